"""Tests for e2b_provider.protocol.reboot_plan: the sans-IO reboot planner (e2b-protocol.md section
12)."""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2b_provider.protocol.reboot_plan import (
    MAX_STEPS,
    MEMORY_OVERRIDE_DISABLED,
    Answer,
    Connect,
    ConnectPlain,
    Finish,
    HealthCheck,
    Healthy,
    Outcome,
    Pause,
    RebootPlan,
    Step,
    Wait,
    Waited,
)

T = 3600
FS = Pause(memory=False)
FULL = Pause(memory=True)
CONN = Connect(T, memory=False)


def drive(plan: RebootPlan, outcomes: Sequence[Outcome]) -> Tuple[List[Step], Finish]:
    """Feed ``outcomes`` in order; return every step yielded and the final Finish."""
    steps: List[Step] = [plan.first()]
    for outcome in outcomes:
        assert not isinstance(steps[-1], Finish), f"plan finished early: {steps}"
        steps.append(plan.next(steps[-1], outcome))
    last = steps[-1]
    assert isinstance(last, Finish), f"plan not finished: {steps}"
    return steps[:-1], last


def A(status: int, error_code: Optional[str] = None, retry_after: Optional[float] = None) -> Answer:
    return Answer(status, error_code, retry_after)


# -- step 1: filesystem-only pause -----------------------------------------------------------


def test_first_step_is_a_filesystem_only_pause() -> None:
    assert RebootPlan(T).first() == Pause(memory=False)


@pytest.mark.parametrize("status", [204, 409])
def test_fs_pause_ok_then_cold_boot(status: int) -> None:
    steps, fin = drive(RebootPlan(T), [A(status), A(201)])
    assert steps == [FS, CONN]
    assert fin.outcome == "rebooted" and fin.rebooted


def test_connect_carries_the_timeout_and_memory_false() -> None:
    plan = RebootPlan(120)
    step = plan.next(plan.first(), A(204))
    assert step == Connect(timeout_seconds=120, memory=False)


def test_fs_pause_404_is_gone() -> None:
    steps, fin = drive(RebootPlan(T), [A(404)])
    assert steps == [FS]
    assert fin.outcome == "gone" and not fin.rebooted


def test_fs_pause_503_healthy_waits_and_retries() -> None:
    steps, fin = drive(
        RebootPlan(T),
        [A(503, retry_after=2.0), Healthy(True), Waited(), A(204), A(201)],
    )
    assert steps == [FS, HealthCheck(), Wait(2.0), FS, CONN]
    assert fin.outcome == "rebooted"


def test_fs_pause_503_without_retry_after_waits_default() -> None:
    plan = RebootPlan(T)
    step = plan.next(plan.first(), A(503))
    assert step == HealthCheck()
    assert plan.next(step, Healthy(True)) == Wait(1.5)


def test_fs_pause_503_healthy_retries_are_bounded() -> None:
    outcomes: List[Outcome] = []
    for _ in range(2):
        outcomes += [A(503), Healthy(True), Waited()]
    outcomes += [A(503), Healthy(True)]
    steps, fin = drive(RebootPlan(T, max_pause_retries=2), outcomes)
    assert steps.count(FS) == 3
    assert FULL not in steps
    assert fin.outcome == "not_rebooted"
    assert "503" in fin.message


def test_max_pause_retries_zero_gives_up_at_once() -> None:
    steps, fin = drive(RebootPlan(T, max_pause_retries=0), [A(503), Healthy(True)])
    assert steps == [FS, HealthCheck()]
    assert fin.outcome == "not_rebooted"


def test_fs_pause_503_unhealthy_falls_back_to_full_pause() -> None:
    steps, fin = drive(RebootPlan(T), [A(503), Healthy(False), A(204), A(201)])
    assert steps == [FS, HealthCheck(), FULL, CONN]
    assert fin.outcome == "rebooted"


def test_fs_pause_500_falls_back_to_full_pause() -> None:
    steps, fin = drive(RebootPlan(T), [A(500), A(409), A(201)])
    assert steps == [FS, FULL, CONN]
    assert fin.rebooted


@pytest.mark.parametrize("status", [400, 401, 429, 502])
def test_fs_pause_other_status_gives_up(status: int) -> None:
    steps, fin = drive(RebootPlan(T), [A(status)])
    assert steps == [FS]
    assert fin.outcome == "not_rebooted"
    assert str(status) in fin.message


# -- step 2: full pause ----------------------------------------------------------------------


def test_full_pause_404_is_gone() -> None:
    _, fin = drive(RebootPlan(T), [A(500), A(404)])
    assert fin.outcome == "gone"


