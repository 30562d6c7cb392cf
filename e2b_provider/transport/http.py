"""The HTTP transport: the only module that imports requests or urllib3.

This module owns :class:`Transport` (requests it prepares itself and sends through one sized
``requests`` ``HTTPAdapter``: no retries, no redirects, no cookies, no ``~/.netrc``, the
environment's proxy settings read once), the buffered :meth:`Transport.request` that returns
a frozen :class:`HttpResponse` and never raises for an HTTP error status, the streaming
:meth:`Transport.open_stream` whose :class:`Stream` can be aborted from any thread, the
:class:`RawStream` of :meth:`Transport.open_raw_stream` (a connection of its own, read with
a timeout per read that loses nothing when it passes: a terminal's output), the one
exception seam :func:`map_transport_errors`, and :func:`error_from_response`, which turns an
error answer into the right :class:`~e2b_provider.errors.E2BHttpError` subclass.

Connections are kept: an answer read to its end (for a stream, up to the chunked terminator
after envd's end-of-stream message, see :meth:`Stream.finish`) leaves its connection in the
pool for the next request; an answer abandoned before its end closes its connection, so a
half-read connection is never reused.

Cancellation: a request registers a callback on its :class:`~e2b_provider.CancelToken`. When
the token fires, the callback shuts the request's socket down (``shutdown(2)`` is the only
call that reliably wakes a thread blocked in ``recv``; ``close()`` does not), so the caller's
thread wakes at once and raises :class:`~e2b_provider.errors.Cancelled`. The socket is found
through a small per-request "abort slot" that the pool's connections publish themselves into
while they serve that request, and leave again before they go back to the pool, so a late
cancel can never hit a connection that another request is already using. A cancel that
arrives while the TCP or TLS connection is still being set up takes effect as soon as it is
set up, or when the connect timeout ends, whichever comes first. A stream keeps its slot
until its connection is back in the pool, so :meth:`Stream.abort` has the same guarantee;
a connection that an abort shut down is closed by the pool, never kept.

Deadlines: every request has a total bound (its :class:`~e2b_provider.cancel.Deadline`), not
only per-read timeouts, so a peer that trickles its headers or body a byte at a time, accepts
and never answers, reads an upload slowly or stalls a TLS handshake cannot hold a caller
longer than that. The shared :class:`~e2b_provider._watchdog.Watchdog` shuts the request's
socket down when the deadline passes — through the same abort slot a cancel uses, so it
never touches a pooled connection another request owns — and the connect, send and per-read
timeouts are clamped to the time left. The request then raises
:class:`~e2b_provider.errors.TransportTimeout`. A connection is published in its slot as
soon as its TCP connection exists, before a proxy tunnel or TLS handshake, so those are
covered too; only name resolution (the system resolver) is outside the bound. For a stream
the deadline bounds its opening (until the response headers), or, when asked, the whole body.

Messages name the operation and the URL as scheme, host, port and path only: never a query
string, user info or header, where secrets (the API key, the envd access token, signed-URL
signatures) could be.
"""

from __future__ import annotations

import collections
import contextlib
import errno as errno_mod
import functools
import http.client
import json as json_mod
import logging
import math
import os
import queue
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple, Type, Union

import attrs
import requests
import requests.adapters
import requests.utils
import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.poolmanager
import urllib3.util.proxy

from .._version import __version__
from .._watchdog import TimerHandle, Watchdog
from ..cancel import CancelToken, Deadline
from ..errors import (
    AuthenticationError,
    Cancelled,
    ConfigError,
    Conflict,
    E2BHttpError,
    E2BProviderError,
    NotFound,
    ProtocolError,
    TransportError,
    TransportTimeout,
)
from ..protocol.http1 import BODY, END, Framer, FramingError, Head

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "safe_url",
    "DEFAULT_MAX_BODY",
    "HttpResponse",
    "RawStream",
    "Stream",
    "Transport",
    "error_from_response",
    "map_transport_errors",
    "parse_error_body",
]

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = 10.0
#: Largest buffered body :meth:`Transport.request` accepts unless told otherwise.
DEFAULT_MAX_BODY = 1 << 20
_READ_CHUNK = 64 * 1024
#: How long :meth:`Stream.finish` waits for the end of a body whose content is complete.
END_WAIT_SECONDS = 0.5
_QUICKACK: Optional[int] = getattr(socket, "TCP_QUICKACK", None)  # Linux only
#: The shortest socket timeout set when a deadline is about to pass (0 would mean
#: non-blocking).
_MIN_WAIT = 0.001

Params = Union[Mapping[str, str], None]


# --------------------------------------------------------------------------------------
# values
# --------------------------------------------------------------------------------------


@attrs.frozen
class HttpResponse:
    """A complete, buffered HTTP answer.

    Attributes:
        status: the HTTP status code.
        headers: the response headers, keys in lower case (repeated headers joined by ", ").
        body: the body (at most the ``max_body`` the request allowed); not in the repr,
            since an answer can carry a secret (a new sandbox's envd access token).
    """

    status: int
    headers: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    body: bytes = attrs.field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        """True for a 2xx status."""
        return 200 <= self.status < 300

    def json(self, operation: str = "") -> Any:
        """The body parsed as JSON (``None`` for an empty body).

        Raises:
            ProtocolError: the body is not UTF-8 JSON.
        """
        if not self.body.strip():
            return None
        try:
            return json_mod.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            what = f"E2B {operation}" if operation else "E2B"
            raise ProtocolError(
                f"{what} answered HTTP {self.status} with a body that is not JSON"
            ) from None


def _lower_headers(headers: Mapping[str, str]) -> Dict[str, str]:
    return {str(k).lower(): str(v) for k, v in headers.items()}


# --------------------------------------------------------------------------------------
# error mapping
# --------------------------------------------------------------------------------------


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the exceptions it wraps in ``args``, and its cause/context chain (bounded)."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < 32:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        for a in getattr(e, "args", ()):
            if isinstance(a, BaseException):
                todo.append(a)
        reason = getattr(e, "reason", None)
        if isinstance(reason, BaseException):
            todo.append(reason)
        if e.__cause__ is not None:
            todo.append(e.__cause__)
        if e.__context__ is not None:
            todo.append(e.__context__)


def _is_timeout(exc: BaseException) -> bool:
    for e in _chain(exc):
        if isinstance(e, (requests.exceptions.ConnectTimeout, requests.exceptions.ReadTimeout)):
            return True
        if isinstance(e, urllib3.exceptions.ReadTimeoutError):
            return True
        if isinstance(e, urllib3.exceptions.ConnectTimeoutError) and not isinstance(
            e, urllib3.exceptions.NewConnectionError
        ):
            return True
        if isinstance(e, socket.timeout):  # TimeoutError on 3.10+
            return True
    return False


def _detail(exc: BaseException) -> str:
    """Exception class names (outer/inner) and an errno name: never the text, which has URLs."""
    names = []
    err_name = ""
    for e in _chain(exc):
        n = type(e).__name__
        if n not in names:
            names.append(n)
        if not err_name and isinstance(e, OSError) and isinstance(e.errno, int):
            err_name = errno_mod.errorcode.get(e.errno, "")
    text = "/".join(names[:3])
    return f"{text}, {err_name}" if err_name else text


_TRANSPORT_EXCEPTIONS: Tuple[Type[BaseException], ...] = (
    requests.exceptions.RequestException,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    OSError,  # includes socket.timeout, ssl.SSLError, ConnectionError
)
_BAD_URL_EXCEPTIONS: Tuple[Type[BaseException], ...] = (
    requests.exceptions.InvalidURL,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidSchema,
    urllib3.exceptions.LocationValueError,
)


