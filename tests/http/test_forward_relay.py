"""The port relay behind ``forward``, against a real HTTP server on 127.0.0.1.

The upstream is an aiohttp server on a thread standing where E2B's edge (or the emulator)
would be; what is checked is what the relay does on the way: the request heads it rewrites
(Host, routing headers, traffic token), the bodies and WebSocket frames it passes on as
they come, and its bounds (connection limit, idle timeout, unreachable upstream, close).
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import aiohttp
import attrs
import pytest
import requests
from aiohttp import web
from waiting import run_in_threads

from e2b_provider.ports.relay import ForwardLimits, PortRelay, Upstream, port_address

TOKEN = "traffic-secret-123456"


class Upstream_:
    """An aiohttp server on its own thread: the relay's upstream."""

    def __init__(self) -> None:
        self.seen: List[Dict[str, str]] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/headers", self._headers)
        app.router.add_get("/big", self._big)
        app.router.add_get("/sse", self._sse)
        app.router.add_get("/ws", self._ws)
        app.router.add_post("/post", self._post)
        app.router.add_get("/slow", self._slow)
        runner = web.AppRunner(app, shutdown_timeout=1.0)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.runner = runner
        started.set()
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _headers(self, request: web.Request) -> web.Response:
        self.seen.append(dict(request.headers))
        return web.json_response(dict(request.headers))

    async def _big(self, request: web.Request) -> web.StreamResponse:
        mib = int(request.query["mib"])
        resp = web.StreamResponse()
        resp.content_length = mib << 20
        await resp.prepare(request)
        piece = bytes(range(256)) * 4096
        for _ in range(mib):
            await resp.write(piece)
        return resp

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            await resp.write(f"data: {i} {time.monotonic()}\n\n".encode())
            await asyncio.sleep(0.3)
        return resp

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("echo",), max_msg_size=32 << 20)
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                await ws.send_str("echo: " + msg.data)
            elif msg.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(msg.data[::-1])
        return ws

    async def _post(self, request: web.Request) -> web.Response:
        digest = hashlib.sha256()
        size = 0
        async for chunk in request.content.iter_any():
            digest.update(chunk)
            size += len(chunk)
        return web.json_response({"sha256": digest.hexdigest(), "size": size,
                                  "chunked": request.headers.get("Transfer-Encoding")})

    async def _slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query.get("s", "1")))
        return web.Response(text="slow")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream_]:
    up = Upstream_()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture
def relay() -> Iterator[PortRelay]:
    r = PortRelay()
    try:
        yield r
    finally:
        r.close()


def target(up: Upstream_, token: str = "") -> Upstream:
    """As a forward of port 8000 of sandbox ``sbx1`` reaches the emulator at ``up``."""
    return Upstream.for_port("sbx1", "e2b.localhost", 8000, f"http://127.0.0.1:{up.port}",
                             token or None)


def test_the_url_of_a_port_on_e2b_and_behind_a_sandbox_url() -> None:
    assert port_address("abc", "e2b.app", 8000, None) == (
        "https://8000-abc.e2b.app", "8000-abc.e2b.app")
    assert port_address("abc", "e2b.localhost", 3000, "http://127.0.0.1:4567") == (
        "http://3000-abc.e2b.localhost:4567", "3000-abc.e2b.localhost:4567")
    assert port_address("abc", "d.io", 80, "https://sandbox.d.io")[0] == "https://80-abc.d.io"
    e2b = Upstream.for_port("abc", "e2b.app", 8000, None, TOKEN)
    assert (e2b.host, e2b.port, e2b.tls, e2b.server_hostname) == (
        "8000-abc.e2b.app", 443, True, "8000-abc.e2b.app")
    assert dict(e2b.headers) == {"e2b-traffic-access-token": TOKEN}
    assert TOKEN not in repr(e2b)
    # envd's own port never gets the traffic token
    assert dict(Upstream.for_port("abc", "e2b.app", 49983, None, TOKEN).headers) == {}


def test_requests_get_the_host_routing_headers_and_token_and_nothing_else_changes(
    upstream: Upstream_, relay: PortRelay
) -> None:
    fwd = relay.open(target(upstream, TOKEN))
    with requests.Session() as s:
        for _ in range(3):  # one kept-alive connection, three requests
            got = s.get(fwd.url + "/headers", headers={
                "X-Mine": "kept", "E2b-Sandbox-Id": "other", "e2b-traffic-access-token": "x"},
                timeout=10).json()
            assert got["Host"] == f"8000-sbx1.e2b.localhost:{upstream.port}"
            assert got["E2b-Sandbox-Id"] == "sbx1" and got["E2b-Sandbox-Port"] == "8000"
            assert got["e2b-traffic-access-token"] == TOKEN
            assert got["X-Mine"] == "kept"
    assert fwd.url.startswith("http://127.0.0.1:")
    fwd.close()


