"""The envd client for one sandbox: process streams, signals, file upload/download, health.

This module owns the requests made to a sandbox's envd (``process.Process/Start`` as a
Connect server stream, ``process.Process/SendSignal`` as a unary Connect call,
``filesystem.Filesystem/WatchDir`` as a server stream, ``/files`` and ``/health``) and
:class:`ProcessStream`, the iterator of process events read from a ``Start`` answer. Every
request carries ``E2b-Sandbox-Id``, ``E2b-Sandbox-Port: 49983`` and ``X-Access-Token``;
redirects are never followed (the transport refuses them). All I/O goes through
:class:`~e2b_provider.transport.client.Transport`; framing and event parsing are the sans-IO
:mod:`e2b_provider.protocol.connect` and :mod:`e2b_provider.protocol.process_events` (a watch's
events: :mod:`e2b_provider.files.watch`). A terminal's process (``Start`` with ``pty``, and
``Connect`` to it) is opened as a :class:`~e2b_provider.transport.raw_stream.RawStream`
instead, which its reader reads with a timeout of its own; ``SendInput`` with ``input.pty``,
``Update`` (resize) and ``List`` serve it.

No message built here contains the access token.
"""

from __future__ import annotations

import base64
import collections
import posixpath
import urllib.parse
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

from ..cancel import CancelToken, Deadline
from ..errors import (
    E2BProviderError,
    InvalidArgument,
    ProtocolError,
    RemoteError,
)
from ..models import Target
from ..protocol.connect import EndStream, EnvelopeDecoder, Parsed, encode_envelope
from ..protocol.process_events import (
    ProcessEvent,
    StartEvent,
    event_from_wire,
    is_output_message,
    parse_output_message,
    parse_plain_stdout,
)
from ..transport.client import Transport
from ..transport.error_mapping import error_from_response, parse_error_body
from ..transport.raw_stream import RawStream
from ..transport.response import HttpResponse
from ..transport.stream import Stream

__all__ = [
    "ENVD_PORT",
    "ERROR_BODY_BYTES",
    "KEEPALIVE_SECONDS",
    "START_OPEN_SECONDS",
    "SIGNALS",
    "EnvdClient",
    "ProcessStream",
]

ENVD_PORT = 49983
KEEPALIVE_SECONDS = 50
#: The longest the opening of a process stream may take (connect, send, response headers:
#: envd answers once the process started).
START_OPEN_SECONDS = 30.0
#: How much of an error answer is read to build the exception.
ERROR_BODY_BYTES = 64 * 1024
#: The largest answer to ``process.Process/List`` read: it holds the whole config (arguments,
#: environment) of every process envd runs, and the library's own sandbox programs travel as
#: arguments (the file agent about 59 KB, a background command's supervisor about 11 KiB).
LIST_BODY_BYTES = 64 << 20
#: The signals envd's SendSignal accepts.
SIGNALS = frozenset({"SIGNAL_SIGKILL", "SIGNAL_SIGTERM"})
_READ_SIZE = 64 * 1024
_START_OP = "process start"
_CONNECT_OP = "process connect"
_WATCH_OP = "filesystem watch"
_PTY_OP = "terminal stream"


def _basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode("ascii")


def _check_user(user: object) -> str:
    if (
        not isinstance(user, str)
        or not user
        or len(user) > 255
        or any(c in user for c in ": \t\r\n\x00")
        or not user.isprintable()
    ):
        raise InvalidArgument("user must be a non-empty user name without ':' or whitespace")
    return user


def _check_path(path: object) -> str:
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidArgument("path must be a non-empty string without NUL")
    return path


def _check_pid(pid: object) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise InvalidArgument("pid must be a positive int")
    return pid


