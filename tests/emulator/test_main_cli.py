"""The emulator's command lines, ``python -m e2b_provider.emulator`` and ``e2b-provider
emulator``: the same options, the export lines alone on stdout (so ``> e2b.env`` works), the
ready line on stderr, a clean stop on SIGINT/SIGTERM. Real processes and sandboxes."""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO, Iterator

import pytest
import requests
from command_line import STALL_IMPORT, default_sigint
from waiting import wait_until

from e2b_provider.emulator import Emulator

from .test_server import alive, proc_start_time

pytestmark = pytest.mark.integration

COMMANDS = {
    "python -m e2b_provider.emulator": ([sys.executable, "-m", "e2b_provider.emulator"],
                                        "e2b-emulator"),
    "e2b-provider emulator": ([sys.executable, "-m", "e2b_provider", "emulator"],
                              "e2b-provider emulator"),
}
KEY = "e2b_" + "5c" * 20

#: In a shell that sourced the export lines: a sandbox through this library, its id printed.
_FROM_SHELL = """
from e2b_provider import DeploymentConfig, E2BSandboxProvider
p = E2BSandboxProvider(DeploymentConfig.from_env())
h = p.create("from-env-file")
assert p.exec(h, "echo hi").stdout == "hi\\n"
print(h.id)
"""


