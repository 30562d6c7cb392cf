"""The Go standard-library HTTP and MIME behaviour that envd's ``/files`` routes inherit.

envd serves downloads with Go's ``http.ServeContent`` and parses uploads with ``mime`` and
``mime/multipart``, so what a client sees depends on those: content types from the file
extension (Go's small built-in table, then the system's shared MIME database or
``mime.types``) or sniffed from the first 512 bytes (the WHATWG signature table Go uses),
``Content-Disposition`` formatting, HTTP dates, ``Range`` parsing (several ranges, suffix
ranges, "failed to overlap"), the ``If-*`` preconditions (envd sets no ETag), media-type
parameters (RFC 2231 included) and envd's own ``Accept-Encoding``/``Content-Encoding``
negotiation (gzip is the only coding). This module re-implements those rules in Python from
their documented behaviour; it is pure (no I/O except reading the MIME tables once) and is
used only by :mod:`.files`.
"""

from __future__ import annotations

import calendar
import datetime
import email.utils
import os
import re
import struct
import threading
from typing import Dict, List, Mapping, Optional, Tuple
from urllib.parse import unquote_to_bytes

__all__ = [
    "COND_FALSE",
    "COND_NONE",
    "COND_TRUE",
    "ENCODING_GZIP",
    "ENCODING_IDENTITY",
    "EncodingError",
    "MediaTypeError",
    "RangeError",
    "accept_encoding",
    "byte_range_parts",
    "content_encoding",
    "content_range",
    "detect_content_type",
    "file_ext",
    "format_media_type",
    "http_date",
    "identity_acceptable",
    "lseek_size",
    "parse_http_date",
    "parse_media_type",
    "parse_range",
    "preconditions",
    "type_by_extension",
]

ENCODING_GZIP = "gzip"
ENCODING_IDENTITY = "identity"
_SUPPORTED = (ENCODING_GZIP,)

COND_NONE = 0
COND_TRUE = 1
COND_FALSE = 2

_TSPECIALS = frozenset('()<>@,;:\\"/[]?=')
SNIFF_LEN = 512


# ---- media types -----------------------------------------------------------------------


class MediaTypeError(ValueError):
    """A media type or its parameters do not parse (the message is Go's)."""


def _is_token_char(c: str) -> bool:
    return 0x20 < ord(c) < 0x7F and c not in _TSPECIALS


def _is_token(s: str) -> bool:
    return bool(s) and all(_is_token_char(c) for c in s)


def _consume_token(v: str) -> Tuple[str, str]:
    i = 0
    while i < len(v) and _is_token_char(v[i]):
        i += 1
    return v[:i], v[i:]


def _consume_value(v: str) -> Tuple[str, str]:
    if not v:
        return "", ""
    if v[0] != '"':
        return _consume_token(v)
    out: List[str] = []
    i = 1
    while i < len(v):
        c = v[i]
        if c == '"':
            return "".join(out), v[i + 1 :]
        # A backslash escapes only a tspecial; before anything else it is literal (how
        # browsers send Windows paths).
        if c == "\\" and i + 1 < len(v) and v[i + 1] in _TSPECIALS:
            out.append(v[i + 1])
            i += 2
            continue
        if c in "\r\n":
            return "", v
        out.append(c)
        i += 1
    return "", v


def _consume_param(v: str) -> Tuple[str, str, str]:
    rest = v.lstrip()
    if not rest.startswith(";"):
        return "", "", v
    rest = rest[1:].lstrip()
    param, rest = _consume_token(rest)
    param = param.lower()
    if not param:
        return "", "", v
    rest = rest.lstrip()
    if not rest.startswith("="):
        return "", "", v
    rest = rest[1:].lstrip()
    value, rest2 = _consume_value(rest)
    if not value and rest2 == rest:
        return "", "", v
    return param, value, rest2


def _check_media_type(s: str) -> None:
    typ, rest = _consume_token(s)
    if not typ:
        raise MediaTypeError("mime: no media type")
    if not rest:
        return
    if not rest.startswith("/"):
        raise MediaTypeError("mime: expected slash after first token")
    sub, rest = _consume_token(rest[1:])
    if not sub:
        raise MediaTypeError("mime: expected token after slash")
    if rest:
        raise MediaTypeError("mime: unexpected content after media subtype")


