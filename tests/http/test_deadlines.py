"""Every request has a total bound, whatever the peer does: hostile peers over real sockets.

A peer that trickles its headers or body a byte at a time, accepts and never answers, reads an
upload slowly or stalls a TLS handshake must not hold a caller past the request's deadline
(the per-read timeout alone lets a trickle go on for hours). The deadlines are enforced by the
watchdog; most tests give the transport a watchdog on a manual clock and make the deadline
pass when the peer is visibly in the middle of its trickle, so nothing depends on timing.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
from control_wire import SID
from server import ACCESS_TOKEN, API_KEY, Request, Responder, ScriptedServer
from waiting import thread_blocked_in, wait_until

from e2b_provider import DeploymentConfig, E2BSandboxProvider
from e2b_provider._watchdog import Watchdog
from e2b_provider.cancel import CancelToken, Deadline
from e2b_provider.clients.control import ControlPlane
from e2b_provider.clients.envd import EnvdClient
from e2b_provider.core.run_engine import run_process
from e2b_provider.errors import Conflict, E2BHttpError, TransportError, TransportTimeout
from e2b_provider.models import Target
from e2b_provider.protocol.connect import encode_envelope
from e2b_provider.transport.client import Transport

#: The peer's pace: one byte (or one piece) this often. It is the peer's behaviour, not a
#: way to wait for anything.
PACE = 0.02


class ManualClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Expiry:
    """A watchdog on a manual clock: :meth:`expire` makes every pending deadline pass now."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.watchdog = Watchdog(self.clock, start_thread=False)

    def expire(self) -> int:
        self.clock.now += 1e6
        return self.watchdog.run_due()


@pytest.fixture
def expiry() -> Iterator[Expiry]:
    e = Expiry()
    try:
        yield e
    finally:
        e.watchdog.close()


@pytest.fixture
def manual(expiry: Expiry) -> Iterator[Transport]:
    """A transport whose deadlines pass only when the test says so."""
    t = Transport(pool_connections=4, pool_maxsize=8, connect_timeout=30.0,
                  watchdog=expiry.watchdog)
    try:
        yield t
    finally:
        t.close()


class Trickle:
    """A peer's answer sent one byte per :data:`PACE` until the client goes away."""

    def __init__(self, head: bytes, body: bytes = b"", *, trickle_head: bool = False) -> None:
        self.head = head
        self.body = body
        self.trickle_head = trickle_head
        self.sent = 0
        self.stop = threading.Event()

    def __call__(self, q: Request, r: Responder) -> None:
        data = self.head + self.body
        start = 0 if self.trickle_head else len(self.head)
        if start:
            r.raw(self.head)
        for i in range(start, len(data)):
            try:
                r.raw(data[i:i + 1])
            except OSError:
                return  # the client gave up
            self.sent += 1
            if self.stop.wait(PACE) or r.server.stop_event.is_set():
                return
        r.drop()


def in_thread(fn: Callable[[], Any]) -> Dict[str, Any]:
    """Run ``fn`` on a thread; the dict gets ``result`` or ``error``, and ``thread``."""
    out: Dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    th = threading.Thread(target=run, daemon=True)
    out["thread"] = th
    th.start()
    return out


def finished(out: Dict[str, Any]) -> Any:
    out["thread"].join(10)
    assert not out["thread"].is_alive(), "the call did not end"
    return out


@contextlib.contextmanager
def raw_peer(serve: Callable[[socket.socket, threading.Event], None],
             rcvbuf: Optional[int] = None) -> Iterator[int]:
    """A TCP listener on 127.0.0.1 whose connections are served by ``serve(conn, stop)``."""
    srv = socket.socket()
    if rcvbuf is not None:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()
    conns: List[socket.socket] = []
    threads: List[threading.Thread] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conns.append(conn)
            th = threading.Thread(target=serve, args=(conn, stop), daemon=True)
            threads.append(th)
            th.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            srv.shutdown(socket.SHUT_RDWR)
        srv.close()
        acceptor.join(5)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        for th in threads:
            th.join(5)