@pytest.fixture
def short_tmp() -> Iterator[str]:
    """A short temporary directory (sandbox socket paths must stay under 108 bytes)."""
    path = tempfile.mkdtemp(prefix="e2bt-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _line(stream: IO[bytes], timeout: float) -> str:
    """The next line of a pipe, waiting ``timeout`` s at most (the rest is left unread)."""
    got = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while not got.endswith(b"\n"):
            left = deadline - time.monotonic()
            assert left > 0, f"no whole line within {timeout:g} s: {got!r}"
            if sel.select(min(left, 0.5)):
                piece = os.read(stream.fileno(), 1)
                assert piece, f"end of output before a whole line: {got!r}"
                got += piece
    return got.decode()


def _ready_line(stream: IO[bytes], timeout: float = 60) -> str:
    """The ready line on stderr (after any log lines before it)."""
    deadline = time.monotonic() + timeout
    while True:
        line = _line(stream, max(0.1, deadline - time.monotonic()))
        if " ready at " in line:
            return line


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_export_lines_alone_on_stdout_ready_line_on_stderr(
    emulator: Emulator, short_tmp: str, command: str, stop: str
) -> None:
    # (the session's emulator is asked for only to skip where sandboxes cannot run)
    argv, name = COMMANDS[command]
    env_file = os.path.join(short_tmp, "e2b.env")
    state = os.path.join(short_tmp, "state")
    options = ["--api-key", KEY, "--state-dir", state, "--cpu-count", "1", "--memory-mb",
               "256", "--disk-mb", "512", "--max-processes", "64", "--host", "127.0.0.1",
               "--port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    with open(env_file, "wb") as out:
        proc = subprocess.Popen([*argv, *options], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stderr is not None
        ready = _ready_line(proc.stderr)
        m = re.fullmatch(rf"{name}: ready at (http://127\.0\.0\.1:\d+) \(template base\); "
                         r"Ctrl-C stops it\n", ready)
        assert m is not None, ready
        url = m.group(1)
        with open(env_file) as fh:  # written before the ready line: whole by now
            assert fh.read() == (
                f"export E2B_API_KEY={KEY}\n"
                f"export E2B_API_URL={url}\n"
                f"export E2B_SANDBOX_URL={url}\n"
                f"export E2B_VOLUME_API_URL={url}\n"
                "export E2B_TEMPLATE=base\n"
            )
        # the file works as written: a shell sources it and this library finds the emulator
        done = subprocess.run(
            ["sh", "-c", '. "$1" && exec "$2" -c "$3"', "sh", env_file, sys.executable,
             _FROM_SHELL],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        sid = done.stdout.strip()
        headers = {"X-API-KEY": KEY}
        info = requests.get(f"{url}/sandboxes/{sid}", headers=headers, timeout=30).json()
        # the options reached the template every sandbox runs
        assert (info["cpuCount"], info["memoryMB"], info["diskSizeMB"]) == (1, 256, 512)
        got = requests.get(f"{url}/_emulator/sandboxes/{sid}/pids", headers=headers, timeout=30)
        pids = {p: proc_start_time(p) for p in got.json()["pids"]}
        assert pids and os.listdir(state)  # its files are in the state dir given
        proc.send_signal(getattr(signal, stop))
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read().decode()
        assert "Traceback" not in err, err
        wait_until(lambda: not alive(pids), 30, "the sandbox's processes to end")
        with open(env_file) as fh:
            assert fh.read().count("\n") == 5  # nothing else was written on stdout
        assert os.path.isdir(state)  # a state dir given is kept
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_isolation_unavailable_is_an_error_of_the_command_line(short_tmp: str) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip(reason="needs util-linux setpriv")
    drop = ["setpriv", "--bounding-set=-sys_admin", "--"]
    for argv, name in COMMANDS.values():
        done = subprocess.run([*drop, *argv, "--port", "0"], capture_output=True, timeout=60)
        # 2 from python -m (the Emulator handle relies on it), 1 from e2b-provider (whose 2
        # means a usage error)
        assert done.returncode == (2 if name == "e2b-emulator" else 1)
        assert done.stdout == b""
        assert done.stderr.startswith(f"{name}: ".encode()) and b"CAP_SYS_ADMIN" in done.stderr
        assert done.stderr.count(b"\n") == 1, done.stderr


def test_ctrl_c_before_it_serves_is_one_line(short_tmp: str) -> None:
    # SIGINT while it starts (here: while it imports its server's dependencies)
    with open(os.path.join(short_tmp, "sitecustomize.py"), "w") as fh:
        fh.write(STALL_IMPORT)
    env = dict(os.environ, PYTHONPATH=short_tmp, CLI_TEST_STALL_IMPORT="aiohttp")
    proc = subprocess.Popen(
        [sys.executable, "-m", "e2b_provider.emulator", "--port", "0"], env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=default_sigint,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        assert _line(proc.stderr, 60) == "stalled importing aiohttp\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out, err) == (130, b"", b"e2b-emulator: interrupted\n")


def _as_a_background_job() -> None:
    # what a job started with ``&`` by a shell without job control gets (SIGINT and SIGQUIT
    # ignored), what ``nohup`` adds (SIGHUP), and a blocked signal for good measure
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])


#: In a sandbox: the signals an exec's command and a terminal's program see (not the same
#: path: an exec runs under ``timeout``, which sets some itself), a SIGQUIT, a Ctrl-C.
_SIGNALS_IN_A_SANDBOX = r"""
from e2b_provider import DeploymentConfig, E2BSandboxProvider
p = E2BSandboxProvider(DeploymentConfig.from_env())
h = p.create("signals")
r = p.exec(h, "grep -E '^Sig(Blk|Ign):' /proc/self/status; sh -c 'kill -QUIT $$'; echo quit=$?")
print(r.stdout, end="")
with p.terminal(h, "grep -E '^Sig(Blk|Ign):' /proc/self/status; echo ready; sleep 60") as t:
    got = b""
    while b"ready" not in got:
        piece = t.read(timeout=30)
        assert piece, "the terminal ended before it was ready"
        got += piece
    print(got.decode().replace("\r\n", "\n"), end="")
    t.write(b"\x03")
    print(f"ctrl-c={t.wait(timeout=30)}")
"""


def test_sandboxes_get_default_signals_whatever_the_emulator_inherited(
    emulator: Emulator, short_tmp: str
) -> None:
    # envd runs under a service manager: its commands start with no signal blocked or
    # ignored. An emulator started from a background job must not pass on what it inherited
    # (or Ctrl-C and Ctrl-\ in a terminal, and ``kill -QUIT``, would do nothing).
    state = os.path.join(short_tmp, "state")
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "e2b_provider.emulator", "--api-key", KEY, "--state-dir", state,
         "--host", "127.0.0.1", "--port", "0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        preexec_fn=_as_a_background_job,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        url = re.search(r"ready at (\S+) ", _ready_line(proc.stderr)).group(1)  # type: ignore[union-attr]
        run_env = dict(env, E2B_API_KEY=KEY, E2B_API_URL=url, E2B_SANDBOX_URL=url,
                       E2B_TEMPLATE="base")
        done = subprocess.run([sys.executable, "-c", _SIGNALS_IN_A_SANDBOX], env=run_env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "SigBlk:\t0000000000000000",
            "SigIgn:\t0000000000000000",
            "quit=131",
            "SigBlk:\t0000000000000000",  # a terminal's program
            "SigIgn:\t0000000000000000",
            "ready",
            "ctrl-c=130",
        ]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_boot_setting_is_refused_in_one_line(command: str) -> None:
    argv, name = COMMANDS[command]
    env = {**os.environ, "E2B_EMULATOR_BOOT_TIMEOUT": "soon"}
    done = subprocess.run([*argv, "--port", "0"], capture_output=True, timeout=60, env=env)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr == (f"{name}: $E2B_EMULATOR_BOOT_TIMEOUT: not a number of seconds: "
                           "'soon'\n").encode()
    done = subprocess.run([*argv, "--boot-timeout", "0"], capture_output=True, timeout=60)
    assert done.returncode == 2 and b"--boot-timeout: must be a positive number" in done.stderr
