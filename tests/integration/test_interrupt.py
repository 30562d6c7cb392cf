"""Ctrl-C: SIGINT to a process blocked in exec kills the remote command, then re-raises."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Iterator

import pytest
from waiting import last_request, wait_until

from e2b_provider import E2BSandboxProvider, SandboxHandle

from .conftest import unique_name

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent(
    """
    import json, logging, signal, sys
    # Ctrl-C works as in a terminal or a Jupyter kernel even when this test run was started
    # with SIGINT ignored (a background job of a non-interactive shell).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")
    from e2b_provider import DeploymentConfig, E2BSandboxProvider
    cfg = DeploymentConfig(**json.loads(sys.argv[1]))
    with E2BSandboxProvider(cfg, interrupt_kill_bound=float(sys.argv[4])) as p:
        print("ready", flush=True)
        try:
            p.exec(sys.argv[2], sys.argv[3], timeout=300.0)
        except KeyboardInterrupt:
            print("child saw KeyboardInterrupt", flush=True)
            raise
        print("exec returned", flush=True)
    """
)


def _spawn(emu, sandbox_id: str, command: str, bound: float = 10.0) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    cfg = {
        "api_key": emu.api_key,
        "template": "base",
        "api_url": emu.api_url,
        "sandbox_url": emu.sandbox_url,
        "domain": "e2b.localhost",
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(cfg), sandbox_id, command, str(bound)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_running(p: E2BSandboxProvider, h: SandboxHandle, pattern: str) -> None:
    wait_until(
        lambda: p.exec(h, f"pgrep -f '{pattern}' >/dev/null && echo yes", timeout=30.0).stdout,
        30.0,
        "the remote command to start",
        interval=0.2,
    )


@contextlib.contextmanager
def _running_child(
    emu, p: E2BSandboxProvider, h: SandboxHandle, command: str, pattern: str, bound: float = 10.0
) -> Iterator[subprocess.Popen]:  # type: ignore[no-untyped-def]
    """A child process blocked in ``exec(command)``, once ``pattern`` runs in the sandbox."""
    child = _spawn(emu, h.id, command, bound)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        _wait_running(p, h, pattern)
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_sigint_kills_remote_command_and_reraises(
    emu, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:  # type: ignore[no-untyped-def]
    marker = str(time.monotonic_ns())
    command = f"sleep 1{marker} & sleep 2{marker}"
    with _running_child(emu, shared_provider, sandbox, command, f"[s]leep 2{marker}") as child:
        t0 = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
        took = time.monotonic() - t0
    assert "child saw KeyboardInterrupt" in out
    assert "exec returned" not in out
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert child.returncode != 0
    assert took < 15.0
    left = shared_provider.exec(sandbox, f"pgrep -f '[s]leep [0-9]{marker}' || true", timeout=30.0)
    assert left.stdout.strip() == ""


def test_a_script_interrupted_in_exec_prints_a_short_traceback(
    emu, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:  # type: ignore[no-untyped-def]
    """The traceback Python prints: the script's line and the library's call, no internal
    frame (was 60 lines down to ``socket.recv_into``)."""
    marker = str(time.monotonic_ns())
    command = f"sleep 4{marker}"
    with _running_child(emu, shared_provider, sandbox, command, f"[s]leep 4{marker}") as child:
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    assert "child saw KeyboardInterrupt" in out
    shown = err[err.index("Traceback (most recent call last):"):].rstrip().splitlines()
    assert len(shown) <= 12, err
    assert shown[-1] == "KeyboardInterrupt", err
    files = [line.split(",")[0].strip() for line in shown if line.startswith("  File ")]
    assert files[0] == 'File "<string>"', err  # the script's own line
    assert len(files) == 2 and files[1].endswith('e2b_provider/provider.py"'), err


def test_second_sigint_abandons_a_hung_cleanup(emu, provider: E2BSandboxProvider) -> None:  # type: ignore[no-untyped-def]
    h = provider.create(unique_name("ki2"))
    try:
        marker = str(time.monotonic_ns())
        command, pattern = f"sleep 3{marker}", f"[s]leep 3{marker}"
        with _running_child(emu, provider, h, command, pattern, bound=60.0) as child:
            mark = last_request(emu)
            emu.envd_unresponsive(h.id)  # the kill will hang
            child.send_signal(signal.SIGINT)
            wait_until(
                lambda: [
                    e
                    for e in emu.requests(sandbox_id=h.id, path="process.Process/Start")
                    if e["seq"] > mark and e.get("hung")
                ],
                30.0,
                "the interrupted child's kill to reach the sandbox",
            )
            assert child.poll() is None  # still trying to kill (bounded by 60 s)
            t0 = time.monotonic()
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=20)
            took = time.monotonic() - t0
        assert "child saw KeyboardInterrupt" in out
        assert "abandoning cleanup" in err
        assert err.rstrip().endswith("KeyboardInterrupt")
        assert took < 5.0
    finally:
        emu.clear_faults()
        provider.destroy(h)
