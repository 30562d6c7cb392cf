"""envd's Connect server streams, decoded: process events, a terminal's events, watch messages.

This module owns the one read loop of envd's server streams, :class:`ConnectReader` (the
bytes of each read go in, and what they complete comes out in order: the messages,
converted, then the end-of-stream message), and the three streams built on it:

* :class:`ProcessStream`: the events of a ``process.Process/Start`` (or ``Connect``)
  answer, an iterator whose reads block (bounded by the keepalive);
* :class:`PtyStream`: the events of a terminal's process, polled with a timeout from a
  :class:`~e2b_provider.transport.raw_stream.RawStream` (a timed-out read loses nothing);
* :class:`WatchStream`: the messages of a ``filesystem.Filesystem/WatchDir`` answer, read
  only when asked (their meaning: :mod:`e2b_provider.files.watch`).

Framing and event parsing are the sans-IO :mod:`e2b_provider.protocol.connect` and
:mod:`e2b_provider.protocol.process_events`.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Deque, Dict, Generic, Iterator, Optional, TypeVar, Union

from ..errors import ProtocolError, RemoteError
from ..protocol.connect import EndStream, EnvelopeDecoder, Message, Parsed
from ..protocol.process_events import (
    ProcessEvent,
    StartEvent,
    event_from_wire,
    is_output_message,
    parse_output_message,
    parse_plain_stdout,
)
from ..transport.raw_stream import RawStream
from ..transport.stream import Stream

__all__ = [
    "PTY_OPERATION",
    "START_OPERATION",
    "STREAM_END",
    "WATCH_MESSAGE_BYTES",
    "WATCH_READ_BYTES",
    "ConnectReader",
    "ProcessStream",
    "PtyStream",
    "StreamEnd",
    "WatchStream",
]

#: What a process stream's errors call it (``Start``; ``Connect`` is "process connect").
START_OPERATION = "process start"
#: What a terminal's stream's errors call it.
PTY_OPERATION = "terminal stream"
#: The most of a process stream read at once.
_PROCESS_READ_BYTES = 64 * 1024
#: The most of a watch's stream read at once (what a watch holds at most, decoded).
WATCH_READ_BYTES = 64 * 1024
#: The largest ``WatchDir`` message accepted (a path is at most 4 KiB).
WATCH_MESSAGE_BYTES = 64 * 1024

T = TypeVar("T")


class ConnectReader(Generic[T]):
    """The read loop of one Connect server stream, without the reads: :meth:`feed` each
    read's bytes, then :meth:`take` what they completed.

    Every message is converted as soon as it is decoded (a conversion's error is raised by
    :meth:`feed`); the end-of-stream message is taken after the values decoded before it.

    Args:
        decoder: the stream's envelope decoder.
        convert: a decoded message's value (None: the message is dropped).
        cut: the error's message for a body that ended without the end-of-stream message.
    """

    def __init__(
        self,
        decoder: EnvelopeDecoder,
        convert: Callable[[Union[Message, Parsed]], Optional[T]],
        cut: str,
    ) -> None:
        self.decoder = decoder
        self._convert = convert
        self._cut = cut
        self._pending: Deque[T] = collections.deque()
        self._end: Optional[EndStream] = None

    def held(self) -> bool:
        """True when a value or the end was received and not taken yet."""
        return bool(self._pending) or self._end is not None

    def take(self) -> Union[T, EndStream, None]:
        """The next value received, else the end-of-stream message (once), else None."""
        if self._pending:
            return self._pending.popleft()
        end, self._end = self._end, None
        return end

    def feed(self, chunk: bytes) -> None:
        """The bytes of one read (``b""``: the body ended).

        Raises:
            ProtocolError: a malformed frame or message, or the body ended without the
                end-of-stream message.
        """
        if not chunk:
            self.decoder.close()  # raises: EOF before the end-of-stream message
            raise ProtocolError(self._cut)
        self.decoder.feed(chunk)
        for item in self.decoder:
            if isinstance(item, EndStream):
                # Values decoded before the end-of-stream are delivered first.
                self._end = item
                continue
            value = self._convert(item)
            if value is not None:
                self._pending.append(value)


def process_event(item: Union[Message, Parsed]) -> Optional[ProcessEvent]:
    """The process event of a decoded message (a large output message was read in place)."""
    return item.value if isinstance(item, Parsed) else event_from_wire(item.data)


def raise_if_failed(end: EndStream, operation: str) -> None:
    """Raise the :class:`~e2b_provider.errors.RemoteError` a stream ended with, if any."""
    if end.error_code is not None:
        raise RemoteError(end.error_code, end.error_message, operation=operation)


class StreamEnd:
    """A terminal's stream ended with its end-of-stream message (without an error)."""


STREAM_END = StreamEnd()


