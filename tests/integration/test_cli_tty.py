"""``e2b-provider exec -it`` and ``shell`` used as a person uses them: in a terminal.

Each test runs the command line in a pane of its own ``tmux`` server (``./dev`` installs
tmux), types with ``send-keys`` and reads the screen with ``capture-pane``. The pane runs
``stty -g`` before and after the command line and writes its exit status to a file, so a
test sees the status and whether the terminal was given back as it was.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest
from command_line import CLI, cli_env
from waiting import wait_until

from e2b_provider import E2BSandboxProvider, SandboxHandle

from .conftest import root

pytestmark = pytest.mark.integration


class Pane:
    """One tmux server (its own socket) with one 120 x 40 pane running a command line."""

    def __init__(self, tmp: Path, env: Dict[str, str]) -> None:
        tmux = shutil.which("tmux")
        if tmux is None:
            pytest.fail("tmux is missing: ./dev installs it (apt-get install tmux)")
        self.tmux = tmux
        self.dir = tmp
        self.sock = str(tmp / "tmux.sock")
        self.env = env

    def _run(self, *args: str) -> str:
        r = subprocess.run([self.tmux, "-S", self.sock, *args], env=self.env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (args, r.stderr)
        return r.stdout

    def start(self, words: List[str]) -> None:
        """Run the command line with ``words`` in the pane, between two ``stty -g``."""
        d = shlex.quote(str(self.dir))
        line = (f"stty -g > {d}/before; {shlex.join(CLI + words)} 2> {d}/stderr; "
                f"echo $? > {d}/rc.tmp; stty -g > {d}/after; mv {d}/rc.tmp {d}/rc")
        self._run("new-session", "-d", "-x", "120", "-y", "40", "-s", "t", "sh", "-c", line)

    def keys(self, *keys: str) -> None:
        """Type keys: tmux key names (``Enter``, ``C-c``); ``"text:..."`` types text."""
        for key in keys:
            if key.startswith("text:"):
                self._run("send-keys", "-t", "t", "-l", key[len("text:"):])
            else:
                self._run("send-keys", "-t", "t", key)

    def screen(self) -> str:
        """The pane's lines (its history too), wrapped lines joined, without trailing
        blanks."""
        try:
            text = self._run("capture-pane", "-p", "-J", "-t", "t", "-S", "-200")
        except AssertionError:
            return ""  # the pane is gone (the command line ended)
        return "\n".join(line.rstrip() for line in text.splitlines())

    def wait_for(self, pattern: str, timeout: float = 60.0) -> str:
        def seen() -> Optional[str]:
            text = self.screen()
            return text if re.search(pattern, text) else None

        try:
            return wait_until(seen, timeout, f"{pattern!r} on the screen", interval=0.1)
        except AssertionError:
            raise AssertionError(f"no {pattern!r} on the screen:\n{self.screen()}") from None

    def cli_pid(self) -> int:
        """The command line's process id (the pane's shell's child)."""
        shell = self._run("display-message", "-p", "-t", "t", "#{pane_pid}").strip()
        children = subprocess.run(["pgrep", "-P", shell], capture_output=True,
                                  text=True).stdout.split()
        assert len(children) == 1, children
        return int(children[0])

    def resize(self, cols: int, rows: int) -> None:
        self._run("resize-window", "-t", "t", "-x", str(cols), "-y", str(rows))

    def status(self, timeout: float = 60.0) -> int:
        """The command line's exit status, once it exited; checks the terminal was restored."""
        rc = self.dir / "rc"
        wait_until(rc.exists, timeout, "the command line to exit", interval=0.1)
        before = (self.dir / "before").read_text().strip()
        after = (self.dir / "after").read_text().strip()
        assert before and after == before, "the terminal was not restored"
        return int(rc.read_text())

    @property
    def stderr(self) -> str:
        path = self.dir / "stderr"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        subprocess.run([self.tmux, "-S", self.sock, "kill-server"], env=self.env,
                       capture_output=True, timeout=30)


@pytest.fixture
def env(emu) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    return cli_env(emu, drop=("E2B_", "TMUX"), TERM="xterm-256color")


@pytest.fixture
def pane(tmp_path: Path, env: Dict[str, str]) -> Iterator[Pane]:
    p = Pane(tmp_path, env)
    try:
        yield p
    finally:
        p.close()


def test_a_shell_with_a_resize_ctrl_c_ctrl_d_and_its_exit_code(
    pane: Pane, sandbox: SandboxHandle
) -> None:
    pane.start(["shell", sandbox.id])
    pane.wait_for(r"(?m)^sandbox@\S+:~\$$")
    pane.keys("text:stty size; echo \"[$TERM]\"", "Enter")
    pane.wait_for(r"(?m)^40 120$")
    pane.wait_for(r"\[xterm-256color\]")
    pane.resize(100, 30)
    pane.keys("text:stty size", "Enter")
    pane.wait_for(r"(?m)^30 100$")
    # Ctrl-C goes to the remote program (raw mode): the sleep stops, the shell goes on
    pane.keys("text:sleep 300", "Enter")
    time.sleep(0.5)
    t0 = time.monotonic()
    pane.keys("C-c")
    pane.keys("text:echo status=$?", "Enter")
    pane.wait_for(r"status=130")
    assert time.monotonic() - t0 < 30
    pane.keys("text:(exit 9)", "Enter")
    # as a person does, Ctrl-D once the prompt is back (typed while the command runs, it
    # meets the terminal in bash's cooked mode, not readline at its prompt)
    pane.wait_for(r"(?m)\(exit 9\)\nsandbox@\S+:~\$$")
    pane.keys("C-d")  # end of input at the prompt: bash exits with the last status
    assert pane.status() == 9


