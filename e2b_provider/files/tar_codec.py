"""The tar streams on this machine's side: written from an upload plan, read from a download.

This module owns :func:`tar_stream` (a plan's entries written as a POSIX tar stream piece
by piece, so memory stays flat whatever the size and the number of files, with
:func:`tar_length` its exact length announced beforehand), and the reading of a stream as
it arrives (:class:`Chunks` over its pieces, :class:`TarReader` for its members, faster
than :mod:`tarfile`'s stream mode).
"""

from __future__ import annotations

import functools
import logging
import os
import struct
import tarfile
from typing import Callable, Dict, Iterator, List, Optional

from ..cancel import CancelToken
from .upload_plan import SENT, SKIP, Item, Unsent, UploadPlan, opened_entries

log = logging.getLogger("e2b_provider")

#: ``progress(done_bytes, total_bytes_or_None)``: called as file content moves.
Progress = Callable[[int, Optional[int]], None]

_BLOCK = 512
CHUNK = 1 << 20
#: The most a filler's pax header holds (the sandbox's reader refuses more than 1 MiB).
_FILL_MAX = 1 << 16

_USTAR = struct.Struct("100s8s8s8s12s12s8s1s100s6s2s32s32s8s8s155s12s")
#: Numbers below this fit a ustar header's 12-byte octal fields.
_OCTAL_11 = 8**11
#: The checksum of a plain header's constant fields: uid and gid "0000000\0", the
#: checksum field as eight spaces, "ustar\0" and "00".
_CHECK_BASE = sum(b"0000000\0" * 2 + b" " * 8 + b"ustar\0" + b"00")


def _plain(item: Item, size: int) -> bool:
    """Whether ``item``'s header is one ustar block (ASCII name and link of at most 100
    bytes, numbers that fit): :func:`_header` packs it directly."""
    name, link = item.rel, item.link
    if size < 0 and not item.link and not name.endswith("/"):
        name += "/"  # as tarfile names a directory
    return (
        name.isascii() and link.isascii() and len(name) <= 100 and len(link) <= 100
        and 0 <= max(size, 0) < _OCTAL_11 and 0 <= int(item.mtime) < _OCTAL_11
    )


def _header(item: Item, size: int) -> bytes:
    """The tar header of ``item`` (``size`` -1: a directory), as ``tarfile`` writes it in
    PAX format. A plain member (see :func:`_plain`) is packed directly, which is several
    times faster for trees of many small files; the rest goes through ``tarfile``."""
    kind = b"2" if item.link else (b"5" if size < 0 else b"0")
    length = max(size, 0)
    mtime = int(item.mtime)
    name, link = item.rel, item.link
    if kind == b"5" and not name.endswith("/"):
        name += "/"  # as tarfile names a directory
    if _plain(item, size):
        raw_name, raw_link = name.encode("ascii"), link.encode("ascii")
        numbers = b"%07o\0" % (item.mode & 0o777) + b"%011o\0%011o\0" % (length, mtime)
        # the checksum is the sum of the header's bytes with its own field as spaces
        check = _CHECK_BASE + sum(raw_name) + sum(raw_link) + sum(numbers) + kind[0]
        return _USTAR.pack(
            raw_name, numbers[:8], b"0000000\0", b"0000000\0", numbers[8:20], numbers[20:],
            b"%06o\0 " % check, kind, raw_link, b"ustar\0", b"00",
            b"", b"", b"", b"", b"", b"",
        )
    ti = tarfile.TarInfo(item.rel)
    ti.mode = item.mode & 0o777
    ti.mtime = mtime
    if item.link:
        ti.type = tarfile.SYMTYPE
        ti.linkname = link
    elif size < 0:
        ti.type = tarfile.DIRTYPE
    else:
        ti.size = size
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_stream(
    plan: UploadPlan,
    end_name: str,
    *,
    progress: Optional[Progress] = None,
    cancel: Optional[CancelToken] = None,
    unsent: Optional[Unsent] = None,
) -> Iterator[bytes]:
    """The tar stream of ``plan``, in pieces of about :data:`CHUNK` bytes (small members
    are gathered into one piece), ending with an empty member named ``end_name`` and the
    end-of-archive blocks; always :func:`tar_length` bytes.

    Entries are read as :func:`opened_entries` opens them: never through a symbolic link, each
    checked to be what was planned. One that is not any more (replaced, by a link or
    anything else, removed, or a file whose size changed since it was planned) is not
    sent, nor is anything below a directory left out: its place in the stream is taken
    by pax global headers holding only a comment, which tar readers skip, and it is
    recorded in ``unsent``. A file that shrinks while it is read is padded with zeros to
    its planned size (and recorded); one that grows is cut at it.

    Raises:
        Cancelled: ``cancel`` fired (checked between pieces).
        OSError: a local file could not be read.
    """
    if unsent is None:
        unsent = Unsent()
    done = 0
    out = bytearray()
    if progress is not None:
        progress(0, plan.total)
    walk = opened_entries(plan, unsent)
    try:
        for item, fd in walk:
            if cancel is not None:
                cancel.raise_if_cancelled()
            if len(out) >= CHUNK:  # the headers of many small entries
                yield bytes(out)
                out.clear()
                if progress is not None:
                    progress(done, plan.total)
            size = -1 if item.is_dir else (0 if item.link else item.size)
            if fd == SKIP:
                for piece in _filler(_length(item, size)):
                    if out and len(out) + len(piece) > CHUNK:
                        yield bytes(out)
                        out.clear()
                    out += piece
                done += item.size
                continue
            out += _header(item, size)
            if fd == SENT:
                continue
            left = item.size
            while left > 0:
                if len(out) >= CHUNK:
                    yield bytes(out)
                    out.clear()
                    if cancel is not None:
                        cancel.raise_if_cancelled()
                    if progress is not None:
                        progress(done, plan.total)
                if not out and left >= CHUNK:
                    # a large file's pieces go out as read: no copy on this side
                    piece = os.read(fd, CHUNK)
                    if len(piece) == CHUNK:
                        left -= CHUNK
                        done += CHUNK
                        yield piece
                        if cancel is not None:
                            cancel.raise_if_cancelled()
                        if progress is not None:
                            progress(done, plan.total)
                        continue
                else:
                    piece = os.read(fd, min(max(CHUNK - len(out), _BLOCK), left))
                if not piece:
                    log.warning("e2b_provider: %s shrank while it was uploaded; its end is "
                                "padded with zeros",
                                f"{plan.root}/{item.rel}" if plan.is_dir else plan.root)
                    unsent.entries.append(
                        (item.rel, "it shrank while it was uploaded: its end was sent as zeros"))
                    while left > 0:
                        pad = min(CHUNK, left)
                        out += bytes(pad)
                        left -= pad
                        done += pad
                        if len(out) >= CHUNK:
                            yield bytes(out)
                            out.clear()
                    break
                left -= len(piece)
                done += len(piece)
                out += piece
            out += b"\0" * (-item.size % _BLOCK)
    finally:
        walk.close()
    out += _end_header(end_name)
    out += b"\0" * (2 * _BLOCK)
    yield bytes(out)
    if progress is not None:
        progress(done, plan.total)


