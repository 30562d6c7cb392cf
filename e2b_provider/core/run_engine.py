"""Drive one envd process stream to its end: the exec engine.

This module owns :func:`run_process`: it starts a process through envd, reads the event
stream on the caller's thread, budgets the output, and wires the deadline, the cancel token
and Ctrl-C into the kill → grace → wedged escalation (:mod:`e2b_provider.protocol.escalation`).
Timers live on the shared watchdog thread; blocking kill calls run on the watchdog's bounded worker
pool (directly, or batched per sandbox by a kill starter), never on the watchdog thread itself,
so the library adds a constant number of threads however many commands run at once.

A kill that failed, or ran past its bound after it started, wedges the run; a kill that gave
no verdict within its bound counted from submission (still queued behind other work, say)
does not: the stream is dropped, the result comes back on time, and nothing is rebooted.

Three lanes touch one run: the caller (reads the stream), the watchdog (deadline and grace
timers; callbacks only flip state) and a worker (the kill job). The escalation state machine
is guarded by a lock; actions it returns are carried out outside the lock.

A KeyboardInterrupt while the command runs kills the remote command (bounded by
``interrupt_kill_seconds``; a second Ctrl-C abandons the cleanup with a log line) and is then
re-raised unchanged.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

import attrs

from .._watchdog import Watchdog
from ..cancel import WAIT_SLICE_SECONDS, CancelReason, CancelToken, Deadline
from ..clients.envd import EnvdClient
from ..clients.envd_streams import ProcessStream
from ..errors import (
    E2BProviderError,
    ProtocolError,
)
from ..protocol import escalation as esc_mod
from ..protocol.process_events import DataEvent, EndEvent, LiveText, OutputBudget, StartEvent
from .interrupts import calls_user_code

__all__ = ["KillStarter", "Killer", "OnText", "RunOutcome", "run_process", "wait_verdict"]

log = logging.getLogger("e2b_provider")

#: A kill job: given the pid (if the start event arrived) and a bound in seconds, stop the
#: command and its whole tree; True when it worked, False when it failed (the sandbox counts
#: as wedged), None for no verdict. It runs on a worker thread and bounds itself from when
#: it starts.
Killer = Callable[[Optional[int], float], Optional[bool]]

#: Starts a kill without blocking: given the bound in seconds and a probe that gives the
#: run's pid while its process is known to be running (its start event came, its stream has
#: not ended; else None), returns a future with the verdict (as a :data:`Killer`'s). The
#: bound counts from when the kill actually starts.
KillStarter = Callable[
    [float, Callable[[], Optional[int]]], "concurrent.futures.Future[Optional[bool]]"
]

#: A live-output callback: called on the reading thread with each piece of decoded text.
OnText = Callable[[str], None]



@attrs.frozen
class RunOutcome:
    """What one process run produced (bytes; the provider decodes)."""

    exit_code: Optional[int]
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    cancelled: bool
    wedged: bool
    pid: Optional[int] = None
    #: The exit status envd reported, also for a run that was stopped (whose
    #: ``exit_code`` is None): it may have ended on its own before the stop reached it.
    exited: Optional[int] = None


class _CallbackFailed(Exception):
    """Carries the exception a live-output callback raised out of the read loop."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _Live:
    """Live output of one stream: the decoder and the caller's callback."""

    __slots__ = ("_fn", "_text")

    def __init__(self, fn: OnText) -> None:
        self._fn = fn
        self._text = LiveText()

    def feed(self, kept: bytes) -> None:
        if kept:
            self._call(self._text.feed(kept))

    def finish(self, truncated: bool) -> None:
        self._call(self._text.finish(truncated))

    @calls_user_code
    def _call(self, text: str) -> None:
        if not text:
            return
        try:
            self._fn(text)
        except Exception as exc:  # the caller's error: the command is stopped, then it is raised
            raise _CallbackFailed(exc) from exc


@attrs.define(eq=False)
class _Run:
    """Mutable state shared by the three lanes of one run."""

    esc: esc_mod.Escalation
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    abort_token: CancelToken = attrs.field(factory=CancelToken)
    stream: Optional[ProcessStream] = None
    pid: Optional[int] = None
    #: The process's end event came.
    ended: bool = False
    kill_future: Optional[concurrent.futures.Future[Optional[bool]]] = None
    #: When the wait for the kill's verdict ends: its bound, from submission, plus 1 s.
    kill_deadline: Optional[Deadline] = None
    timers: list[Any] = attrs.field(factory=list)