def overran(exc: BaseException) -> bool:
    return isinstance(exc, TransportTimeout) and "gave no complete answer within" in str(exc)


# -- buffered requests ---------------------------------------------------------------------


def test_a_trickled_body_ends_at_the_default_deadline(
    server: ScriptedServer, transport: Transport
) -> None:
    """No deadline given, no token: a byte every 20 ms keeps every read within its 0.5 s
    read timeout, yet the request ends at its default deadline (connect + read timeout)."""
    trickle = Trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n", b"x" * 2000)
    server.on("GET", "/t", trickle)
    with pytest.raises(TransportTimeout) as ei:
        transport.request("GET", server.url + "/t", read_timeout=0.5, operation="GET /t")
    assert overran(ei.value), ei.value
    assert f"{server.url}/t gave no complete answer" in str(ei.value)
    assert trickle.sent < 2000


@pytest.mark.parametrize(
    "head, body, trickle_head",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n", b"x" * 2000, False),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"7d0\r\n" + b"x" * 2000,
         False),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"x" * 2000, False),
        (b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 2000 + b"\r\n\r\n", b"", True),
    ],
    ids=["content-length", "chunked", "close-delimited", "headers"],
)  # fmt: skip
def test_a_trickled_answer_ends_at_the_deadline(
    server: ScriptedServer, manual: Transport, expiry: Expiry, head: bytes, body: bytes,
    trickle_head: bool,
) -> None:
    trickle = Trickle(head, body, trickle_head=trickle_head)
    server.on("GET", "/t", trickle)
    server.on("GET", "/ok", lambda q, r: r.send(200, b"fine"))
    out = in_thread(lambda: manual.request(
        "GET", server.url + "/t", read_timeout=60, operation="GET /t",
        params={"signature": ACCESS_TOKEN},
    ))
    wait_until(lambda: trickle.sent >= 3, what="the peer trickling its answer")
    assert expiry.expire() == 1
    err = finished(out).get("error")
    assert err is not None and overran(err), err
    assert ACCESS_TOKEN not in str(err) and "signature" not in str(err)
    # The connection cut at its deadline is never reused.
    accepted = server.accepted
    assert manual.request("GET", server.url + "/ok", read_timeout=5, operation="ok").body == b"fine"
    assert server.accepted == accepted + 1


def test_a_peer_that_accepts_and_never_answers(
    server: ScriptedServer, manual: Transport, expiry: Expiry
) -> None:
    server.on("POST", "/silent", lambda q, r: r.hold(timeout=30))
    out = in_thread(lambda: manual.request(
        "POST", server.url + "/silent", json={"a": 1}, read_timeout=60, operation="silent"
    ))
    wait_until(lambda: server.received("POST", "/silent"), what="the request to arrive")
    wait_until(lambda: thread_blocked_in(out["thread"].ident, "socket.py"),
               what="the client waiting for the answer")
    expiry.expire()
    err = finished(out).get("error")
    assert err is not None and overran(err), err


def test_an_upload_read_slowly_ends_at_the_deadline(manual: Transport, expiry: Expiry) -> None:
    received = [0]

    def slow_reader(conn: socket.socket, stop: threading.Event) -> None:
        while not stop.wait(PACE):
            try:
                data = conn.recv(1024)
            except OSError:
                return
            if not data:
                return
            received[0] += len(data)

    with raw_peer(slow_reader, rcvbuf=4096) as port:
        out = in_thread(lambda: manual.request(
            "POST", f"http://127.0.0.1:{port}/files", data=b"u" * (8 << 20), read_timeout=60,
            operation="file upload",
        ))
        wait_until(lambda: received[0] >= 4096, what="the peer reading the upload")
        wait_until(lambda: thread_blocked_in(out["thread"].ident, "client.py"),
                   what="the client blocked sending")
        expiry.expire()
        err = finished(out).get("error")
    assert err is not None and overran(err), err


