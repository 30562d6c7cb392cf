"""Unit tests of deadlines and cancellation tokens (e2b_provider.cancel)."""

from __future__ import annotations

import math
import threading
import time
from typing import List

import pytest
from waiting import run_in_threads

from e2b_provider.cancel import CancelReason, CancelToken, Deadline
from e2b_provider.errors import Cancelled

from .fakeclock import FakeClock

# --- CancelToken ----------------------------------------------------------------------------


def test_fresh_token() -> None:
    tok = CancelToken()
    assert not tok.cancelled and tok.reason is None
    tok.raise_if_cancelled()  # no-op


def test_first_reason_wins() -> None:
    tok = CancelToken()
    assert tok.cancel("first") is True
    assert tok.cancel("second") is False
    assert tok.cancel(CancelReason("shutdown", "third")) is False
    assert tok.cancelled
    assert tok.reason == CancelReason("explicit", "first")


def test_cancel_with_reason_object_and_none() -> None:
    tok = CancelToken()
    tok.cancel(CancelReason("interrupt", "ctrl-c"))
    assert tok.reason == CancelReason("interrupt", "ctrl-c")
    tok2 = CancelToken()
    tok2.cancel()
    assert tok2.reason == CancelReason("explicit", "")


def test_raise_if_cancelled() -> None:
    tok = CancelToken()
    tok.cancel(CancelReason("deadline", "too slow"))
    with pytest.raises(Cancelled) as info:
        tok.raise_if_cancelled()
    assert info.value.reason == CancelReason("deadline", "too slow")


def test_callbacks_run_once_with_the_reason() -> None:
    tok = CancelToken()
    seen: List[CancelReason] = []
    tok.on_cancel(seen.append)
    tok.on_cancel(seen.append)
    tok.cancel("go")
    tok.cancel("again")
    assert seen == [CancelReason("explicit", "go")] * 2


def test_late_registration_fires_immediately() -> None:
    tok = CancelToken()
    tok.cancel("done")
    seen: List[CancelReason] = []
    unregister = tok.on_cancel(seen.append)
    assert seen == [CancelReason("explicit", "done")]
    unregister()  # a no-op after it ran
    tok.cancel("x")
    assert len(seen) == 1


def test_unregister() -> None:
    tok = CancelToken()
    seen: List[str] = []
    unregister = tok.on_cancel(lambda r: seen.append("a"))
    tok.on_cancel(lambda r: seen.append("b"))
    unregister()
    unregister()  # idempotent
    tok.cancel()
    assert seen == ["b"]


def test_broken_callback_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    tok = CancelToken()
    seen: List[str] = []

    def broken(_r: CancelReason) -> None:
        raise RuntimeError("boom")

    tok.on_cancel(broken)
    tok.on_cancel(lambda r: seen.append("ok"))
    assert tok.cancel() is True
    assert seen == ["ok"]
    (record,) = [r for r in caplog.records if r.exc_info]
    assert (record.name, record.getMessage()) == ("e2b_provider", "cancel callback failed")
    assert isinstance(record.exc_info[1], RuntimeError)  # type: ignore[index]


def test_wait_returns_false_on_timeout() -> None:
    tok = CancelToken()
    start = time.monotonic()
    assert tok.wait(0.05) is False
    assert time.monotonic() - start >= 0.04
    assert tok.wait(0) is False
    assert tok.wait(-1) is False


def test_wait_returns_true_at_once_when_already_cancelled() -> None:
    tok = CancelToken()
    tok.cancel()
    start = time.monotonic()
    assert tok.wait(30.0) is True
    assert tok.wait(None) is True
    # wide for a loaded machine; waiting the timeout out would take 30 s (None: forever)
    assert time.monotonic() - start < 5.0


def test_wait_returns_early_on_cancel_from_another_thread() -> None:
    tok = CancelToken()
    timer = threading.Timer(0.05, tok.cancel, args=("from a thread",))
    timer.start()
    try:
        start = time.monotonic()
        assert tok.wait(30.0) is True  # generous bound; should wake within ~0.05 s
        assert time.monotonic() - start < 5.0
        assert tok.reason == CancelReason("explicit", "from a thread")
    finally:
        timer.cancel()
        timer.join(5.0)


def test_cancel_races_from_many_threads_one_winner() -> None:
    tok = CancelToken()
    calls: List[CancelReason] = []
    tok.on_cancel(calls.append)
    results: List[bool] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait(5.0)
        won = tok.cancel(f"t{i}")
        with lock:
            results.append(won)

    run_in_threads(worker, 8, 5.0)
    assert results.count(True) == 1 and len(results) == 8
    assert len(calls) == 1 and calls[0] == tok.reason


def test_linked() -> None:
    a, b = CancelToken(), CancelToken()
    child = CancelToken.linked(a, None, b)
    assert not child.cancelled
    b.cancel(CancelReason("shutdown", "closing"))
    assert child.cancelled and child.reason == CancelReason("shutdown", "closing")
    a.cancel("later")
    assert child.reason == CancelReason("shutdown", "closing")
    # Cancelling the child does not cancel the parents.
    p = CancelToken()
    c2 = CancelToken.linked(p)
    c2.cancel()
    assert not p.cancelled


def test_linked_to_an_already_cancelled_parent() -> None:
    p = CancelToken()
    p.cancel("early")
    assert CancelToken.linked(p).reason == CancelReason("explicit", "early")
    assert not CancelToken.linked().cancelled


def test_cancel_reason_str() -> None:
    assert str(CancelReason("deadline", "")) == "deadline"
    assert str(CancelReason("explicit", "why")) == "why"


# --- Deadline ---------------------------------------------------------------------------------


def test_deadline_remaining_and_expired_with_fake_clock() -> None:
    clock = FakeClock()
    d = Deadline.after(10.0, clock)
    assert d.at == 1010.0
    assert d.remaining() == 10.0 and not d.expired()
    clock.advance(4.0)
    assert d.remaining() == 6.0
    clock.advance(5.5)
    assert d.remaining() == 0.5 and not d.expired()  # half a second left is not expired
    clock.advance(0.5)
    assert d.remaining() == 0.0 and d.expired()
    clock.advance(100.0)
    assert d.remaining() == 0.0  # never negative


def test_deadline_negative_is_already_expired() -> None:
    clock = FakeClock()
    d = Deadline.after(-5.0, clock)
    assert d.expired() and d.remaining() == 0.0


def test_deadline_none_and_never() -> None:
    clock = FakeClock()
    for d in (Deadline.after(None, clock), Deadline.never()):
        assert d.at == math.inf
        assert d.remaining() == math.inf and not d.expired()
        assert d.clamp(5.0) == 5.0
    clock.advance(1e12)
    assert not Deadline.after(None, clock).expired()


def test_deadline_clamp() -> None:
    clock = FakeClock()
    d = Deadline.after(3.0, clock)
    assert d.clamp(10.0) == 3.0
    assert d.clamp(1.0) == 1.0
    clock.advance(2.5)
    assert d.clamp(10.0) == 0.5
    clock.advance(1.0)
    assert d.clamp(10.0) == 0.0


def test_deadline_earliest() -> None:
    clock = FakeClock()
    a = Deadline.after(5.0, clock)
    b = Deadline.after(2.0, clock)
    c = Deadline.never()
    assert a.earliest(b, c) is b
    assert c.earliest(a) is a
    assert c.earliest() is c
    assert b.earliest(a).remaining() == 2.0


def test_deadline_equality_ignores_clock() -> None:
    assert Deadline(5.0, FakeClock()) == Deadline(5.0, FakeClock(0.0))
