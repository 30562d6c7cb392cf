"""Interactive terminals against the emulator: a shell and a REPL driven by write/read,
resize, Ctrl-C typed in, exit codes, kills of the whole tree, cancel, timeout and
KeyboardInterrupt (bounded, the tree killed), attach from another process, the thread bound,
and errors typed and worded."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Iterator

import pytest
from waiting import wait_until

from e2b_provider import (
    CancelToken,
    E2BSandboxProvider,
    SandboxHandle,
    Terminal,
)
from e2b_provider.errors import (
    Cancelled,
    CommandEnded,
    CommandNotFound,
    InvalidArgument,
    OperationTimeout,
)

from .conftest import child_config, count_processes, root, run_readme_example, until

pytestmark = pytest.mark.integration


def marked(p: E2BSandboxProvider, h: SandboxHandle, t: Terminal) -> str:
    """The processes of the sandbox that carry ``t``'s exec marker (pids, one a line)."""
    return root(p, h, f"grep -lsz 'CAPYBARA_EXEC={t._ctl}$' /proc/[0-9]*/environ || true")


def gone(p: E2BSandboxProvider, h: SandboxHandle, t: Terminal, pattern: str) -> bool:
    """Nothing matches ``pattern`` and no process carries ``t``'s marker."""
    return count_processes(p, h, pattern) == 0 and not marked(p, h, t).strip()


@pytest.fixture
def term(shared_provider: E2BSandboxProvider, sandbox: SandboxHandle) -> Iterator[Terminal]:
    with shared_provider.terminal(sandbox) as t:
        until(t, r"\$ $")
        yield t


def test_a_login_shell_as_the_sandbox_user(term: Terminal) -> None:
    term.write("echo \"[$TERM $HOME $USER $LANG $0 $(pwd) $(id -un)]\"\n")
    out = until(term, r"\[xterm-256color .*\]\r\n")
    assert "[xterm-256color /workspace sandbox C.UTF-8 /bin/bash /workspace sandbox]" in out
    term.write("shopt -q login_shell && echo LOGIN-$((6*7))\n")
    until(term, r"LOGIN-42")
    assert term.id.startswith(f"{term.sandbox_id}:pty-{term.pid}-")
    assert not term.ended and term.exit_code is None


