"""Connection reuse: kept after a complete answer, dropped after an abandoned one, closed on close.

Counted on both ends over real sockets: the scripted server counts the connections it
accepted, :func:`server.client_sockets` counts this process's open sockets to the server.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Callable, Iterator, List

import pytest
from server import Request, Responder, ScriptedServer, client_sockets
from waiting import run_in_threads

import e2b_provider.transport.pool as pool_mod
from e2b_provider.cancel import CancelToken
from e2b_provider.errors import Cancelled, ProtocolError, TransportError, TransportTimeout
from e2b_provider.transport.client import Transport
from e2b_provider.transport.stream import Stream


def _ok(q: Request, r: Responder) -> None:
    r.send(200, b"ok")


def _streaming(
    *chunks: bytes, end: bool = True, hold: float = 10
) -> Callable[[Request, Responder], None]:
    def handler(q: Request, r: Responder) -> None:
        r.start_chunked()
        for c in chunks:
            r.chunk(c)
        if end:
            r.end_chunked()
        else:
            r.hold(timeout=hold)

    return handler


def _open(transport: Transport, server: ScriptedServer, path: str = "/s", **kw: float) -> Stream:
    return transport.open_stream("POST", server.url + path, data=b"req",
                                 read_timeout=kw.get("read_timeout", 5.0), operation="stream")


def _get(transport: Transport, server: ScriptedServer, path: str = "/n") -> bytes:
    return transport.request("GET", server.url + path, read_timeout=5, operation="get").body


# -- kept --------------------------------------------------------------------------------


def test_buffered_requests_share_one_connection(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("GET", "/cl", lambda q, r: r.send(200, b"x" * 3000))
    server.on("GET", "/chunked", _streaming(b"a" * 100, b"b" * 70000))
    server.on("GET", "/empty", lambda q, r: r.empty(204))
    server.on("GET", "/zero", lambda q, r: r.send(200, b""))
    server.on("GET", "/missing", lambda q, r: r.json(404, {"code": 404, "message": "no"}))
    server.on("POST", "/json", lambda q, r: r.json(200, {"echo": q.json()}))
    for _ in range(3):
        assert len(_get(transport, server, "/cl")) == 3000
        assert len(_get(transport, server, "/chunked")) == 70100
        assert _get(transport, server, "/empty") == b""
        assert _get(transport, server, "/zero") == b""
        assert transport.request("GET", server.url + "/missing", read_timeout=5,
                                 operation="get").status == 404
        assert transport.request("POST", server.url + "/json", json={"a": 1}, read_timeout=5,
                                 operation="post").json() == {"echo": {"a": 1}}
    assert len(server.received()) == 18
    assert server.accepted == 1


def test_stream_read_to_its_end_keeps_the_connection(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("POST", "/s", _streaming(b"one", b"two"))
    server.on("GET", "/n", _ok)
    for _ in range(3):
        with _open(transport, server) as st:
            assert st.read_all(100) == b"onetwo"
        assert _get(transport, server) == b"ok"
    assert server.accepted == 1
    assert client_sockets(server.port) == 1


def test_a_body_of_known_length_read_in_one_call_keeps_the_connection(
    server: ScriptedServer, transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB, Content-Length
    server.on("GET", "/big", lambda q, r: r.send(200, body))
    server.on("GET", "/n", _ok)
    pieces: List[int] = []
    read1 = Stream.read1

    def counting(st: Stream, n: int = 65536) -> bytes:
        pieces.append(n)
        return read1(st, n)

    monkeypatch.setattr(Stream, "read1", counting)
    for _ in range(3):
        st = transport.open_stream("GET", server.url + "/big", data=b"", read_timeout=5,
                                   operation="big")
        assert st.read_all(len(body)) == body
        assert pieces == []  # one call, no pieces
        assert read1(st) == b""  # and the end is known
        st.close()
        assert not st.aborted
        assert _get(transport, server) == b"ok"
    assert server.accepted == 1
    assert client_sockets(server.port) == 1


def test_finish_reads_the_terminator_and_keeps_the_connection(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("POST", "/s", _streaming(b"payload-END"))
    server.on("GET", "/n", _ok)
    for _ in range(3):
        st = _open(transport, server)
        assert st.read1() == b"payload-END"  # the content is complete; the terminator is not read
        st.finish()
        assert st.closed and not st.aborted
        assert _get(transport, server) == b"ok"
    assert server.accepted == 1


def test_finish_waits_briefly_for_a_late_terminator(
    server: ScriptedServer, transport: Transport
) -> None:
    def late(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(b"END")
        time.sleep(0.1)  # the peer's own pace: its terminator comes a little later
        r.end_chunked()

    server.on("POST", "/s", late)
    server.on("GET", "/n", _ok)
    st = _open(transport, server)
    assert st.read1() == b"END"
    st.finish(bound=5.0)
    assert _get(transport, server) == b"ok"
    assert server.accepted == 1


# -- dropped -----------------------------------------------------------------------------


def test_finish_drops_a_connection_whose_terminator_never_comes(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("POST", "/s", _streaming(b"END", end=False, hold=30))
    server.on("GET", "/n", _ok)
    st = _open(transport, server, read_timeout=30.0)
    assert st.read1() == b"END"
    t0 = time.monotonic()
    st.finish(bound=0.2)  # no error: the content was complete
    assert time.monotonic() - t0 < 5.0  # the bound ignored: the 30 s hold or read timeout
    assert st.closed
    assert client_sockets(server.port) == 0  # closed now, not left for the garbage collector
    assert _get(transport, server) == b"ok"
    assert server.accepted == 2


def test_finish_refuses_data_after_the_end(server: ScriptedServer, transport: Transport) -> None:
    server.on("POST", "/s", _streaming(b"END", b"more"))
    server.on("GET", "/n", _ok)
    st = _open(transport, server)
    assert st.read1() == b"END"
    with pytest.raises(ProtocolError, match="after the end"):
        st.finish()
    assert st.closed
    assert _get(transport, server) == b"ok"
    assert server.accepted == 2


def _close_mid_body(st: Stream) -> None:
    st.close()


def _abort_mid_body(st: Stream) -> None:
    st.abort()
    st.close()


def _oversized(st: Stream) -> None:
    with pytest.raises(ProtocolError):
        st.read_all(2)


def _timeout(st: Stream) -> None:
    with pytest.raises(TransportTimeout):
        while st.read1():
            pass
    st.close()


@pytest.mark.parametrize("abandon", [_close_mid_body, _abort_mid_body, _oversized, _timeout])
def test_a_stream_abandoned_mid_flight_is_never_reused(
    server: ScriptedServer, transport: Transport, abandon: Callable[[Stream], None]
) -> None:
    server.on("POST", "/s", _streaming(b"part", b"more-data", end=False))
    server.on("GET", "/n", _ok)
    st = _open(transport, server, read_timeout=0.5)
    assert st.read1() == b"part"
    abandon(st)
    assert st.closed
    assert client_sockets(server.port) == 0
    assert _get(transport, server) == b"ok"
    assert server.accepted == 2


def test_a_cancelled_request_is_never_reused(
    server: ScriptedServer, transport: Transport
) -> None:
    started = threading.Event()

    def partial(q: Request, r: Responder) -> None:
        r.start_chunked(content_type="text/plain")
        r.chunk(b"part")
        started.set()
        r.hold(timeout=10)

    server.on("GET", "/body", partial)
    server.on("GET", "/n", _ok)
    tok = CancelToken()
    threading.Thread(target=lambda: (started.wait(5), tok.cancel("test"))).start()
    with pytest.raises(Cancelled):
        transport.request("GET", server.url + "/body", read_timeout=30, cancel=tok,
                          operation="body")
    assert client_sockets(server.port) == 0
    assert _get(transport, server) == b"ok"
    assert server.accepted == 2


@pytest.mark.parametrize("body", ["chunked", "whole"])
def test_a_late_abort_never_reaches_the_connection_back_in_the_pool(
    server: ScriptedServer, transport: Transport, body: str
) -> None:
    go_on = threading.Event()

    def slow(q: Request, r: Responder) -> None:
        r.hold(go_on, timeout=10)
        r.send(200, b"second")

    if body == "chunked":
        server.on("POST", "/s", _streaming(b"all"))
    else:  # Content-Length: read by read_all in one call
        server.on("POST", "/s", lambda q, r: r.send(200, b"all"))
    server.on("GET", "/slow", slow)
    first = _open(transport, server)
    assert first.read_all(10) == b"all"  # its connection is back in the pool
    result: List[bytes] = []
    errors: List[BaseException] = []

    def second() -> None:
        try:
            result.append(_get(transport, server, "/slow"))
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=second)
    th.start()
    deadline = time.monotonic() + 5
    while not server.received("GET", "/slow") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.received("GET", "/slow"), "the second request did not arrive"
    first.abort()  # late: must not touch the connection the second request now uses
    first.close()
    go_on.set()
    th.join(10)
    assert errors == [] and result == [b"second"]
    assert server.accepted == 1  # the second request did reuse that connection


def test_aborted_streams_leave_no_socket_behind(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("POST", "/s", _streaming(b"part", end=False))
    gc.disable()  # closed by the library, not by the garbage collector
    try:
        for _ in range(5):
            st = _open(transport, server, read_timeout=30.0)
            assert st.read1() == b"part"
            st.abort()
            st.close()
            assert client_sockets(server.port) == 0
    finally:
        gc.enable()
    assert server.accepted == 5


def test_an_idle_connection_is_not_reused_past_its_expiry(
    server: ScriptedServer, transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.on("GET", "/n", _ok)
    _get(transport, server)
    _get(transport, server)
    assert server.accepted == 1
    monkeypatch.setattr(pool_mod, "IDLE_CONNECTION_SECONDS", 0.0)
    _get(transport, server)
    _get(transport, server)
    assert server.accepted == 3
    assert client_sockets(server.port) == 1


# -- closing -----------------------------------------------------------------------------


@pytest.fixture
def second_server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    try:
        yield srv
    finally:
        srv.stop()


def test_close_leaves_no_socket_open(server: ScriptedServer) -> None:
    together = threading.Barrier(6, timeout=5)

    def concurrent(q: Request, r: Responder) -> None:
        together.wait()  # six connections open at once
        r.send(200, b"ok")

    server.on("GET", "/c", concurrent)
    server.on("POST", "/s", _streaming(b"done"))
    t = Transport(pool_connections=4, pool_maxsize=8)
    run_in_threads(lambda _: _get(t, server, "/c"), 6, 10)
    assert len(server.received()) == 6
    # A finished stream the caller still holds keeps a reference to its pool, as a result
    # or a traceback might: closing must not depend on the pools being freed.
    held = _open(t, server)
    assert held.read_all(10) == b"done"
    held.close()
    assert client_sockets(server.port) == 6  # kept for reuse
    t.close()
    assert client_sockets(server.port) == 0
    assert held.closed


def test_a_stream_in_flight_at_close_closes_its_socket_when_done(
    server: ScriptedServer,
) -> None:
    server.on("POST", "/s", _streaming(b"one", b"two"))
    t = Transport()
    st = _open(t, server)
    t.close()
    assert st.read_all(100) == b"onetwo"  # in-flight work completes
    st.close()
    assert client_sockets(server.port) == 0


def test_a_host_evicted_from_the_pools_has_its_sockets_closed(
    server: ScriptedServer, second_server: ScriptedServer
) -> None:
    server.on("GET", "/n", _ok)
    second_server.on("GET", "/n", _ok)
    with Transport(pool_connections=1) as t:
        _get(t, server)
        assert client_sockets(server.port) == 1
        _get(t, second_server)  # only one host is kept
        assert client_sockets(server.port) == 0
        assert client_sockets(second_server.port) == 1
        _get(t, server)
        assert server.accepted == 2


def test_the_transport_is_closed_after_close(server: ScriptedServer) -> None:
    t = Transport()
    t.close()
    with pytest.raises(TransportError, match="closed"):
        _get(t, server)
