"""The command line (``e2b-provider``, ``python -m e2b_provider``) against the emulator."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Dict, Iterator, List

import pytest

from e2b_provider import E2BSandboxProvider, SandboxHandle
from e2b_provider.cli import parser

from .conftest import unique_name

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "e2b_provider"]


def _default_sigint() -> None:
    # As in a terminal, also when this test run was started with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def env(emu) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    e = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    e.update(
        E2B_API_URL=emu.api_url,
        E2B_SANDBOX_URL=emu.sandbox_url,
        E2B_API_KEY=emu.api_key,
        E2B_TEMPLATE="base",
        PYTHONUNBUFFERED="1",
    )
    return e


def run(env: Dict[str, str], *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run(
        [*CLI, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_default_sigint,
    )


@contextlib.contextmanager
def started(env: Dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    """The command line running in the background with piped output; killed if still running."""
    child = subprocess.Popen(
        [*CLI, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.fixture
def named(env: Dict[str, str], provider: E2BSandboxProvider) -> Iterator[str]:
    name = unique_name("cli")
    r = run(env, "create", name)
    assert r.returncode == 0, r.stderr
    yield name
    provider.destroy_by_name(name)


def test_round_trip_create_exec_cp_ls_rm(env: Dict[str, str], tmp_path, provider) -> None:  # type: ignore[no-untyped-def]
    name = unique_name("cli")
    r = run(env, "create", name, "--cpu", "2", "--memory-mb", "1024")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    assert provider.list_sandboxes(name)[0].id == sid
    r = run(
        env,
        "exec",
        name,
        "--env",
        "GREETING=hi",
        "--cwd",
        "/tmp",
        "--",
        "echo $GREETING; pwd; echo oops >&2; exit 7",
    )
    assert (r.returncode, r.stdout, r.stderr) == (7, "hi\n/tmp\n", "oops\n")
    src = tmp_path / "up.bin"
    src.write_bytes(os.urandom(300_000))
    assert run(env, "cp", str(src), f"{name}:/workspace/d/up.bin").returncode == 0
    down = tmp_path / "down.bin"
    r = run(env, "cp", f"{sid}:/workspace/d/up.bin", str(down))  # by id this time
    assert r.returncode == 0, r.stderr
    assert down.read_bytes() == src.read_bytes()
    r = run(env, "ls")
    assert r.returncode == 0
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "STATE", "STARTED"]
    assert any(row.split()[:3] == [sid, name, "running"] for row in rows), r.stdout
    assert run(env, "suspend", name).returncode == 0
    assert provider.list_sandboxes(name)[0].state == "paused"
    assert run(env, "resume", name).returncode == 0
    assert provider.list_sandboxes(name)[0].state == "running"
    assert run(env, "rm", name).returncode == 0
    assert provider.list_sandboxes(name) == []


def test_exec_exit_codes_timeout_and_missing_sandbox(env: Dict[str, str], named: str) -> None:
    assert run(env, "exec", named, "--", "true").returncode == 0
    assert run(env, "exec", named, "--", "ls", "-la", "/nonexistent").returncode == 2
    r = run(env, "exec", named, "--timeout", "1", "--", "sleep", "30")
    assert r.returncode == 124 and "timed out" in r.stderr
    r = run(env, "exec", "no-such-sandbox", "--", "true")
    assert r.returncode == 2 and "no sandbox is named 'no-such-sandbox'" in r.stderr
    assert "Traceback" not in r.stderr


def test_exec_streams_output_live(env: Dict[str, str], named: str, provider) -> None:  # type: ignore[no-untyped-def]
    h = provider.list_sandboxes(named)[0].handle
    provider.exec(h, "rm -f /tmp/cli-go", timeout=30.0)
    command = "echo first; while [ ! -e /tmp/cli-go ]; do sleep 0.05; done; echo second"
    with started(env, "exec", named, "--", command) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "first\n"  # shown while the command still runs
        provider.write_file(h, "/tmp/cli-go", b"")
        out, err = child.communicate(timeout=60)
        assert (child.returncode, out) == (0, "second\n"), err


def test_ctrl_c_kills_the_remote_command_and_exits_130(
    env: Dict[str, str], named: str, provider
) -> None:  # type: ignore[no-untyped-def]
    h = provider.list_sandboxes(named)[0].handle
    marker = str(time.monotonic_ns())[-6:]
    with started(env, "exec", named, "--", f"echo started; sleep 9{marker}") as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "started\n"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    left = provider.exec(h, f"pgrep -f '[s]leep 9{marker}' || true", timeout=30.0)
    assert left.stdout.strip() == ""


def test_usage_and_config_errors_are_one_line(env: Dict[str, str]) -> None:
    r = run(env, "exec")
    assert r.returncode == 2 and "usage:" in r.stderr
    r = run(env, "create", "bad name!")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run({**env, "E2B_API_KEY": ""}, "ls")
    assert r.returncode == 2 and "E2B_API_KEY" in r.stderr and "Traceback" not in r.stderr
    r = run(env, "ls", "--", "x")
    assert r.returncode == 2
    r = run(env, "cp", "/a", "/b")
    assert r.returncode == 2 and "SANDBOX:/" in r.stderr


def test_every_command_has_help() -> None:
    sub = next(a for a in parser()._actions if a.dest == "cmd")
    names: List[str] = list(sub.choices)  # type: ignore[union-attr]
    assert set(names) == {"create", "exec", "start", "logs", "kill", "ps", "cp", "ls", "rm",
                          "suspend", "resume", "emulator"}
    for name in [*names, None]:
        args = [name, "--help"] if name else ["--help"]
        r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "usage: e2b-provider" in r.stdout


def test_emulator_command_prints_exports_and_stops_on_ctrl_c(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with started({**os.environ, "PYTHONUNBUFFERED": "1"}, "emulator") as child:
        assert child.stdout is not None
        lines = [child.stdout.readline().strip() for _ in range(5)]
        exports = dict(line.removeprefix("export ").split("=", 1) for line in lines)
        assert set(exports) == {
            "E2B_API_URL",
            "E2B_SANDBOX_URL",
            "E2B_VOLUME_API_URL",
            "E2B_API_KEY",
            "E2B_TEMPLATE",
        }
        assert exports["E2B_TEMPLATE"] == "base"
        env = {**os.environ, **exports}
        r = run(env, "create", "emu-cli")
        assert r.returncode == 0, r.stderr
        r = run(env, "exec", "emu-cli", "--", "echo", "hello")
        assert (r.returncode, r.stdout) == (0, "hello\n")
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=60)
        assert child.returncode == 0
        r = run(env, "ls", timeout=30)
        # the emulator is gone: the message names the URL that failed, and why
        api = exports["E2B_API_URL"].rstrip("/")
        assert r.returncode == 1 and f"connection to {api}/v2/sandboxes failed: connection " \
            "refused" in r.stderr, r.stderr


def test_python_dash_m_and_console_script_agree() -> None:
    script = os.path.join(os.path.dirname(sys.executable), "e2b-provider")
    a = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    b = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=60)
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout != ""


def test_handle_of_a_listed_sandbox(provider: E2BSandboxProvider) -> None:
    name = unique_name("ls")
    h = provider.create(name)
    try:
        (s,) = provider.list_sandboxes(name)
        assert s.handle == SandboxHandle(h.id, name) and s.state == "running"
        assert s.started_at is not None and s.started_at.tzinfo is not None
    finally:
        provider.destroy(h)


def test_cp_r_both_ways_and_ls_of_a_directory(
    env: Dict[str, str], named: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "proj"
    (src / "src").mkdir(parents=True)
    (src / "src" / "main.py").write_text("print(1)\n")
    (src / "README").write_text("hi\n")
    (src / "x.pyc").write_bytes(b"compiled")
    # a directory without -r is refused, as cp does
    r = run(env, "cp", str(src), f"{named}:/workspace/")
    assert r.returncode == 1 and "-r not given" in r.stderr
    # into an existing directory: the copy goes inside it, under its own name
    r = run(env, "cp", "-r", "--exclude", "*.pyc", str(src), f"{named}:/workspace/")
    assert r.returncode == 0, r.stderr
    r = run(env, "ls", f"{named}:/workspace/proj")
    assert (r.returncode, r.stdout.split()) == (0, ["README", "src"]), r.stderr
    r = run(env, "ls", "-l", "--depth", "2", f"{named}:/workspace/proj")
    lines = r.stdout.splitlines()
    assert any(line.startswith("-rw-r--r--") and line.endswith("/workspace/proj/src/main.py")
               for line in lines), r.stdout
    assert any(line.startswith("d") and line.endswith("/workspace/proj/src") for line in lines)
    # and back, into a new directory
    back = tmp_path / "back"
    r = run(env, "cp", "-r", f"{named}:/workspace/proj", str(back))
    assert r.returncode == 0, r.stderr
    assert (back / "src" / "main.py").read_text() == "print(1)\n"
    assert not (back / "x.pyc").exists()
    # a missing path says so and exits 1
    r = run(env, "cp", f"{named}:/workspace/none", str(tmp_path / "n"))
    assert r.returncode == 1 and "no such file or directory" in r.stderr
    r = run(env, "ls", f"{named}:/workspace/none")
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_cp_shows_a_progress_line_on_a_terminal(
    env: Dict[str, str], named: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import pty

    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(48 << 20))
    leader, follower = pty.openpty()
    try:
        child = subprocess.Popen(
            [*CLI, "cp", str(src), f"{named}:/workspace/big.bin"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower,
            preexec_fn=_default_sigint,
        )
        os.close(follower)
        follower = -1
        seen = b""
        while True:
            try:
                piece = os.read(leader, 4096)
            except OSError:  # the child closed the terminal
                break
            if not piece:
                break
            seen += piece
        assert child.wait(120) == 0, seen
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    text = seen.decode("utf-8", "replace")
    assert f"{src} -> {named}:/workspace/big.bin" in text
    assert "48.0 MiB in" in text and "MiB/s" in text, text


def test_ctrl_c_during_cp_leaves_the_old_file_whole(
    env: Dict[str, str], named: str, tmp_path, provider
) -> None:  # type: ignore[no-untyped-def]
    h = provider.list_sandboxes(named)[0].handle
    old = os.urandom(1 << 20)
    provider.write_file(h, "/workspace/up/big.bin", old)
    src = tmp_path / "up"  # cp -r up SANDBOX:/workspace writes /workspace/up
    src.mkdir()
    with open(src / "big.bin", "wb") as f:  # 400 MiB: Ctrl-C lands while it is written
        for _ in range(25):
            f.write(os.urandom(16 << 20))
    with started(env, "cp", "-r", str(src), f"{named}:/workspace") as child:
        # interrupt once the upload runs in the sandbox
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = provider.exec(h, "pgrep -f '[e]xtract /workspace/up' || true", timeout=30.0)
            if r.stdout.strip():
                break
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert "Traceback" not in err
    got = provider.read_file(h, "/workspace/up/big.bin", max_bytes=2 << 20)
    assert got is not None and got.data == old
    parts = provider.exec(h, "find /workspace -name '.capybara-part-*'", timeout=30.0)
    assert parts.stdout == ""