def _decode_2231(v: str) -> Optional[str]:
    parts = v.split("'", 2)
    if len(parts) != 3:
        return None
    charset = parts[0].lower()
    if charset not in ("us-ascii", "utf-8"):
        return None
    if re.search(r"%(?![0-9A-Fa-f]{2})", parts[2]):
        return None
    return unquote_to_bytes(parts[2]).decode("utf-8", "replace")


def parse_media_type(v: str) -> Tuple[str, Dict[str, str]]:
    """Go's ``mime.ParseMediaType``: the lower-cased type and its parameters.

    Parameter names are lower-cased; RFC 2231 ``name*`` / ``name*0`` values are decoded and
    win over plain ``name``.

    Raises:
        MediaTypeError: with Go's message.
    """
    base = v.split(";", 1)[0]
    mediatype = base.lower().strip()
    _check_media_type(mediatype)
    params: Dict[str, str] = {}
    continuation: Dict[str, Dict[str, str]] = {}
    rest = v[len(base) :]
    while rest:
        rest = rest.lstrip()
        if not rest:
            break
        key, value, remainder = _consume_param(rest)
        if not key:
            if remainder.strip() == ";":
                break
            raise MediaTypeError("mime: invalid media parameter")
        target = params
        if "*" in key:
            target = continuation.setdefault(key.split("*", 1)[0], {})
        if key in target and target[key] != value:
            raise MediaTypeError("mime: duplicate parameter name")
        target[key] = value
        rest = remainder
    for key, pieces in continuation.items():
        single = pieces.get(key + "*")
        if single is not None:
            decoded = _decode_2231(single)
            if decoded is not None:
                params[key] = decoded
            continue
        buf: List[str] = []
        valid = False
        n = 0
        while True:
            simple = f"{key}*{n}"
            if simple in pieces:
                valid = True
                buf.append(pieces[simple])
            elif simple + "*" in pieces:
                valid = True
                enc = pieces[simple + "*"]
                if n == 0:
                    decoded = _decode_2231(enc)
                    if decoded is not None:
                        buf.append(decoded)
                else:
                    buf.append(unquote_to_bytes(enc).decode("utf-8", "replace"))
            else:
                break
            n += 1
        if valid:
            params[key] = "".join(buf)
    return mediatype, params


def format_media_type(t: str, params: Dict[str, str]) -> str:
    """Go's ``mime.FormatMediaType`` (``""`` when ``t`` or a name is not a token)."""
    major, slash, sub = t.partition("/")
    if slash:
        if not _is_token(major) or not _is_token(sub):
            return ""
        out = [major.lower() + "/" + sub.lower()]
    else:
        if not _is_token(t):
            return ""
        out = [t.lower()]
    for name in sorted(params):
        value = params[name]
        if not _is_token(name):
            return ""
        out.append("; " + name.lower())
        if any((c < " " or c > "~") and c != "\t" for c in value):
            encoded = []
            for byte in value.encode("utf-8", "surrogateescape"):
                ch = chr(byte)
                if byte <= 0x20 or byte >= 0x7F or ch in "*'%" or ch in _TSPECIALS:
                    encoded.append(f"%{byte:02X}")
                else:
                    encoded.append(ch)
            out.append("*=utf-8''" + "".join(encoded))
        elif _is_token(value):
            out.append("=" + value)
        else:
            out.append('="' + re.sub(r'(["\\])', r"\\\1", value) + '"')
    return "".join(out)


# ---- content types -----------------------------------------------------------------------

_BUILTIN_TYPES = {
    ".avif": "image/avif",
    ".css": "text/css; charset=utf-8",
    ".gif": "image/gif",
    ".htm": "text/html; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".ico": "image/x-icon",
    ".jpeg": "image/jpeg",
    ".jpg": "image/jpeg",
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".mjs": "text/javascript; charset=utf-8",
    ".pdf": "application/pdf",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".wasm": "application/wasm",
    ".webp": "image/webp",
    ".xml": "text/xml; charset=utf-8",
}
_GLOBS_FILES = ("/usr/local/share/mime/globs2", "/usr/share/mime/globs2")
_TYPES_FILES = (
    "/etc/mime.types",
    "/etc/apache2/mime.types",
    "/etc/apache/mime.types",
    "/etc/httpd/conf/mime.types",
)