def test_full_pause_503_retries_with_backoff_then_succeeds() -> None:
    steps, fin = drive(
        RebootPlan(T), [A(500), A(503), Waited(), A(503, retry_after=4.0), Waited(), A(204), A(201)]
    )
    assert steps == [FS, FULL, Wait(1.5), FULL, Wait(4.0), FULL, CONN]
    assert fin.rebooted


def test_full_pause_503_gives_up_after_a_few_retries() -> None:
    steps, fin = drive(RebootPlan(T), [A(500), A(503), Waited(), A(503), Waited(), A(503)])
    assert steps == [FS, FULL, Wait(1.5), FULL, Wait(3.0), FULL]
    assert fin.outcome == "not_rebooted"
    assert "503" in fin.message


def test_full_pause_other_status_gives_up() -> None:
    _, fin = drive(RebootPlan(T), [A(500), A(401)])
    assert fin.outcome == "not_rebooted" and "401" in fin.message


# -- step 3: connect with memory false -------------------------------------------------------


def test_connect_200_means_it_was_running() -> None:
    _, fin = drive(RebootPlan(T), [A(204), A(200)])
    assert fin.outcome == "not_rebooted" and not fin.rebooted
    assert "running" in fin.message


def test_connect_memory_override_disabled_connects_plainly() -> None:
    steps, fin = drive(RebootPlan(T), [A(204), A(400, MEMORY_OVERRIDE_DISABLED), A(201)])
    assert steps == [FS, CONN, ConnectPlain(T)]
    assert fin.outcome == "not_rebooted"
    assert "may still be running" in fin.message


def test_plain_connect_failure_is_reported() -> None:
    _, fin = drive(RebootPlan(T), [A(204), A(400, MEMORY_OVERRIDE_DISABLED), A(500)])
    assert fin.outcome == "not_rebooted" and "500" in fin.message


def test_plain_connect_404_is_gone() -> None:
    _, fin = drive(RebootPlan(T), [A(204), A(400, MEMORY_OVERRIDE_DISABLED), A(404)])
    assert fin.outcome == "gone"


def test_plain_connect_409_is_retried() -> None:
    steps, fin = drive(
        RebootPlan(T),
        [A(204), A(400, MEMORY_OVERRIDE_DISABLED), A(409), Waited(), A(200)],
    )
    assert steps == [FS, CONN, ConnectPlain(T), Wait(0.5), ConnectPlain(T)]
    assert fin.outcome == "not_rebooted"


def test_connect_other_400_gives_up_with_status_and_code() -> None:
    _, fin = drive(RebootPlan(T), [A(204), A(400, "bad_timeout")])
    assert fin.outcome == "not_rebooted"
    assert "400" in fin.message and "bad_timeout" in fin.message


def test_connect_409_waits_half_a_second_and_retries() -> None:
    steps, fin = drive(RebootPlan(T), [A(204), A(409), Waited(), A(201)])
    assert steps == [FS, CONN, Wait(0.5), CONN]
    assert fin.rebooted


def test_connect_409_retries_are_bounded() -> None:
    outcomes: List[Outcome] = [A(204)]
    for _ in range(3):
        outcomes += [A(409), Waited()]
    outcomes += [A(409)]
    steps, fin = drive(RebootPlan(T), outcomes)
    assert steps.count(CONN) == 4
    assert fin.outcome == "not_rebooted" and "409" in fin.message


def test_connect_404_is_gone() -> None:
    _, fin = drive(RebootPlan(T), [A(409), A(404)])
    assert fin.outcome == "gone"


def test_connect_503_retries_with_backoff_then_succeeds() -> None:
    steps, fin = drive(RebootPlan(T), [A(204), A(503), Waited(), A(503), Waited(), A(201)])
    assert steps == [FS, CONN, Wait(1.5), CONN, Wait(3.0), CONN]
    assert fin.rebooted


def test_connect_503_retries_are_bounded() -> None:
    retry: List[Outcome] = [A(503), Waited()]
    outcomes: List[Outcome] = [A(204), *(retry * 3), A(503)]
    steps, fin = drive(RebootPlan(T), outcomes)
    assert steps.count(CONN) == 4
    assert fin.outcome == "not_rebooted"


@pytest.mark.parametrize("status", [401, 429, 500, 504])
def test_connect_other_status_gives_up(status: int) -> None:
    _, fin = drive(RebootPlan(T), [A(204), A(status)])
    assert fin.outcome == "not_rebooted" and str(status) in fin.message


# -- answers, misuse and bounds --------------------------------------------------------------


