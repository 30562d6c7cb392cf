"""Fault injection for the local E2B emulator.

Every fault is off by default. A test arms one through the admin API (``POST /_emulator/faults``
with ``{"kind": …, …}``, the ``X-API-KEY`` header required) or the matching
:class:`~e2b_provider.emulator.handle.Emulator` method, and ``DELETE /_emulator/faults`` (or
``Emulator.clear_faults()``) disarms them all. Each fault has a ``count``: how many requests it
hits before it disarms itself (default 1; ``-1`` = until cleared). The kinds:

``connect_conflict(count=1, error_code=None)``
    The next ``count`` connects (``POST /v2/sandboxes/{id}/connect``, ``POST
    /sandboxes/{id}/connect``) answer 409 ``{"code":409,"message":…}``, with ``error_code``
    when given (e.g. ``sandbox_snapshot_guest_agent_unresponsive``).
``control_error(route, status, count=1, error_code=None, retry_after=None)``
    The next ``count`` control-plane requests of ``route`` (``create``, ``connect`` (also the
    legacy resume), ``pause``, ``delete``, ``list``, ``get`` or ``any``) answer ``status``
    with an E2B error body, plus ``Retry-After: retry_after`` when given (seconds, may be
    fractional). Nothing else happens (no sandbox is created, paused, …).
``control_redirect(route, count=1)``
    The next ``count`` requests of ``route`` answer 307 with a ``Location`` pointing at
    ``/_emulator/redirect-target`` on this server (which answers 200 and records the hit), so
    a client that follows redirects can be caught.
``no_token(count=1)``
    The next ``count`` create/connect answers omit ``envdAccessToken``.
``stream_cut(after_bytes, sandbox_id=None, count=1)``
    The next ``process.Process/Start`` stream (of that sandbox, or any) is forwarded for
    ``after_bytes`` bytes of response body and then the client connection is closed without
    an end of stream. The process keeps running in the sandbox.
``stream_cut_at_end(sandbox_id=None, count=1)``
    The next Start stream is forwarded whole up to its Connect end-of-stream message (so the
    process's ``end`` event arrives), then the client connection is closed without it.
``stream_stall(sandbox_id=None, after_bytes=0, count=1)``
    The next Start stream sends ``after_bytes`` bytes of response body and then nothing at all:
    it never ends. The connection stays open until the client goes away, its sandbox is
    paused, rebooted or killed, or the faults are cleared (clearing closes it).
``stream_stall_at_end(sandbox_id=None, count=1)``
    The next Start stream is forwarded whole up to its Connect end-of-stream message (so the
    process's ``end`` event arrives), then stalls as ``stream_stall`` does.
``edge_not_found(sandbox_id=None, count=1)``
    The next ``count`` envd requests (of that sandbox, or any) answer 502 "The sandbox was not
    found" without reaching envd, as E2B's edge answers for a sandbox paused between a client's
    connect and its next request.
``envd_error(status, sandbox_id=None, count=1)``
    The next ``count`` envd requests (of that sandbox, or any) answer ``status`` with the
    body ``{"code": status, "message": "Bad gateway"}`` without reaching envd: a generic
    error of the edge or a proxy in between, which a client cannot tell from one that came
    after envd acted (so it must not retry a process start on it).
``envd_unresponsive(sandbox_id)``
    Every new envd request to that sandbox (``GET /health`` included) hangs without an answer
    until the sandbox is rebooted (a filesystem-only pause, or a connect with ``memory:
    false``) or the faults are cleared. Streams already open keep flowing. While it is set, a
    filesystem-only pause answers 503 and a full pause succeeds but marks the sandbox
    ``envdUnresponsiveAtPause`` (a plain connect then answers 409). Its count is ignored.
``bad_envelope(mode, sandbox_id=None, count=1)``
    The next Start stream's first frame is replaced: ``oversized`` (a header claiming 1 GiB,
    followed by a few bytes), ``malformed`` (a data frame that is not JSON) or ``compressed``
    (a valid JSON frame with flag 0x01). The real stream follows.

Faults are per sandbox: a fault limited to a sandbox acts on that sandbox only, is dropped when
the sandbox is killed, and what it holds (a stalled stream, hanging requests) is released only
by that sandbox's own events (its fault dropped by a reboot or kill) or by clearing all faults,
never by another sandbox's.

This module owns the registry of armed faults and the bytes of the bad frames. It does no I/O:
no aiohttp, requests, urllib3 or socket. The server asks it, per request, whether a fault
applies (:meth:`FaultRegistry.take`), and waits on :meth:`FaultRegistry.wait_changed` (per
sandbox) to learn when the faults of a sandbox changed.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs

__all__ = [
    "BAD_ENVELOPE_MODES",
    "FAULT_KINDS",
    "ROUTES",
    "Fault",
    "FaultError",
    "FaultRegistry",
    "TrailerCut",
    "bad_frame",
]

#: Control-plane route names a ``control_error``/``control_redirect`` fault can target.
ROUTES = ("create", "connect", "pause", "delete", "list", "get", "any")
#: Modes of ``bad_envelope``.
BAD_ENVELOPE_MODES = ("oversized", "malformed", "compressed")
#: Every fault kind and the parameters it takes (besides ``count``).
FAULT_KINDS: Mapping[str, Tuple[str, ...]] = {
    "connect_conflict": ("error_code",),
    "control_error": ("route", "status", "error_code", "retry_after"),
    "control_redirect": ("route",),
    "no_token": (),
    "stream_cut": ("after_bytes", "sandbox_id"),
    "stream_cut_at_end": ("sandbox_id",),
    "stream_stall": ("after_bytes", "sandbox_id"),
    "stream_stall_at_end": ("sandbox_id",),
    "envd_unresponsive": ("sandbox_id",),
    "edge_not_found": ("sandbox_id",),
    "envd_error": ("status", "sandbox_id"),
    "bad_envelope": ("mode", "sandbox_id"),
}

_ids = itertools.count(1)


class FaultError(ValueError):
    """An admin request described a fault that does not exist or has bad parameters."""


@attrs.define(eq=False)
class Fault:
    """One armed fault. ``count`` is what is left (``-1`` = until cleared)."""

    kind: str
    count: int
    params: Dict[str, Any]
    id: int = attrs.field(factory=lambda: next(_ids))

    @property
    def sandbox_id(self) -> Optional[str]:
        """The sandbox this fault is limited to, if any."""
        value = self.params.get("sandbox_id")
        return value if isinstance(value, str) else None

    def to_json(self) -> Dict[str, Any]:
        """A JSON description (for ``GET /_emulator/faults``)."""
        return {"id": self.id, "kind": self.kind, "count": self.count, **self.params}


def _int(params: Mapping[str, Any], name: str, default: Optional[int] = None) -> int:
    value = params.get(name, default)
    if value is None:
        raise FaultError(f"{name} is required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultError(f"{name} must be an integer")
    return int(value)


def _opt_str(params: Mapping[str, Any], name: str) -> Optional[str]:
    value = params.get(name)
    if value is not None and not isinstance(value, str):
        raise FaultError(f"{name} must be a string")
    return value


def _choice(params: Mapping[str, Any], name: str, choices: Sequence[str]) -> Any:
    value = params.get(name)
    if value not in choices:
        raise FaultError(f"{name} must be one of {', '.join(choices)}")
    return value


def validate(kind: str, params: Mapping[str, Any]) -> Fault:
    """Check a fault description from the admin API and build the :class:`Fault`.

    Raises:
        FaultError: unknown kind, unknown parameter or a bad value.
    """
    if kind not in FAULT_KINDS:
        raise FaultError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
    allowed = set(FAULT_KINDS[kind]) | {"count"}
    extra = set(params) - allowed
    if extra:
        raise FaultError(f"{kind} takes no parameter(s) {', '.join(sorted(extra))}")
    count = _int(params, "count", 1)
    if count == 0 or count < -1:
        raise FaultError("count must be a positive integer or -1 (until cleared)")
    out: Dict[str, Any] = {}
    if "route" in FAULT_KINDS[kind]:
        out["route"] = _choice(params, "route", ROUTES)
    if "status" in FAULT_KINDS[kind]:
        status = _int(params, "status")
        if not 400 <= status <= 599:
            raise FaultError("status must be an HTTP error status (400-599)")
        out["status"] = status
    if kind == "control_error":
        retry_after = params.get("retry_after")
        if retry_after is not None:
            if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)):
                raise FaultError("retry_after must be a number of seconds")
            if retry_after < 0:
                raise FaultError("retry_after must be >= 0")
            out["retry_after"] = retry_after
    if "error_code" in FAULT_KINDS[kind]:
        error_code = _opt_str(params, "error_code")
        if error_code is not None:
            out["error_code"] = error_code
    if kind in ("stream_cut", "stream_stall"):
        after = _int(params, "after_bytes", None if kind == "stream_cut" else 0)
        if after < 0:
            raise FaultError("after_bytes must be >= 0")
        out["after_bytes"] = after
    if kind == "bad_envelope":
        out["mode"] = _choice(params, "mode", BAD_ENVELOPE_MODES)
    if "sandbox_id" in FAULT_KINDS[kind]:
        sandbox_id = _opt_str(params, "sandbox_id")
        if kind == "envd_unresponsive" and not sandbox_id:
            raise FaultError("envd_unresponsive needs a sandbox_id")
        if sandbox_id is not None:
            out["sandbox_id"] = sandbox_id
    if kind == "envd_unresponsive":
        count = -1
    return Fault(kind=kind, count=count, params=out)


def bad_frame(mode: str) -> bytes:
    """The bytes of a ``bad_envelope`` frame of the given mode."""
    if mode == "oversized":
        return struct.pack(">BI", 0, 1 << 30) + b'{"event":'
    if mode == "malformed":
        body = b'{"event": {"start": not json'
        return struct.pack(">BI", 0, len(body)) + body
    if mode == "compressed":
        body = b'{"event":{"keepalive":{}}}'
        return struct.pack(">BI", 0x01, len(body)) + body
    raise FaultError(f"unknown bad_envelope mode {mode!r}")


class TrailerCut:
    """Splits a Connect stream so that everything before its end-of-stream message passes
    (``stream_cut_at_end``): feed it the body as it arrives."""

    def __init__(self) -> None:
        self._buf = b""
        self.done = False

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` to forward; :attr:`done` is set once the end-of-stream
        message began (nothing of it or after it is ever returned)."""
        if self.done:
            return b""
        self._buf += chunk
        out = bytearray()
        while len(self._buf) >= 5:
            flags, length = struct.unpack(">BI", self._buf[:5])
            if flags & 0x02:
                self.done = True
                self._buf = b""
                break
            if len(self._buf) < 5 + length:
                break
            out += self._buf[: 5 + length]
            self._buf = self._buf[5 + length :]
        return bytes(out)


