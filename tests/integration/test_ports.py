"""Ports against the emulator: url, traffic headers and forward, to a real server in a sandbox.

The server is ``tests/support/sandbox_server.py`` (standard library only), written into the
sandbox and started as a background command; the requests go through the emulator's port
relay exactly as they would through E2B's edge.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
import tracemalloc
import urllib.parse
from typing import Dict, Iterator, List

import aiohttp
import command_line
import pytest
import requests
from waiting import run_in_threads

from e2b_provider import E2BSandboxProvider, InvalidArgument, SandboxHandle, SandboxLimits

from .conftest import SERVER_PORT as PORT
from .conftest import run_readme_example, serve, unique_name


@pytest.fixture(scope="module")
def served(shared_provider: E2BSandboxProvider, sandbox: SandboxHandle) -> SandboxHandle:
    serve(shared_provider, sandbox)
    return sandbox


def test_url_is_the_edge_name_with_the_emulator_scheme_and_port(
    shared_provider: E2BSandboxProvider, served: SandboxHandle, emulator  # type: ignore[no-untyped-def]
) -> None:
    url = shared_provider.url(served, PORT)
    emu = urllib.parse.urlsplit(emulator.sandbox_url)
    assert url == f"http://{PORT}-{served.id}.{emulator.domain}:{emu.port}"
    assert shared_provider.traffic_headers(served) == {}
    # the name resolves nowhere for Python, but the emulator routes by the Host it carries,
    # as a browser sends it
    r = requests.get(f"http://127.0.0.1:{emu.port}/hello",
                     headers={"Host": urllib.parse.urlsplit(url).netloc}, timeout=10)
    assert (r.status_code, r.text) == (200, "hello\n")


def test_bad_ports_are_refused_before_any_request(shared_provider: E2BSandboxProvider) -> None:
    for bad in (0, 65536, -1, True, "8000", 80.0):
        with pytest.raises(InvalidArgument):
            shared_provider.url("nosuchsandbox1", bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            with shared_provider.forward("nosuchsandbox1", bad):  # type: ignore[arg-type]
                pass
    with pytest.raises(InvalidArgument):
        with shared_provider.forward("nosuchsandbox1", 8000, local_port=70000):
            pass


def test_forward_serves_http_streams_and_a_closed_port(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    p = shared_provider
    with p.forward(served, PORT) as url:
        assert url.startswith("http://127.0.0.1:")
        with requests.Session() as s:
            assert s.get(url + "/hello", timeout=10).text == "hello\n"
            body = os.urandom(3 << 20)
            r = s.post(url + "/echo", data=body, timeout=30)
            assert r.content == body
            chunked = s.post(url + "/echo", data=iter([body[:1000], body[1000:]]), timeout=30)
            assert chunked.content == body
            r = s.get(url + "/chunked?n=50", timeout=30)
            assert r.headers.get("Transfer-Encoding") == "chunked" and len(r.content) > 0
    with p.forward(served, 8999) as url:  # nothing listens there
        r = requests.get(url + "/", timeout=10)
        assert r.status_code == 502
        assert r.json()["message"] == "The sandbox is running but port is not open"


def test_forward_listens_on_the_address_it_is_given(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    """``address``: the loopback alone by default (127.0.0.2, on the same loopback net, is
    refused); ``0.0.0.0`` every interface (127.0.0.2 served), the URL still the loopback's;
    an address that is not an IP (nor localhost) is refused before any request."""
    p = shared_provider
    with p.forward(served, PORT) as url:
        port = url.rsplit(":", 1)[1]
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.2:{port}/hello", timeout=5)
    with p.forward(served, PORT, address="0.0.0.0") as url:
        assert url.startswith("http://127.0.0.1:")
        port = url.rsplit(":", 1)[1]
        for host in ("127.0.0.1", "127.0.0.2"):
            assert requests.get(f"http://{host}:{port}/hello", timeout=10).text == "hello\n"
    with p.forward(served, PORT, address="localhost") as url:
        assert requests.get(url + "/hello", timeout=10).text == "hello\n"
    for bad in ("example.com", "", "127.0.0.1:80", None):
        with pytest.raises(InvalidArgument):
            with p.forward("nosuchsandbox1", PORT, address=bad):  # type: ignore[arg-type]
                pass


def test_ten_mib_streams_through_with_constant_client_memory(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    with shared_provider.forward(served, PORT) as url:
        tracemalloc.start()
        try:
            digest = hashlib.sha256()
            size = 0
            with requests.get(url + "/big?mib=10", stream=True, timeout=60) as r:
                for piece in r.iter_content(1 << 16):
                    digest.update(piece)
                    size += len(piece)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert size == 10 << 20
    # every allocation of this process (the forward's thread included) stayed far below
    # the 10 MiB that passed
    assert peak < 4 << 20, f"peak traced memory {peak} bytes"


def test_server_sent_events_arrive_one_by_one(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    with shared_provider.forward(served, PORT) as url:
        times: List[float] = []
        with requests.get(url + "/sse?n=3&gap=0.5", stream=True, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith(b"data:"):
                    times.append(time.monotonic())
    assert len(times) == 3
    assert times[2] - times[0] > 0.7  # spaced as sent, not delivered at the end


def test_websocket_echo_through_forward(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    async def talk(url: str) -> List[object]:
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(url + "/ws", max_msg_size=32 << 20) as ws:
                await ws.send_str("hi there")
                text = (await ws.receive(timeout=10)).data
                blob = os.urandom(2 << 20)
                await ws.send_bytes(blob)
                back = (await ws.receive(timeout=30)).data
                await ws.close(code=4001)
                return [text, back == blob]

    with shared_provider.forward(served, PORT) as url:
        text, same = asyncio.run(talk(url))
    assert text == "hi there" and same


def test_a_hundred_concurrent_requests_through_forward(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    errors: List[BaseException] = []
    answers: List[str] = []
    with shared_provider.forward(served, PORT) as url:
        def one(_: int) -> None:
            try:
                answers.append(requests.get(url + "/hello", timeout=60).text)
            except BaseException as exc:
                errors.append(exc)

        run_in_threads(one, 100, 90)
    assert errors == [] and answers == ["hello\n"] * 100


def test_private_traffic_needs_the_token_and_forward_adds_it(
    shared_provider: E2BSandboxProvider, emulator  # type: ignore[no-untyped-def]
) -> None:
    p = shared_provider
    h = p.create(unique_name("priv"), SandboxLimits(public_traffic=False))
    try:
        serve(p, h)
        headers = p.traffic_headers(h)
        assert list(headers) == ["e2b-traffic-access-token"]
        token = headers["e2b-traffic-access-token"]
        assert token not in repr(h) and token not in repr(p)
        host = urllib.parse.urlsplit(p.url(h, PORT)).netloc
        direct = f"{emulator.sandbox_url}/hello"
        assert requests.get(direct, headers={"Host": host}, timeout=10).status_code == 403
        ok = requests.get(direct, headers={"Host": host, **headers}, timeout=10)
        assert (ok.status_code, ok.text) == (200, "hello\n")
        with p.forward(h, PORT) as url:
            assert requests.get(url + "/hello", timeout=10).text == "hello\n"
    finally:
        p.destroy(h)


def test_forward_is_closed_with_the_provider(
    emulator, served: SandboxHandle  # type: ignore[no-untyped-def]
) -> None:
    p = E2BSandboxProvider(emulator.config(template="base"))
    cm = p.forward(served, PORT)
    url = cm.__enter__()
    assert requests.get(url + "/hello", timeout=10).text == "hello\n"
    p.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "/hello", timeout=5)
    cm.__exit__(None, None, None)  # leaving afterwards is harmless


@pytest.fixture
def cli_env(emulator) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    return command_line.cli_env(emulator)


@pytest.fixture
def cli_forward(cli_env: Dict[str, str], served: SandboxHandle) -> Iterator[subprocess.Popen[str]]:
    with command_line.started(cli_env, "forward", served.id, str(PORT)) as child:
        yield child


def test_cli_forward_runs_until_ctrl_c(cli_forward: subprocess.Popen[str]) -> None:
    assert cli_forward.stdout is not None
    line = cli_forward.stdout.readline()
    assert line.startswith("Forwarding from 127.0.0.1:") and line.endswith(f" -> {PORT}\n")
    local = line.split()[2]
    assert requests.get(f"http://{local}/hello", timeout=10).text == "hello\n"
    cli_forward.send_signal(signal.SIGINT)
    assert cli_forward.wait(30) == 0
    assert cli_forward.stderr is not None and "Traceback" not in cli_forward.stderr.read()


def test_the_readme_example_runs_as_written() -> None:
    out = run_readme_example("### Ports and previews")
    status, url = out.stdout.splitlines()
    assert status == "200"
    assert url.startswith("http://8000-") and ".e2b.localhost:" in url


def test_cli_url_prints_the_port_url(
    cli_env: Dict[str, str], shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    r = subprocess.run([sys.executable, "-m", "e2b_provider", "url", served.id, str(PORT)],
                       env=cli_env, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (0, shared_provider.url(served, PORT) + "\n"), r.stderr
    bad = subprocess.run([sys.executable, "-m", "e2b_provider", "url", served.id, "0"],
                         env=cli_env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "ports are from 1 to 65535" in bad.stderr
    clash = subprocess.run(
        [sys.executable, "-m", "e2b_provider", "forward", served.id, "9000:8000",
         "--local-port", "9001"], env=cli_env, capture_output=True, text=True, timeout=120)
    assert clash.returncode == 2 and "local port once" in clash.stderr
