"""Sans-IO envd process events and command output handling.

This module owns the meaning of the messages of an envd ``process.Process/Start`` (or
``Connect``) stream once the Connect framing is gone: :func:`event_from_wire` turns one
decoded message (proto3 JSON) into a :class:`StartEvent`, :class:`DataEvent`,
:class:`EndEvent` or :class:`KeepaliveEvent`; :func:`exit_code_of` turns an end event into a
shell-style exit code (128 + n for signal n) as the reference does; :class:`OutputBudget`
keeps at most ``max_bytes`` of stdout and stderr together; :func:`decode_output` decodes
them without mangling a UTF-8 sequence cut at the end; :func:`is_output_message` recognises an
output message from its first bytes, so output past the cap is dropped without being parsed
or decoded (see :meth:`~e2b_provider.protocol.connect.EnvelopeDecoder.skip_when`);
:func:`parse_output_message` reads an output message too large for general JSON in place,
in memory about its decoded size; :func:`parse_plain_stdout` reads the commonest one (standard
output alone) without parsing JSON at all.

Pure code: no I/O, no threads, and no requests, urllib3 or socket imports.
"""

from __future__ import annotations

import base64
import binascii
import re
import sys
from collections import abc
from typing import Any, List, Mapping, Optional, Union

import attrs

from ..errors import InvalidArgument, ProtocolError
from .validate import show

__all__ = [
    "SIGNALS",
    "DataEvent",
    "EndEvent",
    "KeepaliveEvent",
    "LiveText",
    "OutputBudget",
    "ProcessEvent",
    "StartEvent",
    "decode_output",
    "event_from_wire",
    "exit_code_of",
    "is_output_message",
    "parse_output_message",
    "parse_plain_stdout",
]

#: Go's names of the Linux signals (``syscall.Signal.String()``), as they appear in an end
#: event's ``status`` (``signal: killed``). 1-15 are the reference's table.
SIGNALS: Mapping[str, int] = {
    "hangup": 1,
    "interrupt": 2,
    "quit": 3,
    "illegal instruction": 4,
    "trace/breakpoint trap": 5,
    "aborted": 6,
    "bus error": 7,
    "floating point exception": 8,
    "killed": 9,
    "user defined signal 1": 10,
    "segmentation fault": 11,
    "user defined signal 2": 12,
    "broken pipe": 13,
    "alarm clock": 14,
    "terminated": 15,
    "stack fault": 16,
    "child exited": 17,
    "continued": 18,
    "stopped (signal)": 19,
    "stopped": 20,
    "stopped (tty input)": 21,
    "stopped (tty output)": 22,
    "urgent I/O condition": 23,
    "CPU time limit exceeded": 24,
    "file size limit exceeded": 25,
    "virtual timer expired": 26,
    "profiling timer expired": 27,
    "window changed": 28,
    "I/O possible": 29,
    "power failure": 30,
    "bad system call": 31,
}

_SIGNAL_STATUS_RE = re.compile(r"signal: (.+?)(?: \(core dumped\))?")
_EXIT_STATUS_PREFIX = "exit status "


@attrs.frozen
class StartEvent:
    """The process started; ``pid`` is its id inside the sandbox."""

    pid: int


@attrs.frozen
class DataEvent:
    """A chunk of output (PTY output is reported as stdout)."""

    stdout: bytes = b""
    stderr: bytes = b""


@attrs.frozen
class EndEvent:
    """The process ended.

    Attributes:
        exited: True when it exited normally (Go's ``ProcessState.Exited()``).
        status: Go's description, e.g. ``"exit status 3"`` or ``"signal: killed"``.
        raw_exit_code: the wire ``exitCode`` (``-1`` for a signal), None when omitted
            (proto3 omits a zero).
        error: the text of envd's wait error, if any.
    """

    exited: bool
    status: str
    raw_exit_code: Optional[int] = None
    error: Optional[str] = None

    @property
    def exit_code(self) -> Optional[int]:
        """The shell-style exit code (see :func:`exit_code_of`)."""
        return exit_code_of(self)


