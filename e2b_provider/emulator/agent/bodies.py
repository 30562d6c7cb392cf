"""Streaming request-body decoders of the envd agent's ``POST /files``: gzip and multipart.

envd decodes ``Content-Encoding: gzip`` itself (Go's ``compress/gzip``: several members in a
row, header and trailer checks) and reads ``multipart/form-data`` with Go's ``mime/multipart``
(preamble skipped, ``--boundary`` lines with optional trailing blanks, LF-only line ends
tolerated, truncated header blocks read as the end of the form). This module reproduces both
as pull-based async readers over the request body, so an upload of any size is decoded and
written in bounded steps without holding it in memory. Errors carry Go's texts (``gzip:
invalid header``, ``gzip: invalid checksum``, ``unexpected EOF``, ``multipart: NextPart:
…``), which :mod:`.files` wraps the way envd does.
"""

from __future__ import annotations

import struct
import zlib
from typing import Dict, Optional, Protocol, Tuple

from .gohttp import MediaTypeError, parse_media_type

__all__ = [
    "BodyError",
    "ByteSource",
    "GzipSource",
    "MultipartReader",
    "Part",
    "multipart_boundary",
]

#: Largest piece of decompressed output produced per read.
OUT_CHUNK = 256 * 1024
#: Go's bufio size for multipart boundary lines.
_LINE_LIMIT = 4096
#: Bound on one part's header block (Go allows 10 MiB; the agent keeps memory small).
_HEADER_LIMIT = 1024 * 1024


class BodyError(Exception):
    """The body could not be read or decoded; the message is Go's error text."""


class ByteSource(Protocol):
    """An async byte stream: :meth:`read` returns ``b""`` at the end."""

    async def read(self) -> bytes:
        """The next bytes (``b""`` once the stream is exhausted)."""


class _Buffered:
    """A byte source with a look-ahead buffer."""

    def __init__(self, src: ByteSource) -> None:
        self._src = src
        self.buf = bytearray()
        self.eof = False

    async def fill(self) -> bool:
        """Append the next piece of the source; False at its end."""
        if self.eof:
            return False
        chunk = await self._src.read()
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    async def fill_to(self, n: int) -> bool:
        """Buffer at least ``n`` bytes; False when the source ends first."""
        while len(self.buf) < n:
            if not await self.fill():
                return False
        return True

    def take(self, n: int) -> bytes:
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


# ---- gzip ----------------------------------------------------------------------------------

_FHCRC, _FEXTRA, _FNAME, _FCOMMENT = 0x02, 0x04, 0x08, 0x10


class GzipSource:
    """Go's multistream ``gzip.Reader`` over a byte source (itself a :class:`ByteSource`).

    Call :meth:`open` first: it reads the first member's header, as ``gzip.NewReader`` does.
    """

    def __init__(self, src: ByteSource) -> None:
        self._in = _Buffered(src)
        self._inflater: Optional[zlib._Decompress] = None
        self._crc = 0
        self._size = 0
        self._fed = 0
        self._done = False

    async def open(self) -> None:
        """Read the first member's header.

        Raises:
            BodyError: ``EOF`` (empty body), ``unexpected EOF`` or ``gzip: invalid header``.
        """
        if not await self._header():
            raise BodyError("EOF")

    async def _header(self) -> bool:
        src = self._in
        await src.fill_to(10)
        if not src.buf:
            return False
        if len(src.buf) < 10:
            raise BodyError("unexpected EOF")
        head = bytes(src.buf[:10])
        if head[0] != 0x1F or head[1] != 0x8B or head[2] != 8:
            raise BodyError("gzip: invalid header")
        flags = head[3]
        pos = 10
        if flags & _FEXTRA:
            if not await src.fill_to(pos + 2):
                raise BodyError("unexpected EOF")
            pos += 2 + struct.unpack("<H", bytes(src.buf[pos : pos + 2]))[0]
            if not await src.fill_to(pos):
                raise BodyError("unexpected EOF")
        for flag in (_FNAME, _FCOMMENT):
            if flags & flag:
                start = pos
                while True:
                    if not await src.fill_to(pos + 1):
                        raise BodyError("unexpected EOF")
                    if pos - start >= 512:
                        raise BodyError("gzip: invalid header")
                    pos += 1
                    if src.buf[pos - 1] == 0:
                        break
        if flags & _FHCRC:
            if not await src.fill_to(pos + 2):
                raise BodyError("unexpected EOF")
            want = struct.unpack("<H", bytes(src.buf[pos : pos + 2]))[0]
            if zlib.crc32(bytes(src.buf[:pos])) & 0xFFFF != want:
                raise BodyError("gzip: invalid header")
            pos += 2
        src.take(pos)
        self._inflater = zlib.decompressobj(-15)
        self._crc = 0
        self._size = 0
        self._fed = 0
        return True

    async def read(self) -> bytes:
        """Decompressed bytes (at most :data:`OUT_CHUNK` at a time); ``b""`` at the end.

        Raises:
            BodyError: ``flate: corrupt input …``, ``gzip: invalid checksum``,
                ``gzip: invalid header`` (garbage after a member) or ``unexpected EOF``.
        """
        while not self._done:
            inflater = self._inflater
            if inflater is None:
                if not await self._header():
                    self._done = True
                    break
                continue
            if inflater.unconsumed_tail:
                data_in = inflater.unconsumed_tail
            else:
                if not self._in.buf and not await self._in.fill():
                    raise BodyError("unexpected EOF")
                data_in = self._in.take(len(self._in.buf))
                self._fed += len(data_in)
            try:
                out = inflater.decompress(data_in, OUT_CHUNK)
            except zlib.error:
                raise BodyError(f"flate: corrupt input before offset {self._fed}") from None
            self._crc = zlib.crc32(out, self._crc)
            self._size += len(out)
            if inflater.eof:
                self._in.buf[:0] = inflater.unused_data
                await self._trailer()
                self._inflater = None
            if out:
                return out
        return b""

    async def _trailer(self) -> None:
        if not await self._in.fill_to(8):
            raise BodyError("unexpected EOF")
        crc, size = struct.unpack("<II", self._in.take(8))
        if crc != self._crc or size != self._size & 0xFFFFFFFF:
            raise BodyError("gzip: invalid checksum")


