"""What users read: errors said in the caller's terms, without the library's internals.

This module owns the wording of the errors a provider method raises. :func:`reword` rewrites
a library error's message in place as ``"<what the caller asked> failed: <why>; <what to
do>"`` — naming the operation, the sandbox and the path instead of the request or sandbox
script that failed inside (``process start``, ``POST /v2/sandboxes/{id}/connect``, a
script's ``$0``) — and keeps its class and attributes, so ``except`` clauses and ``.status``
keep working. :func:`script_reason` turns a sandbox script's standard error into a reason
without the script's internal names (``capybara-…: 1: cannot create …`` becomes
``permission denied (cannot create …)``).

Pure functions on text and exceptions: no I/O, no requests, urllib3 or socket.
"""

from __future__ import annotations

import contextlib
import re
import sys
from typing import Callable, Iterator, Optional, Sequence, Tuple, Union

from ..errors import (
    AuthenticationError,
    Cancelled,
    CommandFailed,
    Conflict,
    E2BHttpError,
    E2BProviderError,
    InvalidArgument,
    MissingAccessToken,
    OperationTimeout,
    ProtocolError,
    ProviderClosed,
    RemoteError,
    SandboxGoneError,
    SandboxPaused,
    TransportError,
    TransportTimeout,
    UnsafePath,
    redact,
)
from .interrupts import caller_handling, shorten_in_generator

__all__ = [
    "clean_stderr",
    "command_failed",
    "cwd_refused",
    "describe",
    "is_ambiguous",
    "looks_like_sandbox_id",
    "mark_worded",
    "name_not_id",
    "reword",
    "script_reason",
    "scrub",
    "unknown_sandbox_id",
]

_WORDED = "_e2b_worded"

#: "E2B <request>( failed)?: " / "E2B <request> timed out" at the start of a message built
#: by the HTTP layer or the envd/control clients: the request is ours, not the caller's.
_OPERATION_PREFIX = re.compile(
    r"^E2B (?:(?:GET|POST|PUT|PATCH|DELETE) \S+|process start|process signal|process input|"
    r"file upload|file download|filesystem watch|health check|request|stream)"
    r"(?: failed)?(?::\s*|\s+(?=timed out))"
)
#: Programs and internal names a sandbox script's messages start with.
_SCRIPT_PREFIX = re.compile(
    r"^(?:capybara-[\w-]+|/bin/sh|/bin/bash|sh|bash|dash|head|cat|mkdir|runuser|stat|base64|"
    r"dirname|chmod|chown|mkfifo|timeout|wc|rm|python3?|/usr/bin/python3)"
    r"(?::\s*line\s*\d+)?:\s*(?:\d+:\s*)?"
)
#: The library's own places and names in a sandbox, which a message must not show, each
#: with what is said instead: a temporary file beside a target (said by its directory), a
#: tree upload's end marker, the root-only staging directory, the registries of temporary
#: files and of background commands, an exec's control file, and an internal process name
#: (with the ``: `` or ``: 1: `` after it, as a script's ``$0`` prefixes its words).
_Said = Union[str, Callable[["re.Match[str]"], str]]
_INTERNALS: Tuple[Tuple[re.Pattern[str], _Said], ...] = (
    (re.compile(r"'?(?:([^\s'\":,;]*)/)?\.capybara-part-[\w.-]*'?"),
     lambda m: f"a temporary file in {m.group(1) or '/'}" if m.group(1) is not None
     else "a temporary file"),
    (re.compile(r"'?(?:[^\s'\":,;]*/)?\.capybara-end-[\w.-]*'?"), "the end of the stream"),
    (re.compile(r"'?/opt/capybara/upload(?:/[^\s'\":,;]*)?'?"), "the staging directory"),
    (re.compile(r"'?/tmp/\.capybara-parts-[^\s'\":,;]*'?"), "the registry of temporary files"),
    (re.compile(r"'?/tmp/\.capybara-cmd(?:/[^\s'\":,;]*)?'?"), "the command records"),
    (re.compile(r"'?/tmp/\.capybara-exec-[^\s'\":,;]*'?"), "a command's control file"),
    (re.compile(r"\bcapybara-[\w-]+(?::(?:\s*line)?\s*\d+)?:?\s*"), ""),
)
#: How the control-plane client says a sandbox is gone.
_GONE = re.compile(r"E2B sandbox (\S+) no longer exists")
#: What E2B sandbox ids look like (``i`` and 20 of ``[a-z0-9]`` today; older ones had a
#: ``-<client id>`` suffix): a "gone" id of another shape was most likely a name.
_E2B_ID = re.compile(r"[a-z0-9]{20,}(?:-[a-z0-9]+)?", re.ASCII)
#: envd's answer to a process start whose working directory does not exist.
_CWD_MISSING = re.compile(r"cwd '(.*)' does not exist", re.DOTALL)
#: errno texts (as coreutils and sh print them) and the reason users read.
_ERRNO_REASONS: Tuple[Tuple[str, str], ...] = (
    ("Permission denied", "permission denied"),
    ("Operation not permitted", "operation not permitted"),
    ("No space left on device", "no space left on the sandbox's disk"),
    ("Disk quota exceeded", "disk quota exceeded"),
    ("Read-only file system", "the file system is read-only"),
    ("Is a directory", "it is a directory"),
    ("Not a directory", "a parent of the path is not a directory"),
    ("No such file or directory", "no such file or directory"),
    ("File name too long", "a file name is too long"),
    ("Too many levels of symbolic links", "too many levels of symbolic links"),
    ("Text file busy", "the file is a running program (text file busy)"),
    ("Input/output error", "input/output error in the sandbox"),
)


