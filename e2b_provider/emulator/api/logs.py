"""Sandbox logs: what ``GET /sandboxes/{id}/logs`` and ``GET /v2/sandboxes/{id}/logs`` answer.

This module owns turning a sandbox's output lines (PID 1's and the envd agent's, each stamped
with the host's time in ms as it arrived: :class:`~e2b_provider.emulator.runtime.SandboxOutput`)
into E2B's log entries, the two routes' queries and the entries they select, and keeping the
logs of killed sandboxes for a while (the handlers are :mod:`.control`'s). Pure: no I/O.

The agent and PID 1 write one JSON object per line (``level``, ``time``, ``message``,
``logger``, ``event_type``, …); such a line becomes an entry with that level and message and
every other key as a string field. E2B's lines are always JSON objects (its CLI's ``e2b
sandbox logs`` parses each ``line`` as JSON), so any other line (stray output on the pipe, a
line cut at the length limit) is served as one: ``{"level": "info", "time", "logger":
"output", "message": <the raw text>}``.

v2 (``cursor`` ms, ``limit`` 0-1000 default 1000, ``direction`` ``backward`` (default, newest
first) or ``forward`` (oldest first), ``level`` (the least level kept), ``search`` (a
case-sensitive substring of the message, at most 256 characters)): as E2B, the entries of a
7-day window starting (forward) or ending (backward) at the cursor, both ends included; with
no cursor the last 7 days. To page, pass the last entry's time plus one ms (forward) or minus
one ms (backward). v1 (``start`` ms, ``limit`` ≥ 0 default 1000): oldest first from ``start``
(default: 7 days ago), the lines (``logs``) and the entries (``logEntries``).

Running and paused sandboxes have logs, across their boots; a killed sandbox's logs are kept
for the emulator's life, for its last :data:`KILLED_KEPT` killed sandboxes (E2B keeps them 7
days). Any other id is 404. Bad query values are 400 with E2B's validation message.
"""

from __future__ import annotations

import bisect
import collections
import datetime
import json
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import attrs

from .errors import query_enum, query_error, query_int

__all__ = [
    "KILLED_KEPT",
    "KilledLogs",
    "LogEntry",
    "LogQuery",
    "parse_line",
    "parse_v1_query",
    "parse_v2_query",
    "select",
]

#: Killed sandboxes whose logs are kept (the oldest forgotten first).
KILLED_KEPT = 64
#: The most entries one v2 request answers (E2B's maximum and default).
MAX_LIMIT = 1000
#: How far back logs go, and how wide a cursor's window is (E2B: 7 days), in ms.
WINDOW_SECONDS = 7 * 24 * 3600
_WINDOW_MS = WINDOW_SECONDS * 1000
#: The longest ``search`` E2B accepts.
MAX_SEARCH = 256
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
LEVELS = ("debug", "info", "warn", "error")
_RANK = {name: i for i, name in enumerate(LEVELS)}
#: Levels other loggers write, as E2B's four.
_ALIASES = {
    "warning": "warn",
    "fatal": "error",
    "panic": "error",
    "critical": "error",
    "trace": "debug",
}
_NOT_FIELDS = frozenset({"level", "message", "msg", "time"})
#: The ``logger`` of a line that was not a JSON object.
RAW_LOGGER = "output"

Lines = Sequence[Tuple[int, str]]


@attrs.frozen
class LogEntry:
    """One log entry: time (unix ms), level, message, string fields and the raw line."""

    timestamp_ms: int
    level: str
    message: str
    fields: Mapping[str, str]
    line: str

    def entry_json(self) -> Dict[str, Any]:
        """The ``SandboxLogEntry`` object."""
        return {
            "timestamp": _rfc3339_ms(self.timestamp_ms),
            "level": self.level,
            "message": self.message,
            "fields": dict(self.fields),
        }

    def line_json(self) -> Dict[str, Any]:
        """The ``SandboxLog`` object (v1's ``logs``)."""
        return {"timestamp": _rfc3339_ms(self.timestamp_ms), "line": self.line}


@attrs.frozen
class LogQuery:
    """Which entries to answer: ``start_ms <= time <= end_ms``, in ``forward`` order or
    newest first, at most ``limit``, at least ``min_level``, messages containing
    ``search``."""

    start_ms: int
    end_ms: int
    limit: int
    forward: bool = True
    min_level: Optional[str] = None
    search: Optional[str] = None


