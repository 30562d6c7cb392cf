"""The emulator's bounded request log (``GET /_emulator/requests``).

This module owns what is kept of each request the host server sees: its method, path, query
(signatures and access tokens left out), selected headers (never credentials), kind
(``control``, ``admin``, ``envd``, ``volume``…), sandbox id and status; the oldest entries go
first once :data:`REQUEST_LOG_SIZE` are kept.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Deque, Dict, Optional

from aiohttp import web

__all__ = ["REQUEST_LOG_SIZE", "RequestLog"]

#: How many recent requests ``GET /_emulator/requests`` keeps.
REQUEST_LOG_SIZE = 2000
_LOGGED_HEADERS = (
    "Content-Type",
    "Content-Length",
    "Transfer-Encoding",
    "Connect-Protocol-Version",
    "Connect-Timeout-Ms",
    "Keepalive-Ping-Interval",
    "E2b-Sandbox-Id",
    "E2b-Sandbox-Port",
    "Idempotency-Key",
    "User-Agent",
)
_SECRET_QUERY_KEYS = frozenset({"signature", "signature_expiration", "access_token"})


class RequestLog:
    """The most recent requests, oldest first (bounded)."""

    def __init__(self, size: int = REQUEST_LOG_SIZE) -> None:
        self.entries: Deque[Dict[str, Any]] = collections.deque(maxlen=size)
        self._seq = 0

    def add(
        self, request: web.BaseRequest, *, kind: str, sandbox_id: Optional[str] = None
    ) -> Dict[str, Any]:
        """Append a request to the log (selected headers only, never secrets); returns its
        (mutable) entry."""
        self._seq += 1
        query = {k: v for k, v in request.query.items() if k.lower() not in _SECRET_QUERY_KEYS}
        entry: Dict[str, Any] = {
            "seq": self._seq,
            "time": time.time(),
            "kind": kind,
            "method": request.method,
            "path": request.path,
            "query": query,
            "sandbox_id": sandbox_id,
            "headers": {h: request.headers[h] for h in _LOGGED_HEADERS if h in request.headers},
            "status": None,
        }
        self.entries.append(entry)
        return entry

    def clear(self) -> None:
        """Forget every entry (the numbering goes on)."""
        self.entries.clear()