def test_retry_after_is_clamped() -> None:
    assert Answer(503, retry_after=1e6).retry_after == 10.0
    assert Answer(503, retry_after=-5).retry_after == 0.0
    assert Answer(503, retry_after=math.nan).retry_after is None
    plan = RebootPlan(T)
    step = plan.next(plan.first(), Answer(503, retry_after=3600))
    assert plan.next(step, Healthy(True)) == Wait(10.0)


def test_misuse_is_refused() -> None:
    plan = RebootPlan(T)
    with pytest.raises(ValueError):
        plan.next(FS, A(204))  # no step yielded yet
    step = plan.first()
    with pytest.raises(ValueError):
        plan.first()
    with pytest.raises(ValueError):
        plan.next(step, Healthy(True))  # wrong outcome kind
    with pytest.raises(ValueError):
        plan.next(Pause(memory=False), A(204))  # equal but not the step it returned
    step = plan.next(step, A(503))
    with pytest.raises(ValueError):
        plan.next(step, Waited())
    step = plan.next(step, Healthy(True))
    with pytest.raises(ValueError):
        plan.next(step, A(204))  # a Wait needs Waited
    assert plan.next(step, Waited()) == FS


def test_finished_plan_refuses_more_input() -> None:
    plan = RebootPlan(T)
    fin = plan.next(plan.first(), A(404))
    assert isinstance(fin, Finish) and plan.finished
    with pytest.raises(ValueError):
        plan.next(fin, A(204))


def test_messages_are_short_and_bounded() -> None:
    _, fin = drive(RebootPlan(T), [A(204), A(400, "x" * 5000)])
    assert len(fin.message) < 400


STILL_RUNNING = "the stuck command may still be running"
PLAIN = (
    "cold boot is not enabled for this team (connect answered 400 "
    f"{MEMORY_OVERRIDE_DISABLED}); the sandbox was resumed with its memory and {STILL_RUNNING}"
)


@pytest.mark.parametrize(
    "outcomes, finish",
    [
        ([A(404)], Finish("gone", False, "the sandbox no longer exists (pause answered 404)")),
        ([A(500), A(404)],
         Finish("gone", False, "the sandbox no longer exists (pause answered 404)")),
        ([A(204), A(404)],
         Finish("gone", False, "the sandbox no longer exists (connect answered 404)")),
        ([A(204), A(400, MEMORY_OVERRIDE_DISABLED), A(404)],
         Finish("gone", False, "the sandbox no longer exists (connect answered 404)")),
        ([A(204), A(201)], Finish("rebooted", True, "the sandbox was cold-booted")),
        ([A(204), A(200)], Finish("not_rebooted", False, "the sandbox was running when it was "
         f"reconnected (resumed in between); no reboot happened and {STILL_RUNNING}")),
        ([A(204), A(400, MEMORY_OVERRIDE_DISABLED), A(200)], Finish("not_rebooted", False, PLAIN)),
        ([A(204), A(400, MEMORY_OVERRIDE_DISABLED), A(201)], Finish("not_rebooted", False, PLAIN)),
        ([A(204), A(400, MEMORY_OVERRIDE_DISABLED), A(500)], Finish("not_rebooted", False,
         "cold boot is not enabled and the plain connect answered HTTP 500; the sandbox stays "
         f"paused with its memory and {STILL_RUNNING}")),
        ([A(418, "x" * 150)], Finish("not_rebooted", False, "filesystem-only pause answered "
         f"HTTP 418 ({'x' * 100}); {STILL_RUNNING}")),
        ([A(500), A(401)], Finish("not_rebooted", False, "full pause answered HTTP 401; gave "
         f"up, the sandbox keeps running and {STILL_RUNNING}")),
        ([A(204), A(500)], Finish("not_rebooted", False, "connect answered HTTP 500; the "
         f"sandbox may stay paused and {STILL_RUNNING}")),
        ([A(503), Healthy(True), Waited(), A(503), Healthy(True), Waited(), A(503), Healthy(True)],
         Finish("not_rebooted", False, "pause kept answering 503 after 2 retries while envd is "
         f"healthy; the sandbox keeps running and {STILL_RUNNING}")),
    ],
)  # fmt: skip
def test_each_end_says_what_happened(outcomes: Sequence[Outcome], finish: Finish) -> None:
    # the default plan: two retries of a filesystem-only pause answering 503
    assert drive(RebootPlan(T), outcomes)[1] == finish


