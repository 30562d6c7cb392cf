"""A manual monotonic clock for deterministic timer tests (trio's MockClock idea, no autojump)."""

from __future__ import annotations

import threading


class FakeClock:
    """A clock that only moves when told to.

    Args:
        now: the starting time in seconds.

    Example::

        clock = FakeClock()
        wd = Watchdog(clock, start_thread=False)
        wd.call_later(5.0, fired.append)
        clock.advance(5.0)
        wd.run_due()
    """

    def __init__(self, now: float = 1000.0) -> None:
        self._now = float(now)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    @property
    def now(self) -> float:
        """The current time."""
        return self()

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` (never backwards) and return the new time."""
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go backwards")
        with self._lock:
            self._now += seconds
            return self._now