def mark_worded(exc: E2BProviderError) -> E2BProviderError:
    """Mark ``exc`` as already said in the caller's terms: :func:`reword` leaves it alone."""
    setattr(exc, _WORDED, True)
    return exc


def _strip_operation(text: str) -> str:
    return _OPERATION_PREFIX.sub("", text, count=1).strip()


def _reason(exc: E2BProviderError) -> str:
    """Why it failed, from the exception, without the library's own request names."""
    if isinstance(exc, SandboxGoneError):
        text = str(exc)
        return "the sandbox no longer exists" if _GONE.fullmatch(text) else text
    if isinstance(exc, AuthenticationError) and exc.credential == "access_token":
        text = f"the sandbox refused its access token (HTTP {exc.status}"
        text += f": {exc.message})" if exc.message else ")"
        return text
    if isinstance(exc, E2BHttpError):
        text = f"E2B answered HTTP {exc.status}"
        if exc.message:
            text += f": {exc.message}"
        if exc.error_code:
            text += f" [{exc.error_code}]"
        return text
    if isinstance(exc, RemoteError):
        text = f"the sandbox reported {exc.code}"
        return f"{text}: {exc.message}" if exc.message else text
    detail = _strip_operation(str(exc)) or type(exc).__name__
    if isinstance(exc, ProtocolError) and not isinstance(exc, MissingAccessToken):
        return f"E2B's answer could not be read ({detail})"
    return detail


