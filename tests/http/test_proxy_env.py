"""The environment's proxy settings, honoured as requests honours them, read once.

A second scripted server on 127.0.0.1 plays the forward proxy: a request sent through it
arrives in absolute form (``GET http://host:port/path``) and is recorded there, so each test
sees on which server a request really arrived.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from server import Request, Responder, ScriptedServer

from e2b_provider.transport.client import Transport

_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "REQUEST_METHOD")


@pytest.fixture
def proxy() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    srv.on("GET", "/x", lambda q, r: r.send(200, b"via proxy"))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def _direct(q: Request, r: Responder) -> None:
    r.send(200, b"direct")


def _get(t: Transport, url: str) -> bytes:
    return t.request("GET", url, read_timeout=5, operation="get").body


def test_http_proxy_is_used(
    env: pytest.MonkeyPatch, server: ScriptedServer, proxy: ScriptedServer
) -> None:
    server.on("GET", "/x", _direct)
    env.setenv("HTTP_PROXY", proxy.url)
    with Transport() as t:
        for _ in range(3):
            assert _get(t, server.url + "/x?a=1") == b"via proxy"
    assert server.received() == []
    targets = [r.target for r in proxy.received()]
    assert targets == [server.url + "/x?a=1"] * 3
    assert proxy.accepted == 1  # the connection to the proxy is kept too


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("all_proxy", b"via proxy"),
        ("ALL_PROXY", b"via proxy"),
        ("http_proxy", b"via proxy"),
        ("HTTPS_PROXY", b"direct"),  # only for https URLs
    ],
)
def test_each_variable_is_honoured(
    env: pytest.MonkeyPatch,
    server: ScriptedServer,
    proxy: ScriptedServer,
    name: str,
    answer: bytes,
) -> None:
    server.on("GET", "/x", _direct)
    env.setenv(name, proxy.url)
    with Transport() as t:
        assert _get(t, server.url + "/x") == answer
    assert len(server.received()) == (answer == b"direct")
    assert len(proxy.received()) == (answer == b"via proxy")


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "localhost,127.0.0.1", "*", "127.0.0.0/8"])
def test_no_proxy_bypasses_the_proxy(
    env: pytest.MonkeyPatch, server: ScriptedServer, proxy: ScriptedServer, no_proxy: str
) -> None:
    server.on("GET", "/x", _direct)
    env.setenv("HTTP_PROXY", proxy.url)
    env.setenv("NO_PROXY", no_proxy)
    with Transport() as t:
        assert _get(t, server.url + "/x") == b"direct"
        assert _get(t, server.url + "/x") == b"direct"
    assert proxy.received() == []


def test_no_proxy_is_decided_per_host(
    env: pytest.MonkeyPatch, server: ScriptedServer, proxy: ScriptedServer
) -> None:
    server.on("GET", "/x", _direct)
    env.setenv("http_proxy", proxy.url)
    env.setenv("no_proxy", "localhost")
    by_name = f"http://localhost:{server.port}/x"
    with Transport() as t:
        assert _get(t, by_name) == b"direct"
        assert _get(t, server.url + "/x") == b"via proxy"
        assert _get(t, by_name) == b"direct"
    assert [r.target for r in proxy.received()] == [server.url + "/x"]


def test_the_environment_is_read_once(
    env: pytest.MonkeyPatch, server: ScriptedServer, proxy: ScriptedServer
) -> None:
    server.on("GET", "/x", _direct)
    with Transport() as t:
        assert _get(t, server.url + "/x") == b"direct"
        env.setenv("HTTP_PROXY", proxy.url)  # later changes do not reach a live transport
        assert _get(t, server.url + "/x") == b"direct"
    with Transport() as t2:
        assert _get(t2, server.url + "/x") == b"via proxy"
    env.setenv("HTTP_PROXY", proxy.url)
    with Transport() as t3:
        env.setenv("NO_PROXY", "127.0.0.1")  # read on the host's first request
        assert _get(t3, server.url + "/x") == b"direct"
