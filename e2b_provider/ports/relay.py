"""Reaching a server inside a sandbox from the host: port URLs and local forwarding.

This module owns :func:`port_address` (E2B's ``{port}-{sandbox id}.{domain}`` name for a
sandbox port, with the scheme and port of the configured sandbox URL when there is one, as
on the emulator), and :class:`PortRelay`: one event loop on its own thread that serves
every forward of one provider. Each forward is a listener on the host's loopback (or on
the address the caller names: :func:`listen_address`); each
connection it accepts gets its own upstream connection to E2B's edge (or the emulator), its
requests' heads rewritten (``Host`` and the routing headers, plus the traffic token when
the sandbox's traffic is private), and everything else — bodies, responses, and after a
``101 Switching Protocols`` the whole connection (WebSockets) — passed on as it comes
(:mod:`e2b_provider.protocol.http1` says where messages begin and end). Memory per connection is
bounded by the streams' flow control, not by what passes. A client that shuts down its write side
after whole requests gets their answers, then the end of the connection: that half-close is not
passed on (E2B's edge, a Go server, cancels a request whose client's input ended); one
inside a request, or in a tunnel, is.

Bounds: at most ``max_connections`` open connections per forward (more are answered 503),
an idle timeout per connection, a connect timeout upstream. Closing a forward, or the
provider, closes its listener and connections. The event loop never runs user code.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import ssl
import threading
import urllib.parse
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import attrs

from ..cancel import CancelToken
from ..errors import E2BProviderError, InvalidArgument
from ..models import Target
from ..protocol import validate as v
from ..protocol.e2b_facts import ENVD_PORT, TRAFFIC_TOKEN_HEADER
from ..protocol.http1 import HEAD, REFUSED, SWITCHED, Event, Framer, FramingError, Head

if TYPE_CHECKING:
    from ..core.context import ProviderContext

__all__ = [
    "TRAFFIC_TOKEN_HEADER",
    "Forward",
    "ForwardLimits",
    "PortRelay",
    "Ports",
    "Upstream",
    "address_port",
    "check_port",
    "forward_limits",
    "listen_address",
    "port_address",
]

log = logging.getLogger("e2b_provider")

_READ = 64 * 1024
#: Request headers a forward replaces (lowercase): routing is the forward's to say.
_REPLACED = (b"host", b"e2b-sandbox-id", b"e2b-sandbox-port", TRAFFIC_TOKEN_HEADER.encode())
_START_TIMEOUT_SECONDS = 10.0
_CLOSE_TIMEOUT_SECONDS = 5.0


def _small_reads(writer: asyncio.StreamWriter) -> None:
    """Make the connection's transport read at most :data:`_READ` bytes a time.

    asyncio's selector transport asks the socket for 256 KiB on every read: a bytes object
    of that size, cut to what arrived. glibc serves a block that large from a fresh mmap
    until its dynamic threshold has risen in this process (which depends on what ran before),
    so each read may cost an ``mmap``, an ``mremap`` and a ``munmap``. 64 KiB (what the relay
    reads anyway) stays on the heap. Transports without the attribute (TLS) are left alone.
    """
    transport = writer.transport
    if hasattr(transport, "max_size"):
        transport.max_size = _READ


def check_port(port: object, what: str = "port") -> int:
    """``port`` as an int from 1 to 65535.

    Raises:
        InvalidArgument: anything else (before any I/O).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgument(f"{what} must be an integer from 1 to 65535, not {port!r}")
    return port


def port_address(
    sandbox_id: str, domain: str, port: int, sandbox_url: Optional[str]
) -> Tuple[str, str]:
    """``(url, host)`` of a sandbox port: ``https://{port}-{id}.{domain}`` on E2B; with a
    configured sandbox URL (the emulator, a self-hosted edge), its scheme and port."""
    host = f"{port}-{sandbox_id}.{domain}"
    scheme = "https"
    if sandbox_url:
        parts = urllib.parse.urlsplit(sandbox_url)
        scheme = parts.scheme or "https"
        default = 443 if scheme == "https" else 80
        if parts.port is not None and parts.port != default:
            host = f"{host}:{parts.port}"
    return f"{scheme}://{host}", host


