"""E2B's volume content API: a volume's files over HTTP, with the volume's bearer token.

This module owns the handlers under ``/volumecontent/{volume id}/``: ``GET dir`` (list,
``depth`` 1 to 10), ``POST dir`` (make a directory; ``force`` makes parents and accepts an
existing one), ``GET path`` (stat), ``PATCH path`` (``{uid, gid, mode}``), ``DELETE path``,
``GET file`` (streamed download) and ``PUT file`` (streamed upload; ``force`` overwrites and
makes parents, else an existing file is 409). Each request carries ``Authorization: Bearer
<token>`` (the token ``GET /volumes/{id}`` answers; 401 without a valid one, no API key).
Errors are ``{code, message}`` with E2B's codes (``path_not_found``, ``path_already_exists``,
``invalid_request``, …). The SDK sends these to ``E2B_VOLUME_API_URL``, which the emulator's
environment lines point at the emulator itself. Files are reached through
:class:`~.volume_files.VolumeRoot`, off the event loop.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, TypeVar

from aiohttp import web

from .errors import BadRequest
from .lifecycle import SandboxLifecycle
from .routing import Handler, json_body
from .volume_files import VolumeError, VolumeRoot
from .volumes import VolumeStore

__all__ = ["VolumeContentRoutes", "content_error"]

T = TypeVar("T")
#: Bytes per read and per write of a file transfer.
CHUNK = 1024 * 1024
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def content_error(status: int, code: str, message: str) -> web.Response:
    """The content API's error answer: ``{"code": <E2B's error code>, "message": …}``."""
    return web.json_response({"code": code, "message": message}, status=status)


def _query_int(request: web.Request, name: str) -> Optional[int]:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        value = int(raw, 10)
    except ValueError:
        raise VolumeError(
            400, "invalid_request", f"query parameter '{name}' must be an integer"
        ) from None
    if value < 0 or value > 0xFFFFFFFF:
        raise VolumeError(400, "invalid_request", f"query parameter '{name}' is out of range")
    return value


def _query_bool(request: web.Request, name: str) -> bool:
    raw = request.query.get(name)
    if raw is None or raw in _FALSE:
        return False
    if raw in _TRUE:
        return True
    raise VolumeError(400, "invalid_request", f"query parameter '{name}' must be a boolean")


def _query_path(request: web.Request) -> str:
    path = request.query.get("path")
    if path is None:
        raise VolumeError(400, "invalid_request", "query parameter 'path' is required")
    if "\0" in path:
        raise VolumeError(400, "invalid_request", "path must not contain NUL")
    return path


def _body_int(body: Dict[str, Any], name: str) -> Optional[int]:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
        raise VolumeError(400, "invalid_request", f"field '{name}' must be a non-negative integer")
    return int(value)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class VolumeContentRoutes:
    """The volume content handlers of one emulator server.

    Args:
        server: the server (its loop and request log).
        store: the team's volumes and their tokens.
    """

    def __init__(self, server: SandboxLifecycle, store: VolumeStore) -> None:
        self._server = server
        self._store = store

    def add_routes(self, app: web.Application) -> None:
        """Register the routes on ``app``."""
        r = app.router
        base = "/volumecontent/{vid}"
        r.add_get(base + "/dir", self._wrap(self.list_dir), allow_head=False)
        r.add_post(base + "/dir", self._wrap(self.make_dir))
        r.add_get(base + "/path", self._wrap(self.stat), allow_head=False)
        r.add_patch(base + "/path", self._wrap(self.update))
        r.add_delete(base + "/path", self._wrap(self.remove))
        r.add_get(base + "/file", self._wrap(self.read_file), allow_head=False)
        r.add_put(base + "/file", self._wrap(self.write_file))

    def _wrap(
        self, handler: Callable[[web.Request, VolumeRoot], Any]
    ) -> Handler:
        """Check the bearer token, then run ``handler``; ``VolumeError`` → its answer."""

        async def serve(request: web.Request) -> web.StreamResponse:
            auth = request.headers.get("Authorization", "")
            token = auth[7:] if auth[:7].lower() == "bearer " else None
            rec = self._store.check_token(request.match_info["vid"], token)
            if rec is None:
                return content_error(401, "unauthorized", "invalid or missing volume token")
            try:
                resp: web.StreamResponse = await handler(request, self._store.content_root(rec))
                return resp
            except VolumeError as exc:
                return content_error(exc.status, exc.code, exc.message)

        return serve

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._server.loop.run_in_executor(None, lambda: fn(*args, **kwargs))

    async def list_dir(self, request: web.Request, root: VolumeRoot) -> web.StreamResponse:
        """``GET dir?path&depth``: 200 ``[VolumeEntryStat]``."""
        path = _query_path(request)
        depth = _query_int(request, "depth")
        entries = await self._run(root.list_dir, path, 1 if depth is None else depth)
        return web.json_response(entries)

    async def make_dir(self, request: web.Request, root: VolumeRoot) -> web.StreamResponse:
        """``POST dir?path&uid&gid&mode&force``: 201 ``VolumeEntryStat``."""
        entry = await self._run(
            root.make_dir,
            _query_path(request),
            uid=_query_int(request, "uid"),
            gid=_query_int(request, "gid"),
            mode=_query_int(request, "mode"),
            force=_query_bool(request, "force"),
        )
        return web.json_response(entry, status=201)

    async def stat(self, request: web.Request, root: VolumeRoot) -> web.StreamResponse:
        """``GET path?path``: 200 ``VolumeEntryStat``."""
        return web.json_response(await self._run(root.stat, _query_path(request)))

    async def update(self, request: web.Request, root: VolumeRoot) -> web.StreamResponse:
        """``PATCH path?path`` ``{uid?, gid?, mode?}``: 200 ``VolumeEntryStat``."""
        path = _query_path(request)
        try:
            body = await json_body(request, optional=True)
        except BadRequest as exc:
            raise VolumeError(400, "invalid_request", exc.message) from None
        entry = await self._run(
            root.update,
            path,
            uid=_body_int(body, "uid"),
            gid=_body_int(body, "gid"),
            mode=_body_int(body, "mode"),
        )
        return web.json_response(entry)

    async def remove(self, request: web.Request, root: VolumeRoot) -> web.StreamResponse:
        """``DELETE path?path``: 204."""
        await self._run(root.remove, _query_path(request))
        return web.Response(status=204)

    async def read_file(self, request: web.Request, root: VolumeRoot) -> web.StreamResponse:
        """``GET file?path``: 200, the file's bytes streamed."""
        fd, size = await self._run(root.open_read, _query_path(request))
        try:
            resp = web.StreamResponse(
                status=200, headers={"Content-Type": "application/octet-stream"}
            )
            resp.content_length = size
            await resp.prepare(request)
            left = size
            while left > 0:
                data = await self._run(os.read, fd, min(CHUNK, left))
                if not data:
                    break  # truncated meanwhile: the client sees a short body
                await resp.write(data)
                left -= len(data)
            await resp.write_eof()
            return resp
        finally:
            os.close(fd)

    async def write_file(self, request: web.Request, root: VolumeRoot) -> web.StreamResponse:
        """``PUT file?path&uid&gid&mode&force`` (body: the bytes): 201 ``VolumeEntryStat``."""
        path = _query_path(request)
        uid, gid = _query_int(request, "uid"), _query_int(request, "gid")
        mode = _query_int(request, "mode")
        force = _query_bool(request, "force")
        fd, where = await self._run(root.open_write, path, uid=uid, gid=gid, mode=mode, force=force)
        try:
            async for chunk in request.content.iter_chunked(CHUNK):
                try:
                    await self._run(_write_all, fd, chunk)
                except OSError as exc:
                    raise VolumeError(
                        507 if exc.errno == 28 else 500,
                        "write_failed",
                        f"failed to write file content: {os.strerror(exc.errno or 0)}",
                    ) from None
            entry = await self._run(root.finish_write, fd, where, uid=uid, gid=gid, mode=mode)
        finally:
            os.close(fd)
        return web.json_response(entry, status=201)
