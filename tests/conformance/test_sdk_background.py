"""Background commands through the OFFICIAL ``e2b`` SDK (sync), answered as envd 0.6.13 does.

``commands.run(background=True)`` and what a client does with the handle afterwards: ``List``
(the config echoed as the SDK sent it), ``wait`` with the whole output, ``Connect`` from a
second client (output from then on, and the exit), stdin (``SendInput``/``CloseStdin``),
``SendSignal`` (SIGKILL), ``Update`` (PTY resize), the ``Connect-Timeout-Ms`` kill of a shell
that already exited, and a command that keeps running through a memory pause and resume.
What the SDK never sends (a missing selector, other signals) goes as raw Connect JSON over
the SDK's own envd connection. The expected answers come from envd's
``internal/services/process`` sources (``list.go``, ``connect.go``, ``input.go``,
``signal.go``, ``update.go``, ``service.go``, ``handler/handler.go``).
"""

from __future__ import annotations

import uuid
from typing import Any, Dict, Iterator, List, Mapping, Tuple

import pytest
from e2b import (
    CommandExitException,
    CommandHandle,
    NotFoundException,
    ProcessInfo,
    PtySize,
    Sandbox,
    SandboxException,
)
from waiting import wait_until

from e2b_provider.emulator import Emulator

from .conftest import sdk_sandbox

pytestmark = [pytest.mark.conformance, pytest.mark.integration]

UNKNOWN_PID = 999_999
#: handler.go WriteStdin/ResizeTty errors, as input.go/update.go wrap them (CodeInternal)
STDIN_CLOSED = "error writing to stdin: stdin not enabled or closed"
NO_TTY = "error resizing tty: tty not assigned to process"


@pytest.fixture(scope="module")
def sandbox(sdk: Emulator) -> Iterator[Sandbox]:
    with sdk_sandbox(timeout=600) as sb:
        yield sb


def workdir(sb: Sandbox) -> str:
    d = f"/home/user/bg-{uuid.uuid4().hex[:10]}"
    sb.files.make_dir(d)
    return d


def gate(path: str) -> str:
    """Shell that blocks until ``path`` exists (the test opens the gate by writing it)."""
    return f"while [ ! -e {path} ]; do sleep 0.05; done"


def pids(sb: Sandbox) -> List[int]:
    return [p.pid for p in sb.commands.list()]


def gone(sb: Sandbox, pid: int) -> None:
    """Wait until ``pid`` left envd's process map (done after its end event went out)."""
    wait_until(lambda: pid not in pids(sb), 15, f"pid {pid} to leave commands.list()")


def read_until(handle: CommandHandle, stdout: str, stderr: str = "") -> None:
    """Consume the handle's events until exactly this output arrived (bounded by the
    handle's own stream timeout)."""
    got: Dict[str, str] = {"out": "", "err": ""}
    for out, err, _ in handle:
        got["out"] += out or ""
        got["err"] += err or ""
        if (got["out"], got["err"]) == (stdout, stderr):
            return
    raise AssertionError(f"the stream ended after {got!r}")


# -- 1. run in the background, list, wait ------------------------------------------------


def test_background_run_is_listed_and_wait_returns_the_whole_output(sandbox: Sandbox) -> None:
    sb, d = sandbox, workdir(sandbox)
    cmd = f"{gate(d + '/go')}; seq 1 20000; seq 1 500 >&2; echo bye"
    plain = sb.commands.run(cmd, background=True)
    placed_cmd = f"{gate(d + '/go')}; pwd; echo $K"
    placed = sb.commands.run(placed_cmd, background=True, envs={"K": "v"}, cwd=d)
    # envd's List echoes each StartRequest's ProcessConfig as sent: the SDK's bash wrapper,
    # no tag, and envs/cwd only when given
    listed = {p.pid: p for p in sb.commands.list()}
    assert listed[plain.pid] == ProcessInfo(
        pid=plain.pid, tag=None, cmd="/bin/bash", args=["-l", "-c", cmd], envs={}, cwd=None
    )
    assert listed[placed.pid] == ProcessInfo(
        pid=placed.pid,
        tag=None,
        cmd="/bin/bash",
        args=["-l", "-c", placed_cmd],
        envs={"K": "v"},
        cwd=d,
    )
    sb.files.write(f"{d}/go", "")
    # nothing read the stream until now: the output waited for it (backpressure), none lost
    result = plain.wait()
    assert (result.exit_code, result.error) == (0, None)
    assert result.stdout == "".join(f"{i}\n" for i in range(1, 20001)) + "bye\n"
    assert result.stderr == "".join(f"{i}\n" for i in range(1, 501))
    assert placed.wait().stdout == f"{d}\nv\n"
    gone(sb, plain.pid)
    gone(sb, placed.pid)


# -- 2. connect from a second client ------------------------------------------------------


