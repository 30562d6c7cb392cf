"""Fixtures for provider integration tests: a provider bound to the session's emulator, and
the helpers their set-up shares."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from waiting import wait_until

from e2b_provider import E2BSandboxProvider, OperationTimeout, SandboxHandle, Terminal
from e2b_provider.core.run_engine import run_process

#: The emulator's template without python3 (E2B's base, python3 hidden from PATH).
NO_PYTHON = "base-without-python3"
#: The HTTP server the port tests start in a sandbox, and the port it listens on by default.
SANDBOX_SERVER = Path(__file__).resolve().parents[1] / "support" / "sandbox_server.py"
SERVER_PORT = 8000


@pytest.fixture
def provider(emu) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emu.config(template="base")) as p:
        yield p


@pytest.fixture(scope="module")
def shared_provider(emulator) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emulator.config(template="base")) as p:
        yield p


@pytest.fixture(scope="module")
def sandbox(shared_provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    h = shared_provider.create(f"it-{uuid.uuid4().hex[:8]}")
    yield h
    shared_provider.destroy(h)


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def own_sandbox(p: E2BSandboxProvider, prefix: str) -> Iterator[SandboxHandle]:
    """A new sandbox of ``p``'s (named ``prefix-<random>``), destroyed at the end."""
    h = p.create(unique_name(prefix))
    try:
        yield h
    finally:
        p.destroy(h)


def child_config(emulator) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    """The emulator's deployment settings, for a script run in another Python process to
    build its provider from (``DeploymentConfig(**json.loads(sys.argv[1]))``)."""
    return {"api_key": emulator.api_key, "template": "base", "api_url": emulator.api_url,
            "sandbox_url": emulator.sandbox_url, "domain": "e2b.localhost"}


def warm_file_agent(p: E2BSandboxProvider, h: SandboxHandle) -> None:
    """Make the provider's agent in ``h`` ready (the first call starts it in the background)."""
    p.stat(h, "/workspace")
    wait_until(lambda: p._files._agents.sessions() != [], 30, "the file agent")


def root(p: E2BSandboxProvider, h: SandboxHandle, cmd: str) -> str:
    """Run ``cmd`` as root in the sandbox (test set-up and inspection only)."""
    ctx = p._ctx
    r = run_process(
        ctx.envd(ctx.attach(h.id, None)), user="root", cmd="/bin/sh", args=["-c", cmd],
        cwd="/", max_output_bytes=1 << 20, timeout=60.0, cancel=None, watchdog=ctx.watchdog,
    )
    assert r.exit_code == 0, r
    return r.stdout.decode()


def count_requests(p: E2BSandboxProvider, monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """From now on, every request ``p`` sends is added to the list returned, as
    ``"<METHOD> <last path segment>"`` (``"POST SendInput"``, ``"GET files"``)."""
    sent: List[str] = []
    send = p._ctx.transport._send

    def counting(method: str, url: str, **kw: Any) -> Any:
        sent.append(f"{method} {url.rsplit('/', 1)[-1].split('?')[0]}")
        return send(method, url, **kw)

    monkeypatch.setattr(p._ctx.transport, "_send", counting)
    return sent


def no_file_agent(p: E2BSandboxProvider) -> E2BSandboxProvider:
    """Keep ``p`` off the file agent: its file calls take the per-call scripts (each its own
    process stream), as they did before the agent, and no agent start runs in the
    background to take a fault a test arms for the next stream."""
    p._files._agents.ready = lambda sid, start=True: None  # type: ignore[method-assign]
    return p


def until(t: Terminal, pattern: str, timeout: float = 60.0) -> str:
    """Read terminal ``t`` until its output (decoded) matches ``pattern``; return what came."""
    seen = b""
    deadline = time.monotonic() + timeout
    while re.search(pattern, seen.decode("utf-8", "replace")) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {pattern!r} within {timeout:g} s in {seen[-300:]!r}")
        try:
            data = t.read(timeout=left)
        except OperationTimeout:
            continue
        if not data:
            raise AssertionError(f"the terminal ended without {pattern!r}: {seen[-300:]!r}")
        seen += data
    return seen.decode("utf-8", "replace")


def count_processes(p: E2BSandboxProvider, h: SandboxHandle, pattern: str) -> int:
    """How many processes of the sandbox match ``pattern`` (``pgrep -f``; anchor it,
    ``^sleep 1``, so neither the pgrep's own shell nor a wrapper whose arguments hold the
    command line matches it)."""
    return int(root(p, h, f"pgrep -fc -- '{pattern}' || true").strip())


def run_readme_example(heading: str) -> subprocess.CompletedProcess[str]:
    """Run the first Python example below the README's ``heading`` as written, in a Python
    process of its own; it must exit 0. What it printed."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as f:
        readme = f.read()
    section = readme.split(heading, 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    return out


def serve(p: E2BSandboxProvider, h: SandboxHandle, port: int = SERVER_PORT,
          tag: str = "port-test") -> None:
    """Start the test server in ``h`` on ``port`` (a background command tagged ``tag``) and
    wait until it answers inside."""
    p.write_file(h, "/workspace/sandbox_server.py", SANDBOX_SERVER.read_bytes())
    p.start(h, f"python3 /workspace/sandbox_server.py {port}", tag=tag)
    probe = (
        "python3 -c \"import urllib.request as u; "
        f"print(u.urlopen('http://127.0.0.1:{port}/hello', timeout=2).read().decode(), end='')\""
    )
    wait_until(lambda: p.exec(h, probe, timeout=10).stdout == "hello\n", 30,
               "the server answers inside the sandbox")