def _length(item: Item, size: int) -> int:
    """The bytes ``item`` (``size`` as for :func:`_header`) takes in the stream: its header,
    and a file's data padded to a whole block."""
    head = _BLOCK if _plain(item, size) else len(_header(item, size))
    return head + (size + (-size % _BLOCK) if size > 0 else 0)


def tar_length(plan: UploadPlan, end_name: str) -> int:
    """The exact length of :func:`tar_stream` ``(plan, end_name)``."""
    total = len(_end_header(end_name)) + 2 * _BLOCK
    for item in plan.items:
        total += _length(item, -1 if item.is_dir else (0 if item.link else item.size))
    return total


def _end_header(end_name: str) -> bytes:
    return tarfile.TarInfo(end_name).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _filler(length: int) -> Iterator[bytes]:
    """``length`` bytes (whole blocks) of pax global headers holding only a ``comment``
    record, which a tar reader skips: the place of an entry not sent, in a stream whose
    length was announced."""
    while length > 0:
        size = min(length - _BLOCK, _FILL_MAX)
        yield _comment(size)
        length -= _BLOCK + size


@functools.lru_cache(maxsize=4)
def _comment(size: int) -> bytes:
    """A pax global header whose ``size`` bytes (whole blocks) are one ``comment``."""
    ti = tarfile.TarInfo("pax_global_header")
    ti.type = tarfile.XGLTYPE
    ti.size = size
    head = ti.tobuf(tarfile.USTAR_FORMAT)
    if not size:
        return head
    record = b"%d comment=" % size
    return head + record + b"x" * (size - len(record) - 1) + b"\n"


