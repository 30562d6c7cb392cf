"""PID 1's log lines: one JSON object per line, with the keys of the agent's (envd's) lines.
"""

from __future__ import annotations

import datetime
import json
import sys

__all__ = ["LOGGER", "log", "log_line"]

#: The ``logger`` of PID 1's log lines (the agent's are envd's: ``process``, ``filesystem``…).
LOGGER = "init"


def log_line(message: str, level: str = "info") -> str:
    """One of PID 1's log lines: a JSON object with the agent's keys (``level``, ``time``,
    ``logger``, ``message``) on one line, so every line of the sandbox's logs is JSON (E2B's
    ``e2b sandbox logs`` parses each as JSON)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
    record = {"level": level, "time": stamp, "logger": LOGGER, "message": message}
    return json.dumps(record, ensure_ascii=False) + "\n"


def log(msg: str, level: str = "info") -> None:
    """Write one of PID 1's log lines to its stderr (the sandbox's logs)."""
    sys.stderr.write(log_line(msg, level))
    sys.stderr.flush()