def test_a_repl_driven_by_write_and_read_and_its_exit_code(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    with shared_provider.terminal(sandbox, "python3 -q -i") as t:
        until(t, ">>> ")
        t.write("x = 6 * 7\n")
        t.write(b"print('answer', x)\r")
        until(t, r"answer 42\r\n>>> ")
        t.write("import sys; sys.exit(5)\n")
        assert t.wait(timeout=30) == 5
        assert t.ended and t.exit_code == 5
        assert t.read(timeout=0) == b""  # the end: every later read too
        with pytest.raises(CommandEnded, match="has ended and takes no more input"):
            t.write("more\n")
        with pytest.raises(CommandEnded):
            t.resize(90, 20)
        t.kill()  # an ended terminal: nothing to do
        # the wrapper removed its pid file
        assert root(shared_provider, sandbox, f"ls {t._ctl}.pid 2>/dev/null || echo none"
                    ).strip() == "none"


def test_resize_is_seen_by_stty_and_sigwinch(term: Terminal) -> None:
    term.write("stty size\n")
    until(term, r"(?<![0-9])24 80\r\n")
    term.write("trap 'echo WINCH' WINCH; sleep 5 & wait\n")
    time.sleep(0.3)
    term.resize(132, 43)
    until(term, "WINCH")
    term.write("stty size\n")
    until(term, r"(?<![0-9])43 132\r\n")


def test_ctrl_c_typed_in_interrupts_the_remote_program(term: Terminal) -> None:
    term.write("sleep 300\n")
    time.sleep(0.5)
    t0 = time.monotonic()
    term.write("\x03")
    until(term, r"\$ $", timeout=10)
    assert time.monotonic() - t0 < 10
    term.write("echo status=$?\n")
    until(term, "status=130")
    # the shell itself is not interrupted: it still answers
    term.write("echo alive\n")
    until(term, r"alive\r\n")


def test_ctrl_d_ends_the_shell_with_its_status(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    with shared_provider.terminal(sandbox) as t:
        until(t, r"\$ $")
        t.write("false\n")
        until(t, r"\$ $")
        t.write("\x04")
        assert t.wait(timeout=30) == 1  # bash exits with the last command's status


def test_kill_stops_the_whole_tree(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    tag = uuid.uuid4().int % 10**6
    with p.terminal(sandbox) as t:
        until(t, r"\$ $")
        # a job, a process that left the session, and one in the foreground
        t.write(f"sleep 1001.{tag} & setsid sleep 1002.{tag} & sleep 1003.{tag}\n")
        wait_until(lambda: count_processes(p, sandbox, rf"^sleep 100[123]\.{tag}") == 3, 30,
                   "the three sleeps")
        t0 = time.monotonic()
        t.kill()
        assert time.monotonic() - t0 < 25
        assert t.wait(timeout=30) == 137
        assert gone(p, sandbox, t, rf"^sleep 100[123]\.{tag}")


def test_closing_kills_the_tree_and_detach_leaves_it(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    with p.terminal(sandbox, "sleep 2001") as t:
        wait_until(lambda: count_processes(p, sandbox, "^sleep 2001") == 1,
                   30, "the sleep")
    assert gone(p, sandbox, t, "^sleep 2001")
    with pytest.raises(InvalidArgument, match="was closed"):
        t.read(timeout=0)
    kept = p.terminal(sandbox, "sleep 2002")
    wait_until(lambda: count_processes(p, sandbox, "^sleep 2002") == 1,
               30, "the sleep")
    kept.detach()
    assert count_processes(p, sandbox, "^sleep 2002") == 1
    again = p.attach(sandbox, kept.id)
    assert isinstance(again, Terminal) and again.pid == kept.pid
    again.close()  # an attached handle lets go
    assert count_processes(p, sandbox, "^sleep 2002") == 1
    p.kill_all(sandbox)  # kill_all reaches terminals too
    assert gone(p, sandbox, kept, "^sleep 2002")


def test_cancel_kills_the_tree_and_wakes_a_blocked_read(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    token = CancelToken()
    with p.terminal(sandbox, "sleep 3001 & sleep 3002", cancel=token) as t:
        wait_until(lambda: count_processes(p, sandbox, "^sleep 300[12]") == 2,
                   30, "the sleeps")
        timer = threading.Timer(0.3, token.cancel, ("enough",))
        timer.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(Cancelled, match="enough"):
                t.read()
        finally:
            timer.join()
        assert time.monotonic() - t0 < 5
        with pytest.raises(Cancelled):
            t.write("x")
        wait_until(lambda: gone(p, sandbox, t, "^sleep 300[12]"), 30, "the tree to be killed")


def test_a_terminal_timeout_kills_it(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    t0 = time.monotonic()
    with p.terminal(sandbox, "sleep 4001 & sleep 4002", timeout=1.5) as t:
        assert t.wait(timeout=60) == 137
        assert t.timed_out
    assert 1.4 < time.monotonic() - t0 < 30
    wait_until(lambda: gone(p, sandbox, t, "^sleep 400[12]"), 30, "the tree to be killed")


def test_a_detached_terminal_is_still_killed_at_its_timeout_by_envd(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    """Nobody watches: envd's Connect-Timeout-Ms kills the terminal's leader, and the
    terminal's hang-up ends its programs."""
    p = shared_provider
    t = p.terminal(sandbox, "sleep 4003 & sleep 4004", timeout=1.5)
    wait_until(lambda: count_processes(p, sandbox, "^sleep 400[34]") == 2, 30, "the sleeps")
    t.detach()
    wait_until(lambda: gone(p, sandbox, t, "^sleep 400[34]"), 30, "envd to kill it")


def test_read_and_wait_timeouts_leave_the_terminal_running(term: Terminal) -> None:
    t0 = time.monotonic()
    with pytest.raises(OperationTimeout, match="within the read's timeout; it still runs"):
        term.read(timeout=0.3)
    assert 0.25 < time.monotonic() - t0 < 5
    with pytest.raises(OperationTimeout):
        term.read(timeout=0)
    with pytest.raises(OperationTimeout, match="did not end within the wait's timeout"):
        term.wait(timeout=0.3)
    stop = CancelToken()
    threading.Timer(0.2, stop.cancel).start()
    with pytest.raises(Cancelled):
        term.read(cancel=stop)  # a read's own token stops the read only
    term.write("echo still-here\n")
    until(term, "still-here")


def test_keyboard_interrupt_in_a_read_kills_the_tree_then_propagates(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with p.terminal(sandbox, "sleep 5001 & sleep 5002") as t:
            wait_until(lambda: count_processes(p, sandbox, "^sleep 500[12]") == 2, 30, "the sleeps")
            timer = threading.Timer(0.3, signal.raise_signal, (signal.SIGINT,))
            timer.start()
            t0 = time.monotonic()
            try:
                with pytest.raises(KeyboardInterrupt):
                    t.read()
            finally:
                timer.join()
            assert time.monotonic() - t0 < 12  # interrupt_kill_bound (10 s) and a little
            assert gone(p, sandbox, t, "^sleep 500[12]")
    finally:
        signal.signal(signal.SIGINT, previous)


def test_wait_gives_the_output_live_to_a_callback(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    pieces = []
    with shared_provider.terminal(sandbox, "for i in 1 2 3; do echo tick $i; sleep 0.1; done; "
                                           "printf 'caf\\303'; printf '\\251\\n'") as t:
        assert t.wait(timeout=30, on_output=pieces.append) == 0
    text = "".join(pieces)
    assert "tick 1\r\ntick 2\r\ntick 3\r\n" in text and "café\r\n" in text
    assert all(isinstance(piece, str) for piece in pieces)


CHILD = textwrap.dedent(
    """
    import json, sys, time
    from e2b_provider import DeploymentConfig, E2BSandboxProvider, OperationTimeout
    cfg = DeploymentConfig(**json.loads(sys.argv[1]))
    with E2BSandboxProvider(cfg) as p:
        t = p.attach(sys.argv[2], sys.argv[3])
        t.write("print('from', 'the', 'child')\\n")
        seen = b""
        end = time.monotonic() + 30
        while b"from the child" not in seen and time.monotonic() < end:
            try:
                seen += t.read(timeout=1)
            except OperationTimeout:
                pass
        t.resize(77, 11)
        print("child read:", seen.decode(errors="replace").replace("\\r", ""), flush=True)
        t.detach()
    """
)


def test_attach_from_another_process_writes_reads_and_resizes(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, emulator  # type: ignore[no-untyped-def]
) -> None:
    with shared_provider.terminal(sandbox, "python3 -q -i") as t:
        until(t, ">>> ")
        child = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(child_config(emulator)), sandbox.id, t.id],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert child.returncode == 0, child.stderr
        assert "from the child" in child.stdout
        until(t, r"from the child\r\n")  # the starting handle sees it too
        t.write("import os; print(os.get_terminal_size())\n")
        until(t, r"columns=77, lines=11")
        t.write("exit(3)\n")
        assert t.wait(timeout=30) == 3


def test_an_attached_terminal_can_kill_and_wait(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    with p.terminal(sandbox, "sleep 6001") as owner:
        viewer = p.attach(sandbox, owner.id)
        assert isinstance(viewer, Terminal)
        with viewer:
            viewer.kill()
            assert viewer.wait(timeout=30) == 137
        assert owner.wait(timeout=30) == 137
        # within envd's 30 s, an ended terminal is still found, with its status
        late = p.attach(sandbox, owner.id)
        assert isinstance(late, Terminal)
        with late:
            assert late.ended and late.wait(timeout=30) == 137


def test_a_hundred_open_terminals_add_at_most_three_threads(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    terms = [p.terminal(sandbox, "cat")]  # warm: the watchdog and its pool already run
    before = threading.active_count()
    try:
        for _ in range(99):
            terms.append(p.terminal(sandbox, "cat"))
        for i, t in enumerate(terms):
            t.write(f"line {i}\n")
        for i, t in enumerate(terms):
            until(t, rf"line {i}\r\nline {i}\r\n")
        assert threading.active_count() - before <= 3
    finally:
        for t in terms:
            t.detach()
        p.kill_all(sandbox)
    assert threading.active_count() - before <= 3


def test_errors_are_typed_and_worded(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p = shared_provider
    for kwargs, match in (
        ({"cols": 0}, "cols must be an int from 1 to 65535"),
        ({"rows": 70000}, "rows must be an int from 1 to 65535"),
        ({"timeout": -1}, "timeout"),
        ({"env": {"1BAD": "x"}}, "environment variable name"),
    ):
        with pytest.raises(InvalidArgument, match=match):
            p.terminal(sandbox, **kwargs)
    with pytest.raises(InvalidArgument, match="command is empty"):
        p.terminal(sandbox, "  ")
    with pytest.raises(InvalidArgument, match="does not exist"):
        p.terminal(sandbox, cwd="/no/such/dir")
    with pytest.raises(InvalidArgument, match="not a command id"):
        p.attach(sandbox, "nonsense")
    with pytest.raises(InvalidArgument, match="belongs to sandbox"):
        p.attach(sandbox, f"iother0000000000000000:pty-12-{uuid.uuid4().hex}")
    with pytest.raises(CommandNotFound, match=r"no terminal .* it ended"):
        p.attach(sandbox, f"{sandbox.id}:pty-999999-{uuid.uuid4().hex}")
    with p.terminal(sandbox, "cat") as t:
        # the pid of a running terminal with another control path is not that terminal
        with pytest.raises(CommandNotFound):
            p.attach(sandbox, f"{sandbox.id}:pty-{t.pid}-{uuid.uuid4().hex}")
        with pytest.raises(InvalidArgument, match="bytes or str"):
            t.write(42)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="cols"):
            t.resize(0, 10)
        with pytest.raises(InvalidArgument, match="timeout"):
            t.read(timeout=-1)
        def other() -> None:
            with pytest.raises(OperationTimeout):
                t.read(timeout=2)

        reader = threading.Thread(target=other)
        reader.start()
        try:
            wait_until(lambda: t._reader.locked(), 5, "the other reader")
            with pytest.raises(RuntimeError, match="already being read"):
                t.read(timeout=0)
        finally:
            reader.join()


def test_the_readme_terminal_example_runs_as_written() -> None:
    out = run_readme_example("### Terminals")
    lines = out.stdout.splitlines()
    assert lines[:2] == ["3", "True"], out.stdout
    assert re.fullmatch(r"\w+:pty-\d+-[0-9a-f]{32}", lines[2]), out.stdout