def safe_url(url: str) -> str:
    """``scheme://host:port/path`` of ``url``, for messages: never its user info, query or
    fragment, where a secret (a password, a signed URL's signature) could be."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "an unreadable URL"
    scheme = parts.scheme.lower()
    if ":" in host:
        host = f"[{host}]"
    port = port or {"http": 80, "https": 443}.get(scheme)
    netloc = f"{host}:{port}" if port else host
    return urllib.parse.urlunsplit((scheme, netloc, parts.path, "", ""))


#: What an errno means to a user whose connection failed.
_ERRNO_WHY = {
    errno_mod.ECONNREFUSED: "connection refused (nothing listens there)",
    errno_mod.ECONNRESET: "the connection was reset",
    errno_mod.ENETUNREACH: "the network is unreachable",
    errno_mod.EHOSTUNREACH: "the host is unreachable",
    errno_mod.ETIMEDOUT: "the connection timed out",
    errno_mod.EPIPE: "the connection was closed while sending",
}


def _why(exc: BaseException) -> str:
    """Why a connection failed, in plain words ("" when nothing better than the class)."""
    proxy = False
    why = ""
    for e in _chain(exc):
        if isinstance(e, urllib3.exceptions.ProxyError):
            proxy = True
        elif why:
            continue
        elif isinstance(e, socket.gaierror) or type(e).__name__ == "NameResolutionError":
            why = "the host name could not be resolved"
        elif isinstance(e, OSError) and e.errno in _ERRNO_WHY:
            why = _ERRNO_WHY[e.errno]
        elif isinstance(e, (http.client.RemoteDisconnected, http.client.IncompleteRead)):
            why = "the connection was closed before the answer was complete"
    if proxy:
        return f"the proxy failed: {why}" if why else "the proxy failed"
    return why


def _where(url: str, proxies: Optional[Mapping[str, str]]) -> str:
    """``url`` for a message, and the proxy it went through, if any (its origin only)."""
    where = safe_url(url) if url else "E2B"
    proxy = requests.utils.select_proxy(url, dict(proxies)) if url and proxies else None
    if proxy:
        where += f" through the proxy {safe_url(proxy).rstrip('/')}"
    return where


@contextlib.contextmanager
def map_transport_errors(
    token: Optional[CancelToken],
    operation: str,
    url: str = "",
    proxies: Optional[Mapping[str, str]] = None,
) -> Iterator[None]:
    """The one exception seam between requests/urllib3 and the library's errors.

    On entry, a token that already fired raises :class:`Cancelled`. On exit with a
    requests, urllib3, ``http.client`` or socket error: :class:`Cancelled` if the token has
    fired (the error was most likely our own abort), else :class:`TransportTimeout` for a
    connect or read timeout, :class:`ConfigError` for an unusable URL, and
    :class:`TransportError` for everything else (refused, reset, TLS, truncated answer).
    Messages say which URL failed (scheme, host, port and path only, see :func:`safe_url`),
    through which proxy, and why. The original exception is always chained
    (``raise ... from exc``). Library errors, ``KeyboardInterrupt`` and programming errors
    pass through unchanged.

    Args:
        token: the caller's cancel token, or None.
        operation: what is being done, e.g. ``"POST /v2/sandboxes"`` (goes into messages;
            must not contain secrets).
        url: the request's URL (only its safe part goes into messages).
        proxies: the proxies the request was sent with (to name the one used).

    Raises:
        Cancelled, TransportTimeout, TransportError, ConfigError: see above.
    """
    if token is not None:
        token.raise_if_cancelled()
    try:
        yield
    except E2BProviderError:
        raise
    except _TRANSPORT_EXCEPTIONS as exc:
        if token is not None and token.cancelled:
            raise Cancelled(token.reason) from exc
        what = f"E2B {operation}" if operation else "E2B request"
        if isinstance(exc, _BAD_URL_EXCEPTIONS):
            raise ConfigError(f"{what}: invalid URL ({type(exc).__name__})") from exc
        where = _where(url, proxies)
        if _is_timeout(exc):
            raise TransportTimeout(f"{what} timed out waiting for {where} ({_detail(exc)})"
                                   ) from exc
        if any(isinstance(e, requests.exceptions.SSLError) for e in _chain(exc)):
            raise TransportError(f"{what}: TLS failure with {where} ({_detail(exc)})") from exc
        why = _why(exc)
        raise TransportError(
            f"{what}: connection to {where} failed{': ' + why if why else ''} "
            f"({_detail(exc)})"
        ) from exc


def error_from_response(resp: HttpResponse, operation: str) -> E2BHttpError:
    """Build the exception for an HTTP error answer (the caller raises it).

    The body is parsed as the E2B/Connect error JSON ``{code, message, error_code}``; a body
    that is not JSON becomes the message. The error class is :class:`AuthenticationError`
    for 401/403, :class:`NotFound` for 404, :class:`Conflict` for 409, and plain
    :class:`E2BHttpError` otherwise. The message is cut to 300 characters by the error class.

    Args:
        resp: the answer.
        operation: what was being done, e.g. ``"POST /v2/sandboxes"``.

    Returns:
        The exception, with ``status``, ``code``, ``error_code`` and ``operation`` set.
    """
    message, code, error_code = parse_error_body(resp.body)
    cls: type = E2BHttpError
    if resp.status in (401, 403):
        cls = AuthenticationError
    elif resp.status == 404:
        cls = NotFound
    elif resp.status == 409:
        cls = Conflict
    err: E2BHttpError = cls(
        resp.status, message, code, error_code=error_code, operation=operation
    )
    return err


def parse_error_body(body: bytes) -> Tuple[str, Union[int, str, None], Optional[str]]:
    """``(message, code, error_code)`` from an error body; non-JSON text becomes the message."""
    text = body[:64 * 1024].decode("utf-8", errors="replace").strip()
    message = text
    code: Union[int, str, None] = None
    error_code: Optional[str] = None
    try:
        obj = json_mod.loads(text) if text else None
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        m = obj.get("message")
        message = m if isinstance(m, str) else text
        c = obj.get("code")
        if isinstance(c, (int, str)) and not isinstance(c, bool):
            code = c
        ec = obj.get("error_code")
        if isinstance(ec, str) and ec:
            error_code = ec
    return message, code, error_code


def _redirect_error(status: int, operation: str) -> E2BHttpError:
    # The Location header is deliberately not echoed: its query could carry a secret.
    return E2BHttpError(status, "unexpected redirect (redirects are never followed)",
                        operation=operation)


# --------------------------------------------------------------------------------------
# abortable connections
# --------------------------------------------------------------------------------------

_tls = threading.local()

#: A pooled connection idle for longer than this is closed instead of reused: servers and
#: proxies drop idle keep-alive connections (aiohttp and nginx after 75 s), and a request
#: sent just as the peer closes would fail. Shorter than any common server idle timeout.
IDLE_CONNECTION_SECONDS = 30.0
_SLOT = "_e2b_slot"  # the abort slot a connection is published in
_DEAD = "_e2b_dead"  # set once the connection was shut down by an abort: never reused
_IDLE = "_e2b_idle"  # monotonic time the connection went back to the pool
_SOCK = "_e2b_sock"  # the socket published with the connection (see _AbortSlot.attach)
_SETUP = "_e2b_setup"  # a duplicate of a new connection's socket while it is set up


class _AbortSlot:
    """Where one request's connection is published so another thread can shut it down.

    The connection publishes itself (:meth:`attach`) while it serves the request and
    leaves (:meth:`detach`) before it goes back to the pool, both under the slot's lock.
    :meth:`fire` shuts down only a connection that is still attached and marks it dead,
    so the pool closes it instead of keeping it: a cancel or abort that comes late can
    never touch a connection that another request may already be using. :meth:`expire`
    is :meth:`fire` for a request whose deadline passed (:attr:`expired` tells them apart).
    """

    __slots__ = ("_conn", "_done", "_expired", "_fired", "_lock", "_used")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: Optional[urllib3.connection.HTTPConnection] = None
        self._fired = False
        self._expired = False
        self._done = False
        self._used = False

    @property
    def fired(self) -> bool:
        return self._fired

    @property
    def expired(self) -> bool:
        """True when the request's deadline (not a cancel or abort) shut it down."""
        return self._expired

    @property
    def used(self) -> bool:
        """True once a connection was published here (False for connection classes that
        do not publish themselves, e.g. a SOCKS proxy's)."""
        return self._used

    def attach(self, conn: urllib3.connection.HTTPConnection) -> None:
        with self._lock:
            if self._done:
                return
            self._conn = conn
            self._used = True
            conn.__dict__[_SLOT] = self
            # http.client lets go of the socket of a close-delimited answer (conn.sock is
            # then None, the answer reads on through its own file object): keep it here.
            conn.__dict__[_SOCK] = conn.sock
            if self._fired:
                _shutdown_conn(conn)

    def detach(self, conn: object) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None

    def fire(self, expired: bool = False) -> None:
        with self._lock:
            if self._done or self._fired:
                return
            self._fired = True
            self._expired = expired
            if self._conn is not None:
                # shutdown(2) does not block; doing it under the lock means a connection
                # cannot be released to the pool (detach) half-way through.
                _shutdown_conn(self._conn)

    def expire(self) -> None:
        """The request's deadline passed (a watchdog callback: it never blocks)."""
        self.fire(expired=True)

    def finish(self) -> None:
        with self._lock:
            self._done = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.__dict__.pop(_SLOT, None)


