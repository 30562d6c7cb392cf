"""Boot, freeze, halt and destroy one sandbox of the local E2B emulator (host side).

This module owns the host side of a sandbox's life: its state directory, its limits, and the
``unshare`` process whose child (:mod:`.pid1.init`, PID 1 of fresh
pid/mount/uts/ipc/net/cgroup/time namespaces, run by file path) builds the sandbox's root
filesystem and runs the envd agent (``python -m e2b_provider.emulator.agent``) on a unix
socket. The spec is :mod:`.spec`'s, the
files a boot starts from :mod:`.boot_files`', PID 1's command and output log
:mod:`.init_launch`'s, cgroups :mod:`.cgroups`', disk images :mod:`.disk`'s, the isolation
check, ids and rootless mode :mod:`.namespaces`'.

Root mode: the agent and every process it starts run in a user namespace whose ids 0-65535
are an unprivileged host range (:func:`.namespaces.root_id_range`); the sandbox's files live
in an ext4 image of ``disk_mb`` MiB, attached by PID 1 inside the sandbox's mount namespace
(where the host has loop devices; else in the state directory, unbounded); CPU, memory and
process count are capped by cgroups where the host has the controllers. Every boot logs (INFO)
which limits are enforced: ``sandbox <id> limits: cpu 2 (cgroup v1 …), …; not enforced: …``.
Rootless mode: the same contract without cgroups or disk image (see :mod:`.namespaces`).

Layout of a sandbox's ``state_dir`` (all of it stays on the host, none of it is visible inside)::

    disk.img       root mode: the sandbox's disk (sparse ext4), holding root/, upper/, work/
                   and hostname
    disk/          root mode: where PID 1 mounts it (in the sandbox's mount namespace only)
    root/          otherwise: the sandbox's own root directory (persistent: /workspace, /home,
                   /root, /tmp…)
    upper/<d>      otherwise: overlayfs upper dirs of /usr, /etc, /var, /opt (its changes)
    work/<d>       otherwise: overlayfs work dirs
    e2b/           bound at /run/e2b inside (host root's; sandbox processes cannot write it):
                   envd.sock and ports.sock (made by PID 1), sandbox.json (the agent's)
    boot.json      the configuration read by init.py
    boot_id        this boot's /proc/sys/kernel/random/boot_id (new at each boot)
    hostname       otherwise: the hostname /etc/hostname and /etc/hosts were generated for
    init.log       PID 1's and the agent's stdout/stderr, written by this process from a pipe
                   (truncated at each boot; rotated to init.log.1 past 1 MiB)

Every coroutine method must run on the server's event-loop thread: ``unshare`` is spawned with
``PR_SET_PDEATHSIG=SIGKILL``, which fires when the *spawning thread* dies, and ``unshare
--kill-child`` passes the death on to the sandbox's PID 1, so sandboxes never outlive the
server. Waits are bounded and use ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import threading
import time
import types
from typing import Callable, List, Mapping, Optional, Sequence, Set, Tuple

import attrs

from . import disk, linux, ports
from .boot_files import default_agent_argv, package_dir, write_boot_files
from .boot_wait import BOOT_STALL_SECONDS, BootProgress, failure_message
from .cgroups import SandboxCgroups
from .errors import SandboxRuntimeError
from .init_launch import init_argv, log_tail, start_init
from .namespaces import check_isolation, remove_tree
from .output import SandboxOutput
from .spec import SandboxSpec
from .usage import ResourceUsage, read_usage

__all__ = ["SandboxRuntime"]

log = logging.getLogger(__name__)

_WAIT_LIMIT_SECONDS = 10.0  # bound on freeze/thaw/halt waits, seconds
_warned: Set[str] = set()


class SandboxRuntime:
    """One sandbox's namespaces, filesystem and processes, driven from the event-loop thread.

    As root, or rootless in a user namespace when the process is not root (:attr:`rootless`,
    see the module docstring for what differs).

    The agent runs as root inside the sandbox (root of the sandbox's user namespace, not host
    root) with its listening socket as fd 3, ``cwd`` = the directory holding the
    ``e2b_provider`` package and an environment of ``PATH``, ``LANG``, ``HOME``, ``USER``,
    ``LOGNAME``, ``E2B_SANDBOX=true``, ``E2B_SANDBOX_ID`` plus ``spec.env_vars``; the spec is
    also written to ``/run/e2b/sandbox.json`` (``sandbox_id``, ``hostname``, ``egress``,
    ``allow_hosts``, ``env_vars``).

    Args:
        spec: what the sandbox is.
        state_dir: this sandbox's own directory (created if missing; must not be inside a
            directory bound into sandboxes).
        agent_argv: the agent's command line inside the sandbox (``argv[0]`` absolute); default
            :func:`default_agent_argv`. Tests pass a stand-in.

    Attributes:
        envd_socket: host path of the agent's unix socket (exists once :meth:`boot` returned).
        ports_socket: host path of the agent's ports socket: write a port number and a newline,
            read one byte with a connected socket to that port inside the sandbox (passed as
            ``SCM_RIGHTS``), or an error line (see :mod:`e2b_provider.emulator.agent.ports`).
        output: PID 1's and the agent's output lines of every boot (the sandbox's logs).
        last_boot_seconds: wall time of the last successful :meth:`boot`.
        boot_id: the sandbox's ``/proc/sys/kernel/random/boot_id`` since the last :meth:`boot`.
    """

    def __init__(
        self, spec: SandboxSpec, state_dir: str, agent_argv: Optional[Sequence[str]] = None
    ) -> None:
        state_dir = os.path.abspath(state_dir)
        if len([p for p in os.path.realpath(state_dir).split("/") if p]) < 2:
            raise ValueError(f"state_dir must be a dedicated directory, not {state_dir!r}")
        if any(c in state_dir for c in ",:\\\n"):
            raise ValueError("state_dir must not contain ',', ':', '\\' or newlines (overlayfs)")
        self.spec = spec
        self.state_dir = state_dir
        self.envd_socket = os.path.join(state_dir, "e2b", "envd.sock")
        self.ports_socket = os.path.join(state_dir, "e2b", "ports.sock")
        self.output = SandboxOutput()
        if len(self.envd_socket.encode()) > linux.MAX_SOCKET_PATH:
            raise ValueError(f"state_dir too long for a unix socket path: {self.envd_socket!r}")
        argv = list(agent_argv) if agent_argv is not None else default_agent_argv()
        if not argv or not os.path.isabs(argv[0]):
            raise ValueError("agent_argv[0] must be an absolute path")
        self._agent_argv = argv
        self._agent_cwd = os.path.dirname(package_dir()) if agent_argv is None else "/"
        self._cgroups = SandboxCgroups(spec.sandbox_id)
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._init_pid: Optional[int] = None
        self._pid_ns: Optional[Tuple[int, int]] = None
        self._frozen = False
        self._lock: Optional[Tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = None
        self._rootless = os.geteuid() != 0
        if spec.without and self._rootless:
            raise ValueError(
                "a template without " + ", ".join(spec.without) + " needs the emulator's "
                "root mode (its overlay hides them with whiteouts, which rootless cannot make)"
            )
        self._log_pump: Optional[threading.Thread] = None
        self._disk = False
        self.last_boot_seconds: Optional[float] = None
        self.boot_id: Optional[str] = None

    def __repr__(self) -> str:
        return (
            f"SandboxRuntime(id={self.spec.sandbox_id!r}, running={self.running}, "
            f"frozen={self.frozen}, state_dir={self.state_dir!r})"
        )

    @property
    def running(self) -> bool:
        """True from a successful boot until halt/destroy, or until PID 1 died by itself."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def frozen(self) -> bool:
        """True while the sandbox is frozen (its processes keep their memory)."""
        return self._frozen and self.running

    @property
    def rootless(self) -> bool:
        """True if the sandbox runs in a user namespace (the runtime is not root).

        Set at construction and at each :meth:`boot` from the effective uid.
        """
        return self._rootless

    @property
    def freeze_method(self) -> str:
        """How :meth:`freeze` works for the current boot.

        ``"cgroup2"`` (``cgroup.freeze``), ``"cgroup1-freezer"`` (``freezer.state``) or
        ``"sigstop"``: SIGSTOP to every process of the sandbox, SIGCONT on thaw (rootless mode,
        or no cgroup hierarchy). SIGSTOP is visible to the sandbox's processes (a parent may
        see its child stop, job-control shells print "Stopped"), unlike the cgroup freezer.
        """
        if self._cgroups.control is None:
            return "sigstop"
        return "cgroup2" if self._cgroups.mode == "v2" else "cgroup1-freezer"

    @property
    def enforced_limits(self) -> Mapping[str, str]:
        """The limits the current (or last) boot enforces, each with how.

        Keys among ``"cpu"``, ``"memory"``, ``"pids"`` (cgroups) and ``"disk"`` (the ext4
        image); a limit this host cannot enforce is absent.
        """
        enforced = dict(self._cgroups.enforced)
        if self._disk:
            enforced["disk"] = "ext4 image on a loop device"
        return types.MappingProxyType(enforced)

    def limits_line(self) -> str:
        """The log line naming every limit of this sandbox and how (or whether) it is enforced."""
        spec = self.spec
        wanted = (
            ("cpu", f"cpu {spec.cpu_count}"),
            ("memory", f"memory {spec.memory_mb} MiB"),
            ("pids", f"processes {spec.max_processes}"),
            ("disk", f"disk {spec.disk_mb} MiB"),
        )
        enforced = self.enforced_limits
        done = [f"{text} ({enforced[key]})" for key, text in wanted if key in enforced]
        left = [text for key, text in wanted if key not in enforced]
        return (
            f"sandbox {spec.sandbox_id} limits: {', '.join(done) or 'none'}; "
            f"not enforced: {', '.join(left) or 'none'}"
        )

    @property
    def init_pid(self) -> Optional[int]:
        """Host pid of the sandbox's PID 1 while it runs (for nsenter in tests)."""
        return self._init_pid if self.running else None

    def storage_paths(self) -> List[str]:
        """The host paths that hold the sandbox's files: what a copy of the sandbox copies.

        ``disk.img`` when its files live in a disk image (root mode, from its first boot on),
        else its ``root``, ``upper`` and ``work`` directories. Copy them while the sandbox is
        halted, or frozen and after :meth:`flush_files`.
        """
        image = os.path.join(self.state_dir, "disk.img")
        if self._disk or os.path.exists(image):
            return [image]
        return [os.path.join(self.state_dir, d) for d in ("root", "upper", "work")]

    def flush_files(self) -> None:
        """Write the running sandbox's pending file changes to its disk image (blocking).

        A copy of :meth:`storage_paths` taken afterwards, while the sandbox stays frozen, is
        consistent. No-op when it is not running (a halted sandbox's image is complete).

        Raises:
            OSError: the sandbox's filesystem could not be synced.
        """
        init_pid = self.init_pid
        if init_pid is not None:
            linux.syncfs(f"/proc/{init_pid}/root/")

    def host_pids(self) -> List[int]:
        """Return the host pids of every process of the sandbox (``unshare`` included)."""
        pids = {p for p in self._cgroups.pids() if not linux.is_zombie(p)}
        if self._pid_ns is not None and self._pid_ns != linux.namespace_id(os.getpid(), "pid"):
            pids.update(linux.pids_in_pid_namespace(self._pid_ns))
        if self._proc is not None and self._proc.poll() is None:
            pids.add(self._proc.pid)
        return sorted(pids)

    def resource_usage(self) -> ResourceUsage:
        """Read the sandbox's CPU, memory and disk use now (blocking: run it off the loop).

        With a disk image, disk use is what its filesystem has in use while it runs (statvfs),
        else the image's allocated bytes; otherwise the files of ``root``/``upper``.
        """
        cg = self._cgroups
        dirs = ([cg.control] if cg.control else []) + list(cg.extra)
        pids = self.host_pids() if self.running else []
        paths = self.storage_paths()
        image = paths[0]
        if not image.endswith("disk.img"):
            return read_usage(dirs, pids, paths[:2])
        usage = read_usage(dirs, pids, [])
        used, source = None, "image"
        init_pid = self.init_pid
        try:
            if init_pid is not None:
                st = os.statvfs(f"/proc/{init_pid}/root/")
                used, source = (st.f_blocks - st.f_bfree) * st.f_frsize, "statvfs"
            else:
                used = os.stat(image).st_blocks * 512
        except OSError:
            pass
        return attrs.evolve(usage, disk_used=used, sources={**usage.sources, "disk": source})

    def _guard(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    # -- boot --

    def _uses_disk(self) -> bool:
        """Whether this sandbox's files live in a disk image (decided at its first boot)."""
        if self._rootless:
            return False
        image = os.path.join(self.state_dir, "disk.img")
        if os.path.exists(image):
            return True
        first_boot = not os.path.exists(os.path.join(self.state_dir, "root"))
        return first_boot and disk.disk_support() is None

    def _prepare(self) -> str:
        """Write the files this boot starts from; return the boot.json path."""
        files = write_boot_files(
            self.spec,
            self.state_dir,
            disk=self._disk,
            rootless=self._rootless,
            agent_argv=self._agent_argv,
            agent_cwd=self._agent_cwd,
            stale_sockets=(self.envd_socket, self.ports_socket),
        )
        self.boot_id = files.boot_id
        return files.config_path

    def _spawn(self, boot_json: str) -> None:
        argv = init_argv(boot_json, rootless=self._rootless)
        if self._rootless:
            # No cgroups: an unprivileged user cannot create them (freeze = SIGSTOP, no limits).
            self._cgroups.mode, self._cgroups.control, self._cgroups.extra = "none", None, []
            self._cgroups.enforced = {}
        else:
            spec = self.spec
            self._cgroups.create(spec.cpu_count, spec.memory_mb, spec.max_processes)
        required, optional = self._cgroups.procs_fds()
        set_pdeathsig = linux.pdeathsig_setter(signal.SIGKILL, os.getpid())

        def preexec() -> None:
            # Runs in the forked child before exec: die with the spawning thread, and join the
            # sandbox's cgroups so that every descendant is born inside them.
            set_pdeathsig()
            for fd in required:
                os.write(fd, b"0")
            for fd in optional:
                try:
                    os.write(fd, b"0")
                except OSError:
                    pass

        try:
            self._proc, self._log_pump = start_init(
                argv, preexec, self.state_dir, self.output, self.spec.sandbox_id
            )
        finally:
            for fd in required + optional:
                os.close(fd)

    def _find_init(self) -> Optional[int]:
        assert self._proc is not None
        pid = self._proc.pid
        children = linux.child_pids(pid)
        # Rootless, unshare first forks a helper (newuidmap/newgidmap) that stays in our pid
        # namespace: PID 1 is the child living in a pid namespace of its own.
        own = linux.namespace_id(os.getpid(), "pid")
        for child in children:
            ns = linux.namespace_id(child, "pid")
            if ns is not None and ns != own:
                return child
        return None

    async def connect_port(self, port: int, timeout: float = 8.0) -> socket.socket:
        """A connection to TCP ``port`` inside the running sandbox (127.0.0.1, else ::1),
        made by its agent from inside and passed back (see :mod:`.ports`).

        Raises:
            PortClosed: nothing listens there, or the agent did not answer within ``timeout``.
        """
        return await ports.connect_port(self.ports_socket, port, timeout)

    def log_tail(self, limit: int = 4000) -> str:
        """Return the end of ``init.log`` (PID 1's and the agent's output, this boot)."""
        return log_tail(self.state_dir, limit)

    def _drain_log(self, timeout: float = 2.0) -> None:
        """Wait (bounded) until the log pipe's writers are gone and init.log has it all."""
        if self._log_pump is not None:
            self._log_pump.join(timeout)

    async def _healthy(self, timeout: float) -> bool:
        writer = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.envd_socket), timeout
            )
            writer.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            line = await asyncio.wait_for(reader.readline(), timeout)
            parts = line.split()
            return len(parts) >= 2 and parts[1][:1] == b"2"
        except (OSError, asyncio.TimeoutError, ValueError):
            return False
        finally:
            if writer is not None:
                writer.close()

    async def boot(self, timeout: float = BOOT_STALL_SECONDS) -> None:
        """Cold-boot the sandbox (keeping the files of earlier boots) and wait for its agent.

        Returns when the agent answers ``GET /health`` on :attr:`envd_socket`. The wait is
        measured by progress (see :mod:`.boot_wait`): a boot fails after ``timeout`` seconds
        without progress, or after ``BOOT_LIMIT_FACTOR`` times that in all.

        Args:
            timeout: seconds the boot may go without progress.

        Raises:
            IsolationUnavailable: the host cannot isolate sandboxes.
            SandboxRuntimeError: already running, PID 1 failed, or no healthy agent in time
                (the sandbox is halted again; the message names the step and why, and ends
                with the last whole lines of its log).
        """
        async with self._guard():
            if self.running:
                raise SandboxRuntimeError(f"sandbox {self.spec.sandbox_id} is already running")
            check_isolation()
            await self._halt_locked()  # leftovers of a PID 1 that died by itself
            self._rootless = os.geteuid() != 0
            t0 = time.monotonic()
            try:
                await self._prepare_disk()
                self._spawn(self._prepare())
                await self._wait_ready(BootProgress(stall=timeout, started=time.monotonic()))
            except BaseException:
                await self._halt_locked()
                raise
            self.last_boot_seconds = time.monotonic() - t0
            log.info("sandbox %s booted in %.3f s", self.spec.sandbox_id, self.last_boot_seconds)
            self._log_limits()

    async def _prepare_disk(self) -> None:
        """Create the disk image at the first boot; wait until an earlier boot released it."""
        self._disk = self._uses_disk()
        if not self._disk:
            return
        image = os.path.join(self.state_dir, "disk.img")
        if not os.path.exists(image):
            os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, disk.create_image, image, self.spec.disk_mb)
        await disk.wait_released(image)

    def _log_limits(self) -> None:
        log.info("%s", self.limits_line())
        missing = [k for k in ("cpu", "memory", "pids", "disk") if k not in self.enforced_limits]
        key = ",".join(missing)
        if missing and key not in _warned:
            _warned.add(key)
            log.warning(
                "this host cannot enforce these sandbox limits: %s (see the INFO line of each "
                "sandbox)",
                ", ".join(missing),
            )

    def _cpu_usec(self) -> Optional[int]:
        """CPU time the sandbox's processes used so far (its cgroups', else ``/proc``'s)."""
        cg = self._cgroups
        dirs = ([cg.control] if cg.control else []) + list(cg.extra)
        try:
            return read_usage(dirs, self.host_pids(), []).cpu_usec
        except OSError:
            return None

    async def _wait_ready(self, progress: BootProgress) -> None:
        assert self._proc is not None
        delay = 0.002
        measured = progress.started
        while True:
            now = time.monotonic()
            if self._init_pid is None:
                self._init_pid = self._find_init()
                if self._init_pid is not None:
                    self._pid_ns = linux.namespace_id(self._init_pid, "pid")
            if self._proc.poll() is not None:
                self._drain_log()
                raise SandboxRuntimeError(failure_message(
                    self.spec.sandbox_id,
                    f"PID 1 exited with status {self._proc.returncode}", self.log_tail(),
                ))
            if self._init_pid is not None:
                progress.reached(1, now)
                if os.path.exists(self.envd_socket):
                    progress.reached(2, now)
                    if progress.step >= 3 or await self._healthy(
                        min(1.0, max(0.05, progress.next_check(now)))
                    ):
                        progress.reached(3, now)
                        if await self._services_listen():
                            return
            now = time.monotonic()
            if now - measured >= 0.5:  # the CPU time: progress while no step is reached
                measured = now
                progress.used_cpu(self._cpu_usec(), now)
            why = progress.why_stop(now)
            if why is not None:
                raise SandboxRuntimeError(
                    failure_message(self.spec.sandbox_id, why, self.log_tail())
                )
            await asyncio.sleep(delay)
            delay = min(0.02, delay * 1.5)

    async def _services_listen(self) -> bool:
        """Whether every service with a ready port listens on it (asked through the agent)."""
        for service in self.spec.services:
            if service.ready_port is None:
                continue
            try:
                sock = await ports.connect_port(self.ports_socket, service.ready_port, 1.0)
            except ports.PortClosed:
                return False
            sock.close()
        return True

    # -- freeze / thaw --

    async def _poll(
        self, predicate: Callable[[], bool], what: str, limit: float = _WAIT_LIMIT_SECONDS
    ) -> None:
        deadline = time.monotonic() + limit
        delay = 0.001
        while not predicate():
            if time.monotonic() >= deadline:
                raise SandboxRuntimeError(
                    f"sandbox {self.spec.sandbox_id}: {what} not done within {limit:.0f} s"
                )
            await asyncio.sleep(delay)
            delay = min(0.05, delay * 2)

    def _signal_all(self, sig: int) -> None:
        for pid in self.host_pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    async def freeze(self) -> None:
        """Freeze every process of the sandbox, keeping its memory (pause with memory).

        Uses the cgroup freezer, or, rootless or without cgroups, SIGSTOP to every process
        (repeated for children forked meanwhile) until all are stopped; see
        :attr:`freeze_method`.

        Raises:
            SandboxRuntimeError: not running, or the freezer did not settle within 10 s.
        """
        async with self._guard():
            if not self.running:
                raise SandboxRuntimeError(f"sandbox {self.spec.sandbox_id} is not running")
            if self._frozen:
                return
            cg = self._cgroups
            if cg.control is not None:
                cg.set_frozen(True)
                self._frozen = True
                await self._poll(lambda: cg.is_frozen(True), "freeze")
            else:
                self._frozen = True
                await self._stop_all()

    def _all_stopped(self, signalled: Set[int]) -> bool:
        """SIGSTOP the processes not signalled yet; True once every process is stopped."""
        settled = True
        for pid in self.host_pids():
            if pid not in signalled:
                signalled.add(pid)
                settled = False
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            elif linux.process_state(pid) not in ("T", "t", "Z", "X", None):
                settled = False
        return settled

    async def _stop_all(self) -> None:
        # SIGSTOP every process, again for any child forked meanwhile, until all are stopped.
        # If that does not settle, everything is continued: a failed freeze leaves it running.
        signalled: Set[int] = set()
        try:
            await self._poll(lambda: self._all_stopped(signalled), "freeze (SIGSTOP)")
        except BaseException:
            self._signal_all(signal.SIGCONT)
            self._frozen = False
            raise

    async def thaw(self) -> None:
        """Resume a frozen sandbox (no-op if it is not frozen).

        Raises:
            SandboxRuntimeError: the freezer did not settle within 10 s.
        """
        async with self._guard():
            if not self._frozen:
                return
            await self._thaw_locked()

    async def _thaw_locked(self) -> None:
        cg = self._cgroups
        if cg.control is not None:
            cg.set_frozen(False)
            await self._poll(lambda: cg.is_frozen(False), "thaw")
        else:
            self._signal_all(signal.SIGCONT)
        self._frozen = False

    # -- halt / destroy --

    async def halt(self) -> None:
        """Kill every process of the sandbox and wait until none is left; keep its files.

        A later :meth:`boot` reboots the sandbox on the same files. No-op if nothing runs.

        Raises:
            SandboxRuntimeError: some process survived 10 s.
        """
        async with self._guard():
            await self._halt_locked()

    async def _halt_locked(self) -> None:
        proc = self._proc
        if proc is None and not self.host_pids():
            self._reset()
            return

        def gone() -> bool:
            if proc is not None and proc.poll() is None:
                return False
            return not self.host_pids()

        # SIGKILL to PID 1 takes its whole pid namespace down, and leaves ``unshare`` alive to
        # reap it (were unshare killed first, PID 1 would linger as a zombie of the host's
        # init). A frozen sandbox is thawed so that unshare can run; killed tasks stay dead.
        init_pid = self._init_pid
        if init_pid is not None:
            try:
                os.kill(init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._frozen:
            try:
                if self._cgroups.control is not None:
                    self._cgroups.set_frozen(False)
                else:
                    self._signal_all(signal.SIGCONT)
            except OSError:
                pass
        if init_pid is None or not await self._poll_quietly(gone, 3.0):
            # No PID 1 known (boot failed early) or something resists: kill everything.
            if not self._cgroups.kill():
                self._signal_all(signal.SIGKILL)
            if proc is not None and proc.poll() is None:
                proc.kill()
            await self._poll(gone, "halt")
        self._reset()

    async def _poll_quietly(self, predicate: Callable[[], bool], limit: float) -> bool:
        try:
            await self._poll(predicate, "", limit)
        except SandboxRuntimeError:
            return False
        return True

    def _reset(self) -> None:
        self._proc = None
        self._init_pid = None
        self._pid_ns = None
        self._frozen = False

    async def destroy(self) -> None:
        """Halt the sandbox, delete every file of it and its cgroups.

        Raises:
            SandboxRuntimeError: processes survived, a mount is still under ``state_dir``
                (nothing is deleted then), or a cgroup could not be removed.
        """
        async with self._guard():
            await self._halt_locked()
            left = linux.mounts_under(self.state_dir)
            if left:
                raise SandboxRuntimeError(
                    f"refusing to delete {self.state_dir}: still mounted: {', '.join(left)}"
                )
            if os.path.lexists(self.state_dir):
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, remove_tree, self.state_dir)
            self._cgroups.remove()