def _rfc3339_ms(ms: int) -> str:
    when = datetime.datetime.fromtimestamp(ms // 1000, tz=datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _field_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def parse_line(timestamp_ms: int, line: str) -> LogEntry:
    """The entry of one output line (a JSON object line, or plain text → an ``info`` JSON
    object line whose message is the text)."""
    obj: Any = None
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
    if not isinstance(obj, dict):
        obj = {
            "level": "info",
            "time": _rfc3339_ms(timestamp_ms),
            "logger": RAW_LOGGER,
            "message": line,
        }
        line = json.dumps(obj, ensure_ascii=False)
    raw_level = str(obj.get("level", "info")).lower()
    level = _ALIASES.get(raw_level, raw_level)
    message = obj.get("message", obj.get("msg", ""))
    return LogEntry(
        timestamp_ms,
        level if level in _RANK else "info",
        message if isinstance(message, str) else _field_text(message),
        {str(k): _field_text(v) for k, v in obj.items() if k not in _NOT_FIELDS},
        line,
    )


def select(lines: Lines, query: LogQuery) -> List[LogEntry]:
    """The entries of ``lines`` (ordered by time) that ``query`` asks for, in its order."""
    if query.limit <= 0 or query.start_ms > query.end_ms:
        return []
    stamps = [ms for ms, _ in lines]
    lo = bisect.bisect_left(stamps, query.start_ms)
    hi = bisect.bisect_right(stamps, query.end_ms)
    indexes: Iterator[int] = iter(range(lo, hi)) if query.forward else reversed(range(lo, hi))
    least = _RANK[query.min_level] if query.min_level is not None else 0
    out: List[LogEntry] = []
    for i in indexes:
        entry = parse_line(*lines[i])
        if _RANK[entry.level] < least:
            continue
        if query.search and query.search not in entry.message:
            continue
        out.append(entry)
        if len(out) >= query.limit:
            break
    return out


# -- queries ------------------------------------------------------------------------------


def parse_v1_query(query: Mapping[str, str], now_ms: int) -> LogQuery:
    """``start`` and ``limit`` of ``GET /sandboxes/{id}/logs``.

    Raises:
        BadRequest: 400 for a value that is not a non-negative integer (``limit``: int32).
    """
    start = query_int(query, "start", None, maximum=_INT64_MAX)
    limit = query_int(query, "limit", MAX_LIMIT, maximum=_INT32_MAX)
    oldest = now_ms - _WINDOW_MS
    return LogQuery(start_ms=max(oldest, start or 0), end_ms=now_ms, limit=limit)


def parse_v2_query(query: Mapping[str, str], now_ms: int) -> LogQuery:
    """``cursor``, ``limit``, ``direction``, ``level`` and ``search`` of
    ``GET /v2/sandboxes/{id}/logs``.

    Raises:
        BadRequest: 400 for a negative or non-integer ``cursor``/``limit``, a ``limit`` above
            1000, an unknown ``direction`` or ``level``, or a ``search`` longer than 256.
    """
    cursor = query_int(query, "cursor", None, maximum=_INT64_MAX)
    limit = query_int(query, "limit", MAX_LIMIT, maximum=MAX_LIMIT)
    direction = query_enum(query, "direction", ("forward", "backward")) or "backward"
    level = query_enum(query, "level", LEVELS)
    search = query.get("search")
    if search is not None and len(search) > MAX_SEARCH:
        raise query_error("search", f"maximum string length is {MAX_SEARCH}")
    forward = direction == "forward"
    oldest = now_ms - _WINDOW_MS
    if cursor is None:
        start, end = oldest, now_ms
    elif forward:
        start, end = cursor, cursor + _WINDOW_MS
    else:
        start, end = cursor - _WINDOW_MS, cursor
    start, end = max(start, oldest), max(end, oldest)
    return LogQuery(
        start_ms=min(start, end),
        end_ms=end,
        limit=limit,
        forward=forward,
        min_level=level,
        search=search or None,
    )


# -- killed sandboxes ------------------------------------------------------------------------


class KilledLogs:
    """The output of the last :data:`KILLED_KEPT` killed sandboxes, by sandbox id."""

    def __init__(self, size: int = KILLED_KEPT) -> None:
        self._size = size
        self._kept: collections.OrderedDict[str, Any] = collections.OrderedDict()

    def keep(self, sandbox_id: str, runtime: Any) -> None:
        """Keep a killed sandbox's output (its runtime's ``output``; none: nothing kept)."""
        output = getattr(runtime, "output", None)
        if output is None:
            return
        self._kept[sandbox_id] = output
        self._kept.move_to_end(sandbox_id)
        while len(self._kept) > self._size:
            _, dropped = self._kept.popitem(last=False)
            dropped.clear()

    def lines(self, sandbox_id: str) -> Optional[Lines]:
        """The kept lines of a killed sandbox, or None when none are kept."""
        output = self._kept.get(sandbox_id)
        return None if output is None else list(output.lines())
