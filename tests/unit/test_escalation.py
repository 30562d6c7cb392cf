"""Tests for e2b_provider.protocol.escalation: the pure kill -> grace -> wedged state machine."""

from __future__ import annotations

import attrs
import pytest

from e2b_provider.cancel import CancelReason
from e2b_provider.protocol.escalation import (
    AbortStream,
    ArmGrace,
    Escalation,
    KillInline,
    Reboot,
    State,
    SubmitKill,
)


def state_of(esc: Escalation) -> State:
    """The state, read through a call so mypy does not keep a stale narrowing."""
    return esc.state


def test_initial_state() -> None:
    esc = Escalation()
    assert state_of(esc) is State.RUNNING
    # booleans (they become the result's flags), not merely falsy values
    flags = (esc.timed_out, esc.cancelled, esc.interrupted, esc.wedged, esc.stopping)
    assert flags == (False,) * 5 and all(f is False for f in flags)
    assert esc.cancel_reason is None


def test_clean_stream_end_without_trigger() -> None:
    esc = Escalation()
    assert esc.on_stream_end() == []
    assert state_of(esc) is State.DONE
    assert not esc.stopping and not esc.wedged


def test_deadline_submits_kill() -> None:
    esc = Escalation()
    assert esc.on_deadline() == [SubmitKill()]
    assert state_of(esc) is State.KILLING
    assert esc.timed_out and esc.stopping
    assert not esc.cancelled and not esc.wedged


def test_deadline_without_killer_aborts_and_is_not_wedged() -> None:
    esc = Escalation(has_killer=False)
    assert esc.on_deadline() == [AbortStream()]
    assert esc.timed_out and esc.stopping
    assert esc.on_stream_end() == []
    assert state_of(esc) is State.DONE
    assert not esc.wedged


def test_cancel_submits_kill_and_keeps_reason() -> None:
    esc = Escalation()
    reason = CancelReason("explicit", "user pressed stop")
    assert esc.on_cancel(reason) == [SubmitKill()]
    assert state_of(esc) is State.KILLING
    assert esc.cancelled and not esc.timed_out
    assert esc.cancel_reason == reason


def test_cancel_without_killer_aborts() -> None:
    esc = Escalation(has_killer=False)
    assert esc.on_cancel(CancelReason()) == [AbortStream()]
    assert esc.cancelled and not esc.wedged


def test_interrupt_kills_inline() -> None:
    esc = Escalation()
    assert esc.on_interrupt() == [KillInline()]
    assert state_of(esc) is State.KILLING
    assert esc.interrupted and esc.stopping
    assert not esc.timed_out and not esc.cancelled


def test_interrupt_without_killer_aborts() -> None:
    esc = Escalation(has_killer=False)
    assert esc.on_interrupt() == [AbortStream()]
    assert esc.interrupted


def test_kill_ok_arms_grace_then_stream_end_is_clean() -> None:
    esc = Escalation(grace_seconds=3.0)
    esc.on_deadline()
    assert esc.on_kill_done(True) == [ArmGrace(3.0)]
    assert state_of(esc) is State.GRACE
    assert esc.on_stream_end() == []
    assert state_of(esc) is State.DONE
    assert esc.timed_out and not esc.wedged


def test_grace_seconds_is_passed_through() -> None:
    esc = Escalation(grace_seconds=0.25)
    esc.on_cancel(CancelReason())
    assert esc.on_kill_done(True) == [ArmGrace(0.25)]


def test_kill_fails_wedges_and_reboots_after_stream_end() -> None:
    esc = Escalation()
    esc.on_deadline()
    assert esc.on_kill_done(False) == [AbortStream()]
    assert state_of(esc) is State.WEDGED
    assert esc.wedged
    assert esc.on_stream_end() == [Reboot()]
    assert state_of(esc) is State.DONE
    assert esc.wedged  # stays visible after DONE


def test_grace_expiry_wedges_and_reboots() -> None:
    esc = Escalation()
    esc.on_cancel(CancelReason())
    esc.on_kill_done(True)
    assert esc.on_grace_expired() == [AbortStream()]
    assert state_of(esc) is State.WEDGED and esc.wedged
    assert esc.on_stream_end() == [Reboot()]


def test_interrupt_then_kill_done_then_grace() -> None:
    esc = Escalation()
    esc.on_interrupt()
    assert esc.on_kill_done(True) == [ArmGrace(3.0)]
    assert esc.on_grace_expired() == [AbortStream()]
    assert esc.on_stream_end() == [Reboot()]
    assert esc.interrupted and esc.wedged


