"""The shared watchdog: one timer thread plus a small bounded worker pool.

This module owns :class:`Watchdog` and :class:`TimerHandle`. However many execs run at once,
the library adds a constant number of threads: one daemon timer thread named
``e2b-provider-watchdog`` and at most ``workers`` pool threads
(``e2b-provider-worker_N``), all started lazily.

* Timers live in a heap of ``(when, seq, handle)``. :meth:`TimerHandle.cancel` only marks an
  entry dead (lazy deletion); dead entries are pruned in one batch once there are more than
  ``2 * live + 64`` of them (trio's ``Deadlines._prune``).
* One :class:`threading.Condition` guards the heap. The thread waits until the earliest
  deadline and is notified only when a new entry becomes the earliest.
* Timer callbacks run on the watchdog thread, must only flip state, and never block: any
  blocking work (a kill RPC) goes to :meth:`Watchdog.submit`. Each callback is wrapped in
  ``try``/``except`` with ``log.exception`` so one bad callback cannot stop every timer.
* :meth:`Watchdog.default` is a process-wide instance; it is forgotten in the child after
  ``os.fork`` (threads do not survive a fork) and closed at interpreter exit.

It is one of the two modules that create threads (with ``cancel``); it does no network I/O.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Callable, Deque, List, Optional, Tuple, Type, TypeVar

__all__ = ["TimerHandle", "Watchdog"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], float]

#: Upper bound for one idle wait of the timer thread (it re-checks and waits again), so no
#: wait in the library is unbounded.
MAX_IDLE_WAIT_SECONDS = 30.0
#: How long :meth:`Watchdog.close` waits for the timer thread to stop.
CLOSE_JOIN_SECONDS = 2.0
THREAD_NAME = "e2b-provider-watchdog"
WORKER_PREFIX = "e2b-provider-worker"

_PENDING = 0
_FIRED = 1
_CANCELLED = 2


class _WorkerPool:
    """A bounded pool of DAEMON threads for blocking kill work.

    ``concurrent.futures.ThreadPoolExecutor`` joins its threads at interpreter exit, so a
    kill job hung on an unresponsive sandbox would hold up the exit of a script the user
    just interrupted. These threads are daemons: nothing waits for them at exit.
    """

    def __init__(self, workers: int) -> None:
        self._max = workers
        self._lock = threading.Lock()  # taken with ``with self._lock`` (see Watchdog)
        self._cond = threading.Condition(self._lock)
        self._jobs: Deque[Tuple[Future[Any], Callable[..., Any], Tuple[Any, ...]]] = deque()
        self._threads: List[threading.Thread] = []
        self._idle = 0
        self._shutdown = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        fut: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("the worker pool is shut down")
            self._jobs.append((fut, fn, args))
            if self._idle == 0 and len(self._threads) < self._max:
                t = threading.Thread(
                    target=self._work, name=f"{WORKER_PREFIX}_{len(self._threads)}", daemon=True
                )
                self._threads.append(t)
                t.start()
            else:
                self._cond.notify()
        return fut

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self._shutdown:
                    self._idle += 1
                    self._cond.wait(MAX_IDLE_WAIT_SECONDS)
                    self._idle -= 1
                if not self._jobs:
                    return
                fut, fn, args = self._jobs.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # delivered to the waiter, never lost
                fut.set_exception(exc)
            else:
                fut.set_result(result)

    def threads(self) -> List[threading.Thread]:
        with self._lock:
            return list(self._threads)

    def shutdown(self) -> None:
        with self._lock:
            self._shutdown = True
            jobs, self._jobs = self._jobs, deque()
            self._cond.notify_all()
        for fut, _, _ in jobs:
            fut.cancel()


class TimerHandle:
    """A scheduled callback; cancel it with :meth:`cancel`.

    Attributes:
        when: the deadline, on the watchdog's clock.
    """

    __slots__ = ("_fn", "_state", "_watchdog", "when")

    def __init__(self, when: float, fn: Callable[[], None], watchdog: Watchdog) -> None:
        self.when = when
        self._fn: Optional[Callable[[], None]] = fn
        self._watchdog = watchdog
        self._state = _PENDING

    @property
    def pending(self) -> bool:
        """True while the callback has neither run nor been cancelled."""
        return self._state == _PENDING

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` won (or the watchdog was closed first)."""
        return self._state == _CANCELLED

    def cancel(self) -> bool:
        """Cancel the callback (idempotent, safe from any thread, never blocks for long).

        Returns:
            True if the callback was still pending and now never runs; False if it already
            ran, is running, or was cancelled before.
        """
        return self._watchdog._cancel(self)

    def __repr__(self) -> str:
        state = ("pending", "fired", "cancelled")[self._state]
        return f"<TimerHandle when={self.when:.3f} {state}>"