class FaultRegistry:
    """The armed faults of one emulator. Use it from the event-loop thread only."""

    def __init__(self) -> None:
        self._faults: List[Fault] = []
        self._changed: Dict[str, asyncio.Event] = {}
        # Change numbers: a waiter compares :meth:`version` before and after, to tell whether
        # a change it would have waited for already happened (and not wait for the next one).
        self._seq = 0
        self._cleared_at = 0
        self._sandbox_changed_at: Dict[str, int] = {}

    def arm(self, kind: str, params: Mapping[str, Any]) -> Fault:
        """Validate and arm a fault; returns it.

        Raises:
            FaultError: see :func:`validate`.
        """
        fault = validate(kind, params)
        self._faults.append(fault)
        return fault

    def list(self) -> List[Fault]:
        """The faults still armed, oldest first."""
        return list(self._faults)

    def clear(self) -> None:
        """Disarm every fault and wake everything waiting on :meth:`wait_changed`."""
        self._faults.clear()
        self._seq += 1
        self._cleared_at = self._seq
        self._sandbox_changed_at.clear()
        waiting = list(self._changed.values())
        self._changed.clear()
        for event in waiting:
            event.set()

    def clear_sandbox(self, sandbox_id: str) -> None:
        """Drop the ``envd_unresponsive`` fault of a sandbox (it was rebooted).

        Wakes only what waits on this sandbox's faults."""
        self._drop(lambda f: f.kind == "envd_unresponsive" and f.sandbox_id == sandbox_id)
        self._notify(sandbox_id)

    def forget_sandbox(self, sandbox_id: str) -> None:
        """Drop every fault limited to a sandbox (it was killed).

        Wakes only what waits on this sandbox's faults."""
        self._drop(lambda f: f.sandbox_id == sandbox_id)
        self._notify(sandbox_id)

    def _drop(self, doomed: Callable[[Fault], bool]) -> None:
        self._faults = [f for f in self._faults if not doomed(f)]

    def is_unresponsive(self, sandbox_id: str) -> bool:
        """True while an ``envd_unresponsive`` fault is set for this sandbox."""
        return any(
            f.kind == "envd_unresponsive" and f.sandbox_id == sandbox_id for f in self._faults
        )

    def take(
        self, kind: str, *, route: Optional[str] = None, sandbox_id: Optional[str] = None
    ) -> Optional[Fault]:
        """Consume one hit of the oldest matching fault of ``kind``, if any.

        ``route`` matches faults armed for that route or for ``any``; ``sandbox_id`` matches
        faults limited to that sandbox or not limited at all. A fault whose count reaches
        zero is disarmed.
        """
        for fault in self._faults:
            if fault.kind != kind:
                continue
            if route is not None and fault.params.get("route") not in (route, "any"):
                continue
            if fault.sandbox_id is not None and fault.sandbox_id != sandbox_id:
                continue
            if fault.count > 0:
                fault.count -= 1
                if fault.count == 0:
                    self._faults.remove(fault)
            return fault
        return None

    async def wait_changed(self, sandbox_id: str) -> None:
        """Return once every fault was cleared, or the faults of ``sandbox_id`` were dropped
        (it was rebooted or killed); never because of another sandbox."""
        event = self._changed.get(sandbox_id)
        if event is None:
            event = self._changed[sandbox_id] = asyncio.Event()
        await event.wait()

    def version(self, sandbox_id: str) -> int:
        """The number of the last change :meth:`wait_changed` of ``sandbox_id`` reports."""
        return max(self._cleared_at, self._sandbox_changed_at.get(sandbox_id, 0))

    def _notify(self, sandbox_id: str) -> None:
        self._seq += 1
        self._sandbox_changed_at[sandbox_id] = self._seq
        event = self._changed.pop(sandbox_id, None)
        if event is not None:
            event.set()