@pytest.mark.parametrize("first", ["deadline", "cancel", "interrupt"])
@pytest.mark.parametrize("second", ["deadline", "cancel"])
def test_second_trigger_is_idempotent_first_wins(first: str, second: str) -> None:
    esc = Escalation()
    fire = {
        "deadline": esc.on_deadline,
        "cancel": lambda: esc.on_cancel(CancelReason("explicit", "x")),
        "interrupt": esc.on_interrupt,
    }
    assert fire[first]() != []
    before = (esc.timed_out, esc.cancelled, esc.interrupted, esc.cancel_reason, esc.state)
    assert fire[second]() == []
    after = (esc.timed_out, esc.cancelled, esc.interrupted, esc.cancel_reason, esc.state)
    assert after == before


@pytest.mark.parametrize("stage", ["killing", "grace", "wedged"])
def test_triggers_while_stopping_emit_nothing(stage: str) -> None:
    esc = Escalation()
    esc.on_deadline()
    if stage in ("grace", "wedged"):
        esc.on_kill_done(True)
    if stage == "wedged":
        esc.on_grace_expired()
    state = esc.state
    assert esc.on_deadline() == []
    assert esc.on_cancel(CancelReason()) == []
    assert not esc.cancelled
    assert esc.state is state


@pytest.mark.parametrize("stage", ["killing", "grace"])
def test_interrupt_while_kill_submitted_records_it(stage: str) -> None:
    esc = Escalation()
    esc.on_cancel(CancelReason())
    if stage == "grace":
        esc.on_kill_done(True)
    state = esc.state
    assert esc.on_interrupt() == []
    assert esc.interrupted
    assert esc.state is state
    assert esc.cancelled  # the first trigger is kept


def test_late_inputs_after_done_are_ignored() -> None:
    esc = Escalation()
    esc.on_deadline()
    assert esc.on_stream_end() == []  # the command ended while the kill was in flight
    assert esc.on_kill_done(True) == []
    assert esc.on_kill_done(False) == []
    assert esc.on_grace_expired() == []
    assert esc.on_deadline() == []
    assert esc.on_cancel(CancelReason()) == []
    assert esc.on_interrupt() == []
    assert esc.on_stream_end() == []
    assert state_of(esc) is State.DONE
    assert not esc.wedged and not esc.interrupted


def test_out_of_order_inputs_are_ignored() -> None:
    esc = Escalation()
    assert esc.on_kill_done(True) == []  # no kill was asked for
    assert esc.on_grace_expired() == []
    assert state_of(esc) is State.RUNNING
    esc.on_deadline()
    assert esc.on_grace_expired() == []  # grace not armed yet
    assert state_of(esc) is State.KILLING
    esc.on_kill_done(True)
    assert esc.on_kill_done(False) == []  # a second kill report changes nothing
    assert state_of(esc) is State.GRACE


def test_stream_end_while_killing_or_grace_does_not_reboot() -> None:
    for grace in (False, True):
        esc = Escalation()
        esc.on_deadline()
        if grace:
            esc.on_kill_done(True)
        assert esc.on_stream_end() == []
        assert not esc.wedged


def test_actions_are_frozen_values() -> None:
    a = ArmGrace(3.0)
    assert a == ArmGrace(3.0) and hash(a) == hash(ArmGrace(3.0))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        a.seconds = 1.0  # type: ignore[misc]
    assert SubmitKill() == SubmitKill()
    assert len({SubmitKill(), KillInline(), AbortStream(), Reboot()}) == 4


# -- a kill without a verdict ------------------------------------------------------------


@pytest.mark.parametrize("how", ["overdue", "no_verdict"])
def test_a_kill_without_verdict_drops_the_stream_and_is_not_wedged(how: str) -> None:
    esc = Escalation()
    esc.on_deadline()
    actions = esc.on_kill_overdue() if how == "overdue" else esc.on_kill_done(None)
    assert actions == [AbortStream()]
    assert state_of(esc) is State.UNCONFIRMED
    assert esc.unconfirmed and not esc.wedged and esc.timed_out
    # a verdict or a grace timer arriving later changes nothing
    assert esc.on_kill_done(False) == []
    assert esc.on_grace_expired() == []
    assert esc.on_kill_overdue() == []
    assert esc.on_stream_end() == []  # no Reboot
    assert state_of(esc) is State.DONE
    assert not esc.wedged and esc.unconfirmed


def test_overdue_after_a_verdict_changes_nothing() -> None:
    for ok in (True, False):
        esc = Escalation()
        esc.on_deadline()
        esc.on_kill_done(ok)
        assert esc.on_kill_overdue() == []
        assert not esc.unconfirmed and esc.wedged is (not ok)


def test_overdue_without_a_kill_asked_for_is_ignored() -> None:
    esc = Escalation()
    assert esc.on_kill_overdue() == []
    assert state_of(esc) is State.RUNNING
