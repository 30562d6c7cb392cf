"""envd's content codings (its ``encoding.go``): ``Content-Encoding`` of uploads and the
``Accept-Encoding`` negotiation of downloads; gzip is the only coding. Pure.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

__all__ = [
    "ENCODING_GZIP",
    "ENCODING_IDENTITY",
    "EncodingError",
    "accept_encoding",
    "content_encoding",
    "identity_acceptable",
]

ENCODING_GZIP = "gzip"
ENCODING_IDENTITY = "identity"
_SUPPORTED = (ENCODING_GZIP,)


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
