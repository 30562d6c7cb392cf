"""The emulator's sandbox front: routes sandbox traffic to the agent inside each sandbox.

A request is sandbox traffic when it carries ``E2b-Sandbox-Id`` (port from
``E2b-Sandbox-Port``, default 49983) or its Host is ``<port>-<sandboxID>.<anything>``. Traffic
to envd's port goes to the agent's unix socket; traffic to any other port is handed, once the
checks below passed, to :class:`~.ports.PortRelay` (the sandbox's own servers). This module
owns, for such a request: the edge answers E2B gives itself (502 "The sandbox was not found"
for an unknown or paused sandbox, 502 "…port is not open" for a dead agent, 403 for a missing or
wrong ``e2b-traffic-access-token`` on another port of a sandbox created with
``allowPublicTraffic: false``, 401 for a missing or wrong ``X-Access-Token`` on everything but
``GET /health`` and — as envd — for ``/files`` requests that carry neither the token nor a valid
URL signature), the ``envd_unresponsive`` hang,
and a byte-level streaming proxy to the agent's unix socket (an aiohttp client with a
``UnixConnector`` per sandbox): request and response bodies flow chunk by chunk as they are
produced, nothing is buffered, and a client that goes away closes the upstream request (the
agent keeps the process running). The Start-stream faults (``stream_cut``,
``stream_cut_at_end``, ``stream_stall``, ``stream_stall_at_end``, ``bad_envelope``) are
applied here. Secrets (the access token) are never forwarded to the agent, logged or echoed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import re
import time
from typing import Any, Dict, Mapping, Optional, Tuple

import aiohttp
import yarl
from aiohttp import web

from .faults import Fault, TrailerCut, bad_frame
from .lifecycle import SandboxLifecycle
from .ports import (
    HOP_BY_HOP,
    SANDBOX_NOT_FOUND,
    PortRelay,
    abort,
    edge_502,
    edge_502_json,
    forwarded_body,
    upstream_answer,
)
from .routing import api_error
from .state import ENVD_PORT, TEMPLATE_USER, TEMPLATE_WORKDIR, SandboxRecord

__all__ = ["EnvdProxy", "envd_route", "route_of", "to_a_port"]

log = logging.getLogger("e2b_provider.emulator.proxy")

_HOST_RE = re.compile(r"^(\d+)-([a-z0-9]+)(?:-[^.]*)?\.")
_SANDBOX_ID_RE = re.compile(r"^[a-z0-9]+$")
_NOT_FORWARDED = HOP_BY_HOP | {"host", "x-access-token", "x-api-key", "content-length"}
_NOT_RETURNED = HOP_BY_HOP | {"content-length", "date", "server"}
#: Unary envd calls whose (small) JSON bodies are kept in the request log.
_LOGGED_BODIES = (
    "/process.Process/SendSignal",
    "/process.Process/List",
    "/process.Process/CloseStdin",
    "/filesystem.Filesystem/",
)
_MAX_LOGGED_BODY = 16 * 1024
_START_PATH = "/process.Process/Start"
_TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"
_UNAUTHORIZED = (
    "unauthorized access, please provide a valid access token or method signing if supported"
)


def _traffic_token_refusal(request: web.BaseRequest, rec: SandboxRecord) -> Optional[web.Response]:
    """The edge's 403 for a sandbox port (not envd's) reached without its traffic token."""
    expected = rec.traffic_access_token
    if not expected:
        return None
    given = request.headers.get(_TRAFFIC_TOKEN_HEADER)
    if given is None:
        message = f"Token header '{_TRAFFIC_TOKEN_HEADER}' is missing"
    elif hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode()):
        return None
    else:
        message = f"Provided token in header '{_TRAFFIC_TOKEN_HEADER}' is invalid"
    body = {
        "sandboxId": rec.sandbox_id,
        "message": f"Sandbox is secured with traffic access token. {message}",
        "code": 403,
    }
    return web.json_response(body, status=403)


def envd_route(request: web.BaseRequest) -> Optional[Tuple[str, int]]:
    """Return ``(sandbox_id, port)`` when ``request`` is envd traffic, else None.

    ``E2b-Sandbox-Id`` wins; otherwise a Host of the form ``<port>-<id>.<anything>``.
    A malformed id still counts as envd traffic (it is simply never found).
    """
    return route_of(request.headers)


def route_of(headers: Mapping[str, str]) -> Optional[Tuple[str, int]]:
    """:func:`envd_route` of a request's headers."""
    sid = headers.get("E2b-Sandbox-Id")
    if sid is not None:
        raw_port = headers.get("E2b-Sandbox-Port", str(ENVD_PORT))
        try:
            port = int(raw_port)
        except ValueError:
            port = -1
        return sid.strip(), port
    host = (headers.get("Host") or "").lower()
    match = _HOST_RE.match(host)
    if match:
        return match.group(2), int(match.group(1))
    return None