def _hint(exc: E2BProviderError) -> str:
    """What the caller can do about it ("" when nothing useful can be said)."""
    if isinstance(exc, (SandboxPaused, MissingAccessToken)):
        return ""  # their own messages say it
    if isinstance(exc, SandboxGoneError):
        return "create a new sandbox" if _GONE.fullmatch(str(exc)) else ""
    if isinstance(exc, AuthenticationError):
        if exc.credential == "access_token":
            return (
                "the API key is not involved: envd checks the sandbox's own access token, "
                "which E2B issued when the sandbox was created or connected; check that "
                "E2B_SANDBOX_URL or E2B_DOMAIN reaches this deployment's sandboxes, and "
                "try again with a new provider (it connects afresh)"
            )
        return "check the API key (E2B_API_KEY) and that it belongs to the sandbox's team"
    if isinstance(exc, Conflict):
        return "the sandbox is changing state (pausing, resuming or being deleted); try again"
    if isinstance(exc, E2BHttpError):
        if exc.status >= 500 or exc.status == 429:
            return "E2B could not serve the request; try again later"
        return ""
    if isinstance(exc, TransportTimeout):
        return "E2B or the sandbox did not answer in time; check the network, then try again"
    if isinstance(exc, TransportError):
        return (
            "check the URL (E2B_API_URL for the API; E2B_SANDBOX_URL or E2B_DOMAIN for "
            "sandboxes), the network and the proxy settings (HTTPS_PROXY, HTTP_PROXY, "
            "NO_PROXY), then try again"
        )
    if isinstance(exc, ProtocolError):
        return "try again, and report it if it persists"
    if isinstance(exc, RemoteError):
        return "try again; if it persists, the sandbox may need to be recreated"
    if isinstance(exc, OperationTimeout):
        return "the sandbox may be overloaded; try again"
    return ""


def reword(exc: E2BProviderError, doing: str, lost: str = "") -> None:
    """Rewrite ``exc``'s message in place as ``"<doing> failed: <why>; <what to do>"``.

    ``doing`` is what the caller asked, in the caller's terms (``"reading /x in sandbox
    abc"``); ``lost`` is said after an ambiguous failure (see :func:`is_ambiguous`): what
    may have happened although the answer was lost. Left alone: errors already worded (see
    :func:`mark_worded`), argument errors (raised before any I/O, they name the value) and
    :class:`ProviderClosed`. A cancel reads ``"<doing> was cancelled: <reason>"``.
    """
    if getattr(exc, _WORDED, False) or isinstance(exc, ProviderClosed) or (
        # an argument refused before any I/O names the value; a path refused in the
        # sandbox is said as what the caller asked
        isinstance(exc, InvalidArgument) and not isinstance(exc, UnsafePath)
    ):
        return
    if isinstance(exc, Cancelled):
        detail = str(exc).partition("cancelled")[2].lstrip(": ")
        text = f"{doing} was cancelled" + (f": {detail}" if detail else "")
    else:
        text = f"{doing} failed: {_reason(exc)}"
        if lost and is_ambiguous(exc):
            text += f"; {lost}"
        hint = _hint(exc)
        if hint:
            text += f"; {hint}"
    exc.args = (redact(scrub(text)),)
    for part in getattr(exc, "failed", {}).values():  # FilesFailed: each path's error too
        if isinstance(part, E2BProviderError) and part.args:
            part.args = (scrub(str(part.args[0])), *part.args[1:])
    mark_worded(exc)


@contextlib.contextmanager
def describe(doing: str, lost: str = "") -> Iterator[None]:
    """Reword every library error raised inside the block (see :func:`reword`); cut a
    Ctrl-C's traceback below the block's frame (see :mod:`e2b_provider.core.interrupts`)."""
    outer = caller_handling()
    try:
        yield
    except KeyboardInterrupt as exc:
        shorten_in_generator(exc, sys._getframe(), outer)
        raise
    except E2BProviderError as exc:
        reword(exc, doing, lost)
        raise


def _clean_line(line: str) -> str:
    while True:
        stripped = _SCRIPT_PREFIX.sub("", line, count=1)
        if stripped == line:
            break
        line = stripped
    return scrub(line)


def clean_stderr(stderr: str) -> str:
    """A script's standard error without the script's internal names (line by line)."""
    lines = (_clean_line(line) for line in stderr.splitlines())
    return "\n".join(line for line in lines if line)


def scrub(text: str) -> str:
    """``text`` without the library's places and names in a sandbox (temporary files,
    staging and registry directories, internal process names): each is said in words
    (``"a temporary file in /workspace/"``), or dropped when it only prefixed a message."""
    if "capybara" not in text:
        return text
    for pattern, said in _INTERNALS:
        text = pattern.sub(said, text)
    return re.sub(r"  +", " ", text).replace(" :", ":").replace(" ;", ";").strip()


