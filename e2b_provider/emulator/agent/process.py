"""Process management of the emulator's envd look-alike agent (the ``process.Process`` service).

This module owns the processes the agent starts for ``Start``: how they are launched (envd
0.6.13's ``/bin/sh -c 'oom_score_adj … exec nice -n 0 "$@"' -- cmd args…`` wrapper, the
target user's uid/gid and supplementary groups, envd's environment and working directory
rules, no new process group or session), how their stdout/stderr (or PTY) output fans out to
any number of subscribed streams with backpressure (a slow stream slows the process; a process
without subscribers has its output read and discarded), when the ``end`` event is due (the
process exited and both pipes reached EOF, or it was released by SIGKILL/SIGTERM from
``SendSignal`` or by its ``Connect-Timeout-Ms`` timer), Go-style exit statuses, stdin
(``SendInput``/``CloseStdin``), the 30 s retention of exit records for late ``Connect``, and
envd's lookups by pid and by tag — the latter with envd's flaw: a tag is looked up in random
order and the search stops at the first process with another tag, so with several tagged
processes alive a lookup by tag may miss (clients must select by pid).

A PTY process (``Start`` with ``pty``) is started as envd 0.6.13 starts it through
creack/pty: a new session whose controlling terminal is the pty slave (``TIOCSCTTY`` with
"steal" = 1, as Go's ``Setctty`` passes it), the slave as fds 0-2, the size set before the
exec, and the slave left owned by the agent (root, as creack/pty never chowns it); no
``TERM`` or other terminal variable is added (a client that wants one sends it in
``envs``); its output comes in ``pty`` data events of at most 16 KiB; ``SendInput`` with
``stdin``, ``CloseStdin`` and an ``Update`` of a process without a pty get envd's errors.
One difference is kept on purpose: the agent subscribes the ``Start`` stream before the
child can write, so a PTY's first output is never lost; envd forks inside
``pty.StartWithSize`` before it subscribes and may drop what the program writes in that
moment (a race no client can rely on either way).

The requests are validated by :mod:`.process_requests`, the launch is
:mod:`.process_spawn`'s, subscribers and fd waits :mod:`.process_output`'s and exit statuses
:mod:`.process_exit`'s; this module owns the processes' lives and the table of them.

Everything here runs on the agent's event loop thread; it uses asyncio file-descriptor
readiness (and a pidfd per child) rather than threads. It imports no requests/urllib3/socket.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import logging
import os
import random
import signal
import subprocess
import threading
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple, Union

import attrs

from . import journal
from .process_exit import ExitInfo, ExitRecord, exit_info_from_status
from .process_output import Item, Subscriber, wait_readable, wait_writable
from .process_requests import Selector, StartSpec
from .process_spawn import DEFAULT_PATH, Launcher, set_winsize
from .rpc import RpcError, UserInfo, errno_text, expand_and_resolve

__all__ = [
    "RETENTION_SECONDS",
    "STD_CHUNK",
    "ManagedProcess",
    "ProcessManager",
]

log = logging.getLogger(__name__)

#: Largest raw chunk of one stdout/stderr data event (envd: 32 KiB).
STD_CHUNK = 32 * 1024
#: Largest raw chunk of one PTY data event (envd: 16 KiB).
PTY_CHUNK = 16 * 1024
#: How long an exited process's end event stays available to ``Connect``.
RETENTION_SECONDS = 30.0
#: What is still read from a released process's pipes once it exited (bounded).
_DRAIN_LIMIT = 1024 * 1024

#: Go's map iteration order is random: what envd's lookups by tag go through.
_map_order = random.Random()


class ManagedProcess:
    """A process started by ``Start``: its pipes, subscribers, stdin, timer and exit.

    Create through :meth:`ProcessManager.start`.
    """

    def __init__(
        self,
        manager: ProcessManager,
        popen: subprocess.Popen[bytes],
        spec: StartSpec,
        pty_master: Optional[int],
    ) -> None:
        self._manager = manager
        self._popen = popen
        self.pid: int = popen.pid
        self.spec = spec
        self.tag = spec.tag
        self._loop = asyncio.get_running_loop()
        self._subs: Set[Subscriber] = set()
        self._pty_master = pty_master
        self._outputs: List[Tuple[int, str, int]] = []  # (fd, event key, chunk size)
        if pty_master is not None:
            os.set_blocking(pty_master, False)
            self._outputs.append((pty_master, "pty", PTY_CHUNK))
        else:
            for stream, key in ((popen.stdout, "stdout"), (popen.stderr, "stderr")):
                if stream is not None:
                    os.set_blocking(stream.fileno(), False)
                    self._outputs.append((stream.fileno(), key, STD_CHUNK))
        self._stdin = popen.stdin  # None for a PTY process (its stdin is the PTY)
        if self._stdin is not None:
            os.set_blocking(self._stdin.fileno(), False)
        self._stdin_lock = asyncio.Lock()
        self._stdin_close_pending = False
        self._pump_tasks: List[asyncio.Task[None]] = []
        self._open_pumps = 0
        self._exited = False
        self._released = False
        self._finishing = False
        self._reaped = False
        self._pidfd: Optional[int] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._deadline_killed = False
        self._finish_task: Optional[asyncio.Task[None]] = None
        self.exit: Optional[ExitInfo] = None
        self.done = asyncio.Event()

    # ---- lifecycle -------------------------------------------------------------------

    def begin(self, timeout: Optional[float]) -> None:
        """Start reading output, watching for the exit, and the kill timer (if any)."""
        for fd, key, size in self._outputs:
            self._open_pumps += 1
            self._pump_tasks.append(self._loop.create_task(self._pump(fd, key, size)))
        self._watch_exit()
        if timeout is not None:
            self._timer = self._loop.call_later(timeout, self._on_timeout)

    def _watch_exit(self) -> None:
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self._pidfd = None
        if self._pidfd is not None:
            self._loop.add_reader(self._pidfd, self._on_exited)
            return
        # Fallback for kernels without pidfd: a thread that waits without reaping.
        loop = self._loop

        def wait() -> None:
            try:
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass
            try:
                loop.call_soon_threadsafe(self._on_exited)
            except RuntimeError:
                pass

        threading.Thread(target=wait, name=f"agent-wait-{self.pid}", daemon=True).start()

    def _on_exited(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
        if self._exited:
            return
        self._exited = True
        self._check_finish()

    def _on_timeout(self) -> None:
        self._timer = None
        if not self._reaped:
            log.info("process %d: Connect-Timeout-Ms expired, sending SIGKILL", self.pid)
            self._deadline_killed = True
            self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self._reaped:
            return
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self._released = True
            self._check_finish()

    def send_signal(self, sig: int) -> None:
        """Signal this pid only (not its group). SIGKILL/SIGTERM release the output wait.

        Raises:
            RpcError: ``internal`` when the process was already reaped (a race at exit).
        """
        if self._reaped:
            raise RpcError("internal", "error sending signal: os: process already finished")
        self._signal(sig)

    def _check_finish(self) -> None:
        if self._finishing or not self._exited:
            return
        if self._open_pumps == 0 or self._released:
            self._finishing = True
            self._finish_task = self._loop.create_task(self._finish())
            self._finish_task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("process %d: finalising failed", self.pid, exc_info=task.exception())

    async def _finish(self) -> None:
        released_early = self._open_pumps > 0
        for task in self._pump_tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*self._pump_tasks, return_exceptions=True)
        if released_early:
            await self._drain_leftovers()
        try:
            _, status = os.waitpid(self.pid, 0)
            info = exit_info_from_status(status)
            self._popen.returncode = (
                os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
            )
        except ChildProcessError:
            info = ExitInfo(-1, False, "unknown status", "wait: no child processes")
            self._popen.returncode = -1
        if self._deadline_killed and info.error is None:
            # Go's exec.Cmd.Wait: a context that killed the process (here one that had
            # already exited, its output still open) turns a clean exit into ctx.Err()
            info = attrs.evolve(info, error="context deadline exceeded")
        # From here on the pid may belong to someone else: never signal it again.
        self._reaped = True
        self.exit = info
        self._close_fds()
        journal.event(
            log,
            "process_end",
            f"Process with pid {self.pid} ended",
            pid=self.pid,
            tag=self.spec.tag,
            exit_code=info.exit_code,
            status=info.status,
        )
        end: Item = ("end", info.end_event())
        for sub in tuple(self._subs):
            await sub.put(end)
            sub.close()
        self._subs.clear()
        self._manager._retire(self)
        self.done.set()

    async def _drain_leftovers(self) -> None:
        budget = _DRAIN_LIMIT
        for fd, key, size in self._outputs:
            while budget > 0:
                try:
                    data = os.read(fd, min(size, budget))
                except OSError:  # EAGAIN: nothing more right now; EIO: pty closed
                    break
                if not data:
                    break
                budget -= len(data)
                await self._dispatch(("data", {"data": {key: _b64(data)}}))

    def _close_fds(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        for stream in (self._popen.stdout, self._popen.stderr):
            if stream is not None:
                stream.close()
        if self._pty_master is not None:
            os.close(self._pty_master)
            self._pty_master = None
            self._outputs = []
        if self._stdin_lock.locked():  # a write is under way: it closes stdin when done
            self._stdin_close_pending = True
        else:
            self._drop_stdin()

    def _drop_stdin(self) -> None:
        if self._stdin is not None:
            self._stdin.close()
            self._stdin = None

    # ---- output ----------------------------------------------------------------------

    async def _pump(self, fd: int, key: str, size: int) -> None:
        try:
            while True:
                try:
                    data = os.read(fd, size)
                except BlockingIOError:
                    await wait_readable(fd)
                    continue
                except OSError as exc:
                    if exc.errno != errno.EIO:  # EIO = the PTY's other side closed
                        log.warning("process %d: reading %s failed: %s", self.pid, key, exc)
                    break
                if not data:
                    break
                await self._dispatch(("data", {"data": {key: _b64(data)}}))
                # Give other tasks a turn even when the pipe is never empty.
                await asyncio.sleep(0)
        finally:
            self._open_pumps -= 1
            self._check_finish()

    async def _dispatch(self, item: Item) -> None:
        for sub in tuple(self._subs):
            await sub.put(item)

    def subscribe(self) -> Subscriber:
        """A new subscriber for output from now on (plus the end event)."""
        sub = Subscriber()
        if self.exit is not None:
            sub.close()
        else:
            self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        """Drop a subscriber (its client went away or its stream ended)."""
        self._subs.discard(sub)
        sub.close()

    # ---- input -----------------------------------------------------------------------

    async def write_input(self, data: bytes, *, pty: bool) -> None:
        """Write all of ``data`` to stdin (or the PTY), waiting for room as long as it
        takes (envd's writes know no deadline; later inputs wait behind this one).

        Raises:
            RpcError: stdin not enabled/closed, the wrong input kind, a write error.
        """
        if pty:
            if self._pty_master is None:
                raise RpcError(
                    "internal",
                    "error writing to tty: tty not assigned to process — input should be "
                    "written to the stdin, not the tty",
                )
            await self._write_fd(self._pty_master, data, "tty", "/dev/ptmx")
            return
        if self.spec.pty is not None:
            raise RpcError(
                "internal",
                "error writing to stdin: tty assigned to process — input should be written "
                "to the pty, not the stdin",
            )
        async with self._stdin_lock:
            try:
                stream = self._stdin
                if stream is None:
                    raise RpcError(
                        "internal", "error writing to stdin: stdin not enabled or closed"
                    )
                await self._write_fd(stream.fileno(), data, "stdin", "|1")
            finally:
                if self._stdin_close_pending:
                    self._drop_stdin()

    async def _write_fd(self, fd: int, data: bytes, what: str, name: str) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                await wait_writable(fd, None)
                continue
            except OSError as exc:
                raise RpcError(
                    "internal",
                    f"error writing to {what}: error writing to {what} of process "
                    f"'{self.pid}': write {name}: {errno_text(exc)}",
                ) from None
            view = view[written:]

    async def close_stdin(self) -> None:
        """Close stdin (EOF for the process); a no-op when it is already closed.

        Raises:
            RpcError: for a PTY process (send Ctrl-D instead).
        """
        if self.spec.pty is not None:
            raise RpcError(
                "unknown",
                "error closing stdin: cannot close stdin for PTY process — send Ctrl+D (0x04) "
                "instead",
            )
        async with self._stdin_lock:
            self._drop_stdin()

    def resize(self, cols: int, rows: int) -> None:
        """Resize the PTY.

        Raises:
            RpcError: the process has no PTY.
        """
        if self._pty_master is None:
            raise RpcError("internal", "error resizing tty: tty not assigned to process")
        set_winsize(self._pty_master, cols, rows)

    def info_json(self) -> Dict[str, Any]:
        """``ProcessInfo`` for ``List``."""
        info: Dict[str, Any] = {"config": self.spec.config_json(), "pid": self.pid}
        if self.tag is not None:
            info["tag"] = self.tag
        return info


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class ProcessManager:
    """All processes of one agent: live ones by pid, and recently finished exit records.

    Args:
        default_env: envd's default variables (``E2B_SANDBOX``, the sandbox's ``envVars``…),
            applied after ``PATH``/``HOME``/``USER``/``LOGNAME`` and before request ``envs``.
        default_workdir: the working directory used when a request gives none (else home).
        retention: seconds an exit record stays available to ``Connect``.
    """

    def __init__(
        self,
        default_env: Optional[Mapping[str, str]] = None,
        default_workdir: Optional[str] = None,
        retention: float = RETENTION_SECONDS,
    ) -> None:
        self.default_env: Dict[str, str] = dict(default_env or {})
        self.default_workdir = default_workdir
        self._retention = retention
        self._live: Dict[int, ManagedProcess] = {}
        self._retained: Dict[int, ExitRecord] = {}
        self._launcher = Launcher()
        self._closed = False

    def start(
        self, spec: StartSpec, user: UserInfo, timeout: Optional[float]
    ) -> Tuple[ManagedProcess, Subscriber]:
        """Launch ``spec`` as ``user``; return it with a subscriber attached before any output.

        The cwd is entered with ``user``'s rights, after the switch to its uid, gids and
        groups (Go's ``forkAndExecInChild`` sets the ``Credential`` envd gives every command
        before its ``chdir``): a ``user`` command cannot start in ``/root``. As in Go, every
        failure in the child, the ``chdir`` included, is ``fork/exec /bin/sh: <errno>``.

        Args:
            spec: the validated request.
            user: who runs it (uid, gid and all groups; ``HOME``/``USER``/``LOGNAME``).
            timeout: seconds until SIGKILL (from ``Connect-Timeout-Ms``), or ``None``.

        Raises:
            RpcError: ``invalid_argument`` for a missing cwd or a spawn failure.
        """
        if self._closed:
            raise RpcError("unavailable", "the agent is shutting down")
        cwd = expand_and_resolve(spec.cwd or "", user, self.default_workdir)
        try:
            os.stat(cwd)
        except FileNotFoundError:
            raise RpcError("invalid_argument", f"cwd '{cwd}' does not exist") from None
        except OSError:
            pass  # let the spawn report it, as envd does
        env: Dict[str, str] = {
            "PATH": DEFAULT_PATH,
            "HOME": user.home,
            "USER": user.name,
            "LOGNAME": user.name,
        }
        env.update(self.default_env)
        env.update(spec.envs)
        popen, master = self._launcher.spawn(spec, user, cwd, env)
        proc = ManagedProcess(self, popen, spec, master)
        sub = proc.subscribe()
        self._live[proc.pid] = proc
        # as envd's Start: a reused pid's retained exit goes, and so do those of the tag
        # (clearTerminatedForTag), so a Connect by tag never finds an older process's end
        self._retained.pop(proc.pid, None)
        if spec.tag is not None:
            for old in [r for r in self._retained.values() if r.tag == spec.tag]:
                del self._retained[old.pid]
        proc.begin(timeout)
        journal.event(
            log,
            "process_start",
            f"Process with pid {proc.pid} started",
            pid=proc.pid,
            tag=spec.tag,
            command=spec.cmd,
            username=user.name,
        )
        return proc, sub

    def _retire(self, proc: ManagedProcess) -> None:
        if self._live.get(proc.pid) is proc:
            del self._live[proc.pid]
        assert proc.exit is not None
        record = ExitRecord(proc.pid, proc.tag, proc.exit)
        self._retained[proc.pid] = record
        try:
            asyncio.get_running_loop().call_later(self._retention, self._forget, record)
        except RuntimeError:
            pass

    def _forget(self, record: ExitRecord) -> None:
        if self._retained.get(record.pid) is record:
            del self._retained[record.pid]

    # ---- lookup ----------------------------------------------------------------------

    @staticmethod
    def _not_found(selector: Selector) -> RpcError:
        if isinstance(selector, int):
            return RpcError("not_found", f"process with pid {selector} not found")
        return RpcError("not_found", f"process with tag {selector} not found")

    def get_live(self, selector: Selector) -> ManagedProcess:
        """The live process for a pid or tag.

        Raises:
            RpcError: ``not_found`` ``process with pid N not found`` (or ``tag``).
        """
        if isinstance(selector, int):
            proc = self._live.get(selector)
            if proc is not None:
                return proc
        else:
            # As envd 0.6.13's getProcess (services/process/service.go): a sync.Map.Range,
            # in Go's randomized map order, whose callback skips untagged processes, keeps
            # going after a match and stops at the first process with another tag. So with
            # other tagged processes alive a tag may not be found, and with two processes
            # of one tag either may be (the last match before the stop).
            found: Optional[ManagedProcess] = None
            procs = list(self._live.values())
            _map_order.shuffle(procs)
            for proc in procs:
                if proc.tag is None:
                    continue
                if proc.tag != selector:
                    break
                found = proc
            if found is not None:
                return found
        raise self._not_found(selector)

    def get_any(self, selector: Selector) -> Union[ManagedProcess, ExitRecord]:
        """A live process, else a retained exit record, for ``Connect``.

        Raises:
            RpcError: ``not_found`` when neither exists.
        """
        try:
            return self.get_live(selector)
        except RpcError:
            pass
        if isinstance(selector, int):
            record = self._retained.get(selector)
            if record is not None:
                return record
        else:
            for record in self._retained.values():
                if record.tag == selector:
                    return record
        raise self._not_found(selector)

    def live(self) -> List[ManagedProcess]:
        """Live processes (started and not yet finalised), by pid."""
        return sorted(self._live.values(), key=lambda p: p.pid)

    # ---- shutdown --------------------------------------------------------------------

    async def shutdown(self, timeout: float = 5.0) -> None:
        """SIGKILL every live process (single pids, as envd would) and wait for them."""
        self._closed = True
        procs = list(self._live.values())
        for proc in procs:
            proc._signal(signal.SIGKILL)
        if procs:
            waits = [asyncio.ensure_future(p.done.wait()) for p in procs]
            _, pending = await asyncio.wait(waits, timeout=timeout)
            for fut in pending:
                fut.cancel()
