"""What every envd request is made of: its constants, argument checks and headers.

This module owns the facts of envd's API the client relies on (its port, the keepalive asked
for, the bounds of an opening and of an error answer), the checks of the arguments envd is
sent (user, path, pid, keepalive, timeouts), the bodies of ``Start`` and ``Connect`` (and a
terminal's size), the check of a Connect stream's answer, and
:class:`EnvdBase`, the part of the envd client every call uses: the target, its base URL and
the headers (``E2b-Sandbox-Id``, ``E2b-Sandbox-Port: 49983``, ``X-Access-Token``; for a
Connect server stream also its content type, the user and the keepalive) and the opening of
a Connect server stream (its URL, body and bounds).
"""

from __future__ import annotations

import base64
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from ..cancel import CancelToken, Deadline
from ..errors import InvalidArgument, ProtocolError
from ..models import Target
from ..protocol.connect import encode_envelope
from ..protocol.e2b_facts import ENVD_PORT
from ..transport.client import Transport
from ..transport.error_mapping import error_from_response
from ..transport.raw_stream import RawStream
from ..transport.response import HttpResponse
from ..transport.stream import Stream

__all__ = [
    "ERROR_BODY_BYTES",
    "KEEPALIVE_SECONDS",
    "START_OPEN_SECONDS",
    "EnvdBase",
    "check_connect_answer",
    "check_keepalive",
    "check_path",
    "check_pid",
    "check_timeout",
    "check_user",
    "connect_request",
    "process_config",
    "pty_size",
    "start_request",
    "within",
]

KEEPALIVE_SECONDS = 50
#: The longest the opening of a process stream may take (connect, send, response headers:
#: envd answers once the process started).
START_OPEN_SECONDS = 30.0
#: How much of an error answer is read to build the exception.
ERROR_BODY_BYTES = 64 * 1024


def basic_auth(user: str) -> str:
    """The ``Authorization`` header that makes envd act as ``user``."""
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode("ascii")


def check_user(user: object) -> str:
    if (
        not isinstance(user, str)
        or not user
        or len(user) > 255
        or any(c in user for c in ": \t\r\n\x00")
        or not user.isprintable()
    ):
        raise InvalidArgument("user must be a non-empty user name without ':' or whitespace")
    return user


def check_path(path: object) -> str:
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidArgument("path must be a non-empty string without NUL")
    return path


def check_pid(pid: object) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise InvalidArgument("pid must be a positive int")
    return pid


