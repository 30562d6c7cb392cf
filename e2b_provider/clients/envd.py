"""The envd client for one sandbox: processes, terminals, watches, signals, health.

This module owns :class:`EnvdClient` and the requests it makes to a sandbox's envd
(``process.Process/Start`` and ``Connect`` as Connect server streams, ``SendInput``,
``CloseStdin``, ``SendSignal``, ``Update`` and ``List`` as unary Connect calls,
``filesystem.Filesystem/WatchDir`` as a server stream, and ``/health``); its ``/files`` calls
are :class:`~e2b_provider.clients.envd_files.EnvdFiles`'s. Every request carries
``E2b-Sandbox-Id``, ``E2b-Sandbox-Port: 49983`` and ``X-Access-Token``; redirects are never
followed (the transport refuses them). All I/O goes through
:class:`~e2b_provider.transport.client.Transport`. The streams come back decoded
(:mod:`e2b_provider.clients.envd_streams`): a process's events as a :class:`ProcessStream`, a
watch's messages as a :class:`~e2b_provider.clients.envd_streams.WatchStream`. A terminal's
process (``Start`` with ``pty``, and ``Connect`` to it) is opened as a
:class:`~e2b_provider.transport.raw_stream.RawStream` instead, which its reader reads with a
timeout of its own through a :class:`~e2b_provider.clients.envd_streams.PtyStream`;
``SendInput`` with ``input.pty``, ``Update`` (resize) and ``List`` serve it.

No message built here contains the access token.
"""

from __future__ import annotations

import base64
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..cancel import CancelToken, Deadline
from ..errors import E2BProviderError, InvalidArgument, ProtocolError
from ..transport.error_mapping import error_from_response, parse_error_body
from ..transport.raw_stream import RawStream
from ..transport.response import HttpResponse
from ..transport.stream import Stream
from .envd_files import EnvdFiles
from .envd_requests import (
    ERROR_BODY_BYTES,
    KEEPALIVE_SECONDS,
    check_connect_answer,
    check_keepalive,
    check_path,
    check_pid,
    check_timeout,
    check_user,
    connect_request,
    pty_size,
    start_request,
    within,
)
from .envd_streams import PTY_OPERATION, START_OPERATION, ProcessStream, WatchStream

__all__ = [
    "SENDABLE_SIGNALS",
    "EnvdClient",
]

#: The largest answer to ``process.Process/List`` read: it holds the whole config (arguments,
#: environment) of every process envd runs, and the library's own sandbox programs travel as
#: arguments (the file agent about 59 KB, a background command's supervisor about 11 KiB).
LIST_BODY_BYTES = 64 << 20
#: The signals envd's SendSignal accepts.
SENDABLE_SIGNALS = frozenset({"SIGNAL_SIGKILL", "SIGNAL_SIGTERM"})
_CONNECT_OP = "process connect"
_WATCH_OP = "filesystem watch"


