"""HTTP/1.1 message framing for a relay that passes bodies on untouched, without I/O.

This module owns where each message of an HTTP/1.1 byte stream begins and ends, as
:func:`~e2b_provider.E2BSandboxProvider.forward`'s relay needs it: request and response
heads (parsed, so a relay can rewrite a request's ``Host``), and bodies framed by
``Content-Length``, ``chunked`` transfer coding or the end of the connection, with the
cases that carry no body (``HEAD``, 1xx, 204, 304) and a ``101 Switching Protocols`` after
an ``Upgrade`` request, after which the stream is opaque (a WebSocket). Body bytes are
returned as they came (chunk framing included): a relay never decodes or re-encodes them. A
framer made with ``content=True`` returns a body's content instead (chunk sizes, chunk ends
and trailers removed), for a client that reads an answer itself (a terminal's stream).

A :class:`Framer` is fed bytes and returns events: ``(HEAD, Head)``, ``(BODY, bytes)``,
``(END, None)`` at the end of each message, ``(RAW, bytes)`` once the stream switched
protocols; a response framer also says ``(SWITCHED, None)`` after a 101 and
``(REFUSED, None)`` when an upgrade request got a final answer that did not switch.
Malformed input raises :class:`FramingError` with the status a server would answer (400,
or 431 for a head too large).
"""

from __future__ import annotations

import re
from collections import deque
from typing import Deque, List, Optional, Sequence, Tuple, Union

import attrs

__all__ = [
    "BODY",
    "END",
    "HEAD",
    "MAX_HEAD_BYTES",
    "RAW",
    "REFUSED",
    "SWITCHED",
    "Event",
    "Framer",
    "FramingError",
    "Head",
]

HEAD = 1
BODY = 2
END = 3
RAW = 4
#: (response framer) the server switched protocols: the request side is opaque too now
SWITCHED = 5
#: (response framer) the final answer to an upgrade request did not switch
REFUSED = 6
Event = Tuple[int, Union["Head", bytes, None]]

#: The largest head (start line and headers) accepted.
MAX_HEAD_BYTES = 64 * 1024
_MAX_CHUNK_LINE = 4096
_TOKEN_RE = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_REQUEST_LINE_RE = re.compile(rb"^([!#$%&'*+.^_`|~0-9A-Za-z-]+) (\S+) HTTP/(\d)\.(\d)$")
_STATUS_LINE_RE = re.compile(rb"^HTTP/(\d)\.(\d) (\d{3})(?: .*)?$")
_HEX_RE = re.compile(rb"^[0-9A-Fa-f]{1,16}$")


