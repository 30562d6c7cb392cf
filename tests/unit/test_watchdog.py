"""Tests for e2b_provider._watchdog: the shared timer thread and worker pool."""

from __future__ import annotations

import gc
import logging
import math
import os
import signal
import sys
import threading
import time
import warnings
from typing import Iterator, List

import pytest
from waiting import thread_blocked_in, wait_until

from e2b_provider._watchdog import THREAD_NAME, WORKER_PREFIX, Watchdog

from .fakeclock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake_wd(clock: FakeClock) -> Iterator[Watchdog]:
    wd = Watchdog(clock, start_thread=False)
    yield wd
    wd.close()


@pytest.fixture
def real_wd() -> Iterator[Watchdog]:
    wd = Watchdog(workers=4)
    yield wd
    wd.close()


# -- deterministic, fake clock -------------------------------------------------------------


def test_callbacks_run_in_deadline_order_then_fifo(fake_wd: Watchdog, clock: FakeClock) -> None:
    ran: List[str] = []
    t0 = clock.now
    fake_wd.call_at(t0 + 3, lambda: ran.append("c"))
    fake_wd.call_at(t0 + 1, lambda: ran.append("a1"))
    fake_wd.call_at(t0 + 2, lambda: ran.append("b"))
    fake_wd.call_at(t0 + 1, lambda: ran.append("a2"))
    assert fake_wd.run_due() == 0
    clock.advance(1)
    assert fake_wd.run_due() == 2
    assert ran == ["a1", "a2"]
    clock.advance(5)
    assert fake_wd.run_due() == 2
    assert ran == ["a1", "a2", "b", "c"]
    assert fake_wd.run_due() == 0
    assert fake_wd.pending_count() == 0


def test_call_later_is_relative_to_the_injected_clock(fake_wd: Watchdog, clock: FakeClock) -> None:
    ran: List[int] = []
    h = fake_wd.call_later(2.5, lambda: ran.append(1))
    assert h.when == clock.now + 2.5
    clock.advance(2.4)
    assert fake_wd.run_due() == 0
    clock.advance(0.1)
    assert fake_wd.run_due() == 1
    assert ran == [1]
    assert not h.pending


def test_cancel_before_fire(fake_wd: Watchdog, clock: FakeClock) -> None:
    ran: List[str] = []
    h1 = fake_wd.call_later(1, lambda: ran.append("cancelled"))
    fake_wd.call_later(1, lambda: ran.append("kept"))
    assert h1.cancel() is True
    assert h1.cancel() is False  # idempotent
    assert h1.cancelled
    assert fake_wd.pending_count() == 1
    clock.advance(1)
    assert fake_wd.run_due() == 1
    assert ran == ["kept"]


def test_cancel_after_fire_returns_false(fake_wd: Watchdog, clock: FakeClock) -> None:
    ran: List[int] = []
    h = fake_wd.call_later(0, lambda: ran.append(1))
    assert fake_wd.run_due() == 1
    assert h.cancel() is False
    assert not h.cancelled
    assert ran == [1]


