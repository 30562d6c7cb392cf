"""The command line's background commands (``start``, ``logs``, ``kill``, ``ps``) and
``exec`` reading our standard input, against the emulator: real subprocesses, no mocks."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from datetime import datetime
from typing import Dict, Iterator, List, Optional

import pytest
from command_line import CLI, cli_env, default_sigint, run, started
from waiting import wait_until

from e2b_provider import E2BSandboxProvider, SandboxHandle

from .conftest import unique_name

pytestmark = pytest.mark.integration


@pytest.fixture
def env(emu) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    return cli_env(emu, COLUMNS="80")


@pytest.fixture
def sb(provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    """A sandbox with a name (the CLI is given ``sb.name``)."""
    h = provider.create(unique_name("clibg"))
    yield h
    provider.destroy(h)


def start(env: Dict[str, str], sb: SandboxHandle, *args: str) -> str:
    r = run(env, "start", str(sb.name), *args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{sb.id}:"), r.stdout
    return lines[0]


def ps_rows(env: Dict[str, str], sb: SandboxHandle, *args: str) -> List[List[str]]:
    r = run(env, "ps", *args, str(sb.name))
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["ID", "PID", "TAG", "STARTED", "COMMAND"]
    return [row.split(maxsplit=5) for row in rows]


def listed(env: Dict[str, str], sb: SandboxHandle, cid: str) -> bool:
    return any(row[0] == cid for row in ps_rows(env, sb))


def one_error_line(r: subprocess.CompletedProcess, code: int) -> str:  # type: ignore[type-arg]
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("e2b-provider: error: "), r.stderr
    return lines[0]


# -- exec and our standard input ---------------------------------------------------------------


def test_piped_stdin_reaches_the_command(env: Dict[str, str], sb: SandboxHandle) -> None:
    r = run(env, "exec", str(sb.name), "--", "cat", stdin="hi\n")
    assert (r.returncode, r.stdout, r.stderr) == (0, "hi\n", "")
    r = run(env, "exec", str(sb.name), "--", "tr a-z A-Z; echo end", stdin="two\nlines\n")
    assert (r.returncode, r.stdout) == (0, "TWO\nLINES\nend\n"), r.stderr
    # no input: the command reads end of file at once
    r = run(env, "exec", str(sb.name), "--", "cat; echo eof")
    assert (r.returncode, r.stdout) == (0, "eof\n"), r.stderr


def test_a_mebibyte_of_stdin_arrives_byte_exact(env: Dict[str, str], sb: SandboxHandle) -> None:
    data = os.urandom(1 << 20)
    r = run(env, "exec", str(sb.name), "--", "sha256sum", stdin=data)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split()[0] == hashlib.sha256(data).hexdigest()


def test_a_terminal_stdin_is_not_forwarded(env: Dict[str, str], sb: SandboxHandle) -> None:
    import pty

    leader, follower = pty.openpty()
    try:
        # on a terminal, cat reads /dev/null: it ends at once (no wait for our input)
        r = subprocess.run(
            [*CLI, "exec", str(sb.name), "--", "cat; echo eof"],
            env=env, stdin=follower, capture_output=True, text=True, timeout=120,
            preexec_fn=default_sigint,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert (r.returncode, r.stdout) == (0, "eof\n"), r.stderr


def test_exec_ends_when_the_command_does_not_read_all_its_input(
    env: Dict[str, str], sb: SandboxHandle
) -> None:
    # our stdin stays open (nothing written, never closed): exec still ends with the command,
    # cleanly (no abort at interpreter shutdown while the input is being read)
    r_fd, w_fd = os.pipe()
    try:
        r = subprocess.run(
            [*CLI, "exec", str(sb.name), "--", "head -c 0; echo done"],
            env=env, stdin=r_fd, capture_output=True, text=True, timeout=120,
            preexec_fn=default_sigint,
        )
    finally:
        os.close(r_fd)
        os.close(w_fd)
    assert (r.returncode, r.stdout, r.stderr) == (0, "done\n", "")


# -- start, ps, logs, kill --------------------------------------------------------------------


def test_start_ps_logs_and_kill(env: Dict[str, str], sb: SandboxHandle) -> None:
    before = time.time()
    cid = start(env, sb, "--tag", "web", "--env", "WHO=there", "--",
                "echo out $WHO; echo err >&2; exec sleep 600")
    row = next(row for row in ps_rows(env, sb) if row[0] == cid)
    assert row[1].isdigit() and row[2] == "web"
    when = datetime.strptime(f"{row[3]} {row[4]}", "%Y-%m-%d %H:%M:%S").timestamp()
    assert before - 60 < when < time.time() + 60
    assert row[5].startswith("echo out $WHO;")

    def logged() -> Optional[subprocess.CompletedProcess]:  # type: ignore[type-arg]
        r = run(env, "logs", str(sb.name), cid)
        assert r.returncode == 0, r.stderr
        return r if r.stdout and r.stderr else None

    r = wait_until(logged, 60, "the command's output in logs", interval=0.1)
    assert (r.stdout, r.stderr) == ("out there\n", "err\n")
    # the 32 hex digits after the ':' name it too, in the sandbox given
    r = run(env, "logs", sb.id, cid.rpartition(":")[2])
    assert (r.returncode, r.stdout, r.stderr) == (0, "out there\n", "err\n")

    r = run(env, "kill", str(sb.name), cid)
    assert (r.returncode, r.stdout) == (0, f"{cid}\n"), r.stderr
    wait_until(lambda: not listed(env, sb, cid), 60, "ps no longer listing the command",
               interval=0.1)
    r = run(env, "kill", str(sb.name), cid)  # it has ended: nothing to do
    assert r.returncode == 0, r.stderr
    r = run(env, "logs", "-f", str(sb.name), cid)  # killed: no exit status of its own
    assert (r.returncode, r.stdout) == (1, "out there\n")
    assert r.stderr.splitlines() == ["err", "e2b-provider: the command was killed"]


def test_start_takes_an_argument_vector_or_one_command_line(
    env: Dict[str, str], sb: SandboxHandle
) -> None:
    def ended(cid: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
        return run(env, "logs", "-f", str(sb.name), cid)  # once it ended, with its status

    # several words after --: each reaches the command unchanged
    cid = start(env, sb, "--", "printf", "%s|", "a b", "c'd", "$HOME")
    r = ended(cid)
    assert (r.returncode, r.stdout, r.stderr) == (0, "a b|c'd|$HOME|", "")
    r = run(env, "logs", str(sb.name), cid)
    assert (r.returncode, r.stdout) == (0, "a b|c'd|$HOME|"), r.stderr
    r = ended(start(env, sb, "--", "sh", "-c", "echo hi; exit 3"))
    assert (r.returncode, r.stdout) == (3, "hi\n"), r.stderr
    # one word: a shell command line
    r = ended(start(env, sb, "--", "echo $((1+2))"))
    assert (r.returncode, r.stdout) == (0, "3\n"), r.stderr


def test_ps_cuts_long_command_lines_unless_no_trunc(
    env: Dict[str, str], sb: SandboxHandle
) -> None:
    long = "exec sleep 600 # " + "x" * 200
    cid = start(env, sb, "--", long)
    r = run(env, "ps", str(sb.name))
    assert r.returncode == 0, r.stderr
    (line,) = [line for line in r.stdout.splitlines() if line.startswith(cid)]
    # the whole id is kept (start prints it; logs and kill take it): the command line is cut
    assert line.endswith("...") and "exec sleep 600" in line and len(line) < 120
    (row,) = [row for row in ps_rows(env, sb, "--no-trunc") if row[0] == cid]
    assert row[2] == "-" and row[5] == long
    assert run(env, "kill", str(sb.name), cid).returncode == 0


def test_logs_follow_to_the_end_and_exit_with_its_status(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    cid = start(env, sb, "--", "echo one; while [ ! -e /tmp/go ]; do sleep 0.05; done; "
                "echo two >&2; echo three; exit 3")
    with started(env, "logs", "-f", str(sb.name), cid) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "one\n"  # shown while the command still runs
        provider.write_file(sb, "/tmp/go", b"")
        out, err = child.communicate(timeout=60)
    assert (child.returncode, out, err) == (3, "three\n", "two\n")
    # once it ended, -f shows all of it and exits at once with the same status
    r = run(env, "logs", "-f", str(sb.name), cid)
    assert (r.returncode, r.stdout, r.stderr) == (3, "one\nthree\n", "two\n")
    assert not listed(env, sb, cid)


def test_logs_follow_of_a_command_that_timed_out_exits_124(
    env: Dict[str, str], sb: SandboxHandle
) -> None:
    cid = start(env, sb, "--timeout", "1", "--", "echo begun; sleep 60")
    r = run(env, "logs", "--follow", str(sb.name), cid)
    assert (r.returncode, r.stdout) == (124, "begun\n"), r.stderr
    assert r.stderr.splitlines()[-1] == "e2b-provider: the command timed out (it was killed)"


def test_ctrl_c_stops_following_not_the_command(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    cid = start(env, sb, "--", "echo started; exec sleep 600")
    with started(env, "logs", "-f", str(sb.name), cid) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "started\n"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
    assert "Traceback" not in err and err.splitlines() == [
        f"e2b-provider: interrupted (command {cid} goes on)"
    ]
    assert listed(env, sb, cid) and provider.attach(sb, cid).running
    assert run(env, "kill", str(sb.name), cid).returncode == 0


# -- errors -----------------------------------------------------------------------------------


def test_bad_ids_are_one_line_errors(env: Dict[str, str], sb: SandboxHandle) -> None:
    name = str(sb.name)
    hexes = "0123456789abcdef" * 2
    for cmd in ("logs", "kill"):
        # not a command id at all: a usage error
        line = one_error_line(run(env, cmd, name, "nope"), 2)
        assert "is not a command id" in line
        # well formed, but no such command in the sandbox: CommandNotFound
        line = one_error_line(run(env, cmd, name, f"{sb.id}:{hexes}"), 1)
        assert "no background command" in line
        line = one_error_line(run(env, cmd, name, hexes), 1)
        assert f"{sb.id}:{hexes}" in line
        # a command of another sandbox
        line = one_error_line(run(env, cmd, name, f"iother0sandbox0000000:{hexes}"), 2)
        assert "belongs to sandbox iother0sandbox0000000" in line
    # no such sandbox: a runtime error, as an API error is
    line = one_error_line(run(env, "logs", "-f", "no-such-sandbox", hexes), 1)
    assert "no sandbox is named 'no-such-sandbox'" in line
    one_error_line(run(env, "ps", "no-such-sandbox"), 1)


def test_start_usage_errors(env: Dict[str, str], sb: SandboxHandle) -> None:
    name = str(sb.name)
    for args in (["start", name, "--"], ["start", name]):
        line = one_error_line(run(env, *args), 2)
        assert "start needs a command after SANDBOX" in line
    line = one_error_line(run(env, "start", name, "--max-output-bytes", "10", "--", "true"), 2)
    assert "1024" in line
    line = one_error_line(run(env, "start", name, "--env", "NOEQUALS", "--", "true"), 2)
    assert "KEY=VALUE" in line
    for args in (["start", name, "--timeout", "0", "--", "true"], ["logs", name],
                 ["kill", name], ["ps", name, "--", "x"], ["logs", name, "--", "x"]):
        r = run(env, *args)
        assert r.returncode == 2 and "usage:" in r.stderr and "Traceback" not in r.stderr, args
    assert ps_rows(env, sb) == []  # nothing was started


def test_new_commands_have_help() -> None:
    for name in ("start", "logs", "kill", "ps", "exec"):
        r = subprocess.run([*CLI, name, "--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and f"usage: e2b-provider {name}" in r.stdout
    r = subprocess.run([*CLI, "exec", "--help"], capture_output=True, text=True, timeout=60)
    assert "not a terminal" in " ".join(r.stdout.split())
