"""The emulator's control plane: E2B's REST API for sandbox lifecycle.

This module owns the HTTP handlers of every route the official SDK and ``e2b_provider`` call
(``e2b-protocol.md`` §2), in both the ``/v2`` and the legacy forms: create, list (metadata
filter, state filter, paging with ``x-next-token``), get, connect (200 running / 201 resumed,
``memory: false`` cold boot, 409 for a snapshot marked ``envdUnresponsiveAtPause``), pause
(full or filesystem-only), legacy resume, timeout, refreshes and delete. It validates requests,
applies the control-plane faults (``control_error``, ``control_redirect``,
``connect_conflict``, ``no_token``) and shapes E2B's answers and error bodies
(``{code, message[, error_code]}``). The lifecycle work itself (booting, freezing, halting,
destroying sandboxes) is done by :class:`~e2b_provider.emulator.server.EmulatorServer`.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Any, Dict, Optional

from aiohttp import web

from .state import (
    KNOWN_TEMPLATES,
    BadRequest,
    SandboxRecord,
    check_idempotency_key,
    page,
    parse_create_body,
    parse_metadata_filter,
    parse_sandbox_path_id,
    parse_timeout,
)

if TYPE_CHECKING:
    from .server import EmulatorServer

__all__ = ["ControlPlane", "api_error"]


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


def _not_found(sandbox_id: str) -> web.Response:
    return api_error(404, f"Sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")


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


def _opt_bool(body: Dict[str, Any], name: str) -> Optional[bool]:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"validation error: field {name!r} must be a boolean")
    return value


class ControlPlane:
    """The control-plane handlers of one :class:`EmulatorServer`."""

    def __init__(self, server: EmulatorServer) -> None:
        self._server = server

    def add_routes(self, app: web.Application) -> None:
        """Register every control-plane route on ``app``."""
        r = app.router
        r.add_post("/v2/sandboxes", self.create_v2)
        r.add_post("/sandboxes", self.create_v1)
        r.add_get("/v2/sandboxes", self.list_v2, allow_head=False)
        r.add_get("/sandboxes", self.list_v1, allow_head=False)
        r.add_get("/sandboxes/{sid}", self.get, allow_head=False)
        r.add_delete("/sandboxes/{sid}", self.delete)
        r.add_post("/v2/sandboxes/{sid}/connect", self.connect_v2)
        r.add_post("/sandboxes/{sid}/connect", self.connect_v1)
        r.add_post("/sandboxes/{sid}/pause", self.pause)
        r.add_post("/sandboxes/{sid}/resume", self.resume)
        r.add_post("/sandboxes/{sid}/timeout", self.set_timeout)
        r.add_post("/sandboxes/{sid}/refreshes", self.refreshes)

    # -- helpers ----------------------------------------------------------------------------

    def _inject(self, request: web.Request, route: str) -> Optional[web.StreamResponse]:
        """Apply an armed ``control_redirect``/``control_error`` fault for ``route``."""
        faults = self._server.faults
        entry = request.get("log_entry")
        redirect = faults.take("control_redirect", route=route)
        if redirect is not None:
            if isinstance(entry, dict):
                entry["fault"] = "control_redirect"
            location = str(request.url.with_path("/_emulator/redirect-target").with_query(None))
            return web.Response(status=307, headers={"Location": location})
        err = faults.take("control_error", route=route)
        if err is not None:
            if isinstance(entry, dict):
                entry["fault"] = "control_error"
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
            raise _NotFound(sid)
        return rec

    def _sandbox_answer(self, rec: SandboxRecord, status: int) -> web.Response:
        no_token = self._server.faults.take("no_token") is not None
        body = rec.sandbox_json(domain=self._server.domain, with_token=not no_token)
        return web.json_response(body, status=status)

    # -- create -----------------------------------------------------------------------------

    async def create_v2(self, request: web.Request) -> web.StreamResponse:
        """``POST /v2/sandboxes`` (default timeout 300 s)."""
        return await self._create(request, default_timeout=300)

    async def create_v1(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes`` (legacy; default timeout 15 s)."""
        return await self._create(request, default_timeout=15)

    async def _create(self, request: web.Request, *, default_timeout: int) -> web.StreamResponse:
        injected = self._inject(request, "create")
        if injected is not None:
            return injected
        try:
            body = await _json_body(request, optional=False)
            spec = parse_create_body(body, default_timeout=default_timeout)
            key = check_idempotency_key(request.headers.get("Idempotency-Key"))
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        if spec.template not in KNOWN_TEMPLATES:
            return api_error(404, f"template '{spec.template}' not found")
        server = self._server
        if key is None:
            return await self._do_create(spec)
        fingerprint = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        known = server.idempotency.get(key)
        if known is not None:
            old_fingerprint, fut = known
            if old_fingerprint != fingerprint:
                return api_error(
                    422,
                    "Idempotency-Key was used with a different request",
                    "idempotency_request_mismatch",
                )
            if not fut.done():
                return api_error(
                    409,
                    "A request with this Idempotency-Key is still in progress",
                    "idempotency_in_progress",
                )
            status, answer = fut.result()
            return web.json_response(answer, status=status)
        fut = server.loop.create_future()
        server.remember_idempotency(key, fingerprint, fut)
        try:
            resp = await self._do_create(spec)
        except BaseException:
            server.idempotency.pop(key, None)
            fut.cancel()
            raise
        if resp.status == 201 and isinstance(resp, web.Response) and resp.text:
            fut.set_result((201, json.loads(resp.text)))
        else:
            server.idempotency.pop(key, None)
            fut.cancel()
        return resp

    async def _do_create(self, spec: Any) -> web.StreamResponse:
        try:
            rec = await self._server.create_sandbox(spec)
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        return self._sandbox_answer(rec, 201)

    # -- list / get -------------------------------------------------------------------------

    async def list_v2(self, request: web.Request) -> web.StreamResponse:
        """``GET /v2/sandboxes``: metadata/state filters, ``limit``, ``nextToken`` paging."""
        injected = self._inject(request, "list")
        if injected is not None:
            return injected
        q = request.query
        try:
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
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        headers = {"x-next-token": token} if token else {}
        return web.json_response([r.listed_json() for r in chunk], headers=headers)

    async def list_v1(self, request: web.Request) -> web.StreamResponse:
        """``GET /sandboxes`` (legacy): running sandboxes only, no paging."""
        injected = self._inject(request, "list")
        if injected is not None:
            return injected
        try:
            metadata = parse_metadata_filter(request.query.get("metadata"))
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        records = sorted(
            (r for r in self._server.records.values() if r.matches(metadata, ("running",))),
            key=lambda r: (r.started_at, r.sandbox_id),
            reverse=True,
        )
        return web.json_response([r.listed_json() for r in records])

    async def get(self, request: web.Request) -> web.StreamResponse:
        """``GET /sandboxes/{id}``: the ``SandboxDetail``."""
        injected = self._inject(request, "get")
        if injected is not None:
            return injected
        try:
            rec = self._record(request)
        except BadRequest as exc:
            return api_error(exc.status, exc.message)
        except _NotFound as exc:
            return _not_found(exc.sandbox_id)
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
        injected = self._inject(request, "connect")
        if injected is not None:
            return injected
        conflict = self._server.faults.take("connect_conflict")
        if conflict is not None:
            entry = request.get("log_entry")
            if isinstance(entry, dict):
                entry["fault"] = "connect_conflict"
            return api_error(
                409, "Sandbox is in a transition, retry later", conflict.params.get("error_code")
            )
        try:
            rec = self._record(request)
            body = await _json_body(request, optional=default_timeout is not None)
            timeout = parse_timeout(body, "timeout", default_timeout)
            memory = _opt_bool(body, "memory")
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        except _NotFound as exc:
            return _not_found(exc.sandbox_id)
        try:
            resumed = await self._server.connect_sandbox(rec, timeout=timeout, memory=memory)
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        return self._sandbox_answer(rec, 201 if resumed else 200)

    async def resume(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/resume`` (legacy): 409 when already running."""
        injected = self._inject(request, "connect")
        if injected is not None:
            return injected
        try:
            rec = self._record(request)
            body = await _json_body(request, optional=True)
            timeout = parse_timeout(body, "timeout", 15)
            memory = _opt_bool(body, "memory")
            auto_pause = _opt_bool(body, "autoPause")
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        except _NotFound as exc:
            return _not_found(exc.sandbox_id)
        if rec.state == "running":
            return api_error(409, f"Sandbox {rec.sandbox_id} is already running")
        if auto_pause is not None:
            rec.auto_pause = auto_pause
        try:
            await self._server.connect_sandbox(rec, timeout=timeout, memory=memory)
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        return self._sandbox_answer(rec, 201)

    # -- pause / timeout / refreshes / delete -----------------------------------------------

    async def pause(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/pause`` with ``{memory?, requireHealthyGuest?}``: 204."""
        injected = self._inject(request, "pause")
        if injected is not None:
            return injected
        try:
            rec = self._record(request)
            body = await _json_body(request, optional=True)
            memory = _opt_bool(body, "memory")
            healthy = _opt_bool(body, "requireHealthyGuest")
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        except _NotFound as exc:
            return _not_found(exc.sandbox_id)
        try:
            await self._server.pause_sandbox(
                rec, memory=memory is not False, require_healthy_guest=bool(healthy)
            )
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        return web.Response(status=204)

    async def set_timeout(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/timeout`` ``{timeout}``: end = now + timeout (may shorten)."""
        injected = self._inject(request, "timeout")
        if injected is not None:
            return injected
        try:
            rec = self._record(request)
            body = await _json_body(request, optional=False)
            value = body.get("timeout")
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadRequest("validation error: field 'timeout' must be an integer")
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        except _NotFound as exc:
            return _not_found(exc.sandbox_id)
        if rec.state != "running":
            return _not_found(rec.sandbox_id)
        rec.end_at = time.time() + max(0, min(value, 24 * 3600))
        return web.Response(status=204)

    async def refreshes(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/refreshes`` ``{duration?}``: extend-only keep-alive."""
        injected = self._inject(request, "refreshes")
        if injected is not None:
            return injected
        try:
            rec = self._record(request)
            body = await _json_body(request, optional=True)
            value = body.get("duration", 15)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 3600:
                raise BadRequest("duration must be an integer between 0 and 3600")
        except BadRequest as exc:
            return api_error(exc.status, exc.message, exc.error_code)
        except _NotFound as exc:
            return _not_found(exc.sandbox_id)
        if rec.state != "running":
            return _not_found(rec.sandbox_id)
        rec.extend_to(time.time() + value)
        return web.Response(status=204)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        """``DELETE /sandboxes/{id}``: 204, or 404 when unknown."""
        injected = self._inject(request, "delete")
        if injected is not None:
            return injected
        try:
            rec = self._record(request)
        except BadRequest as exc:
            return api_error(exc.status, exc.message)
        except _NotFound as exc:
            return _not_found(exc.sandbox_id)
        if not await self._server.kill_sandbox(rec):
            return _not_found(rec.sandbox_id)
        return web.Response(status=204)


class _NotFound(Exception):
    def __init__(self, sandbox_id: str) -> None:
        super().__init__(sandbox_id)
        self.sandbox_id = sandbox_id
