"""Transport tests over real sockets against the scripted server."""

from __future__ import annotations

import socket
import threading
import time
from typing import List

import pytest
from server import (
    ACCESS_TOKEN,
    API_KEY,
    Request,
    Responder,
    ScriptedServer,
    assert_no_secret,
    blackhole,
)
from waiting import run_in_threads, thread_blocked_in, wait_until

from e2b_provider.cancel import CancelReason, CancelToken
from e2b_provider.errors import (
    AuthenticationError,
    Cancelled,
    ConfigError,
    Conflict,
    E2BHttpError,
    NotFound,
    ProtocolError,
    TransportError,
    TransportTimeout,
)
from e2b_provider.transport.client import Transport
from e2b_provider.transport.error_mapping import error_from_response, map_transport_errors, safe_url
from e2b_provider.transport.response import HttpResponse

SECRET_HEADERS = {"X-API-KEY": API_KEY, "X-Access-Token": ACCESS_TOKEN}
SECRET_PARAMS = {"signature": ACCESS_TOKEN}


def _cancel_later(token: CancelToken, delay: float) -> threading.Timer:
    t = threading.Timer(delay, token.cancel, args=(CancelReason("explicit", "test"),))
    t.start()
    return t


# -- plain requests ---------------------------------------------------------------------


