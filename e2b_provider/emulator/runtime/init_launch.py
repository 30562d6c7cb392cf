"""PID 1's process on the host side: the ``unshare`` command that starts it, and its output.

This module owns the command line of a sandbox's PID 1 (``unshare --pid --fork --mount …
--kill-child -- <python> -E -s -S -B <path of pid1/init.py> <boot.json>``, a time namespace
whose uptime starts at 0 where the kernel has one), spawning it with its output on a pipe, and the
pipe's pump into ``init.log`` (rotated to ``init.log.1`` past 1 MiB) and the sandbox's
:class:`~.output.SandboxOutput`; and reading that log's end for error messages. The cgroups
PID 1 joins and its lifetime are :mod:`.boot`'s.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Callable, List, Sequence, Tuple

from .errors import IsolationUnavailable
from .namespaces import HOST_PATH
from .output import SandboxOutput

__all__ = ["init_argv", "log_tail", "start_init"]

# the warnings about a sandbox's output keep the name of the logger of the sandbox's boot
log = logging.getLogger("e2b_provider.emulator.runtime.boot")

_INIT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pid1", "init.py")
_LOG_LIMIT = 1 << 20  # init.log is rotated past this many bytes


def _time_namespace() -> List[str]:
    """unshare options for a time namespace whose uptime starts at 0 (none if unsupported)."""
    if not os.path.exists("/proc/self/ns/time"):
        return []
    # Whole seconds, rounded down: the sandbox's CLOCK_BOOTTIME starts between 0 and 1 s.
    return ["--time", "--boottime", str(-int(time.clock_gettime(time.CLOCK_BOOTTIME)))]


def _pump_log(fd: int, path: str, output: SandboxOutput) -> None:
    """Copy a sandbox's output from the pipe ``fd`` to ``path`` until every writer is gone.

    The file is truncated first and rotated to ``<path>.1`` past :data:`_LOG_LIMIT` bytes, so
    a sandbox that floods its output costs at most twice that on the host. Every line also
    goes to ``output`` (stamped as it arrives; the sandbox's logs).
    """
    try:
        os.unlink(path + ".1")
    except OSError:
        pass
    out = open(path, "wb")
    written = 0
    try:
        while True:
            try:
                data = os.read(fd, 65536)
            except InterruptedError:
                continue
            if not data:
                break
            if written + len(data) > _LOG_LIMIT:
                out.close()
                os.replace(path, path + ".1")
                out = open(path, "wb")
                written = 0
            out.write(data)
            out.flush()
            written += len(data)
            output.feed(data)
    except OSError as exc:
        log.warning("sandbox log %s: %s", path, exc)
    finally:
        output.end()
        out.close()
        os.close(fd)


def init_argv(boot_json: str, *, rootless: bool) -> List[str]:
    """The ``unshare`` command line that starts a sandbox's PID 1 on ``boot_json``.

    Raises:
        IsolationUnavailable: the ``unshare`` command is missing.
    """
    unshare = shutil.which("unshare", path=HOST_PATH)
    if unshare is None:
        raise IsolationUnavailable("the unshare command is missing (package util-linux)")
    # Rootless: a user namespace mapping root to this user and 1-65535 to its subuid and
    # subgid ranges (newuidmap/newgidmap, --map-auto), so that sandbox users are real ids.
    # Root mode: PID 1 makes the sandbox's user namespace itself, once its mounts are done.
    userns = ["--user", "--map-root-user", "--map-auto"] if rootless else []
    # -B: PID 1 (host root in root mode) writes no bytecode of its modules into the package.
    return [
        unshare, *userns, "--pid", "--fork", "--mount", "--uts", "--ipc", "--net",
        "--cgroup", *_time_namespace(), "--propagation", "private", "--kill-child", "--",
        sys.executable, "-E", "-s", "-S", "-B", _INIT_PATH, boot_json,
    ]  # fmt: skip


def start_init(
    argv: Sequence[str],
    preexec: Callable[[], None],
    state_dir: str,
    output: SandboxOutput,
    sandbox_id: str,
) -> Tuple[subprocess.Popen[bytes], threading.Thread]:
    """Spawn PID 1 with its output on a pipe, and the thread that pumps it into ``init.log``.

    Args:
        argv: from :func:`init_argv`.
        preexec: run in the child before the exec (in the calling thread's child).
        state_dir: the sandbox's state directory (where ``init.log`` goes).
        output: where every line of that output goes too.
        sandbox_id: names the pump thread.
    """
    # PID 1's and the agent's output go through a pipe that this process drains into
    # init.log: no process of the sandbox holds a descriptor of a host file (the pipe is
    # host root's, the sandbox's root cannot reopen it through /proc).
    log_path = os.path.join(state_dir, "init.log")
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=write_end,
            start_new_session=True,
            preexec_fn=preexec,  # must run in the spawning (event-loop) thread
            env={"PATH": HOST_PATH, "LANG": "C.UTF-8"},
            close_fds=True,
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    pump = threading.Thread(
        target=_pump_log,
        args=(read_end, log_path, output),
        name=f"e2b-log-{sandbox_id}",
        daemon=True,
    )
    pump.start()
    return proc, pump


def log_tail(state_dir: str, limit: int = 4000) -> str:
    """Return the end of ``init.log`` (PID 1's and the agent's output, this boot)."""
    text = b""
    for name in ("init.log", "init.log.1"):
        try:
            with open(os.path.join(state_dir, name), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - (limit - len(text))))
                text = f.read() + text
        except OSError:
            pass
        if len(text) >= limit:
            break
    return text.decode(errors="replace")
