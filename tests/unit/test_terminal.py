"""Terminals without a sandbox: ids, the environment, and the wrapper run under /bin/sh on a
pty of this machine (its pid file, its ``.kill`` refusal, the login shell it finds, its exit
status, and a Ctrl-C that reaches the program, not the wrapper)."""

from __future__ import annotations

import os
import pty
import select
import shutil
import signal
import time
import uuid
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from e2b_provider.commands.terminal_wrapper import (
    DEFAULT_TERM,
    LEFTOVERS_VAR,
    TERMINAL_LEFTOVERS,
    TERMINAL_WRAPPER,
    is_terminal_id,
    parse_terminal_id,
    terminal_env,
    terminal_id,
)
from e2b_provider.errors import InvalidArgument
from e2b_provider.protocol import scripts as scripts


def test_a_terminal_id_names_its_pid_and_control_path() -> None:
    ctl = scripts.control_path()
    tid = terminal_id("isandbox123", 42, ctl)
    assert tid == f"isandbox123:pty-42-{uuid.UUID(ctl[len('/tmp/.capybara-exec-'):]).hex}"
    assert is_terminal_id(tid)
    assert parse_terminal_id(tid) == ("isandbox123", 42, ctl)
    for bad in ("isandbox123:" + "0" * 32, "pty-1-" + "0" * 32, f"x:pty-0-{'0' * 32}",
                f"x:pty-1-{'0' * 31}", f"x:pty-01-{'0' * 32}", 42, None):
        assert not is_terminal_id(bad)
        with pytest.raises(InvalidArgument, match="not a terminal id"):
            parse_terminal_id(bad)


def test_the_environment_has_term_unless_given_and_always_the_marker() -> None:
    ctl = scripts.control_path()
    env = terminal_env({"HOME": "/workspace", scripts.EXEC_MARKER: "mine"}, ctl)
    assert env == {"TERM": DEFAULT_TERM, "HOME": "/workspace", scripts.EXEC_MARKER: ctl,
                   LEFTOVERS_VAR: TERMINAL_LEFTOVERS}
    assert terminal_env({LEFTOVERS_VAR: "mine"}, ctl)[LEFTOVERS_VAR] == TERMINAL_LEFTOVERS
    assert terminal_env({"TERM": "vt100"}, ctl)["TERM"] == "vt100"


def run_wrapper(ctl: str, command: str, keys: Sequence[Tuple[float, bytes]] = (),
                env: Optional[Dict[str, str]] = None,
                after: bytes = b"") -> Tuple[int, bytes]:
    """The wrapper on a pty of its own (a new session), ``keys`` typed after their delays,
    the first delay counted from when the output first holds ``after``."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        # as a sandbox's processes have them, whatever this runner inherited (a background
        # job starts with SIGINT and SIGQUIT ignored, and bash cannot trap those)
        for sig in (signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        os.execve("/bin/sh", ["/bin/sh", "-c", TERMINAL_WRAPPER, "capybara-exec", ctl, command],
                  {**(env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "USER": "root",
                              "HOME": "/root"}), LEFTOVERS_VAR: TERMINAL_LEFTOVERS})
    out = b""
    pending: List[Tuple[float, bytes]] = list(keys)
    deadline = time.monotonic() + 30
    next_at = time.monotonic() + (pending[0][0] if pending else 0)
    seen = not after
    while time.monotonic() < deadline:
        if not seen and after in out:
            seen = True
            next_at = time.monotonic() + (pending[0][0] if pending else 0)
        if pending and seen and time.monotonic() >= next_at:
            os.write(fd, pending.pop(0)[1])
            next_at = time.monotonic() + (pending[0][0] if pending else 0)
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                data = os.read(fd, 4096)
            except OSError:  # EIO: every holder of the pty's other side is gone
                break
            if not data:
                break
            out += data
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out


@pytest.fixture
def ctl() -> Iterator[str]:
    path = scripts.control_path()
    yield path
    for suffix in (".pid", ".kill"):
        try:
            os.unlink(path + suffix)
        except FileNotFoundError:
            pass


def test_the_wrapper_keeps_a_pid_file_while_the_command_runs(ctl: str) -> None:
    code, out = run_wrapper(ctl, 'echo "pid=$(cat "$CTL.pid") parent=$PPID"; exit 7'.replace(
        "$CTL", ctl))
    assert code == 7
    text = out.decode()
    pid = text.split("pid=")[1].split()[0]
    assert f"parent={pid}" in text  # the pid file names the wrapper, the command's parent
    deadline = time.monotonic() + 5
    while os.path.exists(ctl + ".pid") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(ctl + ".pid")  # removed after the end


def test_the_wrapper_refuses_to_start_once_killed(ctl: str) -> None:
    open(ctl + ".kill", "w").close()
    code, out = run_wrapper(ctl, "echo should-not-run")
    assert code == 137 and b"should-not-run" not in out


def test_the_wrapper_runs_the_users_login_shell(ctl: str) -> None:
    if shutil.which("bash") is None:
        pytest.skip(reason="no bash on this machine")  # pragma: no cover
    code, out = run_wrapper(ctl, "", [(0.5, b"shopt -q login_shell && echo LOGIN-OK; exit 4\n")])
    assert code == 4 and b"LOGIN-OK" in out


def test_ctrl_c_reaches_the_program_and_the_wrapper_goes_on(ctl: str) -> None:
    # the key is typed once the trap is set, and the program waits in a builtin: a Ctrl-C
    # that came while bash forked a ``sleep`` could be taken by the child before its exec
    # (bash then runs no trap), which is bash's race, not the wrapper's
    script = "trap 'echo got-INT' INT; echo ready; read -r -t 2 _; echo after"
    code, out = run_wrapper(ctl, script, [(0.3, b"\x03")], after=b"ready")
    assert code == 0, out
    assert b"got-INT" in out and b"after" in out
