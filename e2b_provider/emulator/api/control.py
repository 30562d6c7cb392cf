"""The emulator's control plane: E2B's REST API for sandbox lifecycle.

This module owns the HTTP handlers of every route the official SDK and ``e2b_provider`` call
(``e2b-protocol.md`` §2), in both the ``/v2`` and the legacy forms: create, list (metadata
filter, state filter, paging with ``x-next-token``), get, connect (200 running / 201 resumed,
``memory: false`` cold boot, 409 for a snapshot marked ``envdUnresponsiveAtPause``), pause
(full or filesystem-only), legacy resume, timeout, refreshes and delete. It validates requests,
applies the control-plane faults (``control_error``, ``control_redirect``,
``connect_conflict``, ``no_token``) and shapes E2B's answers and error bodies
(``{code, message[, error_code]}``). The lifecycle work itself (booting, freezing, halting,
destroying sandboxes) is done by the server, reached through
:class:`~.lifecycle.SandboxLifecycle`.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Awaitable, Callable, Dict, Optional

from aiohttp import web

from .lifecycle import SandboxLifecycle
from .state import (
    KNOWN_TEMPLATES,
    BadRequest,
    CreateRequest,
    SandboxRecord,
    check_idempotency_key,
    page,
    parse_bool,
    parse_create_body,
    parse_metadata_filter,
    parse_sandbox_path_id,
    parse_timeout,
    sandbox_not_found,
)

__all__ = ["ControlPlane", "api_error"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def api_error(
    status: int,
    message: str,
    error_code: Optional[str] = None,
    headers: Optional[Dict[str, str]] = None,
) -> web.Response:
    """An E2B control-plane error answer: ``{"code": status, "message": …[, "error_code"]}``."""
    body: Dict[str, Any] = {"code": status, "message": message}
    if error_code:
        body["error_code"] = error_code
    return web.json_response(body, status=status, headers=headers)


def _mark_fault(request: web.Request, kind: str) -> None:
    """Note in the request's log entry that fault ``kind`` answered it."""
    entry = request.get("log_entry")
    if isinstance(entry, dict):
        entry["fault"] = kind


async def _json_body(request: web.Request, *, optional: bool) -> Dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        if optional:
            return {}
        raise BadRequest("validation error: request body has an error: value is required")
    try:
        body = json.loads(raw)
    except ValueError:
        raise BadRequest(
            "validation error: request body has an error: doesn't match schema: invalid JSON"
        ) from None
    if not isinstance(body, dict):
        raise BadRequest("validation error: request body must be a JSON object")
    return body


class ControlPlane:
    """The control-plane handlers of one emulator server.

    Every handler may raise :class:`~.state.BadRequest`; the wrapper
    that :meth:`add_routes` puts around it turns that into E2B's error answer.
    """

    def __init__(self, server: SandboxLifecycle) -> None:
        self._server = server

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
            _mark_fault(request, "control_redirect")
            location = str(request.url.with_path("/_emulator/redirect-target").with_query(None))
            return web.Response(status=307, headers={"Location": location})
        err = faults.take("control_error", route=route)
        if err is not None:
            _mark_fault(request, "control_error")
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
        sid = parse_sandbox_path_id(request.match_info["sid"])
        rec = self._server.records.get(sid)
        if rec is None:
            raise sandbox_not_found(sid)
        return rec

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
        body = await _json_body(request, optional=False)
        spec = parse_create_body(body, default_timeout=default_timeout)
        key = check_idempotency_key(request.headers.get("Idempotency-Key"))
        if spec.template not in KNOWN_TEMPLATES:
            raise BadRequest(f"template '{spec.template}' not found", status=404)
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

    async def _do_create(self, spec: CreateRequest) -> Dict[str, Any]:
        """Boot the sandbox; its ``Sandbox`` answer body (raises ``BadRequest`` 500)."""
        return self._sandbox_body(await self._server.create_sandbox(spec))

    # -- list / get -------------------------------------------------------------------------

    async def list_v2(self, request: web.Request) -> web.StreamResponse:
        """``GET /v2/sandboxes``: metadata/state filters, ``limit``, ``nextToken`` paging."""
        q = request.query
        metadata = parse_metadata_filter(q.get("metadata"))
        states = [s for s in q.get("state", "running,paused").split(",") if s]
        for s in states:
            if s not in ("running", "paused"):
                raise BadRequest(f"invalid state {s!r}")
        try:
            limit = int(q.get("limit", "100"))
        except ValueError:
            raise BadRequest("limit must be an integer") from None
        records = [r for r in self._server.records.values() if r.matches(metadata, states)]
        chunk, token = page(
            records, limit=limit, next_token=q.get("nextToken"), order=q.get("order", "desc")
        )
        headers = {"x-next-token": token} if token else {}
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
            _mark_fault(request, "connect_conflict")
            return api_error(
                409, "Sandbox is in a transition, retry later", conflict.params.get("error_code")
            )
        rec = self._record(request)
        body = await _json_body(request, optional=default_timeout is not None)
        timeout = parse_timeout(body, "timeout", default_timeout)
        memory = parse_bool(body, "memory")
        resumed = await self._server.connect_sandbox(rec, timeout=timeout, memory=memory)
        return self._sandbox_answer(rec, 201 if resumed else 200)

    async def resume(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/resume`` (legacy): 409 when already running."""
        rec = self._record(request)
        body = await _json_body(request, optional=True)
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
        body = await _json_body(request, optional=True)
        memory = parse_bool(body, "memory")
        healthy = parse_bool(body, "requireHealthyGuest")
        await self._server.pause_sandbox(
            rec, memory=memory is not False, require_healthy_guest=bool(healthy)
        )
        return web.Response(status=204)

    async def set_timeout(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/timeout`` ``{timeout}``: end = now + timeout (may shorten)."""
        rec = self._record(request)
        body = await _json_body(request, optional=False)
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
        body = await _json_body(request, optional=True)
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
