"""Bounded waits for an observable state: how tests synchronise with threads and processes.

A test never sleeps for "long enough"; it polls for the state it needs (a file, a request in
the emulator's log, a thread blocked where it should be) and fails with a message when the
state does not come within a bound. Importable as ``waiting`` from every test directory (the
directory of the top-level ``conftest.py`` is on ``sys.path``).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, TypeVar

__all__ = ["last_request", "run_in_threads", "thread_blocked_in", "wait_until"]

T = TypeVar("T")


def wait_until(
    pred: Callable[[], T],
    timeout: float = 10.0,
    what: str = "the condition",
    interval: float = 0.02,
) -> T:
    """Poll ``pred`` until it returns something truthy, and return that.

    Raises:
        AssertionError: ``pred`` stayed falsy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def thread_blocked_in(thread_id: int, module_file: str) -> bool:
    """True while the thread's innermost Python frame is in the stdlib module ``module_file``.

    E.g. ``"socket.py"`` for a blocking read, ``"threading.py"`` for a Condition or Event
    wait: the thread has reached the blocking call (it may be just about to enter it).
    """
    frame = sys._current_frames().get(thread_id)
    return frame is not None and frame.f_code.co_filename.endswith(module_file)


def last_request(emu: Any) -> int:
    """The sequence number of the newest request in an emulator's request log (0: none).

    Requests logged later have higher numbers: wait for ``e["seq"] > mark`` to see only them.
    """
    return max((e["seq"] for e in emu.requests()), default=0)


def run_in_threads(worker: Callable[[int], None], n: int, join_timeout: float) -> float:
    """Run ``worker(i)`` for ``i`` in ``range(n)`` in ``n`` threads started together, join
    each for at most ``join_timeout`` seconds and return the seconds from the first start
    until the last join. The worker records its own results and errors."""
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout)
    return time.monotonic() - t0