def test_an_upload_may_take_longer_than_the_connect_timeout(server: ScriptedServer) -> None:
    """urllib3 sends with the connect timeout, which bounds a whole ``sendall``: a large
    upload over a slow link failed after it. The request's deadline bounds it instead."""
    size = 16 << 20

    def paced_reader(conn: socket.socket, stop: threading.Event) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        body = head.partition(b"\r\n\r\n")[2]
        got = len(body)
        while got < size and not stop.wait(PACE):
            data = conn.recv(256 * 1024)
            if not data:
                return
            got += len(data)
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

    with raw_peer(paced_reader, rcvbuf=65536) as port, \
            Transport(connect_timeout=0.2) as t:
        resp = t.request("POST", f"http://127.0.0.1:{port}/files", data=b"u" * size,
                         read_timeout=30, operation="file upload",
                         deadline=Deadline.after(120))
    assert resp.status == 204


def test_a_stalled_tls_handshake_ends_at_the_deadline(
    manual: Transport, expiry: Expiry
) -> None:
    """The peer starts a TLS record that claims 16 KiB and sends it a byte at a time: each
    read of the handshake gets a byte in time, so only the deadline ends it."""
    sent = [0]

    def stall(conn: socket.socket, stop: threading.Event) -> None:
        try:
            conn.recv(4096)  # the ClientHello
            conn.sendall(b"\x16\x03\x03\x40\x00")
            while not stop.wait(PACE):
                conn.sendall(b"\x00")
                sent[0] += 1
        except OSError:
            return

    with raw_peer(stall) as port:
        out = in_thread(lambda: manual.request(
            "GET", f"https://127.0.0.1:{port}/health", read_timeout=60, operation="health check",
        ))
        wait_until(lambda: sent[0] >= 3, what="the peer stalling the handshake")
        expiry.expire()
        err = finished(out).get("error")
    assert err is not None and overran(err), err


def test_no_time_left_sends_nothing(server: ScriptedServer, transport: Transport) -> None:
    server.on("GET", "/x", lambda q, r: r.send(200, b"x"))
    with pytest.raises(TransportTimeout, match="no time was left"):
        transport.request("GET", server.url + "/x", read_timeout=5, operation="GET /x",
                          deadline=Deadline.after(0))
    assert server.received() == []


def test_a_deadline_that_does_not_pass_changes_nothing(
    server: ScriptedServer, manual: Transport, expiry: Expiry
) -> None:
    server.on("GET", "/x", lambda q, r: r.send(200, b"x"))
    for _ in range(3):
        assert manual.request("GET", server.url + "/x", read_timeout=5, operation="x").ok
    assert server.accepted == 1  # kept
    assert expiry.watchdog.pending_count() == 0  # every request's timer was cancelled
    assert expiry.expire() == 0


# -- streams ---------------------------------------------------------------------------------


def test_the_opening_of_a_stream_is_bounded(
    server: ScriptedServer, manual: Transport, expiry: Expiry
) -> None:
    trickle = Trickle(b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 2000 + b"\r\n\r\n",
                      trickle_head=True)
    server.on("POST", "/process.Process/Start", trickle)
    envd = EnvdClient(manual, Target(url=server.url, sandbox_id=SID, access_token=ACCESS_TOKEN))
    out = in_thread(lambda: envd.start(user="user", cmd="true", args=[]))
    wait_until(lambda: trickle.sent >= 3, what="the peer trickling its headers")
    expiry.expire()
    err = finished(out).get("error")
    assert err is not None and overran(err), err


