"""Admission of sandbox boots: at most so many at once, the rest wait their turn.

This module owns :class:`BootSlots`. Thirty-two creates at once on a two-core host each start
two Python processes (PID 1 and the agent); booted all together they share the CPU so thinly
that each takes the time of all, and every one risks its bound. Booted a few at a time, each
boot is quick and the queue moves; a create waits for a slot at most a bound of its own,
then fails with a message saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import AsyncIterator, Optional, Tuple

__all__ = ["BootSlots", "NoBootSlot", "default_max_boots"]


def default_max_boots() -> int:
    """Boots at once by default: the host's CPUs (usable by this process), at least 2."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(2, cpus)


class NoBootSlot(Exception):
    """No boot slot came free within the wait's bound (the message says how long, and how
    many boots were running and waiting)."""


class BootSlots:
    """At most ``size`` boots at once; the others wait, first come first served.

    Args:
        size: boots at once (at least 1).
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"max_boots must be at least 1, not {size}")
        self.size = size
        self._sem: Optional[Tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = None
        self.running = 0
        self.waiting = 0

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem[0] is not loop:
            self._sem = (loop, asyncio.Semaphore(self.size))
        return self._sem[1]

    @contextlib.asynccontextmanager
    async def slot(self, wait_seconds: float) -> AsyncIterator[None]:
        """Hold a boot slot for the ``async with`` block, waiting at most ``wait_seconds``.

        Raises:
            NoBootSlot: none came free in time.
        """
        sem = self._semaphore()
        began = time.monotonic()
        self.waiting += 1
        try:
            await asyncio.wait_for(sem.acquire(), wait_seconds)
        except asyncio.TimeoutError:
            raise NoBootSlot(
                f"no boot slot came free in {time.monotonic() - began:.0f} s "
                f"({self.running} boots running, {self.waiting - 1} more waiting, at most "
                f"{self.size} at once)"
            ) from None
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            sem.release()
