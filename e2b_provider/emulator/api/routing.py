"""HTTP helpers shared by the control plane's handlers (and the envd front's error answers).

This module owns E2B's error answer (``{code, message[, error_code]}``), reading a JSON request
body the way E2B's validator does, finding the sandbox a path names, and marking a request log
entry as answered by a fault.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Dict, Optional

from aiohttp import web

from .errors import BadRequest
from .lifecycle import SandboxLifecycle
from .state import SandboxRecord, parse_sandbox_path_id, sandbox_not_found

__all__ = [
    "Handler",
    "Router",
    "api_error",
    "find_record",
    "json_body",
    "mark_fault",
    "sandbox_record",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Wraps a handler for a named route (faults first, ``BadRequest`` → E2B's error answer).
Router = Callable[[str, Handler], Handler]


def api_error(
    status: int,
    message: str,
    error_code: Optional[str] = None,
    headers: Optional[Dict[str, str]] = None,
) -> web.Response:
    """An E2B control-plane error answer: ``{"code": status, "message": …[, "error_code"]}``."""
    body: Dict[str, Any] = {"code": status, "message": message}
    if error_code:
        body["error_code"] = error_code
    return web.json_response(body, status=status, headers=headers)


def mark_fault(request: web.Request, kind: str) -> None:
    """Note in the request's log entry that fault ``kind`` answered it."""
    entry = request.get("log_entry")
    if isinstance(entry, dict):
        entry["fault"] = kind


async def json_body(request: web.Request, *, optional: bool) -> Dict[str, Any]:
    """The request's JSON object body (``{}`` when empty and ``optional``).

    Raises:
        BadRequest: an empty required body, invalid JSON, or not an object.
    """
    raw = await request.read()
    if not raw.strip():
        if optional:
            return {}
        raise BadRequest("validation error: request body has an error: value is required")
    try:
        body = json.loads(raw)
    except ValueError:
        raise BadRequest(
            "validation error: request body has an error: doesn't match schema: invalid JSON"
        ) from None
    if not isinstance(body, dict):
        raise BadRequest("validation error: request body must be a JSON object")
    return body


def find_record(server: SandboxLifecycle, raw_id: str) -> SandboxRecord:
    """The record of the sandbox a path names.

    Raises:
        BadRequest: 400 ``Invalid sandbox ID``, or 404 when there is no such sandbox.
    """
    sid = parse_sandbox_path_id(raw_id)
    rec = server.records.get(sid)
    if rec is None:
        raise sandbox_not_found(sid)
    return rec


def sandbox_record(server: SandboxLifecycle, request: web.Request) -> SandboxRecord:
    """The record of the sandbox ``{sid}`` of the request's path (see :func:`find_record`)."""
    return find_record(server, request.match_info["sid"])
