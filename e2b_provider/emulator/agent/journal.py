"""The envd agent's log lines: one JSON object per line, as envd writes its own.

This module owns the agent's log format and its events. Every record becomes
``{"level", "time", "logger", "message", …fields}`` on the agent's stderr (``level`` one of
``debug``/``info``/``warn``/``error``; ``time`` RFC 3339 UTC; ``logger`` ``process``,
``filesystem`` or ``envd``, the names envd's loggers carry). :func:`event` logs one of the
events envd logs (``event_type`` ``process_start``, ``process_end``, ``file_processing``,
``file_read``, ``watcher_created``) with its fields. The host keeps these lines as the
sandbox's logs (``GET /v2/sandboxes/{id}/logs``), so no field may carry a secret: requests'
headers, access tokens and environment values are never logged.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any, Dict

__all__ = ["JsonFormatter", "event"]

#: The agent's module → the envd logger that logs the same things.
_LOGGERS = {
    "process": "process",
    "files": "filesystem",
    "filesystem": "filesystem",
    "watch": "filesystem",
}
_RESERVED = frozenset({"level", "time", "logger", "message"})


def _level(levelno: int) -> str:
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    return "info" if levelno >= logging.INFO else "debug"


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line (fields from ``extra={"fields": {...}}``)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON object on one line."""
        when = datetime.datetime.fromtimestamp(record.created, tz=datetime.timezone.utc)
        out: Dict[str, Any] = {
            "level": _level(record.levelno),
            "time": when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z",
            "logger": _LOGGERS.get(record.name.rsplit(".", 1)[-1], "envd"),
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update((k, v) for k, v in fields.items() if k not in _RESERVED)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def event(logger: logging.Logger, event_type: str, message: str, **fields: Any) -> None:
    """Log an envd event at INFO: ``message`` with ``event_type`` and ``fields`` (None left
    out)."""
    kept = {k: v for k, v in fields.items() if v is not None}
    logger.info(message, extra={"fields": {"event_type": event_type, **kept}})