@attrs.frozen
class Upstream:
    """Where a forward sends its connections, and what each request carries.

    Attributes:
        host: the address connected to.
        port: its TCP port.
        tls: True to speak TLS (``server_hostname`` is checked against the certificate).
        server_hostname: the TLS server name.
        host_header: the ``Host`` every request carries.
        headers: added to every request (the routing headers, the traffic token: hidden
            from repr).
        describe: what the forward reaches, for messages (``port 8000 of sandbox …``).
    """

    host: str
    port: int
    tls: bool
    server_hostname: str
    host_header: str
    headers: Tuple[Tuple[str, str], ...] = attrs.field(repr=False)
    describe: str = ""

    @classmethod
    def for_port(
        cls,
        sandbox_id: str,
        domain: str,
        port: int,
        sandbox_url: Optional[str],
        traffic_token: Optional[str],
    ) -> Upstream:
        """The upstream of ``port`` of a sandbox: E2B's edge at ``{port}-{id}.{domain}:443``,
        or the configured sandbox URL with the routing headers."""
        _, host = port_address(sandbox_id, domain, port, sandbox_url)
        headers: List[Tuple[str, str]] = []
        if sandbox_url:
            parts = urllib.parse.urlsplit(sandbox_url)
            tls = parts.scheme == "https"
            address = parts.hostname or "127.0.0.1"
            to_port = parts.port or (443 if tls else 80)
            name = address
            headers += [("E2b-Sandbox-Id", sandbox_id), ("E2b-Sandbox-Port", str(port))]
        else:
            tls, address, to_port, name = True, host, 443, host
        if traffic_token and port != ENVD_PORT:
            headers.append((TRAFFIC_TOKEN_HEADER, traffic_token))
        return cls(
            host=address,
            port=to_port,
            tls=tls,
            server_hostname=name,
            host_header=host,
            headers=tuple(headers),
            describe=f"port {port} of sandbox {sandbox_id}",
        )


@attrs.frozen
class ForwardLimits:
    """Bounds of one forward (see :meth:`~e2b_provider.E2BSandboxProvider.forward`)."""

    max_connections: int = 256
    idle_timeout: float = 300.0
    connect_timeout: float = 10.0


def forward_limits(
    port: int, local_port: int, max_connections: int, idle_timeout: float
) -> ForwardLimits:
    """Check a forward's ports and bounds (``local_port`` 0: any free port); its limits.

    Raises:
        InvalidArgument: a bad argument (before any I/O).
    """
    check_port(port)
    if local_port != 0:
        check_port(local_port, "local_port")
    elif isinstance(local_port, bool) or not isinstance(local_port, int):
        raise InvalidArgument(f"local_port must be an int, not {local_port!r}")
    if (isinstance(max_connections, bool) or not isinstance(max_connections, int)
            or not 1 <= max_connections <= 10000):
        raise InvalidArgument("max_connections must be an int from 1 to 10000")
    v.check_timeout(idle_timeout, name="idle_timeout")
    return ForwardLimits(max_connections=max_connections, idle_timeout=float(idle_timeout))


#: What a forward listens on unless told: this machine's loopback alone.
LOOPBACK = "127.0.0.1"


def listen_address(address: str) -> str:
    """The IP address a forward listens on, from ``address``: an IPv4 or IPv6 address
    (``0.0.0.0`` or ``::``: every interface), or ``localhost`` (:data:`LOOPBACK`), as
    ``kubectl port-forward --address`` takes them.

    Raises:
        InvalidArgument: anything else (a host name, say), before any I/O.
    """
    if not isinstance(address, str):
        raise InvalidArgument(f"address must be a str, not {type(address).__name__}")
    if address == "localhost":
        return LOOPBACK
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        raise InvalidArgument(
            f"address must be an IP address or localhost (as kubectl port-forward takes "
            f"it), not {address[:100]!r}"
        ) from None