def test_connect_from_a_second_client_gets_later_output_and_the_exit(sandbox: Sandbox) -> None:
    sb, d = sandbox, workdir(sandbox)
    cmd = f"echo before; echo early >&2; {gate(d + '/go')}; echo after; echo late >&2; exit 3"
    first = sb.commands.run(cmd, background=True)
    read_until(first, "before\n", "early\n")  # envd fanned it out before the second client came
    other = Sandbox.connect(sb.sandbox_id)
    attached = other.commands.connect(first.pid)
    assert attached.pid == first.pid
    sb.files.write(f"{d}/go", "")
    with pytest.raises(CommandExitException) as late:
        attached.wait()
    assert (late.value.exit_code, late.value.error) == (3, "exit status 3")
    assert (late.value.stdout, late.value.stderr) == ("after\n", "late\n")
    with pytest.raises(CommandExitException) as whole:
        first.wait()
    assert (whole.value.exit_code, whole.value.stdout, whole.value.stderr) == (
        3,
        "before\nafter\n",
        "early\nlate\n",
    )
    # within envd's 30 s retention a late Connect still gets the exit (start + end only)
    gone(sb, first.pid)
    with pytest.raises(CommandExitException) as retained:
        other.commands.connect(first.pid).wait()
    assert (retained.value.exit_code, retained.value.stdout) == (3, "")
    with pytest.raises(NotFoundException, match=f"process with pid {UNKNOWN_PID} not found"):
        other.commands.connect(UNKNOWN_PID)


# -- 3. stdin -------------------------------------------------------------------------------


def test_stdin_send_and_close(sandbox: Sandbox) -> None:
    sb, d = sandbox, workdir(sandbox)
    cat = sb.commands.run("cat", background=True, stdin=True)
    sb.commands.send_stdin(cat.pid, "héllo\n")
    sb.commands.send_stdin(cat.pid, b"\x00\x01 raw bytes\n")
    cat.close_stdin()  # CloseStdin: EOF, so cat ends
    assert cat.wait().stdout == "héllo\n\x00\x01 raw bytes\n"
    gone(sb, cat.pid)
    with pytest.raises(NotFoundException, match=f"process with pid {cat.pid} not found"):
        sb.commands.send_stdin(cat.pid, "too late")
    # a process that outlives its stdin: closing again is a no-op, writing is an error
    # (handler.go: CloseStdin returns nil for a nil stdin; WriteStdin "stdin not enabled or
    # closed", answered as CodeInternal "error writing to stdin: …")
    keeper = sb.commands.run(f"cat; echo eof; {gate(d + '/go')}", background=True, stdin=True)
    keeper.send_stdin("x\n")
    sb.commands.close_stdin(keeper.pid)
    sb.commands.close_stdin(keeper.pid)
    with pytest.raises(SandboxException, match=STDIN_CLOSED) as closed:
        keeper.send_stdin("late")
    assert not isinstance(closed.value, NotFoundException)
    # the SDK starts commands with stdin=False by default: envd gives them /dev/null
    no_stdin = sb.commands.run(gate(d + "/go"), background=True)
    with pytest.raises(SandboxException, match=STDIN_CLOSED):
        sb.commands.send_stdin(no_stdin.pid, "x")
    sb.files.write(f"{d}/go", "")
    assert keeper.wait().stdout == "x\neof\n"
    assert no_stdin.wait().exit_code == 0


# -- 4. kill --------------------------------------------------------------------------------


def test_kill_ends_the_command_and_unknown_pids_give_false(sandbox: Sandbox) -> None:
    sb = sandbox
    # bash forks sleep, which keeps stdout open: envd's SIGKILL also stops waiting for output
    handle = sb.commands.run("echo up; sleep 300", background=True)
    read_until(handle, "up\n")
    assert sb.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as killed:
        handle.wait()
    assert (killed.value.exit_code, killed.value.error) == (-1, "signal: killed")
    assert killed.value.stdout == "up\n"
    gone(sb, handle.pid)
    assert sb.commands.kill(handle.pid) is False
    assert sb.commands.kill(UNKNOWN_PID) is False
    other = sb.commands.run("sleep 300", background=True)
    assert other.kill() is True
    with pytest.raises(CommandExitException) as again:
        other.wait()
    assert (again.value.exit_code, again.value.error) == (-1, "signal: killed")