def read_upto(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes of ``fd``, fewer only at its end."""
    parts: List[bytes] = []
    while n > 0:
        piece = os.read(fd, n)
        if not piece:
            break
        parts.append(piece)
        n -= len(piece)
    return b"".join(parts)


class Chunks:
    """A file object over pieces of bytes pulled from ``pull`` (None: the end), read
    without gathering them: :meth:`read` hands out (a part of) one piece at a time."""

    def __init__(self, pull: Callable[[], Optional[bytes]]) -> None:
        self._pull = pull
        self._piece = b""
        self._pos = 0
        self._eof = False

    def _next_piece(self) -> bool:
        """Move to the next non-empty piece; False at the end."""
        while not self._eof:
            piece = self._pull()
            if piece is None:
                self._eof = True
                break
            if piece:
                self._piece, self._pos = piece, 0
                return True
        self._piece, self._pos = b"", 0
        return False

    def read_line(self, limit: int) -> bytes:
        """The first line (without its newline), at most ``limit`` bytes; ``b""`` if none."""
        line = bytearray()
        while True:
            nl = self._piece.find(b"\n", self._pos)
            if nl >= 0:
                line += self._piece[self._pos : nl]
                self._pos = nl + 1
                return bytes(line) if len(line) <= limit else b""
            line += self._piece[self._pos :]
            if len(line) > limit or not self._next_piece():
                return b""

    def read(self, n: int) -> bytes:
        """At least one and at most ``n`` bytes (``n`` > 0), from one piece; ``b""`` at the
        end."""
        if self._pos >= len(self._piece) and not self._next_piece():
            return b""
        piece, pos = self._piece, self._pos
        if pos == 0 and n >= len(piece):
            self._pos = len(piece)
            return piece  # a whole piece: not copied
        out = piece[pos : pos + n]
        self._pos = pos + len(out)
        return out


class TarReader:
    """The members of a tar stream, read in order at the speed of the stream: ustar headers
    and pax records parsed here, each member handed out as a :class:`tarfile.TarInfo` (for
    the ``data`` filter) and its data read with :meth:`read`. ``tarfile``'s own stream mode
    costs several times as much per member."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self._left = 0
        self._pad = 0
        #: Set when a global header said the member before it was not read whole (see
        #: :data:`FAILED_KEY`); the caller clears it.
        self.failed = False

    def _upto(self, n: int) -> bytes:
        """``n`` bytes, fewer only at the end of the stream."""
        data = self._read(n) if n else b""
        if len(data) == n or not data:
            return data
        parts = [data]
        got = len(data)
        while got < n:
            more = self._read(n - got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def _exactly(self, n: int) -> bytes:
        data = self._upto(n)
        if len(data) != n:
            raise tarfile.ReadError("unexpected end of data")
        return data

    def read(self, n: int) -> bytes:
        """At least one and at most ``n`` bytes of the current member's data; ``b""`` after
        its end."""
        n = min(n, self._left)
        if n <= 0:
            return b""
        data = self._read(n)
        if not data:
            raise tarfile.ReadError("unexpected end of data")
        self._left -= len(data)
        return data

    def next(self) -> Optional[tarfile.TarInfo]:
        """The next member, or None at the end of the archive."""
        while self._left:
            self.read(self._left)
        if self._pad:
            self._exactly(self._pad)
            self._pad = 0
        pax: Dict[str, str] = {}
        while True:
            block = self._upto(_BLOCK)
            if block == bytes(_BLOCK):
                return None
            if not block:  # cut between two members: not the end of the archive
                raise tarfile.ReadError("unexpected end of data")
            if len(block) != _BLOCK:
                raise tarfile.ReadError("unexpected end of data")
            if _number(block[148:156]) != sum(block) - sum(block[148:156]) + 256:
                raise tarfile.ReadError("a header's checksum is wrong")
            kind = block[156:157]
            size = _number(block[124:136])
            if kind in (b"x", b"g"):
                if not 0 <= size <= (1 << 20):
                    raise tarfile.ReadError("an extended header is too large")
                data = self._exactly(size)
                self._exactly(-size % _BLOCK)
                if kind == b"x":
                    pax.update(_pax_records(data))
                elif FAILED_KEY in _pax_records(data):
                    self.failed = True
                continue
            name = block[0:100].split(b"\0", 1)[0]
            prefix = block[345:500].split(b"\0", 1)[0]
            if prefix and block[257:262] == b"ustar":
                name = prefix + b"/" + name
            ti = tarfile.TarInfo(pax.get("path") or name.decode("utf-8", "surrogateescape"))
            ti.type = kind if kind != b"\0" else tarfile.REGTYPE
            ti.mode = _number(block[100:108]) & 0o7777
            ti.mtime = float(pax["mtime"]) if "mtime" in pax else _number(block[136:148])
            ti.size = int(pax["size"]) if "size" in pax else size
            ti.linkname = pax.get("linkpath") or block[157:257].split(b"\0", 1)[0].decode(
                "utf-8", "surrogateescape"
            )
            if ti.size < 0:
                raise tarfile.ReadError("a negative size")
            data_size = ti.size if ti.type in tarfile.REGULAR_TYPES else 0
            self._left, self._pad = data_size, -data_size % _BLOCK
            return ti


#: The record of a global pax header that the file agent's ``pack`` writes right after a
#: member it could not read whole (it shrank): that member is not to be written.
FAILED_KEY = "CAPYBARA.failed"


def _number(field: bytes) -> int:
    """A tar header's number: octal text, or base-256 (a first byte with its high bit)."""
    if field[:1] and field[0] & 0x80:
        value = field[0] & 0x3F
        for byte in field[1:]:
            value = value * 256 + byte
        return -value if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise tarfile.ReadError("a header number is not octal") from None


def _pax_records(data: bytes) -> Dict[str, str]:
    """The ``length key=value`` records of a pax extended header."""
    out: Dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            length = 0
        if length <= 0 or pos + length > len(data):
            raise tarfile.ReadError("a malformed pax record")
        key, eq, value = data[space + 1 : pos + length - 1].partition(b"=")
        if not eq:
            raise tarfile.ReadError("a malformed pax record")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out
