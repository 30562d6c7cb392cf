"""Fixtures for provider integration tests: a provider bound to the session's emulator."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Iterator, List

import pytest

from e2b_provider import E2BSandboxProvider, OperationTimeout, SandboxHandle, Terminal
from e2b_provider.core.run_engine import run_process


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
    p._files._agents.ready = lambda sid: None  # type: ignore[method-assign]
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
