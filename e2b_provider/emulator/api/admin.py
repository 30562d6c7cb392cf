"""The emulator's admin routes under ``/_emulator/`` (API key required).

This module owns the handlers of the routes tests and tools use to steer and inspect the
emulator: arm, list and clear faults (``/_emulator/faults``), read and clear the request log
(``/_emulator/requests``, filtered by sandbox id or path), list sandboxes with their pause
mode, limits and faults (``/_emulator/sandboxes``), a sandbox's host pids (also of a recently
killed one: ``/_emulator/sandboxes/{sid}/pids``) and a redirect target for the
``control_redirect`` fault.
"""

from __future__ import annotations

from typing import Any, Dict, List

from aiohttp import web

from .faults import FaultError
from .routing import api_error
from .sandboxes import SandboxHost

__all__ = ["AdminRoutes"]


class AdminRoutes:
    """The ``/_emulator/`` routes of one emulator.

    Args:
        host: the sandboxes, faults and request log they show and steer.
    """

    def __init__(self, host: SandboxHost) -> None:
        self._host = host

    def add_routes(self, app: web.Application) -> None:
        """Register the admin routes on ``app``."""
        r = app.router
        r.add_get("/_emulator/faults", self._faults_list, allow_head=False)
        r.add_post("/_emulator/faults", self._faults_arm)
        r.add_delete("/_emulator/faults", self._faults_clear)
        r.add_get("/_emulator/requests", self._requests, allow_head=False)
        r.add_delete("/_emulator/requests", self._requests_clear)
        r.add_get("/_emulator/sandboxes", self._sandboxes, allow_head=False)
        r.add_get("/_emulator/sandboxes/{sid}/pids", self._pids, allow_head=False)
        r.add_route("*", "/_emulator/redirect-target", self._redirect_target)

    async def _faults_list(self, request: web.Request) -> web.StreamResponse:
        return web.json_response([f.to_json() for f in self._host.faults.list()])

    async def _faults_arm(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return api_error(400, "body must be JSON")
        if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
            return api_error(400, 'body must be {"kind": …, …}')
        params = {k: v for k, v in body.items() if k != "kind"}
        try:
            fault = self._host.faults.arm(body["kind"], params)
        except FaultError as exc:
            return api_error(400, str(exc))
        return web.json_response(fault.to_json(), status=201)

    async def _faults_clear(self, request: web.Request) -> web.StreamResponse:
        self._host.faults.clear()
        return web.Response(status=204)

    async def _requests(self, request: web.Request) -> web.StreamResponse:
        entries: List[Dict[str, Any]] = [
            e
            for e in self._host.request_log.entries
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

    async def _requests_clear(self, request: web.Request) -> web.StreamResponse:
        self._host.request_log.clear()
        return web.Response(status=204)

    async def _sandboxes(self, request: web.Request) -> web.StreamResponse:
        out = []
        for rec in self._host.records.values():
            item = rec.listed_json()
            item["pauseMode"] = rec.pause_mode
            item["envdUnresponsiveAtPause"] = rec.envd_unresponsive_at_pause
            item["egress"] = rec.egress
            item["autoPause"] = rec.auto_pause
            item["envdUnresponsive"] = self._host.faults.is_unresponsive(rec.sandbox_id)
            item["maxProcesses"] = self._host.resources.max_processes
            item["enforcedLimits"] = dict(getattr(rec.runtime, "enforced_limits", {}))
            out.append(item)
        return web.json_response(out)

    async def _pids(self, request: web.Request) -> web.StreamResponse:
        sid = request.match_info["sid"]
        runtime = self._host.runtime_of(sid)
        if runtime is None:
            return api_error(404, f"unknown sandbox {sid}")
        return web.json_response({"sandbox_id": sid, "pids": list(runtime.host_pids())})

    async def _redirect_target(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"redirected": True, "method": request.method})
