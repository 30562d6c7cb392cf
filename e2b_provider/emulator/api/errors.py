"""The control plane's request error: what a handler raises to answer with E2B's error body.

This module owns :class:`BadRequest` (status, message, optional ``error_code``) and E2B's
refusal of a query parameter (:func:`query_error`), so that the pure request helpers
(:mod:`.state`, :mod:`.names`, :mod:`.network`, :mod:`.listing`, :mod:`.logs`) can refuse a
request without importing each other or aiohttp.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["BadRequest", "query_error"]


class BadRequest(ValueError):
    """A request the control plane refuses with 400 (or another status given here)."""

    def __init__(self, message: str, status: int = 400, error_code: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_code = error_code


def query_error(name: str, reason: str) -> BadRequest:
    """E2B's 400 for query parameter ``name``: ``validation error: parameter "…" in query …``."""
    return BadRequest(f'validation error: parameter "{name}" in query has an error: {reason}')