def script_reason(stderr: str, exit_code: Optional[int]) -> str:
    """Why a sandbox script failed, in plain words, from its standard error.

    A known errno text becomes the reason (``"permission denied (cannot create /x)"``);
    otherwise the first line of the cleaned standard error, or the exit status.
    """
    cleaned = clean_stderr(stderr)
    first = cleaned.splitlines()[0] if cleaned else ""
    for text, reason in _ERRNO_REASONS:
        if text in cleaned:
            line = next(ln for ln in cleaned.splitlines() if text in ln)
            detail = line.replace(f": {text}", "").replace(text, "").strip(" :")
            return f"{reason} ({detail})" if detail else reason
    if first:
        return first
    return f"exit status {exit_code}" if exit_code is not None else "no exit status"


def command_failed(reason: str, exit_code: Optional[int], stderr: str) -> CommandFailed:
    """A :class:`CommandFailed` whose message is ``reason`` (``stderr`` kept, cleaned, in
    ``.stderr`` only)."""
    err = CommandFailed(reason, exit_code=exit_code)
    err.stderr = redact(clean_stderr(stderr).strip())[:500]
    return err


def is_ambiguous(exc: BaseException) -> bool:
    """True for a failure after which a request may or may not have taken effect: the
    connection broke, timed out, or the answer could not be read (not a cancel, an error
    answer, a refused argument or a missing token)."""
    if isinstance(exc, (SandboxPaused, MissingAccessToken)):
        return False
    return isinstance(exc, (TransportError, ProtocolError, RemoteError))


def cwd_refused(exc: BaseException) -> Optional[str]:
    """Why envd refused to start a process, when it was its working directory: envd checks
    the directory before it starts anything (``invalid_argument: cwd '/x' does not exist``),
    so the process did not run. None for any other error."""
    if not isinstance(exc, RemoteError) or exc.code != "invalid_argument":
        return None
    m = _CWD_MISSING.fullmatch(exc.message)
    if m is None:
        return None
    return (
        f"the working directory {m.group(1)} does not exist in the sandbox, so the command "
        "did not run; create the directory first (mkdir -p) or pass an existing cwd"
    )


def unknown_sandbox_id(exc: BaseException) -> Optional[str]:
    """The id E2B knows no sandbox by, from an unworded error for it: "sandbox no longer
    exists" (a 404) or "Invalid sandbox ID" (a 400 for an id of a shape E2B never issues);
    None for any other error."""
    if getattr(exc, _WORDED, False):
        return None
    if isinstance(exc, SandboxGoneError):
        m = _GONE.fullmatch(str(exc))
        return m.group(1) if m is not None else None
    given = getattr(exc, "sandbox_id", None)
    if isinstance(exc, E2BHttpError) and exc.status == 400 and isinstance(given, str):
        return given
    return None


def looks_like_sandbox_id(text: str) -> bool:
    """True when ``text`` has the shape of an E2B sandbox id (not of a typical name)."""
    return _E2B_ID.fullmatch(text) is not None


def name_not_id(exc: E2BProviderError, doing: str, given: str, named: Sequence[str]) -> None:
    """Word ``exc`` (E2B knows no sandbox by the id ``given``) as ``"<doing> failed: ..."``
    saying that ``given`` is a sandbox name (of the sandboxes ``named``), or looks like one,
    where calls take the handle or the id."""
    if named:
        which = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
        noun = "sandbox" if len(named) == 1 else "sandboxes"
        text = f"no sandbox has the id {given!r}: that is the name of {noun} {which}"
    else:
        text = (
            f"no sandbox has the id {given!r}, which looks like a sandbox name rather than an "
            "E2B sandbox id (and no sandbox has that name either)"
        )
    text += (
        "; calls take the handle create() returned, or the sandbox id, not the name "
        f"(list_sandboxes(name={given!r}) gives the handles of a name)"
    )
    exc.args = (redact(f"{doing} failed: {text}"),)
    mark_worded(exc)
