"""PID 1's loop: start the agent, restart it when it exits, reap every orphan, and shut
down on a signal from outside the sandbox.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

# siblings by top-level name for PID 1, through the package for type checkers (see init.py)
if TYPE_CHECKING:
    from .pid1_log import log, log_line
    from .pid1_rootfs import Boot
    from .pid1_syscalls import enter_userns
else:
    from pid1_log import log, log_line
    from pid1_rootfs import Boot
    from pid1_syscalls import enter_userns

__all__ = [
    "LISTEN_FD",
    "serve",
]

#: The fd on which the agent finds its listening socket (systemd's LISTEN_FDS convention).
LISTEN_FD = 3
_OUTSIDE_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Every signal whose disposition can be set (all but SIGKILL and SIGSTOP).
_RESETTABLE_SIGNALS = tuple(
    sig for sig in sorted(signal.valid_signals()) if sig not in (signal.SIGKILL, signal.SIGSTOP)
)


def _spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str, boot: Boot) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            # every signal as a service manager gives envd: none blocked, none ignored. What
            # the emulator inherited must not reach the sandbox (started from a background job
            # it has SIGINT and SIGQUIT ignored, and a terminal's Ctrl-C would do nothing)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            for sig in _RESETTABLE_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            if boot.userns is not None:
                enter_userns(boot.userns)
            wanted = [boot.listener.fileno()]
            if boot.ports is not None:
                wanted.append(boot.ports.fileno())
            # dup every socket above the target range first, so that no dup2 overwrites one
            # that is still to be moved
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, LISTEN_FD + len(wanted)) for fd in wanted]
            for target, fd in enumerate(high, LISTEN_FD):
                os.dup2(fd, target)  # the new descriptor is inheritable
                os.close(fd)
            agent_env = dict(env, LISTEN_FDS=str(len(wanted)), LISTEN_PID=str(os.getpid()))
            os.chdir(cwd)
            os.execve(argv[0], list(argv), agent_env)
        except BaseException as exc:  # report, then leave the child
            os.write(2, log_line(f"cannot start the agent: {exc!r}", "error").encode())
        os._exit(127)
    return pid


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def serve(argv: Sequence[str], env: Mapping[str, str], cwd: str, boot: Boot) -> int:
    """Run PID 1's loop: keep the agent alive, reap orphans, exit on SIGTERM from outside.

    Signals sent from inside the sandbox (``kill 1``) are ignored, as for a real init. The
    agent, and so every process of the sandbox, starts with no signal blocked or ignored. Every
    agent gets the envd listening socket as fd 3 and the ports socket as fd 4 (``LISTEN_FDS=2``,
    ``LISTEN_PID``; ``LISTEN_FDS=1`` when the boot config names no ports socket) and, in root
    mode, runs as root of the sandbox's user namespace.

    Args:
        argv: the agent's command line (argv[0] is an absolute path).
        env: the agent's environment.
        cwd: the agent's working directory.
        boot: what :func:`setup` made.

    Returns:
        The exit status for PID 1 (0 on a requested shutdown).
    """
    wanted = {signal.SIGCHLD, *_OUTSIDE_SIGNALS}
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    agent: Optional[int] = None
    started = 0.0
    failures = 0
    restart_at: Optional[float] = time.monotonic()
    while True:
        now = time.monotonic()
        if agent is None and restart_at is not None and now >= restart_at:
            agent = _spawn(argv, env, cwd, boot)
            started = now
            restart_at = None
            log(f"agent started (pid {agent})")
        wait = 60.0 if restart_at is None else max(0.0, restart_at - now)
        info = signal.sigtimedwait(wanted, wait)
        if info is not None and info.si_signo in _OUTSIDE_SIGNALS:
            if info.si_pid == 0:  # sent from outside the sandbox's pid namespace
                log(f"signal {info.si_signo} from outside: shutting down")
                return 0
            log(f"ignoring signal {info.si_signo} from pid {info.si_pid}")
        while True:  # reap everything that exited, agent or orphan
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == agent:
                ran = time.monotonic() - started
                failures = failures + 1 if ran < 5.0 else 0
                delay = min(2.0, 0.05 * (2 ** min(failures, 6)))
                log(
                    f"agent {_describe(status)} after {ran:.1f}s; restarting in {delay:.2f}s",
                    "warn",
                )
                agent = None
                restart_at = time.monotonic() + delay