def to_a_port(headers: Mapping[str, str]) -> bool:
    """Whether a request with these headers goes to a sandbox port other than envd's."""
    route = route_of(headers)
    return route is not None and route[1] != ENVD_PORT


def basic_user(header: Optional[str]) -> Optional[str]:
    """The user name of an ``Authorization: Basic base64("<user>:")`` header, if any."""
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.split(":", 1)[0]


def files_auth_error(request: web.BaseRequest, access_token: str) -> Optional[str]:
    """envd's check of ``GET``/``POST /files``: the access token, else a signed URL.

    A present ``X-Access-Token`` must match; without it, ``signature`` must be
    ``v1_`` + unpadded base64 of SHA-256 over ``path:read|write:username:token[:expiration]``
    and ``signature_expiration`` (if given) not past. Returns envd's 401 message, or None.
    """
    header = request.headers.get("X-Access-Token")
    if header:
        if hmac.compare_digest(header.encode("utf-8", "surrogateescape"), access_token.encode()):
            return None
        return "access token present in header but does not match"
    query = request.query
    signature = query.get("signature")
    if signature is None:
        return "missing signature query parameter"
    operation = "read" if request.method == "GET" else "write"
    parts = [query.get("path", ""), operation, query.get("username", ""), access_token]
    expiration = query.get("signature_expiration")
    if expiration is not None:
        parts.append(expiration)
    digest = hashlib.sha256(":".join(parts).encode("utf-8", "surrogateescape")).digest()
    expected = "v1_" + base64.b64encode(digest).decode("ascii").rstrip("=")
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "surrogateescape")):
        return "invalid signature"
    if expiration is not None:
        try:
            expired = int(expiration) < time.time()
        except ValueError:
            return "invalid signature"
        if expired:
            return "signature is already expired"
    return None


