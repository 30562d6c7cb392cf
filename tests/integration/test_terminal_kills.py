"""How terminals are killed and how they end, against the emulator.

* A kill never reaches another process through a pid the terminal no longer has: a handle
  that did not read its program's end holds a pid that envd forgot and may give to any
  process (the sandbox user cycles the pid counter in minutes; envd signals as root). The
  reuse is made exact here: the sandbox's pid namespace is told (``ns_last_pid``, written
  from this machine inside that namespace) to give a neighbour's new terminal the dead
  terminal's pid; then each way a handle kills (``kill()``, ``close()``, an attached
  handle's ``kill()``, its cancel token, its timeout) must leave the neighbour running.
* A terminal's timeout kills its whole tree, daemons included (a job, ``nohup``,
  ``setsid``, both, a double fork), as its other ends do; so does ``exec -it --timeout``.
* The program's exit ends the terminal: what it left running (a job ignoring the hang-up,
  which holds the pty) is killed, so ``wait()`` returns its status and ``shell`` returns
  after ``exit``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from typing import Iterator, Tuple

import pytest
from waiting import wait_until

from e2b_provider import CancelToken, E2BSandboxProvider, SandboxHandle, Terminal
from e2b_provider.errors import CommandEnded

from .conftest import count_processes, root
from .test_cli_tty import Pane, env, pane  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def neighbour(emulator) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    """Another client of the same sandboxes."""
    with E2BSandboxProvider(emulator.config(template="base")) as p:
        yield p


def _init_on_this_machine(p: E2BSandboxProvider, h: SandboxHandle) -> int:
    """The pid, on this machine, of the sandbox's process 1 (its command line names the
    sandbox's own boot file, so it is the only process with that command line)."""
    want = root(p, h, "cat /proc/1/cmdline").encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read() == want:
                        found.append(int(entry))
            except OSError:
                continue
    assert len(found) == 1, (want, found)
    return found[0]


