"""The emulator's edge for sandbox ports other than envd's: HTTP/1.1 and WebSocket relays.

A request routed to ``<port>-<sandboxID>.<anything>`` (or ``E2b-Sandbox-Id`` +
``E2b-Sandbox-Port``) with a port other than envd's 49983 reaches that port inside the
sandbox, as E2B's edge makes it. :class:`~.proxy.EnvdProxy` decides that a request is one
(sandbox found and running, traffic token accepted) and hands it to :class:`PortRelay`, which
owns:

* the connections: one aiohttp client session per sandbox whose connector
  (:class:`SandboxPortConnector`) gets each connection from the sandbox's agent through its
  ports socket (:meth:`~e2b_provider.emulator.runtime.SandboxRuntime.connect_port`: the agent
  connects from inside the sandbox's network namespace and passes the socket back; no byte
  passes through the agent); kept-alive connections are pooled per (sandbox, port) and the
  sessions are dropped when the sandbox is halted, rebooted or killed;
* the HTTP relay: method, path and query, headers (minus hop-by-hop ones, minus
  ``X-Access-Token`` and ``e2b-traffic-access-token``; ``Host`` unchanged) and the body,
  streamed chunk by chunk both ways with nothing buffered (``Content-Length`` kept when known,
  chunked otherwise); status, reason and headers of the answer passed back; a client that goes
  away closes the upstream request, an upstream that breaks mid-answer breaks the client's;
* the WebSocket relay (``Upgrade: websocket``): the upstream handshake first (subprotocols and
  ordinary headers forwarded; a refused upgrade answers the upstream's status), then text and
  binary messages pumped both ways (up to :data:`MAX_WS_MESSAGE` bytes each) and the close
  code passed through;
* the edge's answer when nothing listens: 502 ``{"sandboxId", "message": "The sandbox is running
  but port is not open", "code": 502}``, or an HTML page saying the same to a browser
  (User-Agent with ``Mozilla`` and an ``Accept`` with ``text/html``), as E2B answers.
"""

from __future__ import annotations

import asyncio
import html
import logging
from typing import (
    AbstractSet,
    Any,
    AsyncIterator,
    Dict,
    List,
    MutableMapping,
    Optional,
    Set,
    Tuple,
)

import aiohttp
import yarl
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.tracing import Trace
from multidict import CIMultiDict

from ..runtime.ports import PortClosed
from .state import SandboxRecord

__all__ = [
    "HOP_BY_HOP",
    "MAX_WS_MESSAGE",
    "PORT_CLOSED",
    "SANDBOX_NOT_FOUND",
    "PortRelay",
    "SandboxPortClosed",
    "SandboxPortConnector",
    "abort",
    "edge_502",
    "edge_502_json",
    "forwarded_body",
    "upstream_answer",
]

log = logging.getLogger("e2b_provider.emulator.ports")

#: The largest WebSocket message relayed, bytes.
MAX_WS_MESSAGE = 64 * 1024 * 1024
#: Bound on getting a connection from the sandbox's agent, seconds.
CONNECT_TIMEOUT_SECONDS = 8.0
PORT_CLOSED = "The sandbox is running but port is not open"
SANDBOX_NOT_FOUND = "The sandbox was not found"

