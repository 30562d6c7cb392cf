"""Go's ``http.ServeContent`` rules for ranges and preconditions, as envd's downloads follow them.

This module owns ``Range`` parsing (several ranges, suffix ranges, "failed to overlap"), the
``multipart/byteranges`` layout, ``Content-Range``, the ``If-*`` preconditions of a response
without an ETag (envd sets none) and the size ``ServeContent`` computes. Pure but for
:func:`lseek_size`.
"""

from __future__ import annotations

import os
import re
from typing import List, Mapping, Optional, Tuple

from .dates import parse_http_date

__all__ = [
    "COND_FALSE",
    "COND_NONE",
    "COND_TRUE",
    "RangeError",
    "byte_range_parts",
    "content_range",
    "lseek_size",
    "parse_range",
    "preconditions",
]

COND_NONE = 0
COND_TRUE = 1
COND_FALSE = 2


class RangeError(ValueError):
    """A ``Range`` header that cannot be served (416); ``no_overlap`` for "failed to overlap"."""

    def __init__(self, message: str, no_overlap: bool = False) -> None:
        super().__init__(message)
        self.no_overlap = no_overlap


_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = (1 << 63) - 1


def _parse_int64(text: str) -> Optional[int]:
    if not _INT64.fullmatch(text):
        return None
    value = int(text)
    return value if -_INT64_MAX - 1 <= value <= _INT64_MAX else None


def _trim(text: str) -> str:
    return text.strip(" \t\r\n")


def parse_range(header: str, size: int) -> List[Tuple[int, int]]:
    """Go's ``parseRange``: ``[(start, length), …]``; empty when there is no header.

    Raises:
        RangeError: ``invalid range`` or ``invalid range: failed to overlap``.
    """
    if not header:
        return []
    if not header.startswith("bytes="):
        raise RangeError("invalid range")
    ranges: List[Tuple[int, int]] = []
    no_overlap = False
    for spec in header[len("bytes=") :].split(","):
        spec = _trim(spec)
        if not spec:
            continue
        first, dash, last = spec.partition("-")
        if not dash:
            raise RangeError("invalid range")
        first, last = _trim(first), _trim(last)
        if not first:
            if not last or last[0] == "-":
                raise RangeError("invalid range")
            n = _parse_int64(last)
            if n is None or n < 0:
                raise RangeError("invalid range")
            n = min(n, size)
            ranges.append((size - n, n))
            continue
        start = _parse_int64(first)
        if start is None or start < 0:
            raise RangeError("invalid range")
        if start >= size:
            no_overlap = True
            continue
        if not last:
            ranges.append((start, size - start))
            continue
        end = _parse_int64(last)
        if end is None or start > end:
            raise RangeError("invalid range")
        end = min(end, size - 1)
        ranges.append((start, end - start + 1))
    if no_overlap and not ranges:
        raise RangeError("invalid range: failed to overlap", no_overlap=True)
    return ranges


def content_range(start: int, length: int, size: int) -> str:
    """``bytes <first>-<last>/<size>``."""
    return f"bytes {start}-{start + length - 1}/{size}"


def byte_range_parts(
    ranges: List[Tuple[int, int]], ctype: str, size: int, boundary: str
) -> Tuple[List[Tuple[bytes, int, int]], bytes, int]:
    """The ``multipart/byteranges`` layout Go writes for several ranges.

    Returns:
        ``([(part_head, start, length), …], closing, total_length)``: each part's header
        bytes precede that range of the file; ``closing`` ends the body.
    """
    parts: List[Tuple[bytes, int, int]] = []
    total = 0
    for i, (start, length) in enumerate(ranges):
        lead = "--" if i == 0 else "\r\n--"
        head = (
            f"{lead}{boundary}\r\nContent-Range: {content_range(start, length, size)}\r\n"
            f"Content-Type: {ctype}\r\n\r\n"
        ).encode()
        parts.append((head, start, length))
        total += len(head) + length
    closing = f"\r\n--{boundary}--\r\n".encode()
    return parts, closing, total + len(closing)


def _scan_etag(s: str) -> Tuple[str, str]:
    s = _trim(s)
    start = 2 if s.startswith("W/") else 0
    if len(s) - start < 2 or s[start] != '"':
        return "", ""
    for i in range(start + 1, len(s)):
        c = ord(s[i])
        if c == 0x22:
            return s[: i + 1], s[i + 1 :]
        if not (c == 0x21 or 0x23 <= c <= 0x7E or c >= 0x80):
            return "", ""
    return "", ""


def _etag_list(header: str, star: int, match: int) -> int:
    """Walk an ``If-Match``/``If-None-Match`` list against an empty server ETag."""
    buf = header
    while True:
        buf = _trim(buf)
        if not buf:
            break
        if buf[0] == ",":
            buf = buf[1:]
            continue
        if buf[0] == "*":
            return star
        etag, buf = _scan_etag(buf)
        if not etag:
            break
    return match


def preconditions(
    method: str, headers: Mapping[str, str], mtime: int
) -> Tuple[Optional[int], Optional[str]]:
    """Go's ``checkPreconditions`` for a response without an ETag.

    Args:
        method: the request method.
        headers: the request headers (``get(name)``).
        mtime: the file's modification time in whole seconds (0 = unknown).

    Returns:
        ``(status, range_header)``: ``status`` is 304 or 412 when the precondition decides the
        answer, else None; ``range_header`` is the ``Range`` to honour (``None`` when absent
        or cancelled by ``If-Range``).
    """
    known = mtime != 0
    cond = COND_NONE
    if_match = headers.get("If-Match")
    if if_match:
        cond = _etag_list(if_match, COND_TRUE, COND_FALSE)
    else:
        ius = headers.get("If-Unmodified-Since")
        if ius and known:
            t = parse_http_date(ius)
            if t is not None:
                cond = COND_TRUE if mtime <= t else COND_FALSE
    if cond == COND_FALSE:
        return 412, None
    get_or_head = method in ("GET", "HEAD")
    inm = headers.get("If-None-Match")
    if inm:
        if _etag_list(inm, COND_FALSE, COND_TRUE) == COND_FALSE:
            return (304 if get_or_head else 412), None
    else:
        ims = headers.get("If-Modified-Since")
        if get_or_head and ims and known:
            t = parse_http_date(ims)
            if t is not None and mtime <= t:
                return 304, None
    rng = headers.get("Range")
    if rng and get_or_head:
        if_range = headers.get("If-Range")
        if if_range:
            etag, _ = _scan_etag(if_range)
            if etag:
                rng = None
            else:
                t = parse_http_date(if_range) if known else None
                if t is None or t != mtime:
                    rng = None
    return None, rng or None


def lseek_size(fd: int) -> int:
    """The size ``http.ServeContent`` computes (seek to the end and back).

    Raises:
        OSError: the file cannot seek.
    """
    size = os.lseek(fd, 0, os.SEEK_END)
    os.lseek(fd, 0, os.SEEK_SET)
    return size