def wait_verdict(
    fut: concurrent.futures.Future[Optional[bool]], deadline: Deadline
) -> Tuple[bool, Optional[bool]]:
    """Wait for a kill's verdict in slices until ``deadline``: ``(finished, verdict)``."""
    while True:
        left = deadline.remaining()
        try:
            # timeout=0 once the deadline passed: a finished job still counts.
            return True, _verdict(fut.result(timeout=min(left, WAIT_SLICE_SECONDS)))
        except concurrent.futures.TimeoutError:
            if left <= 0:
                return False, None
        except Exception:
            return True, False


def _verdict(value: Optional[bool]) -> Optional[bool]:
    return None if value is None else bool(value)


def run_process(
    envd: EnvdClient,
    *,
    user: str,
    cmd: str,
    args: Sequence[str],
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    max_output_bytes: int,
    timeout: Optional[float],
    cancel: Optional[CancelToken],
    watchdog: Watchdog,
    killer: Optional[Killer] = None,
    start_kill: Optional[KillStarter] = None,
    kill_seconds: float = 20.0,
    grace_seconds: float = 3.0,
    interrupt_kill_seconds: float = 10.0,
    keepalive_seconds: int = 50,
    on_wedged: Optional[Callable[[], None]] = None,
    on_stdout: Optional[OnText] = None,
    on_stderr: Optional[OnText] = None,
    tag: Optional[str] = None,
    on_start: Optional[Callable[[int], None]] = None,
    stdin: bool = False,
) -> RunOutcome:
    """Run one process through envd and return what it produced.

    Args:
        envd: the sandbox's envd client.
        user: the OS user to run as.
        cmd: the program; ``args`` its arguments.
        env: extra environment variables.
        cwd: working directory (None: the user's home, as envd decides).
        max_output_bytes: budget shared by stdout and stderr; the stream is drained past it.
        timeout: seconds until the command is stopped (None: no deadline).
        cancel: cancels the run from any thread.
        watchdog: the shared timer thread and worker pool.
        killer: the kill job for timeouts and cancellation, run on the worker pool; None
            (and no ``start_kill``) means "just drop the stream" (the kill job's own
            process).
        start_kill: starts the kill without blocking (instead of ``killer``).
        kill_seconds: how long the kill may take once it started before the sandbox counts
            as wedged; the wait for its verdict ends this long (plus 1 s) after it was
            asked for, with no verdict (not wedged) if it had not finished by then.
        grace_seconds: how long the stream may take to end after a successful kill.
        interrupt_kill_seconds: bound on the kill after Ctrl-C.
        keepalive_seconds: envd keepalive interval asked for.
        on_wedged: called (on the caller's thread, after the stream ended) when the command
            could not be stopped cleanly: the provider reboots the sandbox there.
        on_stdout: called on the caller's thread with standard output as it arrives,
            decoded incrementally (see :class:`~e2b_provider.protocol.process_events.LiveText`),
            only for output inside the budget; the pieces add up to the decoded result. An exception
            it raises stops the command (like Ctrl-C: the remote command is killed, bounded by
            ``interrupt_kill_seconds``) and is then raised.
        on_stderr: the same for standard error.
        tag: envd's tag for the process (see :meth:`EnvdClient.signal_tag`).
        on_start: called on the reading thread with the pid when the start event arrives
            (envd answered the request); it must not block or raise.
        stdin: give the process a standard input pipe (fed through
            :meth:`EnvdClient.send_input`, e.g. from ``on_start``); else it reads
            ``/dev/null``.

    Returns:
        The run's outcome. A timed-out or cancelled run has ``exit_code=None``.

    Raises:
        Cancelled: ``cancel`` had fired before the process was started.
        TransportError, ProtocolError, RemoteError, E2BHttpError: the stream failed before
            the process's end event while the run was neither timed out nor cancelled (once
            the end event arrived, its exit status is the outcome).
        KeyboardInterrupt: re-raised unchanged after the bounded kill.
        Exception: whatever ``on_stdout``/``on_stderr`` raised, after the bounded kill.
    """
    if cancel is not None:
        cancel.raise_if_cancelled()
    live_out = _Live(on_stdout) if on_stdout is not None else None
    live_err = _Live(on_stderr) if on_stderr is not None else None
    has_killer = killer is not None or start_kill is not None
    run = _Run(esc=esc_mod.Escalation(has_killer=has_killer, grace_seconds=grace_seconds))
    budget = OutputBudget(max_output_bytes)
    exit_code: Optional[int] = None
    stream_error: Optional[BaseException] = None

    def feed(fn: Callable[[], Sequence[object]]) -> None:
        with run.lock:
            actions = fn()
        for action in actions:
            _act(action)

    def _act(action: object) -> None:
        if isinstance(action, esc_mod.SubmitKill):
            _submit_kill(kill_seconds)
        elif isinstance(action, esc_mod.ArmGrace):
            run.timers.append(
                watchdog.call_later(action.seconds, lambda: feed(run.esc.on_grace_expired))
            )
        elif isinstance(action, esc_mod.AbortStream):
            _abort()
        # KillInline and Reboot are handled on the caller's thread below.

    def _abort() -> None:
        run.abort_token.cancel(CancelReason("explicit", "stream dropped"))
        with run.lock:
            stream = run.stream
        if stream is not None:
            stream.abort()

    def _kill_job(bound: float) -> Optional[bool]:
        assert killer is not None
        try:
            return killer(run.pid, bound)
        except Exception as exc:  # a failed kill means "wedged", never an exception
            log.warning("e2b_provider: kill job failed: %s", exc)
            return False

    def _submit_kill(bound: float) -> None:
        fut: concurrent.futures.Future[Optional[bool]]
        if start_kill is not None:
            fut = start_kill(bound, lambda: None if run.ended else run.pid)
        elif killer is not None:
            fut = watchdog.submit(_kill_job, bound)
        else:
            return
        with run.lock:
            run.kill_future = fut
            run.kill_deadline = Deadline.after(bound + 1.0, watchdog.clock)
        # The kill bounds itself from when it starts; the caller waits for its verdict no
        # longer than the bound from now: a kill still queued then is overdue, not failed.
        bound_timer = watchdog.call_later(bound + 1.0, lambda: feed(run.esc.on_kill_overdue))
        run.timers.append(bound_timer)

        def done(f: concurrent.futures.Future[Optional[bool]]) -> None:
            try:
                ok = _verdict(f.result())
            except Exception:
                ok = False
            feed(lambda: run.esc.on_kill_done(ok))

        fut.add_done_callback(done)

    unregister: Callable[[], None] = lambda: None  # noqa: E731
    try:
        try:
            if timeout is not None:
                deadline_at = Deadline.after(timeout, watchdog.clock).at
                run.timers.append(watchdog.call_at(deadline_at, lambda: feed(run.esc.on_deadline)))
            if cancel is not None:
                unregister = cancel.on_cancel(lambda r: feed(lambda: run.esc.on_cancel(r)))
            try:
                stream = envd.start(
                    user=user,
                    cmd=cmd,
                    args=list(args),
                    envs=dict(env) if env else None,
                    cwd=cwd,
                    keepalive_seconds=keepalive_seconds,
                    cancel=run.abort_token,
                    tag=tag,
                    stdin=stdin,
                )
            except E2BProviderError as exc:
                # As the reference: an opening that fails (or is aborted by us) after a
                # timeout or cancel still awaits the kill and ends in a result; otherwise
                # the error is raised below.
                stream_error = exc
                stream = None
            if stream is not None:
                with run.lock:
                    run.stream = stream
                    aborted = run.abort_token.cancelled
                if aborted:
                    stream.abort()
                with stream:
                    try:
                        skipping = False
                        for ev in stream:
                            if isinstance(ev, StartEvent):
                                run.pid = ev.pid
                                if on_start is not None:
                                    on_start(ev.pid)
                            elif isinstance(ev, DataEvent):
                                if ev.stdout:
                                    kept = budget.add_stdout(ev.stdout)
                                    if live_out is not None:
                                        live_out.feed(kept)
                                if ev.stderr:
                                    kept = budget.add_stderr(ev.stderr)
                                    if live_err is not None:
                                        live_err.feed(kept)
                                if budget.truncated and not skipping:
                                    # Full, and known to be truncated: later output cannot
                                    # change the result, so it is dropped unparsed.
                                    stream.skip_output()
                                    skipping = True
                            elif isinstance(ev, EndEvent):
                                exit_code = ev.exit_code
                                run.ended = True
                                with run.lock:
                                    if run.esc.state is esc_mod.State.RUNNING:
                                        # The process has exited: its status is the result.
                                        # A deadline or cancel from now on (before the
                                        # stream closes) changes nothing and kills nothing.
                                        run.esc.on_stream_end()
                    except E2BProviderError as exc:
                        stream_error = exc
        except KeyboardInterrupt:
            _interrupted(run, feed, _submit_kill, _abort, interrupt_kill_seconds, has_killer)
            raise
        except _CallbackFailed as failed:
            _interrupted(run, feed, _submit_kill, _abort, interrupt_kill_seconds, has_killer)
            raise failed.error from None

        # The stream has ended (or was dropped). Let a kill in flight finish first, as the
        # reference awaits it: a kill that fails now still marks the sandbox wedged.
        # The wait ends with the kill's bound counted from its submission, so a kill that
        # is queued or hung delays the result by no more than that bound; without a verdict
        # by then the run is not wedged (the kill may still run later: it acts only on this
        # command's own control path, marker and envd tag).
        with run.lock:
            fut = run.kill_future
            kill_deadline = run.kill_deadline
        if fut is not None:
            try:
                finished, ok = wait_verdict(
                    fut, kill_deadline or Deadline.after(kill_seconds + 1.0, watchdog.clock)
                )
            except KeyboardInterrupt:
                _interrupted(run, feed, _submit_kill, _abort, interrupt_kill_seconds, has_killer)
                raise
            feed(lambda: run.esc.on_kill_done(ok) if finished else run.esc.on_kill_overdue())
        if run.esc.unconfirmed:
            log.warning(
                "e2b_provider: a command that was stopped (timeout or cancel) was not confirmed "
                "stopped in time; it may still be running until its in-sandbox timeout"
            )
        with run.lock:
            actions = run.esc.on_stream_end()
        wedged = any(isinstance(a, esc_mod.Reboot) for a in actions) or run.esc.wedged
    finally:
        unregister()
        for t in run.timers:
            t.cancel()

    if wedged and on_wedged is not None:
        on_wedged()

    timed_out = run.esc.timed_out
    cancelled = run.esc.cancelled
    if not (timed_out or cancelled):
        if not run.ended:
            if stream_error is not None:
                raise stream_error
            raise ProtocolError("E2B process stream ended without an exit status")
        if stream_error is not None:
            # The end event is the result: the process has exited, whatever happened to the
            # stream after it (a caller told "failed" might run the command again).
            log.info("e2b_provider: the process stream failed after its exit status: %s",
                     stream_error)
    try:
        for live in (live_out, live_err):
            if live is not None:
                live.finish(budget.truncated)
    except _CallbackFailed as failed:
        raise failed.error from None
    return RunOutcome(
        exit_code=None if (timed_out or cancelled) else exit_code,
        stdout=budget.stdout_bytes,
        stderr=budget.stderr_bytes,
        truncated=budget.truncated,
        timed_out=timed_out,
        cancelled=cancelled,
        wedged=wedged,
        pid=run.pid,
        exited=exit_code if run.ended else None,
    )


def _interrupted(
    run: _Run,
    feed: Callable[[Callable[[], Sequence[object]]], None],
    submit_kill: Callable[[float], None],
    abort: Callable[[], None],
    bound: float,
    has_killer: bool,
) -> None:
    """Ctrl-C: kill the remote command within ``bound`` seconds, then let the KI propagate.

    A second Ctrl-C abandons the cleanup (logged: the command may still be running).
    """
    with run.lock:
        actions = run.esc.on_interrupt()
        fut = run.kill_future
    try:
        if has_killer:
            if fut is None and any(isinstance(a, esc_mod.KillInline) for a in actions):
                submit_kill(bound)
                with run.lock:
                    fut = run.kill_future
            if fut is not None:
                _, ok = wait_verdict(fut, Deadline.after(bound))
                if not ok:
                    log.warning(
                        "e2b_provider: interrupted; the remote command could not be confirmed "
                        "stopped within %.0f s and may still be running",
                        bound,
                    )
    except KeyboardInterrupt:
        log.warning(
            "e2b_provider: second interrupt; abandoning cleanup, the remote command may "
            "still be running"
        )
    finally:
        abort()