@attrs.frozen
class KeepaliveEvent:
    """envd's keepalive: sent when no output was sent for the requested interval."""


ProcessEvent = Union[StartEvent, DataEvent, EndEvent, KeepaliveEvent]


def exit_code_of(end: EndEvent) -> Optional[int]:
    """The exit code of an ended process, with the reference's ``exitCodeOf`` semantics.

    ``exited`` or a status ``exit status N`` gives the wire exit code (0 when omitted);
    ``signal: <name>`` or ``signal: <name> (core dumped)`` gives ``128 + n`` for the Linux
    signals 1-31 by their Go names; anything else gives None.
    """
    status = end.status or ""
    if end.exited or status.startswith(_EXIT_STATUS_PREFIX):
        return end.raw_exit_code if end.raw_exit_code is not None else 0
    m = _SIGNAL_STATUS_RE.fullmatch(status)
    n = SIGNALS.get(m.group(1)) if m else None
    return 128 + n if n is not None else None


def _b64(value: Any, where: str) -> bytes:
    """Decode proto3 JSON bytes: standard or URL-safe base64, padded or not."""
    if not isinstance(value, str):
        raise ProtocolError(f"process event {where} is a {type(value).__name__}, not base64 text")
    text = value.replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"process event {where} is not valid base64") from None


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"process event {where} is a {type(value).__name__}, not an integer")
    return value


#: For isinstance: ``dict`` first (what JSON gives; typing's Mapping is slow to check).
_MAPPINGS = (dict, abc.Mapping)


def _body(value: Any, kind: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, _MAPPINGS):
        raise ProtocolError(f"process event {kind!r} is a {type(value).__name__}, not an object")
    return value


def _start(body: Mapping[str, Any]) -> StartEvent:
    pid = _int(body.get("pid", 0), "start.pid")
    if pid < 0:
        raise ProtocolError("process event start.pid is negative")
    return StartEvent(pid)


def _data(body: Mapping[str, Any]) -> DataEvent:
    out: List[bytes] = []
    err = b""
    for key in ("stdout", "pty"):
        if body.get(key) is not None:
            out.append(_b64(body[key], f"data.{key}"))
    if body.get("stderr") is not None:
        err = _b64(body["stderr"], "data.stderr")
    return DataEvent(b"".join(out), err)


def _end(body: Mapping[str, Any]) -> EndEvent:
    raw = body.get("exitCode", body.get("exit_code"))
    exited = body.get("exited", False)
    status = body.get("status", "")
    error = body.get("error")
    if raw is not None:
        raw = _int(raw, "end.exitCode")
    if not isinstance(exited, bool):
        raise ProtocolError(f"process event end.exited is a {type(exited).__name__}, not a bool")
    if not isinstance(status, str):
        raise ProtocolError(f"process event end.status is a {type(status).__name__}, not text")
    if error is not None and not isinstance(error, str):
        raise ProtocolError(f"process event end.error is a {type(error).__name__}, not text")
    return EndEvent(exited=exited, status=status, raw_exit_code=raw, error=error)


_KINDS = ("start", "data", "end", "keepalive")


def event_from_wire(obj: Mapping[str, Any]) -> Optional[ProcessEvent]:
    """Turn one decoded stream message into an event.

    Args:
        obj: the message's JSON object, e.g. ``{"event": {"start": {"pid": 12}}}``. Proto3
            JSON omits zeros and false booleans: ``{"event": {"end": {"exited": true,
            "status": "exit status 0"}}}`` is exit 0.

    Returns:
        The event, or None for a message without an ``event`` or with an event kind this
        library does not know (forward compatibility).

    Raises:
        ProtocolError: the message is malformed (not an object, bad base64, a pid that is
            not an integer, several event kinds at once, ...).
    """
    if not isinstance(obj, _MAPPINGS):
        raise ProtocolError(f"process stream message is a {type(obj).__name__}, not an object")
    event = obj.get("event")
    if event is None:
        return None
    if not isinstance(event, _MAPPINGS):
        raise ProtocolError(f"process event is a {type(event).__name__}, not an object")
    kinds = [k for k in _KINDS if k in event]
    if not kinds:
        return None
    if len(kinds) > 1:
        raise ProtocolError(f"process event has several kinds at once: {', '.join(kinds)}")
    kind = kinds[0]
    body = _body(event[kind], kind)
    if kind == "start":
        return _start(body)
    if kind == "data":
        return _data(body)
    if kind == "end":
        return _end(body)
    return KeepaliveEvent()


