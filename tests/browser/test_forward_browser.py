"""A real browser on this machine uses a server in the sandbox through ``forward``.

The sandbox runs ``tests/support/sandbox_server.py``; its page opens a WebSocket back to the
host it came from (here: the forward's local address), sends a greeting and shows the echo.
The text appears only if the forward relayed the page (HTTP) and the WebSocket both ways.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from browser.chromium import OpenPage
from e2b_provider import E2BSandboxProvider, SandboxHandle

pytestmark = pytest.mark.integration

SERVER = Path(__file__).resolve().parents[1] / "support" / "sandbox_server.py"
# files are written as user "sandbox", whose home (and default directory) is /workspace
REMOTE = "/workspace/sandbox_server.py"
PORT = 8000

# Run in the sandbox: wait (at most 30 s) until the server answers on its port.
WAIT_FOR_PORT = f"""
import time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
deadline = time.monotonic() + 30
while True:
    try:
        opener.open("http://127.0.0.1:{PORT}/hello", timeout=2).read()
        break
    except OSError as exc:
        if time.monotonic() > deadline:
            raise SystemExit("port {PORT} did not answer: %s" % exc)
        time.sleep(0.1)
"""


def test_a_page_served_in_the_sandbox_talks_websocket_through_the_forward(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, browser: OpenPage
) -> None:
    shared_provider.write_file(sandbox, REMOTE, SERVER.read_bytes())
    server = shared_provider.start(sandbox, f"python3 {REMOTE} {PORT}")
    try:
        ready = shared_provider.exec(
            sandbox, f"python3 -c {shlex.quote(WAIT_FOR_PORT)}", timeout=60)
        assert ready.exit_code == 0, f"{ready}\nserver output: {server.output()}"
        with shared_provider.forward(sandbox, PORT) as url:
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+/?", url), url
            with browser(url) as page:
                page.expect_text("#echo", "echo: hello from the browser", timeout=30)
    finally:
        server.kill()


def test_the_port_url_of_an_emulator_sandbox_opens_in_a_browser_as_it_is(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, browser: OpenPage
) -> None:
    """``url(h, port)`` on the emulator (``http://<port>-<id>.e2b.localhost:<port>``): the
    browser resolves the name to this machine itself, and the emulator's relay routes by the
    Host it sends; the page's WebSocket goes the same way."""
    shared_provider.write_file(sandbox, REMOTE, SERVER.read_bytes())
    server = shared_provider.start(sandbox, f"python3 {REMOTE} {PORT + 1}")
    try:
        wait = WAIT_FOR_PORT.replace(str(PORT), str(PORT + 1))
        ready = shared_provider.exec(sandbox, f"python3 -c {shlex.quote(wait)}", timeout=60)
        assert ready.exit_code == 0, f"{ready}\nserver output: {server.output()}"
        url = shared_provider.url(sandbox, PORT + 1)
        assert re.fullmatch(rf"http://{PORT + 1}-{sandbox.id}\.e2b\.localhost:\d+", url), url
        with browser(url) as page:
            page.expect_text("#echo", "echo: hello from the browser", timeout=30)
    finally:
        server.kill()