@pytest.mark.parametrize("bounds_body", [False, True])
def test_a_stream_is_bounded_past_its_opening_only_when_asked(
    server: ScriptedServer, manual: Transport, expiry: Expiry, bounds_body: bool
) -> None:
    go_on = threading.Event()

    def handler(q: Request, r: Responder) -> None:
        r.start_chunked(content_type="text/plain")
        r.chunk(b"first")
        r.hold(go_on)
        with contextlib.suppress(OSError):
            r.chunk(b"second")
            r.end_chunked()

    server.on("GET", "/s", handler)
    stream = manual.open_stream("GET", server.url + "/s", data=b"", read_timeout=60,
                                operation="file download", deadline_bounds_body=bounds_body)
    with stream:
        assert stream.read1() == b"first"
        expiry.expire()
        if bounds_body:
            with pytest.raises(TransportTimeout, match="gave no complete answer"):
                stream.read1()
        else:
            go_on.set()
            assert stream.read_all(100) == b"second"
    go_on.set()


# -- what the public calls do with it --------------------------------------------------------


def connect_answer() -> Dict[str, Any]:
    return {"sandboxID": SID, "templateID": "base", "envdVersion": "0.6.13",
            "envdAccessToken": ACCESS_TOKEN, "domain": "e2b.test"}


