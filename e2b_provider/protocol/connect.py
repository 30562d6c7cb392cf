"""Sans-IO Connect envelope codec (the framing of envd's streaming RPCs).

An envelope is one flag byte, a 4-byte big-endian length, then that many bytes of JSON.
Flag bit 0x01 marks a compressed message (we never ask for compression, so we refuse it);
bit 0x02 marks the end-of-stream message, whose JSON may carry ``{"error": {code, message}}``.

This module owns bytes -> messages and messages -> bytes. It imports no requests, urllib3,
socket or threading: the caller feeds whatever chunks arrived, in any split, and iterates
the complete messages. A broken or hostile peer cannot make it allocate more than
``max_message_bytes`` (default :data:`MAX_MESSAGE_BYTES`) plus one read of buffering.

Parsing is bounded too: general JSON can take ~30 times its size in memory (a 16 MiB
``[{},{},...]`` takes ~450 MiB as Python objects), so only messages of at most
``max_json_bytes`` (default :data:`MAX_JSON_BYTES`, far above anything but output) are
parsed as JSON. A larger one is handed to the reader's ``large`` parser, which reads it in
place in memory proportional to its size (envd's output: see
:func:`~e2b_provider.protocol.process_events.parse_output_message`) and yields a :class:`Parsed`
item, or refuses it; without one, or if it refuses, it is a
:class:`~e2b_provider.errors.ProtocolError`.

A reader that no longer needs some messages (command output past its cap) tells the decoder
with :meth:`EnvelopeDecoder.skip_when`: matching messages are then dropped on sight, framing
still checked but their JSON never parsed, so the end-of-stream message is found at the
cost of the framing alone.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, Optional, Union

import attrs

from ..errors import ProtocolError

__all__ = [
    "FLAG_COMPRESSED",
    "FLAG_END_STREAM",
    "HEADER_BYTES",
    "MAX_JSON_BYTES",
    "MAX_MESSAGE_BYTES",
    "EndStream",
    "EnvelopeDecoder",
    "LargeParser",
    "Message",
    "Parsed",
    "SkipMatcher",
    "encode_envelope",
]

FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
HEADER_BYTES = 5
#: Largest message we accept. envd sends output in chunks of at most 32 KiB of raw bytes
#: (about 44 KiB of base64 JSON); 16 MiB leaves wide room and still bounds memory.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: Largest message parsed as general JSON. envd's start, end and keepalive messages are a
#: few hundred bytes, its output messages at most about 44 KiB.
MAX_JSON_BYTES = 64 * 1024

_HEADER = struct.Struct(">BI")


@attrs.frozen
class Message:
    """One ordinary (not end-of-stream) message: its decoded JSON object."""

    data: Dict[str, Any]


@attrs.frozen
class EndStream:
    """The end-of-stream message; ``error_code``/``error_message`` set when the RPC failed."""

    error_code: Optional[str] = None
    error_message: str = ""
    metadata: Dict[str, Any] = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        """True when the stream ended without an error."""
        return self.error_code is None


@attrs.frozen
class Parsed:
    """A message read in place by the decoder's ``plain`` or ``large`` parser."""

    value: Any


Item = Union[Message, Parsed, EndStream]

#: ``matcher(buf, start, end) -> bool``: whether the payload ``buf[start:end]`` is to be
#: dropped unparsed. It must not keep or change ``buf``; it may raise ProtocolError.
SkipMatcher = Callable[[bytearray, int, int], bool]

#: ``parser(buf, start, end) -> value or None``: reads a message larger than
#: ``max_json_bytes`` in place (None refuses it). It must not keep or change ``buf``.
LargeParser = Callable[[bytearray, int, int], Any]


def encode_envelope(obj: Any, *, end_stream: bool = False) -> bytes:
    """Encode one JSON-serialisable object as a Connect envelope."""
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    flags = FLAG_END_STREAM if end_stream else 0
    return _HEADER.pack(flags, len(body)) + body


def _parse_json(payload: bytes) -> Dict[str, Any]:
    try:
        obj = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"envelope is not valid UTF-8 JSON: {exc.__class__.__name__}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"envelope JSON is a {type(obj).__name__}, not an object")
    return obj


def _end_stream(obj: Dict[str, Any]) -> EndStream:
    err = obj.get("error")
    meta = obj.get("metadata")
    metadata = meta if isinstance(meta, dict) else {}
    if err is None:
        return EndStream(metadata=metadata)
    if not isinstance(err, dict):
        raise ProtocolError("end-of-stream error is not an object")
    code = err.get("code")
    message = err.get("message")
    return EndStream(
        error_code=str(code) if code is not None else "unknown",
        error_message=str(message) if message is not None else "",
        metadata=metadata,
    )


