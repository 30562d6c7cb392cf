"""The Go standard-library HTTP and MIME behaviour that envd's ``/files`` routes inherit.

envd serves downloads with Go's ``http.ServeContent`` and parses uploads with ``mime`` and
``mime/multipart``, so what a client sees depends on those: content types from the file
extension (Go's small built-in table, then the system's shared MIME database or
``mime.types``) or sniffed from the first 512 bytes (the WHATWG signature table Go uses),
``Content-Disposition`` formatting, HTTP dates, ``Range`` parsing (several ranges, suffix
ranges, "failed to overlap"), the ``If-*`` preconditions (envd sets no ETag), media-type
parameters (RFC 2231 included) and envd's own ``Accept-Encoding``/``Content-Encoding``
negotiation (gzip is the only coding). This package re-implements those rules in Python from
their documented behaviour; it is pure (no I/O except reading the MIME tables once) and is
used only by :mod:`..files` and :mod:`..bodies`. Modules: :mod:`.media_types`,
:mod:`.content_types`, :mod:`.dates`, :mod:`.ranges` (ranges and preconditions),
:mod:`.codings`; this package re-exports their public names.
"""

from __future__ import annotations

from .codings import (
    ENCODING_GZIP,
    ENCODING_IDENTITY,
    EncodingError,
    accept_encoding,
    content_encoding,
    identity_acceptable,
)
from .content_types import SNIFF_LEN, detect_content_type, file_ext, type_by_extension
from .dates import http_date, parse_http_date
from .media_types import MediaTypeError, format_media_type, parse_media_type
from .ranges import (
    COND_FALSE,
    COND_NONE,
    COND_TRUE,
    RangeError,
    byte_range_parts,
    content_range,
    lseek_size,
    parse_range,
    preconditions,
)

__all__ = [
    "COND_FALSE",
    "COND_NONE",
    "COND_TRUE",
    "ENCODING_GZIP",
    "ENCODING_IDENTITY",
    "EncodingError",
    "MediaTypeError",
    "SNIFF_LEN",
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
