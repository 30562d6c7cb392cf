"""What ``records.sh`` prints, read as the file agent's answers.

Without ``python3`` in a sandbox, background commands' records are read by
``records.sh`` (:mod:`e2b_provider.sandbox_side`) instead of the file agent. This module
owns the parsing of what it prints: :func:`parse_read` (one record and its output, as the
agent's ``cmd_read`` answer) and :func:`parse_list` (the meta of each command that runs, as
``cmd_list`` gives it), so one reader serves both; and :func:`say_bad` (the records a
listing left out).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, Optional, Tuple

from ..core.context import script_failed
from ..core.run_engine import RunOutcome
from ..errors import ProtocolError

__all__ = ["load_json", "parse_list", "parse_read", "say_bad"]

log = logging.getLogger("e2b_provider")


def say_bad(sid: str, bad: object) -> None:
    """Log the records a listing left out because a file in them is not a regular file."""
    if isinstance(bad, list) and bad:
        log.warning("e2b_provider: sandbox %s: background command records left out of the "
                    "list (a file in them is not a regular file, so they were not read): %s",
                    sid, ", ".join(str(b)[:32] for b in bad[:20]))


def load_json(raw: bytes) -> Optional[Dict[str, Any]]:
    """A JSON object, or None (not JSON, or not an object), as the file agent loads one."""
    try:
        value = json.loads(raw.decode("utf-8", "surrogateescape"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def parse_read(r: RunOutcome, what: str) -> Tuple[Dict[str, Any], bytes]:
    """What ``records.sh read`` printed (exit 0), as the file agent's ``cmd_read`` answer
    and data: ``{"meta", "status", "alive", "out": [first, total, length], "err": [...]}``.

    Raises:
        CommandFailed: the script failed.
        ProtocolError: its output is not what it prints.
    """
    if r.exit_code != 0 or r.truncated:
        raise script_failed(f"cannot read the record of command {what}", r)
    line, sep, rest = r.stdout.partition(b"\n")
    try:
        alive, meta_len, status_len, *streams = (int(w) for w in line.split())
    except ValueError:
        alive = meta_len = status_len = -1
        streams = []
    if (not sep or len(streams) != 6 or min(meta_len, status_len, *streams) < 0
            or len(rest) != meta_len + status_len + streams[2] + streams[5]):
        raise ProtocolError(f"the record of command {what} was read as something else")
    meta = load_json(rest[:meta_len])
    if meta is None:
        return {"absent": True}, b""  # as the agent takes a meta.json that is not JSON
    status = load_json(rest[meta_len:meta_len + status_len]) if status_len else None
    answer = {"meta": meta, "status": status, "alive": alive == 1 and status is None,
              "out": streams[:3], "err": streams[3:]}
    return answer, rest[meta_len + status_len:]


def parse_list(out: bytes) -> List[Dict[str, Any]]:
    """What ``records.sh list`` printed (``LENGTH\\n`` and a meta.json, each command that
    runs), as the file agent's ``cmd_list`` gives it: the metas that are JSON objects.

    Raises:
        ProtocolError: the output is not what it prints.
    """
    metas = []
    pos = 0
    while pos < len(out):
        nl = out.find(b"\n", pos)
        head = out[pos:nl] if nl >= 0 else b""
        if not head.isdigit() or len(out) < nl + 1 + int(head):
            raise ProtocolError("the list of background commands was read as something else")
        end = nl + 1 + int(head)
        meta = load_json(out[nl + 1:end])
        if meta is not None:
            metas.append(meta)
        pos = end
    return metas
