"""How the agent launches a ``Start``'s process, as envd 0.6.13 launches it.

This module owns the launch: envd's ``/bin/sh -c 'oom_score_adj … exec [ionice] nice -n 0
"$@"' -- cmd args…`` wrapper, the target user's uid/gid and supplementary groups, the
``chdir`` done with that user's rights, pipes (or, for a PTY, a new session whose controlling
terminal is the pty slave, its size set before the exec) and envd's messages for a failed
spawn (``fork/exec /bin/sh: <errno>``). What to run comes validated from
:mod:`.process_requests`; the process's life after the spawn is :mod:`.process`'s.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import shutil
import struct
import subprocess
import termios
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .process_requests import StartSpec
from .rpc import RpcError, UserInfo, errno_text

__all__ = ["DEFAULT_PATH", "Launcher", "set_winsize"]

#: The PATH every process gets (envd passes on its own PATH, which is this in E2B's VMs).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_OOM_SCORE = 100


def _set_controlling_tty() -> None:  # pragma: no cover - runs in the forked child
    # Go's forkAndExecInChild: ioctl(Ctty, TIOCSCTTY, 1) for SysProcAttr.Setctty
    fcntl.ioctl(0, termios.TIOCSCTTY, 1)


def set_winsize(fd: int, cols: int, rows: int) -> None:
    """Set the window size of the terminal ``fd`` (a pty master or slave)."""
    # envd converts the uint32 sizes with Go's uint16(…), which keeps the low 16 bits
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows & 0xFFFF, cols & 0xFFFF, 0, 0))


def _find_nice() -> Optional[str]:
    if os.access("/usr/bin/nice", os.X_OK):
        return "/usr/bin/nice"
    return shutil.which("nice", path=DEFAULT_PATH)


def _find_ionice() -> Optional[str]:
    return shutil.which("ionice", path=DEFAULT_PATH)


class Launcher:
    """Starts processes the way envd does: its shell wrapper, credentials and pipes or PTY.

    ``nice`` and ``ionice`` are looked up once (each left out of the wrapper when missing).
    """

    def __init__(self) -> None:
        self._nice = _find_nice()
        self._ionice = _find_ionice()

    def _wrapper(self) -> str:
        # envd's: oom score, then "exec [ionice -c 2 -n 4] [nice -n <delta>] "$@"" (each
        # left out when not found). Its "&&" after the oom write is a ";" here: the write
        # works wherever envd runs (and in the emulator as root); where it cannot (some
        # rootless hosts) the command still runs.
        oom = f"{{ echo {_OOM_SCORE} > /proc/$$/oom_score_adj; }} 2>/dev/null"
        chain = ""
        if self._ionice is not None:
            chain += f"{self._ionice} -c 2 -n 4 "
        if self._nice is not None:
            try:
                delta = -os.getpriority(os.PRIO_PROCESS, 0)
            except OSError:
                delta = 0
            chain += f"{self._nice} -n {delta} "
        return f'{oom}; exec {chain}"$@"'

    def spawn(
        self, spec: StartSpec, user: UserInfo, cwd: str, env: Mapping[str, str]
    ) -> Tuple[subprocess.Popen[bytes], Optional[int]]:
        """Launch ``spec`` as ``user`` in ``cwd`` with ``env``: the process and its PTY master
        (``None`` without a PTY; the slave is closed here, the master is the caller's).

        Raises:
            RpcError: ``invalid_argument`` for a spawn failure (a failed ``chdir`` included).
        """
        argv = ["/bin/sh", "-c", self._wrapper(), "--", spec.cmd, *spec.args]
        kwargs: Dict[str, Any] = {}
        preexec: List[Callable[[], None]] = []
        # the errno of a chdir done in the child after the credential switch
        chdir_errno: Optional[mmap.mmap] = None
        popen_cwd: Optional[str] = cwd
        if os.geteuid() == 0:
            kwargs.update(user=user.uid, group=user.gid, extra_groups=list(user.groups))
            if user.uid != 0:
                chdir_errno = mmap.mmap(-1, 4)
                preexec.append(_chdir_in_child(cwd, chdir_errno))
                popen_cwd = None
        elif user.uid != os.geteuid():
            raise RpcError(
                "invalid_argument",
                f"error starting process '{_cmdline(spec)}': the agent does not run as root "
                f"and cannot switch to user '{user.name}'",
            )
        master: Optional[int] = None
        slave: Optional[int] = None
        try:
            if spec.pty is not None:
                # creack/pty's open(): the slave stays the agent's (root's), not the user's
                master, slave = os.openpty()
                cols, rows = spec.pty
                set_winsize(slave, cols, rows)
                kwargs.update(stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
                preexec.append(_set_controlling_tty)
            else:
                kwargs.update(
                    stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    bufsize=0,
                )
            if preexec:
                kwargs["preexec_fn"] = _chain(preexec)
            popen = subprocess.Popen(argv, cwd=popen_cwd, env=env, close_fds=True, **kwargs)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            if master is not None:
                os.close(master)
            failure: BaseException = exc
            if chdir_errno is not None:
                (code,) = struct.unpack("=i", chdir_errno[:4])
                if code:
                    failure = OSError(code, os.strerror(code), cwd)
            raise RpcError("invalid_argument", _start_error(spec, cwd, failure, argv[0])) from None
        finally:
            if slave is not None:
                os.close(slave)
            if chdir_errno is not None:
                chdir_errno.close()
        return popen, master


def _cmdline(spec: StartSpec) -> str:
    return " ".join([spec.cmd, *spec.args])


def _chdir_in_child(cwd: str, errno_out: mmap.mmap) -> Callable[[], None]:
    """A ``preexec_fn`` part: enter ``cwd`` (already as the command's user); on failure the
    errno goes to the shared ``errno_out`` (the exception's own is lost on the way back)."""

    def enter() -> None:  # pragma: no cover - runs in the forked child
        try:
            os.chdir(cwd)
        except OSError as exc:
            errno_out[:4] = struct.pack("=i", exc.errno or errno.EIO)
            raise

    return enter


def _chain(steps: List[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:  # pragma: no cover - runs in the forked child
        for step in steps:
            step()

    return run


def _start_error(spec: StartSpec, cwd: str, exc: BaseException, shell: str) -> str:
    """envd's message for a failed spawn: Go's ``os.StartProcess`` reports any failure in the
    child (with ``SysProcAttr`` set, ``chdir`` included) as ``fork/exec <argv0>: <errno>``;
    handler.go wraps it per mode (a PTY command fails in ``pty.StartWithSize``)."""
    if isinstance(exc, OSError):
        reason = f"fork/exec {shell}: {errno_text(exc)}"
    else:
        reason = str(exc)
    if spec.pty is not None:
        cols, rows = spec.pty
        return (
            f"error starting pty with command '{_cmdline(spec)}' in dir '{cwd}' "
            f"with '{cols}' cols and '{rows}' rows: {reason}"
        )
    return f"error starting process '{_cmdline(spec)}': {reason}"
