"""The exception tree of e2b_provider: every error the library raises on purpose.

Catch :class:`E2BProviderError` to catch everything the library raises. The tree::

    E2BProviderError(Exception)                 root
    ├── InvalidArgument(E2BProviderError, ValueError)
    │       bad name, id, tag, path, env key, limits or config; raised before any I/O
    │   └── ConfigError(InvalidArgument)        a DeploymentConfig field, or a deployment that
    │                                           does not speak the API this library needs
    ├── E2BHttpError(E2BProviderError)          an HTTP error answer: .status .code .error_code
    │   │                                       .message (cut to 300 characters) .operation
    │   ├── AuthenticationError(E2BHttpError)   401 / 403
    │   ├── NotFound(E2BHttpError)              404
    │   │   └── SandboxGoneError(NotFound)      the sandbox no longer exists (or ``create``
    │   │                                       deleted it again: it came without an envd
    │   │                                       access token): create a new one
    │   └── Conflict(E2BHttpError)              409 (after connect's bounded retries)
    ├── TransportError(E2BProviderError)        DNS, refused, TLS, connection dropped mid-stream
    │   ├── TransportTimeout(TransportError, TimeoutError)
    │   │                                       no connection, or no byte, within the bound
    │   └── SandboxPaused(TransportError)       the sandbox was paused while the call ran: its
    │                                           outcome is unknown (see the class)
    ├── ProtocolError(E2BProviderError)         an unparseable answer: bad envelope or JSON,
    │   │                                       compressed or oversized frame, no end-of-stream
    │   └── MissingAccessToken(ProtocolError)   a connect answered without an envd access token:
    │                                           the sandbox is not used unauthenticated
    ├── RemoteError(E2BProviderError)           a Connect end-of-stream error: .code .message
    ├── CommandFailed(E2BProviderError)         an internal sandbox script (read, write, stat,
    │   │                                       kill) exited non-zero: .exit_code .stderr
    │   ├── PathNotFound(CommandFailed, FileNotFoundError)
    │   │                                       the sandbox path a call needs does not exist
    │   ├── NotADirectory(CommandFailed, NotADirectoryError)
    │   │                                       it exists but is not a directory
    │   └── PermissionDenied(CommandFailed, PermissionError)
    │                                           user ``sandbox`` may not read it (or reach it)
    ├── OperationTimeout(E2BProviderError, TimeoutError)
    │                                           an internal bounded operation ran out of time
    ├── ProviderClosed(E2BProviderError)        a call on a provider after its close()
    └── Cancelled(E2BProviderError)             the caller's CancelToken fired: .reason

``SandboxGoneError`` carries ``status=404``; one raised because no access token came back
carries the status of the answer that lacked it.

Every error a provider method raises names what failed in the caller's terms (the operation,
the sandbox, the path) and, where there is one, what to do about it.

``KeyboardInterrupt`` and ``SystemExit`` are never wrapped. An exec that times out or is
cancelled by its token is not an error: it is an ``ExecResult`` with ``timed_out`` or
``cancelled`` set.

No message built here ever contains the API key or an envd access token: messages are made
from status codes and server bodies only, and :func:`redact` scrubs known secrets from any
text that crosses this module.

Known secrets are bounded: a secret registered with an ``owner`` (the config, client or target
object that holds it) is known exactly as long as some such owner is alive — a secret still
held can still be sent, so it can still come back in a message, and it is never forgotten
before the last object holding it is gone (envd access tokens: one per sandbox connect). A
secret registered without an owner is kept for the life of the process (API keys: a few per
process, known from the moment a config sees one, even one it refuses).
"""

from __future__ import annotations

import collections
import os
import re
import threading
import weakref
from typing import Any, Deque, Dict, Iterable, Mapping, Optional, Set, Tuple, Union

__all__ = [
    "MAX_MESSAGE_CHARS",
    "AuthenticationError",
    "Cancelled",
    "CommandEnded",
    "CommandFailed",
    "CommandNotFound",
    "ConfigError",
    "Conflict",
    "E2BHttpError",
    "E2BProviderError",
    "FilesFailed",
    "InvalidArgument",
    "MissingAccessToken",
    "NotADirectory",
    "NotFound",
    "OperationTimeout",
    "PathNotFound",
    "PermissionDenied",
    "ProtocolError",
    "ProviderClosed",
    "RemoteError",
    "SandboxGoneError",
    "SandboxPaused",
    "TransportError",
    "TransportTimeout",
    "UnsafePath",
    "known_secrets",
    "redact",
    "register_secret",
]

