"""Input validation: every value checked here before it goes near the network or a shell.

This module owns the grammars of the values the provider accepts from its caller (sandbox
names, environment variables, sandbox ids, host names, exec tags, sandbox paths, egress allow
entries, limits, timeouts and byte bounds) and turns a bad value into
:class:`~e2b_provider.errors.InvalidArgument` with a message naming the problem. Messages quote
the bad value with ``repr()`` cut to 80 characters.

Pure functions only: it does no I/O and imports no requests, urllib3 or socket. Every regular
expression is matched with :func:`re.fullmatch` and :data:`re.ASCII`, so a trailing newline or a
non-ASCII look-alike never slips through (``$`` alone would match before a final ``\\n``).
"""

from __future__ import annotations

import ipaddress
import math
import re
import unicodedata
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Pattern, cast

from ..cancel import CancelToken
from ..errors import InvalidArgument
from ..models import SandboxLimits
from .e2b_facts import MAX_TIMEOUT_SECONDS

__all__ = [
    "ENV_KEY_RE",
    "HOSTNAME_RE",
    "MAX_ALLOW_HOSTS",
    "MAX_BYTES_LIMIT",
    "MAX_ENV_KEY_CHARS",
    "MAX_ENV_VALUE_BYTES",
    "MAX_ENV_VARS",
    "MAX_HOSTNAME_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_PATH_BYTES",
    "MAX_PATH_COMPONENT_BYTES",
    "NAME_RE",
    "SANDBOX_ID_RE",
    "TAG_RE",
    "allow_host_problems",
    "check_allow_host",
    "check_each",
    "check_env",
    "check_env_key",
    "check_hostname",
    "check_limits",
    "check_max_bytes",
    "check_name",
    "check_path",
    "check_sandbox_id",
    "check_tag",
    "check_terminal_size",
    "check_text",
    "check_timeout",
    "path_problems",
    "show",
]

#: A sandbox name (the reference's ``NAME_RE``).
NAME_RE: Pattern[str] = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,100}", re.ASCII)
#: An environment variable name (the reference's ``ENV_KEY_RE``).
ENV_KEY_RE: Pattern[str] = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
#: A lowercase DNS name with at least two labels (the reference's ``HOSTNAME_RE``).
HOSTNAME_RE: Pattern[str] = re.compile(
    r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+", re.ASCII
)
#: An E2B sandbox id (the reference's ``SANDBOX_ID_RE``).
SANDBOX_ID_RE: Pattern[str] = re.compile(r"[a-zA-Z0-9-]{1,128}", re.ASCII)
#: An exec tag. Tags go into a file name and a ``pgrep -f`` regular expression, so they hold
#: no regex or shell metacharacters at all.
TAG_RE: Pattern[str] = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)

MAX_ENV_VARS = 1000
MAX_ENV_KEY_CHARS = 1024
MAX_ENV_VALUE_BYTES = 128 * 1024
MAX_PATH_BYTES = 4096
MAX_PATH_COMPONENT_BYTES = 255
MAX_HOSTNAME_CHARS = 253
MAX_LABEL_CHARS = 63
MAX_ALLOW_HOSTS = 256
MAX_BYTES_LIMIT = 1024 * 1024 * 1024
#: The longest single argument string Linux accepts (``MAX_ARG_STRLEN`` less its NUL).
MAX_ARG_BYTES = 128 * 1024 - 1

_SHOW_CHARS = 80
# Control characters, invisible format characters (U+200B, U+202E, BOM, ...), and the
# Unicode line and paragraph separators.
UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
#: The egress policies a sandbox may have.
EGRESS_MODES = ("none", "allowlist", "open")
_HOST_CHARS_RE = re.compile(r"[A-Za-z0-9.:/*_-]+", re.ASCII)


def show(value: object) -> str:
    """``repr(value)`` cut to 80 characters, for error messages."""
    r = repr(value)
    return r if len(r) <= _SHOW_CHARS else r[: _SHOW_CHARS - 3] + "..."


def _has_bad_chars(text: str) -> bool:
    return any(unicodedata.category(c) in UNPRINTABLE_CATEGORIES for c in text)


