"""Abortable pooled connections: the abort slot, the connection classes, the pools, the adapter.

Connections are kept: an answer read to its end leaves its connection in the pool for the
next request; an answer abandoned before its end closes its connection, so a half-read
connection is never reused. A connection idle for longer than
:data:`IDLE_CONNECTION_SECONDS` is closed instead of reused, and a pool the pool manager lets
go of closes its connections at once (:meth:`HTTPPool.retire`).

Cancellation: a request registers a callback on its :class:`~e2b_provider.CancelToken`
(:func:`publishing`). When the token fires, the callback shuts the request's socket down
(``shutdown(2)`` is the only call that reliably wakes a thread blocked in ``recv``;
``close()`` does not), so the caller's thread wakes at once and raises
:class:`~e2b_provider.errors.Cancelled`. The socket is found through a small per-request
:class:`AbortSlot` that the pool's connections publish themselves into while they serve that
request, and leave again before they go back to the pool, so a late cancel can never hit a
connection that another request is already using. A connection is published in its slot as
soon as its TCP connection exists, before a proxy tunnel or TLS handshake, so a cancel or a
deadline (the watchdog fires the same slot) also stops those; one that arrives while the
connection is still being set up takes effect as soon as it is set up, or when the connect
timeout ends, whichever comes first. A connection that an abort shut down is closed by the
pool, never kept.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time
from typing import Any, Dict, Iterator, Optional

import requests
import requests.adapters
import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.poolmanager

from ..cancel import CancelToken, Deadline

__all__ = [
    "IDLE_CONNECTION_SECONDS",
    "MIN_WAIT_SECONDS",
    "AbortSlot",
    "Adapter",
    "HTTPPool",
    "answer_sock",
    "publishing",
    "quickack",
    "reset_on_abort",
]

_QUICKACK: Optional[int] = getattr(socket, "TCP_QUICKACK", None)  # Linux only
#: The shortest socket timeout set when a deadline is about to pass (0 would mean
#: non-blocking).
MIN_WAIT_SECONDS = 0.001

_tls = threading.local()

#: A pooled connection idle for longer than this is closed instead of reused: servers and
#: proxies drop idle keep-alive connections (aiohttp and nginx after 75 s), and a request
#: sent just as the peer closes would fail. Shorter than any common server idle timeout.
IDLE_CONNECTION_SECONDS = 30.0
_SLOT = "_e2b_slot"  # the abort slot a connection is published in
_DEAD = "_e2b_dead"  # set once the connection was shut down by an abort: never reused
_IDLE = "_e2b_idle"  # monotonic time the connection went back to the pool
_SOCK = "_e2b_sock"  # the socket published with the connection (see AbortSlot.attach)
_SETUP = "_e2b_setup"  # a duplicate of a new connection's socket while it is set up
_RESET = "_e2b_reset"  # an abort of this connection sends a reset (RST), never a FIN


class AbortSlot:
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
        """True once the request was shut down (a cancel, an abort or its deadline)."""
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


def reset_on_abort(conn: Any) -> None:
    """Make an abort of ``conn`` a reset: its socket closes with ``SO_LINGER`` 0 (an RST) and
    the abort shuts down only its reading side, which wakes a blocked reader without sending
    the FIN a peer could take for a half-close."""
    sock = getattr(conn, "sock", None)
    if conn is not None and _linger(sock, struct.pack("ii", 1, 0)):
        conn.__dict__[_RESET] = True


def _linger(sock: Optional[socket.socket], value: bytes) -> bool:
    """Set ``SO_LINGER`` of ``sock``; False when there is no socket or it cannot be set."""
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, value)
    except OSError:
        return False
    return True


def _shutdown_conn(conn: urllib3.connection.HTTPConnection) -> None:
    conn.__dict__[_DEAD] = True
    how = socket.SHUT_RD if conn.__dict__.get(_RESET) else socket.SHUT_RDWR
    for sock in (getattr(conn, "sock", None) or conn.__dict__.get(_SOCK),
                 conn.__dict__.get(_SETUP)):
        if sock is None:
            continue
        try:
            sock.shutdown(how)
        except (OSError, ValueError, AttributeError):
            pass


def quickack(sock: Optional[socket.socket]) -> None:
    """Acknowledge what arrives at once (Linux): on a kept connection the kernel delays its
    ACKs, and a peer that has Nagle's algorithm on holds its next small write (the first
    chunk after the headers, the chunked terminator) until that ACK: 40 ms or more per
    answer. Fresh connections start in this mode; kept ones need to be told."""
    if _QUICKACK is not None and sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        except OSError:
            pass


def answer_sock(raw: Any) -> Optional[socket.socket]:
    """The socket of the connection an answer (``resp.raw``) is read from, while the answer
    still holds it (None once urllib3 put the connection back in the pool)."""
    return getattr(getattr(raw, "connection", None), "sock", None)


def _publish(conn: urllib3.connection.HTTPConnection) -> None:
    slot: Optional[AbortSlot] = getattr(_tls, "slot", None)
    if slot is not None and conn.sock is not None:
        slot.attach(conn)


@contextlib.contextmanager
def publishing(
    slot: AbortSlot, cancel: Optional[CancelToken], limit: Deadline
) -> Iterator[None]:
    """Publish ``slot`` (and the request's deadline) for this thread's request and wire it
    to ``cancel`` meanwhile."""
    unregister = cancel.on_cancel(lambda _r: slot.fire()) if cancel is not None else None
    prev = getattr(_tls, "slot", None), getattr(_tls, "limit", None)
    _tls.slot = slot
    _tls.limit = limit
    try:
        yield
    finally:
        _tls.slot, _tls.limit = prev
        if unregister is not None:
            unregister()


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
            self.sock.settimeout(max(limit.remaining(), MIN_WAIT_SECONDS))
        super().send(data)

    def getresponse(self) -> Any:
        quickack(self.sock)
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
    if isinstance(slot, AbortSlot):
        slot.detach(conn)
    d.pop(_SOCK, None)
    if d.pop(_DEAD, False):
        conn.close()
        return False
    if d.pop(_RESET, False):  # the stream ended whole: the next request aborts as usual
        _linger(getattr(conn, "sock", None), struct.pack("ii", 0, 0))
    if getattr(conn, "sock", None) is not None:
        d[_IDLE] = time.monotonic()
    return True


class HTTPPool(urllib3.connectionpool.HTTPConnectionPool):
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


class _HTTPSPool(HTTPPool, urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _AbortableHTTPSConnection


def _retire(pool: object) -> None:
    """What a pool manager does with a pool it lets go of."""
    if isinstance(pool, HTTPPool):
        pool.retire()


_POOL_CLASSES: Dict[str, type] = {"http": HTTPPool, "https": _HTTPSPool}


# (The ``type: ignore``s below: on Python 3.9 pip installs types-requests 2.32, whose
# HTTPAdapter methods are untyped; 2.33 and later type them.)
class Adapter(requests.adapters.HTTPAdapter):
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