def _check_keepalive(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 3600:
        raise InvalidArgument("keepalive_seconds must be an int from 1 to 3600")
    return value


def _process_config(
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


def _pty_size(cols: object, rows: object) -> Dict[str, Any]:
    """A request's ``pty`` field for a terminal of ``cols`` x ``rows``, checked."""
    for name, n in (("cols", cols), ("rows", rows)):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 0xFFFF:
            raise InvalidArgument(f"{name} must be an int from 1 to 65535")
    return {"size": {"cols": cols, "rows": rows}}


def _check_connect_answer(
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


def _check_timeout(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgument(f"{what} must be a positive number of seconds")
    return float(value)


def _within(timeout: object) -> Dict[str, Any]:
    """A buffered request's bounds: ``timeout`` seconds in total, and per read."""
    t = _check_timeout(timeout, "timeout")
    return {"read_timeout": t, "deadline": Deadline.after(t)}


class _Sized:
    """An upload body of a known length (``requests`` sends it with ``Content-Length``);
    raises instead of sending more, or ending sooner, than that length."""

    def __init__(self, pieces: Iterable[bytes], length: int) -> None:
        self._pieces = pieces
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        left = self._length
        for piece in self._pieces:
            left -= len(piece)
            if left < 0:
                raise ProtocolError("an upload body grew past its announced length")
            yield piece
        if left:
            raise ProtocolError("an upload body ended before its announced length")


class ProcessStream:
    """The events of one ``process.Process/Start`` answer, read as they arrive.

    Iterate it to get :data:`~e2b_provider.protocol.process_events.ProcessEvent` values (start,
    data, keepalive, end) in order; iteration stops after the Connect end-of-stream message.
    Reads block the iterating thread; :meth:`abort` (any thread, any time) wakes it.

    Raises (from iteration):
        RemoteError: the stream ended with a Connect error (``code``, ``message``).
        ProtocolError: a malformed frame or event, or the body ended without the
            end-of-stream message (truncated).
        TransportError: the connection broke, or the stream was aborted (then
            :attr:`aborted` is True: tell "aborted by us" from "dropped by the peer" by it).
        TransportTimeout: envd sent nothing (not even a keepalive) within the read timeout.

    The stream is closed automatically when it ends or fails; use it as a context manager
    (or call :meth:`close`) to release it early. A stream read to its end-of-stream message
    leaves its connection in the pool (the HTTP body's end is read, briefly bounded); one
    released early closes it.
    """

    def __init__(self, stream: Stream, *, operation: str = _START_OP) -> None:
        self._stream = stream
        self._operation = operation
        # Messages too large for general JSON are read in place, as output, or refused:
        # parsing one costs about its size, whatever the peer sends. Plain standard output
        # is decoded without its JSON being parsed.
        self._decoder = EnvelopeDecoder(large=parse_output_message, plain=parse_plain_stdout)
        self._pending: Deque[ProcessEvent] = collections.deque()
        self._end: Optional[EndStream] = None
        self._done = False
        self.pid: Optional[int] = None

    @property
    def aborted(self) -> bool:
        """True once :meth:`abort` was called."""
        return self._stream.aborted

    def abort(self) -> None:
        """Shut the stream down now (thread-safe, idempotent); a blocked read wakes up."""
        self._stream.abort()

    def close(self) -> None:
        """Release the stream (idempotent)."""
        self._stream.close()

    def skip_output(self) -> None:
        """From now on, drop output events unread (their JSON is never parsed or decoded).

        For a reader whose output budget is used up: the stream is still read to its end
        event, at the cost of the framing alone. Events already decoded are still delivered.
        """
        self._decoder.skip_when(is_output_message)

    def __enter__(self) -> ProcessStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[ProcessEvent]:
        return self

    def __next__(self) -> ProcessEvent:
        try:
            return self._next()
        except StopIteration:
            raise
        except Exception:
            # A failed stream is released at once; KeyboardInterrupt is left to the caller,
            # which may still want to kill the command before it lets go of the stream.
            self.close()
            raise

    def _next(self) -> ProcessEvent:
        while True:
            if self._pending:
                return self._pending.popleft()
            if self._end is not None:
                end, self._end = self._end, None
                self._done = True
                # The content is complete: read the body's end so the connection is kept.
                self._stream.finish()
                if end.error_code is not None:
                    raise RemoteError(end.error_code, end.error_message,
                                      operation=self._operation)
            if self._done:
                raise StopIteration
            chunk = self._stream.read1(_READ_SIZE)
            if not chunk:
                self._decoder.close()  # raises: EOF before the end-of-stream message
                raise ProtocolError("E2B process stream ended without an end-of-stream message")
            self._decoder.feed(chunk)
            for item in self._decoder:
                ev: Optional[ProcessEvent]
                if isinstance(item, EndStream):
                    # Events decoded before the end-of-stream are delivered first.
                    self._end = item
                    continue
                if isinstance(item, Parsed):
                    ev = item.value  # a large output message, read in place
                else:
                    ev = event_from_wire(item.data)
                if ev is None:
                    continue
                if isinstance(ev, StartEvent) and self.pid is None:
                    self.pid = ev.pid
                self._pending.append(ev)


class EnvdClient:
    """A client for one sandbox's envd.

    Bounds: every call but :meth:`start` takes at most its ``timeout`` in seconds in total,
    whatever envd (or a peer in its place) does — slow headers, a body a byte at a time, an
    upload read slowly, silence (for :meth:`download_head`, reading the body included); no
    cancel token is needed for that. :meth:`start` bounds the opening of its stream
    (:data:`START_OPEN_SECONDS`) and then each read (the keepalive).

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

    def _stream_headers(
        self, user: str, keepalive_seconds: int, extra: Mapping[str, str]
    ) -> Dict[str, str]:
        """The headers of a Connect server stream opened as ``user``."""
        return self._headers(
            {
                "Content-Type": "application/connect+json",
                "Connect-Protocol-Version": "1",
                "Authorization": _basic(user),
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

    def start(
        self,
        *,
        user: str,
        cmd: str,
        args: Sequence[str],
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        keepalive_seconds: int = KEEPALIVE_SECONDS,
        token: Optional[CancelToken] = None,
        tag: Optional[str] = None,
        stdin: bool = False,
    ) -> ProcessStream:
        """Start a process and return its event stream: ``POST /process.Process/Start``.

        Unless ``stdin`` is True the request sends ``stdin: false`` (the process reads
        ``/dev/null``); with it, the process reads a pipe fed by :meth:`send_input`. It
        asks envd for a keepalive every ``keepalive_seconds`` and reads with a timeout of
        ``2 * keepalive_seconds + 10`` seconds, so a silent peer ends in
        :class:`~e2b_provider.errors.TransportTimeout`; the opening (until envd's answer
        headers) takes at most :data:`START_OPEN_SECONDS` in total. Closing the stream does
        not stop the process (envd never kills on disconnect).

        Args:
            user: the OS user to run as (``Authorization: Basic base64("user:")``).
            cmd: the program.
            args: its arguments.
            envs: environment variables added for the process.
            cwd: the working directory.
            keepalive_seconds: the keepalive interval asked of envd (1-3600; never 0,
                which would crash envd).
            token: guards only the opening of the stream (until envd answers); once
                returned, stop the stream with :meth:`ProcessStream.abort`.
            tag: a label envd keeps with the process (see :meth:`signal_tag`).
            stdin: give the process a standard input pipe (fed by :meth:`send_input`).

        Returns:
            The event stream.

        Raises:
            InvalidArgument: bad arguments (before any I/O).
            E2BHttpError: envd (or the edge) answered with a non-200 status.
            ProtocolError: a 200 answer that is not a Connect stream.
            Cancelled, TransportError, TransportTimeout.
        """
        _check_user(user)
        process = _process_config(cmd, args, envs, cwd)
        _check_keepalive(keepalive_seconds)
        request: Dict[str, Any] = {"process": process, "stdin": bool(stdin)}
        if tag is not None:
            if not isinstance(tag, str) or not tag:
                raise InvalidArgument("tag must be a non-empty string")
            request["tag"] = tag
        return self._open_events("Start", request, user, keepalive_seconds, token, _START_OP)

    def connect(
        self,
        pid: int,
        *,
        user: str,
        keepalive_seconds: int = KEEPALIVE_SECONDS,
        token: Optional[CancelToken] = None,
    ) -> ProcessStream:
        """Follow a running process's events: ``POST /process.Process/Connect``.

        The stream starts with a start event and carries the output produced from now on,
        then the end event; bounded as :meth:`start`'s. Closing it leaves the process
        running.

        Raises:
            InvalidArgument: bad arguments (before any I/O).
            E2BHttpError: envd (or the edge) answered with a non-200 status.
            RemoteError: (from iteration) envd does not know the pid (``not_found``).
            ProtocolError, Cancelled, TransportError, TransportTimeout.
        """
        _check_pid(pid)
        _check_user(user)
        _check_keepalive(keepalive_seconds)
        return self._open_events("Connect", {"process": {"pid": pid}}, user, keepalive_seconds,
                                 token, _CONNECT_OP)

    def watch_dir(
        self,
        path: str,
        *,
        user: str,
        recursive: bool = False,
        keepalive_seconds: int = KEEPALIVE_SECONDS,
        token: Optional[CancelToken] = None,
        server_timeout: Optional[float] = None,
    ) -> Stream:
        """Watch a directory: ``POST /filesystem.Filesystem/WatchDir`` (a Connect server
        stream of ``start``, then ``filesystem`` events and keepalives; decoded by
        :mod:`e2b_provider.files.watch`).

        Bounded as :meth:`start`'s stream: the opening takes at most
        :data:`START_OPEN_SECONDS` (envd answers once the watch is set up, a recursive
        one after walking the tree), then each read at most ``2 * keepalive_seconds + 10``
        seconds. envd removes the watch when the stream ends or its connection closes.

        Args:
            path: the directory (absolute; envd resolves it as ``user``, watches as root).
            user: the user envd resolves the path for (``Authorization: Basic``).
            recursive: watch every directory below too.
            keepalive_seconds: the keepalive interval asked of envd (1-3600).
            token: guards only the opening of the stream.
            server_timeout: seconds after which envd ends the watch itself
                (``Connect-Timeout-Ms``; None: never).

        Returns:
            The raw stream (the caller decodes its envelopes and closes it).

        Raises:
            InvalidArgument: bad arguments (before any I/O).
            E2BHttpError: envd (or the edge) answered with a non-200 status.
            ProtocolError: a 200 answer that is not a Connect stream.
            Cancelled, TransportError, TransportTimeout.
        """
        _check_path(path)
        _check_user(user)
        _check_keepalive(keepalive_seconds)
        extra: Dict[str, str] = {}
        if server_timeout is not None:
            ms = _check_timeout(server_timeout, "server_timeout") * 1000.0
            extra["Connect-Timeout-Ms"] = str(max(1, min(int(ms), 9_999_999_999)))
        return self._open_stream(
            "/filesystem.Filesystem/WatchDir", {"path": path, "recursive": bool(recursive)},
            user, keepalive_seconds, token, _WATCH_OP, extra,
        )

    def start_pty(
        self,
        *,
        user: str,
        cmd: str,
        args: Sequence[str],
        cols: int,
        rows: int,
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        tag: Optional[str] = None,
        keepalive_seconds: int = KEEPALIVE_SECONDS,
        timeout_ms: Optional[int] = None,
        token: Optional[CancelToken] = None,
    ) -> RawStream:
        """Start a process on a terminal of its own: ``POST /process.Process/Start`` with
        ``pty: {size: {cols, rows}}`` (envd gives it a new session whose controlling
        terminal is the pty, on its standard input, output and error).

        The answer is returned as a :class:`~e2b_provider.transport.raw_stream.RawStream` of Connect
        envelopes (its events: start, data with ``pty`` bytes, keepalive, end), on a
        connection of its own, opened within :data:`START_OPEN_SECONDS`; it ends with
        :class:`TransportTimeout` after ``2 * keepalive_seconds + 10`` seconds of silence.
        With ``timeout_ms`` (``Connect-Timeout-Ms``) envd SIGKILLs the process that long
        after its start and ends the stream with ``deadline_exceeded``, whoever watches.
        Closing the stream does not stop the process.

        Raises:
            InvalidArgument: bad arguments (before any I/O).
            E2BHttpError: envd (or the edge) answered with a non-200 status.
            ProtocolError: a 200 answer that is not a Connect stream.
            Cancelled, TransportError, TransportTimeout.
        """
        _check_user(user)
        process = _process_config(cmd, args, envs, cwd)
        _check_keepalive(keepalive_seconds)
        # As the SDK's pty.create: no stdin field (envd ignores it for a terminal).
        request: Dict[str, Any] = {"process": process, "pty": _pty_size(cols, rows)}
        if tag is not None:
            request["tag"] = tag
        extra: Dict[str, str] = {}
        if timeout_ms is not None:
            if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not (
                0 < timeout_ms < 10**10
            ):
                raise InvalidArgument("timeout_ms must be a positive int of at most 10 digits")
            extra["Connect-Timeout-Ms"] = str(timeout_ms)
        return self._open_raw("Start", request, user, keepalive_seconds, token, extra)

    def connect_pty(
        self,
        pid: int,
        *,
        user: str,
        keepalive_seconds: int = KEEPALIVE_SECONDS,
        token: Optional[CancelToken] = None,
    ) -> RawStream:
        """Follow a terminal's process from now on: ``POST /process.Process/Connect``, as a
        :class:`~e2b_provider.transport.raw_stream.RawStream` (see :meth:`start_pty`). envd keeps no
        output: the stream carries a start event, then what the process writes from now on,
        then its end (a process that ended within the last 30 s: start and end only).

        Raises:
            InvalidArgument, E2BHttpError, ProtocolError, Cancelled, TransportError,
            TransportTimeout.
        """
        _check_pid(pid)
        _check_user(user)
        _check_keepalive(keepalive_seconds)
        return self._open_raw("Connect", {"process": {"pid": pid}}, user, keepalive_seconds,
                              token, {})

    def _open_raw(
        self,
        method: str,
        request: Dict[str, Any],
        user: str,
        keepalive_seconds: int,
        token: Optional[CancelToken],
        extra: Mapping[str, str],
    ) -> RawStream:
        headers = self._stream_headers(user, keepalive_seconds, extra)
        stream = self._transport.open_raw_stream(
            "POST",
            f"{self._base}/process.Process/{method}",
            headers=headers,
            data=encode_envelope(request),
            read_timeout=2.0 * keepalive_seconds + 10.0,
            token=token,
            operation=_PTY_OP,
            deadline=Deadline.after(START_OPEN_SECONDS),
        )
        _check_connect_answer(
            stream, _PTY_OP, lambda: stream.read_all(ERROR_BODY_BYTES, timeout=5.0)
        )
        return stream

    def resize_pty(
        self,
        pid: int,
        cols: int,
        rows: int,
        *,
        token: Optional[CancelToken] = None,
        timeout: float = 15.0,
    ) -> None:
        """Resize the terminal of process ``pid``: ``POST /process.Process/Update`` with
        ``pty: {size: {cols, rows}}`` (the kernel sends its foreground programs SIGWINCH).

        Raises:
            NotFound: no such process.
            E2BHttpError: any other error answer (``internal`` for a process without a
                terminal).
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        _check_pid(pid)
        body = {"process": {"pid": pid}, "pty": _pty_size(cols, rows)}
        resp = self._rpc("Update", body, "terminal resize", token, timeout)
        if not resp.ok:
            raise error_from_response(resp, "terminal resize")

    def list_processes(
        self, *, token: Optional[CancelToken] = None, timeout: float = 15.0
    ) -> List[Dict[str, Any]]:
        """The processes envd started that still run: ``POST /process.Process/List``, each
        ``{"pid": N, "tag": ..., "config": {"cmd", "args", "envs", "cwd"}}`` (proto3 JSON:
        absent fields omitted); an answer of at most :data:`LIST_BODY_BYTES`.

        Raises:
            E2BHttpError, ProtocolError, InvalidArgument, Cancelled, TransportError,
            TransportTimeout.
        """
        resp = self._rpc("List", {}, "process list", token, timeout,
                         max_body=LIST_BODY_BYTES)
        if not resp.ok:
            raise error_from_response(resp, "process list")
        body = resp.json("process list")
        found = body.get("processes") if isinstance(body, dict) else None
        if found is None:
            return []
        if not isinstance(found, list):
            raise ProtocolError("E2B process list: 'processes' is not a list")
        return [p for p in found if isinstance(p, dict)]

    def _open_events(
        self,
        method: str,
        request: Dict[str, Any],
        user: str,
        keepalive_seconds: int,
        token: Optional[CancelToken],
        operation: str,
    ) -> ProcessStream:
        stream = self._open_stream(f"/process.Process/{method}", request, user,
                                   keepalive_seconds, token, operation)
        return ProcessStream(stream, operation=operation)

    def _open_stream(
        self,
        route: str,
        request: Dict[str, Any],
        user: str,
        keepalive_seconds: int,
        token: Optional[CancelToken],
        operation: str,
        extra: Optional[Mapping[str, str]] = None,
    ) -> Stream:
        """Open one Connect server stream of envd; its answer checked (200, Connect)."""
        headers = self._stream_headers(user, keepalive_seconds, extra or {})
        stream = self._transport.open_stream(
            "POST",
            f"{self._base}{route}",
            headers=headers,
            data=encode_envelope(request),
            read_timeout=2.0 * keepalive_seconds + 10.0,
            token=token,
            operation=operation,
            deadline=Deadline.after(START_OPEN_SECONDS),
        )
        _check_connect_answer(
            stream, operation, lambda: stream.read_all(ERROR_BODY_BYTES, truncate=True)
        )
        return stream

    def _rpc(
        self,
        method: str,
        body: Dict[str, Any],
        operation: str,
        token: Optional[CancelToken],
        timeout: float,
        *,
        max_body: int = ERROR_BODY_BYTES,
    ) -> HttpResponse:
        """One unary Connect call of the process service (JSON), bounded by ``timeout``;
        an answer larger than ``max_body`` is a ProtocolError."""
        return self._transport.request(
            "POST",
            f"{self._base}/process.Process/{method}",
            headers=self._headers(
                {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
            ),
            json=body,
            token=token,
            **_within(timeout),
            operation=operation,
            max_body=max_body,
        )

    def send_input(
        self,
        pid: int,
        data: bytes,
        *,
        token: Optional[CancelToken] = None,
        timeout: float = 30.0,
        pty: bool = False,
    ) -> None:
        """Write ``data`` to the standard input of process ``pid`` (started with ``stdin``):
        ``POST /process.Process/SendInput``. envd writes one request's bytes in one piece,
        never interleaved with another request's. With ``pty``, the bytes go to the
        process's terminal (``input.pty``: what a keyboard would type) instead.

        Raises:
            NotFound: no such process (it ended, or never had that pid).
            E2BHttpError: any other error answer (e.g. stdin not enabled or closed).
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        _check_pid(pid)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument("data must be bytes")
        text = base64.b64encode(bytes(data)).decode("ascii")
        body = {"process": {"pid": pid}, "input": {"pty" if pty else "stdin": text}}
        resp = self._rpc("SendInput", body, "process input", token, timeout)
        if not resp.ok:
            raise error_from_response(resp, "process input")

    def close_stdin(
        self,
        pid: int,
        *,
        token: Optional[CancelToken] = None,
        timeout: float = 15.0,
    ) -> None:
        """Close the standard input of process ``pid`` (it reads end of file):
        ``POST /process.Process/CloseStdin``.

        Raises:
            NotFound: no such process.
            E2BHttpError: any other error answer.
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        _check_pid(pid)
        resp = self._rpc("CloseStdin", {"process": {"pid": pid}}, "process input", token,
                         timeout)
        if not resp.ok:
            raise error_from_response(resp, "process input")

    def send_signal(
        self,
        pid: int,
        signal: str = "SIGNAL_SIGKILL",
        *,
        token: Optional[CancelToken] = None,
        timeout: float = 15.0,
    ) -> bool:
        """Signal one process: ``POST /process.Process/SendSignal`` (that pid only).

        Args:
            pid: the process id (from the start event).
            signal: ``"SIGNAL_SIGKILL"`` or ``"SIGNAL_SIGTERM"`` (all envd accepts).
            token: cancels the call.
            timeout: the longest the call may take, in seconds (default 15).

        Returns:
            True when the signal was sent; False when the process was already gone
            (404 ``not_found``, or a 500 "process already finished" race at exit).

        Raises:
            E2BHttpError: any other error answer.
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        _check_pid(pid)
        return self._signal({"pid": pid}, signal, token, timeout)

    def signal_tag(
        self,
        tag: str,
        signal: str = "SIGNAL_SIGKILL",
        *,
        token: Optional[CancelToken] = None,
        timeout: float = 15.0,
    ) -> bool:
        """Signal the live process started with ``tag`` (see :meth:`start`).

        envd looks the tag up among the processes it started and has not yet reaped, so a
        True answer proves that process was alive (or an unreaped zombie, its pid still
        taken) when the signal was sent; a pid reused by another process is never hit.

        Returns:
            True when the signal was sent; False when no live process has that tag.

        Raises:
            E2BHttpError: any other error answer.
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        if not isinstance(tag, str) or not tag:
            raise InvalidArgument("tag must be a non-empty string")
        return self._signal({"tag": tag}, signal, token, timeout)

    def _signal(
        self,
        selector: Dict[str, Any],
        signal: str,
        token: Optional[CancelToken],
        timeout: float,
    ) -> bool:
        if signal not in SIGNALS:
            raise InvalidArgument(f"signal must be one of {sorted(SIGNALS)}")
        op = "process signal"
        resp = self._rpc("SendSignal", {"process": selector, "signal": signal}, op, token,
                         timeout)
        if resp.ok:
            return True
        message, code, _ = parse_error_body(resp.body)
        if resp.status == 404 and code == "not_found":
            return False
        if resp.status == 500 and "process already finished" in message:
            return False
        raise error_from_response(resp, op)

    def upload(
        self,
        path: str,
        data: bytes,
        *,
        user: str,
        token: Optional[CancelToken] = None,
        timeout: float = 120.0,
    ) -> None:
        """Write a file: multipart ``POST /files?path=<path>&username=<user>``.

        One part named ``file`` (file name = the path's base name) carries the bytes. envd
        creates missing parent directories and owns the file to ``user``.

        Raises:
            E2BHttpError: a non-2xx answer (e.g. 507 disk full, 401 unknown user).
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        self._post_file(path, user, data, token, timeout, raw=False)

    def _post_file(
        self,
        path: str,
        user: str,
        data: bytes,
        token: Optional[CancelToken],
        timeout: float,
        *,
        raw: bool,
    ) -> None:
        """``POST /files``: one multipart part named ``file`` (file name = the path's base
        name), or (``raw``) the bare bytes."""
        _check_path(path)
        _check_user(user)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument("data must be bytes")
        op = "file upload"
        if raw:
            body: Dict[str, Any] = {
                "headers": self._headers({"Content-Type": "application/octet-stream"}),
                "data": data,
            }
        else:
            name = posixpath.basename(path) or "file"
            body = {
                "headers": self._headers(),
                "files": {"file": (name, bytes(data), "application/octet-stream")},
            }
        resp = self._transport.request(
            "POST",
            self._base + "/files",
            params={"path": path, "username": user},
            token=token,
            operation=op,
            max_body=ERROR_BODY_BYTES,
            **_within(timeout),
            **body,
        )
        if not resp.ok:
            raise error_from_response(resp, op)

    def download(
        self,
        path: str,
        *,
        user: str,
        max_bytes: int,
        token: Optional[CancelToken] = None,
        timeout: float = 120.0,
    ) -> Optional[bytes]:
        """Read a whole file: ``GET /files?path=<path>&username=<user>``.

        Note that envd reads as root whatever ``user`` says (``user`` only resolves
        relative paths), so this is no permission check.

        Args:
            max_bytes: the largest file accepted; a longer one raises (nothing partial is
                returned).

        Returns:
            The bytes, or None when the path does not exist (404).

        Raises:
            ProtocolError: the file is larger than ``max_bytes``.
            E2BHttpError: another error answer (e.g. 400 for a directory).
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        _check_path(path)
        _check_user(user)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidArgument("max_bytes must be a non-negative int")
        op = "file download"
        resp = self._transport.request(
            "GET",
            self._base + "/files",
            headers=self._headers({"Accept-Encoding": "identity"}),
            params={"path": path, "username": user},
            token=token,
            operation=op,
            max_body=max(max_bytes, ERROR_BODY_BYTES),
            **_within(timeout),
        )
        if resp.status == 404:
            return None
        if not resp.ok:
            raise error_from_response(resp, op)
        if len(resp.body) > max_bytes:
            raise ProtocolError(f"E2B {op}: the file is larger than {max_bytes} bytes")
        return resp.body

    def upload_raw(
        self,
        path: str,
        data: bytes,
        *,
        user: str,
        token: Optional[CancelToken] = None,
        timeout: float = 120.0,
    ) -> None:
        """Write a file from a raw body: ``POST /files?path=<path>&username=<user>`` with
        ``Content-Type: application/octet-stream`` (envd >= 0.5.7; no multipart encoding,
        so the bytes are sent as they are).

        Raises:
            E2BHttpError: a non-2xx answer (e.g. 507 disk full, 401 unknown user).
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        self._post_file(path, user, data, token, timeout, raw=True)

    def upload_stream(
        self,
        path: str,
        body: Iterable[bytes],
        *,
        user: str,
        token: Optional[CancelToken] = None,
        timeout: float = 120.0,
        length: Optional[int] = None,
    ) -> None:
        """Write a file from pieces of bytes sent as they come:
        ``POST /files?path=<path>&username=<user>``, ``application/octet-stream``.

        With ``length`` (the exact number of bytes ``body`` yields) the request carries a
        ``Content-Length`` and the pieces go out as they are; without it, chunked transfer
        encoding (each piece copied once more into its chunk). An exception raised by
        ``body`` ends the request (the connection is dropped, so envd sees a cut upload)
        and propagates.

        Raises:
            E2BHttpError: a non-2xx answer.
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        _check_path(path)
        _check_user(user)
        op = "file upload"
        resp = self._transport.request(
            "POST",
            self._base + "/files",
            params={"path": path, "username": user},
            headers=self._headers({"Content-Type": "application/octet-stream"}),
            data=iter(body) if length is None else _Sized(body, length),
            token=token,
            operation=op,
            max_body=ERROR_BODY_BYTES,
            **_within(timeout),
        )
        if not resp.ok:
            raise error_from_response(resp, op)

    def download_head(
        self,
        path: str,
        *,
        user: str,
        length: int,
        token: Optional[CancelToken] = None,
        timeout: float = 120.0,
        on_open: Optional[Callable[[], None]] = None,
    ) -> bytes:
        """Read at most the first ``length`` bytes of a file: ``GET /files`` with
        ``Range: bytes=0-<length-1>`` (identity encoding).

        As :meth:`download`, envd reads as root: no permission check. A body of known
        length is read in one call, straight into the bytes returned.

        Args:
            path: the file.
            user: envd's ``username``.
            length: the most bytes wanted.
            token: aborts the request when it fires.
            timeout: the read timeout.
            on_open: called once the success answer's headers arrived, before its body is
                read (envd opens the file before it answers).

        Returns:
            The bytes (``b""`` for an empty file).

        Raises:
            E2BHttpError: an error answer (404 missing, 400 a directory, ...).
            ProtocolError: a whole-file answer longer than ``length``.
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        _check_path(path)
        _check_user(user)
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise InvalidArgument("length must be a positive int")
        op = "file download"
        query = urllib.parse.urlencode({"path": path, "username": user})
        stream = self._transport.open_stream(
            "GET",
            f"{self._base}/files?{query}",
            headers=self._headers(
                {"Accept-Encoding": "identity", "Range": f"bytes=0-{length - 1}"}
            ),
            data=b"",
            token=token,
            operation=op,
            deadline_bounds_body=True,
            **_within(timeout),
        )
        unregister = token.on_cancel(lambda _r: stream.abort()) if token is not None else None
        try:
            if stream.status == 416:
                return b""  # a range that starts past the end: the file is empty
            if not 200 <= stream.status < 300:
                raw = stream.read_all(ERROR_BODY_BYTES, truncate=True)
                raise error_from_response(HttpResponse(stream.status, stream.headers, raw), op)
            if on_open is not None:
                on_open()
            return stream.read_all(length)
        except BaseException:
            stream.abort()
            raise
        finally:
            if unregister is not None:
                unregister()
            stream.close()

    def health(self, *, timeout: float = 5.0) -> bool:
        """Whether envd answers ``GET /health`` (200/204) within ``timeout`` seconds.

        Never raises: any error, error status or timeout is False.
        """
        try:
            t = _check_timeout(timeout, "timeout")
            resp = self._transport.request(
                "GET",
                self._base + "/health",
                headers=self._headers(),
                read_timeout=t,
                connect_timeout=t,
                deadline=Deadline.after(t),
                operation="health check",
                max_body=ERROR_BODY_BYTES,
            )
        except E2BProviderError:
            return False
        return resp.status in (200, 204)
