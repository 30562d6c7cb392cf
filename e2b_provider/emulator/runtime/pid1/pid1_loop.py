"""PID 1's loop: start the agent and the template's services, restart each when it exits,
reap every orphan, and shut down on a signal from outside the sandbox.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

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


def _spawn(
    argv: Sequence[str], env: Mapping[str, str], cwd: str, boot: Boot, listeners: bool = True
) -> int:
    """Fork and exec one supervised program; only the agent (``listeners``) gets the
    sockets."""
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
            if not listeners:  # a service: the sockets are not inheritable, exec drops them
                os.chdir(cwd)
                os.execve(argv[0], list(argv), dict(env))
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
            os.write(2, log_line(f"cannot start {argv[0]}: {exc!r}", "error").encode())
        os._exit(127)
    return pid


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


class _Child:
    """One supervised program: the agent or a service, its pid, and when to start it."""

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, listeners: bool
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.cwd = cwd
        self.listeners = listeners
        self.pid: Optional[int] = None
        self.started = 0.0
        self.failures = 0
        self.restart_at: Optional[float] = time.monotonic()

    def start(self, boot: Boot, now: float) -> None:
        self.pid = _spawn(self.argv, self.env, self.cwd, boot, self.listeners)
        self.started = now
        self.restart_at = None
        log(f"{self.name} started (pid {self.pid})")

    def exited(self, status: int) -> None:
        """It exited: start it again after a delay that grows while it keeps failing fast."""
        ran = time.monotonic() - self.started
        self.failures = self.failures + 1 if ran < 5.0 else 0
        delay = min(2.0, 0.05 * (2 ** min(self.failures, 6)))
        log(f"{self.name} {_describe(status)} after {ran:.1f}s; restarting in {delay:.2f}s",
            "warn")
        self.pid = None
        self.restart_at = time.monotonic() + delay


def serve(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    boot: Boot,
    services: Sequence[Mapping[str, Any]] = (),
) -> int:
    """Run PID 1's loop: keep the agent and the services alive, reap orphans, exit on SIGTERM
    from outside.

    Signals sent from inside the sandbox (``kill 1``) are ignored, as for a real init. The
    agent, and so every process of the sandbox, starts with no signal blocked or ignored. Every
    agent gets the envd listening socket as fd 3 and the ports socket as fd 4 (``LISTEN_FDS=2``,
    ``LISTEN_PID``; ``LISTEN_FDS=1`` when the boot config names no ports socket) and, in root
    mode, runs as root of the sandbox's user namespace. Each service (``name``, ``argv``,
    ``env``, ``cwd``) runs as that root too, in a session of its own, without the sockets.

    Args:
        argv: the agent's command line (argv[0] is an absolute path).
        env: the agent's environment.
        cwd: the agent's working directory.
        boot: what :func:`setup` made.
        services: the template's services.

    Returns:
        The exit status for PID 1 (0 on a requested shutdown).
    """
    wanted = {signal.SIGCHLD, *_OUTSIDE_SIGNALS}
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    children: List[_Child] = [_Child("agent", argv, env, cwd, True)] + [
        _Child(str(sv["name"]), sv["argv"], sv["env"], str(sv["cwd"]), False) for sv in services
    ]
    by_pid: Dict[int, _Child] = {}
    while True:
        now = time.monotonic()
        for child in children:
            if child.pid is None and child.restart_at is not None and now >= child.restart_at:
                child.start(boot, now)
                assert child.pid is not None
                by_pid[child.pid] = child
        due = [c.restart_at for c in children if c.restart_at is not None]
        wait = 60.0 if not due else max(0.0, min(due) - now)
        info = signal.sigtimedwait(wanted, wait)
        if info is not None and info.si_signo in _OUTSIDE_SIGNALS:
            if info.si_pid == 0:  # sent from outside the sandbox's pid namespace
                log(f"signal {info.si_signo} from outside: shutting down")
                return 0
            log(f"ignoring signal {info.si_signo} from pid {info.si_pid}")
        while True:  # reap everything that exited, supervised or orphan
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            gone = by_pid.pop(pid, None)
            if gone is not None:
                gone.exited(status)
