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
from typing import Iterator, Optional, Tuple

from .errors import (
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
    redact,
)

__all__ = [
    "clean_stderr",
    "command_failed",
    "describe",
    "is_ambiguous",
    "mark_worded",
    "reword",
    "script_reason",
]

_WORDED = "_e2b_worded"

#: "E2B <request>( failed)?: " / "E2B <request> timed out" at the start of a message built
#: by the HTTP layer or the envd/control clients: the request is ours, not the caller's.
_OPERATION_PREFIX = re.compile(
    r"^E2B (?:(?:GET|POST|PUT|PATCH|DELETE) \S+|process start|process signal|process input|"
    r"file upload|file download|health check|request|stream)(?: failed)?(?::\s*|\s+(?=timed out))"
)
#: Programs and internal names a sandbox script's messages start with.
_SCRIPT_PREFIX = re.compile(
    r"^(?:capybara-[\w-]+|/bin/sh|/bin/bash|sh|bash|dash|head|cat|mkdir|runuser|stat|base64|"
    r"dirname|chmod|chown|mkfifo|timeout|wc|rm|python3?|/usr/bin/python3)"
    r"(?::\s*line\s*\d+)?:\s*(?:\d+:\s*)?"
)
_INTERNAL_NAME = re.compile(r"capybara-[\w-]+")
#: How the control-plane client says a sandbox is gone.
_GONE = re.compile(r"E2B sandbox \S+ no longer exists")
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
    if getattr(exc, _WORDED, False) or isinstance(exc, (InvalidArgument, ProviderClosed)):
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
    exc.args = (redact(text),)
    mark_worded(exc)


@contextlib.contextmanager
def describe(doing: str, lost: str = "") -> Iterator[None]:
    """Reword every library error raised inside the block (see :func:`reword`)."""
    try:
        yield
    except E2BProviderError as exc:
        reword(exc, doing, lost)
        raise


def _clean_line(line: str) -> str:
    while True:
        stripped = _SCRIPT_PREFIX.sub("", line, count=1)
        if stripped == line:
            break
        line = stripped
    return _INTERNAL_NAME.sub("", line).strip()


def clean_stderr(stderr: str) -> str:
    """A script's standard error without the script's internal names (line by line)."""
    lines = (_clean_line(line) for line in stderr.splitlines())
    return "\n".join(line for line in lines if line)


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