class ProcessStream:
    """The events of one ``process.Process/Start`` answer, read as they arrive.

    Iterate it to get :data:`~e2b_provider.protocol.process_events.ProcessEvent` values (start,
    data, keepalive, end) in order; iteration stops after the Connect end-of-stream message.
    Reads block the iterating thread; :meth:`abort` (any thread, any time) wakes it.

    Raises (from iteration):
        RemoteError: the stream ended with a Connect error (``code``, ``message``).
        ProtocolError: a malformed frame or event, or the body ended without the
            end-of-stream message (truncated).
        TransportError: the connection broke, or the stream was aborted (then
            :attr:`aborted` is True: tell "aborted by us" from "dropped by the peer" by it).
        TransportTimeout: envd sent nothing (not even a keepalive) within the read timeout.

    The stream is closed automatically when it ends or fails; use it as a context manager
    (or call :meth:`close`) to release it early. A stream read to its end-of-stream message
    leaves its connection in the pool (the HTTP body's end is read, briefly bounded); one
    released early closes it.
    """

    def __init__(self, stream: Stream, *, operation: str = START_OPERATION) -> None:
        self._stream = stream
        self._operation = operation
        # Messages too large for general JSON are read in place, as output, or refused:
        # parsing one costs about its size, whatever the peer sends. Plain standard output
        # is decoded without its JSON being parsed.
        self._reader: ConnectReader[ProcessEvent] = ConnectReader(
            EnvelopeDecoder(large=parse_output_message, plain=parse_plain_stdout),
            self._event,
            "E2B process stream ended without an end-of-stream message",
        )
        self._done = False
        self.pid: Optional[int] = None

    @property
    def aborted(self) -> bool:
        """True once :meth:`abort` was called."""
        return self._stream.aborted

    def abort(self) -> None:
        """Shut the stream down now (thread-safe, idempotent); a blocked read wakes up."""
        self._stream.abort()

    def close(self) -> None:
        """Release the stream (idempotent)."""
        self._stream.close()

    def skip_output(self) -> None:
        """From now on, drop output events unread (their JSON is never parsed or decoded).

        For a reader whose output budget is used up: the stream is still read to its end
        event, at the cost of the framing alone. Events already decoded are still delivered.
        """
        self._reader.decoder.skip_when(is_output_message)

    def __enter__(self) -> ProcessStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[ProcessEvent]:
        return self

    def __next__(self) -> ProcessEvent:
        try:
            return self._next()
        except StopIteration:
            raise
        except Exception:
            # A failed stream is released at once; KeyboardInterrupt is left to the caller,
            # which may still want to kill the command before it lets go of the stream.
            self.close()
            raise

    def _event(self, item: Union[Message, Parsed]) -> Optional[ProcessEvent]:
        ev = process_event(item)
        if isinstance(ev, StartEvent) and self.pid is None:
            self.pid = ev.pid
        return ev

    def _next(self) -> ProcessEvent:
        while not self._done:
            item = self._reader.take()
            if item is None:
                self._reader.feed(self._stream.read1(_PROCESS_READ_BYTES))
                continue
            if not isinstance(item, EndStream):
                return item
            self._done = True
            # The content is complete: read the body's end so the connection is kept.
            self._stream.finish()
            raise_if_failed(item, self._operation)
        raise StopIteration


class PtyStream:
    """The process events of a terminal's stream (``Start`` with ``pty``, or ``Connect``),
    polled with a timeout on the caller's thread (no thread of its own).

    Args:
        raw: the stream envd's answer is read from (closed by :meth:`close`).
    """

    def __init__(self, raw: RawStream) -> None:
        self._raw = raw
        self._reader: ConnectReader[ProcessEvent] = ConnectReader(
            EnvelopeDecoder(large=parse_output_message),
            process_event,
            "the terminal's stream ended without an end-of-stream message",
        )
        self.done = False

    def fileno(self) -> int:
        """The connection's descriptor, for ``select`` (see :meth:`buffered`)."""
        return self._raw.fileno()

    def close(self) -> None:
        """Release the stream (idempotent); the process goes on."""
        self._raw.close()

    def buffered(self) -> bool:
        """True when an event (or the end) was received and not polled yet: ``select`` on
        the socket does not see it."""
        return self._reader.held()

    def poll(self, timeout: Optional[float]) -> Union[ProcessEvent, StreamEnd, None]:
        """The next event; :data:`STREAM_END` after the end-of-stream message; None when
        none was complete within ``timeout`` seconds (or a part of one came).

        Raises:
            RemoteError: the stream ended with a Connect error.
            ProtocolError, TransportError, TransportTimeout: as the stream's reads.
        """
        item = self._reader.take()
        if item is None and not self.done:
            data = self._raw.read(timeout)
            if data is None:
                return None
            self._reader.feed(data)
            item = self._reader.take()
            if item is None:
                return None
        if item is None or isinstance(item, EndStream):
            self.done = True
            if item is not None:
                raise_if_failed(item, PTY_OPERATION)
            return STREAM_END
        return item


class WatchStream:
    """The messages of one ``filesystem.Filesystem/WatchDir`` answer (each a JSON object),
    read only when asked, at most :data:`WATCH_READ_BYTES` at a time.

    Args:
        stream: the stream envd's answer is read from (closed by :meth:`close`).
    """

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        # A message is checked when it is taken: one after a message that ends or restarts
        # the watch is never looked at.
        self._reader: ConnectReader[Union[Message, Parsed]] = ConnectReader(
            EnvelopeDecoder(max_message_bytes=WATCH_MESSAGE_BYTES),
            lambda item: item,
            "the sandbox's watch stream ended without an end message",
        )

    def abort(self) -> None:
        """Shut the stream down now (thread-safe, idempotent); a blocked read wakes up."""
        self._stream.abort()

    def close(self) -> None:
        """Release the stream (idempotent): envd removes the watch."""
        self._stream.close()

    def take(self) -> Union[Dict[str, Any], EndStream, None]:
        """The next message read, else the end-of-stream message (once), else None (then
        :meth:`read`).

        Raises:
            ProtocolError: the next message is not JSON.
        """
        item = self._reader.take()
        if item is None or isinstance(item, (Message, EndStream)):
            return item.data if isinstance(item, Message) else item
        raise ProtocolError("the sandbox sent a watch message that is not JSON")

    def read(self) -> None:
        """Read once more (blocking, bounded by the keepalive).

        Raises:
            TransportError, TransportTimeout: as the stream's read (also once aborted).
            ProtocolError: a malformed frame or message, or the body ended without the
                end-of-stream message.
        """
        self._reader.feed(self._stream.read1(WATCH_READ_BYTES))