#: Headers that concern one connection, never passed on (RFC 9110 §7.6.1).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
#: Request headers the sandbox never sees: secrets of the edge and of envd, and ``Expect``
#: (the relay streams the body itself).
_NOT_FORWARDED = HOP_BY_HOP | {
    "content-length",
    "expect",
    "x-access-token",
    "e2b-traffic-access-token",
}
#: Handshake headers the WebSocket client makes itself.
_WS_OWN = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
    }
)
_NOT_RETURNED = HOP_BY_HOP | {"content-length"}
#: Close codes a WebSocket endpoint may send (RFC 6455 §7.4; 1005, 1006, 1015 never are).
_SENDABLE_CLOSE = frozenset({1000, 1001, 1002, 1003, *range(1007, 1015)})

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:4em auto;max-width:40em;color:#222}}
code{{background:#eee;padding:0 .3em}}</style></head>
<body><h1>{title}</h1><p>Sandbox <code>{sandbox}</code>{detail}</p></body>
</html>
"""


class SandboxPortClosed(aiohttp.ClientConnectionError):
    """The sandbox's agent gave no connection to the port (nothing listens, or no answer)."""


class SandboxPortConnector(aiohttp.BaseConnector):
    """An aiohttp connector whose connections come from a sandbox's agent (its ports socket).

    The URL's port is the port inside the sandbox; its host is not used.

    Args:
        runtime: the sandbox's runtime (``connect_port(port, timeout)``).
        kwargs: passed to :class:`aiohttp.BaseConnector`.
    """

    def __init__(self, runtime: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._runtime = runtime

    async def _create_connection(
        self, req: ClientRequest, traces: List[Trace], timeout: aiohttp.ClientTimeout
    ) -> ResponseHandler:
        port = req.url.port
        if port is None:
            raise SandboxPortClosed("no port")
        try:
            sock = await self._runtime.connect_port(port, CONNECT_TIMEOUT_SECONDS)
        except PortClosed as exc:
            raise SandboxPortClosed(str(exc)) from None
        try:
            _, proto = await self._loop.create_connection(self._factory, sock=sock)
        except BaseException:
            sock.close()
            raise
        return proto


def _wants_html(request: web.BaseRequest) -> bool:
    agent = request.headers.get("User-Agent", "")
    accept = request.headers.get("Accept", "")
    return "Mozilla" in agent and "text/html" in accept


def edge_502(request: web.BaseRequest, sandbox_id: str, message: str) -> web.Response:
    """E2B's edge 502: JSON, or an HTML page for a browser."""
    if _wants_html(request):
        detail = (
            ": the server inside does not listen on this port (yet)."
            if message == PORT_CLOSED
            else ": it may have been paused or killed, or its timeout passed."
        )
        page = _PAGE.format(
            title=html.escape(message), sandbox=html.escape(sandbox_id), detail=detail
        )
        return web.Response(status=502, text=page, content_type="text/html")
    return edge_502_json(sandbox_id, message)


def edge_502_json(sandbox_id: str, message: str) -> web.Response:
    """E2B's edge 502 as JSON (what it answers itself for a sandbox it cannot reach)."""
    return web.json_response({"sandboxId": sandbox_id, "message": message, "code": 502}, status=502)


def _connection_listed(headers: Any) -> frozenset[str]:
    """Header names the ``Connection`` header lists (hop-by-hop for this hop only)."""
    names: Set[str] = set()
    for value in headers.getall("Connection", ()):
        names.update(part.strip().lower() for part in value.split(",") if part.strip())
    return frozenset(names)


def _forwarded_headers(
    request: web.BaseRequest, extra: frozenset[str] = frozenset()
) -> CIMultiDict[str]:
    """The request's headers for the sandbox (a multidict: repeated headers kept)."""
    drop = _NOT_FORWARDED | _connection_listed(request.headers) | extra
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in request.headers.items():
        if key.lower() not in drop:
            out.add(key, value)
    return out


def _is_websocket(request: web.BaseRequest) -> bool:
    upgrade = request.headers.get("Upgrade", "").lower()
    return request.method == "GET" and "websocket" in upgrade and "upgrade" in (
        request.headers.get("Connection", "").lower()
    )


def _sandbox_url(port: int, raw_path: str) -> yarl.URL:
    if not raw_path.startswith("/"):
        raw_path = "/"
    return yarl.URL(f"http://sandbox:{port}{raw_path}", encoded=True)


async def _body(request: web.Request) -> AsyncIterator[bytes]:
    async for chunk in request.content.iter_any():
        yield chunk


def forwarded_body(request: web.Request, headers: MutableMapping[str, str]) -> Any:
    """The request's body to send on: a stream, ``b""`` or ``None`` (no body).

    A ``Content-Length`` the client sent is set in ``headers`` too.
    """
    if request.content_length is not None:
        headers["Content-Length"] = str(request.content_length)
        return _body(request) if request.content_length else b""
    if request.body_exists:
        return _body(request)
    return None


def upstream_answer(
    upstream: aiohttp.ClientResponse, dropped: AbstractSet[str]
) -> web.StreamResponse:
    """A streamed answer with ``upstream``'s status, reason and headers (but ``dropped``)."""
    resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    for key, value in upstream.headers.items():
        if key.lower() not in dropped:
            resp.headers.add(key, value)
    return resp


def _port_closed(
    request: web.BaseRequest, rec: SandboxRecord, entry: Dict[str, Any]
) -> web.Response:
    """The edge's 502 for a port nothing listens on (logged as the request's status)."""
    entry["status"] = 502
    return edge_502(request, rec.sandbox_id, PORT_CLOSED)


def abort(request: web.BaseRequest) -> None:
    """Close the client connection (after what was written): a broken answer stays broken."""
    transport = request.transport
    if transport is not None:
        transport.close()


class PortRelay:
    """Relays requests to sandbox ports (see the module docstring); one per server."""

    def __init__(self) -> None:
        self._sessions: Dict[str, aiohttp.ClientSession] = {}

    def session(self, rec: SandboxRecord) -> aiohttp.ClientSession:
        """The client session whose connections come from the sandbox's agent."""
        sess = self._sessions.get(rec.sandbox_id)
        if sess is None or sess.closed:
            connector = SandboxPortConnector(rec.runtime, limit=0)
            sess = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SECONDS),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                max_line_size=65536,
                max_field_size=65536,
            )
            self._sessions[rec.sandbox_id] = sess
        return sess

    async def drop_session(self, sandbox_id: str) -> None:
        """Close a sandbox's pooled connections (after a halt, reboot or kill)."""
        sess = self._sessions.pop(sandbox_id, None)
        if sess is not None:
            await sess.close()

    async def close(self) -> None:
        """Close every session."""
        for sid in list(self._sessions):
            await self.drop_session(sid)

    async def handle(
        self, request: web.Request, rec: SandboxRecord, port: int, entry: Dict[str, Any]
    ) -> web.StreamResponse:
        """Relay one request to ``port`` of the running sandbox ``rec``."""
        if _is_websocket(request):
            return await self._websocket(request, rec, port, entry)
        return await self._http(request, rec, port, entry)

    # -- HTTP -------------------------------------------------------------------------------

    async def _http(
        self, request: web.Request, rec: SandboxRecord, port: int, entry: Dict[str, Any]
    ) -> web.StreamResponse:
        headers = _forwarded_headers(request)
        data = forwarded_body(request, headers)
        try:
            upstream = await self.session(rec).request(
                request.method,
                _sandbox_url(port, request.raw_path),
                headers=headers,
                data=data,
                allow_redirects=False,
            )
        except SandboxPortClosed as exc:
            log.debug("port %d of %s is not open: %s", port, rec.sandbox_id, exc)
            return _port_closed(request, rec, entry)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            log.info("port %d of %s did not answer: %s", port, rec.sandbox_id, exc)
            return _port_closed(request, rec, entry)

        finished = False
        try:
            resp = upstream_answer(upstream, _NOT_RETURNED)
            if upstream.content_length is not None:
                resp.content_length = upstream.content_length
            entry["status"] = upstream.status
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await resp.write(chunk)
            except ConnectionError:
                return resp  # the client went away while we wrote
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.info("answer of port %d of %s broke: %s", port, rec.sandbox_id, exc)
                abort(request)
                return resp
            finished = True
            await resp.write_eof()
            return resp
        finally:
            if finished:
                upstream.release()
            else:
                upstream.close()

    # -- WebSocket --------------------------------------------------------------------------

    async def _websocket(
        self, request: web.Request, rec: SandboxRecord, port: int, entry: Dict[str, Any]
    ) -> web.StreamResponse:
        offered = [
            p.strip()
            for value in request.headers.getall("Sec-WebSocket-Protocol", ())
            for p in value.split(",")
            if p.strip()
        ]
        headers = _forwarded_headers(request, _WS_OWN)
        try:
            upstream = await self.session(rec).ws_connect(
                _sandbox_url(port, request.raw_path),
                protocols=offered,
                headers=headers,
                max_msg_size=MAX_WS_MESSAGE,
                autoclose=False,
                autoping=True,
                compress=0,
            )
        except aiohttp.WSServerHandshakeError as exc:
            status = exc.status if 200 <= exc.status < 600 and exc.status != 101 else 502
            entry["status"] = status
            return web.Response(status=status, text=f"{exc.message}\n")
        except SandboxPortClosed:
            return _port_closed(request, rec, entry)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            log.info("websocket to port %d of %s failed: %s", port, rec.sandbox_id, exc)
            return _port_closed(request, rec, entry)
        try:
            ws = web.WebSocketResponse(
                protocols=(upstream.protocol,) if upstream.protocol else (),
                max_msg_size=MAX_WS_MESSAGE,
                autoclose=False,
                autoping=True,
            )
            await ws.prepare(request)
            entry["status"] = 101
            await _pump_both(ws, upstream, request)
            return ws
        finally:
            if not upstream.closed:
                await upstream.close()


_Closing = Optional[Tuple[int, str]]


async def _pump(src: Any, dst: Any) -> _Closing:
    """Copy messages from ``src`` to ``dst`` until ``src`` closes.

    Returns:
        ``(code, reason)`` of the close frame ``src`` sent, or None when it ended without one.
    """
    while True:
        msg = await src.receive()
        kind = msg.type
        if kind == aiohttp.WSMsgType.TEXT:
            await dst.send_str(msg.data)
        elif kind == aiohttp.WSMsgType.BINARY:
            await dst.send_bytes(msg.data)
        elif kind == aiohttp.WSMsgType.CLOSE:
            return int(msg.data or 1005), str(msg.extra or "")
        elif kind in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
            return None
        elif kind == aiohttp.WSMsgType.ERROR:
            return None


def _sendable(code: int) -> int:
    """A close code that may go on the wire for ``code`` (1000 when it may not)."""
    return code if code in _SENDABLE_CLOSE or 3000 <= code <= 4999 else 1000


def _outcome(task: asyncio.Future[_Closing]) -> _Closing:
    try:
        return task.result()
    except Exception as exc:  # a broken connection, on either side
        log.debug("websocket relay ended: %r", exc)
        return None


async def _pump_both(ws: web.WebSocketResponse, upstream: Any, request: web.Request) -> None:
    """Pump messages both ways; pass the first close on to the other side.

    The pump that still runs is never cancelled while it waits (a cancelled receive marks the
    client's connection as closed abnormally): closing its source breaks its wait.
    """
    down = asyncio.ensure_future(_pump(upstream, ws))
    up = asyncio.ensure_future(_pump(ws, upstream))
    try:
        done, _ = await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
        if down in done:  # the sandbox's server closed first
            closing = _outcome(down)
            if closing is None:
                abort(request)  # no close frame: the client sees the connection drop too
                up.cancel()
            else:
                code, reason = closing
                await upstream.close(code=_sendable(code), message=reason.encode())
                await ws.close(code=_sendable(code), message=reason.encode())
        else:
            closing = _outcome(up)
            if closing is None:  # the client went away without a close frame
                await upstream.close(code=1001)
            else:
                code, reason = closing
                await upstream.close(code=_sendable(code), message=reason.encode())
                answer = upstream.close_code
                await ws.close(code=_sendable(answer if answer is not None else code))
        await asyncio.wait({down, up}, timeout=5.0)
    finally:
        for task in (down, up):
            if not task.done():
                task.cancel()
        await asyncio.gather(down, up, return_exceptions=True)
