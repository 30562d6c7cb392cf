"""A streaming answer read from a pooled connection, :class:`Stream`, and what every stream shares.

:class:`Stream` is what :meth:`~e2b_provider.transport.client.Transport.open_stream` returns:
its body is read in pieces as they arrive, and :meth:`Stream.abort` stops it from any thread.
A body read to its end (for envd's streams, up to the chunked terminator after envd's
end-of-stream message, see :meth:`Stream.finish`) leaves its connection in the pool; one
abandoned before its end closes it. :class:`OneReaderStream` is what :class:`Stream` and
:class:`~e2b_provider.transport.raw_stream.RawStream` share: one reader at a time, an abort
from any thread, and closing on leaving a ``with`` block.
"""

from __future__ import annotations

import abc
import logging
import threading
from typing import Any, Callable, Mapping, Optional, TypeVar

from .._watchdog import TimerHandle
from ..errors import E2BProviderError, ProtocolError, TransportError, TransportTimeout
from .direct_send import Response
from .error_mapping import map_transport_errors
from .pool import AbortSlot, answer_sock, quickack, reset_on_abort
from .response import lower_headers

__all__ = ["END_WAIT_SECONDS", "READ_CHUNK", "OneReaderStream", "Stream"]

log = logging.getLogger(__name__)

#: The most bytes one read asks for.
READ_CHUNK = 64 * 1024
#: How long :meth:`Stream.finish` waits for the end of a body whose content is complete.
END_WAIT_SECONDS = 0.5

_S = TypeVar("_S", bound="OneReaderStream")


class OneReaderStream(abc.ABC):
    """A streaming answer that one thread reads at a time and any thread may abort.

    After an abort every read raises ``TransportError("stream aborted")``; :attr:`aborted`
    tells that apart from a peer that dropped the connection. Used as a context manager, the
    stream is closed on leaving the block.
    """

    def __init__(self, operation: str) -> None:
        self._operation = operation
        self._lock = threading.Lock()
        self._reading = False
        self._aborted = False
        self._closed = False

    @property
    def aborted(self) -> bool:
        """True once :meth:`abort` was called."""
        return self._aborted

    @abc.abstractmethod
    def abort(self) -> None:
        """Shut the connection down now; thread-safe and idempotent."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the answer (idempotent); a reader blocked in another thread is woken."""

    def _aborted_error(self) -> TransportError:
        return TransportError(f"E2B {self._operation}: stream aborted")

    def _start_reading(self, reader: str, at_end: bool = False) -> bool:
        """Become the stream's only reader (the caller holds the lock). False, and nothing
        is read, once the stream is closed or ``at_end``.

        Raises:
            TransportError: the stream was aborted.
            RuntimeError: another thread is reading it (``reader`` names the call).
        """
        if self._aborted:
            raise self._aborted_error()
        if self._closed or at_end:
            return False
        if self._reading:
            raise RuntimeError(f"{reader} called from two threads at once")
        self._reading = True
        return True

    def _stop_reading(self) -> bool:
        """Stop being the reader: True when an abort came meanwhile and the stream is not
        closed yet (the reader releases it on its way out)."""
        with self._lock:
            self._reading = False
            return self._aborted and not self._closed

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Stream(OneReaderStream):
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
        resp: Response,
        operation: str,
        slot: AbortSlot,
        *,
        timer: Optional[TimerHandle],
        overrun: Callable[[], str],
    ) -> None:
        super().__init__(operation)
        self._resp = resp
        self._raw: Any = resp.raw
        # The connection stays published in the slot until it goes back to the pool, so
        # abort() reaches it exactly as long as this stream owns it.
        self._slot = slot
        # The deadline's timer when it bounds the whole body (cancelled on release), and
        # what makes the message said when it passed.
        self._timer = timer
        self._overrun = overrun
        self.status: int = resp.status_code
        self.headers: Mapping[str, str] = lower_headers(resp.headers)
        self._eof = False
        self._started = False  # a body byte was asked for

    @property
    def closed(self) -> bool:
        """True once the stream was closed (or aborted and released)."""
        return self._closed

    def read1(self, n: int = READ_CHUNK) -> bytes:
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

    def _guarded(self, read: Callable[[], bytes], what: str) -> Optional[bytes]:
        """``read()`` as the stream's only reader, its errors mapped (None: the stream is
        closed or at its end). An abort that came meanwhile releases the stream here."""
        with self._lock:
            if not self._start_reading(f"Stream.{what}", self._eof):
                return None
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
            if self._stop_reading():
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
            chunk = self.read1(READ_CHUNK)
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
            sock = answer_sock(self._raw)
            try:
                if sock is not None:
                    # The next request on this connection sets its own timeout again.
                    sock.settimeout(bound)
                    quickack(sock)
                extra = self.read1(READ_CHUNK)
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

    def reset_if_stopped(self) -> None:
        """From now on, a stream stopped before its end (an abort, a close, an exception in
        a read such as Ctrl-C) closes its connection with a reset (RST) instead of a FIN:
        a peer, or a proxy between, that keeps answering a half-closed connection learns
        at once that nobody reads the answer any more (a server that stops work when its
        client goes away then stops it now, not at its next write)."""
        with self._lock:
            if not self._aborted and not self._closed:
                reset_on_abort(getattr(self._raw, "connection", None))

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