def address_port(address: str, port: int) -> str:
    """``address:port``, an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _local_url(address: str, port: int) -> str:
    """A URL this machine reaches a listener on ``address`` by (every interface: its
    loopback)."""
    ip = ipaddress.ip_address(address)
    if ip.is_unspecified:
        ip = ipaddress.ip_address("::1" if ip.version == 6 else LOOPBACK)
    return f"http://{address_port(str(ip), port)}"


class Forward:
    """One listening forward; :meth:`close` it (idempotent)."""

    def __init__(self, relay: PortRelay, listener: _Listener, address: str) -> None:
        self._relay = relay
        self._listener = listener
        self.local_port: int = listener.port
        self.url = _local_url(address, listener.port)

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._listener.conns)

    def close(self) -> None:
        """Stop listening and close every connection (bounded wait)."""
        self._relay.close_listener(self._listener)

    def __repr__(self) -> str:
        return f"Forward(url={self.url!r}, to={self._listener.upstream.describe!r})"


class PortRelay:
    """The event loop thread serving one provider's forwards (started on first use).

    Args:
        tls: the TLS context of upstream connections; None: the system's CAs plus
            certifi's (see :meth:`tls_context`).
    """

    def __init__(self, tls: Optional[ssl.SSLContext] = None) -> None:
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._listeners: Set[_Listener] = set()
        self._tls = tls
        self._pid = os.getpid()
        self._closed = False

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The loop's thread, once started."""
        return self._thread

    def open(
        self,
        upstream: Upstream,
        *,
        local_port: int = 0,
        limits: ForwardLimits = ForwardLimits(),
        address: str = LOOPBACK,
    ) -> Forward:
        """Listen on ``address:local_port`` (0: any free port; ``address`` as
        :func:`listen_address` gives it) and relay to ``upstream``.

        Raises:
            E2BProviderError: the relay is closed.
            InvalidArgument: the address or local port is taken or not allowed.
        """
        loop = self._running_loop()
        listener = _Listener(self, upstream, limits)
        future = asyncio.run_coroutine_threadsafe(listener.start(address, local_port), loop)
        try:
            future.result(timeout=_START_TIMEOUT_SECONDS)
        except OSError as exc:
            raise InvalidArgument(
                f"cannot listen on {address_port(address, local_port)}: {exc.strerror or exc}"
            ) from None
        with self._lock:
            self._listeners.add(listener)
        return Forward(self, listener, address)

    def close_listener(self, listener: _Listener) -> None:
        """Close one forward's listener and connections."""
        with self._lock:
            self._listeners.discard(listener)
            loop = self._loop
        if loop is None or not loop.is_running() or self._pid != os.getpid():
            return
        future = asyncio.run_coroutine_threadsafe(listener.aclose(), loop)
        try:
            future.result(timeout=_CLOSE_TIMEOUT_SECONDS)
        except Exception:
            log.debug("e2b_provider: a forward did not close within %.0f s", _CLOSE_TIMEOUT_SECONDS)

    def close(self) -> None:
        """Close every forward and stop the loop (bounded). Idempotent."""
        with self._lock:
            self._closed = True
            listeners = list(self._listeners)
            loop, thread = self._loop, self._thread
        for listener in listeners:
            self.close_listener(listener)
        with self._lock:
            self._loop = None
        if loop is not None and thread is not None and self._pid == os.getpid():
            if not loop.is_closed():
                loop.call_soon_threadsafe(loop.stop)
            if thread is not threading.current_thread():
                thread.join(_CLOSE_TIMEOUT_SECONDS)

    def after_fork(self) -> None:
        """In a forked child: forget the parent's loop and listeners (not ours to close)."""
        with self._lock:
            self._forget()

    def _forget(self) -> None:
        self._loop, self._thread, self._listeners = None, None, set()
        self._pid = os.getpid()

    def tls_context(self) -> ssl.SSLContext:
        """The TLS context for E2B's edge (system CAs, plus certifi's when installed)."""
        if self._tls is None:
            ctx = ssl.create_default_context()
            try:
                import certifi

                ctx.load_verify_locations(cafile=certifi.where())
            except (ImportError, OSError):
                pass
            ctx.set_alpn_protocols(["http/1.1"])
            self._tls = ctx
        return self._tls

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise E2BProviderError("the provider's port forwarding is closed")
            if self._pid != os.getpid():  # forked: the parent's loop is not here
                self._forget()
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    try:
                        loop.run_forever()
                    finally:
                        _shut(loop)

                thread = threading.Thread(target=run, name="e2b-provider-forward", daemon=True)
                thread.start()
                if not ready.wait(_START_TIMEOUT_SECONDS):
                    raise E2BProviderError("the port forwarding thread did not start")
                self._loop, self._thread = loop, thread
            return self._loop


