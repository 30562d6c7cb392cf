"""Go's content types: by file extension (``mime.TypeByExtension``) and sniffed from the
first bytes (``http.DetectContentType``), as envd's downloads carry them.

This module owns Go's small built-in extension table, then the system's shared MIME database
(``globs2``) or ``mime.types`` files, read once; and the WHATWG signature table Go sniffs with.
No I/O besides reading those tables.
"""

from __future__ import annotations

import re
import struct
import threading
from typing import Dict, List, Optional, Tuple

from .media_types import MediaTypeError, format_media_type, parse_media_type

__all__ = ["SNIFF_LEN", "detect_content_type", "file_ext", "type_by_extension"]

#: How many leading bytes :func:`detect_content_type` looks at.
SNIFF_LEN = 512

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
