"""The headless-browser harness itself, against a page and a WebSocket echo served here.

The page is the one the sandbox's test server serves (a script opens a WebSocket to ``/ws``,
sends a greeting and writes the echo into ``#echo``); this server can hold the echo back
(``?delay=S``) or never send it (``?silent=1``), so that the harness is seen to wait for what
the script writes after a network round trip, and to fail, with a screenshot, when it does not
come.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest
from aiohttp import WSMsgType, web

from browser.chromium import BrowserError, OpenPage, _browser_pids, artifacts_dir

GREETING = "hello from the browser"

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><link rel="icon" href="data:,"></head>
<body><p id="echo">waiting</p>
<script>
  var ws = new WebSocket("ws://" + location.host + "/ws" + location.search);
  ws.onopen = function () { ws.send("hello from the browser"); };
  ws.onmessage = function (ev) {
    document.getElementById("echo").textContent = "echo: " + ev.data;
  };
  ws.onerror = function () { document.getElementById("echo").textContent = "error"; };
</script></body></html>
"""


class EchoSite:
    """``GET /`` (the page) and ``GET /ws`` (the echo) on 127.0.0.1, on a thread's loop."""

    def __init__(self) -> None:
        self.received: List[str] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: Optional[web.AppRunner] = None

    def start(self) -> None:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        self.url = f"http://127.0.0.1:{port}/"

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> int:
        app = web.Application()
        app.add_routes([web.get("/", self._page), web.get("/ws", self._ws)])
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port: int = self._runner.addresses[0][1]
        return port

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        delay = float(request.query.get("delay", "0"))
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            self.received.append(msg.data)
            if request.query.get("silent"):
                continue
            await asyncio.sleep(delay)
            await ws.send_str(msg.data)
        return ws


@pytest.fixture
def site() -> Iterator[EchoSite]:
    s = EchoSite()
    s.start()
    try:
        yield s
    finally:
        s.stop()


def test_sees_the_text_a_script_writes_after_a_websocket_round_trip(
    site: EchoSite, browser: OpenPage
) -> None:
    # held back for longer than the page takes to load: what --dump-dom would print is
    # "waiting"
    with browser(site.url + "?delay=1.5") as page:
        t0 = time.monotonic()
        page.expect_text("#echo", f"echo: {GREETING}", timeout=30)
        waited = time.monotonic() - t0
        assert page.text("#echo") == f"echo: {GREETING}"
        assert f'<p id="echo">echo: {GREETING}</p>' in page.html()
    assert site.received == [GREETING]
    assert waited >= 1.0, f"the echo came after {waited:.2f} s, before the server sent it"


def test_a_failing_expectation_saves_a_screenshot_and_names_it(
    site: EchoSite, browser: OpenPage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifacts = tmp_path / "artifacts"
    monkeypatch.setenv("E2B_PROVIDER_ARTIFACTS", str(artifacts))
    with browser(site.url + "?silent=1") as page:
        t0 = time.monotonic()
        with pytest.raises(AssertionError) as failed:
            page.expect_text("#echo", "echo: never sent", timeout=2.0)
        took = time.monotonic() - t0
    message = str(failed.value)
    assert "expected 'echo: never sent', saw 'waiting' after 2 s" in message
    assert took < 15, f"a 2 s expectation failed after {took:.1f} s"
    shot = re.search(r"^screenshot: (.+\.png)$", message, re.M)
    assert shot, message
    path = Path(shot.group(1))
    assert path.parent == artifacts
    assert path.name.startswith("test_a_failing_expectation_saves_a_screenshot")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 1000
    html = re.search(r"^html: (.+\.html)$", message, re.M)
    assert html, message
    assert '<p id="echo">waiting</p>' in Path(html.group(1)).read_text()
    assert site.received == [GREETING]


def test_the_browser_tree_and_its_temporary_directory_are_gone_after_the_page(
    site: EchoSite, browser: OpenPage
) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with browser(site.url) as page:
            page.expect_text("#echo", f"echo: {GREETING}", timeout=30)
            pids = _browser_pids(page.pid, str(page.temp_dir))
            temp_dir = page.temp_dir
            assert page.pid in pids and len(pids) > 1, pids  # a browser has helpers
            assert (temp_dir / "profile").is_dir()
            raise Boom
    alive = [pid for pid in pids if _alive(pid)]
    assert alive == [], f"browser processes left: {alive}"
    assert not temp_dir.exists()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def test_a_page_that_cannot_load_is_an_error(browser: OpenPage) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(BrowserError, match="ERR_CONNECTION_REFUSED"):
        with browser(f"http://127.0.0.1:{port}/"):
            pass


def test_artifacts_default_to_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("E2B_PROVIDER_ARTIFACTS", raising=False)
    repo = Path(__file__).resolve().parents[2]
    assert artifacts_dir() == repo / "artifacts"
    assert "artifacts/" in (repo / ".gitignore").read_text().split()
    monkeypatch.setenv("E2B_PROVIDER_ARTIFACTS", os.fspath(Path("/somewhere")))
    assert artifacts_dir() == Path("/somewhere")
