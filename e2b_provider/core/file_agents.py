"""The file agent: one request server per sandbox, run by this provider as ``sandbox``.

This module owns :class:`FileAgents`, the provider's sessions with the file agent
(:mod:`e2b_provider.sandbox_side.file_agent`), one per sandbox, started on demand: a
``python3`` process the provider starts in a sandbox, as the ``sandbox`` user, that answers
file requests (stat, read, atomic write, batches, listings) without starting a program per
request. A warm file call costs what the SDK's ``/files`` call costs, while every access is
checked with the sandbox user's own credentials (envd's ``/files`` reads and writes as
root). One session, its requests and their withdrawal are
:class:`~e2b_provider.core.agent_session.AgentSession`'s.

A call whose session ended under it (the agent exited after :data:`AGENT_IDLE_SECONDS`
without a request, or was killed by ``kill_all``, or its stream broke: a pause cuts it)
starts a new agent and sends its request again (every request is idempotent: a write
writes the same bytes). A session that ends any other way, or with the provider's
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
from typing import Any, Dict, List, Optional, Tuple

from ..cancel import WAIT_SLICE_SECONDS, CancelReason, CancelToken, Deadline
from ..clients.envd_streams import ProcessStream
from ..errors import (
    Cancelled,
    E2BProviderError,
    OperationTimeout,
    ProtocolError,
)
from ..models import Target
from ..protocol import scripts as scripts
from ..protocol.agent_frames import AGENT_VERSION, FrameDecoder
from ..protocol.process_events import DataEvent, EndEvent, StartEvent, exit_code_of
from ..protocol.scripts import NO_PYTHON_STATUSES
from ..sandbox_side import source
from .agent_session import (
    GOODBYE_SECONDS,
    STDERR_KEPT,
    WRITES,
    AgentAnswer,
    AgentLost,
    AgentSession,
)
from .context import MAX_REMEMBERED_SANDBOXES, ProviderContext

__all__ = [
    "AGENT_IDLE_SECONDS",
    "AGENT_READY_SECONDS",
    "AGENT_TAG_PREFIX",
    "MAX_INLINE_FILE",
    "MAX_PAYLOAD",
    "AgentUnavailable",
    "FileAgents",
]

log = logging.getLogger("e2b_provider")

#: The agent exits after this many seconds without a request (so the agent of a provider
#: that was killed stays at most this long).
AGENT_IDLE_SECONDS = 60
#: How long an agent may take to say it is ready.
AGENT_READY_SECONDS = 30.0
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


class AgentUnavailable(Exception):
    """The sandbox cannot run the file agent (no ``python3``, say); use the scripts."""


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
            if attempt == 2 and op in WRITES:
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
        it exits once its work is done), all at once, within :data:`GOODBYE_SECONDS` seconds
        in all (an agent not told in time exits once idle). An agent still starting is
        waited for within the same bound and told to leave as it becomes ready."""
        self._after_fork()
        bound = Deadline.after(GOODBYE_SECONDS)
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
                return fut.result(timeout=min(WAIT_SLICE_SECONDS, left))
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
                while len(self._unavailable) > MAX_REMEMBERED_SANDBOXES:
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
            while len(self._sessions) > MAX_REMEMBERED_SANDBOXES:
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
                args=["-I", "-S", "-X", "utf8", "-c", scripts.PYTHON_BOOT, "serve",
                      str(AGENT_IDLE_SECONDS), tag],
                envs={scripts.PROGRAM_VAR: source("file_agent")},
                cwd="/",
                keepalive_seconds=ctx.bounds.keepalive,
                cancel=guard,
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
                    if ev.stderr and len(stderr) < STDERR_KEPT:
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
                    if code in NO_PYTHON_STATUSES:
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
