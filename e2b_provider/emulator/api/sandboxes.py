"""The emulator's sandbox table and the sandbox lifecycle, behind the host server.

This module owns :class:`SandboxHost`: the table of sandboxes and their lifecycle (create =
boot a real namespaced sandbox through :mod:`e2b_provider.emulator.runtime`; full pause =
freeze; filesystem-only pause = halt; connect/resume = thaw or cold boot; kill = destroy;
expiry = auto-pause or kill when a sandbox's end time passes; snapshot = freeze, copy the
files, thaw; a sandbox from a snapshot or a fork = boot on a copy of those files), the
snapshot templates, metrics samples, armed faults, request log and idempotency memory. It
implements :class:`~.lifecycle.SandboxLifecycle`, what the control plane and the envd front
use; the HTTP app around it is :class:`~.server.EmulatorServer`.

All runtime coroutines are called from the event-loop thread that runs the server, as the
runtime requires (its sandboxes die with that thread).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import importlib
import logging
import os
import time
from typing import Any, Dict, Optional, Set, Tuple

from aiohttp import web

from ..interpreter.environment import CodeEnvMissing
from ..interpreter.template import code_interpreter_service
from ..runtime.boot_wait import BOOT_LIMIT_FACTOR, BOOT_STALL_SECONDS
from .boot_slots import BootSlots, default_max_boots
from .errors import BadRequest
from .faults import FaultRegistry
from .logs import KilledLogs
from .metrics import MetricSample, MetricsHistory
from .proxy import EnvdProxy
from .request_log import RequestLog
from .state import (
    DEFAULT_DOMAIN,
    CreateRequest,
    SandboxRecord,
    TemplateResources,
    new_access_token,
    new_sandbox_id,
    sandbox_not_found,
)
from .templates import TemplateStore
from .volume_files import IdMap
from .volumes import VolumeStore, mounted_volume_ids

__all__ = ["SandboxHost"]

# the lifecycle's log lines keep the server's logger name
log = logging.getLogger("e2b_provider.emulator.server")

#: How many idempotency keys are remembered.
IDEMPOTENCY_KEYS = 1000
#: How many destroyed sandboxes stay queryable through ``/_emulator/sandboxes/{id}/pids``.
GRAVEYARD_SIZE = 512
#: How long a pause waits for the agent's ``GET /health`` before calling it unresponsive.
HEALTH_PROBE_SECONDS = 3.0
#: Bound on destroying one sandbox during shutdown.
DESTROY_TIMEOUT_SECONDS = 30.0


def _create_failed(exc: BaseException) -> BadRequest:
    """The 500 ``sandbox_create_failed`` answer for a sandbox that did not boot."""
    return BadRequest(f"sandbox boot failed: {exc}", status=500, error_code="sandbox_create_failed")


class SandboxHost:
    """The sandboxes of one emulator and their lifecycle (see the module docstring).

    Args:
        api_key: the team's API key (names the team's volumes directory).
        state_dir: where each sandbox gets its own directory (``<state_dir>/<sandbox id>``).
        runtime_module: the module providing ``SandboxSpec`` and ``SandboxRuntime``; defaults
            to :mod:`e2b_provider.emulator.runtime`.
        domain: the ``domain`` reported to clients.
        boot_timeout: seconds a sandbox's boot may go without progress (it may take
            ``BOOT_LIMIT_FACTOR`` times that in all while it progresses).
        max_boots: boots at once (default: the host's CPUs, at least 2); more creates wait
            for a slot (at most the whole-boot bound).
        resources: CPU, memory, disk and process limits of every sandbox (the template's).
    """

    def __init__(
        self,
        *,
        api_key: str,
        state_dir: str,
        runtime_module: Any = None,
        domain: str = DEFAULT_DOMAIN,
        boot_timeout: float = BOOT_STALL_SECONDS,
        resources: Optional[TemplateResources] = None,
        max_boots: Optional[int] = None,
    ) -> None:
        if runtime_module is None:
            runtime_module = importlib.import_module("..runtime", __package__)
        self._runtime_module = runtime_module
        self._api_key = api_key.encode()
        self.state_dir = state_dir
        self.domain = domain
        if not boot_timeout > 0:
            raise ValueError(f"boot_timeout must be positive, not {boot_timeout!r}")
        self.boot_timeout = boot_timeout
        self.boot_slots = BootSlots(default_max_boots() if max_boots is None else max_boots)
        self.resources = resources if resources is not None else TemplateResources()
        self.records: Dict[str, SandboxRecord] = {}
        self.templates = TemplateStore()
        self.metrics = MetricsHistory()
        self.killed_logs = KilledLogs()
        self.faults = FaultRegistry()
        self.idempotency: collections.OrderedDict[str, Tuple[str, asyncio.Future[Any]]] = (
            collections.OrderedDict()
        )
        self.request_log = RequestLog()
        self._graveyard: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._booting: Set[Any] = set()
        self._destroying: Dict[int, asyncio.Future[None]] = {}
        self._expiring: Set[str] = set()
        self._bg: Set[asyncio.Task[Any]] = set()
        team = hashlib.sha256(self._api_key).hexdigest()[:16]
        uids, gids = runtime_module.sandbox_id_extents()
        self.volumes = VolumeStore(
            os.path.join(os.path.abspath(state_dir), "volumes", team),
            api_key,
            IdMap(uids=uids, gids=gids, can_chown=os.geteuid() == 0),
        )
        self.proxy = EnvdProxy(self)
        self._expiry_task: Optional[asyncio.Task[None]] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this server runs on (set by the server's ``start``)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _remove_leftover_volumes(self) -> None:
        """Remove the files of volumes destroyed while mounted during the last run."""
        for leftover in self.volumes.load():
            self._runtime_module.remove_tree(leftover)

    def _start_expiry(self) -> None:
        """Start pausing or killing sandboxes whose end time passed."""
        self._expiry_task = asyncio.ensure_future(self._expiry_loop())

    def _stop_lifecycle(self) -> None:
        """The first step of shutdown: no more expiries, every envd stream cut, faults gone."""
        self._closed = True
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        for rec in list(self.records.values()):
            self._cut_streams(rec)
        self.faults.clear()

    async def _destroy_everything(self) -> None:
        """The last step of shutdown: destroy every sandbox (bounded), snapshot builds too."""
        for task in list(self._bg):
            task.cancel()
        runtimes = [rec.runtime for rec in self.records.values()] + list(self._booting)
        self.records.clear()
        await asyncio.gather(
            *(self._destroy_runtime(rt) for rt in runtimes), return_exceptions=True
        )
        # destroys started by requests or expiries that were cut short above run on; wait for
        # them too (each is bounded), or the loop's end would cancel them half-way
        await asyncio.gather(*list(self._destroying.values()), return_exceptions=True)
        self.templates.templates.clear()
        await self.remove_files(self.snapshots_dir)
        await self.proxy.close()

    def log_request(
        self, request: web.BaseRequest, *, kind: str, sandbox_id: Optional[str] = None
    ) -> Dict[str, Any]:
        """Append a request to the bounded log (selected headers only, never secrets)."""
        return self.request_log.add(request, kind=kind, sandbox_id=sandbox_id)

    def remember_idempotency(self, key: str, fingerprint: str, fut: asyncio.Future[Any]) -> None:
        """Remember an ``Idempotency-Key`` (bounded, oldest forgotten first)."""
        self.idempotency[key] = (fingerprint, fut)
        while len(self.idempotency) > IDEMPOTENCY_KEYS:
            self.idempotency.popitem(last=False)

    async def create_sandbox(self, req: CreateRequest) -> SandboxRecord:
        """Boot a new sandbox and register it.

        Raises:
            BadRequest: 500 ``sandbox_create_failed`` with the runtime's message when the boot
                failed (everything it started is destroyed again).
        """
        rt_mod = self._runtime_module
        sandbox_id = new_sandbox_id()
        while sandbox_id in self.records:
            sandbox_id = new_sandbox_id()
        res = self.resources
        spec = rt_mod.SandboxSpec(
            sandbox_id=sandbox_id,
            hostname=sandbox_id,
            egress=req.egress,
            allow_hosts=tuple(req.allow_hosts),
            env_vars=dict(req.env_vars),
            cpu_count=res.cpu_count,
            memory_mb=res.memory_mb,
            disk_mb=res.disk_mb,
            max_processes=res.max_processes,
            volume_binds=tuple(
                (self.volumes.get(m.volume_id).data_dir, m.path) for m in req.volume_mounts
            ),
            without=req.without,
            services=self._services(req.services),
        )
        state_dir = os.path.join(self.state_dir, sandbox_id)
        try:
            runtime = rt_mod.SandboxRuntime(spec, state_dir)
        except ValueError as exc:
            raise _create_failed(exc) from None
        # in _booting until it is in records: close() finds it in one of them and destroys it
        self._booting.add(runtime)
        try:
            if req.files_from is not None:
                await self._copy_files(req.files_from, state_dir, runtime)
            rec = await self._boot_new(sandbox_id, runtime, req)
            self.records[sandbox_id] = rec
        finally:
            self._booting.discard(runtime)
        return rec

    def _services(self, names: Tuple[str, ...]) -> Tuple[Any, ...]:
        """The template's services by name (the code interpreter's needs its environment).

        Raises:
            BadRequest: 500 naming the command that builds a missing environment.
        """
        services = []
        for name in names:
            assert name == "code-interpreter", name
            try:
                services.append(code_interpreter_service())
            except CodeEnvMissing as exc:
                log.warning("%s", exc)
                raise _create_failed(exc) from None
        return tuple(services)

    async def _boot(self, runtime: Any) -> None:
        """Boot ``runtime`` in a boot slot (see :mod:`.boot_slots`).

        Raises:
            NoBootSlot: none came free within the whole-boot bound.
        """
        async with self.boot_slots.slot(self.boot_timeout * BOOT_LIMIT_FACTOR):
            await runtime.boot(timeout=self.boot_timeout)

    async def _boot_new(self, sandbox_id: str, runtime: Any, req: CreateRequest) -> SandboxRecord:
        """Boot a new runtime and send envd's ``/init``; destroy it again on any failure."""
        try:
            await self._boot(runtime)
        except asyncio.CancelledError:
            await asyncio.shield(self._destroy_runtime(runtime))
            raise
        except Exception as exc:
            log.warning("boot of %s failed: %s", sandbox_id, exc)
            await self._destroy_runtime(runtime)
            raise _create_failed(exc) from None
        now = time.time()
        rec = SandboxRecord(
            sandbox_id=sandbox_id,
            template_id=req.template,
            access_token=new_access_token(),
            runtime=runtime,
            metadata=dict(req.metadata),
            env_vars=dict(req.env_vars),
            started_at=now,
            end_at=now + req.timeout,
            auto_pause=req.auto_pause,
            auto_pause_memory=req.auto_pause_memory,
            egress=req.egress,
            allow_hosts=tuple(req.allow_hosts),
            allow_internet_access=req.allow_internet_access,
            network=req.network,
            alias=req.alias,
            traffic_access_token=(
                new_access_token()
                if req.network is not None and req.network.allow_public_traffic is False
                else None
            ),
            cpu_count=self.resources.cpu_count,
            memory_mb=self.resources.memory_mb,
            disk_size_mb=self.resources.disk_mb,
            volume_mounts=req.volume_mounts,
        )
        try:
            if self._closed:
                raise RuntimeError("the emulator is shutting down")
            await self.proxy.init(rec)
        except BaseException as exc:
            await self.proxy.drop_session(sandbox_id)
            await asyncio.shield(self._destroy_runtime(runtime))
            if isinstance(exc, Exception):
                raise _create_failed(exc) from None
            raise
        return rec

    def _require_current(self, rec: SandboxRecord) -> None:
        """Raise the 404 answer unless ``rec`` is still this server's record of its sandbox."""
        if self.records.get(rec.sandbox_id) is not rec:
            raise sandbox_not_found(rec.sandbox_id)

    @property
    def snapshots_dir(self) -> str:
        """Where snapshot builds keep their copies of sandboxes' files."""
        return os.path.join(self.state_dir, "snapshots")

    async def _copy_files(self, src: str, dest: str, runtime: Any = None) -> None:
        """Copy a sandbox's files (runtime ``copy_sandbox_files``, off the loop; bounded)."""
        copy = self._runtime_module.copy_sandbox_files
        try:
            await self.loop.run_in_executor(None, copy, src, dest)
        except Exception as exc:
            log.warning("copying the files of %s failed: %s", src, exc)
            if runtime is not None:
                await self._destroy_runtime(runtime)
            raise _create_failed(exc) from None

    async def snapshot_files(self, rec: SandboxRecord, dest: str, *, fork: bool) -> None:
        """Copy a running sandbox's files to ``dest``: freeze it, copy, thaw it (it keeps
        running with its id and end time). Memory and processes are not copied.

        Raises:
            BadRequest: 404 gone (or paused, for a snapshot); 409 paused (for a fork); 500
                the copy failed.
        """
        async with rec.lock:
            self._require_current(rec)
            if rec.state != "running":
                if fork:
                    raise BadRequest(
                        f"Sandbox '{rec.sandbox_id}' is paused and cannot be forked; resume it "
                        "first",
                        status=409,
                    )
                raise sandbox_not_found(rec.sandbox_id)
            runtime = rec.runtime
            os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
            frozen_here = not runtime.frozen
            if frozen_here:
                await runtime.freeze()
            try:
                # its disk's pending writes first, or the copy of its image is not whole
                await self.loop.run_in_executor(None, runtime.flush_files)
                copy = self._runtime_module.copy_sandbox_files
                await self.loop.run_in_executor(None, copy, runtime.state_dir, dest)
            except Exception as exc:
                log.warning("copying the files of %s failed: %s", rec.sandbox_id, exc)
                what = "Error forking sandbox" if fork else "Error creating snapshot template"
                raise BadRequest(what, status=500) from None
            finally:
                if frozen_here:
                    await runtime.thaw()

    async def remove_files(self, path: str) -> None:
        """Remove a copy of sandbox files (a snapshot build), off the loop; errors logged."""
        remove = self._runtime_module.remove_tree
        try:
            await self.loop.run_in_executor(None, remove, path)
        except Exception as exc:
            log.warning("removing %s failed: %s", path, exc)

    async def sample_metrics(self, rec: SandboxRecord) -> Optional[MetricSample]:
        """Sample a running sandbox's resource use (at most once a second); None if paused."""
        now = time.time()
        if rec.state != "running" or not self.metrics.due(rec.sandbox_id, now):
            return None
        usage = await self.loop.run_in_executor(None, rec.runtime.resource_usage)
        if rec.state != "running" or self.records.get(rec.sandbox_id) is not rec:
            return None
        if self.metrics.first_reading(rec.sandbox_id):
            log.info(
                "metrics of %s: cpu from %s, memory from %s, disk from %s",
                rec.sandbox_id,
                usage.sources.get("cpu"),
                usage.sources.get("memory"),
                usage.sources.get("disk"),
            )
        return self.metrics.record(
            rec.sandbox_id,
            usage,
            now=time.time(),
            # the first sample's CPU share counts the boot too (its CPU time is in the reading)
            started_at=rec.started_at - (getattr(rec.runtime, "last_boot_seconds", None) or 0.0),
            cpu_count=rec.cpu_count,
            memory_mb=rec.memory_mb,
            disk_mb=rec.disk_size_mb,
        )

    async def envd_responsive(self, rec: SandboxRecord) -> bool:
        """False when the sandbox's envd is marked unresponsive or does not answer /health."""
        if self.faults.is_unresponsive(rec.sandbox_id):
            return False
        return await self.proxy.health(rec, HEALTH_PROBE_SECONDS)

    def _cut_streams(self, rec: SandboxRecord) -> None:
        """End every envd request in flight for this sandbox (the client sees a dropped
        connection, as in-flight requests end when E2B pauses or kills a sandbox)."""
        for task in list(rec.streams):
            task.cancel()
        rec.streams.clear()

    async def pause_sandbox(
        self, rec: SandboxRecord, *, memory: bool, require_healthy_guest: bool = False
    ) -> None:
        """Pause a running sandbox: ``memory`` → freeze, else halt (filesystem only).

        Raises:
            BadRequest: 404 gone, 409 already paused, 503 refused because envd does not
                answer (filesystem-only, or ``require_healthy_guest``).
        """
        async with rec.lock:
            self._require_current(rec)
            if rec.state == "paused":
                raise BadRequest(
                    f"Error pausing sandbox - sandbox '{rec.sandbox_id}' is already paused",
                    status=409,
                )
            await self._pause_locked(
                rec, memory=memory, require_healthy_guest=require_healthy_guest, fallback=False
            )

    async def _pause_locked(
        self, rec: SandboxRecord, *, memory: bool, require_healthy_guest: bool, fallback: bool
    ) -> None:
        responsive = await self.envd_responsive(rec)
        if not responsive and (not memory or require_healthy_guest):
            if not fallback:
                raise BadRequest(
                    "The sandbox guest agent is not responding; the sandbox was not paused "
                    "and keeps running, retry later",
                    status=503,
                )
            memory = True
        # from here on the envd front answers "not found" (as E2B's edge does while pausing)
        rec.state = "paused"
        self._cut_streams(rec)
        try:
            if memory:
                await rec.runtime.freeze()
            else:
                await self.proxy.drop_session(rec.sandbox_id)
                await rec.runtime.halt()
        except Exception as exc:
            log.warning("pausing %s failed: %s", rec.sandbox_id, exc)
            if memory or rec.runtime.running:
                rec.state = "running"
                raise BadRequest(f"Error pausing sandbox: {exc}", status=500) from None
            # a failed halt that still left no process behind is a filesystem pause
            memory = False
        rec.pause_mode = "full" if memory else "filesystem"
        rec.envd_unresponsive_at_pause = memory and not responsive
        rec.paused_at = time.time()

    async def connect_sandbox(
        self, rec: SandboxRecord, *, timeout: int, memory: Optional[bool]
    ) -> bool:
        """Connect to a sandbox: extend a running one, resume a paused one.

        Returns:
            True when the sandbox was resumed (201), False when it was running (200).

        Raises:
            BadRequest: 404 gone; 409 ``sandbox_snapshot_guest_agent_unresponsive`` for a
                marked snapshot without ``memory: false``; 500 when a cold boot failed.
        """
        async with rec.lock:
            self._require_current(rec)
            now = time.time()
            if rec.state == "running":
                rec.extend_to(now + timeout)
                return False
            if rec.envd_unresponsive_at_pause and memory is not False:
                raise BadRequest(
                    "The sandbox was paused while its guest agent was not responding; "
                    "resume it with memory: false",
                    status=409,
                    error_code="sandbox_snapshot_guest_agent_unresponsive",
                )
            if rec.pause_mode == "filesystem" or memory is False:
                await self._cold_boot(rec)
            else:
                await rec.runtime.thaw()
            now = time.time()
            rec.state = "running"
            rec.pause_mode = None
            rec.paused_at = None
            rec.envd_unresponsive_at_pause = False
            rec.started_at = now
            rec.end_at = now + timeout
            return True

    async def _cold_boot(self, rec: SandboxRecord) -> None:
        runtime = rec.runtime
        await self.proxy.drop_session(rec.sandbox_id)
        if runtime.running or runtime.frozen:
            await runtime.halt()
        self.faults.clear_sandbox(rec.sandbox_id)
        try:
            await self._boot(runtime)
            await self.proxy.init(rec)
        except Exception as exc:
            log.warning("cold boot of %s failed: %s", rec.sandbox_id, exc)
            try:
                await runtime.halt()
            except Exception as exc2:
                log.warning("halt after a failed boot of %s failed: %s", rec.sandbox_id, exc2)
            rec.pause_mode = "filesystem"
            raise BadRequest(f"sandbox boot failed: {exc}", status=500) from None

    async def kill_sandbox(self, rec: SandboxRecord) -> bool:
        """Kill a sandbox and remove its files. Returns False when it was already gone."""
        if self.records.get(rec.sandbox_id) is not rec:
            return False
        del self.records[rec.sandbox_id]
        self._cut_streams(rec)
        self.faults.forget_sandbox(rec.sandbox_id)
        self.metrics.forget(rec.sandbox_id)
        self.killed_logs.keep(rec.sandbox_id, rec.runtime)
        async with rec.lock:
            await self.proxy.drop_session(rec.sandbox_id)
            self._graveyard[rec.sandbox_id] = rec.runtime
            while len(self._graveyard) > GRAVEYARD_SIZE:
                self._graveyard.popitem(last=False)
            await self._destroy_runtime(rec.runtime)
        for directory in self.volumes.release(mounted_volume_ids(self.records.values())):
            await self.remove_files(directory)
        return True

    async def _destroy_runtime(self, runtime: Any) -> None:
        """Destroy a runtime once, however many callers ask (bounded)."""
        key = id(runtime)
        fut = self._destroying.get(key)
        if fut is None:
            fut = asyncio.ensure_future(
                asyncio.wait_for(runtime.destroy(), timeout=DESTROY_TIMEOUT_SECONDS)
            )
            self._destroying[key] = fut
            fut.add_done_callback(lambda _f: self._destroying.pop(key, None))
        try:
            await asyncio.shield(fut)
        except Exception as exc:
            log.warning("destroying a sandbox failed: %s", exc)

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            now = time.time()
            for rec in list(self.records.values()):
                if rec.expired(now) and rec.sandbox_id not in self._expiring:
                    self._expiring.add(rec.sandbox_id)
                    task = asyncio.ensure_future(self._expire(rec))
                    self._bg.add(task)
                    task.add_done_callback(self._bg.discard)

    async def _expire(self, rec: SandboxRecord) -> None:
        try:
            if not rec.auto_pause:
                log.info("sandbox %s timed out: killing it", rec.sandbox_id)
                await self.kill_sandbox(rec)
                return
            async with rec.lock:
                if self.records.get(rec.sandbox_id) is not rec or not rec.expired():
                    return
                log.info("sandbox %s timed out: pausing it", rec.sandbox_id)
                await self._pause_locked(
                    rec, memory=rec.auto_pause_memory, require_healthy_guest=False, fallback=True
                )
        except Exception:
            log.exception("expiry of %s failed", rec.sandbox_id)
        finally:
            self._expiring.discard(rec.sandbox_id)


    def runtime_of(self, sandbox_id: str) -> Any:
        """The runtime of a sandbox, or of a recently destroyed one; None when unknown."""
        rec = self.records.get(sandbox_id)
        return rec.runtime if rec is not None else self._graveyard.get(sandbox_id)
