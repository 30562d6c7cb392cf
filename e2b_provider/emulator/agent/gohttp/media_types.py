"""Go's media types (``mime.ParseMediaType``, ``mime.FormatMediaType``), as envd inherits them.

This module owns parsing a ``Content-Type``-like value into its lower-cased type and
parameters (RFC 2231 ``name*`` and ``name*0`` values included, Go's error messages) and
formatting one back (``Content-Disposition`` of downloads). Pure.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple
from urllib.parse import unquote_to_bytes

__all__ = ["MediaTypeError", "format_media_type", "parse_media_type"]

_TSPECIALS = frozenset('()<>@,;:\\"/[]?=')


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
