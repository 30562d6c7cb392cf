"""The planner for rebooting a sandbox whose command could not be stopped (v2 API).

This module owns :class:`RebootPlan`, a sans-IO planner for the sequence recommended in
``e2b-protocol.md`` section 12 (design.md section 6.4). The caller asks for the first
:data:`Step`, performs it (an HTTP call, an envd health check, or a cancellable wait), feeds
back what happened as an :data:`Outcome`, and gets the next step, until a :class:`Finish`::

    1  POST /sandboxes/{id}/pause {"memory": false}     Pause(memory=False)
         204/409 -> 3;  404 -> gone;  500 -> 2
         503 -> envd GET /health: healthy -> wait, retry 1 (bounded); unhealthy -> 2
    2  POST /sandboxes/{id}/pause {}                    Pause(memory=True)
         204/409 -> 3;  404 -> gone;  503 -> wait, retry (bounded), then give up
    3  POST /v2/sandboxes/{id}/connect {"timeout": T, "memory": false}
         201 -> rebooted;  200 -> was running, no reboot;  404 -> gone
         400 sandbox_memory_override_disabled -> plain connect (memory restored), not rebooted
         409 -> wait 0.5 s, retry (bounded);  503 -> wait, retry (bounded);  other -> give up

Every path is bounded: retries are counted per phase and the whole plan never yields more
than :data:`MAX_STEPS` steps before its :class:`Finish`. Messages hold statuses and error
codes only, never a secret.

Pure: no clock, no threads, no I/O; it imports no requests, urllib3 or socket.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import attrs

__all__ = [
    "MAX_STEPS",
    "Answer",
    "Connect",
    "ConnectPlain",
    "Finish",
    "HealthCheck",
    "Healthy",
    "Outcome",
    "Pause",
    "RebootPlan",
    "Step",
    "Wait",
    "Waited",
]

#: No plan yields more steps than this before its Finish.
MAX_STEPS = 20
#: Retries of the full pause (step 2) while it answers 503.
FULL_PAUSE_RETRIES = 2
#: Retries of a connect (step 3, or the plain connect) answering 409 or 503, together.
CONNECT_RETRIES = 3
#: Wait before retrying a connect that answered 409 (the reference's CONNECT_CONFLICT_WAIT_MS).
CONFLICT_WAIT_SECONDS = 0.5
#: Wait before retrying a 503 when the answer has no Retry-After (doubles per retry).
BUSY_WAIT_SECONDS = 1.5
#: A server's Retry-After is clamped to this many seconds.
MAX_WAIT_SECONDS = 10.0
#: The ``error_code`` of a ``memory: false`` connect refused because cold boot is disabled.
MEMORY_OVERRIDE_DISABLED = "sandbox_memory_override_disabled"

OUTCOME_REBOOTED = "rebooted"
OUTCOME_GONE = "gone"
OUTCOME_NOT_REBOOTED = "not_rebooted"


# -- steps --------------------------------------------------------------------------------


@attrs.frozen
class Pause:
    """``POST /sandboxes/{id}/pause``.

    Attributes:
        memory: False sends ``{"memory": false}`` (filesystem-only pause); True sends ``{}``
            (a full snapshot, which E2B marks when envd does not answer).
    """

    memory: bool


@attrs.frozen
class HealthCheck:
    """Envd ``GET /health`` with a short (5 s) timeout; answer with :class:`Healthy`."""


@attrs.frozen
class Wait:
    """Wait ``seconds`` (cancellable, clamped to the reboot's deadline); answer :class:`Waited`."""

    seconds: float


@attrs.frozen
class Connect:
    """``POST /v2/sandboxes/{id}/connect`` with ``{"timeout": ..., "memory": memory}``.

    Attributes:
        timeout_seconds: the sandbox timeout to send.
        memory: the ``memory`` field (False: cold boot from the filesystem).
    """

    timeout_seconds: int
    memory: bool = False


@attrs.frozen
class ConnectPlain:
    """``POST /v2/sandboxes/{id}/connect`` with ``{"timeout": timeout_seconds}`` only.

    A normal connect: the sandbox is resumed with its memory.
    """

    timeout_seconds: int


@attrs.frozen
class Finish:
    """The plan is over.

    Attributes:
        outcome: ``"rebooted"``, ``"gone"`` (the sandbox no longer exists) or
            ``"not_rebooted"`` (it was running, cold boot is disabled, or the plan gave up).
        rebooted: True only for ``"rebooted"``.
        message: a short, secret-free explanation for the log.
    """

    outcome: str
    rebooted: bool
    message: str


Step = Union[Pause, HealthCheck, Wait, Connect, ConnectPlain, Finish]


# -- outcomes -----------------------------------------------------------------------------


def _retry_after(value: Optional[float]) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    if math.isnan(value):
        return None
    return min(max(0.0, value), MAX_WAIT_SECONDS)


@attrs.frozen
class Answer:
    """The HTTP answer to a :class:`Pause`, :class:`Connect` or :class:`ConnectPlain`.

    Attributes:
        status: the HTTP status.
        error_code: the body's ``error_code``, if any.
        retry_after: the ``Retry-After`` header in seconds, if any (clamped to 0..10 s).
    """

    status: int
    error_code: Optional[str] = None
    retry_after: Optional[float] = attrs.field(default=None, converter=_retry_after)


@attrs.frozen
class Healthy:
    """The result of a :class:`HealthCheck`: ``ok`` is True if envd answered."""

    ok: bool


@attrs.frozen
class Waited:
    """A :class:`Wait` is over."""


Outcome = Union[Answer, Healthy, Waited]

# phases
_FS_PAUSE = "fs_pause"
_FULL_PAUSE = "full_pause"
_CONNECT = "connect"
_CONNECT_PLAIN = "connect_plain"


def _describe(answer: Answer) -> str:
    text = f"HTTP {answer.status}"
    if answer.error_code:
        text += f" ({answer.error_code[:100]})"
    return text


class RebootPlan:
    """Decides the next reboot request from the previous answer (see the module docstring).

    Args:
        timeout_seconds: the sandbox timeout sent with the connect.
        max_pause_retries: how often a filesystem-only pause answering 503 is retried while
            envd still answers its health check.

    Example::

        plan = RebootPlan(3600)
        step = plan.first()
        while not isinstance(step, Finish):
            step = plan.next(step, perform(step))
        log.warning("reboot: %s: %s", step.outcome, step.message)
    """

    def __init__(self, timeout_seconds: int, *, max_pause_retries: int = 2) -> None:
        self.timeout_seconds = int(timeout_seconds)
        self.max_pause_retries = max(0, int(max_pause_retries))
        self._phase = _FS_PAUSE
        self._last: Optional[Step] = None
        self._steps = 0
        self._fs_retries = 0
        self._full_retries = 0
        self._connect_retries = 0
        self._retry_after: Optional[float] = None
        self._message = ""

    @property
    def steps(self) -> int:
        """How many steps (Finish excluded) the plan has yielded so far."""
        return self._steps

    @property
    def finished(self) -> bool:
        """True once the plan has yielded its :class:`Finish`."""
        return isinstance(self._last, Finish)

    def first(self) -> Step:
        """The first step: a filesystem-only pause.

        Raises:
            ValueError: the plan has already started.
        """
        if self._last is not None:
            raise ValueError("the reboot plan has already started")
        return self._emit(Pause(memory=False))

    def next(self, step: Step, outcome: Outcome) -> Step:
        """The step after ``step`` produced ``outcome``.

        Args:
            step: the step just performed (the last one this plan returned).
            outcome: :class:`Answer` for HTTP steps, :class:`Healthy` for
                :class:`HealthCheck`, :class:`Waited` for :class:`Wait`.

        Raises:
            ValueError: ``step`` is not the last step returned, the plan is finished, or
                ``outcome`` does not fit ``step``.
        """
        if self._last is None or step is not self._last:
            raise ValueError("next() must be given the last step this plan returned")
        if isinstance(step, Finish):
            raise ValueError("the reboot plan is finished")
        if isinstance(step, HealthCheck):
            if not isinstance(outcome, Healthy):
                raise ValueError("a HealthCheck step needs a Healthy outcome")
            return self._after_health(outcome.ok)
        if isinstance(step, Wait):
            if not isinstance(outcome, Waited):
                raise ValueError("a Wait step needs a Waited outcome")
            return self._after_wait()
        if not isinstance(outcome, Answer):
            raise ValueError("an HTTP step needs an Answer outcome")
        if isinstance(step, Pause):
            if step.memory:
                return self._after_full_pause(outcome)
            return self._after_fs_pause(outcome)
        if isinstance(step, Connect):
            return self._after_connect(outcome)
        return self._after_connect_plain(outcome)

    # -- internals ------------------------------------------------------------------------

    def _emit(self, step: Step) -> Step:
        if not isinstance(step, Finish):
            if self._steps >= MAX_STEPS:
                step = Finish(
                    OUTCOME_NOT_REBOOTED,
                    False,
                    f"gave up after {self._steps} steps; the stuck command may still be running",
                )
            else:
                self._steps += 1
        self._last = step
        return step

    def _finish(self, outcome: str, message: str) -> Step:
        return self._emit(Finish(outcome, outcome == OUTCOME_REBOOTED, message))

    def _gone(self, what: str) -> Step:
        return self._finish(OUTCOME_GONE, f"the sandbox no longer exists ({what} answered 404)")

    def _connect(self) -> Step:
        self._phase = _CONNECT
        return self._emit(Connect(self.timeout_seconds, memory=False))

    def _wait(self, seconds: float) -> Step:
        return self._emit(Wait(seconds))

    def _after_fs_pause(self, a: Answer) -> Step:
        if a.status in (204, 409):
            return self._connect()
        if a.status == 404:
            return self._gone("pause")
        if a.status == 503:
            self._retry_after = a.retry_after
            return self._emit(HealthCheck())
        if a.status == 500:
            self._phase = _FULL_PAUSE
            return self._emit(Pause(memory=True))
        return self._finish(
            OUTCOME_NOT_REBOOTED,
            f"filesystem-only pause answered {_describe(a)}; the stuck command may still be "
            "running",
        )

    def _after_health(self, ok: bool) -> Step:
        if not ok:
            # envd does not answer: a full pause marks the snapshot, memory:false cold-boots it
            self._phase = _FULL_PAUSE
            return self._emit(Pause(memory=True))
        if self._fs_retries >= self.max_pause_retries:
            return self._finish(
                OUTCOME_NOT_REBOOTED,
                f"pause kept answering 503 after {self._fs_retries} retries while envd is "
                "healthy; the sandbox keeps running and the stuck command may still be running",
            )
        self._fs_retries += 1
        self._phase = _FS_PAUSE
        ra = self._retry_after
        return self._wait(BUSY_WAIT_SECONDS if ra is None else ra)

    def _after_wait(self) -> Step:
        if self._phase == _FS_PAUSE:
            return self._emit(Pause(memory=False))
        if self._phase == _FULL_PAUSE:
            return self._emit(Pause(memory=True))
        if self._phase == _CONNECT:
            return self._emit(Connect(self.timeout_seconds, memory=False))
        return self._emit(ConnectPlain(self.timeout_seconds))

    def _after_full_pause(self, a: Answer) -> Step:
        if a.status in (204, 409):
            return self._connect()
        if a.status == 404:
            return self._gone("pause")
        if a.status == 503 and self._full_retries < FULL_PAUSE_RETRIES:
            wait = (
                BUSY_WAIT_SECONDS * (2**self._full_retries)
                if a.retry_after is None
                else a.retry_after
            )
            self._full_retries += 1
            return self._wait(wait)
        return self._finish(
            OUTCOME_NOT_REBOOTED,
            f"full pause answered {_describe(a)}; gave up, the sandbox keeps running and the "
            "stuck command may still be running",
        )

    def _connect_failed(self, a: Answer, message: str) -> Step:
        """A connect that did not succeed: the sandbox is gone on a 404, a 409 or 503 waits
        and connects again (at most ``CONNECT_RETRIES`` times), anything else ends the
        reboot with ``message``."""
        if a.status == 404:
            return self._gone("connect")
        if self._connect_retries < CONNECT_RETRIES and a.status in (409, 503):
            n = self._connect_retries
            if a.status == 409:
                wait = CONFLICT_WAIT_SECONDS
            else:
                wait = BUSY_WAIT_SECONDS * (2**n) if a.retry_after is None else a.retry_after
            self._connect_retries += 1
            return self._wait(wait)
        return self._finish(OUTCOME_NOT_REBOOTED, message)

    def _after_connect(self, a: Answer) -> Step:
        if a.status == 201:
            return self._finish(OUTCOME_REBOOTED, "the sandbox was cold-booted")
        if a.status == 200:
            return self._finish(
                OUTCOME_NOT_REBOOTED,
                "the sandbox was running when it was reconnected (resumed in between); no "
                "reboot happened and the stuck command may still be running",
            )
        if a.status == 400 and a.error_code == MEMORY_OVERRIDE_DISABLED:
            self._phase = _CONNECT_PLAIN
            self._message = (
                "cold boot is not enabled for this team (connect answered 400 "
                f"{MEMORY_OVERRIDE_DISABLED}); the sandbox was resumed with its memory and "
                "the stuck command may still be running"
            )
            return self._emit(ConnectPlain(self.timeout_seconds))
        return self._connect_failed(
            a,
            f"connect answered {_describe(a)}; the sandbox may stay paused and the stuck "
            "command may still be running",
        )

    def _after_connect_plain(self, a: Answer) -> Step:
        if a.status in (200, 201):
            return self._finish(OUTCOME_NOT_REBOOTED, self._message)
        return self._connect_failed(
            a,
            f"cold boot is not enabled and the plain connect answered {_describe(a)}; the "
            "sandbox stays paused with its memory and the stuck command may still be running",
        )