# ---- multipart -----------------------------------------------------------------------------


def multipart_boundary(content_type: str) -> str:
    """The boundary of a ``multipart/form-data`` (or ``multipart/mixed``) body.

    Raises:
        BodyError: Go's ``request.MultipartReader`` error text.
    """
    try:
        media, params = parse_media_type(content_type)
    except MediaTypeError:
        media, params = "", {}
    if media not in ("multipart/form-data", "multipart/mixed"):
        raise BodyError("request Content-Type isn't multipart/form-data")
    boundary = params.get("boundary")
    if boundary is None:
        raise BodyError("no multipart boundary param in Content-Type")
    return boundary


def _skip_lwsp(data: bytes) -> bytes:
    return data.lstrip(b" \t")


def _match_after(buf: bytes, prefix_len: int, at_eof: bool) -> int:
    """Go's ``matchAfterPrefix``: +1 boundary, -1 not a boundary, 0 need more bytes."""
    if len(buf) == prefix_len:
        return 1 if at_eof else 0
    c = buf[prefix_len]
    if c in b" \t\r\n":
        return 1
    if c == 0x2D:  # '-'
        if len(buf) == prefix_len + 1:
            return -1 if at_eof else 0
        if buf[prefix_len + 1] == 0x2D:
            return 1
    return -1


class Part:
    """One part of a multipart body: its headers and a streaming body reader."""

    def __init__(self, reader: MultipartReader, headers: Dict[str, str]) -> None:
        self._reader = reader
        self.headers = headers
        self._total = 0
        self._done = False

    def _disposition(self) -> Tuple[str, Dict[str, str]]:
        return parse_media_type(self.headers.get("content-disposition", ""))

    def form_name(self) -> str:
        """Go's ``Part.FormName``: ``name`` of a ``form-data`` disposition, else ``""``."""
        try:
            disposition, params = self._disposition()
        except MediaTypeError:
            return ""
        return params.get("name", "") if disposition == "form-data" else ""

    def file_name_with_path(self) -> str:
        """The disposition's ``filename`` with its directories (envd's ``FileNameWithPath``).

        Raises:
            BodyError: the disposition does not parse or has no filename.
        """
        try:
            _, params = self._disposition()
        except MediaTypeError as exc:
            raise BodyError(str(exc)) from None
        name = params.get("filename")
        if name is None:
            raise BodyError("filename not found in Content-Disposition header")
        return name

    def _scan(self, buf: bytes, at_eof: bool) -> Tuple[int, bool]:
        """Go's ``scanUntilBoundary``: ``(data bytes to hand out, boundary reached)``."""
        dash = self._reader.dash_boundary
        nl_dash = self._reader.nl_dash_boundary
        if self._total == 0:
            if buf.startswith(dash):
                m = _match_after(buf, len(dash), at_eof)
                if m == -1:
                    return len(dash), False
                return 0, m == 1
            if dash.startswith(buf):
                return 0, False
        i = buf.find(nl_dash)
        if i >= 0:
            m = _match_after(buf[i:], len(nl_dash), at_eof)
            if m == -1:
                return i + len(nl_dash), False
            return i, m == 1
        if nl_dash.startswith(buf):
            return 0, False
        i = buf.rfind(nl_dash[:1])
        if i >= 0 and nl_dash.startswith(buf[i:]):
            return i, False
        return len(buf), False

    async def read(self) -> bytes:
        """The next bytes of the body (``b""`` at its end).

        Raises:
            BodyError: ``unexpected EOF`` when the body ends without a boundary.
        """
        src = self._reader.src
        while not self._done:
            if not src.buf and not await src.fill():
                raise BodyError("unexpected EOF")
            n, boundary = self._scan(bytes(src.buf), src.eof)
            if n:
                self._total += n
                return src.take(n)
            if boundary:
                self._done = True
                break
            if not await src.fill():
                n, boundary = self._scan(bytes(src.buf), True)
                if n or boundary:
                    continue
                raise BodyError("unexpected EOF")
        return b""

    async def drain(self) -> None:
        """Read and drop the rest of the body (errors are left for the next part)."""
        try:
            while await self.read():
                pass
        except BodyError:
            self._done = True


