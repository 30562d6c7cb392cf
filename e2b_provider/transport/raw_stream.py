"""A streaming answer on a connection of its own, read straight from its socket: :class:`RawStream`.

For a reader that waits with a timeout of its own on every read and must lose nothing when
that timeout passes (a terminal's output). The answer's head (:func:`read_head`) and body are
framed by :class:`~e2b_provider.protocol.http1.Framer` from what ``recv`` gives, so nothing
sits between the socket and the reader.
"""

from __future__ import annotations

import collections
import http.client
import logging
import socket
import ssl
import time
from typing import Any, Dict, Mapping, Optional, Tuple

import requests
import urllib3.util.proxy

from ..cancel import Deadline
from ..errors import ProtocolError, TransportError, TransportTimeout
from ..protocol.http1 import BODY, END, Framer, FramingError, Head
from .error_mapping import map_transport_errors, safe_url
from .pool import MIN_WAIT_SECONDS
from .stream import READ_CHUNK, OneReaderStream

__all__ = ["RawStream", "read_head", "send_on_own_connection"]

log = logging.getLogger(__name__)


class RawStream(OneReaderStream):
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
        super().__init__(operation)
        self._conn = conn
        self._sock: Any = conn.sock
        self._framer = framer
        self._body = body
        self._ended = ended
        self._url = url
        self._read_timeout = read_timeout
        self._heard = time.monotonic()
        self.status: int = head.status
        self.headers: Mapping[str, str] = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers
        }

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
            if not self._start_reading("RawStream.read"):
                raise TransportError(f"E2B {self._operation}: the stream is closed")
        try:
            return self._read(timeout)
        finally:
            self._stop_reading()

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
                data = self._sock.recv(READ_CHUNK)
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
                        raise self._cut_error()
                    continue
                self._heard = time.monotonic()
                self._take(self._framer.feed(data))
            except FramingError as exc:
                if not data:
                    raise self._cut_error() from None
                raise ProtocolError(
                    f"E2B {self._operation}: the answer is not HTTP/1.1 it can read ({exc})"
                ) from None

    def _cut_error(self) -> TransportError:
        """The error for a connection that ended before the end of the answer."""
        return TransportError(
            f"E2B {self._operation}: the connection to {safe_url(self._url)} ended before "
            "the end of the answer"
        )

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


def send_on_own_connection(
    conn: Any,
    pool: Any,
    method: str,
    prep: requests.PreparedRequest,
    *,
    body: bytes,
    headers: Dict[str, str],
) -> None:
    """Connect ``conn``, a new connection of ``pool``, as the pool connects its own (through
    the proxy's tunnel, then TLS inside it, when the pool has one that needs it), and send
    on it a ``method`` request to the URL ``prep`` prepared, with ``body`` and ``headers``
    (the proxy's headers added and the whole URL asked for when the proxy forwards
    requests)."""
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
        target = prep.url or ""  # a forwarding proxy wants the whole URL
        headers.update(getattr(pool, "proxy_headers", None) or {})
    conn.request(method, target, body=body, headers=headers)


def read_head(
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
        sock.settimeout(max(limit.remaining(), MIN_WAIT_SECONDS))
        data = sock.recv(READ_CHUNK)
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