def _unsafe_tail(buf: bytes) -> int:
    """Where a partial UTF-8 sequence at the end of ``buf`` starts (``len(buf)`` if none).

    Looks back at most 4 bytes for the lead byte; the sequence it starts is partial when it
    needs more bytes than are there. This is the cut :func:`decode_output` makes when the
    output was truncated.
    """
    end = len(buf)
    i = end - 1
    while i >= 0 and i >= end - 4:
        b = buf[i]
        if b & 0xC0 == 0x80:
            i -= 1
            continue
        need = 4 if b >= 0xF0 else 3 if b >= 0xE0 else 2 if b >= 0xC0 else 1
        return i if end - i < need else end
    return end


def decode_output(buf: bytes, truncated: bool) -> str:
    """Decode command output as UTF-8 (the reference's ``decodeOutput``).

    Only when ``truncated``, a partial UTF-8 sequence at the very end is dropped (the cap cut
    a character in two): look back at most 4 bytes for the lead byte and cut there if the
    sequence it starts is incomplete. Everything else that is not valid UTF-8 becomes
    U+FFFD.
    """
    end = _unsafe_tail(buf) if truncated else len(buf)
    return bytes(buf[:end]).decode("utf-8", errors="replace")


class LiveText:
    """Incremental decoding of one output stream, equal in the end to :func:`decode_output`.

    :meth:`feed` takes the bytes the budget kept, as they arrive, and returns the text that
    is final already: everything but a partial UTF-8 sequence at the end, which waits for
    its remaining bytes. Pieces are cut only before a byte that is not a UTF-8 continuation
    byte, where decoding in pieces and decoding at once agree (also for invalid bytes).
    :meth:`finish` returns the rest, decoded as :func:`decode_output` would; the
    concatenation of every piece is ``decode_output(all_bytes, truncated)``.

    Not thread-safe: one reader thread feeds it.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> str:
        """The text that ``data`` (appended to what came before) completes."""
        if not data:
            return ""
        buf = self._pending + data
        cut = _unsafe_tail(buf)
        self._pending = buf[cut:]
        return buf[:cut].decode("utf-8", errors="replace")

    def finish(self, truncated: bool) -> str:
        """The rest, once the stream has ended: see :func:`decode_output`."""
        buf, self._pending = self._pending, b""
        return decode_output(buf, truncated)


def _budget_cap(n: Any) -> int:
    # No upper bound here: callers bound what they ask for (a read adds stderr room to its
    # max_bytes), and memory is bounded by what actually arrives.
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise InvalidArgument(f"invalid max_output_bytes {show(n)}: must be an int >= 0")
    return int(n)


@attrs.define(eq=False)
class OutputBudget:
    """At most ``max_bytes`` of stdout and stderr together, kept in arrival order.

    As the reference's ``collect()``: each chunk is kept whole while it fits, the chunk that
    crosses the cap is cut, and later chunks are dropped; ``truncated`` is set as soon as
    anything is dropped. Data past the cap is still accepted (and dropped) so the stream can
    be drained to its end event.

    Not thread-safe: one reader thread feeds it.

    Attributes:
        max_bytes: the cap, an int >= 0 (anything else raises ``InvalidArgument``).
    """

    max_bytes: int = attrs.field(converter=_budget_cap, on_setattr=attrs.setters.frozen)
    _out: bytearray = attrs.field(factory=bytearray, init=False, repr=False)
    _err: bytearray = attrs.field(factory=bytearray, init=False, repr=False)
    _used: int = attrs.field(default=0, init=False)
    _truncated: bool = attrs.field(default=False, init=False)

    def _add(self, into: bytearray, data: bytes) -> bytes:
        room = self.max_bytes - self._used
        if len(data) > room:
            self._truncated = True
        if room <= 0 or not data:
            return b""
        keep = data[:room]
        into += keep
        self._used += len(keep)
        return keep

    def add_stdout(self, data: bytes) -> bytes:
        """Account a chunk of standard output; returns the part kept (inside the cap)."""
        return self._add(self._out, data)

    def add_stderr(self, data: bytes) -> bytes:
        """Account a chunk of standard error; returns the part kept (inside the cap)."""
        return self._add(self._err, data)

    def add(self, event: DataEvent) -> None:
        """Account both streams of a :class:`DataEvent` (stdout first)."""
        if event.stdout:
            self.add_stdout(event.stdout)
        if event.stderr:
            self.add_stderr(event.stderr)

    @property
    def stdout_bytes(self) -> bytes:
        """The standard output kept so far."""
        return bytes(self._out)

    @property
    def stderr_bytes(self) -> bytes:
        """The standard error kept so far."""
        return bytes(self._err)

    @property
    def used(self) -> int:
        """Bytes kept so far, stdout and stderr together (never above ``max_bytes``)."""
        return self._used

    @property
    def truncated(self) -> bool:
        """True once any byte was dropped."""
        return self._truncated

    def stdout_text(self) -> str:
        """Standard output decoded by :func:`decode_output`."""
        return decode_output(self.stdout_bytes, self._truncated)

    def stderr_text(self) -> str:
        """Standard error decoded by :func:`decode_output`."""
        return decode_output(self.stderr_bytes, self._truncated)


# -- output messages recognised unparsed -------------------------------------------------

#: The start of an output message, ``{"event":{"data":{``, in any JSON spacing (Go's
#: protojson varies its spacing on purpose).
_JSON_WS = rb"[ \t\r\n]*"
_OUTPUT_PREFIX = re.compile(
    _JSON_WS.join([b"", rb"\{", rb'"event"', b":", rb"\{", rb'"data"', b":", rb"\{"])
)
_JSON_SPACE = b" \t\r\n"


def is_output_message(buf: bytearray, start: int, end: int) -> bool:
    """Whether the stream message in ``buf[start:end]`` is an output (data) event.

    Looks only at its first bytes and checks, cheaply, that it ends like a JSON object; its
    content is neither parsed nor decoded. Its signature is that of a
    :data:`~e2b_provider.protocol.connect.SkipMatcher`.

    Raises:
        ProtocolError: it starts as an output event but does not end as a JSON object.
    """
    if _OUTPUT_PREFIX.match(buf, start, end) is None:
        return False
    last = end - 1
    while buf[last] in _JSON_SPACE:  # stops at the latest at the prefix's "{"
        last -= 1
    if buf[last] != 0x7D:  # "}"
        raise ProtocolError("process output event is not a complete JSON object")
    return True


#: An output message and nothing else: ``{"event":{"data":{...}}}`` whose fields are only
#: ``stdout``, ``stderr`` or ``pty`` with base64 text (standard or URL-safe), in any JSON
#: spacing. No nesting, no escapes: it cannot cost more than its size to read.
_B64_TEXT = rb'"([A-Za-z0-9+/_-]*)(={0,2})"'
_OUTPUT_FIELD = re.compile(rb'"(stdout|stderr|pty)"' + _JSON_WS + b":" + _JSON_WS + _B64_TEXT)
_FIELD_SHAPE = (
    rb'"(?:stdout|stderr|pty)"' + _JSON_WS + b":" + _JSON_WS + rb'"[A-Za-z0-9+/_-]*={0,2}"'
)
_FLAT_OUTPUT = re.compile(
    _JSON_WS.join([
        b"", rb"\{", rb'"event"', b":", rb"\{", rb'"data"', b":", rb"\{",
        b"(?:" + _FIELD_SHAPE + b"(?:" + _JSON_WS + b"," + _JSON_WS + _FIELD_SHAPE + b")*)?",
        rb"\}", rb"\}", rb"\}", b"",
    ])
)
_URL_SAFE = bytes.maketrans(b"-_", b"+/")


def _b64_in_place(buf: bytearray, start: int, end: int, where: str) -> bytes:
    """Decode the base64 text ``buf[start:end]`` (padding not included) without copying it
    (unless it is URL-safe or unpadded); as :func:`_b64` decides, for a validated text."""
    n = end - start
    rest = n % 4
    if rest == 1:
        raise ProtocolError(f"process event {where} is not valid base64")
    with memoryview(buf) as whole, whole[start:end] as text:
        data: Union[bytes, memoryview] = text
        if buf.find(b"-", start, end) >= 0 or buf.find(b"_", start, end) >= 0:
            data = text.tobytes().translate(_URL_SAFE)
        try:
            head = binascii.a2b_base64(data[: n - rest])
            if not rest:
                return head
            tail = binascii.a2b_base64(bytes(data[n - rest :]) + b"=" * (4 - rest))
        except (binascii.Error, ValueError):
            raise ProtocolError(f"process event {where} is not valid base64") from None
        finally:
            del data
    return head + tail


def parse_output_message(buf: bytearray, start: int, end: int) -> Optional[DataEvent]:
    """Read the output message ``buf[start:end]`` in place: its :class:`DataEvent`, or None
    when it is anything but a plain output message (its fields base64 text).

    For messages too large for general JSON (see
    :class:`~e2b_provider.protocol.connect.EnvelopeDecoder`): the text is checked against the shape
    of an output message and its base64 decoded straight from the buffer, so reading it
    takes about its decoded size in memory (a general JSON parse takes several times the
    message's size, and ~30 times for a message of many small objects). Its signature is
    that of a :data:`~e2b_provider.protocol.connect.LargeParser`.

    Raises:
        ProtocolError: a field is not valid base64.
    """
    if _FLAT_OUTPUT.fullmatch(buf, start, end) is None:
        return None
    spans = {}
    for m in _OUTPUT_FIELD.finditer(buf, start, end):
        spans[m.group(1).decode("ascii")] = m.span(2)  # the last one wins, as in JSON
    out: List[bytes] = []
    for key in ("stdout", "pty"):
        if key in spans:
            out.append(_b64_in_place(buf, *spans[key], f"data.{key}"))
    err = _b64_in_place(buf, *spans["stderr"], "data.stderr") if "stderr" in spans else b""
    stdout = out[0] if len(out) == 1 else b"".join(out)
    return DataEvent(stdout, err)


#: envd's message for standard output alone, around its base64 text: Go's protojson puts a
#: random space only after a comma, and this message has none.
_PLAIN_STDOUT = b'{"event":{"data":{"stdout":"'
_PLAIN_END = b'"}}}'


def parse_plain_stdout(buf: bytearray, start: int, end: int) -> Optional[DataEvent]:
    """The :class:`DataEvent` of the message ``buf[start:end]`` if it is exactly
    ``{"event":{"data":{"stdout":"<base64>"}}}`` (standard, padded base64), decoded straight
    from the buffer; None for anything else (read as JSON instead).

    Nothing but base64 text can stand between the two ends (any quote, backslash or other
    character fails the strict decode), so what this accepts is that one JSON object, and
    gives what :func:`event_from_wire` gives for it; it only skips the JSON parse and a copy.
    Its signature is that of a :data:`~e2b_provider.protocol.connect.LargeParser` (Python 3.11+:
    before, it always answers None).
    """
    if sys.version_info < (3, 11):
        return None
    first, last = start + len(_PLAIN_STDOUT), end - len(_PLAIN_END)
    if not (first <= last and buf.startswith(_PLAIN_STDOUT, start, end)
            and buf.endswith(_PLAIN_END, start, end)):
        return None
    with memoryview(buf) as whole, whole[first:last] as text:
        try:
            data = binascii.a2b_base64(text, strict_mode=True)
        except binascii.Error:
            return None
    return DataEvent(data, b"")
