"""Tests for the kill batch's bound (e2b_provider.commands.kills._Bound), on a fake clock.

A batch gives up ``bound`` seconds after it started, unless its script has not started yet
while the sandbox answered other requests: then it waits one more bound (up to a cap). Once
its script started, it has the full bound from then.
"""

from __future__ import annotations

from typing import Iterator, List

import pytest

from e2b_provider._watchdog import Watchdog
from e2b_provider.cancel import CancelToken
from e2b_provider.commands.kills import _Answers, _Bound

from .fakeclock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def wd(clock: FakeClock) -> Iterator[Watchdog]:
    w = Watchdog(clock, start_thread=False)
    yield w
    w.close()


def step(wd: Watchdog, clock: FakeClock, seconds: float) -> None:
    clock.advance(seconds)
    wd.run_due()


def make(wd: Watchdog, answers: _Answers, closed: List[bool]) -> tuple[_Bound, CancelToken]:
    guard = CancelToken()
    return _Bound(wd, answers, 5.0, 20.0, guard, lambda: closed[0]), guard


def test_a_silent_sandbox_fires_after_one_bound(wd: Watchdog, clock: FakeClock) -> None:
    bound, guard = make(wd, _Answers(), [False])
    step(wd, clock, 4.9)
    assert not guard.cancelled
    step(wd, clock, 0.1)
    assert guard.cancelled and not bound.capped and not bound.started


def test_a_sandbox_answering_others_gets_more_time_up_to_the_cap(
    wd: Watchdog, clock: FakeClock
) -> None:
    answers = _Answers()
    bound, guard = make(wd, answers, [False])
    for _ in range(3):  # 15 s: each window saw an answer
        step(wd, clock, 2.0)
        answers.last = clock.now
        step(wd, clock, 3.0)
        assert not guard.cancelled
    step(wd, clock, 2.0)
    answers.last = clock.now
    step(wd, clock, 3.0)  # 20 s: the cap
    assert guard.cancelled and bound.capped


def test_a_window_without_answers_fires(wd: Watchdog, clock: FakeClock) -> None:
    answers = _Answers()
    bound, guard = make(wd, answers, [False])
    step(wd, clock, 1.0)
    answers.last = clock.now
    step(wd, clock, 4.0)  # extended
    assert not guard.cancelled
    step(wd, clock, 5.0)  # nothing answered in this window
    assert guard.cancelled and not bound.capped


def test_a_started_script_has_the_full_bound_from_its_start(
    wd: Watchdog, clock: FakeClock
) -> None:
    answers = _Answers()
    bound, guard = make(wd, answers, [False])
    step(wd, clock, 4.0)
    bound.script_started()
    answers.last = clock.now  # answers no longer extend anything
    step(wd, clock, 4.9)
    assert not guard.cancelled
    step(wd, clock, 0.1)
    assert guard.cancelled and bound.started and not bound.capped


def test_a_closed_provider_gets_no_extension(wd: Watchdog, clock: FakeClock) -> None:
    answers = _Answers()
    closed = [False]
    bound, guard = make(wd, answers, closed)
    step(wd, clock, 1.0)
    answers.last = clock.now
    closed[0] = True
    step(wd, clock, 4.0)
    assert guard.cancelled and not bound.capped


def test_cancel_stops_the_timer(wd: Watchdog, clock: FakeClock) -> None:
    bound, guard = make(wd, _Answers(), [False])
    bound.cancel()
    step(wd, clock, 60.0)
    assert not guard.cancelled
    bound.script_started()  # after cancel: nothing is armed again
    assert wd.pending_count() == 0