def test_resume_against_a_trickled_answer_ends_at_its_deadline(
    server: ScriptedServer, expiry: Expiry
) -> None:
    """The issue's case: a connect answer that declares 2,000 bytes and sends one at a time
    held ``resume()`` for about 33 minutes (the read timeout is per read)."""
    trickle = Trickle(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 2000\r\n\r\n", b" " * 2000)
    server.on("POST", f"/v2/sandboxes/{SID}/connect", trickle)
    config = DeploymentConfig(API_KEY, "base", api_url=server.url, sandbox_url=server.url,
                              domain="e2b.test")
    with E2BSandboxProvider(config, watchdog=expiry.watchdog) as provider:
        out = in_thread(lambda: provider.resume(SID))
        wait_until(lambda: trickle.sent >= 3, what="the peer trickling its answer")
        expiry.expire()
        err = finished(out).get("error")
    assert isinstance(err, TransportTimeout), err
    assert str(err).startswith(f"resuming sandbox {SID} failed: timed out: {server.url}/v2/"
                               f"sandboxes/{SID}/connect gave no complete answer within")
    assert API_KEY not in str(err) and ACCESS_TOKEN not in str(err)


def test_a_retry_is_made_only_while_time_is_left_for_it(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("GET", f"/sandboxes/{SID}",
              lambda q, r: r.json(503, {"code": 503, "message": "busy"}, {"Retry-After": "1"}))
    control = ControlPlane(transport, api_url=server.url, api_key=API_KEY, domain="e2b.test",
                           call_timeout=1.5)
    with pytest.raises(E2BHttpError) as ei:
        control.get(SID)
    assert ei.value.status == 503
    # A wait of 1 s would leave less than a second for the retry: not made.
    assert len(server.received("GET", f"/sandboxes/{SID}")) == 1


def test_a_409_is_waited_out_only_while_time_is_left(
    server: ScriptedServer, transport: Transport
) -> None:
    path = f"/v2/sandboxes/{SID}/connect"
    server.on("POST", path, lambda q, r: r.json(409, {"code": 409, "message": "pausing"}))
    control = ControlPlane(transport, api_url=server.url, api_key=API_KEY, domain="e2b.test",
                           call_timeout=1.2)
    with pytest.raises(Conflict):
        control.attach(SID, timeout_seconds=300)
    assert len(server.received("POST", path)) == 1  # without the bound: 6 tries


def test_a_caller_deadline_shortens_a_call(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("GET", "/v2/sandboxes", lambda q, r: r.json(200, []))
    control = ControlPlane(transport, api_url=server.url, api_key=API_KEY, domain="e2b.test")
    with pytest.raises(TransportTimeout, match="time ran out"):
        control.list(deadline=Deadline.after(0))
    assert server.received() == []


@pytest.mark.parametrize("call", ["signal", "download", "upload", "health"])
def test_buffered_envd_calls_end_at_their_timeout(
    server: ScriptedServer, manual: Transport, expiry: Expiry, call: str
) -> None:
    trickle = Trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n", b"x" * 2000)
    for method, path in (("POST", "/process.Process/SendSignal"), ("GET", "/files"),
                         ("POST", "/files"), ("GET", "/health")):
        server.on(method, path, trickle)
    envd = EnvdClient(manual, Target(url=server.url, sandbox_id=SID, access_token=ACCESS_TOKEN))
    calls: Dict[str, Callable[[], Any]] = {
        "signal": lambda: envd.send_signal(42, timeout=600),
        "download": lambda: envd.download("/x", user="user", max_bytes=1 << 20, timeout=600),
        "upload": lambda: envd.upload_raw("/x", b"data", user="user", timeout=600),
        "health": lambda: envd.health(timeout=600),
    }
    out = in_thread(calls[call])
    wait_until(lambda: trickle.sent >= 3, what="the peer trickling its answer")
    expiry.expire()
    done = finished(out)
    if call == "health":
        assert done.get("result") is False
    else:
        err = done.get("error")
        assert err is not None and overran(err), err
        assert ACCESS_TOKEN not in str(err)


def test_stream_errors_name_the_url(server: ScriptedServer, transport: Transport) -> None:
    def cut(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(encode_envelope({"event": {"start": {"pid": 1}}}))
        r.drop()

    server.on("POST", "/process.Process/Start", cut)
    envd = EnvdClient(transport, Target(url=server.url, sandbox_id=SID,
                                        access_token=ACCESS_TOKEN))
    with pytest.raises(TransportError) as ei, envd.start(user="u", cmd="true", args=[]) as s:
        list(s)
    assert f"{server.url}/process.Process/Start" in str(ei.value)


# -- an exec whose deadline passes after its end event ---------------------------------------


@pytest.mark.parametrize("trigger", ["deadline", "cancel"])
def test_a_deadline_after_the_end_event_leaves_the_exit_status(
    server: ScriptedServer, transport: Transport, expiry: Expiry, trigger: str
) -> None:
    """The end event arrived, then the deadline passed (or the caller cancelled) before the
    stream closed: the result is the exit status, not a timeout, and nothing is killed."""
    closing = threading.Event()

    def handler(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(encode_envelope({"event": {"start": {"pid": 42}}}))
        # output and the end event in one piece: both are taken in before the next read
        r.chunk(encode_envelope({"event": {"data": {"stdout": "b3V0"}}})
                + encode_envelope({"event": {"end": {"exited": True, "exitCode": 3,
                                                     "status": "exit status 3"}}}))
        r.hold(closing)
        with contextlib.suppress(OSError):
            r.chunk(encode_envelope({}, end_stream=True))
            r.end_chunked()

    server.on("POST", "/process.Process/Start", handler)
    envd = EnvdClient(transport, Target(url=server.url, sandbox_id=SID,
                                        access_token=ACCESS_TOKEN))
    seen: List[str] = []
    kills: List[Optional[int]] = []

    def killer(pid: Optional[int], bound: float) -> bool:
        kills.append(pid)
        return True

    token = CancelToken()
    out = in_thread(lambda: run_process(
        envd, user="user", cmd="/bin/sh", args=["-c", "exit 3"], max_output_bytes=1024,
        timeout=60, cancel=token, watchdog=expiry.watchdog, killer=killer,
        on_stdout=seen.append,
    ))
    wait_until(lambda: seen == ["out"], what="the output before the end event")
    wait_until(lambda: thread_blocked_in(out["thread"].ident, "socket.py"),
               what="the end event taken in and the stream's end awaited")
    if trigger == "deadline":
        assert expiry.expire() == 1  # the exec's deadline passes now
    else:
        token.cancel("too late")
    closing.set()
    result = finished(out).get("result")
    assert result is not None, out.get("error")
    assert (result.exit_code, result.timed_out, result.cancelled, result.wedged) == (
        3, False, False, False)
    assert result.stdout == b"out"
    assert kills == []
