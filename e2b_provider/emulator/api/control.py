"""The emulator's control plane: E2B's REST API for sandbox lifecycle.

This module owns the HTTP handlers of every route the official SDK and ``e2b_provider`` call
(``e2b-protocol.md`` §2), in both the ``/v2`` and the legacy forms: create, list (metadata
filter, state filter, paging with ``x-next-token``), get, connect (200 running / 201 resumed,
``memory: false`` cold boot, 409 for a snapshot marked ``envdUnresponsiveAtPause``), pause
(full or filesystem-only), legacy resume, timeout, refreshes and delete. It validates requests,
applies the control-plane faults (``control_error``, ``control_redirect``,
``connect_conflict``, ``no_token``) and shapes E2B's answers and error bodies
(``{code, message[, error_code]}``), metrics and logs. List queries are :mod:`.listing`'s,
network settings :mod:`.network`'s, log entries :mod:`.logs`'. The lifecycle work itself
(booting, freezing, halting, destroying sandboxes) is done by the server, reached through
:class:`~.lifecycle.SandboxLifecycle`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any, Dict, List, Optional

import attrs
from aiohttp import web

from .errors import BadRequest, query_error
from .lifecycle import SandboxLifecycle
from .listing import page, parse_list_query
from .logs import LogEntry, LogQuery, parse_v1_query, parse_v2_query, select
from .names import parse_name
from .network import egress_mode, parse_network_update
from .routing import (
    Handler,
    api_error,
    find_record,
    json_body,
    mark_fault,
    sandbox_record,
)
from .snapshots import SnapshotRoutes
from .state import (
    CreateRequest,
    SandboxRecord,
    check_idempotency_key,
    parse_bool,
    parse_create_body,
    parse_metadata_filter,
    parse_sandbox_path_id,
    parse_timeout,
    sandbox_not_found,
)
from .volumes import VolumeRoutes, VolumeStore

__all__ = ["ControlPlane"]

#: The most sandboxes ``GET /sandboxes/metrics`` answers for.
MAX_METRICS_SANDBOXES = 100


class ControlPlane:
    """The control-plane handlers of one emulator server.

    Every handler may raise :class:`~.state.BadRequest`; the wrapper
    that :meth:`add_routes` puts around it turns that into E2B's error answer.
    """

    def __init__(self, server: SandboxLifecycle, volumes: VolumeStore) -> None:
        self._server = server
        self._volumes = volumes
        self._snapshots = SnapshotRoutes(server, self._sandbox_body)
        self._volume_routes = VolumeRoutes(server, volumes)

    def add_routes(self, app: web.Application) -> None:
        """Register every control-plane route on ``app``."""
        r = app.router
        r.add_post("/v2/sandboxes", self._route("create", self.create_v2))
        r.add_post("/sandboxes", self._route("create", self.create_v1))
        r.add_get("/v2/sandboxes", self._route("list", self.list_v2), allow_head=False)
        r.add_get("/sandboxes", self._route("list", self.list_v1), allow_head=False)
        r.add_get("/sandboxes/{sid}", self._route("get", self.get), allow_head=False)
        r.add_delete("/sandboxes/{sid}", self._route("delete", self.delete))
        r.add_post("/v2/sandboxes/{sid}/connect", self._route("connect", self.connect_v2))
        r.add_post("/sandboxes/{sid}/connect", self._route("connect", self.connect_v1))
        r.add_post("/sandboxes/{sid}/pause", self._route("pause", self.pause))
        r.add_post("/sandboxes/{sid}/resume", self._route("connect", self.resume))
        r.add_post("/sandboxes/{sid}/timeout", self._route("timeout", self.set_timeout))
        r.add_post("/sandboxes/{sid}/refreshes", self._route("refreshes", self.refreshes))
        r.add_put("/sandboxes/{sid}/network", self._route("network", self.update_network))
        r.add_get("/sandboxes/metrics", self._route("metrics", self.metrics_many), allow_head=False)
        r.add_get(
            "/sandboxes/{sid}/metrics", self._route("metrics", self.metrics), allow_head=False
        )
        r.add_get("/sandboxes/{sid}/logs", self._route("logs", self.logs_v1), allow_head=False)
        r.add_get(
            "/v2/sandboxes/{sid}/logs", self._route("logs", self.logs_v2), allow_head=False
        )
        self._snapshots.add_routes(app, self._route)
        self._volume_routes.add_routes(app, self._route)

    # -- helpers ----------------------------------------------------------------------------

    def _route(self, route: str, handler: Handler) -> Handler:
        """Wrap ``handler``: armed faults of ``route`` first, then ``BadRequest`` → answer."""

        async def serve(request: web.Request) -> web.StreamResponse:
            injected = self._inject(request, route)
            if injected is not None:
                return injected
            try:
                return await handler(request)
            except BadRequest as exc:
                return api_error(exc.status, exc.message, exc.error_code)

        return serve

    def _inject(self, request: web.Request, route: str) -> Optional[web.StreamResponse]:
        """Apply an armed ``control_redirect``/``control_error`` fault for ``route``."""
        faults = self._server.faults
        redirect = faults.take("control_redirect", route=route)
        if redirect is not None:
            mark_fault(request, "control_redirect")
            location = str(request.url.with_path("/_emulator/redirect-target").with_query(None))
            return web.Response(status=307, headers={"Location": location})
        err = faults.take("control_error", route=route)
        if err is not None:
            mark_fault(request, "control_error")
            headers = {}
            if err.params.get("retry_after") is not None:
                headers["Retry-After"] = f"{err.params['retry_after']:g}"
            return api_error(
                int(err.params["status"]),
                "injected fault",
                err.params.get("error_code"),
                headers=headers,
            )
        return None

    def _record(self, request: web.Request) -> SandboxRecord:
        return sandbox_record(self._server, request)

    def _sandbox_body(self, rec: SandboxRecord) -> Dict[str, Any]:
        no_token = self._server.faults.take("no_token") is not None
        return rec.sandbox_json(domain=self._server.domain, with_token=not no_token)

    def _sandbox_answer(self, rec: SandboxRecord, status: int) -> web.Response:
        return web.json_response(self._sandbox_body(rec), status=status)

    # -- create -----------------------------------------------------------------------------

    async def create_v2(self, request: web.Request) -> web.StreamResponse:
        """``POST /v2/sandboxes`` (default timeout 300 s)."""
        return await self._create(request, default_timeout=300)

    async def create_v1(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes`` (legacy; default timeout 15 s)."""
        return await self._create(request, default_timeout=15)

    async def _create(self, request: web.Request, *, default_timeout: int) -> web.StreamResponse:
        body = await json_body(request, optional=False)
        spec = parse_create_body(body, default_timeout=default_timeout)
        key = check_idempotency_key(request.headers.get("Idempotency-Key"))
        spec = self._resolve_template(spec)
        spec = attrs.evolve(spec, volume_mounts=self._volumes.resolve_mounts(spec.volume_mounts))
        server = self._server
        if key is None:
            return web.json_response(await self._do_create(spec), status=201)
        fingerprint = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        known = server.idempotency.get(key)
        if known is not None:
            old_fingerprint, fut = known
            if old_fingerprint != fingerprint:
                raise BadRequest(
                    "Idempotency-Key was used with a different request",
                    status=422,
                    error_code="idempotency_request_mismatch",
                )
            if not fut.done():
                raise BadRequest(
                    "A request with this Idempotency-Key is still in progress",
                    status=409,
                    error_code="idempotency_in_progress",
                )
            status, answer = fut.result()
            return web.json_response(answer, status=status)
        fut = server.loop.create_future()
        server.remember_idempotency(key, fingerprint, fut)
        try:
            answer = await self._do_create(spec)
        except BaseException:
            server.idempotency.pop(key, None)
            fut.cancel()
            raise
        fut.set_result((201, answer))
        return web.json_response(answer, status=201)

    def _resolve_template(self, spec: CreateRequest) -> CreateRequest:
        """Resolve ``templateID`` (``base``, or a snapshot ``[local/]name-or-id[:tag]``).

        Raises:
            BadRequest: 400 for a malformed name, 404 for an unknown template or tag.
        """
        identifier, tag = parse_name(spec.template, "Invalid template ID")
        found = self._server.templates.resolve(identifier, tag)
        return attrs.evolve(
            spec,
            template=found.template_id,
            alias=found.alias,
            files_from=found.build.files_dir if found.build is not None else None,
            without=found.without,
            services=found.services,
        )

    async def _do_create(self, spec: CreateRequest) -> Dict[str, Any]:
        """Boot the sandbox; its ``Sandbox`` answer body (raises ``BadRequest`` 500)."""
        return self._sandbox_body(await self._server.create_sandbox(spec))

    # -- list / get -------------------------------------------------------------------------

    async def list_v2(self, request: web.Request) -> web.StreamResponse:
        """``GET /v2/sandboxes``: metadata, state, ``startedAfter`` and template filters,
        ``order``, ``limit`` and ``nextToken`` paging; ``X-Total-Running`` when running
        sandboxes were asked for (all that match, before paging)."""
        query = parse_list_query(request.query)
        headers: Dict[str, str] = {}
        template_id: Optional[str] = None
        if query.template is not None:
            templates = self._server.templates
            if templates.is_base(query.template):
                template_id = "base"
            else:
                found = templates.find(query.template)
                if found is None:
                    if "running" in query.states:
                        headers["X-Total-Running"] = "0"
                    return web.json_response([], headers=headers)
                template_id = found.template_id
        records = [
            r
            for r in self._server.records.values()
            if r.matches(query.metadata, query.states)
            and (template_id is None or r.template_id == template_id)
            and (query.started_after_us is None or r.list_key()[0] >= query.started_after_us)
        ]
        if "running" in query.states:
            running = sum(1 for r in records if r.state == "running")
            headers["X-Total-Running"] = str(running)
        chunk, token = page(records, SandboxRecord.list_key, query.page)
        if token:
            headers["X-Next-Token"] = token
        return web.json_response([r.listed_json() for r in chunk], headers=headers)

    async def list_v1(self, request: web.Request) -> web.StreamResponse:
        """``GET /sandboxes`` (legacy): running sandboxes only, no paging."""
        metadata = parse_metadata_filter(request.query.get("metadata"))
        records = sorted(
            (r for r in self._server.records.values() if r.matches(metadata, ("running",))),
            key=lambda r: (r.started_at, r.sandbox_id),
            reverse=True,
        )
        return web.json_response([r.listed_json() for r in records])

    async def get(self, request: web.Request) -> web.StreamResponse:
        """``GET /sandboxes/{id}``: the ``SandboxDetail``."""
        rec = self._record(request)
        return web.json_response(rec.detail_json(domain=self._server.domain))

    # -- connect / resume -------------------------------------------------------------------

    async def connect_v2(self, request: web.Request) -> web.StreamResponse:
        """``POST /v2/sandboxes/{id}/connect`` (body optional; timeout default 300 s)."""
        return await self._connect(request, default_timeout=300)

    async def connect_v1(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/connect`` (legacy; ``timeout`` required)."""
        return await self._connect(request, default_timeout=None)

    async def _connect(
        self, request: web.Request, *, default_timeout: Optional[int]
    ) -> web.StreamResponse:
        conflict = self._server.faults.take("connect_conflict")
        if conflict is not None:
            mark_fault(request, "connect_conflict")
            return api_error(
                409, "Sandbox is in a transition, retry later", conflict.params.get("error_code")
            )
        rec = self._record(request)
        body = await json_body(request, optional=default_timeout is not None)
        timeout = parse_timeout(body, "timeout", default_timeout)
        memory = parse_bool(body, "memory")
        resumed = await self._server.connect_sandbox(rec, timeout=timeout, memory=memory)
        return self._sandbox_answer(rec, 201 if resumed else 200)

    async def resume(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/resume`` (legacy): 409 when already running."""
        rec = self._record(request)
        body = await json_body(request, optional=True)
        timeout = parse_timeout(body, "timeout", 15)
        memory = parse_bool(body, "memory")
        auto_pause = parse_bool(body, "autoPause")
        if rec.state == "running":
            raise BadRequest(f"Sandbox {rec.sandbox_id} is already running", status=409)
        if auto_pause is not None:
            rec.auto_pause = auto_pause
        await self._server.connect_sandbox(rec, timeout=timeout, memory=memory)
        return self._sandbox_answer(rec, 201)

    # -- pause / timeout / refreshes / delete -----------------------------------------------

    async def pause(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/pause`` with ``{memory?, requireHealthyGuest?}``: 204."""
        rec = self._record(request)
        body = await json_body(request, optional=True)
        memory = parse_bool(body, "memory")
        healthy = parse_bool(body, "requireHealthyGuest")
        await self._server.pause_sandbox(
            rec, memory=memory is not False, require_healthy_guest=bool(healthy)
        )
        return web.Response(status=204)

    async def set_timeout(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/timeout`` ``{timeout}``: end = now + timeout (may shorten)."""
        rec = self._record(request)
        body = await json_body(request, optional=False)
        value = body.get("timeout")
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest("validation error: field 'timeout' must be an integer")
        if rec.state != "running":
            raise sandbox_not_found(rec.sandbox_id)
        rec.end_at = time.time() + max(0, min(value, 24 * 3600))
        return web.Response(status=204)

    async def refreshes(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/refreshes`` ``{duration?}``: extend-only keep-alive."""
        rec = self._record(request)
        body = await json_body(request, optional=True)
        value = body.get("duration", 15)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 3600:
            raise BadRequest("duration must be an integer between 0 and 3600")
        if rec.state != "running":
            raise sandbox_not_found(rec.sandbox_id)
        rec.extend_to(time.time() + value)
        return web.Response(status=204)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        """``DELETE /sandboxes/{id}``: 204, or 404 when unknown."""
        rec = self._record(request)
        if not await self._server.kill_sandbox(rec):
            raise sandbox_not_found(rec.sandbox_id)
        return web.Response(status=204)

    # -- network / metrics ------------------------------------------------------------------

    async def update_network(self, request: web.Request) -> web.StreamResponse:
        """``PUT /sandboxes/{id}/network``: replace a running sandbox's egress settings (an
        omitted field is cleared); 204. Recorded only: sandboxes have loopback alone."""
        rec = self._record(request)
        body = await json_body(request, optional=False)
        network, allow_internet = parse_network_update(body, rec.network)
        async with rec.lock:
            if self._server.records.get(rec.sandbox_id) is not rec or rec.state != "running":
                raise sandbox_not_found(rec.sandbox_id)
            rec.network = network
            if allow_internet is not None:
                rec.allow_internet_access = allow_internet
            rec.egress, rec.allow_hosts = egress_mode(network, rec.allow_internet_access)
        return web.Response(status=204)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        """``GET /sandboxes/{id}/metrics?start&end``: the sandbox's samples in the interval
        (unix seconds; default: since it started), a fresh one taken when it runs."""
        rec = self._record(request)
        bounds: List[Optional[int]] = []
        for name in ("start", "end"):
            raw = request.query.get(name)
            value: Optional[int] = None
            if raw is not None:
                try:
                    value = int(raw)
                except ValueError:
                    value = -1
                if value < 0:
                    raise query_error(name, "number must be at least 0")
            bounds.append(value)
        await self._server.sample_metrics(rec)
        start = bounds[0] if bounds[0] is not None else int(rec.started_at)
        samples = self._server.metrics.samples(rec.sandbox_id, start, bounds[1])
        return web.json_response([s.to_json() for s in samples])

    async def metrics_many(self, request: web.Request) -> web.StreamResponse:
        """``GET /sandboxes/metrics?sandbox_ids=a,b``: the latest sample of each running
        sandbox named (unknown ones left out), ``{"sandboxes": {id: SandboxMetric}}``."""
        raw = request.query.get("sandbox_ids")
        if raw is None:
            raise query_error("sandbox_ids", "value is required but missing")
        ids = [i for i in raw.split(",") if i]
        if len(ids) > MAX_METRICS_SANDBOXES:
            raise BadRequest(
                f"Too many sandboxes requested, maximum is {MAX_METRICS_SANDBOXES}"
            )
        records = []
        for raw_id in ids:
            try:
                records.append(find_record(self._server, raw_id))
            except BadRequest as exc:
                if exc.status != 404:
                    raise
        await asyncio.gather(*(self._server.sample_metrics(r) for r in records))
        out: Dict[str, Any] = {}
        for rec in records:
            latest = self._server.metrics.latest(rec.sandbox_id)
            if rec.state == "running" and latest is not None:
                out[rec.sandbox_id] = latest.to_json()
        return web.json_response({"sandboxes": out})

    # -- logs -------------------------------------------------------------------------------

    def _log_entries(self, request: web.Request, query: LogQuery) -> List[LogEntry]:
        """The entries ``query`` selects from the logs of the sandbox the path names: running,
        paused or recently killed (404 for any other id)."""
        sid = parse_sandbox_path_id(request.match_info["sid"])
        rec = self._server.records.get(sid)
        if rec is not None:
            output = getattr(rec.runtime, "output", None)
            lines = [] if output is None else output.lines()
        else:
            kept = self._server.killed_logs.lines(sid)
            if kept is None:
                raise sandbox_not_found(sid)
            lines = kept
        return select(lines, query)

    async def logs_v1(self, request: web.Request) -> web.StreamResponse:
        """``GET /sandboxes/{id}/logs?start&limit``: ``{logs, logEntries}``, oldest first."""
        query = parse_v1_query(request.query, int(time.time() * 1000))
        found = self._log_entries(request, query)
        return web.json_response(
            {
                "logs": [e.line_json() for e in found],
                "logEntries": [e.entry_json() for e in found],
            }
        )

    async def logs_v2(self, request: web.Request) -> web.StreamResponse:
        """``GET /v2/sandboxes/{id}/logs?cursor&limit&direction&level&search``: ``{logs}``
        (newest first unless ``direction=forward``)."""
        query = parse_v2_query(request.query, int(time.time() * 1000))
        found = self._log_entries(request, query)
        return web.json_response({"logs": [e.entry_json() for e in found]})
