"""The emulator's host server: one aiohttp app on one TCP port, around the sandbox lifecycle.

This module owns :class:`EmulatorServer`: the aiohttp app and its start and shutdown (every
sandbox destroyed), and the request dispatch (envd traffic → :class:`~.proxy.EnvdProxy`,
``/volumecontent/`` → the volume content API with its bearer token, everything else → API-key
check → :class:`~.control.ControlPlane` or the admin routes of :mod:`.admin`). The sandbox
table and lifecycle it serves are :class:`~.sandboxes.SandboxHost`'s, the request log
:mod:`.request_log`'s.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import os
from typing import Optional, Tuple

from aiohttp import web

from ..runtime.linux import MAX_SOCKET_PATH
from .admin import AdminRoutes
from .control import ControlPlane
from .half_close import HalfCloseRunner
from .proxy import envd_route, to_a_port
from .routing import Handler, api_error
from .sandboxes import SandboxHost
from .volume_content import VolumeContentRoutes, content_error

__all__ = ["EmulatorServer"]

log = logging.getLogger("e2b_provider.emulator.server")

#: The listening socket's accept queue (the kernel caps it at ``net.core.somaxconn``). E2B's
#: edge takes a burst of connections: a client that starts 1,000 commands at once opens 1,000
#: of them. With aiohttp's default of 128 the kernel dropped the SYNs past the queue (each
#: retried 1 s, then 3 s later) and, with SYN cookies, reset some connections whose request
#: was already sent.
LISTEN_BACKLOG = 4096


class EmulatorServer(SandboxHost):
    """A local E2B: control plane, envd front and sandbox lifecycle on one aiohttp app.

    Takes the arguments of :class:`~.sandboxes.SandboxHost`; ``api_key`` is also the key
    every control-plane and admin request must carry in ``X-API-KEY``.
    """

    _runner: Optional[web.AppRunner] = None

    @functools.cached_property
    def control(self) -> ControlPlane:
        """The control-plane routes."""
        return ControlPlane(self, self.volumes)

    @functools.cached_property
    def _volume_content(self) -> VolumeContentRoutes:
        return VolumeContentRoutes(self, self.volumes)

    @functools.cached_property
    def _admin(self) -> AdminRoutes:
        return AdminRoutes(self)

    # -- app --------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        """Build the aiohttp application (routes + dispatch middleware)."""
        app = web.Application(middlewares=[self._dispatch], client_max_size=1024**3)
        self.control.add_routes(app)
        self._volume_content.add_routes(app)
        self._admin.add_routes(app)
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
        self._remove_leftover_volumes()
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
        self._start_expiry()
        bound = runner.addresses[0]
        return str(bound[0]), int(bound[1])

    async def close(self) -> None:
        """Stop serving, cut every stream and destroy every sandbox (bounded)."""
        if self._closed:
            return
        self._stop_lifecycle()
        if self._runner is not None:
            await self._runner.cleanup()
        await self._destroy_everything()

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