def _utf8_len(text: str) -> Optional[int]:
    """Length of ``text`` in UTF-8, or None when it cannot be encoded (lone surrogates)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _refuse(problems: List[str], what: str, value: object) -> None:
    """Raise :class:`InvalidArgument` listing every one of ``problems`` of ``value`` (a
    ``what``); nothing when there are none."""
    if problems:
        raise InvalidArgument(f"invalid {what} {show(value)}: {'; '.join(problems)}")


def _check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"invalid {what}: must be a string, not {type(value).__name__}")
    return value


def _check_re(value: object, pattern: Pattern[str], what: str, grammar: str) -> str:
    text = _check_str(value, what)
    if pattern.fullmatch(text) is None:
        raise InvalidArgument(f"invalid {what} {show(text)}: {grammar}")
    return text


def check_text(value: object, what: str, *, max_bytes: int = MAX_ARG_BYTES) -> str:
    """Check free text that goes into a request as one string (a shell command).

    It must be a string without NUL, encodable as UTF-8 (no lone surrogates such as
    ``os.fsdecode(b"\\xff")`` gives) and at most ``max_bytes`` bytes in UTF-8.

    Returns:
        The text, unchanged.

    Raises:
        InvalidArgument: naming ``what`` and the problem (the text itself is not quoted).
    """
    text = _check_str(value, what)
    if "\x00" in text:
        raise InvalidArgument(f"invalid {what}: contains a NUL character")
    size = _utf8_len(text)
    if size is None:
        bad = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
        raise InvalidArgument(
            f"invalid {what}: not encodable as UTF-8 (a lone surrogate {text[bad]!r} at "
            f"index {bad}, as os.fsdecode() gives for bytes that are not UTF-8); pass text, "
            "or decode the bytes with errors='replace'"
        )
    if size > max_bytes:
        raise InvalidArgument(f"invalid {what}: {size} bytes in UTF-8, at most {max_bytes}")
    return text


def check_name(name: object) -> str:
    """Check a sandbox name.

    Args:
        name: 1-101 ASCII letters, digits, ``_``, ``.`` or ``-``, starting with a letter or digit.

    Returns:
        The name, unchanged.

    Raises:
        InvalidArgument: the name does not match the grammar.
    """
    return _check_re(
        name,
        NAME_RE,
        "sandbox name",
        "must be 1-101 ASCII letters, digits, '_', '.' or '-', starting with a letter or digit",
    )


def check_env_key(key: object) -> str:
    """Check an environment variable name (``[A-Za-z_][A-Za-z0-9_]*``, at most 1024 chars).

    Raises:
        InvalidArgument: the name does not match the grammar.
    """
    text = _check_str(key, "environment variable name")
    if len(text) > MAX_ENV_KEY_CHARS:
        raise InvalidArgument(
            f"invalid environment variable name {show(text)}: longer than "
            f"{MAX_ENV_KEY_CHARS} characters"
        )
    return _check_re(
        text,
        ENV_KEY_RE,
        "environment variable name",
        "must be ASCII letters, digits and '_', not starting with a digit",
    )


def check_env(env: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """Check a set of environment variables for a command.

    Keys must be valid names (:func:`check_env_key`); values must be strings without NUL, valid
    as UTF-8, and at most 128 KiB each (the kernel's per-string limit); at most 1000 variables.

    Args:
        env: the variables, or None for none.

    Returns:
        A new plain dict with the same items.

    Raises:
        InvalidArgument: naming the first bad key or value.
    """
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise InvalidArgument(f"invalid env: must be a mapping, not {type(env).__name__}")
    if len(env) > MAX_ENV_VARS:
        raise InvalidArgument(
            f"invalid env: {len(env)} variables, at most {MAX_ENV_VARS} are allowed"
        )
    out: Dict[str, str] = {}
    for key, value in env.items():
        check_env_key(key)
        if not isinstance(value, str):
            raise InvalidArgument(
                f"invalid value for environment variable {key}: must be a string, "
                f"not {type(value).__name__}"
            )
        if "\x00" in value:
            raise InvalidArgument(
                f"invalid value for environment variable {key}: contains a NUL character"
            )
        size = _utf8_len(value)
        if size is None:
            raise InvalidArgument(
                f"invalid value for environment variable {key}: not encodable as UTF-8"
            )
        if size > MAX_ENV_VALUE_BYTES:
            raise InvalidArgument(
                f"invalid value for environment variable {key}: {size} bytes, at most "
                f"{MAX_ENV_VALUE_BYTES} are allowed"
            )
        out[key] = value
    return out


def check_sandbox_id(sandbox_id: object) -> str:
    """Check an E2B sandbox id (1-128 ASCII letters, digits and ``-``).

    Raises:
        InvalidArgument: the id does not match the grammar.
    """
    return _check_re(
        sandbox_id,
        SANDBOX_ID_RE,
        "E2B sandbox id",
        "must be 1-128 ASCII letters, digits or '-'",
    )


def _hostname_problems(host: str) -> List[str]:
    problems: List[str] = []
    if len(host) > MAX_HOSTNAME_CHARS:
        problems.append(f"longer than {MAX_HOSTNAME_CHARS} characters")
    if HOSTNAME_RE.fullmatch(host) is None:
        problems.append(
            "must be a lowercase DNS name with at least two labels of ASCII letters, "
            "digits and '-' (no leading or trailing '-'), such as e2b.app"
        )
    elif any(len(label) > MAX_LABEL_CHARS for label in host.split(".")):
        problems.append(f"has a label longer than {MAX_LABEL_CHARS} characters")
    return problems


def check_hostname(host: object) -> str:
    """Check a lowercase DNS host name such as ``e2b.app`` (<= 253 chars, labels <= 63).

    Raises:
        InvalidArgument: the name does not match the grammar.
    """
    text = _check_str(host, "host name")
    _refuse(_hostname_problems(text), "host name", text)
    return text


def check_tag(tag: object) -> str:
    """Check an exec tag (1-64 ASCII letters, digits, ``_`` or ``-``).

    Tags are embedded in a file name and in a ``pgrep -f`` regular expression, so the grammar
    admits no metacharacter of either.

    Raises:
        InvalidArgument: the tag does not match the grammar.
    """
    return _check_re(tag, TAG_RE, "sandbox tag", "must be 1-64 ASCII letters, digits, '_' or '-'")


def path_problems(path: object) -> List[str]:
    """Everything wrong with a sandbox path (empty when it is acceptable).

    A good path is absolute and normalized (no ``.`` or ``..`` segment, no ``//``, no trailing
    ``/`` except the root itself), holds no NUL, control or invisible format character, and
    is at most 4096 UTF-8 bytes with each component at most 255 bytes.
    """
    if not isinstance(path, str):
        return [f"must be a string, not {type(path).__name__}"]
    if path == "":
        return ["must not be empty"]
    problems: List[str] = []
    if not path.startswith("/"):
        problems.append("must be absolute (start with '/')")
    if "\x00" in path:
        problems.append("must not contain NUL")
    if _has_bad_chars(path.replace("\x00", "")):
        problems.append("must not contain control or invisible formatting characters")
    size = _utf8_len(path)
    if size is None:
        problems.append("must be valid Unicode (no lone surrogates)")
    elif size > MAX_PATH_BYTES:
        problems.append(f"longer than {MAX_PATH_BYTES} bytes in UTF-8")
    if "//" in path:
        problems.append("must not contain empty segments ('//')")
    if len(path) > 1 and path.endswith("/"):
        problems.append("must not end with '/'")
    segments = path.split("/")
    if any(s in (".", "..") for s in segments):
        problems.append("must be normalized (no '.' or '..' segments)")
    if size is not None and any(
        len(s.encode("utf-8")) > MAX_PATH_COMPONENT_BYTES for s in segments
    ):
        problems.append(f"has a component longer than {MAX_PATH_COMPONENT_BYTES} bytes")
    return problems


def check_path(path: object) -> str:
    """Check a file path inside the sandbox (see :func:`path_problems`).

    Returns:
        The path, unchanged.

    Raises:
        InvalidArgument: listing every problem found.
    """
    _refuse(path_problems(path), "sandbox path", path)
    return cast(str, path)  # path_problems proved it is a str


def check_each(values: Iterable[str], check: Callable[[str], object], one_string: str) -> List[str]:
    """``values`` as a list, each checked by ``check`` in order; one string (a sequence of
    characters, not of values) is refused with the message ``one_string``."""
    if isinstance(values, str):
        raise InvalidArgument(one_string)
    out = list(values)
    for value in out:
        check(value)
    return out


def _ip_problems(host: str) -> Optional[List[str]]:
    """Problems of ``host`` as an IP or CIDR; None when it does not look like one."""
    if "/" in host:
        addr, _, prefix = host.partition("/")
        looks_ip = ":" in addr or re.fullmatch(r"[0-9.]+", addr, re.ASCII) is not None
        if not looks_ip:
            return None
        if re.fullmatch(r"[0-9]{1,3}", prefix, re.ASCII) is None:
            return ["CIDR prefix length must be a decimal number"]
        try:
            ipaddress.ip_network(host, strict=True)
        except ValueError as exc:
            text = str(exc)
            if "host bits set" in text:
                return ["CIDR has host bits set (use the network address)"]
            return ["not a valid CIDR block"]
        return []
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None  # maybe a host:port; the caller says so
        return []
    if re.fullmatch(r"[0-9.]+", host, re.ASCII) is not None:
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return ["not a valid IPv4 address"]
        return []
    return None


def allow_host_problems(host: object) -> List[str]:
    """Everything wrong with an egress allowlist entry (empty when it is acceptable).

    Accepted: a lowercase DNS name (``example.com``), the same with a leading ``*.`` wildcard
    (``*.example.com``), an IPv4 or IPv6 address, or a CIDR block (``10.0.0.0/8``). Refused:
    schemes, ports, paths, whitespace, other wildcards, and any non-ASCII character (Unicode
    look-alikes such as a Cyrillic ``\\u0430`` for ``a``).
    """
    if not isinstance(host, str):
        return [f"must be a string, not {type(host).__name__}"]
    if host == "":
        return ["must not be empty"]
    if len(host) > MAX_HOSTNAME_CHARS + 2:
        return [f"longer than {MAX_HOSTNAME_CHARS} characters"]
    problems: List[str] = []
    if not host.isascii():
        problems.append("must be ASCII only (no Unicode look-alike characters)")
    if any(c.isspace() for c in host):
        problems.append("must not contain whitespace")
    if _has_bad_chars(host):
        problems.append("must not contain control or invisible formatting characters")
    if "://" in host:
        problems.append("must not include a scheme such as https://")
    elif _HOST_CHARS_RE.fullmatch(host) is None and not problems:
        problems.append(
            "may contain only ASCII letters, digits, '.', '-', a leading '*.', "
            "and ':' or '/' in IP addresses and CIDR blocks"
        )
    if problems:
        return problems
    ip = _ip_problems(host)
    if ip is not None:
        return ip
    if "/" in host:
        problems.append("must not include a path")
    if ":" in host:
        problems.append("must not include a port")
    if problems:
        return problems
    name = host[2:] if host.startswith("*.") else host
    if "*" in name:
        return ["a wildcard is only allowed as a leading '*.'"]
    if name != name.lower():
        return ["must be lowercase"]
    problems = _hostname_problems(name)
    if not problems and name.rsplit(".", 1)[-1].isdigit():
        problems.append("looks like an IPv4 address but is not a valid one")
    return problems


def check_allow_host(host: object) -> str:
    """Check an egress allowlist entry (see :func:`allow_host_problems`).

    Raises:
        InvalidArgument: listing every problem found.
    """
    _refuse(allow_host_problems(host), "allowHosts entry", host)
    return cast(str, host)  # allow_host_problems proved it is a str


def _positive_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def check_limits(limits: object) -> SandboxLimits:
    """Check a :class:`~e2b_provider.models.SandboxLimits`.

    ``cpu``, ``memory_mb`` and ``disk_mb`` must be None (no request) or positive finite
    numbers (not bool, not NaN); ``egress`` one of ``"none"``, ``"allowlist"``, ``"open"``;
    with ``"allowlist"`` every entry of ``allow_hosts`` (at most 256) must pass
    :func:`check_allow_host`; ``public_traffic`` a bool.

    Returns:
        The limits, unchanged.

    Raises:
        InvalidArgument: naming the bad field.
    """
    if not isinstance(limits, SandboxLimits):
        raise InvalidArgument(
            f"invalid sandbox limits: must be SandboxLimits, not {type(limits).__name__}"
        )
    for field in ("cpu", "memory_mb", "disk_mb"):
        value = getattr(limits, field)
        if value is not None and not _positive_number(value):
            raise InvalidArgument(
                f"invalid sandbox limits: {field} must be a positive finite number, "
                f"not {show(value)}"
            )
    if limits.egress not in EGRESS_MODES:
        raise InvalidArgument(
            f"invalid sandbox limits: egress must be one of 'none', 'allowlist', 'open', "
            f"not {show(limits.egress)}"
        )
    if not isinstance(limits.public_traffic, bool):
        raise InvalidArgument(
            f"invalid sandbox limits: public_traffic must be True or False, "
            f"not {show(limits.public_traffic)}"
        )
    if limits.egress == "allowlist":
        if len(limits.allow_hosts) > MAX_ALLOW_HOSTS:
            raise InvalidArgument(
                f"invalid sandbox limits: {len(limits.allow_hosts)} allow_hosts entries, at "
                f"most {MAX_ALLOW_HOSTS} are allowed"
            )
        for host in limits.allow_hosts:
            check_allow_host(host)
    return limits


def check_timeout(seconds: object, *, name: str = "timeout") -> float:
    """Check a timeout in seconds: a positive finite int or float, not bool, at most 86400.

    Returns:
        The timeout as a float.

    Raises:
        InvalidArgument: naming ``name``.
    """
    if not _positive_number(seconds):
        raise InvalidArgument(
            f"invalid {name} {show(seconds)}: must be a positive finite number of seconds"
        )
    value = float(seconds)  # type: ignore[arg-type]  # _positive_number proved it is a number
    if value > MAX_TIMEOUT_SECONDS:
        raise InvalidArgument(
            f"invalid {name} {show(seconds)}: at most {MAX_TIMEOUT_SECONDS} seconds"
        )
    return value


def check_max_bytes(n: object, name: str) -> int:
    """Check a byte bound: an int (not bool) from 0 to 1 GiB.

    Returns:
        The bound, as a plain int.

    Raises:
        InvalidArgument: naming ``name``.
    """
    if not isinstance(n, int) or isinstance(n, bool):
        raise InvalidArgument(f"invalid {name} {show(n)}: must be an int")
    if n < 0:
        raise InvalidArgument(f"invalid {name} {show(n)}: must not be negative")
    if n > MAX_BYTES_LIMIT:
        raise InvalidArgument(f"invalid {name} {show(n)}: at most {MAX_BYTES_LIMIT} (1 GiB)")
    return int(n)


def check_terminal_size(cols: object, rows: object) -> None:
    """Check a terminal's size: ``cols`` and ``rows`` ints (not bool) from 1 to 65535.

    Raises:
        InvalidArgument: naming the one that is not.
    """
    for name, n in (("cols", cols), ("rows", rows)):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 0xFFFF:
            raise InvalidArgument(f"{name} must be an int from 1 to 65535, not {show(n)}")


def check_cancel(cancel: object) -> Optional[CancelToken]:
    """``cancel`` if it is a :class:`~e2b_provider.CancelToken` or None.

    Raises:
        InvalidArgument: anything else (before any I/O).
        Cancelled: the token has fired already.
    """
    if cancel is None:
        return None
    if not isinstance(cancel, CancelToken):
        raise InvalidArgument(
            f"cancel must be a CancelToken or None, not {type(cancel).__name__}"
        )
    cancel.raise_if_cancelled()
    return cancel
