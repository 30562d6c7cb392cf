"""The reboot of a wedged sandbox: one at a time per sandbox, shared by the commands it frees.

This module owns :class:`Reboots`, the driver of the sans-IO reboot plan
(:mod:`e2b_provider.protocol.reboot_plan`) that the exec engine and the terminals call when a
command could not be stopped cleanly, and the marks that tell the kill batches whether a
sandbox was rebooted since a command began (:meth:`Reboots.rebooted_since`). Per-sandbox
bookkeeping is bounded: reboot locks exist only while used, and the reboot times of at most
:data:`MAX_REBOOT_MARKS` sandboxes are kept.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from typing import Any, Callable

from ..cancel import CancelReason, CancelToken, Deadline
from ..errors import Cancelled, E2BHttpError, E2BProviderError, OperationTimeout
from ..models import Target
from ..protocol.e2b_facts import MAX_TIMEOUT_SECONDS
from ..protocol.reboot_plan import (
    Answer,
    Connect,
    ConnectPlain,
    Finish,
    HealthCheck,
    Healthy,
    Pause,
    RebootPlan,
    Wait,
    Waited,
)
from .context import KeyedLocks, ProviderContext
from .marks import remember

__all__ = ["MAX_REBOOT_MARKS", "Reboots", "fire"]

log = logging.getLogger("e2b_provider")

#: Sandboxes whose last reboot time is remembered (least recently rebooted dropped first;
#: forgetting one costs at most an extra reboot of a sandbox that needs one).
MAX_REBOOT_MARKS = 4096


def fire(token: CancelToken, why: str) -> None:
    """Cancel ``token`` with a deadline reason (a watchdog callback)."""
    token.cancel(CancelReason("deadline", why))


class Reboots:
    """Reboot wedged sandboxes, once for all the commands stuck together in one."""

    def __init__(self, ctx: ProviderContext) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        # One reboot per sandbox at a time; execs wedged before a reboot finished share it.
        self._reboot_locks = KeyedLocks()
        # When the latest reboot of each sandbox began (recorded as it begins: a reboot in
        # progress holds the sandbox's lock, so sharing sees only finished ones); bounded.
        self._rebooted_at: collections.OrderedDict[str, float] = collections.OrderedDict()

    def after_fork(self) -> None:
        """Forget the parent's bookkeeping (its locks may be held by dead threads)."""
        self._lock = threading.Lock()
        self._reboot_locks = KeyedLocks()
        self._rebooted_at = collections.OrderedDict()

    def bookkeeping(self) -> int:
        """How many sandboxes this part keeps state for now (for leak checks)."""
        with self._lock:
            marks = len(self._rebooted_at)
        return marks + len(self._reboot_locks)

    def forget(self, sid: str) -> None:
        """Drop the reboot mark of a sandbox that was destroyed."""
        with self._lock:
            self._rebooted_at.pop(sid, None)

    def rebooted_since(self, sid: str, t: float) -> bool:
        """True if a reboot of ``sid`` began at or after ``t`` (monotonic clock)."""
        with self._lock:
            return self._rebooted_at.get(sid, -math.inf) >= t

    def reboot_once(self, sid: str, target: Target, began: float) -> None:
        """Reboot ``sid`` unless a reboot that started after ``began`` already finished.

        ``began`` is when the stuck command was started: a reboot that started later killed
        it. So many commands on one stuck sandbox that time out together share one reboot
        instead of pausing and cold-booting the same sandbox over each other. After the
        provider was closed nothing is rebooted (logged).
        """
        if self._ctx.closed:
            log.warning(
                "e2b_provider: a command in sandbox %s could not be stopped, and the provider "
                "was closed: the sandbox is not rebooted",
                sid,
            )
            return
        with self._reboot_locks.hold(sid, timeout=self._ctx.bounds.reboot) as got:
            if not got:
                log.warning(
                    "e2b_provider: another reboot of sandbox %s did not finish in time", sid
                )
                return
            if self.rebooted_since(sid, began):
                log.info("e2b_provider: sandbox %s was just rebooted for another command", sid)
                return
            with self._lock:
                remember(self._rebooted_at, sid, time.monotonic(), MAX_REBOOT_MARKS)
            self._reboot(sid, target)

    def _reboot(self, sid: str, target: Target) -> None:
        """Reboot a wedged sandbox (v2 API sequence); failures are logged, never raised."""
        ctx = self._ctx
        log.warning("e2b_provider: could not stop a command cleanly; rebooting sandbox %s", sid)
        ctx.leases.forget(sid)
        bound = ctx.bounds.reboot
        deadline = Deadline.after(bound)
        guard = CancelToken()
        timer = ctx.watchdog.call_later(bound, lambda: fire(guard, "reboot bound"))
        plan = RebootPlan(min(MAX_TIMEOUT_SECONDS, ctx.config.timeout_seconds))
        try:
            step = plan.first()
            while not isinstance(step, Finish):
                if deadline.expired():
                    raise OperationTimeout("sandbox reboot ran out of time")
                outcome: object
                if isinstance(step, Pause):
                    outcome = _answer(
                        ctx.control.pause, sid, memory=step.memory, cancel=guard, retry=False
                    )
                elif isinstance(step, HealthCheck):
                    health = ctx.envd(target).health(timeout=min(5.0, deadline.remaining()))
                    outcome = Healthy(health)
                elif isinstance(step, Wait):
                    if guard.wait(min(step.seconds, deadline.remaining())):
                        raise OperationTimeout("sandbox reboot ran out of time")
                    outcome = Waited()
                elif isinstance(step, Connect):
                    outcome = _answer(
                        ctx.control.connect,
                        sid,
                        timeout_seconds=step.timeout_seconds,
                        memory=False,
                        cancel=guard,
                    )
                elif isinstance(step, ConnectPlain):
                    outcome = _answer(
                        ctx.control.connect, sid, timeout_seconds=step.timeout_seconds, cancel=guard
                    )
                else:  # pragma: no cover - a step kind this loop does not know
                    raise E2BProviderError(f"unknown reboot step {step!r}")
                step = plan.next(step, outcome)
            if step.rebooted:
                log.warning("e2b_provider: sandbox %s rebooted", sid)
            else:
                log.warning(
                    "e2b_provider: sandbox %s was not rebooted (%s): %s; the stuck command may "
                    "still be running",
                    sid,
                    step.outcome,
                    step.message,
                )
        except (E2BProviderError, Cancelled) as exc:
            log.warning(
                "e2b_provider: sandbox reboot failed for %s; the stuck command may still be "
                "running: %s",
                sid,
                str(exc)[:500],
            )
        finally:
            timer.cancel()
            # Whatever happened, the next call connects afresh (it may have to resume).
            ctx.leases.forget(sid)


def _answer(call: Callable[..., object], *args: Any, **kwargs: Any) -> Answer:
    """Run one control-plane call of the reboot plan and turn it into an Answer."""
    try:
        result = call(*args, **kwargs)
    except E2BHttpError as exc:
        return Answer(exc.status, exc.error_code, getattr(exc, "retry_after", None))
    if isinstance(result, int):
        return Answer(result)
    return Answer(int(getattr(result, "raw_status", 200)))