#: Server messages are cut to this many characters before they enter an exception.
MAX_MESSAGE_CHARS = 300

_secrets_lock = threading.Lock()
#: Secrets held by live owners: value -> number of owners alive.
_owned: Dict[str, int] = {}
#: Secrets registered without an owner: kept for the life of the process.
_pinned: Set[str] = set()
#: Secrets whose owner was collected, waiting to be counted down. The finalizer only appends
#: here (it may run inside a garbage collection triggered while ``_secrets_lock`` is held).
_released: Deque[str] = collections.deque()
#: Every known secret, longest first (rebuilt on change).
_known: Tuple[str, ...] = ()
_MIN_SECRET_LEN = 6


def _refresh(changed: bool = False) -> None:
    """Count down released owners and, if the set changed, rebuild :data:`_known` (caller
    holds the lock)."""
    global _known
    while _released:
        value = _released.popleft()
        left = _owned.get(value, 0) - 1
        if left > 0:
            _owned[value] = left
        else:
            _owned.pop(value, None)
            changed = True
    if changed:
        _known = tuple(sorted(_owned.keys() | _pinned, key=len, reverse=True))


def _after_fork_in_child() -> None:
    # Another thread may have held the lock at fork time: the child starts with a free one.
    global _secrets_lock
    _secrets_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def register_secret(value: Optional[str], owner: Optional[object] = None) -> None:
    """Remember a secret (API key, access token) so :func:`redact` can scrub it.

    Args:
        value: the secret. Values shorter than six characters are ignored: scrubbing them
            would mangle ordinary text.
        owner: an object holding the secret (weak-referenceable). The secret is known while
            any of its owners is alive and forgotten after the last one is collected. Without
            an owner it is kept for the life of the process, unless an owner already holds it.
    """
    if not isinstance(value, str) or len(value) < _MIN_SECRET_LEN:
        return
    with _secrets_lock:
        _refresh()
        if owner is None:
            if value in _owned or value in _pinned:
                return
            _pinned.add(value)
        else:
            weakref.finalize(owner, _released.append, value)
            if value in _owned:
                _owned[value] += 1
                return
            _owned[value] = 1
        _refresh(changed=True)


def known_secrets() -> int:
    """How many secrets are known now (for tests and leak checks)."""
    with _secrets_lock:
        _refresh()
        return len(_known)


