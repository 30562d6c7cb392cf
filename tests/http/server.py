"""A tiny threaded HTTP/1.1 test server on 127.0.0.1 that plays scripted answers.

Tests register handlers per ``(method, path)``; each request pops the next handler of its
route (the last one repeats). A handler gets the recorded :class:`Request` and a
:class:`Responder` that can answer in full, stream chunks, stall on an event, or drop the
connection. Every request is recorded so tests can assert on what was actually sent, and
every accepted connection is counted (:attr:`ScriptedServer.accepted`), so tests can tell a
kept connection from a new one. :func:`client_sockets` counts this process's open sockets to a port.

``stop()`` wakes stalled handlers, shuts every open connection down and joins every handler
thread, so no thread or socket outlives a test.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import socketserver
import threading
import urllib.parse
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

Handler = Callable[["Request", "Responder"], object]

#: Distinctive fake secrets: tests assert they never show up in exception text.
API_KEY = "e2b_SECRETKEY0123456789abcdef0123456789"
ACCESS_TOKEN = "envdTOKENsecret0123456789abcdef0123456789abcdef"


def assert_no_secret(exc: BaseException) -> None:
    """Neither fake secret appears in the exception's text or repr."""
    for text in (str(exc), repr(exc)):
        assert API_KEY not in text
        assert ACCESS_TOKEN not in text


class Request:
    """One request as the server received it."""

    def __init__(
        self, method: str, target: str, headers: Dict[str, str], body: bytes
    ) -> None:
        self.method = method
        self.target = target
        parts = urllib.parse.urlsplit(target)
        self.path = parts.path
        self.raw_query = parts.query
        self.query: Dict[str, List[str]] = urllib.parse.parse_qs(
            parts.query, keep_blank_values=True
        )
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))

    def q(self, name: str) -> Optional[str]:
        vals = self.query.get(name)
        return vals[0] if vals else None

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.target}>"


class Responder:
    """Writes one answer on the connection (full, chunked, raw) or drops it."""

    def __init__(self, handler: _RequestHandler, server: ScriptedServer) -> None:
        self._h = handler
        self.server = server

    def send(
        self,
        status: int,
        body: bytes = b"",
        headers: Optional[Mapping[str, str]] = None,
        *,
        content_type: str = "application/octet-stream",
    ) -> None:
        h = self._h
        h.send_response_only(status)
        hdrs = {"Content-Type": content_type, "Content-Length": str(len(body))}
        hdrs.update(headers or {})
        for k, v in hdrs.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(body)
        h.wfile.flush()

    def json(
        self, status: int, obj: Any, headers: Optional[Mapping[str, str]] = None
    ) -> None:
        self.send(
            status, json.dumps(obj).encode(), headers, content_type="application/json"
        )

    def empty(self, status: int = 204, headers: Optional[Mapping[str, str]] = None) -> None:
        h = self._h
        h.send_response_only(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        if status != 204:
            h.send_header("Content-Length", "0")
        h.end_headers()
        h.wfile.flush()

    def start_chunked(
        self,
        status: int = 200,
        headers: Optional[Mapping[str, str]] = None,
        *,
        content_type: str = "application/connect+json",
    ) -> None:
        h = self._h
        h.send_response_only(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Transfer-Encoding", "chunked")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.flush()

    def chunk(self, data: bytes) -> None:
        if data:
            self._h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self._h.wfile.flush()

    def end_chunked(self) -> None:
        self._h.wfile.write(b"0\r\n\r\n")
        self._h.wfile.flush()

    def raw(self, data: bytes) -> None:
        self._h.wfile.write(data)
        self._h.wfile.flush()

    def hold(self, event: Optional[threading.Event] = None, timeout: float = 10.0) -> bool:
        """Stall until ``event`` (or the server's stop) is set, at most ``timeout`` seconds."""
        ev = event or self.server.stop_event
        step = 0.05
        waited = 0.0
        while waited < timeout:
            if ev.wait(step) or self.server.stop_event.is_set():
                return ev.is_set()
            waited += step
        return False

    def drop(self) -> None:
        """Close the connection without (further) answer."""
        self._h.close_connection = True
        with contextlib.suppress(OSError):
            self._h.connection.shutdown(socket.SHUT_RDWR)


class _RequestHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 15  # backstop: an idle keep-alive connection never pins a thread forever
    server: ScriptedServer

    def setup(self) -> None:
        super().setup()
        self.server._track(self.connection, True)
        self.server._count_accept()

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            pass  # the client went away (or aborted on purpose): nothing to answer

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        self.server._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _read_body(self) -> bytes:
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            out = bytearray()
            while True:
                line = self.rfile.readline()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length", "0") or "0")
        return self.rfile.read(n) if n else b""

    def _dispatch(self) -> None:
        body = self._read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        req = Request(self.command, self.path, headers, body)
        handler = self.server._take(req)
        resp = Responder(self, self.server)
        if handler is None:
            resp.json(599, {"code": 599, "message": f"no route for {req.method} {req.path}"})
            return
        try:
            handler(req, resp)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_POST = do_DELETE = do_PUT = _dispatch


class ScriptedServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """The scripted server. Use as a context manager or call :meth:`stop`."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RequestHandler)
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._routes: Dict[Tuple[str, str], List[Handler]] = {}
        self._conns: set[socket.socket] = set()
        self._accepted = 0
        self.requests: List[Request] = []
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def on(self, method: str, path: str, *handlers: Handler) -> None:
        """Script the answers for ``method path`` (each request takes the next; last repeats)."""
        with self._lock:
            self._routes[(method.upper(), path)] = list(handlers)

    def _take(self, req: Request) -> Optional[Handler]:
        with self._lock:
            self.requests.append(req)
            handlers = self._routes.get((req.method, req.path))
            if not handlers:
                return None
            return handlers.pop(0) if len(handlers) > 1 else handlers[0]

    def received(self, method: Optional[str] = None, path: Optional[str] = None) -> List[Request]:
        with self._lock:
            return [
                r for r in self.requests
                if (method is None or r.method == method) and (path is None or r.path == path)
            ]

    @property
    def accepted(self) -> int:
        """Connections accepted so far (one per new TCP connection of a client)."""
        with self._lock:
            return self._accepted

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def _count_accept(self) -> None:
        with self._lock:
            self._accepted += 1

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def stop(self) -> None:
        self.stop_event.set()
        self.shutdown()
        self._thread.join(5)
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self.server_close()  # joins the handler threads (block_on_close)

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def blackhole() -> Iterator[str]:
    """A URL whose TCP connect never completes: a listener with a full accept backlog."""
    srv = socket.socket()
    fill: List[socket.socket] = []
    try:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            fill.append(s)
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in fill:
            s.close()
        srv.close()


def client_sockets(port: int) -> int:
    """This process's open TCP sockets connected to ``127.0.0.1:port`` (the client ends)."""
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port:
                inodes.add(fields[9])
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            n += 1
    return n
