"""The command line finds the ``e2b-provider emulator`` this user runs, as ``docker`` finds its
local daemon: with no ``E2B_API_KEY``, through the record the emulator keeps while it serves
(and removes when it stops); with none running, the error says what to do. The key is never
printed, and a configuration in the environment wins."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Dict, Iterator

import pytest
from command_line import CLI, run, started
from waiting import wait_until

from e2b_provider.cli import emulator_record


@pytest.fixture
def env(tmp_path: Path) -> Dict[str, str]:
    """Our environment with no E2B_ variable, a runtime directory of its own."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    e = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    return {**e, "XDG_RUNTIME_DIR": str(runtime), "PYTHONUNBUFFERED": "1"}


def record_file(env: Dict[str, str]) -> Path:
    return Path(env["XDG_RUNTIME_DIR"]) / "e2b-provider" / "emulator.json"


@pytest.fixture
def detached(env: Dict[str, str]) -> Iterator[int]:
    """``e2b-provider emulator -d``: its pid; stopped (SIGTERM) at the end if still running."""
    r = subprocess.run([*CLI, "emulator", "-d"], env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=200)
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout)
    assert f"in the background as pid {pid}: 'kill {pid}' stops it" in r.stderr
    yield pid
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), 120, "the emulator to stop")


def test_with_no_emulator_and_no_key_the_error_names_both(env: Dict[str, str]) -> None:
    r = run(env, "ls", timeout=60)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert "e2b-provider emulator" in r.stderr and "E2B_API_KEY" in r.stderr, r.stderr
    assert "apiKey: required" not in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_foreground_emulator_is_found_and_its_record_goes_when_it_stops(
    env: Dict[str, str], sig: int
) -> None:
    with started(env, "emulator") as child:
        assert child.stdout is not None
        key = child.stdout.readline().strip().split("=", 1)[1]  # export E2B_API_KEY=...
        wait_until(lambda: record_file(env).exists(), 60, "the record")
        st = record_file(env).stat()
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid()
        assert json.loads(record_file(env).read_text())["pid"] == child.pid
        created = run(env, "create", "found-1")
        assert created.returncode == 0, created.stderr
        r = run(env, "exec", "found-1", "--", "echo", "hello")
        assert (r.returncode, r.stdout) == (0, "hello\n"), r.stderr
        listed = run(env, "ls")
        assert listed.returncode == 0 and "found-1" in listed.stdout, listed.stderr
        removed = run(env, "rm", "found-1")
        assert removed.returncode == 0, removed.stderr
        for out in (created, r, listed, removed):
            assert key not in out.stdout + out.stderr
        child.send_signal(sig)
        child.communicate(timeout=120)
        assert child.returncode == 0
    assert not record_file(env).exists()
    r = run(env, "ls", timeout=60)
    assert r.returncode == 2 and "e2b-provider emulator" in r.stderr, r.stderr


def test_detach_returns_once_it_serves_and_kill_removes_its_record(
    env: Dict[str, str], detached: int
) -> None:
    r = run(env, "create", "found-2")
    assert r.returncode == 0, r.stderr
    r = run(env, "exec", "found-2", "--", "echo", "hi")
    assert (r.returncode, r.stdout) == (0, "hi\n"), r.stderr
    # a session of its own: a Ctrl-C in the terminal that started it does not reach it
    assert os.getsid(detached) == detached
    os.kill(detached, signal.SIGTERM)
    wait_until(lambda: not Path(f"/proc/{detached}").exists(), 120, "the emulator to stop")
    assert not record_file(env).exists()


def test_a_key_in_the_environment_wins_over_the_record(
    env: Dict[str, str], detached: int
) -> None:
    url = emulator_record.read(env)
    assert url is not None
    wrong = {**env, "E2B_API_KEY": "e2b_" + "0" * 40, "E2B_API_URL": url["api_url"],
             "E2B_SANDBOX_URL": url["sandbox_url"], "E2B_TEMPLATE": "base"}
    r = run(wrong, "ls", timeout=60)
    assert r.returncode == 1 and "401" in r.stderr, r.stderr
    assert url["api_key"] not in r.stderr


def test_a_stale_record_is_ignored_and_removed(env: Dict[str, str], detached: int) -> None:
    os.kill(detached, signal.SIGKILL)  # no chance to remove its record
    wait_until(lambda: not Path(f"/proc/{detached}").exists(), 60, "the emulator to die")
    assert record_file(env).exists()
    r = run(env, "ls", timeout=60)
    assert r.returncode == 2 and "e2b-provider emulator" in r.stderr, r.stderr
    assert not record_file(env).exists()


def test_a_record_others_may_read_is_refused(env: Dict[str, str], detached: int) -> None:
    key = json.loads(record_file(env).read_text())["api_key"]
    record_file(env).chmod(0o644)
    r = run(env, "ls", timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"refusing the emulator record at {record_file(env)}: others may use it" in r.stderr
    assert key not in r.stderr