def test_keys_typed_after_a_resize_meet_the_new_size(
    pane: Pane, sandbox: SandboxHandle
) -> None:
    """A resize and keys typed after it, arriving together (the command line stopped while
    both came, as on a loaded machine): the keys reach a terminal of the new size."""
    pane.start(["shell", sandbox.id])
    pane.wait_for(r"(?m)^sandbox@\S+:~\$$")
    pid = pane.cli_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        pane.resize(90, 25)
        pane.keys("text:stty size", "Enter")
    finally:
        os.kill(pid, signal.SIGCONT)
    pane.wait_for(r"(?m)^25 90$")
    pane.keys("text:exit 0", "Enter")
    assert pane.status() == 0


def test_a_repl_and_its_exit_code(pane: Pane, sandbox: SandboxHandle) -> None:
    pane.start(["exec", "-it", sandbox.id, "--", "python3", "-q"])
    pane.wait_for(r"(?m)^>>>$")
    pane.keys("text:6 * 7", "Enter")
    pane.wait_for(r"(?m)^42$")
    pane.keys("text:import time; time.sleep(300)", "Enter")
    time.sleep(0.5)
    pane.keys("C-c")
    pane.wait_for(r"KeyboardInterrupt")
    pane.keys("text:raise SystemExit(4)", "Enter")
    assert pane.status() == 4


def test_exec_it_runs_every_word_after_the_sandbox_with_docker_short_options(
    pane: Pane, sandbox: SandboxHandle
) -> None:
    # as docker exec -it: no --, the options before SANDBOX, -u root -w DIR -e K=V
    pane.start(["exec", "-it", "-u", "root", "-w", "/tmp", "-e", "GREETING=hi", sandbox.id,
                "python3", "-q"])
    pane.wait_for(r"(?m)^>>>$")
    pane.keys("text:import os; print(os.getuid(), os.getcwd(), os.environ['GREETING'])",
              "Enter")
    pane.wait_for(r"(?m)^0 /tmp hi$")
    pane.keys("text:raise SystemExit(5)", "Enter")
    assert pane.status() == 5, pane.stderr


def test_ctrl_backslash_quits_the_remote_program(pane: Pane, sandbox: SandboxHandle) -> None:
    pane.start(["exec", "-it", sandbox.id, "--", "sh", "-c", "echo ready; sleep 300"])
    pane.wait_for("ready")
    time.sleep(0.3)
    pane.keys("C-\\")
    assert pane.status() == 131  # 128 + SIGQUIT, as the remote shell reports it


def test_the_remote_killed_with_sigkill(
    pane: Pane, sandbox: SandboxHandle, shared_provider: E2BSandboxProvider
) -> None:
    pane.start(["exec", "-it", sandbox.id, "--", "sh", "-c", "echo ready-to-die; sleep 301"])
    pane.wait_for("ready-to-die")
    root(shared_provider, sandbox, "pkill -9 -f '[c]apybara-exec .*sleep 301'")
    assert pane.status() == 137


def test_a_lost_connection(pane: Pane, sandbox: SandboxHandle, emu) -> None:  # type: ignore[no-untyped-def]
    emu.stream_cut(after_bytes=600, sandbox_id=sandbox.id)
    pane.start(["exec", "-it", sandbox.id, "--", "sh", "-c",
                "echo one-line-of-output; sleep 1; yes | head -c 20000; sleep 300"])
    assert pane.status() == 1
    assert "broke" in pane.stderr, pane.stderr


def test_a_signal_to_the_command_line_restores_the_terminal(
    pane: Pane, sandbox: SandboxHandle, shared_provider: E2BSandboxProvider
) -> None:
    pane.start(["exec", "-it", sandbox.id, "--", "sh", "-c", "echo up; sleep 302"])
    pane.wait_for("up")
    os.kill(pane.cli_pid(), 15)
    assert pane.status() == 143
    assert "stopped by signal 15" in pane.stderr
    wait_until(lambda: root(shared_provider, sandbox, "pgrep -fc '^sleep 302' || true").strip()
               == "0", 30, "the remote terminal to be killed")


def test_tty_needs_a_terminal_and_i_alone_feeds_a_pipe(
    env: Dict[str, str], sandbox: SandboxHandle
) -> None:
    r = subprocess.run([*CLI, "exec", "-t", sandbox.id, "--", "true"], env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith(
        "e2b-provider: error: the input device is not a terminal")
    r = subprocess.run([*CLI, "shell", sandbox.id], env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a terminal" in r.stderr
    r = subprocess.run([*CLI, "exec", "-i", sandbox.id, "--", "tr", "a-z", "A-Z"], env=env,
                       input="piped in\n", capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (0, "PIPED IN\n"), r.stderr


def test_i_alone_on_a_terminal_feeds_its_lines(pane: Pane, sandbox: SandboxHandle) -> None:
    pane.start(["exec", "-i", sandbox.id, "--", "sed", "-u", "s/^/got: /"])
    time.sleep(1.0)
    pane.keys("text:hello", "Enter")
    pane.wait_for(r"(?m)^got: hello$")
    pane.keys("C-d")  # our terminal's end of input: the command's input closes
    assert pane.status() == 0