def test_raw_signal_and_selector_errors(sandbox: Sandbox) -> None:
    """What the SDK never sends, as Connect JSON over the SDK's own envd connection."""
    api = sandbox._envd_api

    def call(method: str, body: Mapping[str, Any]) -> Tuple[int, Any]:
        r = api.post(
            f"/process.Process/{method}", json=body, headers={"Connect-Protocol-Version": "1"}
        )
        return r.status_code, r.json()

    def unimplemented(message: str) -> Tuple[int, Any]:
        return 501, {"code": "unimplemented", "message": message}

    # signal.go: getProcess comes before the signal switch, which prints the decoded enum
    # (connect-go's protojson ignores an unknown name: SIGNAL_UNSPECIFIED)
    assert call("SendSignal", {"process": {"pid": UNKNOWN_PID}, "signal": "SIGNAL_SIGHUP"}) == (
        404,
        {"code": "not_found", "message": f"process with pid {UNKNOWN_PID} not found"},
    )
    sleeper = sandbox.commands.run("sleep 300", background=True)
    try:
        for signal in (None, "SIGNAL_SIGHUP", "SIGNAL_UNSPECIFIED", 0):
            body = {"process": {"pid": sleeper.pid}, "signal": signal}
            assert call("SendSignal", body) == unimplemented("invalid signal: SIGNAL_UNSPECIFIED")
        body = {"process": {"pid": sleeper.pid}, "signal": 1}
        assert call("SendSignal", body) == unimplemented("invalid signal: 1")
        assert sleeper.pid in pids(sandbox)
    finally:
        assert sandbox.commands.kill(sleeper.pid) is True
    # service.go getProcess without pid or tag: "invalid input type %T" of the selector
    for method in ("SendSignal", "SendInput", "CloseStdin", "Update"):
        bare: Mapping[str, Any]
        for bare in ({}, {"process": {}}):
            assert call(method, bare) == unimplemented(
                "invalid input type *process.ProcessSelector"
            )


# -- 5. update (PTY resize) ---------------------------------------------------------------


def test_pty_resize_and_resize_of_a_command_without_pty(sandbox: Sandbox) -> None:
    sb = sandbox
    pty = sb.pty.create(PtySize(rows=24, cols=80))
    sb.pty.resize(pty.pid, PtySize(rows=30, cols=100))
    # update.go converts the uint32 sizes with uint16(…): the low 16 bits are applied
    sb.pty.resize(pty.pid, PtySize(rows=65536 + 40, cols=65536 + 120))
    sb.pty.send_stdin(pty.pid, b"stty size; exit\n")
    out: List[bytes] = []
    assert pty.wait(on_pty=out.append).exit_code == 0
    assert "40 120" in b"".join(out).decode()
    plain = sb.commands.run("sleep 300", background=True)
    try:
        with pytest.raises(SandboxException, match=NO_TTY) as no_tty:
            sb.pty.resize(plain.pid, PtySize(rows=10, cols=10))
        assert not isinstance(no_tty.value, NotFoundException)
    finally:
        assert sb.commands.kill(plain.pid) is True
    with pytest.raises(NotFoundException, match=f"process with pid {UNKNOWN_PID} not found"):
        sb.pty.resize(UNKNOWN_PID, PtySize(rows=10, cols=10))


# -- Connect-Timeout-Ms on a shell that already exited --------------------------------------


def test_timeout_of_an_exited_shell_whose_child_holds_the_output(sandbox: Sandbox) -> None:
    sb = sandbox
    # bash exits at once, but its background child keeps stdout open, so envd still waits
    # for the output; the request's deadline then kills the (exited) process and Go's
    # exec.Cmd.Wait reports ctx.Err() for that clean exit
    handle = sb.commands.run("sleep 60 & echo started", background=True, timeout=4)
    try:
        state = f"awk '{{print $3}}' /proc/{handle.pid}/stat"
        wait_until(lambda: sb.commands.run(state).stdout.strip() == "Z", 10, "bash to exit")
        attached = Sandbox.connect(sb.sandbox_id).commands.connect(handle.pid, timeout=60)
        result = attached.wait()
        assert (result.exit_code, result.error) == (0, "context deadline exceeded")
    finally:
        handle.disconnect()


# -- 6. memory pause and resume -------------------------------------------------------------


def test_background_command_keeps_running_through_pause_and_resume(fresh: Sandbox) -> None:
    d = workdir(fresh)
    loop = (
        f"sh -c 'i=0; while true; do echo $i; echo $i > {d}/n.tmp; mv {d}/n.tmp {d}/n; "
        "i=$((i+1)); sleep 0.1; done'"
    )
    handle = fresh.commands.run(loop, background=True, timeout=0)

    def counter(sb: Sandbox) -> int:
        return int(sb.files.read(f"{d}/n")) if sb.files.exists(f"{d}/n") else -1

    wait_until(lambda: counter(fresh) >= 3, 15, "the loop to count")
    before = counter(fresh)
    assert fresh.pause() is True  # the handle's stream is cut; the process is frozen
    back = Sandbox.connect(fresh.sandbox_id)
    resumed = counter(back)
    assert resumed >= before  # the same memory: not restarted
    assert [p.args for p in back.commands.list() if p.pid == handle.pid] == [["-l", "-c", loop]]
    wait_until(lambda: counter(back) >= resumed + 5, 15, "the counter to go on after the resume")
    # its output still streams, to a client that connects after the resume
    attached = back.commands.connect(handle.pid, timeout=30)
    text = ""
    for out, _, _ in attached:
        text += out or ""
        if text.count("\n") >= 3:
            break
    attached.disconnect()
    numbers = [int(n) for n in text.split()]
    assert numbers[0] > resumed and numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    assert back.commands.kill(handle.pid) is True
    gone(back, handle.pid)