def _next_pid_is(p: E2BSandboxProvider, h: SandboxHandle, pid: int) -> None:
    """The next process made in the sandbox gets ``pid`` (the sandbox's root may not write
    ``ns_last_pid``: its ``/proc/sys`` is read-only and it lacks CAP_SYS_ADMIN; root of this
    machine writes it from inside the sandbox's pid namespace)."""
    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        pytest.skip(reason="making a pid be reused needs root and nsenter on this machine")
    subprocess.run(
        ["nsenter", "-t", str(_init_on_this_machine(p, h)), "-p", "--", "/bin/sh", "-c",
         f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid"],
        check=True, timeout=30,
    )


def _gone(p: E2BSandboxProvider, h: SandboxHandle, pid: int) -> bool:
    return root(p, h, f"[ -e /proc/{pid} ] && echo here || echo gone").strip() == "gone"


def _bystander_at(p: E2BSandboxProvider, neighbour: E2BSandboxProvider, h: SandboxHandle,
                  pid: int) -> Terminal:
    """Once the sandbox has no process ``pid`` (the dead terminal's, its end unread), a
    neighbour's terminal that gets exactly that pid; it exits 7 once it reads a line."""
    wait_until(lambda: _gone(p, h, pid), 30, f"process {pid} to be gone")
    _next_pid_is(p, h, pid)
    by = neighbour.terminal(h, "read -r _; exit 7")
    assert by.pid == pid, "the bystander did not get the dead terminal's pid"
    return by


def _still_runs(by: Terminal) -> int:
    """The bystander's status once told to exit: 7 if it was still running, 137 if a
    SIGKILL reached it."""
    try:
        by.write("go\n")
    except CommandEnded:
        pass
    with by:
        return by.wait(timeout=60)


@pytest.fixture
def warm(neighbour: E2BSandboxProvider, sandbox: SandboxHandle) -> E2BSandboxProvider:
    """The neighbour, connected to the sandbox already (its terminal then is the first
    process made after ``ns_last_pid`` was set)."""
    neighbour.exec(sandbox, "true")
    return neighbour


def _ended_unread_and_the_pids_new_owner(
    p: E2BSandboxProvider, neighbour: E2BSandboxProvider, h: SandboxHandle, **kw: object
) -> Tuple[Terminal, Terminal]:
    """A terminal of ``p``'s whose program ended, its end unread, and the neighbour's
    terminal that got its pid (:func:`_bystander_at`)."""
    t = p.terminal(h, "exit 0", **kw)  # type: ignore[arg-type]
    assert not t.ended
    return t, _bystander_at(p, neighbour, h, t.pid)


def test_kill_of_a_terminal_whose_end_was_not_read_spares_the_pids_new_owner(
    shared_provider: E2BSandboxProvider, warm: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    t, by = _ended_unread_and_the_pids_new_owner(p, warm, sandbox)
    t.kill()
    assert _still_runs(by) == 7
    assert t.wait(timeout=30) == 0  # its own end, read now
    t.close()


def test_close_of_a_terminal_whose_end_was_not_read_spares_the_pids_new_owner(
    shared_provider: E2BSandboxProvider, warm: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    t, by = _ended_unread_and_the_pids_new_owner(p, warm, sandbox)
    t.close()
    assert _still_runs(by) == 7


def test_an_attached_handles_kill_spares_the_pids_new_owner(
    shared_provider: E2BSandboxProvider, warm: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    owner = p.terminal(sandbox, "read -r _; exit 0")
    viewer = p.attach(sandbox, owner.id)
    assert isinstance(viewer, Terminal)
    owner.detach()
    viewer.write("\n")  # the program ends; neither handle reads its end
    by = _bystander_at(p, warm, sandbox, viewer.pid)
    viewer.kill()
    assert _still_runs(by) == 7
    viewer.close()


def test_a_cancel_of_a_terminal_whose_end_was_not_read_spares_the_pids_new_owner(
    shared_provider: E2BSandboxProvider, warm: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    token = CancelToken()
    t, by = _ended_unread_and_the_pids_new_owner(p, warm, sandbox, cancel=token)
    token.cancel("enough")
    t.close()  # waits for the kill the cancel started
    assert _still_runs(by) == 7


def test_a_timeout_of_a_terminal_whose_end_was_not_read_spares_the_pids_new_owner(
    shared_provider: E2BSandboxProvider, warm: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    t, by = _ended_unread_and_the_pids_new_owner(p, warm, sandbox, timeout=10.0)
    assert not t.timed_out, "the timeout fired before the pid was reused"
    wait_until(lambda: t.timed_out, 60, "the terminal's timeout")
    t.close()  # waits for the kill the timeout started
    assert _still_runs(by) == 7


# -- a timeout kills the whole tree ----------------------------------------------------------

#: Daemons of every kind, each a ``sleep`` with its own first argument: a job of the
#: interactive shell (a process group of its own, not the terminal's foreground one), one
#: under ``nohup``, one that left the session with ``setsid``, one with both, a double fork.
DAEMONS = (
    "sleep 7001.{n} & nohup sleep 7002.{n} >/dev/null 2>&1 & setsid sleep 7003.{n} & "
    "setsid nohup sleep 7004.{n} >/dev/null 2>&1 & (sleep 7005.{n} &) ; echo started-{n}"
)


def test_a_terminal_timeout_kills_every_kind_of_daemon(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    n = uuid.uuid4().int % 10**6
    pattern = rf"^sleep 700[1-5]\.{n}$"
    with p.terminal(sandbox, timeout=12.0) as t:  # the login shell, typed into
        t.write(DAEMONS.format(n=n) + "\n")
        wait_until(lambda: count_processes(p, sandbox, pattern) == 5, 30, "the five daemons")
        assert t.wait(timeout=60) == 137
        assert t.timed_out
    wait_until(lambda: count_processes(p, sandbox, pattern) == 0, 10, "no daemon left")


def test_exec_it_timeout_kills_every_kind_of_daemon(
    pane: Pane, sandbox: SandboxHandle, shared_provider: E2BSandboxProvider  # noqa: F811
) -> None:
    p = shared_provider
    n = uuid.uuid4().int % 10**6
    pattern = rf"^sleep 700[1-5]\.{n}$"
    pane.start(["exec", "-it", "--timeout", "12", sandbox.id, "--", "bash", "-c",
                DAEMONS.format(n=n) + "; sleep 300"])
    pane.wait_for(rf"(?m)^started-{n}$")
    wait_until(lambda: count_processes(p, sandbox, pattern) == 5, 30, "the five daemons")
    assert pane.status() == 124
    wait_until(lambda: count_processes(p, sandbox, pattern) == 0, 10, "no daemon left")


# -- the program's exit ends the terminal ----------------------------------------------------


def test_wait_returns_when_the_program_exits_leaving_a_child_that_holds_the_pty(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    n = uuid.uuid4().int % 10**6
    with p.terminal(sandbox, f"trap '' HUP; sleep 7101.{n} & exit 5") as t:
        assert t.wait(timeout=60) == 5
    assert count_processes(p, sandbox, rf"^sleep 7101\.{n}$") == 0


def test_a_shell_returns_after_exit_with_a_job_left_running(
    pane: Pane, sandbox: SandboxHandle, shared_provider: E2BSandboxProvider  # noqa: F811
) -> None:
    p = shared_provider
    n = uuid.uuid4().int % 10**6
    pane.start(["shell", sandbox.id])
    pane.wait_for(r"(?m)^sandbox@\S+:~\$$")
    pane.keys(f"text:sleep 7201.{n} &", "Enter")
    wait_until(lambda: count_processes(p, sandbox, rf"^sleep 7201\.{n}$") == 1, 30, "the job")
    pane.keys("text:exit 3", "Enter")
    assert pane.status() == 3
    assert count_processes(p, sandbox, rf"^sleep 7201\.{n}$") == 0