def test_bodies_stream_both_ways_chunked_or_sized(upstream: Upstream_, relay: PortRelay) -> None:
    fwd = relay.open(target(upstream))
    payload = bytes(range(256)) * 8192  # 2 MiB

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(payload), 100_000):
            yield payload[i : i + 100_000]

    want = hashlib.sha256(payload).hexdigest()
    sized = requests.post(fwd.url + "/post", data=payload, timeout=30).json()
    chunked = requests.post(fwd.url + "/post", data=pieces(), timeout=30).json()
    assert sized == {"sha256": want, "size": len(payload), "chunked": None}
    assert chunked == {"sha256": want, "size": len(payload), "chunked": "chunked"}
    # 10 MiB down, read in pieces
    with requests.get(fwd.url + "/big?mib=10", stream=True, timeout=30) as r:
        digest = hashlib.sha256()
        for piece in r.iter_content(1 << 16):
            digest.update(piece)
    assert digest.hexdigest() == hashlib.sha256((bytes(range(256)) * 4096) * 10).hexdigest()
    fwd.close()


def test_server_sent_events_arrive_as_they_are_sent(upstream: Upstream_, relay: PortRelay) -> None:
    fwd = relay.open(target(upstream))
    arrivals: List[Tuple[float, float]] = []
    with requests.get(fwd.url + "/sse", stream=True, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                sent = float(line.split()[2])
                arrivals.append((sent, time.monotonic()))
    assert len(arrivals) == 3
    for sent, got in arrivals:  # each within a fraction of the 0.3 s gap, not at the end
        assert got - sent < 0.25
    fwd.close()


def test_a_websocket_upgrade_becomes_a_tunnel(upstream: Upstream_, relay: PortRelay) -> None:
    fwd = relay.open(target(upstream))

    async def talk() -> Tuple[str, bytes, str]:
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(fwd.url + "/ws", protocols=("echo",),
                                    max_msg_size=32 << 20) as ws:
                await ws.send_str("hello")
                text = (await ws.receive(timeout=10)).data
                big = bytes(range(256)) * 40000  # ~10 MiB frame
                await ws.send_bytes(big)
                back = (await ws.receive(timeout=30)).data
                return text, back, ws.protocol or ""

    text, back, protocol = asyncio.run(talk())
    assert text == "echo: hello"
    assert back == (bytes(range(256)) * 40000)[::-1]
    assert protocol == "echo"
    fwd.close()


def test_a_hundred_concurrent_requests(upstream: Upstream_, relay: PortRelay) -> None:
    fwd = relay.open(target(upstream))
    errors: List[BaseException] = []
    results: List[Any] = []

    def one(_: int) -> None:
        try:
            r = requests.get(fwd.url + "/slow?s=0.2", timeout=30)
            results.append(r.text)
        except BaseException as exc:
            errors.append(exc)

    run_in_threads(one, 100, 60)
    assert errors == [] and results == ["slow"] * 100
    fwd.close()


def test_connections_beyond_the_limit_are_answered_503(
    upstream: Upstream_, relay: PortRelay
) -> None:
    fwd = relay.open(target(upstream), limits=ForwardLimits(max_connections=2))
    held = [socket.create_connection(("127.0.0.1", fwd.local_port)) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        while fwd.connections < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = requests.get(fwd.url + "/headers", timeout=10)
        assert r.status_code == 503 and "too many connections" in r.text
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while fwd.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert requests.get(fwd.url + "/headers", timeout=10).status_code == 200
    fwd.close()


def test_an_idle_connection_is_closed(upstream: Upstream_, relay: PortRelay) -> None:
    fwd = relay.open(target(upstream), limits=ForwardLimits(idle_timeout=0.4))
    with socket.create_connection(("127.0.0.1", fwd.local_port), timeout=10) as s:
        began = time.monotonic()
        assert s.recv(1) == b""  # closed by the forward, not by us
        assert 0.3 < time.monotonic() - began < 5
    fwd.close()


def test_an_unreachable_upstream_is_a_502_saying_so(relay: PortRelay) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # bound, never listening: refused
    fwd = relay.open(Upstream.for_port("sbx1", "e2b.localhost", 8000,
                                       f"http://127.0.0.1:{dead}", TOKEN))
    r = requests.get(fwd.url + "/", timeout=10)
    assert r.status_code == 502
    assert "port 8000 of sandbox sbx1" in r.text and TOKEN not in r.text
    fwd.close()


def test_closing_ends_the_listener_and_open_connections(
    upstream: Upstream_, relay: PortRelay
) -> None:
    fwd = relay.open(target(upstream))
    with socket.create_connection(("127.0.0.1", fwd.local_port), timeout=10) as s:
        s.sendall(b"GET /slow?s=30 HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + 10
        while fwd.connections < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        began = time.monotonic()
        fwd.close()
        assert s.recv(100) == b""
        assert time.monotonic() - began < 5
    with pytest.raises(requests.ConnectionError):
        requests.get(fwd.url + "/headers", timeout=5)
    relay.close()
    assert relay.thread is not None and not relay.thread.is_alive()


def test_a_taken_local_port_is_refused_clearly(upstream: Upstream_, relay: PortRelay) -> None:
    from e2b_provider.errors import InvalidArgument

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(InvalidArgument, match=r"cannot listen on 127\.0\.0\.1"):
            relay.open(target(upstream), local_port=s.getsockname()[1])


def test_a_malformed_request_gets_400(upstream: Upstream_, relay: PortRelay) -> None:
    fwd = relay.open(target(upstream))
    with socket.create_connection(("127.0.0.1", fwd.local_port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400 ")
    fwd.close()



def _certificate(tmp: Path, name: str) -> Tuple[Path, Path]:
    """A self-signed certificate for ``name`` (openssl, one day)."""
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name}",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,digitalSignature,keyCertSign"],
        check=True, capture_output=True, timeout=60,
    )
    return key, cert


def test_tls_upstream_is_verified_by_name_as_on_e2b(tmp_path: Path) -> None:
    """The E2B path (no sandbox URL): TLS to ``{port}-{id}.{domain}:443`` with that name as
    SNI and as the certificate's name; a certificate for another name is refused."""
    name = "8000-sbx1.e2b.test"
    key, cert = _certificate(tmp_path, name)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(cert), str(key))
    seen: List[str] = []
    ready = threading.Event()
    state: Dict[str, Any] = {}

    def serve() -> None:
        async def hello(request: web.Request) -> web.Response:
            seen.append(request.headers.get("Host", ""))
            return web.Response(text="tls hello")

        async def main() -> None:
            app = web.Application()
            app.router.add_get("/", hello)
            runner = web.AppRunner(app, shutdown_timeout=1.0)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
            await site.start()
            state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            stop = asyncio.Event()
            state["stop"] = (asyncio.get_running_loop(), stop)
            ready.set()
            await stop.wait()
            await runner.cleanup()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    relay = PortRelay(tls=client_ctx)
    try:
        e2b = Upstream.for_port("sbx1", "e2b.test", 8000, None, None)
        good = attrs.evolve(e2b, host="127.0.0.1", port=state["port"])  # resolved here
        fwd = relay.open(good)
        r = requests.get(fwd.url + "/", timeout=10)
        assert (r.status_code, r.text) == (200, "tls hello")
        assert seen == ["8000-sbx1.e2b.test"]
        wrong = attrs.evolve(good, server_hostname="9000-sbx1.e2b.test")
        bad = relay.open(wrong)
        r = requests.get(bad.url + "/", timeout=10)
        assert r.status_code == 502 and "certificate" in r.text.lower()
    finally:
        relay.close()
        loop, stop = state["stop"]
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def test_a_bad_request_mid_connection_ends_it_at_once(
    upstream: Upstream_, relay: PortRelay
) -> None:
    """A request the forward cannot frame after a good one on the same connection: the
    answer to the good one arrives, then the connection (and its upstream) closes, not at
    the idle timeout."""
    fwd = relay.open(target(upstream))
    with socket.create_connection(("127.0.0.1", fwd.local_port), timeout=10) as s:
        s.sendall(b"GET /slow?s=0.3 HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n")
        got = b""
        began = time.monotonic()
        while True:
            piece = s.recv(65536)
            if not piece:
                break
            got += piece
    # the good request is answered (the 400 would look like its answer); then the end
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"slow"), got
    assert time.monotonic() - began < 5
    deadline = time.monotonic() + 5
    while fwd.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fwd.connections == 0
    fwd.close()


