"""The kill -> grace -> wedged escalation state machine of one running exec.

This module owns :class:`Escalation`, a pure state machine: inputs (a deadline fired, the
caller's token was cancelled, Ctrl-C, the kill job finished or is overdue, the grace period
ran out, the stream ended) go in, and a list of :data:`Action` values comes out for the
caller to carry out.
It mirrors the reference's ``stop()`` / ``killing`` / ``grace`` / ``wedged`` logic in ``run``.

Transitions (the first trigger wins; later triggers change nothing)::

    RUNNING --deadline/cancel--> KILLING  [SubmitKill]   (no killer: [AbortStream])
    RUNNING --interrupt--------> KILLING  [KillInline]   (no killer: [AbortStream])
    KILLING --kill_done(True)--> GRACE    [ArmGrace(grace_seconds)]
    KILLING --kill_done(False)-> WEDGED   [AbortStream]
    KILLING --kill_done(None)--> UNCONFIRMED [AbortStream]   (also kill_overdue)
    GRACE   --grace_expired----> WEDGED   [AbortStream]
    any     --stream_end-------> DONE     [Reboot] if it was WEDGED

WEDGED needs evidence about the sandbox: a kill that failed, or ran past its bound after it
actually started, or a stream still open a grace period after a kill that worked. A kill
with no verdict (it never got to run in time, or the provider was closed) is UNCONFIRMED:
the stream is dropped so the caller gets its result on time, and nothing is rebooted.

Pure: no threads, no clock, no I/O; it imports no requests, urllib3 or socket. It is not
thread-safe: the caller wraps every input in its own lock and performs the actions outside it.
"""

from __future__ import annotations

import enum
from typing import List, Optional, Union

import attrs

from ..cancel import CancelReason

__all__ = [
    "AbortStream",
    "Action",
    "ArmGrace",
    "Escalation",
    "KillInline",
    "Reboot",
    "State",
    "SubmitKill",
]

#: Seconds the stream may keep going after a successful kill (the reference's KILL_GRACE_MS).
KILL_GRACE_SECONDS = 3.0


class State(enum.Enum):
    """Where an exec is in its stop sequence."""

    RUNNING = "running"
    KILLING = "killing"
    GRACE = "grace"
    WEDGED = "wedged"
    UNCONFIRMED = "unconfirmed"
    DONE = "done"


@attrs.frozen
class SubmitKill:
    """Hand the kill job to the worker pool (never run it on the watchdog thread)."""


@attrs.frozen
class KillInline:
    """Run the kill job on the calling thread now, under its own short deadline (Ctrl-C)."""


@attrs.frozen
class ArmGrace:
    """Schedule ``on_grace_expired`` after ``seconds``.

    Attributes:
        seconds: the grace period.
    """

    seconds: float


@attrs.frozen
class AbortStream:
    """Abort the process stream now (shut its socket down)."""


@attrs.frozen
class Reboot:
    """The command could not be stopped: reboot the sandbox (see ``_reboot``)."""


Action = Union[SubmitKill, KillInline, ArmGrace, AbortStream, Reboot]


class Escalation:
    """The stop sequence of one exec, as a pure state machine.

    Args:
        has_killer: whether a kill job exists. File operations have none: a deadline or
            cancel then just aborts the stream, and the exec is never considered wedged.
        grace_seconds: how long to wait for the stream to end after a successful kill.

    Attributes:
        state: the current :class:`State`.
        timed_out: the deadline was the first trigger.
        cancelled: the caller's token was the first trigger.
        interrupted: a Ctrl-C arrived before the stream ended (the caller must re-raise it).
        cancel_reason: the token's reason when ``cancelled``.
        wedged: the command could not be stopped (stays True after DONE).
        unconfirmed: the kill gave no verdict in time (stays True after DONE).
        stopping: a stop was triggered (deadline, cancel or interrupt).
    """

    def __init__(self, has_killer: bool = True, grace_seconds: float = KILL_GRACE_SECONDS) -> None:
        self.has_killer = has_killer
        self.grace_seconds = grace_seconds
        self.state = State.RUNNING
        self.timed_out = False
        self.cancelled = False
        self.interrupted = False
        self.cancel_reason: Optional[CancelReason] = None
        self.wedged = False
        self.unconfirmed = False
        self.stopping = False

    def __repr__(self) -> str:
        return (
            f"<Escalation {self.state.value} timed_out={self.timed_out} "
            f"cancelled={self.cancelled} interrupted={self.interrupted} wedged={self.wedged}>"
        )

    def _stop(self) -> List[Action]:
        self.stopping = True
        self.state = State.KILLING
        if not self.has_killer:
            return [AbortStream()]
        return [SubmitKill()]

    def on_deadline(self) -> List[Action]:
        """The exec's deadline passed."""
        if self.state is not State.RUNNING:
            return []
        self.timed_out = True
        return self._stop()

    def on_cancel(self, reason: Optional[CancelReason] = None) -> List[Action]:
        """The caller's token fired with ``reason``."""
        if self.state is not State.RUNNING:
            return []
        self.cancelled = True
        self.cancel_reason = reason
        return self._stop()

    def on_interrupt(self) -> List[Action]:
        """A KeyboardInterrupt reached the thread reading the stream.

        While RUNNING this asks for the kill to run inline. Later (a kill is already under
        way) it only records ``interrupted``; after DONE it is ignored.
        """
        if self.state is State.DONE:
            return []
        self.interrupted = True
        if self.state is not State.RUNNING:
            return []
        self.stopping = True
        self.state = State.KILLING
        if not self.has_killer:
            return [AbortStream()]
        return [KillInline()]

    def on_kill_done(self, ok: Optional[bool]) -> List[Action]:
        """The kill job finished: ``ok`` True if it worked, False if it failed or ran past its
        bound after it started (evidence: the sandbox is wedged), None for no verdict."""
        if self.state is not State.KILLING:
            return []
        if ok is None:
            return self.on_kill_overdue()
        if ok:
            self.state = State.GRACE
            return [ArmGrace(self.grace_seconds)]
        return self._wedge()

    def on_kill_overdue(self) -> List[Action]:
        """The kill gave no verdict within its bound from submission (it may still be
        queued): drop the stream without declaring the sandbox wedged."""
        if self.state is not State.KILLING:
            return []
        self.state = State.UNCONFIRMED
        self.unconfirmed = True
        return [AbortStream()]

    def on_grace_expired(self) -> List[Action]:
        """The grace period after a successful kill ran out and the stream is still open."""
        if self.state is not State.GRACE:
            return []
        return self._wedge()

    def _wedge(self) -> List[Action]:
        """The command could not be stopped: give up on its stream, the sandbox is wedged."""
        self.state = State.WEDGED
        self.wedged = True
        return [AbortStream()]

    def on_stream_end(self) -> List[Action]:
        """The stream ended, cleanly or not (also after an abort)."""
        if self.state is State.DONE:
            return []
        was_wedged = self.state is State.WEDGED
        self.state = State.DONE
        return [Reboot()] if was_wedged else []
