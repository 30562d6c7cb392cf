"""The command lines of the library's and the emulator's processes in a sandbox stay short.

``ps aux`` shows every process's arguments to every user: a program sent as a ``-c``
argument (the file agent's text alone is 60 KB) made each process a wall of source. The
programs travel in their process's environment instead, and leave it before anything they
start could inherit them.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from waiting import wait_until

from e2b_provider import E2BSandboxProvider, SandboxHandle
from e2b_provider.commands.terminal_wrapper import LEFTOVERS_VAR
from e2b_provider.protocol.boot import PROGRAM_VAR

from .conftest import NO_PYTHON, own_sandbox, root, until, warm_file_agent

#: The longest command line (``ps -o args``) a process of the library or emulator may have.
LIMIT = 1000


def _processes(p: E2BSandboxProvider, h: SandboxHandle) -> List[Tuple[int, str, str]]:
    rows = []
    for line in root(p, h, "ps -eo pid=,user=,args= -ww").splitlines():
        pid, user, args = ([*line.strip().split(None, 2), "", ""])[:3]
        rows.append((int(pid), user, args))
    return rows


def _environ(p: E2BSandboxProvider, h: SandboxHandle, pid: int) -> Dict[str, str]:
    r = p.exec(h, f"cat /proc/{pid}/environ", timeout=30.0)  # as their user, the sandbox's
    assert r.exit_code == 0, r
    text = r.stdout
    names = {}
    for item in text.split("\0"):
        if "=" in item:
            k, v = item.split("=", 1)
            names[k] = v
    return names


def test_command_lines_are_short_with_agent_supervisor_and_terminal(
    provider: E2BSandboxProvider,
) -> None:
    with own_sandbox(provider, "argv") as h:
        warm_file_agent(provider, h)
        cmd = provider.start(h, "sleep 300")
        with provider.terminal(h) as t:
            t.write(b"echo ready-$((6*7))\n")
            until(t, "ready-42")
            wait_until(lambda: any(a == "/bin/bash -l" for _, _, a in _processes(provider, h)),
                       30, "the terminal's shell")
            rows = _processes(provider, h)
            long_lines = [(pid, user, len(a), a[:120]) for pid, user, a in rows
                          if len(a.encode()) > LIMIT]
            assert long_lines == [], long_lines
            # the processes this is about are there: PID 1, envd, the file agent, the
            # background command's supervisor and the terminal's wrapper
            joined = "\n".join(a for _, _, a in rows)
            assert "pid1/init.py" in joined and "e2b_provider.emulator.agent" in joined
            assert " serve " in joined and "capybara-files-" in joined, joined
            assert " capybara-bg " in joined, joined
            assert any(" capybara-exec /tmp/.capybara-exec-" in a and "timeout -s KILL" not in a
                       for _, _, a in rows), joined  # the terminal's wrapper
            # what the user's programs run with carries no program text
            for pid, _, args in rows:
                if args in ("sleep 300", "/bin/bash -l"):
                    env = _environ(provider, h, pid)
                    assert "CAPYBARA_EXEC" in env, (args, sorted(env))
                    assert PROGRAM_VAR not in env and LEFTOVERS_VAR not in env, (args,
                                                                                sorted(env))
            t.write(b"exit 3\n")
        cmd.kill()


def test_the_shell_supervisor_has_a_short_command_line_too(emulator) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emulator.config(template=NO_PYTHON)) as p, \
            own_sandbox(p, "argv-nopy") as h:
        cmd = p.start(h, "sleep 300")
        rows = wait_until(lambda: [r for r in _processes(p, h) if r[2] == "sleep 300"]
                          and _processes(p, h), 30, "the command")
        long_lines = [(pid, user, len(a), a[:120]) for pid, user, a in rows
                      if len(a.encode()) > LIMIT]
        assert long_lines == [], long_lines
        assert any(" capybara-bg " in a for _, _, a in rows), rows  # the shell supervisor
        for pid, _, args in rows:
            if args == "sleep 300":
                env = _environ(p, h, pid)
                assert "CAPYBARA_EXEC" in env and PROGRAM_VAR not in env, sorted(env)
        cmd.kill()
