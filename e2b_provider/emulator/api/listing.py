"""List queries of the control plane: ``GET /v2/sandboxes`` and ``GET /snapshots``.

This module owns the query parameters of those lists as E2B validates them (``metadata``,
``state``, ``order``, ``startedAfter``, ``template``, ``limit`` 1-100, ``nextToken``), RFC 3339
date-times, and keyset paging: items are ordered by (time, id) at microsecond precision and a
page's ``x-next-token`` is base64url of ``"<RFC 3339 time>__<id>"`` (``"__asc"`` appended for
ascending order; a token is refused under the other order, as E2B refuses it). Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import re
import time
from typing import Callable, List, Mapping, Optional, Sequence, Tuple, TypeVar

import attrs

from .errors import BadRequest, query_enum, query_error, query_int
from .names import parse_name
from .state import parse_metadata_filter

__all__ = [
    "ListQuery",
    "PageRequest",
    "decode_cursor",
    "encode_cursor",
    "page",
    "parse_list_query",
    "parse_page_request",
    "parse_rfc3339_us",
    "rfc3339_us",
]

T = TypeVar("T")

_STATES = ("running", "paused")
_ORDERS = ("asc", "desc")
_RFC3339_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


def parse_rfc3339_us(text: str) -> Optional[int]:
    """An RFC 3339 date-time as microseconds since the epoch (truncated), or None if invalid."""
    m = _RFC3339_RE.match(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        return None
    try:
        seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if day > calendar.monthrange(year, month)[1]:
        return None
    micros = int((m.group(7) or "0")[:6].ljust(6, "0"))
    if m.group(9):
        offset = int(m.group(10)) * 3600 + int(m.group(11)) * 60
        seconds -= offset if m.group(9) == "+" else -offset
    return seconds * 1_000_000 + micros


def rfc3339_us(us: int) -> str:
    """Render microseconds since the epoch as an RFC 3339 UTC date-time (6 fraction digits)."""
    seconds, micros = divmod(us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


def encode_cursor(time_us: int, item_id: str, order: str) -> str:
    """The opaque ``nextToken`` that resumes a listing after this item, for ``order``."""
    raw = f"{rfc3339_us(time_us)}__{item_id}" + ("__asc" if order == "asc" else "")
    return base64.urlsafe_b64encode(raw.encode()).decode("ascii")


def decode_cursor(token: str, order: str) -> Tuple[int, str]:
    """Decode a ``nextToken`` made by :func:`encode_cursor` for ``order``.

    Raises:
        BadRequest: not a token of this server, or one made for the other order
            (``Invalid next token``).
    """
    try:
        padded = token + "=" * (-len(token) % 4)
        text = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
    except (ValueError, UnicodeError, binascii.Error):
        raise BadRequest("Invalid next token") from None
    parts = text.split("__")
    token_order = "desc"
    if len(parts) == 3 and parts[2] == "asc":
        token_order = "asc"
        parts = parts[:2]
    time_us = parse_rfc3339_us(parts[0]) if len(parts) == 2 else None
    if time_us is None or not parts[1] or token_order != order:
        raise BadRequest("Invalid next token")
    return time_us, parts[1]


@attrs.frozen
class PageRequest:
    """``limit`` (1-100), the decoded ``nextToken`` (time, id) and ``order`` of a list
    request."""

    limit: int
    cursor: Optional[Tuple[int, str]]
    order: str


def parse_page_request(query: Mapping[str, str], *, order: str = "desc") -> PageRequest:
    """Read and validate ``limit`` and ``nextToken`` (default limit 100).

    Raises:
        BadRequest: ``limit`` not an integer between 1 and 100, or a ``nextToken`` this
            server did not make for ``order`` (``Invalid next token``).
    """
    limit = query_int(query, "limit", 100, minimum=1, maximum=100)
    token = query.get("nextToken")
    cursor = decode_cursor(token, order) if token else None
    return PageRequest(limit=limit, cursor=cursor, order=order)


@attrs.frozen
class ListQuery:
    """The validated query of ``GET /v2/sandboxes``.

    Attributes:
        metadata: pairs every listed sandbox must carry.
        states: ``running`` and/or ``paused``.
        started_after_us: inclusive lower bound on the start time (microseconds), if any.
        template: the ``template`` filter as parsed (identifier without tag), if any.
        page: limit, token and order.
    """

    metadata: Mapping[str, str]
    states: Tuple[str, ...]
    started_after_us: Optional[int]
    template: Optional[str]
    page: PageRequest


def parse_list_query(query: Mapping[str, str]) -> ListQuery:
    """Validate the query of ``GET /v2/sandboxes`` as E2B does.

    Raises:
        BadRequest: an unknown state or order, a malformed ``startedAfter``, ``limit`` or
            ``metadata``, a template with a tag or a bad character, or a bad ``nextToken``.
    """
    raw_states = query.get("state")
    states: Tuple[str, ...] = _STATES
    if raw_states is not None:
        states = tuple(raw_states.split(","))
        for s in states:
            if s not in _STATES:
                raise query_error(
                    "state", 'value is not one of the allowed values ["running","paused"]'
                )
    order = query_enum(query, "order", _ORDERS) or "desc"
    started_after: Optional[int] = None
    raw_after = query.get("startedAfter")
    if raw_after is not None:
        started_after = parse_rfc3339_us(raw_after)
        if started_after is None:
            raise query_error("startedAfter", 'string doesn\'t match the format "date-time"')
    page_req = parse_page_request(query, order=order)
    template: Optional[str] = None
    raw_template = query.get("template")
    if raw_template is not None:
        if ":" in raw_template:
            raise BadRequest(
                "Invalid template: tags are not supported here because sandboxes are not "
                "tag-scoped"
            )
        template, _ = parse_name(raw_template, "Invalid template")
    try:
        metadata = parse_metadata_filter(query.get("metadata"))
    except BadRequest:
        raise BadRequest("Error parsing metadata") from None
    return ListQuery(
        metadata=metadata,
        states=states,
        started_after_us=started_after,
        template=template,
        page=page_req,
    )


def page(
    items: Sequence[T], key: Callable[[T], Tuple[int, str]], req: PageRequest
) -> Tuple[List[T], Optional[str]]:
    """Order ``items`` by ``key`` (time in microseconds, id) and return one page and the
    next cursor (None on the last page)."""
    reverse = req.order == "desc"
    ordered = sorted(items, key=key, reverse=reverse)
    cursor = req.cursor
    if cursor is not None:
        if reverse:
            ordered = [i for i in ordered if key(i) < cursor]
        else:
            ordered = [i for i in ordered if key(i) > cursor]
    chunk = ordered[: req.limit]
    token = None
    if len(ordered) > req.limit and chunk:
        last = key(chunk[-1])
        token = encode_cursor(last[0], last[1], req.order)
    return chunk, token