class FramingError(Exception):
    """The stream is not HTTP/1.1 this relay can frame.

    Attributes:
        status: what a server answers for it (400 bad request, 431 head too large).
        events: the events of the same :meth:`Framer.feed` call before the error (whole
            messages that came before the bad one, say).
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.events: List[Event] = []


@attrs.frozen
class Head:
    """A message's start line and headers, as sent.

    Attributes:
        start_line: the request or status line, without its line end.
        headers: ``(name, value)`` pairs in order, names as sent, values stripped.
        raw: the head's bytes as they came, blank line included.
        method: a request's method (b"" for a response).
        status: a response's status code (0 for a request).
        wants_upgrade: True for a request asking to switch protocols (``Connection:
            upgrade`` and an ``Upgrade`` header), such as a WebSocket handshake.
    """

    start_line: bytes
    headers: Tuple[Tuple[bytes, bytes], ...]
    raw: bytes = attrs.field(repr=False)
    method: bytes = b""
    status: int = 0
    wants_upgrade: bool = False

    def get(self, name: bytes) -> Optional[bytes]:
        """The last value of header ``name`` (any case), or None."""
        return _header(self.headers, name)

    def tokens(self, name: bytes) -> List[bytes]:
        """The comma-separated, lowercased tokens of every ``name`` header."""
        return _tokens(self.headers, name)

    def rewritten(
        self, drop: Tuple[bytes, ...], add: Tuple[Tuple[bytes, bytes], ...]
    ) -> bytes:
        """The head's bytes without the headers named in ``drop`` (lowercase) and with
        ``add`` appended."""
        lines = [self.start_line]
        lines.extend(k + b": " + v for k, v in self.headers if k.lower() not in drop)
        lines.extend(k + b": " + v for k, v in add)
        return b"\r\n".join(lines) + b"\r\n\r\n"


def _parse_head(raw: bytes, is_request: bool) -> Head:
    text = raw[: -4] if raw.endswith(b"\r\n\r\n") else raw.rstrip(b"\n").rstrip(b"\r")
    lines = [line[:-1] if line.endswith(b"\r") else line for line in text.split(b"\n")]
    start = lines[0]
    match = (_REQUEST_LINE_RE if is_request else _STATUS_LINE_RE).match(start)
    if match is None:
        raise FramingError("malformed request line" if is_request else "malformed status line")
    headers: List[Tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise FramingError("folded header lines are not accepted")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN_RE.match(name):
            raise FramingError("malformed header line")
        value = value.strip(b" \t")
        if b"\r" in value or b"\x00" in value:
            raise FramingError("malformed header value")
        headers.append((name, value))
    if not is_request:
        return Head(start, tuple(headers), raw, status=int(match.group(3)))
    upgrade = (_header(headers, b"upgrade") is not None
               and b"upgrade" in _tokens(headers, b"connection"))
    return Head(start, tuple(headers), raw, method=match.group(1), wants_upgrade=upgrade)


def _header(headers: Sequence[Tuple[bytes, bytes]], name: bytes) -> Optional[bytes]:
    lname = name.lower()
    found = None
    for key, value in headers:
        if key.lower() == lname:
            found = value
    return found


def _tokens(headers: Sequence[Tuple[bytes, bytes]], name: bytes) -> List[bytes]:
    lname = name.lower()
    out: List[bytes] = []
    for key, value in headers:
        if key.lower() == lname:
            out.extend(t.strip().lower() for t in value.split(b",") if t.strip())
    return out


def _content_length(head: Head) -> Optional[int]:
    values = [v for k, v in head.headers if k.lower() == b"content-length"]
    if not values:
        return None
    parts = {p.strip() for v in values for p in v.split(b",")}
    if len(parts) != 1:
        raise FramingError("conflicting Content-Length headers")
    (only,) = parts
    if not only.isdigit() or len(only) > 18:
        raise FramingError("malformed Content-Length")
    return int(only)


# body modes
_NONE, _LENGTH, _CHUNKED, _UNTIL_CLOSE = range(4)
# chunked sub-states
_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class Framer:
    """Frames one direction of an HTTP/1.1 connection (see the module docstring).

    Args:
        is_request: True for the client's requests, False for the server's responses.
        max_head: the largest head accepted.
        content: ``BODY`` events carry the body's content only (a chunked body without its
            framing) rather than the bytes as they came.

    A request framer stops after a request that asks for an upgrade: what follows is
    kept until :meth:`resume` says whether the server switched protocols (then it is
    returned as ``RAW``) or not (then it is framed as further requests). A response
    framer must be told each request's method, in order, with :meth:`expect`.
    """

    def __init__(
        self, *, is_request: bool, max_head: int = MAX_HEAD_BYTES, content: bool = False
    ) -> None:
        self._is_request = is_request
        self._content = content
        self._max_head = max_head
        self._buf = bytearray()
        self._in_body = False
        self._mode = _NONE
        self._left = 0
        self._chunk_state = _SIZE
        self._raw = False
        self._held = False
        self._upgrade_asked = False
        self._expected: Deque[Tuple[bytes, bool]] = deque()
        self._answering: Optional[Tuple[bytes, bool]] = None

    @property
    def raw(self) -> bool:
        """True once the stream switched protocols (everything is ``RAW`` now)."""
        return self._raw

    @property
    def held(self) -> bool:
        """True while a request framer waits for :meth:`resume` after an upgrade request."""
        return self._held

    @property
    def answered_all(self) -> bool:
        """(Response framer.) True when every request announced with :meth:`expect` got
        its whole answer."""
        return not self._expected and self.between_messages

    @property
    def between_messages(self) -> bool:
        """True when no message is partly read (nothing buffered, not in a body)."""
        return not self._in_body and not self._buf

    def expect(self, method: bytes, upgrade: bool = False) -> None:
        """(Response framer.) The next request sent had this method (and asked to upgrade)."""
        self._expected.append((method.upper(), upgrade))

    def resume(self, switched: bool) -> List[Event]:
        """(Request framer.) The server answered the upgrade request: ``switched`` True
        when it switched protocols (from then on everything is ``RAW``, also when no
        upgrade was held). Returns the events of what was held."""
        self._held = False
        if switched:
            self._raw = True
        held = bytes(self._buf)
        self._buf.clear()
        return self.feed(held) if held else []

    def feed(self, data: bytes) -> List[Event]:
        """Take the next bytes of the stream; return the events they complete."""
        if self._raw:
            return [(RAW, data)] if data else []
        if self._held:
            self._buf += data
            return []
        events: List[Event] = []
        try:
            self._feed(memoryview(data), events)
        except FramingError as exc:
            exc.events = events
            raise
        return events

    def _feed(self, view: memoryview, events: List[Event]) -> List[Event]:
        pos = 0
        while True:
            if self._raw:
                rest = bytes(self._buf) + bytes(view[pos:])
                self._buf.clear()
                if rest:
                    events.append((RAW, rest))
                return events
            if self._held:
                self._buf += view[pos:]
                return events
            if pos >= len(view):
                return events
            if not self._in_body:
                pos, complete = self._take_head(view, pos, events)
                if not complete:
                    return events
                continue
            pos = self._take_body(view, pos, events)

    def eof(self) -> List[Event]:
        """The stream ended. Returns ``END`` for a body delimited by the end.

        Raises:
            FramingError: the stream ended inside a head or a framed body.
        """
        if self._raw:
            return []
        if self._in_body and self._mode == _UNTIL_CLOSE:
            self._in_body = False
            return [(END, None)]
        if self._in_body or self._buf.strip(b"\r\n"):
            raise FramingError("the connection ended inside a message")
        return []

    # -- heads ---------------------------------------------------------------------------

    def _take_head(
        self, view: memoryview, pos: int, events: List[Event]
    ) -> Tuple[int, bool]:
        start = len(self._buf)
        self._buf += view[pos:]
        if not self._buf.strip(b"\r\n"):
            self._buf.clear()  # empty lines between messages are ignored
            return len(view), False
        lead = len(self._buf) - len(self._buf.lstrip(b"\r\n"))
        end = self._buf.find(b"\r\n\r\n", lead)
        size = 4
        alt = self._buf.find(b"\n\n", lead)
        if alt != -1 and (end == -1 or alt < end):
            end, size = alt, 2
        if end == -1:
            if len(self._buf) - lead > self._max_head:
                raise FramingError("the head is too large", 431)
            return len(view), False
        if end - lead > self._max_head:
            raise FramingError("the head is too large", 431)
        raw = bytes(self._buf[lead : end + size])
        used = end + size - start  # bytes of ``view`` consumed
        self._buf.clear()
        head = _parse_head(raw, self._is_request)
        self._upgrade_asked = self._is_request and head.wants_upgrade
        after: List[Event] = []  # a head whose framing is refused adds no event at all
        self._start_body(head, after)
        events.append((HEAD, head))
        events.extend(after)
        return pos + used, True

    def _start_body(self, head: Head, events: List[Event]) -> None:
        if self._is_request:
            te = head.tokens(b"transfer-encoding")
            length = _content_length(head)
            if te:
                if length is not None:
                    raise FramingError("both Transfer-Encoding and Content-Length")
                if te[-1] != b"chunked":
                    raise FramingError("a request's last transfer coding must be chunked")
                self._begin(_CHUNKED)
            elif length:
                self._begin(_LENGTH, length)
            else:
                self._finish(events)
            return
        status = head.status
        if 100 <= status < 200 and status != 101:
            return  # interim: the final response follows for the same request
        answering = self._expected.popleft() if self._expected else (b"GET", False)
        method, upgrade = answering
        if status == 101 or (method == b"CONNECT" and 200 <= status < 300):
            events.append((END, None))
            events.append((SWITCHED, None))
            self._raw = True
            return
        if upgrade:
            events.append((REFUSED, None))
        if method == b"HEAD" or status in (204, 304):
            self._finish(events)
            return
        te = head.tokens(b"transfer-encoding")
        if te:
            self._begin(_CHUNKED if te[-1] == b"chunked" else _UNTIL_CLOSE)
            return
        length = _content_length(head)
        if length is None:
            self._begin(_UNTIL_CLOSE)
        elif length:
            self._begin(_LENGTH, length)
        else:
            self._finish(events)

    def _begin(self, mode: int, length: int = 0) -> None:
        self._in_body = True
        self._mode = mode
        self._left = length
        self._chunk_state = _SIZE

    def _finish(self, events: List[Event]) -> None:
        self._in_body = False
        self._mode = _NONE
        events.append((END, None))
        if self._upgrade_asked:  # wait for the server's answer before framing more
            self._upgrade_asked = False
            self._held = True

    # -- bodies --------------------------------------------------------------------------

    def _take_body(self, view: memoryview, pos: int, events: List[Event]) -> int:
        mode = self._mode
        if mode == _UNTIL_CLOSE:
            if pos < len(view):
                events.append((BODY, bytes(view[pos:])))
            return len(view)
        if mode == _LENGTH:
            n = min(self._left, len(view) - pos)
            if n:
                events.append((BODY, bytes(view[pos : pos + n])))
                self._left -= n
            if self._left == 0:
                self._finish(events)
            return pos + n
        return self._take_chunked(view, pos, events)

    def _take_chunked(self, view: memoryview, pos: int, events: List[Event]) -> int:
        begin = pos
        end = len(view)
        while pos < end:
            state = self._chunk_state
            if state == _DATA:
                n = min(self._left, end - pos)
                if self._content and n:
                    events.append((BODY, bytes(view[pos : pos + n])))
                pos += n
                self._left -= n
                if self._left == 0:
                    self._chunk_state = _DATA_END
                    self._left = 2
                continue
            if state == _DATA_END:
                # the CRLF after a chunk's data (a bare LF is accepted)
                byte = view[pos]
                pos += 1
                if byte == 0x0A:
                    self._chunk_state = _SIZE
                elif byte != 0x0D:
                    raise FramingError("malformed chunk end")
                continue
            # _SIZE or _TRAILER: a line
            nl = bytes(view[pos:end]).find(b"\n")
            if nl == -1:
                self._buf += view[pos:end]
                if len(self._buf) > _MAX_CHUNK_LINE:
                    raise FramingError("a chunk size or trailer line is too long")
                pos = end
                break
            line = bytes(self._buf) + bytes(view[pos : pos + nl])
            self._buf.clear()
            pos += nl + 1
            line = line.rstrip(b"\r")
            if state == _TRAILER:
                if line == b"":
                    if pos > begin and not self._content:
                        events.append((BODY, bytes(view[begin:pos])))
                    self._finish(events)
                    return pos
                continue
            size_text = line.split(b";", 1)[0].strip()
            if not _HEX_RE.match(size_text):
                raise FramingError("malformed chunk size")
            size = int(size_text, 16)
            if size == 0:
                self._chunk_state = _TRAILER
            else:
                self._chunk_state = _DATA
                self._left = size
        if pos > begin and not self._content:
            events.append((BODY, bytes(view[begin:pos])))
        return pos