def test_a_half_closed_client_gets_the_answers_it_is_owed(
    upstream: Upstream_, relay: PortRelay
) -> None:
    """A client that sends whole requests and then shuts down its write side gets every
    answer, then the end. The upstream here, as E2B's edge (a Go server), drops a request
    whose client's input ended: the forward must not pass that half-close on."""
    fwd = relay.open(target(upstream))
    body = b"x" * 1000
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", fwd.local_port), timeout=10) as s:
            s.sendall(b"GET /slow?s=0.2 HTTP/1.1\r\nHost: x\r\n\r\n"
                      b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + body)
            s.shutdown(socket.SHUT_WR)
            got = b""
            while True:
                piece = s.recv(65536)
                if not piece:
                    break
                got += piece
        assert got.startswith(b"HTTP/1.1 200 ") and got.count(b"HTTP/1.1 200 ") == 2, got
        assert b"slow" in got and got.endswith(b'"size": 1000, "chunked": null}'), got
    # a client that half-closes with nothing owed: the forward ends the connection at once
    with socket.create_connection(("127.0.0.1", fwd.local_port), timeout=10) as s:
        s.shutdown(socket.SHUT_WR)
        assert s.recv(65536) == b""
    deadline = time.monotonic() + 5
    while fwd.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fwd.connections == 0
    fwd.close()
