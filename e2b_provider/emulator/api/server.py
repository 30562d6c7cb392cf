"""The emulator's host server: one aiohttp app on one TCP port, and the sandbox lifecycle.

This module owns :class:`EmulatorServer`: the table of sandboxes, their lifecycle (create =
boot a real namespaced sandbox through :mod:`e2b_provider.emulator.runtime`; full pause =
freeze; filesystem-only pause = halt; connect/resume = thaw or cold boot; kill = destroy;
expiry = auto-pause or kill when a sandbox's end time passes; snapshot = freeze, copy the
files, thaw; a sandbox from a snapshot or a fork = boot on a copy of those files), the
snapshot templates and metrics samples, the request dispatch (envd
traffic → :class:`~.proxy.EnvdProxy`, ``/volumecontent/`` → the volume content API with its
bearer token, everything else → API-key check →
:class:`~.control.ControlPlane` or the admin routes), the admin routes
under ``/_emulator/`` (faults, request log, sandbox pids, sandbox list — API key required), the
bounded request log, and shutdown (every sandbox destroyed).

All runtime coroutines are called from the event-loop thread that runs this server, as the
runtime requires (its sandboxes die with that thread).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import importlib
import logging
import os
import time
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from aiohttp import web

from .control import ControlPlane
from .errors import BadRequest
from .faults import FaultError, FaultRegistry
from .half_close import HalfCloseRunner
from .logs import KilledLogs
from .metrics import MetricSample, MetricsHistory
from .proxy import EnvdProxy, envd_route, to_a_port
from .routing import Handler, api_error
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
from .volume_content import VolumeContentRoutes, content_error
from .volume_files import IdMap
from .volumes import VolumeStore, mounted_volume_ids

__all__ = ["EmulatorServer"]

log = logging.getLogger("e2b_provider.emulator.server")

#: How many recent requests ``GET /_emulator/requests`` keeps.
REQUEST_LOG_SIZE = 2000
#: How many idempotency keys are remembered.
IDEMPOTENCY_KEYS = 1000
#: How many destroyed sandboxes stay queryable through ``/_emulator/sandboxes/{id}/pids``.
GRAVEYARD_SIZE = 512
#: How long a pause waits for the agent's ``GET /health`` before calling it unresponsive.
HEALTH_PROBE_SECONDS = 3.0
#: Bound on destroying one sandbox during shutdown.
DESTROY_TIMEOUT = 30.0
#: Longest unix socket path Linux accepts (sun_path is 108 bytes with the NUL).
MAX_SOCKET_PATH = 107
#: The listening socket's accept queue (the kernel caps it at ``net.core.somaxconn``). E2B's
#: edge takes a burst of connections: a client that starts 1,000 commands at once opens 1,000
#: of them. With aiohttp's default of 128 the kernel dropped the SYNs past the queue (each
#: retried 1 s, then 3 s later) and, with SYN cookies, reset some connections whose request
#: was already sent.
LISTEN_BACKLOG = 4096
_LOGGED_HEADERS = (
    "Content-Type",
    "Content-Length",
    "Transfer-Encoding",
    "Connect-Protocol-Version",
    "Connect-Timeout-Ms",
    "Keepalive-Ping-Interval",
    "E2b-Sandbox-Id",
    "E2b-Sandbox-Port",
    "Idempotency-Key",
    "User-Agent",
)
_SECRET_QUERY_KEYS = frozenset({"signature", "signature_expiration", "access_token"})


def _create_failed(exc: BaseException) -> BadRequest:
    """The 500 ``sandbox_create_failed`` answer for a sandbox that did not boot."""
    return BadRequest(f"sandbox boot failed: {exc}", status=500, error_code="sandbox_create_failed")


class EmulatorServer:
    """A local E2B: control plane, envd front and sandbox lifecycle on one aiohttp app.

    Args:
        api_key: the key every control-plane and admin request must carry in ``X-API-KEY``.
        state_dir: where each sandbox gets its own directory (``<state_dir>/<sandbox id>``).
        runtime_module: the module providing ``SandboxSpec`` and ``SandboxRuntime``; defaults
            to :mod:`e2b_provider.emulator.runtime`.
        domain: the ``domain`` reported to clients.
        boot_timeout: seconds a sandbox may take to boot.
        resources: CPU, memory, disk and process limits of every sandbox (the template's).
    """

    def __init__(
        self,
        *,
        api_key: str,
        state_dir: str,
        runtime_module: Any = None,
        domain: str = DEFAULT_DOMAIN,
        boot_timeout: float = 30.0,
        resources: Optional[TemplateResources] = None,
    ) -> None:
        if runtime_module is None:
            runtime_module = importlib.import_module("..runtime", __package__)
        self._runtime_module = runtime_module
        self._api_key = api_key.encode()
        self.state_dir = state_dir
        self.domain = domain
        self.boot_timeout = boot_timeout
        self.resources = resources if resources is not None else TemplateResources()
        self.records: Dict[str, SandboxRecord] = {}
        self.templates = TemplateStore()
        self.metrics = MetricsHistory()
        self.killed_logs = KilledLogs()
        self.faults = FaultRegistry()
        self.idempotency: collections.OrderedDict[str, Tuple[str, asyncio.Future[Any]]] = (
            collections.OrderedDict()
        )
        self.request_log: Deque[Dict[str, Any]] = collections.deque(maxlen=REQUEST_LOG_SIZE)
        self._request_seq = 0
        self._graveyard: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._booting: Set[Any] = set()
        self._destroying: Dict[int, asyncio.Future[None]] = {}
        self._expiring: Set[str] = set()
        self._bg: Set[asyncio.Task[Any]] = set()
        team = hashlib.sha256(api_key.encode()).hexdigest()[:16]
        uids, gids = runtime_module.sandbox_id_extents()
        self.volumes = VolumeStore(
            os.path.join(os.path.abspath(state_dir), "volumes", team),
            api_key,
            IdMap(uids=uids, gids=gids, can_chown=os.geteuid() == 0),
        )
        self.proxy = EnvdProxy(self)
        self.control = ControlPlane(self, self.volumes)
        self._volume_content = VolumeContentRoutes(self, self.volumes)
        self._runner: Optional[web.AppRunner] = None
        self._expiry_task: Optional[asyncio.Task[None]] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this server runs on (set by :meth:`start`)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    # -- app --------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        """Build the aiohttp application (routes + dispatch middleware)."""
        app = web.Application(middlewares=[self._dispatch], client_max_size=1024**3)
        self.control.add_routes(app)
        self._volume_content.add_routes(app)
        r = app.router
        r.add_get("/_emulator/faults", self._admin_faults_list, allow_head=False)
        r.add_post("/_emulator/faults", self._admin_faults_arm)
        r.add_delete("/_emulator/faults", self._admin_faults_clear)
        r.add_get("/_emulator/requests", self._admin_requests, allow_head=False)
        r.add_delete("/_emulator/requests", self._admin_requests_clear)
        r.add_get("/_emulator/sandboxes", self._admin_sandboxes, allow_head=False)
        r.add_get("/_emulator/sandboxes/{sid}/pids", self._admin_pids, allow_head=False)
        r.add_route("*", "/_emulator/redirect-target", self._admin_redirect_target)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> Tuple[str, int]:
        """Start serving on ``host:port`` (0 = a free port); returns the bound address."""
        self._loop = asyncio.get_running_loop()
        self.state_dir = os.path.abspath(self.state_dir)
        socket_path = os.path.join(self.state_dir, "i" + "x" * 20, "e2b", "envd.sock")
        if len(socket_path.encode()) > MAX_SOCKET_PATH:
            raise ValueError(
                f"state dir {self.state_dir!r} is too long: sandbox sockets would exceed the "
                f"{MAX_SOCKET_PATH}-byte unix socket path limit; use a shorter --state-dir"
            )
        os.makedirs(self.state_dir, exist_ok=True)
        for leftover in self.volumes.load():  # volumes destroyed while mounted, last run
            self._runtime_module.remove_tree(leftover)
        runner = HalfCloseRunner(
            self.build_app(),
            keeps=to_a_port,  # a sandbox port's request is answered after a half-close
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=2.0,
            auto_decompress=False,  # envd bodies reach the agent as sent (it decodes gzip)
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True, backlog=LISTEN_BACKLOG)
        await site.start()
        self._runner = runner
        self._expiry_task = asyncio.ensure_future(self._expiry_loop())
        bound = runner.addresses[0]
        return str(bound[0]), int(bound[1])

    async def close(self) -> None:
        """Stop serving, cut every stream and destroy every sandbox (bounded)."""
        if self._closed:
            return
        self._closed = True
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        for rec in list(self.records.values()):
            self._cut_streams(rec)
        self.faults.clear()
        if self._runner is not None:
            await self._runner.cleanup()
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

    # -- dispatch ---------------------------------------------------------------------------

    @web.middleware
    async def _dispatch(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = envd_route(request)
        if route is not None:
            return await self.proxy.handle(request, route[0], route[1])
        is_admin = request.path.startswith("/_emulator/")
        if request.path.startswith("/volumecontent/"):
            # the volume content API: a volume's bearer token, no API key (checked per route)
            entry = self.log_request(request, kind="volume")
            if request.match_info.http_exception is not None:
                status = request.match_info.http_exception.status
                entry["status"] = status
                return content_error(status, "invalid_request", "no matching operation was found")
            try:
                resp = await handler(request)
            except Exception:
                log.exception("volume content handler failed")
                resp = content_error(500, "internal_error", "internal server error")
            entry["status"] = resp.status
            return resp
        entry = self.log_request(request, kind="admin" if is_admin else "control")
        request["log_entry"] = entry
        key = request.headers.get("X-API-KEY")
        entry["api_key"] = "missing" if key is None else "present"
        if request.path != "/_emulator/redirect-target" and (
            key is None
            or not hmac.compare_digest(key.encode("utf-8", "surrogateescape"), self._api_key)
        ):
            if key is not None:
                entry["api_key"] = "invalid"
            entry["status"] = 401
            return api_error(401, "Invalid API key")
        match_info = request.match_info
        if "sid" in match_info:
            entry["sandbox_id"] = match_info["sid"]
        if match_info.http_exception is not None:
            status = match_info.http_exception.status
            entry["status"] = status
            message = (
                "validation error: no matching operation was found"
                if status == 404
                else "validation error: method not allowed"
            )
            return api_error(status, message)
        try:
            resp = await handler(request)
        except Exception:
            log.exception("control-plane handler failed")
            entry["status"] = 500
            return api_error(500, "internal server error", "internal_server_error")
        entry["status"] = resp.status
        return resp

    def log_request(
        self, request: web.BaseRequest, *, kind: str, sandbox_id: Optional[str] = None
    ) -> Dict[str, Any]:
        """Append a request to the bounded log (selected headers only, never secrets)."""
        self._request_seq += 1
        query = {k: v for k, v in request.query.items() if k.lower() not in _SECRET_QUERY_KEYS}
        entry: Dict[str, Any] = {
            "seq": self._request_seq,
            "time": time.time(),
            "kind": kind,
            "method": request.method,
            "path": request.path,
            "query": query,
            "sandbox_id": sandbox_id,
            "headers": {h: request.headers[h] for h in _LOGGED_HEADERS if h in request.headers},
            "status": None,
        }
        self.request_log.append(entry)
        return entry

    # -- lifecycle --------------------------------------------------------------------------

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

    async def _boot_new(self, sandbox_id: str, runtime: Any, req: CreateRequest) -> SandboxRecord:
        """Boot a new runtime and send envd's ``/init``; destroy it again on any failure."""
        try:
            await runtime.boot(timeout=self.boot_timeout)
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
            await runtime.boot(timeout=self.boot_timeout)
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
                asyncio.wait_for(runtime.destroy(), timeout=DESTROY_TIMEOUT)
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

    # -- admin ------------------------------------------------------------------------------

    async def _admin_faults_list(self, request: web.Request) -> web.StreamResponse:
        return web.json_response([f.to_json() for f in self.faults.list()])

    async def _admin_faults_arm(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return api_error(400, "body must be JSON")
        if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
            return api_error(400, 'body must be {"kind": …, …}')
        params = {k: v for k, v in body.items() if k != "kind"}
        try:
            fault = self.faults.arm(body["kind"], params)
        except FaultError as exc:
            return api_error(400, str(exc))
        return web.json_response(fault.to_json(), status=201)

    async def _admin_faults_clear(self, request: web.Request) -> web.StreamResponse:
        self.faults.clear()
        return web.Response(status=204)

    async def _admin_requests(self, request: web.Request) -> web.StreamResponse:
        entries: List[Dict[str, Any]] = [
            e
            for e in self.request_log
            if not str(e["path"]).startswith("/_emulator/")
            or e["path"] == "/_emulator/redirect-target"
        ]
        sid = request.query.get("sandbox_id")
        if sid:
            entries = [e for e in entries if e.get("sandbox_id") == sid]
        path = request.query.get("path")
        if path:
            entries = [e for e in entries if path in str(e["path"])]
        return web.json_response(entries)

    async def _admin_requests_clear(self, request: web.Request) -> web.StreamResponse:
        self.request_log.clear()
        return web.Response(status=204)

    async def _admin_sandboxes(self, request: web.Request) -> web.StreamResponse:
        out = []
        for rec in self.records.values():
            item = rec.listed_json()
            item["pauseMode"] = rec.pause_mode
            item["envdUnresponsiveAtPause"] = rec.envd_unresponsive_at_pause
            item["egress"] = rec.egress
            item["autoPause"] = rec.auto_pause
            item["envdUnresponsive"] = self.faults.is_unresponsive(rec.sandbox_id)
            item["maxProcesses"] = self.resources.max_processes
            item["enforcedLimits"] = dict(getattr(rec.runtime, "enforced_limits", {}))
            out.append(item)
        return web.json_response(out)

    async def _admin_pids(self, request: web.Request) -> web.StreamResponse:
        sid = request.match_info["sid"]
        rec = self.records.get(sid)
        runtime = rec.runtime if rec is not None else self._graveyard.get(sid)
        if runtime is None:
            return api_error(404, f"unknown sandbox {sid}")
        return web.json_response({"sandbox_id": sid, "pids": list(runtime.host_pids())})

    async def _admin_redirect_target(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"redirected": True, "method": request.method})