class EnvelopeDecoder:
    """Incremental decoder: ``feed(chunk)`` bytes, then iterate complete items.

    After an :class:`EndStream` item the decoder is finished; any further bytes are a
    protocol error. :meth:`close` (call it at EOF) raises if the stream stopped inside
    an envelope or before the end-of-stream message.

    Args:
        max_message_bytes: the largest message accepted at all.
        max_json_bytes: the largest message parsed as general JSON.
        large: reads an ordinary message larger than ``max_json_bytes`` in place (see
            :data:`LargeParser`); None refuses every such message.
        plain: reads an ordinary message in place before general JSON is tried (same
            signature; None from it: the message is read as usual), for a message whose
            exact shape makes JSON parsing a needless cost (command output).
    """

    def __init__(
        self,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_json_bytes: int = MAX_JSON_BYTES,
        large: Optional[LargeParser] = None,
        plain: Optional[LargeParser] = None,
    ) -> None:
        if max_message_bytes <= 0 or max_json_bytes <= 0:
            raise ValueError("max_message_bytes and max_json_bytes must be positive")
        self._max = max_message_bytes
        self._max_json = max_json_bytes
        self._large = large
        self._plain = plain
        self._buf = bytearray()
        self._ready: Deque[Item] = deque()
        self._finished = False
        self._failed = False
        self._skip: Optional[SkipMatcher] = None
        self._skipped = 0

    @property
    def skipped(self) -> int:
        """How many messages were dropped unparsed (see :meth:`skip_when`)."""
        return self._skipped

    def skip_when(self, matcher: Optional[SkipMatcher]) -> None:
        """Drop, from now on, every ordinary message whose payload ``matcher`` accepts.

        The framing of a dropped message is still checked (flags, length bound); its JSON is
        never parsed or even copied. The end-of-stream message is never dropped. Messages
        already decoded stay queued. ``None`` stops skipping.
        """
        self._skip = matcher

    @property
    def finished(self) -> bool:
        """True once the end-of-stream message has been decoded."""
        return self._finished

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a complete envelope."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        """Add bytes received from the peer (any split is fine)."""
        if not data:
            return
        if self._failed:
            raise ProtocolError("the stream already failed")
        if self._finished:
            raise ProtocolError("data after the end-of-stream message")
        self._buf += data
        try:
            self._drain()
        except ProtocolError:
            self._failed = True
            raise

    def _drain(self) -> None:
        buf = self._buf
        pos = 0
        while len(buf) - pos >= HEADER_BYTES:
            flags, length = _HEADER.unpack_from(buf, pos)
            if flags & ~(FLAG_COMPRESSED | FLAG_END_STREAM):
                raise ProtocolError(f"unknown envelope flags 0x{flags:02x}")
            if flags & FLAG_COMPRESSED:
                raise ProtocolError("compressed envelope refused (we never ask for compression)")
            if length > self._max:
                raise ProtocolError(
                    f"envelope of {length} bytes exceeds the {self._max}-byte bound"
                )
            end = pos + HEADER_BYTES + length
            if len(buf) < end:
                break
            skip = self._skip
            if skip is not None and not flags & FLAG_END_STREAM and skip(
                buf, pos + HEADER_BYTES, end
            ):
                self._skipped += 1
                pos = end
                continue
            plain = self._plain
            if plain is not None and not flags & FLAG_END_STREAM:
                value = plain(buf, pos + HEADER_BYTES, end)
                if value is not None:
                    self._ready.append(Parsed(value))
                    pos = end
                    continue
            if length > self._max_json:
                value = None
                if self._large is not None and not flags & FLAG_END_STREAM:
                    value = self._large(buf, pos + HEADER_BYTES, end)
                if value is None:
                    raise ProtocolError(
                        f"a message of {length} bytes is larger than the {self._max_json} "
                        "bytes accepted for anything but command output"
                    )
                self._ready.append(Parsed(value))
                pos = end
                continue
            obj = _parse_json(bytes(buf[pos + HEADER_BYTES : end]))
            pos = end
            if flags & FLAG_END_STREAM:
                self._ready.append(_end_stream(obj))
                self._finished = True
                if pos != len(buf):
                    raise ProtocolError("data after the end-of-stream message")
                break
            self._ready.append(Message(obj))
        if pos:
            del buf[:pos]

    def __iter__(self) -> Iterator[Item]:
        return self

    def __next__(self) -> Item:
        if not self._ready:
            raise StopIteration
        return self._ready.popleft()

    def close(self) -> None:
        """Declare EOF: raise :class:`ProtocolError` unless the stream ended cleanly."""
        if self._finished:
            return
        if self._buf:
            raise ProtocolError(
                f"stream ended inside an envelope ({len(self._buf)} bytes left over)"
            )
        raise ProtocolError("stream ended without an end-of-stream message")