class EnvdClient(EnvdFiles):
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

    def start(
        self,
        *,
        user: str,
        cmd: str,
        args: Sequence[str],
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        keepalive_seconds: int = KEEPALIVE_SECONDS,
        cancel: Optional[CancelToken] = None,
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
            cancel: guards only the opening of the stream (until envd answers); once
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
        request = start_request(user, cmd, args, envs, cwd, keepalive_seconds)
        request["stdin"] = bool(stdin)
        if tag is not None:
            if not isinstance(tag, str) or not tag:
                raise InvalidArgument("tag must be a non-empty string")
            request["tag"] = tag
        return self._process_stream(*self._stream_opening(
            "/process.Process/Start", request, user, keepalive_seconds, cancel, START_OPERATION
        ))

    def connect(
        self,
        pid: int,
        *,
        user: str,
        keepalive_seconds: int = KEEPALIVE_SECONDS,
        cancel: Optional[CancelToken] = None,
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
        request = connect_request(pid, user, keepalive_seconds)
        return self._process_stream(*self._stream_opening(
            "/process.Process/Connect", request, user, keepalive_seconds, cancel, _CONNECT_OP
        ))

    def watch_dir(
        self,
        path: str,
        *,
        user: str,
        recursive: bool = False,
        keepalive_seconds: int = KEEPALIVE_SECONDS,
        cancel: Optional[CancelToken] = None,
        server_timeout: Optional[float] = None,
    ) -> WatchStream:
        """Watch a directory: ``POST /filesystem.Filesystem/WatchDir`` (a Connect server
        stream of ``start``, then ``filesystem`` events and keepalives; their meaning:
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
            cancel: guards only the opening of the stream.
            server_timeout: seconds after which envd ends the watch itself
                (``Connect-Timeout-Ms``; None: never).

        Returns:
            The stream of the watch's messages (the caller closes it).

        Raises:
            InvalidArgument: bad arguments (before any I/O).
            E2BHttpError: envd (or the edge) answered with a non-200 status.
            ProtocolError: a 200 answer that is not a Connect stream.
            Cancelled, TransportError, TransportTimeout.
        """
        check_path(path)
        check_user(user)
        check_keepalive(keepalive_seconds)
        extra: Dict[str, str] = {}
        if server_timeout is not None:
            ms = check_timeout(server_timeout, "server_timeout") * 1000.0
            extra["Connect-Timeout-Ms"] = str(max(1, min(int(ms), 9_999_999_999)))
        opening = self._stream_opening(
            "/filesystem.Filesystem/WatchDir", {"path": path, "recursive": bool(recursive)},
            user, keepalive_seconds, cancel, _WATCH_OP, extra,
        )
        return WatchStream(self._open_stream(*opening))

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
        cancel: Optional[CancelToken] = None,
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
            InvalidArgument, E2BHttpError, ProtocolError, Cancelled, TransportError,
            TransportTimeout: as :meth:`start`.
        """
        request = start_request(user, cmd, args, envs, cwd, keepalive_seconds)
        # As the SDK's pty.create: no stdin field (envd ignores it for a terminal).
        request["pty"] = pty_size(cols, rows)
        if tag is not None:
            request["tag"] = tag
        extra: Dict[str, str] = {}
        if timeout_ms is not None:
            if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not (
                0 < timeout_ms < 10**10
            ):
                raise InvalidArgument("timeout_ms must be a positive int of at most 10 digits")
            extra["Connect-Timeout-Ms"] = str(timeout_ms)
        return self._open_raw(*self._stream_opening(
            "/process.Process/Start", request, user, keepalive_seconds, cancel, PTY_OPERATION,
            extra,
        ))

    def connect_pty(
        self,
        pid: int,
        *,
        user: str,
        keepalive_seconds: int = KEEPALIVE_SECONDS,
        cancel: Optional[CancelToken] = None,
    ) -> RawStream:
        """Follow a terminal's process from now on: ``POST /process.Process/Connect``, as a
        :class:`~e2b_provider.transport.raw_stream.RawStream` (see :meth:`start_pty`). envd keeps no
        output: the stream carries a start event, then what the process writes from now on,
        then its end (a process that ended within the last 30 s: start and end only).

        Raises:
            InvalidArgument, E2BHttpError, ProtocolError, Cancelled, TransportError,
            TransportTimeout.
        """
        request = connect_request(pid, user, keepalive_seconds)
        return self._open_raw(*self._stream_opening(
            "/process.Process/Connect", request, user, keepalive_seconds, cancel, PTY_OPERATION
        ))

    def _open_raw(self, url: str, opening: Dict[str, Any]) -> RawStream:
        """Open one Connect server stream of envd as a raw stream (``opening``: see
        :meth:`_stream_opening`); its answer checked (200, Connect)."""
        stream = self._transport.open_raw_stream("POST", url, **opening)
        check_connect_answer(
            stream, opening["operation"], lambda: stream.read_all(ERROR_BODY_BYTES, timeout=5.0)
        )
        return stream

    def resize_pty(
        self,
        pid: int,
        cols: int,
        rows: int,
        *,
        cancel: Optional[CancelToken] = None,
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
        check_pid(pid)
        body = {"process": {"pid": pid}, "pty": pty_size(cols, rows)}
        resp = self._rpc("Update", body, "terminal resize", cancel, timeout)
        if not resp.ok:
            raise error_from_response(resp, "terminal resize")

    def list_processes(
        self, *, cancel: Optional[CancelToken] = None, timeout: float = 15.0
    ) -> List[Dict[str, Any]]:
        """The processes envd started that still run: ``POST /process.Process/List``, each
        ``{"pid": N, "tag": ..., "config": {"cmd", "args", "envs", "cwd"}}`` (proto3 JSON:
        absent fields omitted); an answer of at most :data:`LIST_BODY_BYTES`.

        Raises:
            E2BHttpError, ProtocolError, InvalidArgument, Cancelled, TransportError,
            TransportTimeout.
        """
        resp = self._rpc("List", {}, "process list", cancel, timeout,
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

    def _process_stream(self, url: str, opening: Dict[str, Any]) -> ProcessStream:
        """A process's events (``Start`` or ``Connect``), as :meth:`_open_stream` opens
        them."""
        return ProcessStream(self._open_stream(url, opening), operation=opening["operation"])

    def _open_stream(self, url: str, opening: Dict[str, Any]) -> Stream:
        """Open one Connect server stream of envd (``opening``: see :meth:`_stream_opening`);
        its answer checked (200, Connect)."""
        stream = self._transport.open_stream("POST", url, **opening)
        check_connect_answer(
            stream, opening["operation"],
            lambda: stream.read_all(ERROR_BODY_BYTES, truncate=True),
        )
        return stream

    def _rpc(
        self,
        method: str,
        body: Dict[str, Any],
        operation: str,
        cancel: Optional[CancelToken],
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
            cancel=cancel,
            **within(timeout),
            operation=operation,
            max_body=max_body,
        )

    def send_input(
        self,
        pid: int,
        data: bytes,
        *,
        cancel: Optional[CancelToken] = None,
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
        check_pid(pid)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument("data must be bytes")
        text = base64.b64encode(bytes(data)).decode("ascii")
        body = {"process": {"pid": pid}, "input": {"pty" if pty else "stdin": text}}
        resp = self._rpc("SendInput", body, "process input", cancel, timeout)
        if not resp.ok:
            raise error_from_response(resp, "process input")

    def close_stdin(
        self,
        pid: int,
        *,
        cancel: Optional[CancelToken] = None,
        timeout: float = 15.0,
    ) -> None:
        """Close the standard input of process ``pid`` (it reads end of file):
        ``POST /process.Process/CloseStdin``.

        Raises:
            NotFound: no such process.
            E2BHttpError: any other error answer.
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        check_pid(pid)
        resp = self._rpc("CloseStdin", {"process": {"pid": pid}}, "process input", cancel,
                         timeout)
        if not resp.ok:
            raise error_from_response(resp, "process input")

    def send_signal(
        self,
        pid: int,
        signal: str = "SIGNAL_SIGKILL",
        *,
        cancel: Optional[CancelToken] = None,
        timeout: float = 15.0,
    ) -> bool:
        """Signal one process: ``POST /process.Process/SendSignal`` (that pid only).

        Args:
            pid: the process id (from the start event).
            signal: ``"SIGNAL_SIGKILL"`` or ``"SIGNAL_SIGTERM"`` (all envd accepts).
            cancel: cancels the call.
            timeout: the longest the call may take, in seconds (default 15).

        Returns:
            True when the signal was sent; False when the process was already gone
            (404 ``not_found``, or a 500 "process already finished" race at exit).

        Raises:
            E2BHttpError: any other error answer.
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        check_pid(pid)
        return self._signal({"pid": pid}, signal, cancel, timeout)

    def signal_tag(
        self,
        tag: str,
        signal: str = "SIGNAL_SIGKILL",
        *,
        cancel: Optional[CancelToken] = None,
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
        return self._signal({"tag": tag}, signal, cancel, timeout)

    def _signal(
        self,
        selector: Dict[str, Any],
        signal: str,
        cancel: Optional[CancelToken],
        timeout: float,
    ) -> bool:
        if signal not in SENDABLE_SIGNALS:
            raise InvalidArgument(f"signal must be one of {sorted(SENDABLE_SIGNALS)}")
        op = "process signal"
        resp = self._rpc("SendSignal", {"process": selector, "signal": signal}, op, cancel,
                         timeout)
        if resp.ok:
            return True
        message, code, _ = parse_error_body(resp.body)
        if resp.status == 404 and code == "not_found":
            return False
        if resp.status == 500 and "process already finished" in message:
            return False
        raise error_from_response(resp, op)

    def health(self, *, timeout: float = 5.0) -> bool:
        """Whether envd answers ``GET /health`` (200/204) within ``timeout`` seconds.

        Never raises: any error, error status or timeout is False.
        """
        try:
            t = check_timeout(timeout, "timeout")
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
