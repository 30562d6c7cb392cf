"""The file agent: one request server per sandbox, run by this provider as ``sandbox``.

This module owns :class:`FileAgents`, the provider's sessions with the file agent
(:mod:`e2b_provider.sandbox_side.file_agent`): a ``python3`` process the provider starts in a
sandbox, as the ``sandbox`` user, that answers file requests (stat, read, atomic write,
batches, listings) without starting a program per request. A request travels as one
``process.Process/SendInput`` (one round trip); its answer comes back on the agent's
output stream, which the provider holds open from the ``Start`` that launched it. So a warm
file call costs what the SDK's ``/files`` call costs, while every access is checked with the
sandbox user's own credentials (envd's ``/files`` reads and writes as root).

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
its cancel says: it may have been done before the agent was killed, and ends done. The
calls do the same when the agent exits (after
:data:`AGENT_IDLE_SECONDS` without a request, or killed by ``kill_all``) or its stream
breaks (a pause cuts it), and a session that ends any other way, or with the provider's
``close()``, tells its agent to leave (its standard input is closed: it exits once its
work is done). So what stays in a sandbox is the agent of a provider that is open and used
it within the last :data:`AGENT_IDLE_SECONDS`, or of one killed within that time.

A sandbox that cannot run the agent (no ``python3``) is remembered for
:data:`UNAVAILABLE_SECONDS`; the callers then take the per-operation scripts instead.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import threading
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple

import attrs

from .._watchdog import TimerHandle
from ..cancel import CancelReason, CancelToken, Deadline
from ..clients.envd import ProcessStream
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
from ..protocol.agent_frames import AGENT_VERSION, Frame, FrameDecoder, encode_request
from ..protocol.process_events import DataEvent, EndEvent, ProcessEvent, StartEvent, exit_code_of
from ..sandbox_side import source
from .context import ProviderContext
from .run_engine import run_process

__all__ = [
    "AGENT_IDLE_SECONDS",
    "AGENT_READY_SECONDS",
    "AGENT_SILENCE_SECONDS",
    "AGENT_TAG_PREFIX",
    "MAX_INLINE_FILE",
    "MAX_PAYLOAD",
    "WITHDRAW_SECONDS",
    "AgentAnswer",
    "AgentLost",
    "AgentUnavailable",
    "FileAgents",
]

log = logging.getLogger("e2b_provider")

#: The agent exits after this many seconds without a request (so the agent of a provider
#: that was killed stays at most this long).
AGENT_IDLE_SECONDS = 60
#: How long an agent may take to say it is ready.
AGENT_READY_SECONDS = 30.0
#: An agent that writes nothing for this long while an answer is awaited is taken as hung
#: (stopped, say): its session ends, the calls go to a new agent, and it is killed.
AGENT_SILENCE_SECONDS = 30.0
#: How long the agent may take to answer a withdrawn request (it reads a withdrawal as it
#: comes and its requests stop at their next step, so a healthy one answers in a round
#: trip): past it the agent counts as hung and is retired.
WITHDRAW_SECONDS = 5.0
#: How long a sandbox that could not run the agent is left to the scripts.
UNAVAILABLE_SECONDS = 300.0
#: envd tag of an agent process: this prefix, then 32 hex digits.
AGENT_TAG_PREFIX = "capybara-files-"
#: The largest payload one request carries (a batch larger than this is split).
MAX_PAYLOAD = 1 << 20
#: The largest file sent inside a request: a larger one goes through envd's ``/files``,
#: which moves bulk bytes faster than a request's JSON (base64) body, at one more round
#: trip (on a 20 ms link a 1 MiB write is quicker inside a request; on loopback the two
#: are about even at 1 MiB).
MAX_INLINE_FILE = 1 << 20
#: Sandboxes whose sessions or unavailability are remembered at most.
_MAX_REMEMBERED = 1024
#: Slice of every wait, so Ctrl-C and cancels stay responsive.
_SLICE_S = 0.25
#: Standard error kept from an agent, for messages.
_STDERR_KEPT = 4096
#: Exit statuses that say the sandbox has no usable ``python3`` (not found, not runnable).
_NO_PYTHON = (126, 127)
#: How long a session's goodbye (closing the agent's input) may take.
_GOODBYE_S = 5.0
#: How long sending a withdrawal may take.
_WITHDRAW_S = 5.0
#: Requests that replace files: one whose outcome was lost is sent again, whatever its
#: cancel says (the same bytes written again), so that it never ends as "cancelled" with
#: its new content in place.
_WRITES = ("write", "write_many")


class AgentUnavailable(Exception):
    """The sandbox cannot run the file agent (no ``python3``, say); use the scripts."""


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
        self._ended: Optional[str] = None
        #: The agent wrote nothing for AGENT_SILENCE_SECONDS while it was waited for.
        self.hung = False
        self._stderr = bytearray()

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
    ) -> AgentAnswer:
        """Send one request and wait for its whole answer.

        Raises:
            AgentLost: the session ended first (send it again to a new agent).
            Cancelled: ``cancel`` fired.
            OperationTimeout: ``deadline`` passed.
            E2BProviderError: sending failed (transport, envd).
        """
        with self._lock:
            if self._ended is not None:
                raise AgentLost(self._ended)
            rid = self._next
            self._next += 1
            call = _Call(rid)
            self._calls[rid] = call
        try:
            writes = op in _WRITES
            try:
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
                self.pid, data, token=cancel, timeout=max(0.5, min(30.0, deadline.remaining()))
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
                        self._changed.wait(_SLICE_S)

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
            if ev.stderr and len(self._stderr) < _STDERR_KEPT:
                self._stderr += ev.stderr[: _STDERR_KEPT - len(self._stderr)]
            if not ev.stdout:
                return
            try:
                frames = self._decoder.feed(ev.stdout)
            except ProtocolError as exc:
                self.end(str(exc))
                return
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
        elif isinstance(ev, EndEvent):
            why = "the file agent exited"
            if self._stderr:
                why += ": " + self._stderr.decode("utf-8", "replace").strip()[-300:]
            self.end(why)

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
            self._ctx.envd(lease.target).send_input(self.pid, data, timeout=_WITHDRAW_S)
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
        ctx = self._ctx
        try:
            lease = ctx.leases.lease(self.sid)
            if lease is None:
                return
            run_process(
                ctx.envd(lease.target), user=scripts.SANDBOX_USER, cmd="/bin/sh",
                args=scripts.agent_retire_args(self.pid, self.tag), cwd="/", max_output_bytes=4096,
                timeout=ctx.bounds.kill, token=None, watchdog=ctx.watchdog,
                keepalive_seconds=ctx.bounds.keepalive,
            )
        except E2BProviderError as exc:
            log.warning("e2b_provider: could not retire the file agent in sandbox %s: %s",
                        self.sid, exc)

    def _retire_later(self, why: str) -> None:
        self.end(why)
        try:
            self._ctx.watchdog.submit(self.retire, why)
        except RuntimeError:
            pass

    def goodbye(self, timeout: float = _GOODBYE_S) -> None:
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


class FileAgents:
    """The provider's file agents, one per sandbox (started on demand).

    Args:
        ctx: the provider's shared state.
    """

    def __init__(self, ctx: ProviderContext) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._sessions: collections.OrderedDict[str, AgentSession] = collections.OrderedDict()
        self._starting: Dict[str, concurrent.futures.Future[AgentSession]] = {}
        self._unavailable: collections.OrderedDict[str, Tuple[float, str]] = (
            collections.OrderedDict()
        )
        self._pid = os.getpid()
        #: close() ran: an agent that finishes starting from now on is told to leave.
        self._closed = False
        ctx.on_fork(self._after_fork)

    def _after_fork(self) -> None:
        # The parent's streams are the parent's: drop them unread, never shut them down
        # (their sockets are shared with the parent).
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._sessions.clear()
            self._starting.clear()

    def unavailable(self, sid: str) -> Optional[str]:
        """Why the sandbox cannot run the agent, if it was found so lately."""
        with self._lock:
            seen = self._unavailable.get(sid)
            if seen is None:
                return None
            if time.monotonic() - seen[0] > UNAVAILABLE_SECONDS:
                del self._unavailable[sid]
                return None
            return seen[1]

    def ready(self, sid: str) -> Optional[AgentSession]:
        """The sandbox's running session, or None; with none, one is started in the
        background (unless the sandbox cannot run it), for the calls that follow."""
        with self._lock:
            s = self._sessions.get(sid)
            if s is not None and not s.ended:
                return s
            if sid in self._starting:
                return None
        if self.unavailable(sid) is None:
            self._start(sid, background=True)
        return None

    def call(
        self,
        sid: str,
        op: str,
        fields: Dict[str, Any],
        payload: bytes = b"",
        *,
        deadline: Deadline,
        cancel: Optional[CancelToken],
    ) -> AgentAnswer:
        """One request to the sandbox's agent (started now if needed), sent again once to a
        new agent if the session ended under it. A write is sent again whatever its cancel
        says (the first may have been done, and the same bytes written again give the
        same files): it then ends done, or by its deadline.

        Raises:
            AgentUnavailable: the sandbox cannot run the agent.
            Cancelled, OperationTimeout, E2BProviderError.
        """
        for attempt in (1, 2):
            if attempt == 2 and op in _WRITES:
                cancel = None
            session = self._session(sid, deadline, cancel)
            try:
                return session.call(op, fields, payload, deadline=deadline, cancel=cancel)
            except AgentLost as exc:
                self._drop(sid, session)
                if attempt == 2:
                    raise ProtocolError(f"the file agent's session ended twice: {exc}") from exc
                log.info("e2b_provider: file agent session in sandbox %s ended (%s); "
                         "starting another", sid, exc)
        raise AssertionError("unreachable")

    def forget(self, sid: str) -> None:
        """Drop the sandbox's session (it was destroyed, paused or rebooted)."""
        self._after_fork()
        with self._lock:
            s = self._sessions.pop(sid, None)
            self._unavailable.pop(sid, None)
        if s is not None:
            s.end("the sandbox was stopped")

    def close(self) -> None:
        """End every session and tell each agent to leave (its standard input is closed:
        it exits once its work is done), all at once, within :data:`_GOODBYE_S` seconds
        in all (an agent not told in time exits once idle). An agent still starting is
        waited for within the same bound and told to leave as it becomes ready."""
        self._after_fork()
        bound = Deadline.after(_GOODBYE_S)
        with self._lock:
            self._closed = True
            sessions = list(self._sessions.values())
            self._sessions.clear()
            starting = list(self._starting.values())
        if starting:  # each start that ends from now on says goodbye itself (_launch)
            concurrent.futures.wait(starting, timeout=max(0.0, bound.remaining()))
        pending: List[concurrent.futures.Future[None]] = []
        for s in sessions:
            s.end("the provider was closed")
            try:
                pending.append(self._ctx.watchdog.submit(s.goodbye))
            except RuntimeError:  # no pool: said inline, briefly
                s.goodbye(timeout=1.0)
        if pending:
            concurrent.futures.wait(pending, timeout=max(0.0, bound.remaining()))

    def sessions(self) -> List[AgentSession]:
        """The running sessions (for tests and diagnostics)."""
        with self._lock:
            return [s for s in self._sessions.values() if not s.ended]

    # -- starting ---------------------------------------------------------------------------

    def _drop(self, sid: str, session: AgentSession) -> None:
        with self._lock:
            if self._sessions.get(sid) is session:
                del self._sessions[sid]
        session.end("replaced")
        try:
            self._ctx.watchdog.submit(session.goodbye)
        except RuntimeError:
            pass

    def _session(
        self, sid: str, deadline: Deadline, cancel: Optional[CancelToken]
    ) -> AgentSession:
        why = self.unavailable(sid)
        if why is not None:
            raise AgentUnavailable(why)
        fut = self._start(sid, background=False)
        while True:
            if cancel is not None and cancel.cancelled:
                raise Cancelled(cancel.reason)
            left = deadline.remaining()
            if left <= 0:
                raise OperationTimeout("the file agent did not start within the bound")
            try:
                return fut.result(timeout=min(_SLICE_S, left))
            except concurrent.futures.TimeoutError:
                continue

    def _start(self, sid: str, *, background: bool) -> concurrent.futures.Future[AgentSession]:
        """The future of the sandbox's session: a running one, one being started, or a new
        start (on the worker pool when ``background``, else on this thread)."""
        with self._lock:
            s = self._sessions.get(sid)
            if s is not None and not s.ended:
                done: concurrent.futures.Future[AgentSession] = concurrent.futures.Future()
                done.set_result(s)
                return done
            fut = self._starting.get(sid)
            if fut is not None:
                return fut
            fut = concurrent.futures.Future()
            if self._closed:
                fut.set_exception(AgentUnavailable("the provider is closing"))
                return fut
            self._starting[sid] = fut
        if background:
            try:
                self._ctx.watchdog.submit(self._launch, sid, fut)
            except RuntimeError:  # no pool (closing)
                with self._lock:
                    self._starting.pop(sid, None)
                fut.set_exception(AgentUnavailable("the provider is closing"))
        else:
            self._launch(sid, fut)
        return fut

    def _launch(self, sid: str, fut: concurrent.futures.Future[AgentSession]) -> None:
        try:
            session = self._ctx.on_target(
                sid, None, lambda t: self._boot(sid, t), need=AGENT_READY_SECONDS
            )
        except AgentUnavailable as exc:
            with self._lock:
                self._unavailable[sid] = (time.monotonic(), str(exc))
                while len(self._unavailable) > _MAX_REMEMBERED:
                    self._unavailable.popitem(last=False)
                self._starting.pop(sid, None)
            log.info("e2b_provider: sandbox %s cannot run the file agent (%s); using the "
                     "slower per-call scripts", sid, exc)
            fut.set_exception(exc)
            return
        except BaseException as exc:
            with self._lock:
                self._starting.pop(sid, None)
            fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        with self._lock:
            self._starting.pop(sid, None)
            closed = self._closed
            old = None if closed else self._sessions.pop(sid, None)
            if not closed:
                self._sessions[sid] = session
            while len(self._sessions) > _MAX_REMEMBERED:
                _, gone = self._sessions.popitem(last=False)
                gone.end("too many sessions")
        if old is not None:
            old.end("replaced")
        if closed:  # the provider closed while it started: it leaves at once
            session.end("the provider was closed")
            session.goodbye()
        fut.set_result(session)

    def _boot(self, sid: str, target: Target) -> AgentSession:
        """Start the agent in ``target`` and read its stream up to the ready frame."""
        ctx = self._ctx
        tag = AGENT_TAG_PREFIX + uuid.uuid4().hex
        guard = CancelToken()

        def expire() -> None:
            guard.cancel(CancelReason("deadline", "agent start"))

        timer = ctx.watchdog.call_later(AGENT_READY_SECONDS, expire)
        stream: Optional[ProcessStream] = None
        try:
            stream = ctx.envd(target).start(
                user=scripts.SANDBOX_USER,
                cmd="python3",
                args=["-I", "-S", "-X", "utf8", "-c", source("file_agent"), "serve",
                      str(AGENT_IDLE_SECONDS), tag],
                cwd="/",
                keepalive_seconds=ctx.bounds.keepalive,
                token=guard,
                tag=tag,
                stdin=True,
            )
            opened = stream
            guard.on_cancel(lambda _r: opened.abort())
            events = iter(stream)
            decoder = FrameDecoder()
            pid: Optional[int] = None
            stderr = bytearray()
            for ev in events:
                if isinstance(ev, StartEvent):
                    pid = ev.pid
                elif isinstance(ev, DataEvent):
                    if ev.stderr and len(stderr) < _STDERR_KEPT:
                        stderr += ev.stderr
                    frames = decoder.feed(ev.stdout) if ev.stdout else []
                    if frames:
                        ready = frames[0].answer
                        if (
                            frames[0].id != 0
                            or ready.get("ready") is not True
                            or ready.get("version") != AGENT_VERSION
                            or pid is None
                        ):
                            raise ProtocolError(
                                "the file agent did not say it was ready as expected"
                            )
                        session = AgentSession(ctx, sid, stream, events, decoder, pid, tag)
                        stream = None  # the session owns it now
                        return session
                elif isinstance(ev, EndEvent):
                    code = exit_code_of(ev)
                    text = stderr.decode("utf-8", "replace").strip()[-300:]
                    if code in _NO_PYTHON:
                        raise AgentUnavailable("it has no python3")
                    raise AgentUnavailable(
                        f"the file agent exited at once (status {code}): {text or 'no message'}"
                    )
            raise ProtocolError("the file agent's stream ended before it was ready")
        except E2BProviderError:
            if guard.cancelled:
                raise OperationTimeout(
                    f"the file agent did not start within {AGENT_READY_SECONDS:.0f} s"
                ) from None
            raise
        finally:
            timer.cancel()
            if stream is not None:
                stream.abort()
                stream.close()
