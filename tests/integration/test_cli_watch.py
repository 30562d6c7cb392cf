"""The command line's ``watch`` against the emulator: real subprocesses, real changes.

One line per event (``create /workspace/...``; ``--json``: one object per line), live; Ctrl-C
exits 130; ``--timeout`` and a removed directory exit 0; a pipe whose reader went away
(``| head -n 1``) ends it at once and quietly, also when no more event comes; errors are one
line (exit 1).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator

import pytest
from command_line import CLI, cli_env, default_sigint, run, started
from waiting import wait_until

from e2b_provider import E2BSandboxProvider, SandboxHandle

from .conftest import unique_name
from .test_cli import _one_line

pytestmark = pytest.mark.integration


@pytest.fixture
def env(emu) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    return cli_env(emu)


@pytest.fixture
def sb(provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    h = provider.create(unique_name("cliw"))
    assert provider.exec(h, "mkdir -p /workspace/w").ok
    yield h
    provider.destroy(h)


def test_watch_prints_one_event_a_line_and_ctrl_c_exits_130(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    with started(env, "watch", str(sb.name), "/workspace/w", "-r") as child:
        assert child.stdout is not None and child.stderr is not None
        assert "watching /workspace/w" in child.stderr.readline()  # set up: nothing is missed
        assert provider.exec(sb, "mkdir /workspace/w/d").ok
        assert child.stdout.readline() == "create /workspace/w/d\n"  # watched from now on
        assert provider.exec(sb, "echo hi > /workspace/w/d/a.txt && "
                                 "mv /workspace/w/d/a.txt /workspace/w/b.txt").ok
        lines = [child.stdout.readline().rstrip("\n") for _ in range(4)]
        assert lines == ["create /workspace/w/d/a.txt", "write /workspace/w/d/a.txt",
                         "rename /workspace/w/d/a.txt", "create /workspace/w/b.txt"]
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
    assert "stopped watching" in err and "Traceback" not in err


def test_watch_json_lines_and_its_timeout(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    with started(env, "watch", str(sb.id), "/workspace/w", "--json", "--timeout", "3") as child:
        assert child.stdout is not None and child.stderr is not None
        child.stderr.readline()
        assert provider.exec(sb, "touch '/workspace/w/two\nlines' /workspace/w/plain").ok
        t0 = time.monotonic()
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert time.monotonic() - t0 < 10
    events = [json.loads(line) for line in out.splitlines()]
    assert {"type": "create", "path": "/workspace/w/two\nlines"} in events
    assert {"type": "create", "path": "/workspace/w/plain"} in events


def test_a_path_with_a_newline_stays_on_one_line(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    with started(env, "watch", str(sb.id), "/workspace/w", "--timeout", "3") as child:
        assert child.stdout is not None and child.stderr is not None
        child.stderr.readline()
        assert provider.exec(sb, "touch '/workspace/w/two\nlines'").ok
        out, _ = child.communicate(timeout=60)
    # create, then chmod (touch sets the times)
    assert out.splitlines() == ["create /workspace/w/two\\nlines", "chmod /workspace/w/two\\nlines"]


def test_watch_ends_quietly_once_its_reader_went_away(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider, tmp_path: Path
) -> None:
    # `| head -n 1`: the first event ends the pipeline, although no other event comes
    err_file = tmp_path / "err.txt"
    line = " ".join(CLI) + f" watch {sb.id} /workspace/w 2>{err_file} | head -n 1"
    child = subprocess.Popen(["bash", "-c", f"set -o pipefail; {line}"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=default_sigint)
    try:
        wait_until(lambda: child.poll() is not None or (
            err_file.exists() and "watching" in err_file.read_text()), 60, "the watch")
        assert child.poll() is None
        assert provider.exec(sb, "touch /workspace/w/first").ok
        t0 = time.monotonic()
        out, _ = child.communicate(timeout=30)
        assert time.monotonic() - t0 < 10
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert (child.returncode, out) == (0, "create /workspace/w/first\n")
    err = err_file.read_text()
    assert "Traceback" not in err and "Broken pipe" not in err and "error" not in err, err


def test_watch_ends_when_its_directory_goes_and_errors_are_one_line(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    with started(env, "watch", str(sb.id), "/workspace/w") as child:
        assert child.stdout is not None and child.stderr is not None
        child.stderr.readline()
        assert provider.exec(sb, "rmdir /workspace/w").ok
        out, err = child.communicate(timeout=60)
    assert (child.returncode, out) == (0, "remove /workspace/w\n"), err
    _one_line(run(env, "watch", str(sb.id), "/workspace/w"), 1,
              "/workspace/w does not exist")
    _one_line(run(env, "watch", str(sb.id), "/root"), 1, "may not read the directory /root")
    r = run(env, "watch", str(sb.id), "workspace")
    assert r.returncode == 2 and "absolute" in r.stderr


def test_watch_names_the_target_of_a_write_never_its_staging_file(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    with started(env, "watch", str(sb.name), "/workspace/w") as child:
        assert child.stdout is not None and child.stderr is not None
        assert "watching /workspace/w" in child.stderr.readline()
        provider.write_file(sb, "/workspace/w/a.txt", b"hello")
        assert provider.exec(sb, "touch /workspace/w/last").ok
        lines = []
        while not lines or lines[-1] != "create /workspace/w/last":
            line = child.stdout.readline()
            assert line, (lines, child.stderr.read())
            lines.append(line.rstrip("\n"))
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=30)
    assert lines == ["create /workspace/w/a.txt", "write /workspace/w/a.txt",
                     "create /workspace/w/last"]
