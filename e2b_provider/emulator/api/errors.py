"""The control plane's request error: what a handler raises to answer with E2B's error body.

This module owns :class:`BadRequest` (status, message, optional ``error_code``) and E2B's
refusal of a query parameter (:func:`query_error`, with the integer and enum checks that make
it: :func:`query_int`, :func:`query_enum`), so that the pure request helpers
(:mod:`.state`, :mod:`.names`, :mod:`.network`, :mod:`.listing`, :mod:`.logs`) can refuse a
request without importing each other or aiohttp.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, overload

__all__ = ["BadRequest", "query_enum", "query_error", "query_int"]


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


@overload
def query_int(
    query: Mapping[str, str], name: str, default: int, *, minimum: int = 0, maximum: int
) -> int: ...


@overload
def query_int(
    query: Mapping[str, str], name: str, default: None, *, minimum: int = 0, maximum: int
) -> Optional[int]: ...


def query_int(
    query: Mapping[str, str],
    name: str,
    default: Optional[int],
    *,
    minimum: int = 0,
    maximum: int,
) -> Optional[int]:
    """Integer query parameter ``name`` (``default`` when absent), ``minimum`` to ``maximum``.

    Raises:
        BadRequest: not a decimal integer, or out of range (E2B's messages).
    """
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise query_error(name, f"value {raw}: an invalid integer: invalid syntax") from None
    if value < minimum:
        raise query_error(name, f"number must be at least {minimum}")
    if value > maximum:
        raise query_error(name, f"number must be at most {maximum}")
    return value


def query_enum(query: Mapping[str, str], name: str, allowed: Sequence[str]) -> Optional[str]:
    """Query parameter ``name``, one of ``allowed`` (None when absent).

    Raises:
        BadRequest: another value (``value is not one of the allowed values [...]``).
    """
    raw = query.get(name)
    if raw is not None and raw not in allowed:
        listed = ",".join(f'"{a}"' for a in allowed)
        raise query_error(name, f"value is not one of the allowed values [{listed}]")
    return raw
