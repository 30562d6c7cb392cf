"""Control-plane routes for snapshots, forks and templates.

This module owns the handlers of ``POST /sandboxes/{id}/snapshots`` (a snapshot template build
from a running sandbox: frozen, its files copied, thawed; named ``local/<name>[:tag]`` or an
unnamed template id), ``GET /snapshots`` (filters ``sandboxID`` and ``name``, paging),
``DELETE /templates/{id}`` (deletes a snapshot template; how the SDK deletes a snapshot),
``GET /templates/aliases/{alias}`` (200 for the team's snapshot names, 403 for E2B's public
``base``, 404 otherwise) and ``POST /sandboxes/{id}/fork`` (``count`` sandboxes booted from one
copy of the source's files; the source is frozen for the copy and keeps running).

In the emulator a snapshot or a fork holds files only: a sandbox created from a snapshot or
forked boots cold on a copy of them (fresh processes, empty memory, its own boot), also for a
``memory: true`` ("full") snapshot.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from aiohttp import web

from .errors import BadRequest
from .lifecycle import SandboxLifecycle
from .listing import page, parse_page_request
from .names import DEFAULT_TAG, TEAM_SLUG, parse_name, split_namespace
from .routing import Router, json_body, sandbox_record
from .state import (
    CreateRequest,
    SandboxRecord,
    epoch_us,
    parse_bool,
    parse_sandbox_path_id,
    parse_timeout,
)
from .templates import SnapshotBuild, SnapshotTemplate

__all__ = ["SnapshotRoutes"]

#: The most sandboxes one fork request creates (E2B's limit; the SDK allows 1 to 20).
MAX_FORK_COUNT = 100
#: A fork's default timeout in seconds.
FORK_TIMEOUT_SECONDS = 15


def _parse_team_name(raw: str, what: str) -> Tuple[str, Optional[str]]:
    """Parse a template name of the team: ``(identifier, tag)``.

    Raises:
        BadRequest: 400 for a malformed name or another team's namespace.
    """
    identifier, tag = parse_name(raw, what)
    namespace, _ = split_namespace(identifier)
    if namespace is not None and namespace != TEAM_SLUG:
        raise BadRequest(f"namespace '{namespace}' must match your team '{TEAM_SLUG}'")
    return identifier, tag


def _snapshot_json(tpl: SnapshotTemplate, build: SnapshotBuild) -> Dict[str, Any]:
    return {"snapshotID": tpl.snapshot_id(build.tag), "names": tpl.names}


class SnapshotRoutes:
    """The snapshot, fork and template handlers of one emulator server.

    Args:
        server: the server's sandbox table and lifecycle.
        sandbox_body: renders a sandbox's ``Sandbox`` answer (as create does).
    """

    def __init__(
        self, server: SandboxLifecycle, sandbox_body: Callable[[SandboxRecord], Dict[str, Any]]
    ) -> None:
        self._server = server
        self._sandbox_body = sandbox_body

    def add_routes(self, app: web.Application, route: Router) -> None:
        """Register the routes on ``app``, each wrapped by ``route``."""
        r = app.router
        r.add_post("/sandboxes/{sid}/snapshots", route("snapshot", self.create_snapshot))
        r.add_post("/sandboxes/{sid}/fork", route("fork", self.fork))
        r.add_get("/snapshots", route("snapshots", self.list_snapshots), allow_head=False)
        r.add_get(
            "/templates/aliases/{alias}", route("template", self.alias), allow_head=False
        )
        r.add_delete("/templates/{tid}", route("template", self.delete_template))

    def _new_files_dir(self, prefix: str) -> str:
        return os.path.join(self._server.snapshots_dir, f"{prefix}{uuid.uuid4().hex}")

    # -- snapshots ---------------------------------------------------------------------------

    async def create_snapshot(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/snapshots`` ``{name?, memory?}``: 201 ``SnapshotInfo``."""
        parse_sandbox_path_id(request.match_info["sid"])
        body = await json_body(request, optional=False)
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise BadRequest("validation error: field 'name' must be a string")
        memory = parse_bool(body, "memory")
        alias: Optional[str] = None
        tag: Optional[str] = None
        if name is not None:
            identifier, tag = _parse_team_name(name, "Invalid name")
            alias = split_namespace(identifier)[1]
        rec = sandbox_record(self._server, request)
        dest = self._new_files_dir("")
        await self._server.snapshot_files(rec, dest, fork=False)
        tpl, build, replaced = self._server.templates.add_build(
            alias,
            tag,
            files_dir=dest,
            source_sandbox_id=rec.sandbox_id,
            memory=memory is not False,
        )
        if replaced is not None:
            await self._server.remove_files(replaced.files_dir)
        return web.json_response(_snapshot_json(tpl, build), status=201)

    async def list_snapshots(self, request: web.Request) -> web.StreamResponse:
        """``GET /snapshots?sandboxID&name&limit&nextToken``: the team's snapshot builds,
        newest first, with ``X-Next-Token`` paging."""
        query = request.query
        req = parse_page_request(query)
        source: Optional[str] = None
        if query.get("sandboxID") is not None:
            source = parse_sandbox_path_id(query["sandboxID"])
        items = self._server.templates.builds()
        raw_name = query.get("name")
        if raw_name is not None:
            identifier, tag = _parse_team_name(raw_name, "Invalid name")
            tpl = self._server.templates.find(identifier)
            if tpl is None:
                return web.json_response([])
            wanted_tag = (tag or DEFAULT_TAG) if ":" in raw_name else None
            items = [
                (t, b)
                for t, b in items
                if t is tpl and (wanted_tag is None or b.tag == wanted_tag)
            ]
        if source is not None:
            items = [(t, b) for t, b in items if b.source_sandbox_id == source]

        def key(item: Tuple[SnapshotTemplate, SnapshotBuild]) -> Tuple[int, str]:
            return epoch_us(item[1].created_at), item[1].build_id

        chunk, token = page(items, key, req)
        headers = {"X-Next-Token": token} if token else {}
        return web.json_response([_snapshot_json(t, b) for t, b in chunk], headers=headers)

    async def delete_template(self, request: web.Request) -> web.StreamResponse:
        """``DELETE /templates/{id}`` (id, ``[local/]name``; a tag is ignored): deletes a
        snapshot template with every build; 204, 404 unknown, 403 for ``base``."""
        raw = request.match_info["tid"]
        if raw == "tags":  # E2B's DELETE /templates/tags (template build tags): not emulated
            raise BadRequest("validation error: no matching operation was found", status=404)
        identifier, _ = parse_name(raw, "Invalid template ID")
        templates = self._server.templates
        if templates.is_base(identifier):
            raise BadRequest(f"you don't have access to template '{identifier}'", status=403)
        tpl = templates.find(identifier)
        if tpl is None:
            raise BadRequest(f"template '{identifier}' not found", status=404)
        for build in templates.remove(tpl):
            await self._server.remove_files(build.files_dir)
        return web.Response(status=204)

    async def alias(self, request: web.Request) -> web.StreamResponse:
        """``GET /templates/aliases/{alias}``: ``{templateID, public}`` for the team's own
        names; 403 for E2B's public ``base``; 404 for an unknown name or tag."""
        raw = request.match_info["alias"]
        identifier, tag = _parse_team_name(raw, "Invalid alias format")
        templates = self._server.templates
        if templates.is_base(identifier):
            raise BadRequest("You don't have access to this template alias", status=403)
        tpl = templates.find(identifier, by_id=False)
        if tpl is None:
            raise BadRequest(f"template '{identifier}' not found", status=404)
        if ":" in raw and (tag or DEFAULT_TAG) not in tpl.builds:
            raise BadRequest(
                f"tag '{tag or DEFAULT_TAG}' does not exist for template '{identifier}'",
                status=404,
            )
        return web.json_response({"templateID": tpl.template_id, "public": False})

    # -- fork --------------------------------------------------------------------------------

    async def fork(self, request: web.Request) -> web.StreamResponse:
        """``POST /sandboxes/{id}/fork`` ``{timeout?, count?}``: 201, one result per fork
        (``{"sandbox": Sandbox}`` or ``{"error": {code, message}}``)."""
        rec = sandbox_record(self._server, request)
        body = await json_body(request, optional=True)
        timeout = parse_timeout(body, "timeout", FORK_TIMEOUT_SECONDS)
        count = body.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int):
            raise BadRequest("validation error: field 'count' must be an integer")
        if count < 1:
            raise BadRequest("Count must be at least 1")
        if count > MAX_FORK_COUNT:
            raise BadRequest(f"Count cannot be greater than {MAX_FORK_COUNT}")
        files = self._new_files_dir("fork-")
        await self._server.snapshot_files(rec, files, fork=True)
        spec = CreateRequest(
            template=rec.template_id,
            timeout=timeout,
            auto_pause=rec.auto_pause,
            auto_pause_memory=rec.auto_pause_memory,
            metadata=dict(rec.metadata),
            env_vars=dict(rec.env_vars),
            egress=rec.egress,
            allow_hosts=rec.allow_hosts,
            allow_internet_access=rec.allow_internet_access,
            network=rec.network,
            alias=rec.alias,
            files_from=files,
            volume_mounts=rec.volume_mounts,
        )
        try:
            results = await asyncio.gather(
                *(self._server.create_sandbox(spec) for _ in range(count)), return_exceptions=True
            )
        finally:
            await asyncio.shield(self._server.remove_files(files))
        out: List[Dict[str, Any]] = []
        for result in results:
            if isinstance(result, SandboxRecord):
                out.append({"sandbox": self._sandbox_body(result)})
            elif isinstance(result, BadRequest):
                out.append({"error": {"code": result.status, "message": result.message}})
            elif isinstance(result, Exception):
                out.append({"error": {"code": 500, "message": "Error forking sandbox"}})
            else:
                raise result
        return web.json_response(out, status=201)