def check_keepalive(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 3600:
        raise InvalidArgument("keepalive_seconds must be an int from 1 to 3600")
    return value


def check_timeout(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgument(f"{what} must be a positive number of seconds")
    return float(value)


def within(timeout: object) -> Dict[str, Any]:
    """A buffered request's bounds: ``timeout`` seconds in total, and per read."""
    t = check_timeout(timeout, "timeout")
    return {"read_timeout": t, "deadline": Deadline.after(t)}


def process_config(
    cmd: object, args: Sequence[str], envs: Optional[Mapping[str, str]], cwd: object
) -> Dict[str, Any]:
    """A Start request's ``process``: ``cmd``, ``args`` and, when given, ``envs`` and
    ``cwd``, checked."""
    if not isinstance(cmd, str) or not cmd:
        raise InvalidArgument("cmd must be a non-empty string")
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise InvalidArgument("args must be a sequence of strings")
    process: Dict[str, Any] = {"cmd": cmd, "args": list(args)}
    if envs is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in envs.items()):
            raise InvalidArgument("envs must map strings to strings")
        process["envs"] = dict(envs)
    if cwd is not None:
        if not isinstance(cwd, str):
            raise InvalidArgument("cwd must be a string")
        process["cwd"] = cwd
    return process


def start_request(
    user: str,
    cmd: object,
    args: Sequence[str],
    envs: Optional[Mapping[str, str]],
    cwd: object,
    keepalive_seconds: int,
) -> Dict[str, Any]:
    """A Start request (its ``process``), the arguments of every start checked."""
    check_user(user)
    process = process_config(cmd, args, envs, cwd)
    check_keepalive(keepalive_seconds)
    return {"process": process}


def connect_request(pid: int, user: str, keepalive_seconds: int) -> Dict[str, Any]:
    """A Connect request (to process ``pid``), the arguments of every connect checked."""
    check_pid(pid)
    check_user(user)
    check_keepalive(keepalive_seconds)
    return {"process": {"pid": pid}}


def pty_size(cols: object, rows: object) -> Dict[str, Any]:
    """A request's ``pty`` field for a terminal of ``cols`` x ``rows``, checked."""
    for name, n in (("cols", cols), ("rows", rows)):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 0xFFFF:
            raise InvalidArgument(f"{name} must be an int from 1 to 65535")
    return {"size": {"cols": cols, "rows": rows}}


def check_connect_answer(
    stream: Union[Stream, RawStream], operation: str, error_body: Callable[[], bytes]
) -> None:
    """Check a stream's answer is a 200 Connect stream; otherwise abort and close it and
    raise (the error answer's body, read by ``error_body``, in the error)."""
    try:
        if stream.status != 200:
            raise error_from_response(
                HttpResponse(stream.status, stream.headers, error_body()), operation
            )
        ctype = stream.headers.get("content-type", "")
        if ctype and not ctype.lower().startswith("application/connect+json"):
            raise ProtocolError(
                f"E2B {operation} answered 200 with content type {ctype[:80]!r}, "
                "not a Connect stream"
            )
    except BaseException:
        stream.abort()
        stream.close()
        raise


class EnvdBase:
    """What every call of the envd client uses: the transport, the target and the headers.

    Args:
        transport: the HTTP transport (shared).
        target: where the sandbox's envd is, and its access token.
    """

    def __init__(self, transport: Transport, target: Target) -> None:
        self._transport = transport
        self._target = target
        self._base = target.url.rstrip("/")

    def __repr__(self) -> str:
        return f"EnvdClient(sandbox_id={self._target.sandbox_id!r}, url={self._base!r})"

    @property
    def target(self) -> Target:
        """The target this client talks to."""
        return self._target

    def _stream_opening(
        self,
        route: str,
        request: Dict[str, Any],
        user: str,
        keepalive_seconds: int,
        cancel: Optional[CancelToken],
        operation: str,
        extra: Optional[Mapping[str, str]] = None,
    ) -> Tuple[str, Dict[str, Any]]:
        """The URL and arguments that open one Connect server stream of envd (buffered or
        raw), sending ``request`` as ``user``: the opening within
        :data:`START_OPEN_SECONDS`, then each read within twice the keepalive plus 10 s."""
        headers = self._stream_headers(user, keepalive_seconds, extra or {})
        return f"{self._base}{route}", {
            "headers": headers,
            "data": encode_envelope(request),
            "read_timeout": 2.0 * keepalive_seconds + 10.0,
            "cancel": cancel,
            "operation": operation,
            "deadline": Deadline.after(START_OPEN_SECONDS),
        }

    def _stream_headers(
        self, user: str, keepalive_seconds: int, extra: Mapping[str, str]
    ) -> Dict[str, str]:
        """The headers of a Connect server stream opened as ``user``."""
        return self._headers(
            {
                "Content-Type": "application/connect+json",
                "Connect-Protocol-Version": "1",
                "Authorization": basic_auth(user),
                "Keepalive-Ping-Interval": str(keepalive_seconds),
                **extra,
            }
        )

    def _headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        h = {
            "E2b-Sandbox-Id": self._target.sandbox_id,
            "E2b-Sandbox-Port": str(ENVD_PORT),
            "X-Access-Token": self._target.access_token,
        }
        if extra:
            h.update(extra)
        return h
