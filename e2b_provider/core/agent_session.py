"""One session with a sandbox's file agent: its requests, their answers, their withdrawal.

This module owns :class:`AgentSession`, one running file agent
(:mod:`e2b_provider.sandbox_side.file_agent`) and the stream its answers come on, held open
from the ``Start`` that launched it: a request travels as one ``process.Process/SendInput``
(one round trip) and its answer comes back on that stream. The call that finds no agent
running starts one carrying its request (:data:`CARRIED_ID`), whose answer comes the same
way: one round trip for the start and the request.
:class:`~e2b_provider.core.file_agents.FileAgents` starts the sessions and keeps one per
sandbox.

Threads: none of its own. Whichever caller is waiting reads the stream for everybody
("leader"); the others wait for their answer or their turn.

A call stopped by its cancel, its deadline or Ctrl-C withdraws its request: one more
``SendInput`` (``cancel``) that the agent handles as it reads it, answering the request
``{"cancelled": true}`` unless it had already taken effect (a write's rename and the cancel
exclude each other). The call waits for that answer (at most :data:`WITHDRAW_SECONDS`), so
a cancelled write is either not done, and the call says so, or done, and the call returns
as if no cancel had come; the session and its agent go on serving the others. An agent
that does not answer in that time (stopped, hung) is retired: its session ends, the agent
is killed and the temporary files it registered are removed before the call returns; the
calls still waiting start a new agent and send their request again (every request is
idempotent: a write writes the same bytes). So does the withdrawn write itself, whatever
its cancel says: it may have been done before the agent was killed, and ends done. An
agent that writes nothing for :data:`AGENT_SILENCE_SECONDS` while it is waited for is
taken as hung and retired too.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import attrs

from .._watchdog import TimerHandle
from ..cancel import WAIT_SLICE_SECONDS, CancelToken, Deadline
from ..clients.envd_streams import ProcessStream
from ..errors import (
    Cancelled,
    E2BHttpError,
    E2BProviderError,
    NotFound,
    OperationTimeout,
    ProtocolError,
)
from ..models import Target
from ..protocol import scripts as scripts
from ..protocol.agent_frames import Frame, FrameDecoder, encode_request
from ..protocol.process_events import DataEvent, EndEvent, ProcessEvent
from .context import ProviderContext
from .run_engine import run_process

__all__ = [
    "AGENT_SILENCE_SECONDS",
    "CARRIED_ID",
    "GOODBYE_SECONDS",
    "STDERR_KEPT",
    "WITHDRAW_SECONDS",
    "WRITES",
    "AgentAnswer",
    "AgentLost",
    "AgentSession",
    "retire_agent",
]

log = logging.getLogger("e2b_provider")

#: An agent that writes nothing for this long while an answer is awaited is taken as hung
#: (stopped, say): its session ends, the calls go to a new agent, and it is killed.
AGENT_SILENCE_SECONDS = 30.0
#: How long the agent may take to answer a withdrawn request (it reads a withdrawal as it
#: comes and its requests stop at their next step, so a healthy one answers in a round
#: trip): past it the agent counts as hung and is retired.
WITHDRAW_SECONDS = 5.0
#: The id of the request an agent is started with (see :class:`AgentSession`).
CARRIED_ID = 1
#: Standard error kept from an agent, for messages.
STDERR_KEPT = 4096
#: How long a session's goodbye (closing the agent's input) may take.
GOODBYE_SECONDS = 5.0
#: How long sending a withdrawal may take.
_WITHDRAW_SECONDS = 5.0
#: Requests that replace files: one whose outcome was lost is sent again, whatever its
#: cancel says (the same bytes written again), so that it never ends as "cancelled" with
#: its new content in place.
WRITES = ("write", "write_many")


class AgentLost(Exception):
    """The session ended under a call (the agent exited, the stream broke or was shut
    down); the call may be sent again to a new agent."""


@attrs.frozen
class AgentAnswer:
    """A whole answer: the frames before the last (``parts``) and the last one."""

    answer: Dict[str, Any]
    data: bytes
    parts: Tuple[Frame, ...] = ()


class _Call:
    __slots__ = ("done", "frames", "id", "withdrawn")

    def __init__(self, rid: int) -> None:
        self.id = rid
        self.frames: List[Frame] = []
        self.done = False
        #: The agent was told to drop it (see :meth:`AgentSession.withdraw`).
        self.withdrawn = False


class AgentSession:
    """One running agent and the stream its answers come on.

    Args:
        ctx: the provider's shared state.
        sid: the sandbox.
        stream: the agent's ``Start`` stream, read up to its ready frame.
        events: that stream's event iterator (the same one that was read so far).
        decoder: the frame decoder that read the ready frame.
        pid: the agent's process id.
        tag: its envd tag.
        carried: the agent was started carrying its first request (id
            :data:`CARRIED_ID`), whose answer comes on the stream like any other: the call
            that started it waits for it with ``call(..., carried=True)``.
        early: frames that came with the ready frame (the start of that answer).
    """

    def __init__(
        self,
        ctx: ProviderContext,
        sid: str,
        stream: ProcessStream,
        events: Iterator[ProcessEvent],
        decoder: FrameDecoder,
        pid: int,
        tag: str,
        *,
        carried: bool = False,
        early: Sequence[Frame] = (),
    ) -> None:
        self._ctx = ctx
        self.sid = sid
        self.pid = pid
        self.tag = tag
        self._stream = stream
        self._events = events
        self._decoder = decoder
        self._lock = threading.Lock()
        # taken as ``with self._lock``, never ``with self._changed``: a Condition's
        # ``__enter__`` is Python code, and a KeyboardInterrupt between its taking the lock and
        # the block would leave the lock held for good (as the watchdog's once was)
        self._changed = threading.Condition(self._lock)
        self._reader = threading.Lock()
        self._calls: Dict[int, _Call] = {}
        self._next = 1
        if carried:
            self._calls[CARRIED_ID] = _Call(CARRIED_ID)
            self._next = CARRIED_ID + 1
        self._ended: Optional[str] = None
        #: The agent wrote nothing for AGENT_SILENCE_SECONDS while it was waited for.
        self.hung = False
        self._stderr = bytearray()
        self._deliver(early)

    @property
    def ended(self) -> bool:
        """True once the session is over (a new agent is needed)."""
        return self._ended is not None

    def call(
        self,
        op: str,
        fields: Dict[str, Any],
        payload: bytes,
        *,
        deadline: Deadline,
        cancel: Optional[CancelToken],
        carried: bool = False,
    ) -> AgentAnswer:
        """Send one request and wait for its whole answer. ``carried``: the request is the
        one the agent was started with (see the class): it is not sent, only waited for
        (once).

        Raises:
            AgentLost: the session ended first (send it again to a new agent).
            Cancelled: ``cancel`` fired.
            OperationTimeout: ``deadline`` passed.
            E2BProviderError: sending failed (transport, envd).
        """
        with self._lock:
            if self._ended is not None:
                raise AgentLost(self._ended)
            if carried:
                call = self._calls.get(CARRIED_ID) or _Call(0)
                if call.id != CARRIED_ID:
                    raise ProtocolError("the file agent's first request was waited for twice")
                rid = CARRIED_ID
            else:
                rid = self._next
                self._next += 1
                call = _Call(rid)
                self._calls[rid] = call
        try:
            writes = op in WRITES
            try:
                if not carried:
                    self._send(encode_request(rid, op, fields, payload), deadline, cancel)
                answer = self._await(call, deadline, cancel)
            except (Cancelled, OperationTimeout) as stop:
                return self._withdrawn(call, stop, interrupted=False, writes=writes)
            except KeyboardInterrupt as stop:
                self._withdrawn(call, stop, interrupted=True)
                raise  # not reached: the interrupt is raised again above
            except AgentLost:
                stop2 = _stop_of(cancel, deadline)
                if stop2 is None or not call.withdrawn:
                    raise
                # withdrawn while this thread read the stream, and the agent did not
                # answer in time (the read was ended): it is retired, the call stopped; a
                # write may have been done, so it is lost (sent again), not stopped
                self.retire("the file agent did not drop a cancelled request in time")
                if writes:
                    raise AgentLost("the file agent did not drop a cancelled write") from None
                raise stop2 from None
            if answer.answer.get("cancelled") is True:
                # withdrawn while this thread read the stream (its cancel or deadline)
                raise _stop_of(cancel, deadline) or ProtocolError(
                    "the file agent dropped a request nobody withdrew")
            return answer
        finally:
            with self._lock:
                self._calls.pop(rid, None)

    def _withdrawn(
        self, call: _Call, stop: BaseException, *, interrupted: bool, writes: bool = False
    ) -> AgentAnswer:
        """After ``stop`` (a cancel, the deadline, Ctrl-C) ended the wait for ``call``: tell
        the agent to drop it and wait (bounded) for its last answer. Returns that answer
        when the request took effect before the cancel reached it (a write that was done);
        raises ``stop`` when it was dropped, after Ctrl-C in any case, and when the agent
        did not answer in time (it is then retired: killed, its temporary files removed;
        ``writes``: the request may have replaced files, so :class:`AgentLost` is raised
        instead, and the caller sends it again).
        A second Ctrl-C gives up waiting (the retirement goes on in the background)."""
        bounds = self._ctx.bounds
        grace = Deadline.after(
            min(WITHDRAW_SECONDS, bounds.interrupt_kill if interrupted else bounds.kill)
        )
        try:
            self.withdraw(call)
            try:
                got: Optional[AgentAnswer] = self._await(call, grace, None, settling=True)
            except (AgentLost, OperationTimeout):
                got = None
        except KeyboardInterrupt:
            log.warning("e2b_provider: second interrupt; not waiting for the file agent in "
                        "sandbox %s to drop a request", self.sid)
            self._retire_later("interrupted twice")
            raise stop from None
        if got is None:
            self.retire("the file agent did not drop a cancelled request in time")
            if writes and not interrupted:
                raise AgentLost("the file agent did not drop a cancelled write") from None
            raise stop
        if got.answer.get("cancelled") is True or interrupted:
            raise stop
        return got

    def _send(self, data: bytes, deadline: Deadline, cancel: Optional[CancelToken]) -> None:
        ctx = self._ctx
        left = deadline.remaining()
        if left <= 0:
            raise OperationTimeout("it did not finish within its bound")

        def send(target: Target) -> None:
            ctx.envd(target).send_input(
                self.pid, data, cancel=cancel, timeout=max(0.5, min(30.0, deadline.remaining()))
            )

        try:
            ctx.on_target(self.sid, cancel, send, need=min(left, 120.0))
        except E2BHttpError as exc:
            if not _agent_gone(exc):
                raise
            self.end(f"the file agent is gone ({exc})")
            raise AgentLost("the file agent is gone") from exc

    def _await(
        self,
        call: _Call,
        deadline: Deadline,
        cancel: Optional[CancelToken],
        *,
        settling: bool = False,
    ) -> AgentAnswer:
        """Wait for ``call``'s whole answer (leading the stream's reading when nobody
        does). ``settling``: it was withdrawn, and ``deadline`` is how long its last answer
        may take."""
        while True:
            with self._lock:
                if call.done:
                    *parts, last = call.frames
                    return AgentAnswer(last.answer, last.data, tuple(parts))
                if self._ended is not None:
                    raise AgentLost(self._ended)
            if not call.withdrawn:
                if cancel is not None and cancel.cancelled:
                    raise Cancelled(cancel.reason)
                if deadline.remaining() <= 0:
                    raise OperationTimeout("the file agent did not answer within the bound")
            elif settling and deadline.remaining() <= 0:
                raise OperationTimeout("the file agent did not drop a request in time")
            if self._reader.acquire(blocking=False):
                try:
                    self._lead(call, deadline, cancel, settling)
                finally:
                    self._reader.release()
                    with self._lock:
                        self._changed.notify_all()
            else:
                with self._lock:
                    if not call.done and self._ended is None:
                        self._changed.wait(WAIT_SLICE_SECONDS)

    def _lead(
        self, call: _Call, deadline: Deadline, cancel: Optional[CancelToken], settling: bool
    ) -> None:
        """Read the stream for everybody until ``call`` is answered or the session ends.

        A cancel or the deadline has ``call`` withdrawn (from the worker pool: this thread
        is blocked in the read), and the agent's answer to that wakes the read; if none
        comes within the kill bound (or by ``deadline`` when ``settling``), the stream is
        shut down, ending the session. So is it when the agent wrote nothing for
        :data:`AGENT_SILENCE_SECONDS` while it was waited for (stopped or hung: envd's
        keepalives still come, so the stream alone would not tell)."""
        stream = self._stream
        watchdog = self._ctx.watchdog
        grace: List[TimerHandle] = []

        def silent() -> None:
            self.hung = True
            stream.abort()

        def stop(_reason: object = None) -> None:
            if settling:
                silent()
                return
            try:
                watchdog.submit(self.withdraw, call)
                grace.append(watchdog.call_later(
                    min(WITHDRAW_SECONDS, self._ctx.bounds.kill), silent))
            except RuntimeError:  # no pool (closing): the read is ended instead
                stream.abort()

        unlink = cancel.on_cancel(stop) if cancel is not None and not settling else None
        timer = watchdog.call_later(max(0.0, deadline.remaining()), stop)
        quiet = watchdog.call_later(AGENT_SILENCE_SECONDS, silent)
        try:
            while True:
                with self._lock:
                    if call.done or self._ended is not None:
                        return
                try:
                    ev = next(self._events)
                except StopIteration:
                    self.end("the file agent's stream ended")
                    return
                except E2BProviderError as exc:
                    self.end(
                        "the file agent answered nothing in time" if self.hung
                        else f"the file agent's stream broke ({exc})"
                    )
                    return
                except BaseException:
                    self.end("interrupted while the file agent's stream was read")
                    raise
                if isinstance(ev, DataEvent) and ev.stdout:
                    quiet.cancel()
                    quiet = watchdog.call_later(AGENT_SILENCE_SECONDS, silent)
                self._take(ev)
        finally:
            if unlink is not None:
                unlink()
            timer.cancel()
            quiet.cancel()
            for t in grace:
                t.cancel()

    def _take(self, ev: ProcessEvent) -> None:
        if isinstance(ev, DataEvent):
            if ev.stderr and len(self._stderr) < STDERR_KEPT:
                self._stderr += ev.stderr[: STDERR_KEPT - len(self._stderr)]
            if not ev.stdout:
                return
            try:
                frames = self._decoder.feed(ev.stdout)
            except ProtocolError as exc:
                self.end(str(exc))
                return
            self._deliver(frames)
        elif isinstance(ev, EndEvent):
            why = "the file agent exited"
            if self._stderr:
                why += ": " + self._stderr.decode("utf-8", "replace").strip()[-300:]
            self.end(why)

    def _deliver(self, frames: Sequence[Frame]) -> None:
        """Hand each frame to the call it answers (and wake the waiting)."""
        if not frames:
            return
        with self._lock:
            for f in frames:
                c = self._calls.get(f.id)
                if c is None or c.done:
                    continue  # a call that gave up, or a stray frame
                c.frames.append(f)
                c.done = f.last
            self._changed.notify_all()

    def end(self, why: str) -> None:
        """End the session: every waiting call gets :class:`AgentLost`; the stream is
        shut down (the agent itself idles out, or is told to exit by :meth:`goodbye`)."""
        with self._lock:
            if self._ended is not None:
                return
            self._ended = why
            self._changed.notify_all()
        log.debug("e2b_provider: file agent session in sandbox %s ended: %s", self.sid, why)
        self._stream.abort()
        self._stream.close()

    def withdraw(self, call: _Call) -> None:
        """Tell the agent to drop ``call`` (once; bounded; a failure only ends the session
        when the agent is gone)."""
        with self._lock:
            if call.withdrawn or call.done or self._ended is not None:
                return
            call.withdrawn = True
            rid = self._next  # the withdrawal's own id (nothing answers it)
            self._next += 1
        data = encode_request(rid, "cancel", {"of": call.id})
        try:
            lease = self._ctx.leases.lease(self.sid)
            if lease is None:
                return
            self._ctx.envd(lease.target).send_input(self.pid, data, timeout=_WITHDRAW_SECONDS)
        except E2BHttpError as exc:
            if _agent_gone(exc):
                self.end(f"the file agent is gone ({exc})")
            else:
                log.info("e2b_provider: could not withdraw a file agent request in sandbox "
                         "%s: %s", self.sid, exc)
        except E2BProviderError as exc:
            log.info("e2b_provider: could not withdraw a file agent request in sandbox %s: "
                     "%s", self.sid, exc)

    def retire(self, why: str) -> None:
        """End the session, kill the agent and remove the temporary files it registered
        (bounded by the kill bound; best effort)."""
        self.end(why)
        retire_agent(self._ctx, self.sid, self.pid, self.tag)

    def _retire_later(self, why: str) -> None:
        self.end(why)
        try:
            self._ctx.watchdog.submit(self.retire, why)
        except RuntimeError:
            pass

    def goodbye(self, timeout: float = GOODBYE_SECONDS) -> None:
        """Close the agent's standard input, so it exits once its work is done; kill it
        if it was found hung. Best effort, bounded by ``timeout`` seconds."""
        ctx = self._ctx
        try:
            lease = ctx.leases.lease(self.sid)
            if lease is None:
                return
            envd = ctx.envd(lease.target)
            if self.hung:
                envd.send_signal(self.pid, timeout=timeout)
            else:
                envd.close_stdin(self.pid, timeout=timeout)
        except E2BProviderError as exc:
            log.debug("e2b_provider: could not retire a file agent: %s", exc)


def retire_agent(ctx: ProviderContext, sid: str, pid: int, tag: str) -> None:
    """Kill the file agent ``pid`` (0: not known, found by its ``tag``) and remove the
    temporary files it registered (bounded by the kill bound; best effort)."""
    try:
        lease = ctx.leases.lease(sid)
        if lease is None:
            return
        run_process(
            ctx.envd(lease.target), user=scripts.SANDBOX_USER, cmd="/bin/sh",
            args=scripts.agent_retire_args(pid, tag), cwd="/", max_output_bytes=4096,
            timeout=ctx.bounds.kill, cancel=None, watchdog=ctx.watchdog,
            keepalive_seconds=ctx.bounds.keepalive,
        )
    except E2BProviderError as exc:
        log.warning("e2b_provider: could not retire the file agent in sandbox %s: %s", sid, exc)


def _stop_of(
    cancel: Optional[CancelToken], deadline: Deadline
) -> Optional[E2BProviderError]:
    """What stopped a call: its cancel, else its deadline; None if neither."""
    if cancel is not None and cancel.cancelled:
        return Cancelled(cancel.reason)
    if deadline.remaining() <= 0:
        return OperationTimeout("the file agent did not answer within the bound")
    return None


def _agent_gone(exc: E2BHttpError) -> bool:
    """Whether envd's refusal of an input says the agent is gone: no such process (404),
    or its standard input is closed or broken (envd: 500 "error writing to stdin ...")."""
    if isinstance(exc, NotFound):
        return True
    text = exc.message.lower()
    return exc.status == 500 and "stdin" in text and (
        "broken pipe" in text or "closed" in text or "not enabled" in text
    )