class MultipartReader:
    """Go's ``multipart.Reader`` (``NextPart``) over a byte source."""

    def __init__(self, src: ByteSource, boundary: str) -> None:
        self.src = _Buffered(src)
        b = boundary.encode("utf-8", "surrogateescape")
        self.dash_boundary = b"--" + b
        self._final = b"--" + b + b"--"
        self._nl = b"\r\n"
        self.nl_dash_boundary = b"\r\n--" + b
        self._parts = 0
        self._current: Optional[Part] = None

    async def _line(self) -> Tuple[bytes, bool]:
        """One line with its end (``(line, at_eof)``; at the end the line may lack it)."""
        src = self.src
        while True:
            i = src.buf.find(b"\n", 0, _LINE_LIMIT)
            if i >= 0:
                return src.take(i + 1), False
            if len(src.buf) >= _LINE_LIMIT:
                raise BodyError("multipart: NextPart: bufio: buffer full")
            if not await src.fill():
                return src.take(len(src.buf)), True

    def _is_delimiter(self, line: bytes) -> bool:
        if not line.startswith(self.dash_boundary):
            return False
        rest = _skip_lwsp(line[len(self.dash_boundary) :])
        if self._parts == 0 and rest == b"\n":
            self._nl = b"\n"
            self.nl_dash_boundary = self.nl_dash_boundary[1:]
        return rest == self._nl

    def _is_final(self, line: bytes) -> bool:
        if not line.startswith(self._final):
            return False
        rest = _skip_lwsp(line[len(self._final) :])
        return not rest or rest == self._nl

    async def next_part(self) -> Optional[Part]:
        """The next part, or None at the end of the form.

        Raises:
            BodyError: a malformed body (Go's ``multipart: …`` texts).
        """
        if self._current is not None:
            await self._current.drain()
            self._current = None
        if self.dash_boundary == b"--":
            raise BodyError("multipart: boundary is empty")
        expect_new = False
        while True:
            line, at_eof = await self._line()
            if at_eof:
                if self._is_final(line):
                    return None
                raise BodyError("multipart: NextPart: EOF")
            if self._is_delimiter(line):
                self._parts += 1
                headers = await self._headers()
                if headers is None:
                    return None  # Go hands the reader io.EOF here: the form just ends
                self._current = Part(self, headers)
                return self._current
            if self._is_final(line):
                return None
            if expect_new:
                raise BodyError(f"multipart: expecting a new Part; got line {_go_quote(line)}")
            if self._parts == 0:
                continue
            if line == self._nl:
                expect_new = True
                continue
            raise BodyError(f"multipart: unexpected line in Next(): {_go_quote(line)}")

    async def _headers(self) -> Optional[Dict[str, str]]:
        headers: Dict[str, str] = {}
        size = 0
        current: Optional[str] = None  # "" for a repeated header (only the first is kept)
        while True:
            line, at_eof = await self._line()
            if at_eof and not line.endswith(b"\n"):
                return None
            size += len(line)
            if size > _HEADER_LIMIT:
                raise BodyError("message too large")
            text = line.rstrip(b"\r\n")
            if not text:
                return headers
            if text[:1] in (b" ", b"\t"):
                if current is None:
                    raise BodyError("malformed MIME header initial line: " + text.decode("latin-1"))
                if current:
                    headers[current] += " " + text.strip().decode("utf-8", "surrogateescape")
                continue
            key, colon, value = text.partition(b":")
            if not colon or not key or key != key.strip():
                raise BodyError("malformed MIME header line: " + text.decode("latin-1"))
            name = key.decode("latin-1").lower()
            if name in headers:
                current = ""
                continue
            current = name
            headers[name] = value.strip(b" \t").decode("utf-8", "surrogateescape")


def _go_quote(data: bytes) -> str:
    """Go's ``%q`` of a byte string (close enough for error texts)."""
    out = []
    for b in data:
        ch = chr(b)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif 0x20 <= b < 0x7F:
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append(f"\\x{b:02x}")
    return '"' + "".join(out) + '"'
