"""A JSON string's content decoded piece by piece, as its bytes arrive, never kept whole.

A code interpreter sends a cell's output as JSON lines, and a cell that writes 100 MB in a
tight loop can come as one ``stdout`` line of that size. :class:`JsonTextPieces` takes the
bytes that follow the string's opening quote, in any pieces, and gives back the text each
piece completes: it cuts only where no escape (``\\n``, ``\\"``, ``\\uXXXX``, a surrogate
pair ``\\uD83D\\uDE00``) or UTF-8 character is split, and keeps at most those few bytes back.
Pure: no I/O.
"""

from __future__ import annotations

import codecs
import json
from typing import Tuple

from ..errors import ProtocolError

__all__ = ["JsonTextPieces"]

_BACKSLASH = 0x5C
_QUOTE = 0x22


def _escape_at(buf: bytearray, i: int) -> bool:
    """Whether the backslash at ``i`` starts an escape (an odd run of backslashes ends at
    it: ``\\\\`` is an escaped backslash, the next one starts an escape anew)."""
    j = i
    while j > 0 and buf[j - 1] == _BACKSLASH:
        j -= 1
    return (i - j) % 2 == 0


def _closing_quote(buf: bytearray) -> int:
    """The index of the string's closing quote in ``buf`` (one not escaped), or -1."""
    at = buf.find(b'"')
    while at >= 0:
        if at == 0 or buf[at - 1] != _BACKSLASH or not _escape_at(buf, at - 1):
            return at
        at = buf.find(b'"', at + 1)
    return -1


def _high_surrogate(escape: bytes) -> bool:
    """Whether a ``\\uXXXX`` escape is the first half of a surrogate pair."""
    try:
        return 0xD800 <= int(escape[2:6], 16) <= 0xDBFF
    except ValueError:
        return False


def _safe_cut(buf: bytearray) -> int:
    """How much of ``buf`` (string content, no closing quote) can be decoded now: all of it
    but an escape cut short at its end, or a surrogate pair's first half alone there."""
    end = len(buf)
    i = buf.rfind(b"\\", max(0, end - 12))
    while i >= 0 and not _escape_at(buf, i):
        i = buf.rfind(b"\\", max(0, end - 12), i)
    if i >= 0:
        size = 6 if buf[i + 1:i + 2] == b"u" else 2
        if i + size > end:
            end = i
    tail = bytes(buf[end - 6:end]) if end >= 6 else b""
    if tail.startswith(b"\\u") and _escape_at(buf, end - 6) and _high_surrogate(tail):
        end -= 6  # wait for the pair's second half
    return end


class JsonTextPieces:
    """The content of one JSON string, decoded as it arrives (see the module doc)."""

    __slots__ = ("_utf8", "closed")

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        #: True once the closing quote was read.
        self.closed = False

    def feed(self, buf: bytearray) -> Tuple[str, bool]:
        """Take what it can from the start of ``buf`` (consumed in place): the text decoded,
        and whether the string ended (its closing quote consumed too).

        Raises:
            ProtocolError: an escape JSON does not have.
        """
        quote = _closing_quote(buf)
        end = quote if quote >= 0 else _safe_cut(buf)
        raw = bytes(buf[:end])
        del buf[:end + (1 if quote >= 0 else 0)]
        text = self._utf8.decode(raw, final=quote >= 0)
        if quote >= 0:
            self.closed = True
        if "\\" not in text:
            return text, self.closed
        try:
            decoded: str = json.loads('"' + text + '"')
        except ValueError as exc:
            raise ProtocolError("code interpreter: a bad escape in an output line") from exc
        return decoded, self.closed