def _shutdown_conn(conn: urllib3.connection.HTTPConnection) -> None:
    conn.__dict__[_DEAD] = True
    for sock in (getattr(conn, "sock", None) or conn.__dict__.get(_SOCK),
                 conn.__dict__.get(_SETUP)):
        if sock is None:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError, AttributeError):
            pass


def _quickack(sock: Optional[socket.socket]) -> None:
    """Acknowledge what arrives at once (Linux): on a kept connection the kernel delays its
    ACKs, and a peer that has Nagle's algorithm on holds its next small write (the first
    chunk after the headers, the chunked terminator) until that ACK: 40 ms or more per
    answer. Fresh connections start in this mode; kept ones need to be told."""
    if _QUICKACK is not None and sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        except OSError:
            pass


def _answer_sock(raw: Any) -> Optional[socket.socket]:
    """The socket of the connection an answer (``resp.raw``) is read from, while the answer
    still holds it (None once urllib3 put the connection back in the pool)."""
    return getattr(getattr(raw, "connection", None), "sock", None)


def _publish(conn: urllib3.connection.HTTPConnection) -> None:
    slot: Optional[_AbortSlot] = getattr(_tls, "slot", None)
    if slot is not None and conn.sock is not None:
        slot.attach(conn)


class _AbortableHTTPConnection(urllib3.connection.HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        # Published as soon as the TCP connection exists: a deadline or cancel then also
        # reaches a proxy tunnel or TLS handshake that a peer stalls. Wrapping for TLS
        # takes the descriptor away from ``sock`` before the handshake, so a duplicate is
        # kept until the connection is set up: shutting it down stops the handshake.
        self.__dict__[_SETUP] = sock.dup()
        self.sock = sock
        _publish(self)
        return sock

    def connect(self) -> None:
        self.__dict__.pop(_DEAD, None)  # a fresh socket
        try:
            super().connect()
        finally:
            setup = self.__dict__.pop(_SETUP, None)
            if setup is not None:
                setup.close()
        _publish(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _publish(self)  # a pooled connection is already connected
        super().request(*args, **kwargs)

    def send(self, data: Any) -> None:
        # urllib3 sends with the connect timeout, which bounds a whole ``sendall``: a large
        # upload on a slow link would fail after it. Sending is bounded by the request's
        # deadline instead (the watchdog shuts the socket down when it passes).
        limit: Optional[Deadline] = getattr(_tls, "limit", None)
        if limit is not None and self.sock is not None:
            self.sock.settimeout(max(limit.remaining(), _MIN_WAIT))
        super().send(data)

    def getresponse(self) -> Any:
        _quickack(self.sock)
        return super().getresponse()


class _AbortableHTTPSConnection(_AbortableHTTPConnection, urllib3.connection.HTTPSConnection):
    pass


def _returning(conn: Any) -> bool:
    """A connection is going back to its pool: leave the abort slot first (so no late abort
    can reach it once other requests can take it). False if it must not be kept: an abort
    shut it down (it is closed here)."""
    d = getattr(conn, "__dict__", None)
    if d is None:
        return True
    slot = d.pop(_SLOT, None)
    if isinstance(slot, _AbortSlot):
        slot.detach(conn)
    d.pop(_SOCK, None)
    if d.pop(_DEAD, False):
        conn.close()
        return False
    if getattr(conn, "sock", None) is not None:
        d[_IDLE] = time.monotonic()
    return True


class _HTTPPool(urllib3.connectionpool.HTTPConnectionPool):
    """A pool of abortable connections that closes idle ones and can be retired.

    urllib3 2 no longer closes a pool its PoolManager lets go of (when the transport closes,
    or to make room for another host), so its idle sockets stayed open until garbage
    collection. :meth:`retire` closes them at once, and every connection that comes back
    later, without disabling the pool under a request that is still using it.
    """

    ConnectionCls: Any = _AbortableHTTPConnection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._e2b_lock = threading.Lock()
        self._e2b_retired = False

    def _get_conn(self, timeout: Optional[float] = None) -> Any:
        conn = super()._get_conn(timeout)
        since = conn.__dict__.pop(_IDLE, None)
        if since is not None and time.monotonic() - since > IDLE_CONNECTION_SECONDS:
            conn.close()  # reconnects on use
        return conn

    def _put_conn(self, conn: Any) -> None:
        if conn is not None and not _returning(conn):
            conn = None  # closed: keep its place in the queue empty
        with self._e2b_lock:
            if not self._e2b_retired:
                super()._put_conn(conn)
                return
        if conn is not None:
            conn.close()

    def retire(self) -> None:
        """Close the idle connections now and each busy one when it comes back."""
        with self._e2b_lock:
            self._e2b_retired = True
            idle = self.pool
            conns = []
            while idle is not None:
                try:
                    conns.append(idle.get(block=False))
                except queue.Empty:
                    break
        for conn in conns:
            if conn is not None:
                conn.close()


class _HTTPSPool(_HTTPPool, urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _AbortableHTTPSConnection


def _retire(pool: object) -> None:
    """What a pool manager does with a pool it lets go of."""
    if isinstance(pool, _HTTPPool):
        pool.retire()


_POOL_CLASSES: Dict[str, type] = {"http": _HTTPPool, "https": _HTTPSPool}


# (The ``type: ignore``s below: on Python 3.9 pip installs types-requests 2.32, whose
# HTTPAdapter methods are untyped; 2.33 and later type them.)
class _Adapter(requests.adapters.HTTPAdapter):
    """An HTTPAdapter whose pools hand out abortable connections."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)  # type: ignore[no-untyped-call,unused-ignore]
        self.poolmanager.pool_classes_by_scheme = dict(_POOL_CLASSES)
        self.poolmanager.pools.dispose_func = _retire

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)  # type: ignore[no-untyped-call,unused-ignore]
        if type(manager) is urllib3.poolmanager.ProxyManager:
            manager.pool_classes_by_scheme = dict(_POOL_CLASSES)
            manager.pools.dispose_func = _retire
        return manager


def _requests_error(exc: BaseException) -> BaseException:
    """The ``requests`` exception ``HTTPAdapter.send`` raises for the urllib3 (or socket)
    error ``exc`` of ``urlopen`` (``exc`` itself when it raises that unchanged), so that a
    request sent without ``requests`` (:meth:`Transport._send_known`) fails with the same
    exceptions, chained the same way, and so with the same messages."""
    rex = requests.exceptions
    u3 = urllib3.exceptions
    if isinstance(exc, (u3.ProtocolError, OSError)):
        return rex.ConnectionError(exc)
    if isinstance(exc, u3.MaxRetryError):
        reason = exc.reason
        if isinstance(reason, u3.ConnectTimeoutError) and not isinstance(
            reason, u3.NewConnectionError
        ):
            return rex.ConnectTimeout(exc)
        if isinstance(reason, u3.ResponseError):
            return rex.RetryError(exc)
        if isinstance(reason, u3.ProxyError):
            return rex.ProxyError(exc)
        if isinstance(reason, u3.SSLError):
            return rex.SSLError(exc)
        return rex.ConnectionError(exc)
    if isinstance(exc, u3.ClosedPoolError):
        return rex.ConnectionError(exc)
    if isinstance(exc, u3.ProxyError):
        return rex.ProxyError(exc)
    if isinstance(exc, u3.SSLError):
        return rex.SSLError(exc)
    if isinstance(exc, u3.ReadTimeoutError):
        return rex.ReadTimeout(exc)
    if isinstance(exc, u3.InvalidHeader):
        return rex.InvalidHeader(exc)
    return exc


class _Answer:
    """The answer of a request sent by :meth:`Transport._send_known`: what the transport
    uses of a ``requests.Response`` (``status_code``, ``headers``, ``raw``, ``url``,
    ``close()``), without the cost of making one (its cookie jar above all)."""

    __slots__ = ("headers", "raw", "status_code", "url")

    def __init__(self, raw: Any, url: str) -> None:
        self.raw = raw
        self.status_code: int = raw.status
        found = raw.headers
        # one entry per name, repeated headers joined by ", " (as requests makes them), the
        # names in lower case (how the library looks them up)
        self.headers: Dict[str, str] = {name.lower(): found[name] for name in found}
        self.url = url

    def close(self) -> None:
        """As ``requests.Response.close()`` for an answer whose content was not read whole:
        before the end of the body this closes the connection."""
        self.raw.close()
        release = getattr(self.raw, "release_conn", None)
        if release is not None:
            release()


#: The answer a request gets: a ``requests.Response``, or an :class:`_Answer`.
_Response = Union[requests.Response, _Answer]


@contextlib.contextmanager
def _publishing(
    slot: _AbortSlot, token: Optional[CancelToken], limit: Deadline
) -> Iterator[None]:
    """Publish ``slot`` (and the request's deadline) for this thread's request and wire it
    to ``token`` meanwhile."""
    unregister = token.on_cancel(lambda _r: slot.fire()) if token is not None else None
    prev = getattr(_tls, "slot", None), getattr(_tls, "limit", None)
    _tls.slot = slot
    _tls.limit = limit
    try:
        yield
    finally:
        _tls.slot, _tls.limit = prev
        if unregister is not None:
            unregister()


# --------------------------------------------------------------------------------------
# streams
# --------------------------------------------------------------------------------------


class Stream:
    """A streaming HTTP answer whose body is read in pieces as they arrive.

    :meth:`read1` returns as soon as any bytes are available (it never waits to fill its
    buffer). :meth:`abort` may be called from any thread at any time, also while another
    thread is blocked in :meth:`read1`: it shuts the socket down so that read wakes at once.
    After an abort every read raises ``TransportError("stream aborted")``; :attr:`aborted`
    tells that apart from a peer that dropped the connection (also a ``TransportError``).

    Connections: a body read to its end (``read1`` returned ``b""``, or :meth:`finish`
    found the end) gives its connection back to the pool for the next request. A stream
    closed or aborted before its end closes its connection: it is never reused.
    """

    def __init__(
        self,
        resp: _Response,
        operation: str,
        slot: _AbortSlot,
        *,
        timer: Optional[TimerHandle],
        overrun: Callable[[], str],
    ) -> None:
        self._resp = resp
        self._raw: Any = resp.raw
        self._operation = operation
        # The connection stays published in the slot until it goes back to the pool, so
        # abort() reaches it exactly as long as this stream owns it.
        self._slot = slot
        # The deadline's timer when it bounds the whole body (cancelled on release), and
        # what makes the message said when it passed.
        self._timer = timer
        self._overrun = overrun
        self.status: int = resp.status_code
        self.headers: Mapping[str, str] = _lower_headers(resp.headers)
        self._lock = threading.Lock()
        self._aborted = False
        self._closed = False
        self._reading = False
        self._eof = False
        self._started = False  # a body byte was asked for

    @property
    def aborted(self) -> bool:
        """True once :meth:`abort` was called."""
        return self._aborted

    @property
    def closed(self) -> bool:
        """True once the stream was closed (or aborted and released)."""
        return self._closed

    def read1(self, n: int = _READ_CHUNK) -> bytes:
        """Read up to ``n`` bytes, returning as soon as any are available.

        Returns:
            The bytes, or ``b""`` at the end of the body.

        Raises:
            TransportError: the stream was aborted ("stream aborted"), or the connection
                dropped or broke mid-body.
            TransportTimeout: no byte arrived within the read timeout.
        """
        data = self._guarded(lambda: self._raw.read1(n), "read1")
        if data is None:
            return b""
        if not data:
            if self._aborted:
                raise self._aborted_error()
            if self._slot.expired:  # the deadline's shutdown looks like the body's end
                raise TransportTimeout(self._overrun())
            self._eof = True
        return bytes(data)

    def _aborted_error(self) -> TransportError:
        return TransportError(f"E2B {self._operation}: stream aborted")

    def _guarded(self, read: Callable[[], bytes], what: str) -> Optional[bytes]:
        """``read()`` as the stream's only reader, its errors mapped (None: the stream is
        closed or at its end). An abort that came meanwhile releases the stream here."""
        with self._lock:
            if self._aborted:
                raise self._aborted_error()
            if self._closed or self._eof:
                return None
            if self._reading:
                raise RuntimeError(f"Stream.{what} called from two threads at once")
            self._reading = True
            self._started = True
        try:
            try:
                return read()
            except Exception as exc:
                if self._aborted:
                    raise self._aborted_error() from exc
                if self._slot.expired:
                    raise TransportTimeout(self._overrun()) from exc
                with map_transport_errors(None, self._operation, self._resp.url or ""):
                    raise
        finally:
            with self._lock:
                self._reading = False
                close_now = self._aborted and not self._closed
            if close_now:
                self._release()

    def read_all(self, max_bytes: int, *, truncate: bool = False) -> bytes:
        """Read the rest of the body.

        A body not read yet whose length is known (``Content-Length``, no content coding)
        and at most ``max_bytes`` is read in one call, straight into the bytes returned
        (no per-piece work, no second copy).

        Args:
            max_bytes: the most bytes to accept.
            truncate: when True, stop quietly after ``max_bytes`` (for error bodies);
                otherwise a longer body raises.

        Raises:
            ProtocolError: the body is longer than ``max_bytes`` (and ``truncate`` is False).
            TransportError, TransportTimeout: as :meth:`read1`.
        """
        whole = self._whole_length(max_bytes)
        if whole is not None:
            return self._read_whole(whole)
        buf = bytearray()
        while True:
            chunk = self.read1(_READ_CHUNK)
            if not chunk:
                return bytes(buf)
            buf += chunk
            if len(buf) > max_bytes:
                if truncate:
                    return bytes(buf[:max_bytes])
                self.abort()
                raise ProtocolError(
                    f"E2B {self._operation}: answer is larger than {max_bytes} bytes"
                )

    def _whole_length(self, max_bytes: int) -> Optional[int]:
        """The body's length if :meth:`read_all` may read it in one call, else None."""
        length = self.headers.get("content-length", "")
        coding = self.headers.get("content-encoding", "identity").strip().lower()
        if (
            self._started
            or not length.isdigit()
            or not 0 < int(length) <= max_bytes
            or coding not in ("", "identity")
            or "chunked" in self.headers.get("transfer-encoding", "").lower()
        ):
            return None
        return int(length)

    def _read_whole(self, length: int) -> bytes:
        """Read exactly ``length`` body bytes in one call (guarded as :meth:`read1`)."""
        # After the last byte urllib3 returns the connection to the pool itself.
        data = self._guarded(lambda: self._raw.read(length, decode_content=False), "read_all")
        if data is None:
            return b""
        if self._aborted:
            raise self._aborted_error()
        if len(data) != length:
            self.abort()
            if self._slot.expired:  # cut short by the deadline's shutdown
                raise TransportTimeout(self._overrun())
            raise TransportError(
                f"E2B {self._operation}: the connection ended {length - len(data)} bytes "
                "before the end of the answer"
            )
        self._eof = True
        return bytes(data)

    def finish(self, bound: float = END_WAIT_SECONDS) -> None:
        """Read the end of a body whose content is known to be complete, then close.

        Call it when the protocol carried in the body has ended (envd sent its
        end-of-stream message): all that should be left is the HTTP framing's end (the
        chunked terminator). Reading it lets the connection go back to the pool. The wait
        is bounded: a peer that does not end the body within ``bound`` seconds has its
        connection dropped, without an error (the content was complete). Idempotent; after
        an abort or close it only closes.

        Raises:
            ProtocolError: more body bytes came after the end (the connection is dropped).
        """
        extra: Optional[bytes] = b""
        with self._lock:
            pending = not (self._eof or self._closed or self._aborted or self._reading)
        if pending:
            sock = _answer_sock(self._raw)
            try:
                if sock is not None:
                    # The next request on this connection sets its own timeout again.
                    sock.settimeout(bound)
                    _quickack(sock)
                extra = self.read1(_READ_CHUNK)
            except (E2BProviderError, OSError, RuntimeError):
                extra = None  # timed out or broke: the content is complete all the same
        if extra is None or extra:
            self.abort()
        self.close()
        if extra:
            raise ProtocolError(f"E2B {self._operation}: data after the end of the stream")

    def abort(self) -> None:
        """Shut the connection down now; thread-safe and idempotent, a no-op after close."""
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            if self._closed:
                return
            self._shut()
            reading = self._reading
        if not reading:
            self._release()

    def _shut(self) -> None:
        # shutdown() first: close() from another thread would block behind a read. Through
        # the slot, only while the connection is ours (never once it is back in the pool).
        self._slot.fire()
        if not self._slot.used and not self._eof:
            # A connection that did not publish itself (a SOCKS proxy's): best effort.
            # urllib3 >= 2.5 refuses (RuntimeError) once the connection went back to the pool.
            try:
                self._raw.shutdown()
            except (ValueError, RuntimeError, OSError, AttributeError, TypeError):
                pass

    def close(self) -> None:
        """Release the answer (idempotent). A reader blocked in another thread is woken.

        Closing before the end of the body closes the connection (it is never reused).
        """
        with self._lock:
            if self._closed:
                return
            if self._reading:
                # Never close under a reader's feet: wake it, it releases on its way out.
                self._aborted = True
                self._shut()
                return
        self._release()

    def _release(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            # Before the end of the body this closes the connection; after it, urllib3 has
            # already put the connection back in the pool and this is a no-op.
            self._resp.close()
        except Exception:  # closing a broken connection must never mask the real error
            log.debug("closing a stream failed", exc_info=True)
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._slot.finish()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RawStream:
    """A streaming answer on a connection of its own, read straight from its socket.

    For a reader that waits with a timeout of its own on every read and must lose nothing
    when that timeout passes (a terminal's output, read on the caller's thread): a timed-out
    read of a ``requests``/``http.client`` answer closes its connection, and their buffers
    hide bytes from a ``select``. Here the body is framed by
    :class:`~e2b_provider.protocol.http1.Framer` (chunked, a length, or the end of the connection)
    from what ``recv`` gives, so nothing sits between the socket and the reader: :meth:`read`
    returns all it received.

    :meth:`read` returns the body's content as soon as any is there, ``b""`` at its end, or
    None when nothing came within its timeout (the stream goes on). A peer silent for longer
    than ``read_timeout`` ends it with :class:`TransportTimeout` (envd's keepalives keep a
    live stream talking): once that long passed since the last byte, a read looks at the
    socket once more before it says so, since what the peer sent while nobody read waits
    there (or the peer waits, once the buffers are full): a stream left unread for any time
    reads on where it was. :meth:`abort` may be called from any thread at any time: it
    shuts the socket down, a blocked read wakes and raises
    ``TransportError("stream aborted")``.
    The connection is never pooled; :meth:`close` closes it.
    """

    def __init__(
        self,
        conn: Any,
        head: Head,
        framer: Framer,
        body: collections.deque[bytes],
        ended: bool,
        *,
        operation: str,
        url: str,
        read_timeout: float,
    ) -> None:
        self._conn = conn
        self._sock: Any = conn.sock
        self._framer = framer
        self._body = body
        self._ended = ended
        self._operation = operation
        self._url = url
        self._read_timeout = read_timeout
        self._heard = time.monotonic()
        self.status: int = head.status
        self.headers: Mapping[str, str] = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers
        }
        self._lock = threading.Lock()
        self._reading = False
        self._aborted = False
        self._closed = False

    @property
    def aborted(self) -> bool:
        """True once :meth:`abort` was called."""
        return self._aborted

    def fileno(self) -> int:
        """The socket's descriptor, for ``select`` (readable: :meth:`read` may have more)."""
        return int(self._sock.fileno())

    def read(self, timeout: Optional[float]) -> Optional[bytes]:
        """The content received since the last read, as soon as there is any.

        Args:
            timeout: the longest to wait for it, in seconds (0: do not wait; None: as long
                as the peer keeps talking).

        Returns:
            The bytes; ``b""`` at the end of the body; None when nothing came within
            ``timeout``.

        Raises:
            TransportError: the stream was aborted ("stream aborted"), or the connection
                broke or ended before the end of the body.
            TransportTimeout: the peer sent nothing for ``read_timeout`` seconds (nothing
                came since, the socket looked at once more).
            ProtocolError: the answer is not HTTP/1.1 this stream can frame.
        """
        with self._lock:
            if self._aborted:
                raise self._aborted_error()
            if self._closed:
                raise TransportError(f"E2B {self._operation}: the stream is closed")
            if self._reading:
                raise RuntimeError("RawStream.read called from two threads at once")
            self._reading = True
        try:
            return self._read(timeout)
        finally:
            with self._lock:
                self._reading = False

    def _aborted_error(self) -> TransportError:
        return TransportError(f"E2B {self._operation}: stream aborted")

    def _take(self, events: Any) -> None:
        for kind, payload in events:
            if kind == BODY and payload:
                self._body.append(payload)
            elif kind == END:
                self._ended = True

    def _read(self, timeout: Optional[float]) -> Optional[bytes]:
        ends = None if timeout is None else time.monotonic() + max(0.0, timeout)
        tried = False  # once the timeout passed: one last look without waiting
        while True:
            if self._body:
                data = b"".join(self._body)
                self._body.clear()
                return data
            if self._ended:
                return b""
            now = time.monotonic()
            # past the bound, one look without waiting: what came while nobody read counts
            silent = self._heard + self._read_timeout - now
            wait = max(0.0, silent)
            if ends is not None:
                left = ends - now
                if left <= 0:
                    if tried:
                        return None
                    tried = True
                    left = 0.0
                wait = min(wait, left)
            try:
                # 0 makes the socket non-blocking for this one look
                self._sock.settimeout(wait if wait > 0 else 0.0)
                data = self._sock.recv(_READ_CHUNK)
            except (socket.timeout, BlockingIOError, ssl.SSLWantReadError,
                    ssl.SSLWantWriteError):
                if self._aborted:
                    raise self._aborted_error() from None
                if silent <= 0:
                    raise TransportTimeout(
                        f"E2B {self._operation}: {safe_url(self._url)} sent nothing for "
                        f"{self._read_timeout:g} s"
                    ) from None
                continue
            except OSError as exc:
                if self._aborted:
                    raise self._aborted_error() from exc
                with map_transport_errors(None, self._operation, self._url):
                    raise
                raise  # pragma: no cover - map_transport_errors always raises
            if self._aborted:
                raise self._aborted_error()
            try:
                if not data:
                    self._take(self._framer.eof())
                    if not self._ended:
                        raise TransportError(
                            f"E2B {self._operation}: the connection to "
                            f"{safe_url(self._url)} ended before the end of the answer"
                        )
                    continue
                self._heard = time.monotonic()
                self._take(self._framer.feed(data))
            except FramingError as exc:
                if not data:
                    raise TransportError(
                        f"E2B {self._operation}: the connection to {safe_url(self._url)} "
                        "ended before the end of the answer"
                    ) from None
                raise ProtocolError(
                    f"E2B {self._operation}: the answer is not HTTP/1.1 it can read ({exc})"
                ) from None

    def read_all(self, max_bytes: int, timeout: float) -> bytes:
        """The rest of the body, at most ``max_bytes`` (the rest is dropped), read within
        ``timeout`` seconds (what came by then, if it did not end)."""
        buf = bytearray()
        ends = time.monotonic() + timeout
        while len(buf) < max_bytes:
            piece = self.read(max(0.0, ends - time.monotonic()))
            if not piece:
                break
            buf += piece
        return bytes(buf[:max_bytes])

    def abort(self) -> None:
        """Shut the connection down now; thread-safe and idempotent."""
        with self._lock:
            if self._aborted or self._closed:
                self._aborted = True
                return
            self._aborted = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError, AttributeError):
            pass

    def close(self) -> None:
        """Close the connection (idempotent); a reader blocked in another thread is woken
        (it raises "stream aborted")."""
        with self._lock:
            if self._closed:
                return
            reading = self._reading
            if not reading:
                self._closed = True
        if reading:
            self.abort()
            return
        try:
            self._conn.close()
        except Exception:  # closing a broken connection must never mask the real error
            log.debug("closing a raw stream failed", exc_info=True)

    def __enter__(self) -> RawStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



# --------------------------------------------------------------------------------------
# transport
# --------------------------------------------------------------------------------------


def _overrun(operation: str, url: str, limit: Deadline, began: float) -> str:
    """The message of a request (begun at ``began``) that ``limit`` cut short."""
    total = limit.at - began
    return (f"E2B {operation} timed out: {safe_url(url)} gave no complete answer "
            f"within {total:.3g} s")


def _positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number of seconds")
    return float(value)


def _origin(url: str) -> str:
    """``scheme://host:port`` of a prepared URL (which always has a path)."""
    start = url.find("://")
    end = url.find("/", start + 3) if start >= 0 else -1
    return url[:end] if end >= 0 else url


_PROXY_CACHE_MAX = 4096


class Transport:
    """A thread-safe HTTP client for the control plane and envd.

    One ``requests`` HTTPAdapter (its urllib3 pools) is shared by all threads. Requests are
    prepared here rather than by a ``requests.Session``: no cookies are stored or sent,
    ``~/.netrc`` is ignored, redirects are never followed and nothing is retried. Sized for
    the workload: ``pool_connections`` is the number of hosts kept (every E2B sandbox is
    its own host), ``pool_maxsize`` the connections kept per host (concurrent commands on
    one sandbox). Connections are kept alive between requests (idle ones for at most
    :data:`IDLE_CONNECTION_SECONDS`).

    The environment is read as ``requests`` reads it, but once: the proxies
    (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, lower case first) and the CA bundle
    (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``) when the transport is made, and whether
    ``NO_PROXY`` exempts a host on its first request. Later changes to the environment do
    not affect an existing transport.

    Every request has a total deadline (see the module's header); the ``watchdog``'s timer
    thread enforces it.

    Args:
        pool_connections: hosts whose connection pools are kept.
        pool_maxsize: connections kept per host (more may be opened; they are not kept).
        connect_timeout: seconds to establish a connection (TCP and TLS).
        user_agent: the ``User-Agent`` header.
        watchdog: the timer thread that enforces deadlines; default the process-wide one.
    """

    def __init__(
        self,
        *,
        pool_connections: int = 32,
        pool_maxsize: int = 256,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        user_agent: str = f"e2b-provider/{__version__}",
        watchdog: Optional[Watchdog] = None,
    ) -> None:
        for name, n in (("pool_connections", pool_connections), ("pool_maxsize", pool_maxsize)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"{name} must be a positive int")
        self._connect_timeout = _positive(connect_timeout, "connect_timeout")
        self._adapter = _Adapter(
            pool_connections=pool_connections,
            pool_maxsize=pool_maxsize,
            max_retries=0,
            pool_block=False,
        )
        headers = dict(requests.utils.default_headers())
        headers["User-Agent"] = user_agent
        self._headers: Dict[str, str] = headers
        self._env_proxies: Dict[str, str] = dict(urllib.request.getproxies())
        self._verify: Union[bool, str] = (
            os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
        )
        self._proxies: Dict[str, Dict[str, str]] = {}
        # Streams sent before, without a proxy: the pool and request path requests chose
        # for the URL (see _send_known), and the headers requests found valid.
        self._known: Dict[str, Tuple[_HTTPPool, str]] = {}
        self._valid_headers: Dict[Tuple[str, str], bool] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._watchdog = watchdog

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Close every pooled connection (idempotent). Later requests raise TransportError.

        A stream or request still in flight keeps its connection until it ends; then the
        connection is closed (the pools are gone), not kept.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._known = {}
        self._adapter.close()  # type: ignore[no-untyped-call,unused-ignore]

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise TransportError(f"E2B {operation}: the transport is closed")

    def _proxies_for(self, url: str) -> Dict[str, str]:
        """The proxies for ``url``'s host: the environment's, or none if ``NO_PROXY``
        exempts the host (decided once per host, as ``requests`` decides per request)."""
        if not self._env_proxies:
            return self._env_proxies
        key = _origin(url)
        proxies = self._proxies.get(key)
        if proxies is None:
            bypass = requests.utils.should_bypass_proxies(url, no_proxy=None)
            proxies = {} if bypass else self._env_proxies
            if len(self._proxies) >= _PROXY_CACHE_MAX:
                self._proxies.clear()
            self._proxies[key] = proxies
        return proxies

    def _limit(
        self, deadline: Optional[Deadline], read_timeout: float, operation: str
    ) -> Deadline:
        """The request's deadline: the caller's, or connect plus read timeout from now.

        Raises:
            TransportTimeout: it has passed already (nothing is sent).
        """
        if deadline is None:
            limit = Deadline.after(self._connect_timeout + read_timeout)
        elif not isinstance(deadline, Deadline):
            raise ConfigError("deadline must be a Deadline")
        else:
            limit = deadline
        if limit.expired():
            raise TransportTimeout(f"E2B {operation} timed out: no time was left to send it")
        return limit

    def _arm(self, slot: _AbortSlot, limit: Deadline) -> Optional[TimerHandle]:
        """Have the watchdog shut the request down when ``limit`` passes."""
        left = limit.remaining()
        if left == math.inf:
            return None
        wd = self._watchdog
        if wd is None or wd.closed:
            wd = Watchdog.default()
        return wd.call_later(left, slot.expire)

    def _send(
        self,
        method: str,
        url: str,
        *,
        token: Optional[CancelToken],
        operation: str,
        read_timeout: float,
        connect_timeout: Optional[float],
        limit: Deadline,
        headers: Optional[Mapping[str, str]],
        params: Params = None,
        json: Any = None,
        data: Any = None,
        files: Any = None,
        stream: bool = False,
    ) -> _Response:
        """Send one request (the caller publishes its abort slot) and return the answer once
        its headers arrived; every failure goes through :func:`map_transport_errors`.

        The connect and read timeouts are clamped to the time ``limit`` leaves. A stream's
        request (``stream``) that :meth:`_known_for` allows is sent by
        :meth:`_send_known`; one sent through ``requests`` is remembered for that."""
        if stream and not params and json is None and files is None:
            known = self._known_for(url, method, data)
            if known is not None:
                return self._send_known(
                    known, method, url, token=token, operation=operation,
                    read_timeout=read_timeout, connect_timeout=connect_timeout, limit=limit,
                    headers=headers, data=data,
                )
        self._check_open(operation)
        read_timeout = _positive(read_timeout, "read_timeout")
        left = max(limit.remaining(), _MIN_WAIT)
        connect = min(connect_timeout or self._connect_timeout, left)
        proxies: Dict[str, str] = {}  # filled in before anything can fail to connect
        with map_transport_errors(token, operation, url, proxies):
            proxies.update(self._proxies_for(url))
            prep = requests.PreparedRequest()
            prep.prepare_method(method)
            # Encoded here as requests would, but without its per-call type probing.
            query = (
                urllib.parse.urlencode([(k, v) for k, v in params.items()]) if params else None
            )
            prep.prepare_url(url, query)
            full_url = prep.url or ""
            if not full_url.lower().startswith(("http://", "https://")):
                raise requests.exceptions.InvalidSchema(
                    "no connection adapter for the URL scheme"
                )
            if headers:
                merged = dict(self._headers)
                merged.update(headers)  # later keys win, also against a different case
                prep.prepare_headers(merged)
            else:
                prep.prepare_headers(self._headers)
            prep.prepare_body(data, files, json)
            resp = self._adapter.send(
                prep,
                stream=True,
                timeout=(connect, min(read_timeout, left)),
                verify=self._verify,
                cert=None,
                proxies=proxies,
            )
            if 300 <= resp.status_code < 400:
                # Never followed; the Location header is not looked at.
                resp.close()
                raise _redirect_error(resp.status_code, operation)
            if stream and not params and json is None and files is None:
                self._remember(url, resp, proxies)
            return resp

    #: Entries of the known-stream and valid-header caches, each (cleared when full).
    _KNOWN_MAX = 4096

    def _remember(self, url: str, resp: requests.Response, proxies: Mapping[str, str]) -> None:
        """After ``requests`` sent a stream's request to ``url`` without a proxy, remember
        the pool it chose and the path it sent, for :meth:`_send_known`."""
        pool = getattr(resp.raw, "_pool", None)
        prep = resp.request
        if proxies or not isinstance(pool, _HTTPPool) or prep is None:
            return
        path = prep.path_url
        if url not in self._known:
            if len(self._known) >= self._KNOWN_MAX:
                self._known = {}
            self._known[url] = (pool, path)
            for item in (prep.headers or {}).items():
                self._note_valid(item)

    def _note_valid(self, header: Tuple[str, str]) -> None:
        if len(self._valid_headers) >= self._KNOWN_MAX:
            self._valid_headers = {}
        self._valid_headers[header] = True

    def _known_for(self, url: str, method: str, data: Any) -> Optional[Tuple[_HTTPPool, str]]:
        """The pool and path of ``url`` when a stream's request may skip ``requests``: a
        POST of bytes to a URL ``requests`` has sent a stream to before, without a proxy
        (then and now), on a pool still in use."""
        known = self._known.get(url)
        if known is None or method != "POST" or not isinstance(data, bytes) or not data:
            return None
        if known[0]._e2b_retired or self._proxies_for(url):
            self._known.pop(url, None)
            return None
        return known

    def _send_known(
        self,
        known: Tuple[_HTTPPool, str],
        method: str,
        url: str,
        *,
        token: Optional[CancelToken],
        operation: str,
        read_timeout: float,
        connect_timeout: Optional[float],
        limit: Deadline,
        headers: Optional[Mapping[str, str]],
        data: bytes,
    ) -> _Answer:
        """:meth:`_send` for a request :meth:`_known_for` allows: the same request, on the
        same pool, with the same timeouts, errors and messages, sent with urllib3 directly
        instead of through ``requests``' preparation, adapter and response (most of the
        client's work per exec on a warm sandbox).

        Exactly what :meth:`_send` would send: the transport's default headers updated with
        ``headers`` (later names win whatever their case, as in ``requests``), each checked
        as ``requests`` checks it, ``Content-Length``, and the path ``requests`` prepared
        for ``url``; no retries, no redirects followed."""
        self._check_open(operation)
        read_timeout = _positive(read_timeout, "read_timeout")
        left = max(limit.remaining(), _MIN_WAIT)
        connect = min(connect_timeout or self._connect_timeout, left)
        pool, path = known
        merged: Dict[str, Tuple[str, str]] = {k.lower(): (k, v) for k, v in self._headers.items()}
        if headers:
            for k, v in headers.items():
                merged[k.lower()] = (k, v)
        send: Dict[str, str] = {}
        valid = self._valid_headers
        with map_transport_errors(token, operation, url):
            for item in merged.values():
                if item not in valid:
                    requests.utils.check_header_validity(item)
                    self._note_valid(item)
                send[item[0]] = item[1]
            send["Content-Length"] = str(len(data))
            try:
                raw = pool.urlopen(
                    method,
                    path,
                    body=data,
                    headers=send,
                    redirect=False,
                    assert_same_host=False,
                    preload_content=False,
                    decode_content=False,
                    retries=self._adapter.max_retries,
                    timeout=urllib3.Timeout(connect=connect, read=min(read_timeout, left)),
                    chunked=False,
                )
            except Exception as exc:
                mapped = _requests_error(exc)
                if mapped is exc:
                    raise
                raise mapped from exc
            resp = _Answer(raw, url)
            if 300 <= resp.status_code < 400:
                resp.close()
                raise _redirect_error(resp.status_code, operation)
            return resp

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        params: Params = None,
        json: Any = None,
        data: Any = None,
        files: Any = None,
        read_timeout: float,
        token: Optional[CancelToken] = None,
        operation: str,
        max_body: int = DEFAULT_MAX_BODY,
        connect_timeout: Optional[float] = None,
        deadline: Optional[Deadline] = None,
    ) -> HttpResponse:
        """Send one request and buffer its whole answer, within a total deadline.

        HTTP error statuses are returned, not raised (the caller decides); a 3xx answer
        raises, because redirects are never followed. An answer read to its end leaves its
        connection in the pool for the next request; one that is not (too large, cancelled,
        broken, past its deadline) closes it.

        Args:
            method: the HTTP method.
            url: the absolute URL.
            headers: extra request headers.
            params: query parameters.
            json: a JSON body (sets ``Content-Type: application/json``).
            data: a raw body (bytes) or form fields.
            files: multipart files, as for ``requests``.
            read_timeout: seconds to wait for each piece of the answer.
            token: aborts the request at once when it fires.
            operation: names the call in messages, e.g. ``"POST /v2/sandboxes"``.
            max_body: the largest body accepted.
            connect_timeout: overrides the transport's connect timeout.
            deadline: when the whole request (connect, send, wait, read) must be over,
                whatever the peer does; default ``connect_timeout + read_timeout`` from now.

        Returns:
            The answer.

        Raises:
            Cancelled: ``token`` fired (before or during the request).
            TransportTimeout: the deadline passed, or the peer was silent for longer than
                ``read_timeout`` (or a connect took longer than ``connect_timeout``).
            E2BHttpError: the answer was a redirect.
            ProtocolError: the body is larger than ``max_body``.
            TransportError, ConfigError: see :func:`map_transport_errors`.
        """
        began = time.monotonic()
        limit = self._limit(deadline, read_timeout, operation)
        slot = _AbortSlot()
        timer = self._arm(slot, limit)
        try:
            with _publishing(slot, token, limit):
                resp = self._send(
                    method, url, token=token, operation=operation, read_timeout=read_timeout,
                    connect_timeout=connect_timeout, limit=limit, headers=headers,
                    params=params, json=json, data=data, files=files,
                )
                try:
                    return self._read_body(
                        resp, token, slot, operation, max_body, read_timeout, limit, url
                    )
                finally:
                    # After the end of the body urllib3 has already put the connection back
                    # in the pool (this is then a no-op); before it, this closes it.
                    resp.close()
        except (TransportError, ProtocolError) as exc:
            if slot.expired:
                message = _overrun(operation, url, limit, began)
                if not isinstance(exc, TransportTimeout):
                    raise TransportTimeout(message) from exc
                exc.args = (message,)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            slot.finish()

    @staticmethod
    def _read_body(
        resp: _Response,
        token: Optional[CancelToken],
        slot: _AbortSlot,
        operation: str,
        max_body: int,
        read_timeout: float,
        limit: Deadline,
        url: str,
    ) -> HttpResponse:
        length = resp.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_body:
            raise ProtocolError(
                f"E2B {operation}: answer of {int(length)} bytes is larger than "
                f"{max_body} bytes"
            )
        buf = bytearray()
        with map_transport_errors(token, operation, url):
            while True:
                # While the connection is still ours (urllib3 gives it back to the pool, on
                # this thread, once the body ended), each read waits no longer than the
                # deadline leaves; the watchdog also shuts the socket down then, so a read
                # that gets a byte at a time ends too.
                sock = _answer_sock(resp.raw)
                if sock is not None:
                    sock.settimeout(max(min(read_timeout, limit.remaining()), _MIN_WAIT))
                chunk = resp.raw.read(_READ_CHUNK, decode_content=True)
                if not chunk:
                    break
                buf += chunk
                if len(buf) > max_body:
                    raise ProtocolError(
                        f"E2B {operation}: answer is larger than {max_body} bytes"
                    )
        if slot.fired:
            # Our own shutdown can look like a clean end of a close-delimited body.
            if token is not None and token.cancelled:
                raise Cancelled(token.reason)
            if slot.expired:
                raise TransportError(f"E2B {operation}: the answer was cut at its deadline")
        return HttpResponse(resp.status_code, _lower_headers(resp.headers), bytes(buf))

    def open_stream(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        data: bytes,
        read_timeout: float,
        token: Optional[CancelToken] = None,
        operation: str,
        connect_timeout: Optional[float] = None,
        deadline: Optional[Deadline] = None,
        deadline_bounds_body: bool = False,
    ) -> Stream:
        """Send one request and return its answer as a :class:`Stream` once headers arrive.

        ``token`` guards only the opening: if it fires before the response headers arrive,
        the connection is shut down and :class:`Cancelled` raised. Once the stream is
        returned the token is detached; stop the stream with :meth:`Stream.abort`.
        Any status is returned (check :attr:`Stream.status`) except a 3xx, which raises.

        Args:
            method: the HTTP method (envd streams use POST).
            url: the absolute URL.
            headers: request headers.
            data: the request body.
            read_timeout: seconds to wait for each piece of the answer; a peer silent for
                longer makes the read raise :class:`TransportTimeout`.
            token: aborts the opening when it fires.
            operation: names the call in messages.
            connect_timeout: overrides the transport's connect timeout.
            deadline: when the opening (connect, send, response headers) must be over,
                whatever the peer does; default ``connect_timeout + read_timeout`` from
                now. Past it the opening raises :class:`TransportTimeout`.
            deadline_bounds_body: the deadline also bounds the body: once it passes, the
                stream is shut down and its reads raise :class:`TransportTimeout` (for a
                download read as a stream). Otherwise only the read timeout bounds reads.

        Raises:
            Cancelled, E2BHttpError (redirect), TransportError, TransportTimeout, ConfigError.
        """
        began = time.monotonic()
        limit = self._limit(deadline, read_timeout, operation)
        # Its message is made only if the deadline passes.
        overrun = functools.partial(_overrun, operation, url, limit, began)
        slot = _AbortSlot()
        timer = self._arm(slot, limit)
        try:
            with _publishing(slot, token, limit):
                resp = self._send(
                    method, url, token=token, operation=operation, read_timeout=read_timeout,
                    connect_timeout=connect_timeout, limit=limit, headers=headers, data=data,
                    stream=True,
                )
            if not deadline_bounds_body and timer is not None:
                timer.cancel()
                timer = None
            if slot.fired:
                resp.close()
                if token is not None and token.cancelled:
                    raise Cancelled(token.reason)
                raise TransportTimeout(overrun())
            sock = _answer_sock(resp.raw)
            if sock is not None:
                sock.settimeout(read_timeout)  # reads wait as long as asked, not what was left
        except BaseException as exc:
            if timer is not None:
                timer.cancel()
            slot.finish()
            if slot.expired and isinstance(exc, TransportError):
                if isinstance(exc, TransportTimeout):
                    raise
                raise TransportTimeout(overrun()) from exc
            raise
        return Stream(resp, operation, slot, timer=timer, overrun=overrun)


    def open_raw_stream(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        data: bytes,
        read_timeout: float,
        token: Optional[CancelToken] = None,
        operation: str,
        connect_timeout: Optional[float] = None,
        deadline: Optional[Deadline] = None,
    ) -> RawStream:
        """Send one request on a connection of its own and return its answer as a
        :class:`RawStream` once its head arrived.

        The connection is made as this transport makes every other (the proxy the
        environment names for the URL, its tunnel, TLS with the transport's CA bundle) but
        never comes from or goes back to the pool. The request is sent as :meth:`open_stream`
        sends it (the transport's headers, then ``headers``), asking for no content coding.
        ``token`` and ``deadline`` guard the opening (connect, send, the answer's head) as
        for :meth:`open_stream`; after that, only :meth:`RawStream.abort` and the stream's
        ``read_timeout`` (the longest silence accepted) end it.

        Raises:
            Cancelled, TransportError, TransportTimeout, ProtocolError, ConfigError.
        """
        self._check_open(operation)
        read_timeout = _positive(read_timeout, "read_timeout")
        began = time.monotonic()
        limit = self._limit(deadline, read_timeout, operation)
        slot = _AbortSlot()
        timer = self._arm(slot, limit)
        proxies: Dict[str, str] = {}
        conn: Any = None
        try:
            with _publishing(slot, token, limit), map_transport_errors(
                token, operation, url, proxies
            ):
                proxies.update(self._proxies_for(url))
                merged: Dict[str, Tuple[str, str]] = {
                    k.lower(): (k, v) for k, v in self._headers.items()
                }
                for k, v in {**(headers or {}), "Accept-Encoding": "identity"}.items():
                    merged[k.lower()] = (k, v)
                send: Dict[str, str] = {}
                for item in merged.values():
                    requests.utils.check_header_validity(item)
                    send[item[0]] = item[1]
                prep = requests.PreparedRequest()
                prep.prepare_method(method)
                prep.prepare_url(url, None)
                if not (prep.url or "").lower().startswith(("http://", "https://")):
                    raise requests.exceptions.InvalidSchema(
                        "no connection adapter for the URL scheme"
                    )
                get = getattr(self._adapter, "get_connection_with_tls_context", None)
                if get is not None:
                    pool = get(prep, self._verify, proxies=proxies, cert=None)
                else:  # requests before 2.32.2
                    pool = self._adapter.get_connection(prep.url, proxies)
                left = max(limit.remaining(), _MIN_WAIT)
                conn = pool._new_conn()
                conn.timeout = min(connect_timeout or self._connect_timeout, left)
                proxy = getattr(pool, "proxy", None)
                tunnel = proxy is not None and urllib3.util.proxy.connection_requires_http_tunnel(
                    proxy, getattr(pool, "proxy_config", None), pool.scheme
                )
                if tunnel:
                    pool._prepare_proxy(conn)  # CONNECT, then TLS inside the tunnel
                else:
                    conn.connect()
                target = prep.path_url
                if proxy is not None and not tunnel:
                    target = prep.url or url  # a forwarding proxy wants the whole URL
                    send.update(getattr(pool, "proxy_headers", None) or {})
                conn.request(method, target, body=data, headers=send)
                head, framer, body, ended = self._read_head(conn.sock, limit, operation, url)
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if slot.expired and isinstance(exc, (TransportError, ProtocolError)):
                if isinstance(exc, TransportTimeout):
                    raise
                raise TransportTimeout(_overrun(operation, url, limit, began)) from exc
            raise
        finally:
            if timer is not None:
                timer.cancel()
            slot.finish()  # from here on no deadline or cancel can reach the connection
        if slot.fired:  # it did just before: the socket is shut down
            conn.close()
            if token is not None and token.cancelled:
                raise Cancelled(token.reason)
            raise TransportTimeout(_overrun(operation, url, limit, began))
        return RawStream(conn, head, framer, body, ended, operation=operation, url=url,
                         read_timeout=read_timeout)

    @staticmethod
    def _read_head(
        sock: Any, limit: Deadline, operation: str, url: str
    ) -> Tuple[Head, Framer, collections.deque[bytes], bool]:
        """Read an answer's head from ``sock`` (within ``limit``): the head, the framer
        that read it, the content that came with it, and whether the body already ended."""
        framer = Framer(is_request=False, content=True)
        framer.expect(b"POST")
        body: collections.deque[bytes] = collections.deque()
        head: Optional[Head] = None
        ended = False
        while True:
            sock.settimeout(max(limit.remaining(), _MIN_WAIT))
            data = sock.recv(_READ_CHUNK)
            try:
                events = framer.feed(data) if data else framer.eof()
            except FramingError as exc:
                raise ProtocolError(
                    f"E2B {operation}: the answer is not HTTP/1.1 it can read ({exc})"
                ) from None
            for kind, payload in events:
                if isinstance(payload, Head) and payload.status >= 200:
                    head = payload
                elif kind == BODY and isinstance(payload, bytes) and payload:
                    body.append(payload)
                elif kind == END and head is not None:
                    ended = True
            if head is not None:
                return head, framer, body, ended
            if not data:
                raise http.client.RemoteDisconnected(
                    "the connection ended before the answer's head"
                )
