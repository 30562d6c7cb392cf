"""The file agent: one request server per sandbox, run by this provider as ``sandbox``.

This module owns :class:`FileAgents`, the provider's sessions with the file agent
(:mod:`e2b_provider.sandbox_side.file_agent`), one per sandbox, started on demand: a
``python3`` process the provider starts in a sandbox, as the ``sandbox`` user, that answers
file requests (stat, read, atomic write, batches, listings) without starting a program per
request. A warm file call costs what the SDK's ``/files`` call costs, while every access is
checked with the sandbox user's own credentials (envd's ``/files`` reads and writes as
root). One session, its requests and their withdrawal are
:class:`~e2b_provider.core.agent_session.AgentSession`'s.

The first call that needs the agent starts it carrying its request (in the agent's
environment, :data:`CARRIED_ENV`, up to :data:`MAX_CARRIED` bytes): one ``Start`` for
both, no ``SendInput``. A call that can do without it (a single read, write or stat takes a
one-off script) starts it in the background once its script is done, so that a starting
``python3`` never slows the script the caller waits for.

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

import base64
import collections
import concurrent.futures
import functools
import logging
import os
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Set, Tuple

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
from ..protocol.agent_frames import AGENT_VERSION, FrameDecoder, encode_request
from ..protocol.boot import PACKED_BOOT, PROGRAM_VAR
from ..protocol.process_events import DataEvent, EndEvent, StartEvent, exit_code_of
from ..protocol.scripts import NO_PYTHON_STATUSES
from ..sandbox_side import pack, source
from .agent_session import (
    CARRIED_ID,
    GOODBYE_SECONDS,
    STDERR_KEPT,
    WRITES,
    AgentAnswer,
    AgentLost,
    AgentSession,
    retire_agent,
)
from .context import MAX_REMEMBERED_SANDBOXES, ProviderContext

__all__ = [
    "AGENT_IDLE_SECONDS",
    "AGENT_READY_SECONDS",
    "AGENT_TAG_PREFIX",
    "CARRIED_ENV",
    "MAX_CARRIED",
    "MAX_INLINE_FILE",
    "MAX_PAYLOAD",
    "AgentUnavailable",
    "FileAgents",
    "agent_envs",
    "serve_program",
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
#: The environment variable that carries, base64, the request an agent is started with: the
#: call that finds no agent running starts one carrying its request, one round trip for
#: both (the agent serves it as if it had come first on its standard input).
CARRIED_ENV = "CAPYBARA_FIRST_REQUEST"
#: The largest request carried so (encoded, with its payload): base64, with its name, it
#: stays under Linux's 128 KiB for one environment string. A larger first request is sent
#: once the agent is ready.
MAX_CARRIED = 64 << 10


#: The file agent's tar part: from the first mark up to the second (its ``main``). Its serve
#: mode needs none of it, so the program an agent is started with leaves it out: less text
#: for the sandbox's ``python3`` to compile at every start (about 40 % of it).
_TAR_PART = ("\n# -- tar streams ---", "\ndef main(argv")


@functools.lru_cache(maxsize=1)
def serve_program() -> str:
    """The text of :mod:`~e2b_provider.sandbox_side.file_agent` without its tar part (see
    :data:`_TAR_PART`), packed (``sandbox_side.pack``): what the provider's agents run
    (``serve`` mode only)."""
    text = source("file_agent")
    start, end = text.find(_TAR_PART[0]), text.find(_TAR_PART[1])
    if start >= 0 and end >= start:
        text = text[:start] + text[end:]
    return pack(text)


def agent_envs(first: Optional[bytes]) -> Dict[str, str]:
    """The environment an agent starts with: its program (which takes it out of its
    environment first, see :data:`~e2b_provider.protocol.boot.PROGRAM_VAR`) and, when
    given, the request it carries (:data:`CARRIED_ENV`)."""
    envs = {PROGRAM_VAR: serve_program()}
    if first is not None:
        envs[CARRIED_ENV] = base64.b64encode(first).decode("ascii")
    return envs


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
        #: retirements of agents whose start was given up (close() waits for them)
        self._retiring: Set[concurrent.futures.Future[None]] = set()
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
            self._retiring.clear()

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

    def ready(self, sid: str, start: bool = True) -> Optional[AgentSession]:
        """The sandbox's running session, or None; with none, and ``start``, one is started
        in the background (unless the sandbox cannot run it), for the calls that follow.

        A call that takes a script when no agent runs asks with ``start=False``, and again
        once its script is done: an agent starting beside the script (a ``python3`` reading
        its program) would slow the script the call waits for."""
        with self._lock:
            s = self._sessions.get(sid)
            if s is not None and not s.ended:
                return s
            if sid in self._starting or not start:
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
        first: Optional[bytes] = None
        if len(payload) <= MAX_CARRIED:
            first = encode_request(CARRIED_ID, op, fields, payload)
            if len(first) > MAX_CARRIED:
                first = None
        for attempt in (1, 2):
            if attempt == 2 and op in WRITES:
                cancel = None
            session, carried = self._session(sid, deadline, cancel, first)
            try:
                return session.call(op, fields, payload, deadline=deadline, cancel=cancel,
                                    carried=carried)
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
        waited for within the same bound and told to leave as it becomes ready; the running
        ones are told first, so a start that does not end never keeps them waiting."""
        self._after_fork()
        bound = Deadline.after(GOODBYE_SECONDS)
        with self._lock:
            self._closed = True
            sessions = list(self._sessions.values())
            self._sessions.clear()
            starting: List[concurrent.futures.Future[Any]] = list(self._starting.values())
            pending: List[concurrent.futures.Future[Any]] = list(self._retiring)
        for s in sessions:
            s.end("the provider was closed")
            try:
                pending.append(self._ctx.watchdog.submit(s.goodbye))
            except RuntimeError:  # no pool: said inline, briefly
                s.goodbye(timeout=1.0)
        # each start that ends from now on says goodbye itself (_launch), or is retired
        concurrent.futures.wait(starting + pending, timeout=max(0.0, bound.remaining()))
        with self._lock:  # and the retirements of starts given up meanwhile
            retiring = [f for f in self._retiring if f not in pending]
        if retiring:
            concurrent.futures.wait(retiring, timeout=max(0.0, bound.remaining()))

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
        self,
        sid: str,
        deadline: Deadline,
        cancel: Optional[CancelToken],
        first: Optional[bytes] = None,
    ) -> Tuple[AgentSession, bool]:
        """The sandbox's session, started on this thread if there is none (carrying
        ``first``, the encoded request of id :data:`CARRIED_ID`, when given); and whether
        it was started carrying it (the caller then waits for its answer, never sends it)."""
        why = self.unavailable(sid)
        if why is not None:
            raise AgentUnavailable(why)
        fut, carried = self._start(sid, background=False, first=first)
        while True:
            if cancel is not None and cancel.cancelled:
                raise Cancelled(cancel.reason)
            left = deadline.remaining()
            if left <= 0:
                raise OperationTimeout("the file agent did not start within the bound")
            try:
                return fut.result(timeout=min(WAIT_SLICE_SECONDS, left)), carried
            except concurrent.futures.TimeoutError:
                continue

    def _start(
        self, sid: str, *, background: bool, first: Optional[bytes] = None
    ) -> Tuple[concurrent.futures.Future[AgentSession], bool]:
        """The future of the sandbox's session: a running one, one being started, or a new
        start (on the worker pool when ``background``, else on this thread, carrying
        ``first`` if given); and whether it is a new start that carries ``first``."""
        with self._lock:
            s = self._sessions.get(sid)
            if s is not None and not s.ended:
                done: concurrent.futures.Future[AgentSession] = concurrent.futures.Future()
                done.set_result(s)
                return done, False
            fut = self._starting.get(sid)
            if fut is not None:
                return fut, False
            fut = concurrent.futures.Future()
            if self._closed:
                fut.set_exception(AgentUnavailable("the provider is closing"))
                return fut, False
            self._starting[sid] = fut
        if background:
            try:
                self._ctx.watchdog.submit(self._launch, sid, fut)
            except RuntimeError:  # no pool (closing)
                with self._lock:
                    self._starting.pop(sid, None)
                fut.set_exception(AgentUnavailable("the provider is closing"))
            return fut, False
        self._launch(sid, fut, first)
        return fut, first is not None

    def _launch(
        self,
        sid: str,
        fut: concurrent.futures.Future[AgentSession],
        first: Optional[bytes] = None,
    ) -> None:
        try:
            session = self._ctx.on_target(
                sid, None, lambda t: self._boot(sid, t, first), need=AGENT_READY_SECONDS
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

    def _boot(self, sid: str, target: Target, first: Optional[bytes] = None) -> AgentSession:
        """Start the agent in ``target`` and read its stream up to the ready frame;
        ``first``: the request it is started with (in its environment, which only the
        sandbox user and root can read), served as if it had come first on its input."""
        ctx = self._ctx
        tag = AGENT_TAG_PREFIX + uuid.uuid4().hex
        guard = CancelToken()

        def expire() -> None:
            guard.cancel(CancelReason("deadline", "agent start"))

        timer = ctx.watchdog.call_later(AGENT_READY_SECONDS, expire)
        stream: Optional[ProcessStream] = None
        pid: Optional[int] = None
        started = False  # envd answered the start with the agent's stream
        ended = False  # the agent's end event came: nothing of it is left to retire
        try:
            stream = ctx.envd(target).start(
                user=scripts.SANDBOX_USER,
                cmd="python3",
                args=["-I", "-S", "-X", "utf8", "-c", PACKED_BOOT, "serve",
                      str(AGENT_IDLE_SECONDS), tag],
                envs=agent_envs(first),
                cwd="/",
                keepalive_seconds=ctx.bounds.keepalive,
                cancel=guard,
                tag=tag,
                stdin=True,
            )
            started = True
            opened = stream
            guard.on_cancel(lambda _r: opened.abort())
            events = iter(stream)
            decoder = FrameDecoder()
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
                        session = AgentSession(ctx, sid, stream, events, decoder, pid, tag,
                                               carried=first is not None, early=frames[1:])
                        stream = None  # the session owns it now
                        return session
                elif isinstance(ev, EndEvent):
                    ended = True
                    code = exit_code_of(ev)
                    text = stderr.decode("utf-8", "replace").strip()[-300:]
                    if code in NO_PYTHON_STATUSES:
                        raise AgentUnavailable("it has no python3")
                    raise AgentUnavailable(
                        f"the file agent exited at once (status {code}): {text or 'no message'}"
                    )
            raise ProtocolError("the file agent's stream ended before it was ready")
        except BaseException as exc:
            # Given up once envd may have started it (interrupted, too slow, not as
            # expected): the agent may run on, so it is retired from the worker pool
            # (close() waits for that within its bound).
            if not ended and (started or not isinstance(exc, Exception)):
                self._retire_later(sid, pid or 0, tag)
            if isinstance(exc, E2BProviderError) and guard.cancelled:
                raise OperationTimeout(
                    f"the file agent did not start within {AGENT_READY_SECONDS:.0f} s"
                ) from None
            raise
        finally:
            timer.cancel()
            if stream is not None:
                stream.abort()
                stream.close()

    def _retire_later(self, sid: str, pid: int, tag: str) -> None:
        """Retire the agent ``pid`` (0: not known) named ``tag`` from the worker pool."""
        try:
            fut = self._ctx.watchdog.submit(retire_agent, self._ctx, sid, pid, tag)
        except RuntimeError:  # no pool: it exits once idle
            return
        with self._lock:
            self._retiring.add(fut)
        fut.add_done_callback(self._retired)

    def _retired(self, fut: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._retiring.discard(fut)