def test_callback_exception_is_logged_and_isolated(
    fake_wd: Watchdog, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    ran: List[str] = []

    def boom() -> None:
        raise RuntimeError("boom")

    fake_wd.call_later(1, boom)
    fake_wd.call_later(1, lambda: ran.append("after"))
    clock.advance(1)
    with caplog.at_level(logging.ERROR, logger="e2b_provider._watchdog"):
        assert fake_wd.run_due() == 2
    assert ran == ["after"]
    records = [r for r in caplog.records if r.name == "e2b_provider._watchdog"]
    assert len(records) == 1
    assert records[0].exc_info is not None
    assert "boom" in str(records[0].exc_info[1])


def test_callback_may_schedule_more_work(fake_wd: Watchdog, clock: FakeClock) -> None:
    ran: List[str] = []

    def first() -> None:
        ran.append("first")
        fake_wd.call_later(0, lambda: ran.append("second"))

    fake_wd.call_later(1, first)
    clock.advance(1)
    assert fake_wd.run_due() == 1
    assert fake_wd.run_due() == 1
    assert ran == ["first", "second"]


def test_no_thread_without_start_thread(fake_wd: Watchdog) -> None:
    for i in range(10):
        fake_wd.call_later(i, lambda: None)
    assert fake_wd.thread_count() == 0


def test_dead_entries_are_pruned_in_batch(fake_wd: Watchdog, clock: FakeClock) -> None:
    handles = [fake_wd.call_later(10 + i, lambda: None) for i in range(300)]
    for h in handles[:200]:
        assert h.cancel()
    # live = 100, so pruning happens once dead > 2 * 100 + 64 = 264: not yet
    assert fake_wd.heap_size() == 300
    for h in handles[200:290]:
        h.cancel()
    # live dropped to 10: dead > 84 triggered a prune at some point
    assert fake_wd.heap_size() < 300
    assert fake_wd.pending_count() == 10
    clock.advance(1000)
    assert fake_wd.run_due() == 10
    assert fake_wd.heap_size() == 0


def test_infinite_deadline_never_fires_and_nan_is_refused(
    fake_wd: Watchdog, clock: FakeClock
) -> None:
    h = fake_wd.call_at(math.inf, lambda: None)
    clock.advance(1e9)
    assert fake_wd.run_due() == 0
    assert h.pending
    with pytest.raises(ValueError):
        fake_wd.call_at(math.nan, lambda: None)


def test_close_is_idempotent_and_cancels_pending(clock: FakeClock) -> None:
    wd = Watchdog(clock, start_thread=False)
    ran: List[int] = []
    h = wd.call_later(1, lambda: ran.append(1))
    wd.close()
    wd.close()
    assert wd.closed
    assert h.cancelled
    assert h.cancel() is False
    clock.advance(5)
    assert wd.run_due() == 0
    assert ran == []
    with pytest.raises(RuntimeError):
        wd.call_later(1, lambda: None)
    with pytest.raises(RuntimeError):
        wd.submit(lambda: None)


def test_context_manager_closes(clock: FakeClock) -> None:
    with Watchdog(clock, start_thread=False) as wd:
        wd.call_later(1, lambda: None)
    assert wd.closed


# -- real threads --------------------------------------------------------------------------


def test_real_thread_fires_on_time(real_wd: Watchdog) -> None:
    fired = threading.Event()
    names: List[str] = []

    def cb() -> None:
        names.append(threading.current_thread().name)
        fired.set()

    start = time.monotonic()
    real_wd.call_later(0.1, cb)
    assert fired.wait(5.0)
    elapsed = time.monotonic() - start
    assert 0.09 <= elapsed < 3.0
    assert names == [THREAD_NAME]


def test_new_earliest_entry_wakes_the_thread(real_wd: Watchdog) -> None:
    late = threading.Event()
    early = threading.Event()
    idents: List[int] = []
    real_wd.call_later(0.0, lambda: idents.append(threading.get_ident()))
    wait_until(lambda: idents, 5.0, "the watchdog thread to run a callback")
    real_wd.call_later(20.0, late.set)
    # the thread now waits (until the 20 s entry, or idle): a new earliest entry must wake it
    wait_until(lambda: thread_blocked_in(idents[0], "threading.py"), 5.0, "the thread to wait")
    start = time.monotonic()
    real_wd.call_later(0.05, early.set)
    assert early.wait(5.0)
    assert time.monotonic() - start < 3.0
    assert not late.is_set()


def test_real_thread_survives_a_failing_callback(
    real_wd: Watchdog, caplog: pytest.LogCaptureFixture
) -> None:
    fired = threading.Event()

    def boom() -> None:
        raise ValueError("callback failure")

    with caplog.at_level(logging.ERROR, logger="e2b_provider._watchdog"):
        real_wd.call_later(0.01, boom)
        real_wd.call_later(0.05, fired.set)
        assert fired.wait(5.0)
    assert any("callback failure" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


def test_cancelled_timer_never_fires_on_real_thread(real_wd: Watchdog) -> None:
    cancelled = threading.Event()
    sentinel = threading.Event()
    h = real_wd.call_later(0.1, cancelled.set)
    assert h.cancel()
    real_wd.call_later(0.2, sentinel.set)
    assert sentinel.wait(5.0)
    assert not cancelled.is_set()


def test_submit_runs_on_bounded_worker_pool(real_wd: Watchdog) -> None:
    fut = real_wd.submit(lambda a, b: (threading.current_thread().name, a + b), 2, 3)
    name, total = fut.result(timeout=5.0)
    assert total == 5
    assert name.startswith(WORKER_PREFIX)
    assert name != THREAD_NAME


def test_many_timers_and_jobs_use_a_constant_number_of_threads() -> None:
    baseline = threading.active_count()
    wd = Watchdog(workers=4)
    try:
        fired = threading.Semaphore(0)
        handles = [wd.call_later(0.01 + (i % 50) / 1000, fired.release) for i in range(1000)]
        # (on a loaded machine a timer may fire before its cancel: count the cancels that won)
        won = sum(h.cancel() for h in handles[::2])
        assert won > 0
        gate = threading.Event()
        started = threading.Semaphore(0)

        def job() -> bool:
            started.release()
            return gate.wait(10.0)

        futures = [wd.submit(job) for _ in range(40)]
        for _ in range(4):  # every worker is busy
            assert started.acquire(timeout=5.0)
        assert not started.acquire(blocking=False)  # and no fifth job runs
        assert wd.thread_count() <= 1 + 4
        assert threading.active_count() - baseline <= 1 + 4
        gate.set()
        for f in futures:
            assert f.result(timeout=5.0) is True
        for _ in range(1000 - won):
            assert fired.acquire(timeout=5.0)
        assert not fired.acquire(timeout=0.1)  # the cancels that won never fired
        assert threading.active_count() - baseline <= 1 + 4
    finally:
        wd.close()


def test_close_stops_the_thread_and_can_run_from_a_callback() -> None:
    wd = Watchdog(workers=2)
    done = threading.Event()

    def close_from_inside() -> None:
        wd.close()
        done.set()

    wd.call_later(0.01, close_from_inside)
    assert done.wait(5.0)
    wait_until(lambda: wd.thread_count() == 0, 5.0, "the watchdog's threads to end")
    wd.close()


def test_close_does_not_wait_for_running_jobs() -> None:
    wd = Watchdog(workers=1)
    gate = threading.Event()
    started = threading.Event()

    def job() -> bool:
        started.set()
        return gate.wait(60.0)

    running = wd.submit(job)
    queued = wd.submit(job)
    assert started.wait(5.0)
    t0 = time.monotonic()
    wd.close()
    # the job holds its worker until the gate opens (60 s at most): close did not wait for it
    assert not running.done()
    assert time.monotonic() - t0 < 5.0
    assert queued.cancelled()
    gate.set()
    assert running.result(timeout=5.0) is True


def test_default_is_a_singleton() -> None:
    a = Watchdog.default()
    assert a is Watchdog.default()
    assert not a.closed


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_default_is_dropped_in_a_forked_child() -> None:
    parent = Watchdog.default()
    parent_fired = threading.Event()
    parent.call_later(0.0, parent_fired.set)  # make sure the parent's thread exists
    assert parent_fired.wait(5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # multi-threaded fork (3.12+)
        pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            child = Watchdog.default()
            ok = threading.Event()
            child.call_later(0.01, ok.set)
            if child is not parent and ok.wait(5.0) and child.thread_count() == 1:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert Watchdog.default() is parent


@pytest.mark.skipif(
    sys.version_info < (3, 10),
    reason="Python 3.9 may run a signal handler after a with block ended and before its "
    "__exit__ (bpo-29988, fixed in 3.10): no Python-level lock is safe there (README, Ctrl-C)",
)
def test_ctrl_c_at_any_moment_never_leaves_the_watchdog_locked() -> None:
    """Ctrl-C (a KeyboardInterrupt raised in the main thread between any two steps) while
    the main thread schedules, cancels and submits: the watchdog's lock is never left held.
    (A ``with`` on a :class:`threading.Condition` takes the lock in a Python-level
    ``__enter__``, where an interrupt could come before the block began: the lock stayed
    held, the timer thread stopped and the next call on the main thread waited for ever.)"""
    wd = Watchdog(workers=2)  # closed only when its lock is free (closing takes it)
    main = threading.get_ident()
    stop = threading.Event()
    armed = [False]  # interrupts land only inside the watchdog calls below

    def interrupt() -> None:
        while not stop.is_set():
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.0002)

    def on_sigint(signum: int, frame: object) -> None:
        if armed[0]:
            armed[0] = False  # one interrupt per arming
            raise KeyboardInterrupt

    done = interrupted = 0
    switch = sys.getswitchinterval()
    previous = signal.signal(signal.SIGINT, on_sigint)
    sys.setswitchinterval(1e-5)  # the interrupter gets its turns often
    gc.disable()  # an interrupt inside a collector callback would only be reported there
    interrupter = threading.Thread(target=interrupt, daemon=True)
    interrupter.start()
    give_up = time.monotonic() + 30  # a bound for the old code, which locked up
    try:
        while interrupted < 2000 and time.monotonic() < give_up:
            try:
                armed[0] = True
                wd.call_later(60.0, lambda: None).cancel()
                wd.submit(lambda: None)
                wd.pending_count()
                armed[0] = False
                done += 1
            except KeyboardInterrupt:
                interrupted += 1
    finally:
        armed[0] = False
        stop.set()
        interrupter.join(10)
        for _ in range(10_000):  # the interrupts still on their way reach on_sigint
            pass
        signal.signal(signal.SIGINT, previous)
        sys.setswitchinterval(switch)
        gc.enable()
    # the lock is free: another thread takes it, and the timer thread still fires
    probe = threading.Thread(target=wd.pending_count, daemon=True)
    probe.start()
    probe.join(10)
    assert not probe.is_alive(), "the watchdog's lock was left held"
    fired = threading.Event()
    wd.call_later(0.01, fired.set)
    assert fired.wait(10)
    wd.close()
    assert interrupted >= 2000 and done > 0  # the calls went on between the interrupts