def test_request_returns_body_and_lowercase_headers(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("GET", "/x", lambda q, r: r.send(200, b"hello", {"X-Thing": "A"}))
    resp = transport.request(
        "GET", server.url + "/x", params={"a": "1"}, read_timeout=2, operation="get x"
    )
    assert resp == HttpResponse(200, resp.headers, b"hello")
    assert resp.headers["x-thing"] == "A"
    assert all(k == k.lower() for k in resp.headers)
    (req,) = server.received()
    assert req.q("a") == "1"
    assert req.headers["user-agent"].startswith("e2b-provider/")


def test_error_status_is_returned_not_raised(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("POST", "/x", lambda q, r: r.json(503, {"code": 503, "message": "busy"}))
    resp = transport.request("POST", server.url + "/x", json={}, read_timeout=2, operation="op")
    assert resp.status == 503
    assert resp.json() == {"code": 503, "message": "busy"}


def test_redirect_is_not_followed_and_location_not_echoed(
    server: ScriptedServer, transport: Transport
) -> None:
    location = f"{server.url}/elsewhere?token={ACCESS_TOKEN}&key={API_KEY}"
    server.on("GET", "/x", lambda q, r: r.send(302, b"", {"Location": location}))
    server.on("GET", "/elsewhere", lambda q, r: r.send(200, b"followed"))
    with pytest.raises(E2BHttpError) as ei:
        transport.request("GET", server.url + "/x", read_timeout=2, operation="get x")
    assert ei.value.status == 302
    assert "redirect" in str(ei.value)
    assert "elsewhere" not in str(ei.value)
    assert_no_secret(ei.value)
    assert [r.path for r in server.received()] == ["/x"]


def test_redirect_on_stream_is_refused(server: ScriptedServer, transport: Transport) -> None:
    server.on("POST", "/s", lambda q, r: r.send(307, b"", {"Location": "/t?x=" + API_KEY}))
    with pytest.raises(E2BHttpError) as ei:
        transport.open_stream(
            "POST", server.url + "/s", data=b"x", read_timeout=2, operation="stream"
        )
    assert ei.value.status == 307
    assert_no_secret(ei.value)
    assert [r.path for r in server.received()] == ["/s"]


def test_body_over_max_is_refused(server: ScriptedServer, transport: Transport) -> None:
    def chunked(q: Request, r: Responder) -> None:
        r.start_chunked(content_type="text/plain")
        for _ in range(4):
            r.chunk(b"x" * 400)
        r.end_chunked()

    server.on("GET", "/cl", lambda q, r: r.send(200, b"x" * 2000))
    server.on("GET", "/chunked", chunked)
    for path in ("/cl", "/chunked"):
        with pytest.raises(ProtocolError, match="larger than 1000"):
            transport.request(
                "GET", server.url + path, read_timeout=2, operation="big", max_body=1000
            )
    ok = transport.request("GET", server.url + "/cl", read_timeout=2, operation="big",
                           max_body=2000)
    assert len(ok.body) == 2000


def test_shared_transport_across_threads(server: ScriptedServer, transport: Transport) -> None:
    server.on("GET", "/echo", lambda q, r: r.send(200, (q.q("i") or "").encode()))
    failures: List[str] = []

    def worker(n: int) -> None:
        for j in range(10):
            i = f"{n}-{j}"
            body = transport.request("GET", server.url + "/echo", params={"i": i},
                                     read_timeout=5, operation="echo").body
            if body != i.encode():
                failures.append(i)

    run_in_threads(worker, 16, 20)
    assert failures == []
    assert len(server.received()) == 160


def test_cookies_are_never_stored_or_sent(server: ScriptedServer, transport: Transport) -> None:
    server.on("GET", "/c", lambda q, r: r.send(200, b"", {"Set-Cookie": "s=1; Path=/"}))
    for _ in range(2):
        resp = transport.request("GET", server.url + "/c", read_timeout=2, operation="c")
        assert resp.status == 200 and resp.headers.get("set-cookie") == "s=1; Path=/"
    received = server.received("GET", "/c")
    assert len(received) == 2  # the second request came after a cookie was offered
    assert all("cookie" not in r.headers for r in received)


def test_closed_transport_refuses_requests(server: ScriptedServer) -> None:
    t = Transport()
    t.close()
    t.close()  # idempotent
    assert t.closed
    with pytest.raises(TransportError, match="closed"):
        t.request("GET", server.url + "/", read_timeout=1, operation="x")
    with Transport() as t2:
        assert not t2.closed
    assert t2.closed


def test_invalid_url_is_a_config_error(transport: Transport) -> None:
    with pytest.raises(ConfigError):
        transport.request("GET", "http://", read_timeout=1, operation="bad url")


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        Transport(pool_maxsize=0)
    with pytest.raises(ConfigError):
        Transport(connect_timeout=0)


# -- timeouts and connection failures --------------------------------------------------


def test_connect_timeout_maps_to_transport_timeout() -> None:
    # every other timeout is 30 s: the call's connect_timeout ignored takes far past the bound
    with blackhole() as url, Transport(connect_timeout=30.0) as transport:
        t0 = time.monotonic()
        with pytest.raises(TransportTimeout) as ei:
            transport.request(
                "GET", url + "/x", headers=SECRET_HEADERS, params=SECRET_PARAMS,
                read_timeout=30, connect_timeout=0.3, operation="connect test",
            )
        assert time.monotonic() - t0 < 5.0
    assert isinstance(ei.value, TimeoutError)
    assert ei.value.__cause__ is not None
    assert "connect test" in str(ei.value)
    assert_no_secret(ei.value)
    assert "signature" not in str(ei.value)


def test_read_timeout_maps_to_transport_timeout(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("GET", "/slow", lambda q, r: r.hold(timeout=30))
    t0 = time.monotonic()
    with pytest.raises(TransportTimeout) as ei:
        transport.request("GET", server.url + "/slow", headers=SECRET_HEADERS,
                          params=SECRET_PARAMS, read_timeout=0.3, operation="read test")
    assert time.monotonic() - t0 < 5.0  # the read timeout ignored: the 30 s hold
    assert_no_secret(ei.value)
    # The URL that failed is named, without its query (where a signature could be).
    assert f"waiting for {server.url}/slow (" in str(ei.value)
    assert "signature" not in str(ei.value) and "?" not in str(ei.value)


def test_refused_connection_is_transport_error_not_timeout(transport: Transport) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(TransportError) as ei:
        transport.request("GET", f"http://127.0.0.1:{port}/x", headers=SECRET_HEADERS,
                          params=SECRET_PARAMS, read_timeout=1, operation="refused")
    assert not isinstance(ei.value, TransportTimeout)
    assert str(ei.value).startswith(
        f"E2B refused: connection to http://127.0.0.1:{port}/x failed: connection refused "
        "(nothing listens there) ("
    )
    assert "ECONNREFUSED" in str(ei.value)
    assert_no_secret(ei.value)
    assert "signature" not in str(ei.value) and "?" not in str(ei.value)


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://127.0.0.1:8080/a/b?signature=s3cret#frag", "http://127.0.0.1:8080/a/b"),
        ("https://user:pa55@api.example.test/v2/sandboxes?x=1", "https://api.example.test:443/v2/sandboxes"),
        ("http://[::1]/x", "http://[::1]:80/x"),
        ("HTTP://Example.TEST:81", "http://example.test:81"),
        ("http://host:99999999/", "an unreadable URL"),
    ],
)  # fmt: skip
def test_safe_url_keeps_scheme_host_port_and_path_only(url: str, shown: str) -> None:
    assert safe_url(url) == shown


def test_connection_error_names_the_proxy_without_its_credentials(
    transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    monkeypatch.setenv("HTTP_PROXY", f"http://proxyuser:pr0xypass@127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with Transport() as t, pytest.raises(TransportError) as ei:
        t.request("GET", "http://e2b.test/v2/sandboxes", params=SECRET_PARAMS,
                  read_timeout=1, operation="GET /v2/sandboxes")
    text = str(ei.value)
    assert (
        f"connection to http://e2b.test:80/v2/sandboxes through the proxy "
        f"http://127.0.0.1:{port} failed: " in text
    )
    assert "pr0xypass" not in text and "proxyuser" not in text
    assert_no_secret(ei.value)


def test_peer_dropping_mid_body_is_transport_error(
    server: ScriptedServer, transport: Transport
) -> None:
    def partial(q: Request, r: Responder) -> None:
        r.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-some")
        r.drop()

    server.on("GET", "/p", partial)
    with pytest.raises(TransportError) as ei:
        transport.request("GET", server.url + "/p", read_timeout=2, operation="partial",
                          params=SECRET_PARAMS)
    assert_no_secret(ei.value)


# -- cancellation ------------------------------------------------------------------------


def test_precancelled_token_sends_nothing(server: ScriptedServer, transport: Transport) -> None:
    tok = CancelToken()
    tok.cancel("early")
    with pytest.raises(Cancelled):
        transport.request("GET", server.url + "/x", read_timeout=1, cancel=tok, operation="x")
    assert server.received() == []


def test_cancel_aborts_request_waiting_for_headers(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("POST", "/hold", lambda q, r: r.hold(timeout=30))
    tok = CancelToken()
    timer = _cancel_later(tok, 0.2)
    t0 = time.monotonic()
    try:
        with pytest.raises(Cancelled) as ei:
            transport.request("POST", server.url + "/hold", json={"a": 1},
                              headers=SECRET_HEADERS, read_timeout=30, cancel=tok,
                              operation="hold")
    finally:
        timer.join()
    assert time.monotonic() - t0 < 5.0  # not aborted: the 30 s hold
    assert ei.value.reason == CancelReason("explicit", "test")
    assert_no_secret(ei.value)


def test_cancel_aborts_request_reading_body(server: ScriptedServer, transport: Transport) -> None:
    def partial_then_hold(q: Request, r: Responder) -> None:
        r.start_chunked(content_type="text/plain")
        r.chunk(b"part")
        r.hold(timeout=30)

    server.on("GET", "/body", partial_then_hold)
    tok = CancelToken()
    timer = _cancel_later(tok, 0.2)
    t0 = time.monotonic()
    try:
        with pytest.raises(Cancelled):
            transport.request("GET", server.url + "/body", read_timeout=30, cancel=tok,
                              operation="body")
    finally:
        timer.join()
    assert time.monotonic() - t0 < 5.0  # not aborted: the 30 s hold


def test_late_cancel_does_not_touch_the_pooled_connection(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("GET", "/a", lambda q, r: r.send(200, b"a"))
    server.on("GET", "/b", lambda q, r: r.send(200, b"b"))
    tok = CancelToken()
    assert transport.request("GET", server.url + "/a", read_timeout=2, cancel=tok,
                             operation="a").body == b"a"
    tok.cancel("after the fact")
    # The keep-alive connection is reused and still healthy.
    assert transport.request("GET", server.url + "/b", read_timeout=2, operation="b").body == b"b"


def test_map_transport_errors_checks_token_first() -> None:
    tok = CancelToken()
    tok.cancel("x")
    with pytest.raises(Cancelled):
        with map_transport_errors(tok, "op"):
            raise AssertionError("not reached")
    # Non-transport errors pass through unchanged.
    with pytest.raises(KeyError):
        with map_transport_errors(None, "op"):
            raise KeyError("k")
    with pytest.raises(TransportError) as ei:
        with map_transport_errors(None, "op"):
            raise ConnectionResetError(104, "reset by " + API_KEY)
    assert_no_secret(ei.value)
    assert isinstance(ei.value.__cause__, ConnectionResetError)


# -- streams -----------------------------------------------------------------------------


def test_read1_returns_first_chunk_before_server_finishes(
    server: ScriptedServer, transport: Transport
) -> None:
    go_on = threading.Event()
    finished = threading.Event()
    released: List[bool] = []

    def streaming(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(b"first")
        released.append(r.hold(go_on, timeout=30))
        r.chunk(b"second")
        r.end_chunked()
        finished.set()

    server.on("POST", "/s", streaming)
    with transport.open_stream("POST", server.url + "/s", data=b"req", read_timeout=60,
                               operation="stream") as st:
        assert st.status == 200
        assert st.headers["content-type"] == "application/connect+json"
        t0 = time.monotonic()
        assert st.read1() == b"first"
        assert time.monotonic() - t0 < 5.0  # waiting for more: the 30 s hold
        assert not finished.is_set()
        go_on.set()
        assert st.read_all(100) == b"second"
        assert st.read1() == b""
    assert st.closed
    assert released == [True]  # the server went on because the test saw "first", not by timeout
    (req,) = server.received()
    assert req.body == b"req"


def test_abort_unblocks_stalled_read_from_another_thread(
    server: ScriptedServer, transport: Transport
) -> None:
    def stall(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(b"x")
        r.hold(timeout=30)

    server.on("POST", "/s", stall)
    st = transport.open_stream("POST", server.url + "/s", data=b"", read_timeout=30,
                               operation="stream")
    assert st.read1() == b"x"
    errors: List[BaseException] = []
    woke = threading.Event()

    def reader() -> None:
        try:
            st.read1()
        except BaseException as exc:
            errors.append(exc)
        woke.set()

    th = threading.Thread(target=reader)
    th.start()
    assert th.ident is not None
    wait_until(lambda: thread_blocked_in(th.ident, "socket.py"), 5.0, "the reader to block")
    assert not woke.is_set()
    t0 = time.monotonic()
    st.abort()
    # not unblocked: the reader waits for the 30 s hold or read timeout
    assert woke.wait(10.0), "abort() did not unblock the reader"
    th.join(5)
    assert not th.is_alive()
    assert time.monotonic() - t0 < 5.0
    assert st.aborted
    assert len(errors) == 1 and isinstance(errors[0], TransportError)
    assert "stream aborted" in str(errors[0])
    with pytest.raises(TransportError, match="stream aborted"):
        st.read1()
    st.abort()  # idempotent
    st.close()
    st.abort()
    assert st.closed


def test_abort_after_normal_end_is_harmless(server: ScriptedServer, transport: Transport) -> None:
    def short(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(b"all")
        r.end_chunked()

    server.on("POST", "/s", short)
    server.on("GET", "/n", lambda q, r: r.send(200, b"next"))
    st = transport.open_stream("POST", server.url + "/s", data=b"", read_timeout=5,
                               operation="stream")
    assert st.read_all(10) == b"all"
    st.abort()  # connection already back in the pool: must not be shut down
    st.close()
    again = transport.request("GET", server.url + "/n", read_timeout=2, operation="n")
    assert again.body == b"next"


def test_stream_silent_peer_times_out(server: ScriptedServer, transport: Transport) -> None:
    def silent(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.hold(timeout=10)

    server.on("POST", "/s", silent)
    with transport.open_stream("POST", server.url + "/s", data=b"", read_timeout=0.3,
                               operation="stream") as st:
        with pytest.raises(TransportTimeout):
            st.read1()
        assert not st.aborted


def test_stream_dropped_by_peer_is_not_aborted(
    server: ScriptedServer, transport: Transport
) -> None:
    def drop(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(b"a")
        r.drop()

    server.on("POST", "/s", drop)
    with transport.open_stream("POST", server.url + "/s", data=b"", read_timeout=5,
                               operation="stream") as st:
        assert st.read1() == b"a"
        with pytest.raises(TransportError) as ei:
            while st.read1():
                pass
        assert "aborted" not in str(ei.value)
        assert not st.aborted


def test_stream_cancel_while_opening(server: ScriptedServer, transport: Transport) -> None:
    server.on("POST", "/s", lambda q, r: r.hold(timeout=30))
    tok = CancelToken()
    timer = _cancel_later(tok, 0.2)
    t0 = time.monotonic()
    try:
        with pytest.raises(Cancelled):
            transport.open_stream("POST", server.url + "/s", data=b"", read_timeout=30,
                                  cancel=tok, operation="stream")
    finally:
        timer.join()
    assert time.monotonic() - t0 < 5.0  # not aborted: the 30 s hold


def test_token_is_detached_once_stream_is_open(
    server: ScriptedServer, transport: Transport
) -> None:
    go_on = threading.Event()

    def streaming(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(b"1")
        r.hold(go_on, timeout=5)
        r.chunk(b"2")
        r.end_chunked()

    server.on("POST", "/s", streaming)
    tok = CancelToken()
    with transport.open_stream("POST", server.url + "/s", data=b"", read_timeout=5,
                               cancel=tok, operation="stream") as st:
        tok.cancel("later")
        go_on.set()
        assert st.read_all(10) == b"12"
        assert not st.aborted


def test_stream_read_all_bound(server: ScriptedServer, transport: Transport) -> None:
    server.on("POST", "/s", lambda q, r: r.send(200, b"y" * 5000))
    with transport.open_stream("POST", server.url + "/s", data=b"", read_timeout=5,
                               operation="stream") as st:
        assert st.read_all(100, truncate=True) == b"y" * 100
    with transport.open_stream("POST", server.url + "/s", data=b"", read_timeout=5,
                               operation="stream") as st:
        with pytest.raises(ProtocolError):
            st.read_all(100)


def test_a_body_cut_short_is_an_error_not_a_short_answer(
    server: ScriptedServer, transport: Transport
) -> None:
    def short(q: Request, r: Responder) -> None:
        r.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 40000)
        r.drop()

    server.on("GET", "/short", short)
    with transport.open_stream("GET", server.url + "/short", data=b"", read_timeout=5,
                               operation="get") as st:
        with pytest.raises(TransportError) as ei:
            st.read_all(100000)
        assert "60000 bytes before the end" in str(ei.value)
        assert not isinstance(ei.value, TransportTimeout)


def test_a_body_longer_than_allowed_is_refused_unread(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("GET", "/big", lambda q, r: r.send(200, b"y" * 5000))
    with transport.open_stream("GET", server.url + "/big", data=b"", read_timeout=5,
                               operation="get") as st:
        with pytest.raises(ProtocolError):
            st.read_all(4999)
        assert st.aborted


def test_a_whole_body_read_is_woken_by_abort(
    server: ScriptedServer, transport: Transport
) -> None:
    def stall(q: Request, r: Responder) -> None:
        r.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
        r.hold(timeout=30)

    server.on("GET", "/stall", stall)
    st = transport.open_stream("GET", server.url + "/stall", data=b"", read_timeout=30,
                               operation="get")
    errors: List[BaseException] = []

    def reader() -> None:
        try:
            st.read_all(100000)
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=reader)
    th.start()
    assert th.ident is not None
    wait_until(lambda: thread_blocked_in(th.ident, "socket.py"), what="the reader to block")
    t0 = time.monotonic()
    st.abort()
    th.join(10)
    assert not th.is_alive(), "abort() did not unblock the reader"
    assert time.monotonic() - t0 < 5.0  # not unblocked: the 30 s hold or read timeout
    assert len(errors) == 1 and "stream aborted" in str(errors[0])
    assert st.closed


# -- error_from_response -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "cls"),
    [(401, AuthenticationError), (403, AuthenticationError), (404, NotFound),
     (409, Conflict), (500, E2BHttpError), (503, E2BHttpError)],
)
def test_error_from_response_classes(status: int, cls: type) -> None:
    body = b'{"code": %d, "message": "nope", "error_code": "some_code"}' % status
    err = error_from_response(HttpResponse(status, {}, body), "POST /v2/sandboxes")
    assert type(err) is cls
    assert (err.status, err.code, err.message, err.error_code) == (status, status, "nope",
                                                                   "some_code")
    assert err.operation == "POST /v2/sandboxes"
    assert "POST /v2/sandboxes" in str(err)


def test_error_from_response_non_json_and_long_bodies() -> None:
    err = error_from_response(HttpResponse(502, {}, b"Bad gateway\n"), "op")
    assert err.message == "Bad gateway" and err.code is None and err.error_code is None
    long = error_from_response(HttpResponse(500, {}, b'{"message": "%s"}' % (b"m" * 1000)), "op")
    assert len(long.message) == 300
    connect = error_from_response(
        HttpResponse(404, {}, b'{"code": "not_found", "message": "process with pid 1"}'), "sig"
    )
    assert connect.code == "not_found"
    empty = error_from_response(HttpResponse(500, {}, b""), "op")
    assert empty.message == ""


def test_http_response_json_errors() -> None:
    assert HttpResponse(200, {}, b"").json() is None
    with pytest.raises(ProtocolError):
        HttpResponse(200, {}, b"{nope").json("op")

