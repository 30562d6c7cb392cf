"""The emulator's edge for sandbox ports: requests to ``<port>-<id>.<domain>`` reach the server.

Real sandboxes run ``tests/support/sandbox_server.py`` (started with the official SDK, as a
user's code would); requests go through the emulator's port over real sockets, by the header
route (``E2b-Sandbox-Id`` + ``E2b-Sandbox-Port``) and by the Host route
(``Host: <port>-<id>.e2b.localhost``): plain HTTP with Content-Length and chunked bodies both
ways, a 10 MiB download streamed, Server-Sent Events arriving one by one, WebSockets, many
requests at once, and the edge's own answers (port not open, traffic token, paused, killed).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import aiohttp
import pytest
import requests
from e2b import Sandbox
from waiting import wait_until

from e2b_provider.emulator import Emulator

pytestmark = pytest.mark.integration

SERVER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "sandbox_server.py")
SERVER_IN_SANDBOX = "/tmp/sandbox_server.py"
#: The ports of the shared sandbox's servers and the address each one is bound to.
BOUND = {8000: "127.0.0.1", 8001: "0.0.0.0", 8002: "::1"}
CLOSED_PORT = 8999
Make = Callable[..., Dict[str, Any]]


def route(sid: str, port: int, **extra: str) -> Dict[str, str]:
    """Headers of the header route to ``port`` of sandbox ``sid``."""
    return {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(port), **extra}


def host_route(sid: str, port: int) -> Dict[str, str]:
    """Headers of the Host route (what a browser sends for ``http://<port>-<id>.<domain>``)."""
    return {"Host": f"{port}-{sid}.e2b.localhost"}


def start_server(
    sbx: Sandbox, emu: Emulator, port: int, host: str = "127.0.0.1", **hdr: str
) -> None:
    """Upload and start the test server in ``sbx``; wait until it answers through the edge."""
    with open(SERVER, encoding="utf-8") as fh:
        sbx.files.write(SERVER_IN_SANDBOX, fh.read())
    sbx.commands.run(f"python3 {SERVER_IN_SANDBOX} {port} --host {host}", background=True)

    def up() -> bool:
        r = requests.get(
            emu.sandbox_url + "/hello", headers=route(sbx.sandbox_id, port, **hdr), timeout=10
        )
        return r.status_code == 200

    wait_until(up, 15, f"the test server on port {port}")


@pytest.fixture(autouse=True)
def _sdk_env(sdk: Emulator) -> None:
    """Every test may use the SDK (``Sandbox.connect``) against the session's emulator."""


@pytest.fixture(scope="module")
def box(sdk: Emulator) -> Iterator[Sandbox]:
    """One sandbox running a test server on each port of :data:`BOUND`."""
    sbx = Sandbox.create(timeout=600)
    try:
        for port, host in BOUND.items():
            start_server(sbx, sdk, port, host)
        yield sbx
    finally:
        sbx.kill()


def rss_peak(pid: Optional[int]) -> int:
    """The peak resident set size of a process, bytes (VmHWM)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


# -- HTTP -----------------------------------------------------------------------------------


def test_header_route_and_host_route(emu: Emulator, box: Sandbox) -> None:
    sid = box.sandbox_id
    r = requests.get(emu.sandbox_url + "/hello", headers=route(sid, 8000), timeout=10)
    assert (r.status_code, r.text) == (200, "hello\n")
    assert r.headers["Server"].startswith("sandbox-server/")  # the sandbox's own answer
    r = requests.get(emu.sandbox_url + "/headers", headers=host_route(sid, 8000), timeout=10)
    assert r.status_code == 200
    seen = {k.lower(): v for k, v in r.json().items()}
    assert seen["host"] == f"8000-{sid}.e2b.localhost"  # Host passes unchanged
    # the query string passes too
    r = requests.get(emu.sandbox_url + "/chunked?n=2", headers=host_route(sid, 8000), timeout=10)
    assert r.text == "chunk 0\nchunk 1\n"
    log = emu.requests(sandbox_id=sid, path="/chunked")
    assert log and log[-1]["status"] == 200 and log[-1]["port"] == 8000


@pytest.mark.parametrize("port", sorted(BOUND), ids=[BOUND[p] for p in sorted(BOUND)])
def test_servers_bound_to_each_loopback_address(emu: Emulator, box: Sandbox, port: int) -> None:
    for headers in (route(box.sandbox_id, port), host_route(box.sandbox_id, port)):
        r = requests.get(emu.sandbox_url + "/hello", headers=headers, timeout=10)
        assert (r.status_code, r.text) == (200, "hello\n")


def test_post_bodies_with_content_length_and_chunked(emu: Emulator, box: Sandbox) -> None:
    hdr = route(box.sandbox_id, 8000)
    body = os.urandom(3 * 1024 * 1024 + 7)
    r = requests.post(emu.sandbox_url + "/echo", headers=hdr, data=body, timeout=30)
    assert r.status_code == 200 and r.content == body
    assert r.headers["x-sha256"] == hashlib.sha256(body).hexdigest()
    seen = r.headers["x-seen-headers"].split(",")
    assert "content-length" in seen and "transfer-encoding" not in seen

    pieces = [os.urandom(100_000) for _ in range(20)]
    r = requests.post(emu.sandbox_url + "/echo", headers=hdr, data=iter(pieces), timeout=30)
    whole = b"".join(pieces)
    assert r.status_code == 200 and r.content == whole
    assert r.headers["x-sha256"] == hashlib.sha256(whole).hexdigest()
    assert r.headers["Content-Length"] == str(len(whole))
    assert "transfer-encoding" in r.headers["x-seen-headers"].split(",")

    r = requests.post(emu.sandbox_url + "/echo", headers=hdr, data=b"", timeout=30)
    assert r.status_code == 200 and r.content == b""


def test_secrets_of_the_edge_are_not_forwarded(emu: Emulator, box: Sandbox) -> None:
    secrets = {"X-Access-Token": "s3cret-a", "e2b-traffic-access-token": "s3cret-b"}
    hdr = route(box.sandbox_id, 8000, **secrets)
    r = requests.get(emu.sandbox_url + "/headers", headers={**hdr, "X-Custom": "kept"}, timeout=10)
    assert r.status_code == 200
    seen = {k.lower(): v for k, v in r.json().items()}
    assert seen.get("x-custom") == "kept"
    assert "x-access-token" not in seen and "e2b-traffic-access-token" not in seen
    assert "s3cret" not in json.dumps(emu.requests(sandbox_id=box.sandbox_id))


def test_big_download_streams_with_constant_memory(emu: Emulator, box: Sandbox) -> None:
    hdr = route(box.sandbox_id, 8000)
    warm = requests.get(emu.sandbox_url + "/big?mib=1", headers=hdr, timeout=30)
    assert len(warm.content) == 1 << 20
    before = rss_peak(emu.pid)
    digest = hashlib.sha256()
    size = 0
    with requests.get(
        emu.sandbox_url + "/big?mib=10", headers=hdr, stream=True, timeout=30
    ) as r:
        assert r.status_code == 200
        assert r.headers["Content-Length"] == str(10 << 20)
        assert "Transfer-Encoding" not in r.headers
        for chunk in r.iter_content(65536):
            digest.update(chunk)
            size += len(chunk)
        expected = r.headers["x-sha256"]
    assert size == 10 << 20 and digest.hexdigest() == expected
    grown = rss_peak(emu.pid) - before
    print(f"emulator peak RSS grew by {grown / 1024:.0f} KiB over a 10 MiB download")
    assert grown < 6 << 20, grown


def test_chunked_answer_stays_chunked(emu: Emulator, box: Sandbox) -> None:
    r = requests.get(
        emu.sandbox_url + "/chunked?n=5", headers=route(box.sandbox_id, 8001), timeout=10
    )
    assert r.status_code == 200
    assert r.headers.get("Transfer-Encoding") == "chunked" and "Content-Length" not in r.headers
    assert r.text == "".join(f"chunk {i}\n" for i in range(5))


def test_server_sent_events_arrive_one_by_one(emu: Emulator, box: Sandbox) -> None:
    async def scenario() -> List[Tuple[float, str]]:
        got: List[Tuple[float, str]] = []
        async with aiohttp.ClientSession() as session:
            t0 = time.monotonic()
            async with session.get(
                emu.sandbox_url + "/sse?n=3&gap=0.6", headers=route(box.sandbox_id, 8000)
            ) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == "text/event-stream"
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        got.append((time.monotonic() - t0, line[6:].strip().decode()))
        return got

    events = asyncio.run(scenario())
    assert [e for _, e in events] == ["event 0", "event 1", "event 2"]
    # the first event came before the last was even sent (1.2 s later)
    assert events[2][0] - events[0][0] > 0.9, events


def test_many_requests_at_once(emu: Emulator, box: Sandbox) -> None:
    async def scenario() -> List[Any]:
        conn = aiohttp.TCPConnector(limit=100)
        async with aiohttp.ClientSession(connector=conn) as session:

            async def one(i: int) -> Tuple[int, bytes]:
                port = sorted(BOUND)[i % 3]
                if i % 2:
                    async with session.post(
                        emu.sandbox_url + "/echo",
                        headers=route(box.sandbox_id, port),
                        data=b"x%d" % i,
                    ) as resp:
                        return resp.status, await resp.read()
                async with session.get(
                    emu.sandbox_url + "/hello", headers=host_route(box.sandbox_id, port)
                ) as resp:
                    return resp.status, await resp.read()

            return await asyncio.gather(*(one(i) for i in range(100)), return_exceptions=True)

    results = asyncio.run(scenario())
    errors = [r for r in results if not isinstance(r, tuple) or r[0] != 200]
    assert errors == []
    assert all(r == (200, b"x%d" % i if i % 2 else b"hello\n") for i, r in enumerate(results))


def established(sbx: Sandbox, port: int) -> int:
    """How many TCP connections to ``port`` the sandbox's servers have open (IPv4)."""
    table = sbx.commands.run("cat /proc/net/tcp").stdout.splitlines()[1:]
    local = f":{port:04X}"
    return sum(1 for row in table if row.split()[1].endswith(local) and row.split()[3] == "01")


def test_client_going_away_closes_the_upstream_request(emu: Emulator, box: Sandbox) -> None:
    start_server(box, emu, 8003)  # a port of its own: no other connection to it comes and goes
    resp = requests.get(
        emu.sandbox_url + "/sse?n=1000&gap=0.05",
        headers=route(box.sandbox_id, 8003),
        stream=True,
        timeout=10,
    )
    lines = resp.iter_lines()  # kept: a dropped iterator would close the connection
    assert next(lines) == b"data: event 0"
    assert established(box, 8003) == 1
    assert next(lines) == b"" and next(lines) == b"data: event 1"  # still streaming
    resp.close()  # the client goes away mid-stream
    wait_until(
        lambda: established(box, 8003) == 0, 10, "the relay to close its upstream connection"
    )


# -- WebSockets -----------------------------------------------------------------------------


def test_websocket_echo_and_close_codes(emu: Emulator, box: Sandbox) -> None:
    sid = box.sandbox_id

    async def scenario() -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(
                emu.sandbox_url + "/ws",
                headers=route(sid, 8000),
                protocols=("chat.v1", "other"),
                max_msg_size=64 << 20,
            ) as ws:
                out["protocol"] = ws.protocol
                await ws.send_str("hello from the test")
                out["text"] = await ws.receive(timeout=10)
                big = os.urandom(5 << 20)
                await ws.send_bytes(big)
                msg = await ws.receive(timeout=30)
                out["binary"] = msg.type == aiohttp.WSMsgType.BINARY and msg.data == big
                await ws.ping(b"p")
                await ws.close(code=4001, message=b"bye")
                out["client_close"] = ws.close_code
            # the server closes first (4002), on the Host route this time
            async with session.ws_connect(
                emu.sandbox_url + "/ws?close=4002", headers=host_route(sid, 8002)
            ) as ws:
                await ws.send_str("once")
                out["echo"] = (await ws.receive(timeout=10)).data
                closing = await ws.receive(timeout=10)
                out["server_close"] = (closing.type, closing.data)
        return out

    out = asyncio.run(scenario())
    assert out["protocol"] == "chat.v1"
    assert out["text"].type == aiohttp.WSMsgType.TEXT
    assert out["text"].data == "hello from the test"
    assert out["binary"] is True
    assert out["client_close"] == 4001  # the server echoed the client's code through the edge
    assert out["echo"] == "once"
    assert out["server_close"] == (aiohttp.WSMsgType.CLOSE, 4002)


def test_websocket_refused_upgrade_answers_the_status(emu: Emulator, box: Sandbox) -> None:
    async def scenario() -> int:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(
                    emu.sandbox_url + "/nowhere", headers=route(box.sandbox_id, 8000)
                ):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    assert asyncio.run(scenario()) == 404


# -- the edge's own answers -----------------------------------------------------------------


def test_port_not_open_json_and_html(emu: Emulator, box: Sandbox) -> None:
    sid = box.sandbox_id
    r = requests.get(emu.sandbox_url + "/", headers=route(sid, CLOSED_PORT), timeout=15)
    assert r.status_code == 502
    assert r.json() == {
        "sandboxId": sid,
        "message": "The sandbox is running but port is not open",
        "code": 502,
    }
    browser = {
        "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0",
        "Accept": "text/html,application/xhtml+xml,*/*;q=0.8",
    }
    r = requests.get(
        emu.sandbox_url + "/", headers={**host_route(sid, CLOSED_PORT), **browser}, timeout=15
    )
    assert r.status_code == 502 and r.headers["Content-Type"].startswith("text/html")
    assert "The sandbox is running but port is not open" in r.text and sid in r.text
    # a websocket to a closed port gets the same 502
    r = requests.get(
        emu.sandbox_url + "/ws",
        headers={
            **route(sid, CLOSED_PORT),
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        },
        timeout=15,
    )
    assert r.status_code == 502 and "port is not open" in r.json()["message"]


def test_traffic_token_guards_a_private_sandbox(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox(network={"allowPublicTraffic": False})
    sid, token = sb["sandboxID"], sb["trafficAccessToken"]
    assert token
    sbx = Sandbox.connect(sid)
    start_server(sbx, emu, 8000, **{"e2b-traffic-access-token": token})
    r = requests.get(emu.sandbox_url + "/headers", headers=route(sid, 8000), timeout=10)
    assert r.status_code == 403 and "is missing" in r.json()["message"]
    wrong = {"e2b-traffic-access-token": "not-the-token"}
    r = requests.get(emu.sandbox_url + "/headers", headers=route(sid, 8000, **wrong), timeout=10)
    assert r.status_code == 403 and "is invalid" in r.json()["message"]
    right = {"e2b-traffic-access-token": token}
    r = requests.get(emu.sandbox_url + "/headers", headers=route(sid, 8000, **right), timeout=10)
    assert r.status_code == 200
    assert "e2b-traffic-access-token" not in {k.lower() for k in r.json()}
    assert token not in r.text and token not in json.dumps(emu.requests(sandbox_id=sid))


def test_paused_sandbox_is_not_found(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    sid = make_sandbox()["sandboxID"]
    sbx = Sandbox.connect(sid)
    start_server(sbx, emu, 8000)
    assert api.post(f"{emu.api_url}/sandboxes/{sid}/pause", timeout=60).status_code == 204
    r = requests.get(emu.sandbox_url + "/hello", headers=route(sid, 8000), timeout=10)
    assert r.status_code == 502
    assert r.json() == {"sandboxId": sid, "message": "The sandbox was not found", "code": 502}
    # resumed (with its memory), the same server answers again
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/connect", json={"timeout": 60}, timeout=60)
    assert r.status_code == 201, r.text
    r = requests.get(emu.sandbox_url + "/hello", headers=route(sid, 8000), timeout=10)
    assert (r.status_code, r.text) == (200, "hello\n")


def test_killed_sandbox_ends_the_stream(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    sid = make_sandbox()["sandboxID"]
    sbx = Sandbox.connect(sid)
    start_server(sbx, emu, 8000)
    resp = requests.get(
        emu.sandbox_url + "/sse?n=1000&gap=0.1",
        headers=route(sid, 8000),
        stream=True,
        timeout=(10, 15),
    )
    assert resp.status_code == 200
    lines = resp.iter_lines()
    assert next(lines) == b"data: event 0"
    ended = threading.Event()
    outcome: List[str] = []

    def drain() -> None:
        try:
            for _ in lines:
                pass
            outcome.append("end")
        except requests.exceptions.ReadTimeout:
            outcome.append("hang")
        except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError):
            outcome.append("broken")
        finally:
            ended.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    t0 = time.monotonic()
    assert api.delete(f"{emu.api_url}/sandboxes/{sid}", timeout=60).status_code == 204
    assert ended.wait(12), "the stream of a killed sandbox did not end"
    resp.close()
    print(f"stream ended {time.monotonic() - t0:.2f} s after the kill: {outcome}")
    assert outcome == ["broken"]