_Entry = Tuple[float, int, TimerHandle]


class Watchdog:
    """One timer thread and one bounded worker pool, shared by every exec.

    Args:
        clock: monotonic clock in seconds; tests inject a fake one.
        workers: maximum number of pool threads for :meth:`submit`.
        start_thread: start the timer thread on the first :meth:`call_at`. With False, no
            thread is started and callbacks run only from :meth:`run_due` (deterministic
            tests with a fake clock).

    Example::

        wd = Watchdog.default()
        h = wd.call_later(30.0, lambda: esc_input("deadline"))
        ...
        h.cancel()
    """

    def __init__(
        self,
        clock: Clock = time.monotonic,
        *,
        workers: int = 8,
        start_thread: bool = True,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._clock = clock
        self._workers = workers
        self._start_thread = start_thread
        # ``with self._lock``, never ``with self._cond``: a Condition's ``__enter__`` is
        # Python code, so a KeyboardInterrupt could come after it took the lock and before
        # the block began, leaving the lock held for good (the timer thread, and every
        # later call, would then wait for ever); a plain lock's is not.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: List[_Entry] = []
        self._seq = itertools.count()
        self._live = 0
        self._dead = 0
        self._thread: Optional[threading.Thread] = None
        self._pool: Optional[_WorkerPool] = None
        self._closed = False

    # -- process-wide default -------------------------------------------------------------

    @classmethod
    def default(cls) -> Watchdog:
        """The process-wide watchdog (created on first use, again after a fork or close)."""
        global _default
        with _default_lock:
            wd = _default
            if wd is None or wd.closed:
                wd = _default = cls()
            return wd

    # -- timers ---------------------------------------------------------------------------

    def clock(self) -> float:
        """The current time on this watchdog's clock."""
        return self._clock()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._closed

    def call_at(self, when: float, fn: Callable[[], None]) -> TimerHandle:
        """Run ``fn()`` on the watchdog thread once the clock reaches ``when``.

        ``fn`` must not block: flip state, or hand blocking work to :meth:`submit`.
        Callbacks due at the same time run in the order they were scheduled.

        Args:
            when: the deadline on this watchdog's clock; ``math.inf`` never fires.
            fn: the callback; its exceptions are logged and swallowed.

        Raises:
            ValueError: ``when`` is NaN.
            RuntimeError: the watchdog is closed.
        """
        when = float(when)
        if math.isnan(when):
            raise ValueError("when must be a number, not NaN")
        with self._lock:
            if self._closed:
                raise RuntimeError("the watchdog is closed")
            handle = TimerHandle(when, fn, self)
            heapq.heappush(self._heap, (when, next(self._seq), handle))
            self._live += 1
            if self._start_thread and self._thread is None:
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread.start()
            elif self._heap[0][2] is handle:
                self._cond.notify()
        return handle

    def call_later(self, delay: float, fn: Callable[[], None]) -> TimerHandle:
        """Run ``fn()`` ``delay`` seconds from now (see :meth:`call_at`)."""
        return self.call_at(self._clock() + max(0.0, float(delay)), fn)

    def _cancel(self, handle: TimerHandle) -> bool:
        with self._lock:
            if handle._state != _PENDING:
                return False
            handle._state = _CANCELLED
            handle._fn = None
            self._live -= 1
            self._dead += 1
            if self._dead > 2 * self._live + 64:
                self._prune()
            return True

    def _prune(self) -> None:
        # caller holds the lock
        self._heap = [e for e in self._heap if e[2]._state == _PENDING]
        heapq.heapify(self._heap)
        self._dead = 0

    def _pop_due(self, now: float) -> List[TimerHandle]:
        # caller holds the lock
        due: List[TimerHandle] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            handle = heapq.heappop(heap)[2]
            if handle._state == _PENDING:
                handle._state = _FIRED
                self._live -= 1
                due.append(handle)
            else:
                self._dead -= 1
        return due

    def _drop_dead_head(self) -> None:
        # caller holds the lock
        heap = self._heap
        while heap and heap[0][2]._state != _PENDING:
            heapq.heappop(heap)
            self._dead -= 1

    def pending_count(self) -> int:
        """How many timers are scheduled and not cancelled."""
        with self._lock:
            return self._live

    def heap_size(self) -> int:
        """How many entries the heap holds, dead ones included (for tests)."""
        with self._lock:
            return len(self._heap)

    def run_due(self) -> int:
        """Run, on the calling thread, every callback whose time has come.

        Returns:
            How many callbacks ran.
        """
        with self._lock:
            due = self._pop_due(self._clock())
        for handle in due:
            self._invoke(handle)
        return len(due)

    @staticmethod
    def _invoke(handle: TimerHandle) -> None:
        fn = handle._fn
        handle._fn = None
        if fn is None:
            return
        try:
            fn()
        except Exception:
            name = getattr(fn, "__qualname__", type(fn).__name__)
            log.exception("e2b-provider watchdog callback %s failed", name)

    def _run(self) -> None:
        cond = self._cond
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    self._drop_dead_head()
                    if not self._heap:
                        cond.wait(MAX_IDLE_WAIT_SECONDS)
                        continue
                    now = self._clock()
                    delay = self._heap[0][0] - now
                    if delay <= 0:
                        due = self._pop_due(now)
                        break
                    cond.wait(min(delay, MAX_IDLE_WAIT_SECONDS))
            for handle in due:
                self._invoke(handle)

    # -- blocking work --------------------------------------------------------------------

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run blocking ``fn(*args)`` on the bounded worker pool.

        Raises:
            RuntimeError: the watchdog is closed.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the watchdog is closed")
            pool = self._pool
            if pool is None:
                pool = self._pool = _WorkerPool(self._workers)
            return pool.submit(fn, *args)

    # -- lifetime -------------------------------------------------------------------------

    def thread_count(self) -> int:
        """How many live threads this watchdog owns (timer thread plus pool threads)."""
        with self._lock:
            threads: List[threading.Thread] = []
            if self._thread is not None:
                threads.append(self._thread)
            if self._pool is not None:
                threads.extend(self._pool.threads())
        return sum(1 for t in threads if t.is_alive())

    def close(self) -> None:
        """Stop the timer thread and shut the pool down (idempotent).

        Pending timers are cancelled, queued pool jobs are cancelled, and running pool jobs
        are not waited for.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _, _, handle in self._heap:
                if handle._state == _PENDING:
                    handle._state = _CANCELLED
                    handle._fn = None
            self._heap = []
            self._live = self._dead = 0
            thread, self._thread = self._thread, None
            pool, self._pool = self._pool, None
            self._cond.notify_all()
        if pool is not None:
            pool.shutdown()
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_JOIN_SECONDS)

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Watchdog {state} pending={self._live} workers={self._workers}>"


_default: Optional[Watchdog] = None
_default_lock = threading.Lock()


def _forget_default_after_fork() -> None:
    # The child has no watchdog thread and may have inherited a held lock: start afresh.
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()


def _close_default_at_exit() -> None:
    wd = _default
    if wd is not None:
        wd.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_default_after_fork)
atexit.register(_close_default_at_exit)
