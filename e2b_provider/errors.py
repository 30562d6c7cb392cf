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
    │   │   └── SandboxGoneError(NotFound)      the sandbox no longer exists, or came back
    │   │                                       without an envd access token: create a new one
    │   └── Conflict(E2BHttpError)              409 (after connect's bounded retries)
    ├── TransportError(E2BProviderError)        DNS, refused, TLS, connection dropped mid-stream
    │   └── TransportTimeout(TransportError, TimeoutError)
    │                                           no connection, or no byte, within the bound
    ├── ProtocolError(E2BProviderError)         an unparseable answer: bad envelope or JSON,
    │                                           compressed or oversized frame, no end-of-stream
    ├── RemoteError(E2BProviderError)           a Connect end-of-stream error: .code .message
    ├── CommandFailed(E2BProviderError)         an internal sandbox script (read, write, stat,
    │                                           kill) exited non-zero: .exit_code .stderr
    ├── OperationTimeout(E2BProviderError, TimeoutError)
    │                                           an internal bounded operation ran out of time
    └── Cancelled(E2BProviderError)             the caller's CancelToken fired: .reason

``SandboxGoneError`` carries ``status=404``; one raised because no access token came back
carries the status of the answer that lacked it.

``KeyboardInterrupt`` and ``SystemExit`` are never wrapped. An exec that times out or is
cancelled by its token is not an error: it is an ``ExecResult`` with ``timed_out`` or
``cancelled`` set.

No message built here ever contains the API key or an envd access token: messages are made
from status codes and server bodies only, and :func:`redact` scrubs known secrets from any
text that crosses this module.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Iterable, Optional, Union

__all__ = [
    "MAX_MESSAGE_CHARS",
    "AuthenticationError",
    "Cancelled",
    "CommandFailed",
    "ConfigError",
    "Conflict",
    "E2BHttpError",
    "E2BProviderError",
    "InvalidArgument",
    "NotFound",
    "OperationTimeout",
    "ProtocolError",
    "RemoteError",
    "SandboxGoneError",
    "TransportError",
    "TransportTimeout",
    "redact",
    "register_secret",
]

#: Server messages are cut to this many characters before they enter an exception.
MAX_MESSAGE_CHARS = 300

_secrets_lock = threading.Lock()
_secrets: set[str] = set()
_MIN_SECRET_LEN = 6


def register_secret(value: Optional[str]) -> None:
    """Remember a secret (API key, access token) so :func:`redact` can scrub it.

    Values shorter than six characters are ignored: scrubbing them would mangle ordinary text.
    """
    if value and len(value) >= _MIN_SECRET_LEN:
        with _secrets_lock:
            _secrets.add(value)


def redact(text: str) -> str:
    """Return ``text`` with every registered secret replaced by ``***``."""
    with _secrets_lock:
        known = sorted(_secrets, key=len, reverse=True)
    for s in known:
        if s in text:
            text = text.replace(s, "***")
    return text


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    text = redact(text)
    return text if len(text) <= limit else text[:limit]


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
    """401 or 403: the API key or envd access token was refused."""


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


class ProtocolError(E2BProviderError):
    """The peer sent something we cannot parse, or refuse to parse (size, compression)."""


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


class OperationTimeout(E2BProviderError, TimeoutError):
    """An internal bounded operation (a file operation, a reboot) ran out of time."""


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