def test_plan_gives_up_after_max_steps() -> None:
    plan = RebootPlan(T, max_pause_retries=1000)  # a healthy envd, pause busy forever
    step = plan.first()
    assert plan.steps == 1
    yielded = 1
    while not isinstance(step, Finish):
        if isinstance(step, Pause):
            step = plan.next(step, A(503))
        elif isinstance(step, HealthCheck):
            step = plan.next(step, Healthy(True))
        else:
            step = plan.next(step, Waited())
        yielded += not isinstance(step, Finish)
    assert yielded == MAX_STEPS  # every step counted once
    assert step == Finish(
        "not_rebooted", False, f"gave up after {MAX_STEPS} steps; {STILL_RUNNING}"
    )
    assert plan.steps == MAX_STEPS


def test_full_pause_after_an_unhealthy_check_is_retried_as_a_full_pause() -> None:
    steps, fin = drive(
        RebootPlan(T), [A(503), Healthy(False), A(503), Waited(), A(204), A(201)]
    )
    assert steps == [FS, HealthCheck(), FULL, Wait(1.5), FULL, CONN]
    assert fin.rebooted


def test_connect_503_waits_as_long_as_retry_after_says() -> None:
    steps, fin = drive(RebootPlan(T), [A(204), A(503, retry_after=0.7), Waited(), A(201)])
    assert steps == [FS, CONN, Wait(0.7), CONN]
    assert fin.rebooted


def _refusal(call: Callable[[], object]) -> str:
    with pytest.raises(ValueError) as ei:
        call()
    return str(ei.value)


def test_misuse_messages() -> None:
    plan = RebootPlan(T)
    assert _refusal(lambda: plan.next(FS, A(204))) == (
        "next() must be given the last step this plan returned"
    )
    step = plan.first()
    assert _refusal(plan.first) == "the reboot plan has already started"
    assert _refusal(lambda: plan.next(step, Healthy(True))) == (
        "an HTTP step needs an Answer outcome"
    )
    check = plan.next(step, A(503))
    assert _refusal(lambda: plan.next(check, Waited())) == (
        "a HealthCheck step needs a Healthy outcome"
    )
    wait = plan.next(check, Healthy(True))
    assert _refusal(lambda: plan.next(wait, A(204))) == "a Wait step needs a Waited outcome"
    other = RebootPlan(T)
    done = other.next(other.first(), A(404))
    assert _refusal(lambda: other.next(done, A(204))) == "the reboot plan is finished"


def worst_case(plan: RebootPlan) -> Callable[[Step], Outcome]:
    """An adversary that always picks the answer causing the most further steps."""

    def answer(step: Step) -> Outcome:
        if isinstance(step, Wait):
            return Waited()
        if isinstance(step, HealthCheck):
            return Healthy(plan._fs_retries < plan.max_pause_retries)
        if isinstance(step, Pause) and not step.memory:
            return A(503)
        if isinstance(step, Pause):
            return A(503) if plan._full_retries < 2 else A(204)
        if isinstance(step, Connect):
            return A(409) if plan._connect_retries < 3 else A(400, MEMORY_OVERRIDE_DISABLED)
        return A(409)

    return answer


@pytest.mark.parametrize("retries", [0, 2, 5, 100])
def test_adversarial_sequences_are_bounded(retries: int) -> None:
    plan = RebootPlan(T, max_pause_retries=retries)
    answer = worst_case(plan)
    step = plan.first()
    n = 1
    while not isinstance(step, Finish):
        step = plan.next(step, answer(step))
        n += 1
        assert n <= MAX_STEPS + 1
    assert plan.steps <= MAX_STEPS


_statuses = st.sampled_from([200, 201, 204, 400, 401, 404, 409, 429, 500, 502, 503, 504])
_answers = st.builds(
    Answer,
    _statuses,
    st.sampled_from([None, MEMORY_OVERRIDE_DISABLED, "sandbox_start_in_flight"]),
    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
)


@settings(max_examples=300, database=None, deadline=None)
@given(data=st.data(), retries=st.integers(0, 50))
def test_random_answers_always_finish_within_bound(data: st.DataObject, retries: int) -> None:
    plan = RebootPlan(T, max_pause_retries=retries)
    step = plan.first()
    count = 1
    while not isinstance(step, Finish):
        outcome: Outcome
        if isinstance(step, Wait):
            assert 0.0 <= step.seconds <= 10.0
            outcome = Waited()
        elif isinstance(step, HealthCheck):
            outcome = Healthy(data.draw(st.booleans()))
        else:
            outcome = data.draw(_answers)
        step = plan.next(step, outcome)
        count += 1
        assert count <= MAX_STEPS + 1
    assert step.outcome in ("rebooted", "gone", "not_rebooted")
    assert step.rebooted == (step.outcome == "rebooted")