def _shut(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on a stopped loop and close it."""
    try:
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT_SECONDS))
    finally:
        loop.close()


class _Listener:
    """One forward's listening socket and its connections (on the loop's thread)."""

    def __init__(self, relay: PortRelay, upstream: Upstream, limits: ForwardLimits) -> None:
        self.relay = relay
        self.upstream = upstream
        self.limits = limits
        self.conns: Set[_Connection] = set()
        self.port = 0
        self._server: Optional[asyncio.AbstractServer] = None
        self._sweeper: Optional[asyncio.Task[None]] = None
        self.add = tuple(
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in ((("Host", upstream.host_header), *upstream.headers))
        )

    async def start(self, address: str, local_port: int) -> None:
        self._server = await asyncio.start_server(
            self._accept, address, local_port, limit=_READ, backlog=256
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.conns):
            conn.abort()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), _CLOSE_TIMEOUT_SECONDS)
            except asyncio.TimeoutError:
                pass

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self, reader, writer)
        if len(self.conns) >= self.limits.max_connections:
            await conn.refuse(503, "too many connections through this forward; retry shortly")
            return
        self.conns.add(conn)
        try:
            await conn.run()
        finally:
            self.conns.discard(conn)

    async def _sweep(self) -> None:
        """Close connections idle longer than the idle timeout."""
        idle = self.limits.idle_timeout
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(idle / 4, 5.0))
            now = loop.time()
            for conn in list(self.conns):
                if now - conn.last > idle:
                    log.debug("e2b_provider: forward closes a connection idle %.0f s", idle)
                    conn.abort()


class _Connection:
    """One client connection and its upstream connection."""

    def __init__(
        self, listener: _Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.listener = listener
        self.creader = reader
        self.cwriter = writer
        _small_reads(writer)
        self.uwriter: Optional[asyncio.StreamWriter] = None
        self.requests = Framer(is_request=True)
        self.responses = Framer(is_request=False)
        self.decided = asyncio.Event()
        self.switched = False
        self.answered = 0  # bytes sent to the client
        self.sent = 0  # requests sent upstream
        self.closing = False  # no more requests: end once the answers owed have passed
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()

    def abort(self) -> None:
        for writer in (self.cwriter, self.uwriter):
            if writer is not None:
                writer.transport.abort()

    async def refuse(self, status: int, why: str) -> None:
        """Answer ``status`` with ``why`` (when nothing was answered yet) and close."""
        if self.answered == 0:
            body = f"e2b-provider forward: {why}\n".encode("utf-8", "replace")
            reason = _REASONS.get(status, "Error")
            head = (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
            try:
                self.cwriter.write(head + body)
                await asyncio.wait_for(self.cwriter.drain(), _CLOSE_TIMEOUT_SECONDS)
            except (OSError, asyncio.TimeoutError):
                pass
        if self.uwriter is not None:  # nothing more goes upstream: its answer ends too
            self.uwriter.transport.abort()
        if self.answered:
            self.abort()
        else:
            self.cwriter.close()

    async def run(self) -> None:
        up = self.listener.upstream
        limits = self.listener.limits
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    up.host,
                    up.port,
                    ssl=self.listener.relay.tls_context() if up.tls else None,
                    server_hostname=up.server_hostname if up.tls else None,
                    limit=_READ,
                ),
                limits.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
            why = "timed out" if isinstance(exc, asyncio.TimeoutError) else str(exc)
            await self.refuse(502, f"cannot reach {up.describe} at {up.host}:{up.port}: {why}")
            return
        _small_reads(writer)
        self.uwriter = writer
        pump = self.loop.create_task(self._requests())
        clean = False
        try:
            await self._responses(reader)
            clean = True
        except (OSError, asyncio.IncompleteReadError):
            pass
        except FramingError as exc:
            log.debug("e2b_provider: forward got a response it cannot frame: %s", exc)
        finally:
            pump.cancel()
            try:
                await pump
            except (asyncio.CancelledError, OSError, FramingError):
                pass
            writer.transport.abort()
            if clean:  # the server closed: what it sent reaches the client, then the end
                self.cwriter.close()
                try:
                    await asyncio.wait_for(self.cwriter.wait_closed(), _CLOSE_TIMEOUT_SECONDS)
                except (OSError, asyncio.TimeoutError):
                    self.cwriter.transport.abort()
            else:
                self.cwriter.transport.abort()

    async def _requests(self) -> None:
        assert self.uwriter is not None
        upstream = self.uwriter
        while True:
            data = await self.creader.read(_READ)
            self.last = self.loop.time()
            if not data:
                if self.requests.between_messages and not (
                    self.requests.raw or self.requests.held
                ):
                    # the client shut down its write side after whole requests: they are
                    # answered, then the connection ends. The half-close is not passed on:
                    # E2B's edge (a Go server) cancels a request whose client's input ended
                    self.closing = True
                    if self.responses.answered_all:
                        upstream.transport.abort()  # nothing owed: end now
                elif upstream.can_write_eof() and not upstream.is_closing():
                    upstream.write_eof()  # a tunnel, or a request cut short: the end passes
                return
            try:
                events = self.requests.feed(data)
                await self._send(events)
                while self.requests.held:
                    await self.decided.wait()
                    self.decided.clear()
                    await self._send(self.requests.resume(self.switched))
            except FramingError as exc:
                if not self.sent and not any(k == HEAD for k, _ in exc.events):
                    await self.refuse(exc.status, f"bad request: {exc}")
                    return
                # answers are owed for what went upstream: send what came before the bad
                # request, then no more; the connection ends once they have passed
                await self._send(exc.events)
                log.debug("e2b_provider: forward stops reading a client: %s", exc)
                self.closing = True
                if self.responses.answered_all:
                    upstream.transport.abort()
                return

    async def _send(self, events: List[Event]) -> None:
        assert self.uwriter is not None
        add = self.listener.add
        for kind, payload in events:
            if kind == HEAD:
                assert isinstance(payload, Head)
                self.sent += 1
                self.responses.expect(payload.method, payload.wants_upgrade)
                self.uwriter.write(payload.rewritten(_REPLACED, add))
            elif isinstance(payload, bytes):
                self.uwriter.write(payload)
        await self.uwriter.drain()

    async def _responses(self, reader: asyncio.StreamReader) -> None:
        while True:
            data = await reader.read(_READ)
            self.last = self.loop.time()
            if not data:
                return
            self.cwriter.write(data)
            self.answered += len(data)
            if not self.responses.raw:
                for kind, _ in self.responses.feed(data):
                    if kind == SWITCHED or kind == REFUSED:
                        self.switched = kind == SWITCHED
                        self.decided.set()
            await self.cwriter.drain()
            if self.closing and self.responses.answered_all:
                return


_REASONS: Dict[int, str] = {
    400: "Bad Request",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
}



class Ports:
    """The provider's part for sandbox ports: URLs, traffic headers, forwards.

    Args:
        ctx: the provider's shared context (config, leases).
    """

    def __init__(self, ctx: ProviderContext) -> None:
        self._ctx = ctx
        self.relay = PortRelay()
        ctx.on_fork(self.relay.after_fork)

    def _target(self, sid: str, cancel: Optional[CancelToken]) -> Target:
        return self._ctx.on_target(sid, cancel, lambda t: t)

    def url(self, sid: str, port: int, cancel: Optional[CancelToken]) -> str:
        """The URL of ``port`` of sandbox ``sid`` (connects first when cold)."""
        target = self._target(sid, cancel)
        return port_address(sid, target.domain, port, self._ctx.config.sandbox_url)[0]

    def traffic_headers(self, sid: str, cancel: Optional[CancelToken]) -> Dict[str, str]:
        """What a request to a port of ``sid`` must carry (empty when traffic is public)."""
        token = self._target(sid, cancel).traffic_token
        return {TRAFFIC_TOKEN_HEADER: token} if token else {}

    def forward(
        self,
        sid: str,
        port: int,
        local_port: int,
        limits: ForwardLimits,
        cancel: Optional[CancelToken],
        address: str = LOOPBACK,
    ) -> Forward:
        """Open a forward of ``port`` of ``sid`` on ``address:local_port``."""
        target = self._target(sid, cancel)
        upstream = Upstream.for_port(
            sid, target.domain, port, self._ctx.config.sandbox_url, target.traffic_token
        )
        return self.relay.open(upstream, local_port=local_port, limits=limits, address=address)

    def close(self) -> None:
        """Close every forward and the relay's thread."""
        self.relay.close()