class _MimeTable:
    """Go's extension table: built-ins, then the system's globs2 or mime.types files."""

    def __init__(self) -> None:
        self.exact: Dict[str, str] = dict(_BUILTIN_TYPES)
        self.lower: Dict[str, str] = dict(_BUILTIN_TYPES)
        for name in _GLOBS_FILES:
            if self._load_globs(name):
                return
        for name in _TYPES_FILES:
            self._load_types(name)

    def _set(self, ext: str, mime: str) -> None:
        try:
            _, params = parse_media_type(mime)
        except MediaTypeError:
            return
        if mime.startswith("text/") and not params.get("charset"):
            params["charset"] = "utf-8"
            mime = format_media_type(mime, params)
        self.exact[ext] = mime
        self.lower[ext.lower()] = mime

    def _load_globs(self, name: str) -> bool:
        try:
            with open(name, encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return False
        for line in lines:
            fields = line.split(":")
            if len(fields) < 3 or not fields[0] or len(fields[2]) < 3:
                continue
            if fields[0][0] == "#" or not fields[2].startswith("*."):
                continue
            ext = fields[2][1:]
            if "?" in ext or "*" in ext:
                continue
            if "[" in ext:
                for expanded in _expand_glob(ext):
                    self._set(expanded, fields[1])
                continue
            if ext in self.exact:
                continue  # the file is in weight order: the first entry wins
            self._set(ext, fields[1])
        return True

    def _load_types(self, name: str) -> None:
        try:
            with open(name, encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return
        for line in lines:
            fields = line.split()
            if len(fields) <= 1 or fields[0].startswith("#"):
                continue
            for ext in fields[1:]:
                if ext.startswith("#"):
                    break
                self._set("." + ext, fields[0])


def _expand_glob(glob: str) -> List[str]:
    """``.[ch]pp`` → ``[".cpp", ".hpp"]`` (one bracket class with ranges, no negation)."""
    m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", glob)
    if m is None or not glob.isascii() or m.group(2).startswith("!"):
        return []
    chars: List[str] = []
    spec = m.group(2)
    i = 0
    while i < len(spec):
        if spec[i] == "-" and 0 < i < len(spec) - 1:
            lo, hi = ord(spec[i - 1]), ord(spec[i + 1])
            if hi < lo:
                return []
            chars.extend(chr(c) for c in range(lo + 1, hi + 1) if chr(c) != "/")
            i += 2
            continue
        chars.append(spec[i])
        i += 1
    return [m.group(1) + c + m.group(3) for c in chars]


_TABLE: Optional[_MimeTable] = None
_TABLE_LOCK = threading.Lock()


def type_by_extension(ext: str) -> str:
    """Go's ``mime.TypeByExtension`` (``""`` when unknown); text types carry ``charset``."""
    global _TABLE
    if _TABLE is None:
        with _TABLE_LOCK:
            if _TABLE is None:
                _TABLE = _MimeTable()
    table = _TABLE
    found = table.exact.get(ext)
    if found is not None:
        return found
    return table.lower.get(ext.lower(), "")


def file_ext(path: str) -> str:
    """Go's ``filepath.Ext``: from the last dot of the last element, else ``""``."""
    i = len(path) - 1
    while i >= 0 and path[i] != "/":
        if path[i] == ".":
            return path[i:]
        i -= 1
    return ""


_HTML_SIGS = tuple(
    s.encode()
    for s in (
        "<!DOCTYPE HTML",
        "<HTML",
        "<HEAD",
        "<SCRIPT",
        "<IFRAME",
        "<H1",
        "<DIV",
        "<FONT",
        "<TABLE",
        "<A",
        "<STYLE",
        "<TITLE",
        "<B",
        "<BODY",
        "<BR",
        "<P",
        "<!--",
    )
)
_FF = b"\xff"
_EXACT_OR_MASKED: Tuple[Tuple[bytes, Optional[bytes], str], ...] = (
    (b"%PDF-", None, "application/pdf"),
    (b"%!PS-Adobe-", None, "application/postscript"),
    (b"\xfe\xff\x00\x00", b"\xff\xff\x00\x00", "text/plain; charset=utf-16be"),
    (b"\xff\xfe\x00\x00", b"\xff\xff\x00\x00", "text/plain; charset=utf-16le"),
    (b"\xef\xbb\xbf\x00", b"\xff\xff\xff\x00", "text/plain; charset=utf-8"),
    (b"\x00\x00\x01\x00", None, "image/x-icon"),
    (b"\x00\x00\x02\x00", None, "image/x-icon"),
    (b"BM", None, "image/bmp"),
    (b"GIF87a", None, "image/gif"),
    (b"GIF89a", None, "image/gif"),
    (b"RIFF\x00\x00\x00\x00WEBPVP", _FF * 4 + b"\x00" * 4 + _FF * 6, "image/webp"),
    (b"\x89PNG\r\n\x1a\n", None, "image/png"),
    (b"\xff\xd8\xff", None, "image/jpeg"),
    (b"FORM\x00\x00\x00\x00AIFF", _FF * 4 + b"\x00" * 4 + _FF * 4, "audio/aiff"),
    (b"ID3", None, "audio/mpeg"),
    (b"OggS\x00", None, "application/ogg"),
    (b"MThd\x00\x00\x00\x06", None, "audio/midi"),
    (b"RIFF\x00\x00\x00\x00AVI ", _FF * 4 + b"\x00" * 4 + _FF * 4, "video/avi"),
    (b"RIFF\x00\x00\x00\x00WAVE", _FF * 4 + b"\x00" * 4 + _FF * 4, "audio/wave"),
)
_AFTER_MP4: Tuple[Tuple[bytes, Optional[bytes], str], ...] = (
    (b"\x1a\x45\xdf\xa3", None, "video/webm"),
    (b"\x00" * 34 + b"LP", b"\x00" * 34 + _FF * 2, "application/vnd.ms-fontobject"),
    (b"\x00\x01\x00\x00", None, "font/ttf"),
    (b"OTTO", None, "font/otf"),
    (b"ttcf", None, "font/collection"),
    (b"wOFF", None, "font/woff"),
    (b"wOF2", None, "font/woff2"),
    (b"\x1f\x8b\x08", None, "application/x-gzip"),
    (b"PK\x03\x04", None, "application/zip"),
    (b"Rar!\x1a\x07\x00", None, "application/x-rar-compressed"),
    (b"Rar!\x1a\x07\x01\x00", None, "application/x-rar-compressed"),
    (b"\x00asm", None, "application/wasm"),
)
_WS = b"\t\n\x0c\r "
_BINARY = frozenset([*range(0x00, 0x09), 0x0B, *range(0x0E, 0x1B), *range(0x1C, 0x20)])


def _sig_match(data: bytes, pat: bytes, mask: Optional[bytes]) -> bool:
    if mask is None:
        return data.startswith(pat)
    if len(data) < len(pat):
        return False
    return all(data[i] & mask[i] == pat[i] for i in range(len(pat)))


def _mp4(data: bytes) -> bool:
    if len(data) < 12:
        return False
    box = struct.unpack(">I", data[:4])[0]
    if len(data) < box or box % 4 != 0 or data[4:8] != b"ftyp":
        return False
    for st in range(8, box, 4):
        if st != 12 and data[st : st + 3] == b"mp4":
            return True
    return False


def detect_content_type(data: bytes) -> str:
    """Go's ``http.DetectContentType`` of (at most) the first 512 bytes."""
    data = data[:SNIFF_LEN]
    start = 0
    while start < len(data) and data[start] in _WS:
        start += 1
    body = data[start:]
    for sig in _HTML_SIGS:
        if len(body) >= len(sig) + 1 and body[len(sig)] in b" >":
            head = bytes(b & 0xDF if 0x41 <= s <= 0x5A else b for b, s in zip(body, sig))
            if head == sig:
                return "text/html; charset=utf-8"
    if body[:5] == b"<?xml":
        return "text/xml; charset=utf-8"
    for pat, mask, ctype in _EXACT_OR_MASKED:
        if _sig_match(data, pat, mask):
            return ctype
    if _mp4(data):
        return "video/mp4"
    for pat, mask, ctype in _AFTER_MP4:
        if _sig_match(data, pat, mask):
            return ctype
    if not any(b in _BINARY for b in body):
        return "text/plain; charset=utf-8"
    return "application/octet-stream"


# ---- dates -------------------------------------------------------------------------------

_DAYS = "(?:mon|tue|wed|thu|fri|sat|sun)"
_LONG_DAYS = "(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MON = "(" + "|".join(_MONTHS) + ")"
_IMF = re.compile(rf"(?i:{_DAYS}), (\d\d) (?i:{_MON}) (\d{{4}}) (\d\d):(\d\d):(\d\d) GMT")
_RFC850 = re.compile(
    rf"(?i:{_LONG_DAYS}), (\d\d)-(?i:{_MON})-(\d\d) (\d\d):(\d\d):(\d\d) [A-Z]{{3,5}}"
)
_ANSIC = re.compile(rf"(?i:{_DAYS}) (?i:{_MON}) (?: ?(\d{{1,2}})) (\d\d):(\d\d):(\d\d) (\d{{4}})")


def http_date(seconds: float) -> str:
    """Go's ``http.TimeFormat`` of a Unix time (``Mon, 02 Jan 2006 15:04:05 GMT``)."""
    return email.utils.formatdate(int(seconds), usegmt=True)


def parse_http_date(text: str) -> Optional[int]:
    """Go's ``http.ParseTime`` (IMF-fixdate, RFC 850, ANSI C) as Unix seconds, else None."""
    m = _IMF.fullmatch(text)
    if m:
        day, mon, year, hh, mm, ss = m.groups()
    else:
        m = _RFC850.fullmatch(text)
        if m:
            day, mon, yy, hh, mm, ss = m.groups()
            year = str(int(yy) + (1900 if int(yy) >= 69 else 2000))
        else:
            m = _ANSIC.fullmatch(text)
            if m is None:
                return None
            mon, day, hh, mm, ss, year = m.groups()
    try:
        when = datetime.datetime(
            int(year), _MONTHS.index(mon.lower()) + 1, int(day), int(hh), int(mm), int(ss)
        )
    except ValueError:
        return None
    return calendar.timegm(when.timetuple())


# ---- ranges and preconditions --------------------------------------------------------------


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


# ---- content codings (envd's encoding.go) ---------------------------------------------------


class EncodingError(ValueError):
    """An unsupported ``Content-Encoding`` or no acceptable ``Accept-Encoding``."""


_FLOAT = re.compile(
    r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf|infinity|nan)", re.IGNORECASE
)


def _with_quality(value: str) -> Tuple[str, float]:
    value = value.strip()
    quality = 1.0
    if ";" in value:
        value, params = value.split(";", 1)
        value = value.strip()
        for param in params.split(";"):
            param = param.strip()
            if param.lower().startswith("q=") and _FLOAT.fullmatch(param[2:]):
                quality = float(param[2:])
    return value.lower(), quality


def content_encoding(header: Optional[str]) -> str:
    """The coding of a request body (``identity`` or ``gzip``).

    Raises:
        EncodingError: ``unsupported Content-Encoding: <header>, supported: [gzip]``.
    """
    if not header:
        return ENCODING_IDENTITY
    coding, _ = _with_quality(header)
    if coding == ENCODING_IDENTITY:
        return ENCODING_IDENTITY
    if coding not in _SUPPORTED:
        raise EncodingError(
            f"unsupported Content-Encoding: {header}, supported: [{' '.join(_SUPPORTED)}]"
        )
    return coding


def _accept_list(header: str) -> Tuple[List[Tuple[str, float]], bool]:
    codings = [_with_quality(v) for v in header.split(",")]
    identity_rejected = identity_accepted = wildcard_rejected = False
    for coding, q in codings:
        if coding == ENCODING_IDENTITY:
            if q == 0:
                identity_rejected = True
            else:
                identity_accepted = True
        elif coding == "*" and q == 0:
            wildcard_rejected = True
    if wildcard_rejected and not identity_accepted:
        identity_rejected = True
    return codings, identity_rejected


def identity_acceptable(header: Optional[str]) -> bool:
    """Whether ``Accept-Encoding`` allows an unencoded answer."""
    if not header:
        return True
    return not _accept_list(header)[1]


def accept_encoding(header: Optional[str]) -> str:
    """The coding envd picks for a download (``gzip`` or ``identity``).

    Raises:
        EncodingError: identity is refused and gzip is not accepted (406).
    """
    if not header:
        return ENCODING_IDENTITY
    codings, identity_rejected = _accept_list(header)
    # highest quality first (stable); a NaN quality sorts last, as in Go
    for coding, q in sorted(codings, key=lambda c: (c[1] != c[1], -c[1] if c[1] == c[1] else 0)):
        if q == 0:
            continue
        if coding == ENCODING_IDENTITY:
            return ENCODING_IDENTITY
        if coding == "*":
            return _SUPPORTED[0] if identity_rejected else ENCODING_IDENTITY
        if coding in _SUPPORTED:
            return coding
    if not identity_rejected:
        return ENCODING_IDENTITY
    raise EncodingError(f"no acceptable encoding found, supported: [{' '.join(_SUPPORTED)}]")


def lseek_size(fd: int) -> int:
    """The size ``http.ServeContent`` computes (seek to the end and back).

    Raises:
        OSError: the file cannot seek.
    """
    size = os.lseek(fd, 0, os.SEEK_END)
    os.lseek(fd, 0, os.SEEK_SET)
    return size