class EnvdProxy:
    """Serves envd traffic for every sandbox of one emulator server."""

    def __init__(self, server: SandboxLifecycle) -> None:
        self._server = server
        self._sessions: Dict[str, aiohttp.ClientSession] = {}
        self.ports = PortRelay()

    # -- sessions ---------------------------------------------------------------------------

    def session(self, rec: SandboxRecord) -> aiohttp.ClientSession:
        """The client session (unix socket, no connection limit) for a sandbox's agent."""
        sess = self._sessions.get(rec.sandbox_id)
        if sess is None or sess.closed:
            connector = aiohttp.UnixConnector(path=rec.runtime.envd_socket, limit=0)
            sess = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            )
            self._sessions[rec.sandbox_id] = sess
        return sess

    async def drop_session(self, sandbox_id: str) -> None:
        """Close a sandbox's pooled agent connections and the connections to its ports
        (after a halt, reboot or kill)."""
        sess = self._sessions.pop(sandbox_id, None)
        if sess is not None:
            await sess.close()
        await self.ports.drop_session(sandbox_id)

    async def close(self) -> None:
        """Close every session."""
        for sid in list(self._sessions):
            await self.drop_session(sid)
        await self.ports.close()

    async def health(self, rec: SandboxRecord, timeout: float) -> bool:
        """True when the sandbox's agent answers ``GET /health`` within ``timeout`` seconds."""
        try:
            async with self.session(rec).get(
                "http://envd/health", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                await resp.read()
                return resp.status < 300
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def init(self, rec: SandboxRecord, timeout: float = 10.0) -> None:
        """Send envd's ``POST /init`` as E2B's orchestrator does after every boot: the
        sandbox's ``envVars`` (every process gets them) and the template's ``defaultUser``
        and ``defaultWorkdir`` (the cwd of a command given none, and of an empty path).

        Raises:
            RuntimeError: the agent did not accept it.
        """
        try:
            async with self.session(rec).post(
                "http://envd/init",
                json={
                    "envVars": dict(rec.env_vars),
                    "defaultUser": TEMPLATE_USER,
                    "defaultWorkdir": TEMPLATE_WORKDIR,
                },
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                await resp.read()
                if resp.status >= 300:
                    raise RuntimeError(f"envd /init answered {resp.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise RuntimeError(f"envd /init failed: {exc!r}") from None

    # -- requests ---------------------------------------------------------------------------

    async def handle(self, request: web.Request, sandbox_id: str, port: int) -> web.StreamResponse:
        """Answer one envd request (see the module docstring)."""
        server = self._server
        entry = server.log_request(request, kind="envd", sandbox_id=sandbox_id)
        entry["user"] = basic_user(request.headers.get("Authorization"))
        task = asyncio.current_task()
        rec: Optional[SandboxRecord] = None
        try:
            while True:
                rec = server.records.get(sandbox_id) if _SANDBOX_ID_RE.match(sandbox_id) else None
                if rec is None or rec.state != "running":
                    entry["status"] = 502
                    return self._not_found(request, sandbox_id, port)
                if server.faults.take("edge_not_found", sandbox_id=sandbox_id) is not None:
                    entry["status"] = 502
                    entry["fault"] = "edge_not_found"
                    return self._not_found(request, sandbox_id, port)
                error = server.faults.take("envd_error", sandbox_id=sandbox_id)
                if error is not None:
                    status = int(error.params["status"])
                    entry["status"] = status
                    entry["fault"] = "envd_error"
                    return api_error(status, "Bad gateway")
                if port != ENVD_PORT:
                    entry["port"] = port
                    refused = _traffic_token_refusal(request, rec)
                    if refused is not None:
                        entry["status"] = refused.status
                        return refused
                    if task is not None:
                        rec.streams.add(task)  # a pause or kill ends the relay
                    return await self.ports.handle(request, rec, port, entry)
                signed = request.path == "/files" and request.method in ("GET", "POST")
                if signed:
                    denied = files_auth_error(request, rec.access_token)
                    if denied is not None:
                        entry["status"] = 401
                        entry["token"] = "refused"
                        return api_error(401, denied)
                elif not (request.method == "GET" and request.path == "/health"):
                    token = request.headers.get("X-Access-Token")
                    entry["token"] = "missing" if token is None else "present"
                    if token is None or not hmac.compare_digest(
                        token.encode("utf-8", "surrogateescape"),
                        rec.access_token.encode(),
                    ):
                        entry["status"] = 401
                        if token is not None:
                            entry["token"] = "invalid"
                        return api_error(401, _UNAUTHORIZED)
                if task is not None:
                    rec.streams.add(task)
                if not server.faults.is_unresponsive(sandbox_id):
                    break
                entry["hung"] = True
                await server.faults.wait_changed(sandbox_id)
                if task is not None:
                    rec.streams.discard(task)
            return await self._forward(request, rec, entry)
        finally:
            if rec is not None and task is not None:
                rec.streams.discard(task)

    def _port_closed(self, sandbox_id: str) -> web.Response:
        return edge_502_json(sandbox_id, "The sandbox is running but port is not open")

    @staticmethod
    def _not_found(request: web.BaseRequest, sandbox_id: str, port: int) -> web.Response:
        """The edge's "not found" 502: JSON on envd's port, an HTML page to a browser on
        another port (as E2B answers)."""
        if port == ENVD_PORT:
            return edge_502_json(sandbox_id, SANDBOX_NOT_FOUND)
        return edge_502(request, sandbox_id, SANDBOX_NOT_FOUND)

    async def _forward(
        self, request: web.Request, rec: SandboxRecord, entry: Dict[str, Any]
    ) -> web.StreamResponse:
        server = self._server
        faults = server.faults
        bad: Optional[Fault] = None
        cut: Optional[Fault] = None
        stall: Optional[Fault] = None
        if request.method == "POST" and request.path == _START_PATH:
            sid = rec.sandbox_id
            bad = faults.take("bad_envelope", sandbox_id=sid)
            if bad is None:
                cut = faults.take("stream_cut", sandbox_id=sid)
            if bad is None and cut is None:
                cut = faults.take("stream_cut_at_end", sandbox_id=sid)
            if bad is None and cut is None:
                stall = faults.take("stream_stall", sandbox_id=sid)
            if bad is None and cut is None and stall is None:
                stall = faults.take("stream_stall_at_end", sandbox_id=sid)
            for fault in (bad, cut, stall):
                if fault is not None:
                    entry["fault"] = fault.kind
        changes = faults.version(rec.sandbox_id)

        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        data: Any
        if request.path.startswith(_LOGGED_BODIES) and (
            request.content_length is not None and request.content_length <= _MAX_LOGGED_BODY
        ):
            data = await request.read()
            entry["body"] = data.decode("utf-8", "replace")
        else:
            data = forwarded_body(request, headers)

        url = yarl.URL("http://envd" + request.raw_path, encoded=True)
        try:
            upstream = await self.session(rec).request(
                request.method, url, headers=headers, data=data, allow_redirects=False
            )
        except (aiohttp.ClientError, OSError) as exc:
            log.info("envd of %s did not accept a connection: %s", rec.sandbox_id, exc)
            entry["status"] = 502
            return self._port_closed(rec.sandbox_id)

        finished = False
        try:
            resp = upstream_answer(upstream, _NOT_RETURNED)
            faulty = bad is not None or cut is not None or stall is not None
            if upstream.content_length is not None and not faulty:
                resp.content_length = upstream.content_length
            entry["status"] = upstream.status
            await resp.prepare(request)
            if bad is not None:
                await resp.write(bad_frame(str(bad.params["mode"])))
            limit: Optional[int] = None
            at_end = (cut is not None and cut.kind == "stream_cut_at_end") or (
                stall is not None and stall.kind == "stream_stall_at_end"
            )
            trailer = TrailerCut() if at_end else None
            if cut is not None and trailer is None:
                limit = int(cut.params["after_bytes"])
            elif stall is not None and trailer is None:
                limit = int(stall.params["after_bytes"])
            sent = 0
            try:
                async for chunk in upstream.content.iter_any():
                    if trailer is not None:
                        passed = trailer.feed(chunk)
                        if passed:
                            await resp.write(passed)
                        if trailer.done:
                            break
                        continue
                    if limit is not None and sent + len(chunk) >= limit:
                        if limit > sent:
                            await resp.write(chunk[: limit - sent])
                        sent = limit
                        break
                    await resp.write(chunk)
                    sent += len(chunk)
                else:
                    finished = True
            except ConnectionError:
                # the client went away while we wrote: nothing more to do
                return resp
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.info("envd stream of %s broke: %s", rec.sandbox_id, exc)
                abort(request)
                return resp
            if stall is not None and not finished:
                entry["stalled"] = True
                if faults.version(rec.sandbox_id) == changes:  # not cleared meanwhile
                    await faults.wait_changed(rec.sandbox_id)
            if not finished:
                entry["cut"] = True
                abort(request)
            return resp
        finally:
            if not finished:
                upstream.close()
            else:
                upstream.release()