def redact(text: str) -> str:
    """Return ``text`` with every registered secret replaced by ``***``."""
    with _secrets_lock:
        if _released:
            _refresh()
        known = _known
    for s in known:
        if s in text:
            text = text.replace(s, "***")
    return text


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` (redacted) in at most ``limit`` characters, cut after a whole word (then
    ``…``), never inside one unless one word is longer than a third of the limit."""
    text = redact(text)
    if len(text) <= limit:
        return text
    head = text[:limit - 1]
    if not text[limit - 1].isspace():
        space = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
        if space >= limit // 3 * 2:
            head = head[:space]
    return head.rstrip() + "…"


#: How the control-plane client names its requests (``"POST /v2/sandboxes"``); envd's
#: operations are named in words (``"process start"``, ``"file upload"``).
_CONTROL_OPERATION = re.compile(r"(?:GET|POST|PUT|PATCH|DELETE) /")


class E2BProviderError(Exception):
    """Root of every error e2b_provider raises on purpose."""

    def __init__(self, message: str = "") -> None:
        super().__init__(redact(message))

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self.__dict__.copy(), self.args))


def _rebuild(cls: type[BaseException], state: dict[str, Any], args: tuple[Any, ...]) -> Any:
    obj = cls.__new__(cls)
    Exception.__init__(obj, *args)
    obj.__dict__.update(state)
    return obj


class InvalidArgument(E2BProviderError, ValueError):
    """A value was rejected before any I/O: the message names the value's problem."""


class UnsafePath(InvalidArgument):
    """A root write under ``/skills`` was refused because of its path: the path is, or
    goes through, a symbolic link, or a directory that the sandbox user (or anyone but
    root) could change. Found in the sandbox, so after I/O; nothing was written. The
    message names the path and why."""


class ConfigError(InvalidArgument):
    """A configuration is invalid, or the deployment does not offer the API we need.

    Attributes:
        problems: every problem found, one string each (``from_mapping`` reports them all).
    """

    def __init__(self, message: str, problems: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(redact(p) for p in problems)


class E2BHttpError(E2BProviderError):
    """The server answered with an HTTP error status.

    Attributes:
        status: the HTTP status code.
        message: the server's message, cut to 300 characters (never a secret).
        code: the body's ``code`` (E2B control plane: an int equal to the status; envd: a
            Connect code string such as ``"not_found"``), or None.
        error_code: the body's machine-readable ``error_code`` (an open set, e.g.
            ``sandbox_snapshot_guest_agent_unresponsive``), or None.
        operation: what was being done, e.g. ``"POST /v2/sandboxes"``.
    """

    def __init__(
        self,
        status: int,
        message: str,
        code: Union[int, str, None] = None,
        *,
        error_code: Optional[str] = None,
        operation: str = "",
    ) -> None:
        self.status = int(status)
        self.message = _clip(str(message))
        self.code = code
        self.error_code = error_code
        self.operation = operation
        what = f"E2B {operation} failed" if operation else "E2B request failed"
        text = f"{what}: HTTP {self.status}"
        if self.message:
            text += f": {self.message}"
        if error_code:
            text += f" [{error_code}]"
        super().__init__(text)


class AuthenticationError(E2BHttpError):
    """401 or 403: the API key or envd access token was refused.

    Attributes:
        credential: what was refused: ``"api_key"`` when the control plane answered (its
            requests are named ``"<METHOD> /<path>"``), ``"access_token"`` when a
            sandbox's envd did (the sandbox's own token, not the API key).
    """

    @property
    def credential(self) -> str:
        op = self.operation or ""
        return "api_key" if not op or _CONTROL_OPERATION.match(op) else "access_token"


class NotFound(E2BHttpError):
    """404: the resource does not exist."""


class SandboxGoneError(NotFound):
    """The sandbox no longer exists (or cannot be used safely): create a new one."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 404,
        code: Union[int, str, None] = 404,
        error_code: Optional[str] = None,
        operation: str = "",
    ) -> None:
        E2BHttpError.__init__(
            self, status, message, code, error_code=error_code, operation=operation
        )
        # A plain, readable message: "sandbox X no longer exists".
        Exception.__init__(self, _clip(message, 500))


class Conflict(E2BHttpError):
    """409: the sandbox is in a state that does not allow the call (after retries)."""


class TransportError(E2BProviderError):
    """The connection failed: DNS, refused, TLS, or dropped in the middle of an answer."""


class TransportTimeout(TransportError, TimeoutError):
    """No connection, or no byte of the answer, within the bound."""


class SandboxPaused(TransportError):
    """The sandbox was paused (by :meth:`~e2b_provider.E2BSandboxProvider.suspend`, another
    client, or E2B) while the call ran, which cut its connection.

    The call's outcome is unknown: a command may have finished, or may have been frozen with
    the sandbox and carry on when it is resumed (:meth:`kill_all` stops it); a file may or
    may not have been written. Do not blindly retry a command that must not run twice.

    Attributes:
        sandbox_id: the sandbox.
    """

    def __init__(self, message: str, *, sandbox_id: str = "") -> None:
        self.sandbox_id = sandbox_id
        super().__init__(message)


class ProtocolError(E2BProviderError):
    """The peer sent something we cannot parse, or refuse to parse (size, compression)."""


class MissingAccessToken(ProtocolError):
    """E2B answered a connect (or resume) without the sandbox's envd access token.

    The library never talks to a sandbox's envd without its token (that would be an
    unauthenticated sandbox), so the call fails closed. The sandbox itself may be running.

    Attributes:
        sandbox_id: the sandbox.
        status: the HTTP status of the answer that lacked the token.
    """

    def __init__(self, message: str, *, sandbox_id: str = "", status: int = 200) -> None:
        self.sandbox_id = sandbox_id
        self.status = int(status)
        super().__init__(message)


class RemoteError(E2BProviderError):
    """A Connect stream ended with an error.

    Attributes:
        code: the Connect code, e.g. ``"deadline_exceeded"``.
        message: the server's message, cut to 300 characters.
    """

    def __init__(self, code: str, message: str = "", *, operation: str = "") -> None:
        self.code = str(code)
        self.message = _clip(str(message))
        self.operation = operation
        what = f"E2B {operation} failed" if operation else "E2B stream failed"
        super().__init__(f"{what}: {self.code}: {self.message}")


class CommandFailed(E2BProviderError):
    """An internal sandbox script (read, write, stat, kill) exited non-zero.

    Attributes:
        exit_code: the script's exit code, or None.
        stderr: the start of its standard error (at most 500 characters).
    """

    def __init__(self, message: str, *, exit_code: Optional[int] = None, stderr: str = "") -> None:
        self.exit_code = exit_code
        self.stderr = _clip(stderr.strip(), 500)
        super().__init__(f"{message}: {self.stderr}" if self.stderr else message)


#: Failed paths a :class:`FilesFailed` message names, and gives the reason of
#: (``.failed`` has them all).
_MAX_NAMED = 1000
_MAX_REASONS = 20


class FilesFailed(CommandFailed):
    """Some files of a batch (``write_files``, ``read_files``, ``upload``, ``download``)
    failed; the others were done. The message names every path that failed.

    Attributes:
        failed: each failed path and why (a :class:`CommandFailed`, or an
            :class:`UnsafePath` for a ``/skills`` path refused).
        results: for ``read_files``, what was read of the other paths; else empty.
        summary: for ``upload`` and ``download``, what was moved
            (a :class:`~e2b_provider.TransferSummary`); else None.
    """

    def __init__(
        self,
        what: str,
        failed: Mapping[str, E2BProviderError],
        results: Optional[Mapping[str, Any]] = None,
        *,
        summary: Any = None,
    ) -> None:
        self.failed: Dict[str, E2BProviderError] = dict(failed)
        self.results: Dict[str, Any] = dict(results or {})
        self.summary = summary
        items = list(self.failed.items())
        said = [f"{p}: {e}" for p, e in items[:_MAX_REASONS]]
        said += [p for p, _ in items[_MAX_REASONS:_MAX_NAMED]]
        more = len(items) - len(said)
        tail = f"; and {more} more (see .failed)" if more > 0 else ""
        super().__init__(f"{what}: {len(items)} failed: {'; '.join(said)}{tail}")


class PathNotFound(CommandFailed, FileNotFoundError):
    """The sandbox path the call needs does not exist (found in the sandbox, as user
    ``sandbox``; the message names the path). Also a :class:`FileNotFoundError`."""


class NotADirectory(CommandFailed, NotADirectoryError):
    """The sandbox path exists but is not a directory where the call needs one. Also a
    :class:`NotADirectoryError`."""


class PermissionDenied(CommandFailed, PermissionError):
    """User ``sandbox`` may not read the sandbox path, or may not reach it (a directory on
    the way it may not enter; the message says which). Also a :class:`PermissionError`."""


class CommandNotFound(E2BProviderError, LookupError):
    """No background command with that id in the sandbox (its record is not there)."""


class CommandEnded(E2BProviderError):
    """The background command has ended: it takes no more input."""


class OperationTimeout(E2BProviderError, TimeoutError):
    """An internal bounded operation (a file operation, a reboot) ran out of time."""


class ProviderClosed(E2BProviderError):
    """The provider was closed (:meth:`~e2b_provider.E2BSandboxProvider.close`): make a new
    one. Sandboxes are not affected by closing a provider."""


_WS = re.compile(r"\s+")


class Cancelled(E2BProviderError):
    """The caller's :class:`~e2b_provider.CancelToken` fired.

    Attributes:
        reason: the token's :class:`~e2b_provider.CancelReason`, if any.
    """

    def __init__(self, reason: Any = None) -> None:
        self.reason = reason
        msg = getattr(reason, "message", None) or (str(reason) if reason is not None else "")
        super().__init__(f"cancelled: {_WS.sub(' ', msg)}" if msg else "cancelled")
