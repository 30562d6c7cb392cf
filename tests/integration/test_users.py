"""Commands as root (``user="root"``) against the emulator: they really run as root, their
kills reach them, and the sandbox user cannot turn a root command's control files into a
write as root."""

from __future__ import annotations

import shlex
import threading
import time

import pytest

from e2b_provider import CancelToken, E2BSandboxProvider, InvalidArgument, SandboxHandle
from e2b_provider.commands.terminal_wrapper import ROOT_TERMINAL_WRAPPER
from e2b_provider.commands.users import ROOT_EXEC_WRAPPER, ROOT_KILL_BATCH_SCRIPT
from e2b_provider.protocol.scripts import control_path

pytestmark = pytest.mark.integration


def test_exec_runs_as_the_user_asked(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    assert p.exec(sandbox, "id -u").stdout == "1000\n"
    assert p.exec(sandbox, "id -u", user="sandbox").stdout == "1000\n"
    r = p.exec(sandbox, "id -u; id -un; touch /root/by-root && echo wrote", user="root")
    assert (r.exit_code, r.stdout) == (0, "0\nroot\nwrote\n"), r.stderr
    # the sandbox user may not do what root did
    r = p.exec(sandbox, "touch /root/by-sandbox")
    assert r.exit_code != 0
    # file calls stay the sandbox user's
    p.write_file(sandbox, "/workspace/users-f", b"x")
    assert p.exec(sandbox, "stat -c %U /workspace/users-f").stdout == "sandbox\n"


@pytest.mark.parametrize("bad", ["user", "", "ROOT", "nobody", None, 0, "root "])
def test_other_users_are_refused_before_any_io(
    shared_provider: E2BSandboxProvider, bad: object
) -> None:
    h = SandboxHandle(id="nosuchsandbox000000000", name="x")  # no request is made
    with pytest.raises(InvalidArgument, match="user must be 'sandbox' or 'root'"):
        shared_provider.exec(h, "true", user=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="user must be 'sandbox' or 'root'"):
        shared_provider.terminal(h, user=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="user must be 'sandbox' or 'root'"):
        shared_provider.start(h, "true", user=bad)  # type: ignore[arg-type]


def _root_sleepers(p: E2BSandboxProvider, h: SandboxHandle, marker: str) -> str:
    return p.exec(h, f"pgrep -u 0 -f '[s]leep {marker}' || true", user="root").stdout.strip()


def test_a_root_command_is_killed_on_timeout_and_cancel(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    marker = f"9{time.monotonic_ns() % 10**6}"
    # timeout: the tree (a child in its own session too) is gone
    r = p.exec(sandbox, f"setsid sleep {marker} & sleep {marker}", timeout=1.0, user="root")
    assert r.timed_out and not r.wedged, r
    assert _root_sleepers(p, sandbox, marker) == ""
    # cancel
    cancel = CancelToken()
    threading.Timer(1.0, cancel.cancel).start()
    r = p.exec(sandbox, f"sleep {marker}", timeout=60.0, user="root", cancel=cancel)
    assert r.cancelled and not r.wedged, r
    assert _root_sleepers(p, sandbox, marker) == ""


@pytest.mark.parametrize("sweep", ["kill_all", "kill_tagged"])
def test_kill_all_and_kill_tagged_reach_root_commands(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, sweep: str
) -> None:
    p = shared_provider
    marker = f"8{time.monotonic_ns() % 10**6}"
    outcome = {}

    def run() -> None:
        outcome["r"] = p.exec(sandbox, f"setsid sleep {marker} & sleep {marker}",
                              timeout=120.0, user="root", tag="rooted")

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while len(_root_sleepers(p, sandbox, marker).split()) < 2:
        assert time.monotonic() < deadline, "the root command never started"
        time.sleep(0.1)
    if sweep == "kill_all":
        p.kill_all(sandbox)
    else:
        p.kill_tagged(sandbox, ["rooted"])
    worker.join(30)
    assert not worker.is_alive(), "kill_all did not reach the root command"
    assert outcome["r"].exit_code == 137, outcome  # killed, long before its timeout
    assert _root_sleepers(p, sandbox, marker) == ""  # its whole tree, the escapee too
    assert p.exec(sandbox, "echo still here").stdout == "still here\n"


def test_a_root_terminal_runs_as_root_and_is_killed(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    with p.terminal(sandbox, "id -u; sleep 600", user="root") as term:
        got = b""
        deadline = time.monotonic() + 30
        while b"0\r\n" not in got:
            assert time.monotonic() < deadline, got
            got += term.read(timeout=1.0)
        term.kill()
        assert term.wait(timeout=30) is not None or term.timed_out is False
    left = p.exec(sandbox, "pgrep -u 0 -f '[s]leep 600' || true", user="root").stdout
    assert left.strip() == ""


@pytest.mark.parametrize("what", ["exec wrapper", "terminal wrapper", "kill"])
def test_planted_control_files_do_not_make_root_write_through_them(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, what: str
) -> None:
    """The sandbox user plants links at the names of a root command's control files (its
    ``.pid`` and ``.kill``), pointing at a file of root's and at a name in root's home:
    root's wrappers and root's kill write, truncate and create nothing through them. (The
    control path shows in the process list once envd starts the wrapper: here it is known
    before, so the links are there first every time.)"""
    p = shared_provider
    ctl = control_path()
    p.exec(sandbox, "echo precious > /root/victim; chmod 644 /root/victim; rm -f /root/made",
           user="root")
    r = p.exec(sandbox, f"ln -s /root/victim {ctl}.pid && ln -s /root/made {ctl}.kill")
    assert r.exit_code == 0, r
    if what == "kill":
        script, argv = ROOT_KILL_BATCH_SCRIPT, ["capybara-killbatch", ctl]
    else:
        script = ROOT_EXEC_WRAPPER if what == "exec wrapper" else ROOT_TERMINAL_WRAPPER
        argv = ["capybara-exec", ctl, "true", "5"]
    r = p.exec(sandbox, shlex.join(["/bin/sh", "-c", script, *argv]), user="root")
    assert r.exit_code in (0, 137), r  # a wrapper refuses: its .kill name exists
    r = p.exec(sandbox, "cat /root/victim; ls /root/made 2>&1 || true", user="root")
    assert r.stdout.startswith("precious\n") and "No such file" in r.stdout, r
    p.exec(sandbox, f"rm -rf {ctl}.pid {ctl}.kill {ctl}.*", user="root")
