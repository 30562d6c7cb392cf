"""The official SDK's PTY calls against the emulator, as envd 0.6.13 answers them, and the
SDK and this library's terminals on one sandbox (both are envd's own PTY processes).

``sb.pty.create`` (``/bin/bash -i -l``, the SDK's ``TERM``/``LANG``/``LC_ALL``, ``user``,
``cwd``, ``envs``, ``timeout``), ``send_stdin`` (Ctrl-C, Ctrl-D), ``stream_input``,
``resize``, ``connect`` from a second handle, ``kill`` (True, then False for a pid that is
gone), and the pty slave's owner (root: creack/pty does not chown it).
"""

from __future__ import annotations

import re
import time
from typing import Iterator, List

import pytest
from e2b import CommandExitException, PtySize, Sandbox, TimeoutException
from waiting import wait_until

from e2b_provider import CommandNotFound, E2BSandboxProvider, OperationTimeout, Terminal
from e2b_provider.emulator import Emulator

from .conftest import sdk_sandbox

pytestmark = [pytest.mark.conformance, pytest.mark.integration]


@pytest.fixture(scope="module")
def sb(sdk: Emulator) -> Iterator[Sandbox]:
    with sdk_sandbox(timeout=600) as box:
        yield box


def collect(out: List[bytes]) -> str:
    return b"".join(out).decode("utf-8", "replace")


def test_create_runs_an_interactive_login_bash_with_the_sdks_environment(sb: Sandbox) -> None:
    handle = sb.pty.create(PtySize(rows=24, cols=80), cwd="/tmp", envs={"X_FROM": "sdk"})
    sb.pty.send_stdin(handle.pid, b'echo "[$TERM $LANG $LC_ALL $X_FROM $(id -un) $(pwd)]"; '
                                  b'shopt -q login_shell && echo login; '
                                  b'echo "owner=$(stat -c %U "$(tty)")"; exit 3\n')
    out: List[bytes] = []
    with pytest.raises(CommandExitException) as ended:
        handle.wait(on_pty=out.append)
    assert ended.value.exit_code == 3
    text = collect(out)
    assert "[xterm-256color C.UTF-8 C.UTF-8 sdk user /tmp]" in text, text
    assert "login\r\n" in text and "owner=root\r\n" in text, text


def test_ctrl_c_and_ctrl_d_through_send_stdin_and_stream_input(sb: Sandbox) -> None:
    out: List[bytes] = []
    handle = sb.pty.create(PtySize(rows=24, cols=80), user="root")
    events = iter(handle)

    def read_until(pattern: str) -> None:
        while re.search(pattern, collect(out), re.S) is None:
            _, _, pty = next(events)
            if pty:
                out.append(pty)

    read_until(r"# $")
    sb.pty.send_stdin(handle.pid, b"sleep 300\n")
    time.sleep(0.5)
    sb.pty.send_stdin(handle.pid, b"\x03")
    read_until(r"\^C\r\n.*# $")
    sb.pty.send_stdin(handle.pid, b"echo status=$?\n")
    read_until(r"status=130\r\n.*# $")
    sb.pty.stream_input(handle.pid, [b"echo str", b"eamed-in; id -un\n"])
    read_until(r"streamed-in\r\nroot\r\n.*# $")
    sb.pty.send_stdin(handle.pid, b"\x04")  # Ctrl-D at the prompt: bash exits
    handle.wait(on_pty=out.append)


def test_connect_from_a_second_handle_and_kill(sb: Sandbox) -> None:
    first = sb.pty.create(PtySize(rows=24, cols=80), timeout=0)
    second = sb.pty.connect(first.pid, timeout=0)
    seen: List[bytes] = []
    sb.pty.resize(first.pid, PtySize(rows=33, cols=99))
    sb.pty.send_stdin(first.pid, b"stty size; echo from-$((40+2))\n")

    def reads() -> bool:
        for _, _, pty in second:
            if pty:
                seen.append(pty)
            if "from-42" in collect(seen):
                return True
        return False

    assert reads() and re.search(r"(?<![0-9])33 99\r\n", collect(seen)), collect(seen)
    assert sb.pty.kill(first.pid) is True
    with pytest.raises(CommandExitException) as killed:
        first.wait()
    assert killed.value.exit_code == -1 and killed.value.error == "signal: killed"
    wait_until(lambda: sb.pty.kill(first.pid) is False, 40, "envd to forget the pty")


def test_a_pty_timeout_is_envds_deadline(sb: Sandbox) -> None:
    t0 = time.monotonic()
    handle = sb.pty.create(PtySize(rows=24, cols=80), timeout=1)
    with pytest.raises(TimeoutException):
        handle.wait()
    assert time.monotonic() - t0 < 30


def test_the_sdk_types_into_this_librarys_terminal_and_the_library_into_the_sdks(
    sb: Sandbox, emulator: Emulator
) -> None:
    with E2BSandboxProvider(emulator.config()) as p, p.terminal(sb.sandbox_id) as term:
        sb.pty.send_stdin(term.pid, b"echo typed-by-$((6*7))\n")
        sb.pty.resize(term.pid, PtySize(rows=20, cols=70))
        seen = b""
        deadline = time.monotonic() + 30
        while b"typed-by-42" not in seen:
            assert time.monotonic() < deadline, seen
            try:
                seen += term.read(timeout=1)
            except OperationTimeout:
                pass
        term.write("stty size\n")
        while not re.search(rb"(?<![0-9])20 70\r\n", seen):
            assert time.monotonic() < deadline, seen
            try:
                seen += term.read(timeout=1)
            except OperationTimeout:
                pass
        # an SDK pty is not one of this library's terminals (no control path of its own)
        handle = sb.pty.create(PtySize(rows=24, cols=80), timeout=0)
        try:
            with pytest.raises(CommandNotFound):
                p.attach(sb.sandbox_id, f"{sb.sandbox_id}:pty-{handle.pid}-{'0' * 32}")
        finally:
            assert sb.pty.kill(handle.pid) is True
        again = p.attach(sb.sandbox_id, term.id)
        assert isinstance(again, Terminal)
        again.detach()
