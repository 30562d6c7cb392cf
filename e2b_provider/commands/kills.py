"""Exec kills, batched per sandbox: one kill script stops every command that timed out.

This module owns :class:`KillBatcher`. When an exec times out, is cancelled or interrupted,
the exec engine asks for its kill here and gets a future at once (nothing blocks the caller
or the watchdog thread). Kills are queued per sandbox, and one batch per sandbox runs at a
time on the watchdog's bounded worker pool: it takes everything queued for that sandbox (up
to :data:`~e2b_provider.protocol.scripts.KILL_BATCH_MAX`), runs one kill script with all their
control paths (:data:`~e2b_provider.protocol.scripts.KILL_BATCH_SCRIPT`: the reference's tree kill
for each, then every process carrying one of their markers), resolves their verdicts, then SIGKILLs
through envd, by pid, the processes envd started for them that are still running (never by tag: envd
0.6.13's lookup by tag stops at the first process with another tag, so it misses whenever other
tagged processes run). So a burst of timeouts costs
one script per sandbox, not one per command, and no kill waits behind hundreds of others.

A pid is signalled only while it is still that command's process. An exec's probe says so
(its stream is read to its end, so its pid is given only while envd holds the process). A
kill queued with ``confirm`` (a terminal's: its handle may not have read the end that
came) has a probe that may be stale: once a process has ended, envd forgets it and its pid
may be given to any other (a sandbox user cycles the pid counter in minutes, and envd runs
as root); so its pid is signalled only while envd's ``List`` shows it with the kill's
control path as its tag, that is while envd still holds that very process (one ``List``
per batch for all such kills).

A kill's verdict is evidence about its own sandbox only:

* ``True``: the script ran and exited 0.
* ``False``: the script failed; or it started in the sandbox and did not finish within the
  kill bound (counted from its start there); or it did not start there within the bound
  while the sandbox answered no other request of this provider either (unresponsive). The
  sandbox counts as wedged, and the kills queued behind that batch for the same sandbox
  share its verdict (they would meet the same sandbox; the reboot stops them all).
* ``None``, no verdict: the provider was closed; or the sandbox was rebooted since the exec
  began (the reboot stopped it, and a pid file left from before must not be acted on: the
  pid may belong to a new process); or the script had not started after
  :data:`KILL_WAIT_CAP_SECONDS` seconds although the sandbox kept answering other requests (a
  sandbox busy with a backlog of our own requests is slow, not wedged).

A kill still waiting is never counted as failed: the exec engine stops waiting for a verdict
at its own bound, and the kill still runs.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from typing import Callable, Dict, List, Optional, Set, Tuple

import attrs

from .._watchdog import TimerHandle, Watchdog
from ..cancel import CancelReason, CancelToken
from ..clients.envd import EnvdClient
from ..core.context import ProviderContext
from ..core.run_engine import run_process
from ..errors import E2BProviderError
from ..models import Target
from ..protocol import scripts as scripts
from .users import ROOT_KILL_BATCH_SCRIPT

__all__ = ["KILL_WAIT_CAP_SECONDS", "KillBatcher"]

log = logging.getLogger("e2b_provider")

#: Seconds a batch waits at most for its script to start in a sandbox that keeps answering
#: other requests (beyond that: no verdict).
KILL_WAIT_CAP_SECONDS = 120.0
#: Read timeout of each SIGKILL by pid after the script.
SIGNAL_TIMEOUT_SECONDS = 5.0

#: ``rebooted_since(sandbox_id, t)``: True if a reboot of that sandbox began at or after
#: ``t`` (monotonic clock).
RebootedSince = Callable[[str, float], bool]

_Key = Tuple[str, str, str, str]


@attrs.define(eq=False)
class _Kill:
    """One exec's kill: control path, start time, bound, probe (its pid while it runs) and
    verdict."""

    ctl: str
    began: float
    bound: float
    running: Callable[[], Optional[int]]
    future: concurrent.futures.Future[Optional[bool]]
    #: Signal the pid only while envd lists it with ``ctl`` as its tag (see the module).
    confirm: bool = False
    #: The user the command runs as: its kill script runs as that user.
    user: str = scripts.SANDBOX_USER


@attrs.define(eq=False)
class _Queue:
    """The kills of one sandbox that no batch has taken yet."""

    target: Target
    user: str
    kills: List[_Kill] = attrs.field(factory=list)


@attrs.define(eq=False)
class _Answers:
    """When a sandbox last answered a request (a process start event), while watched."""

    last: float = -math.inf
    watchers: int = 0


def _key(target: Target, user: str) -> _Key:
    return (target.sandbox_id, target.url, target.access_token, user)


class _Bound:
    """When one batch gives up, and why (see the module's docstring).

    The first window is ``bound`` long from the batch's start. A window that ends before the
    script started is extended by another ``bound`` if the sandbox answered some other
    request during it (up to ``cap`` seconds in all); once the script started, it has
    ``bound`` seconds from then. When the bound is over, ``guard`` fires.
    """

    def __init__(
        self,
        watchdog: Watchdog,
        answers: _Answers,
        bound: float,
        cap: float,
        guard: CancelToken,
        closed: Callable[[], bool],
    ) -> None:
        self._wd = watchdog
        self._answers = answers
        self._bound = bound
        self._guard = guard
        self._closed = closed
        self._lock = threading.Lock()
        now = watchdog.clock()
        self._cap_at = now + max(cap, bound)
        self._window_start = now
        self.started = False
        #: The batch gave up at the cap, while the sandbox kept answering others.
        self.capped = False
        self._timer: Optional[TimerHandle] = watchdog.call_later(bound, self._check)

    def script_started(self) -> None:
        """The script's start event arrived: it now has the full bound from here."""
        with self._lock:
            if self.started or self._timer is None:
                return
            self.started = True
            self._timer.cancel()
            self._timer = self._wd.call_later(self._bound, self._check)

    def _check(self) -> None:
        now = self._wd.clock()
        with self._lock:
            if self._timer is None:
                return
            answered = self._answers.last > self._window_start
            if not self.started and answered and not self._closed():
                if now + self._bound <= self._cap_at:
                    self._window_start = now
                    self._timer = self._wd.call_later(self._bound, self._check)
                    return
                self.capped = True
            self._timer = None
        self._guard.cancel(CancelReason("deadline", "kill bound"))

    def cancel(self) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()


class KillBatcher:
    """Queues exec kills per sandbox and runs them in batches on the worker pool.

    Args:
        ctx: the provider's shared state (clients, watchdog, bounds, closed flag); a forked
            child starts with no queues.
        rebooted_since: tells whether a sandbox was rebooted since a time.
        wait_cap: seconds a batch waits at most for its script to start in a sandbox that
            keeps answering other requests.
    """

    def __init__(
        self,
        ctx: ProviderContext,
        rebooted_since: RebootedSince,
        wait_cap: float = KILL_WAIT_CAP_SECONDS,
    ) -> None:
        self._ctx = ctx
        self._rebooted_since = rebooted_since
        self._wait_cap = wait_cap
        self._lock = threading.Lock()
        #: Per sandbox: kills not yet taken; present while a batch job is queued or runs.
        self._queues: Dict[_Key, _Queue] = {}
        #: Per sandbox with a batch running: when it last answered a request.
        self._answers: Dict[str, _Answers] = {}
        ctx.on_fork(self.after_fork)

    def after_fork(self) -> None:
        """Forget the parent's queues (their jobs ran on threads the child does not have)."""
        self._lock = threading.Lock()
        self._queues = {}
        self._answers = {}

    def answered(self, sandbox_id: str) -> None:
        """Note that ``sandbox_id`` answered a request (a process start event); cheap."""
        answers = self._answers.get(sandbox_id)
        if answers is not None:
            answers.last = self._ctx.watchdog.clock()

    def kill(
        self,
        target: Target,
        ctl: str,
        began: float,
        bound: float,
        running: Callable[[], Optional[int]],
        *,
        confirm: bool = False,
        user: str = scripts.SANDBOX_USER,
    ) -> concurrent.futures.Future[Optional[bool]]:
        """Queue the kill of the exec with control path ``ctl``; never blocks.

        Args:
            target: the sandbox the exec runs in.
            ctl: the exec's control path.
            began: when the exec was started (monotonic clock).
            bound: seconds the kill may take once it started.
            running: the pid of the exec's process while it is known to be running, else
                None.
            confirm: ``running`` may give the pid of a process that has ended (a terminal
                whose end was not read): signal it only while envd lists it with ``ctl`` as
                its tag.
            user: the user the command runs as (``"root"``: the kill runs as root, by
                :data:`~e2b_provider.commands.users.ROOT_KILL_BATCH_SCRIPT`; the kills of
                each user are batched apart).

        Returns:
            A future with the verdict (see the module's docstring).
        """
        fut: concurrent.futures.Future[Optional[bool]] = concurrent.futures.Future()
        key = _key(target, user)
        with self._lock:
            queue = self._queues.get(key)
            idle = queue is None
            if queue is None:
                queue = self._queues[key] = _Queue(target, user)
            queue.kills.append(_Kill(ctl, began, bound, running, fut, confirm, user))
        if idle:
            self._schedule(key)
        return fut

    def _schedule(self, key: _Key) -> None:
        try:
            self._ctx.watchdog.submit(self._job, key)
        except RuntimeError:  # the watchdog was closed: nothing can run any more
            with self._lock:
                queue = self._queues.pop(key, None)
            for k in queue.kills if queue is not None else ():
                _resolve(k, None)

    def _job(self, key: _Key) -> None:
        with self._lock:
            queue = self._queues[key]
            batch = queue.kills[: scripts.KILL_BATCH_MAX]
            del queue.kills[: scripts.KILL_BATCH_MAX]
            target = queue.target
        try:
            self._run(target, batch, queue.user)
        except BaseException as exc:  # a bug must not leave an exec waiting for nothing
            log.exception("e2b_provider: kill batch failed in sandbox %s", target.sandbox_id)
            for k in batch:
                if not k.future.done():
                    k.future.set_exception(exc)
            raise
        finally:
            # One batch per sandbox at a time: kills queued meanwhile go to the next one.
            with self._lock:
                more = bool(queue.kills)
                if not more:
                    del self._queues[key]
            if more:
                self._schedule(key)

    def _run(self, target: Target, batch: List[_Kill], user: str) -> None:
        """Run one batch: the kill script for all, their verdicts, then SIGKILL by pid."""
        ctx = self._ctx
        sid = target.sandbox_id
        if ctx.closed:
            _log_closed(sid, len(batch))
        live: List[_Kill] = []
        for k in batch:
            if ctx.closed or self._rebooted_since(sid, k.began):
                _resolve(k, None)
            else:
                live.append(k)
        if not live:
            return
        with self._lock:
            answers = self._answers.get(sid)
            if answers is None:
                answers = self._answers[sid] = _Answers()
            answers.watchers += 1
        guard = CancelToken()
        bound = _Bound(
            ctx.watchdog,
            answers,
            max(k.bound for k in live),
            self._wait_cap,
            guard,
            lambda: ctx.closed,
        )
        envd = ctx.envd(target)
        args = scripts.kill_batch_args([k.ctl for k in live])
        if user == scripts.ROOT_USER:
            args[1] = ROOT_KILL_BATCH_SCRIPT
        ok = False
        try:
            r = run_process(
                envd,
                user=user,
                cmd="/bin/sh",
                args=args,
                cwd="/",
                max_output_bytes=4096,
                timeout=None,  # bounded by the guard
                cancel=guard,
                watchdog=ctx.watchdog,
                keepalive_seconds=ctx.bounds.keepalive,
                on_start=lambda _pid: bound.script_started(),
            )
            ok = r.exit_code == 0
            if not ok and not ctx.closed:
                log.warning(
                    "e2b_provider: kill script in sandbox %s %s",
                    sid,
                    "ran out of its bound" if r.cancelled else f"exited {r.exit_code}",
                )
        except E2BProviderError as exc:
            if not ctx.closed:
                log.warning("e2b_provider: kill script failed for sandbox %s: %s", sid, exc)
        finally:
            bound.cancel()
            with self._lock:
                answers.watchers -= 1
                if answers.watchers == 0:
                    del self._answers[sid]
        closed = ctx.closed
        if closed and not ok:
            _log_closed(sid, len(live))
        elif bound.capped:
            log.warning(
                "e2b_provider: sandbox %s did not start the kill script within %.0f s while "
                "busy with other requests; %d command(s) not confirmed stopped",
                sid,
                self._wait_cap,
                len(live),
            )
        # Every verdict is decided before any is delivered: the first False delivered may
        # start a reboot at once, which must not turn the others into "rebooted since".
        verdicts: List[Tuple[_Kill, Optional[bool]]] = []
        for k in live:
            if ok:
                verdicts.append((k, True))
            elif closed or bound.capped or self._rebooted_since(sid, k.began):
                verdicts.append((k, None))
            else:
                verdicts.append((k, False))
        if any(v is False for _, v in verdicts):
            # The sandbox could not run a kill: the kills queued behind this batch would
            # meet the same sandbox. They share the verdict (and so the reboot).
            with self._lock:
                queue = self._queues.get(_key(target, user))
                queued = list(queue.kills) if queue is not None else []
                if queue is not None:
                    queue.kills.clear()
            for k in queued:
                verdicts.append((k, None if self._rebooted_since(sid, k.began) else False))
        # As the reference's kill job: the script, then SIGKILL of the process envd
        # started, before the kill counts as done (by its pid, while its stream has not
        # ended, or, for a kill that confirms, while envd lists it with its tag: envd still
        # holds the process, so the pid is not reused)
        held = self._held(envd, sid, [
            k for k, verdict in verdicts if verdict is True and k.confirm and self._pid(k)
        ])
        for k, verdict in verdicts:
            pid = self._pid(k) if verdict is True else None
            if pid is not None and (not k.confirm or (pid, k.ctl) in held):
                self._signal(envd, sid, k, pid)
            _resolve(k, verdict)

    def _pid(self, k: _Kill) -> Optional[int]:
        return None if self._ctx.closed else k.running()

    def _held(self, envd: EnvdClient, sid: str, kills: List[_Kill]) -> Set[Tuple[int, str]]:
        """``(pid, tag)`` of every process envd holds, when ``kills`` need it (else none)."""
        if not kills:
            return set()
        try:
            bound = min(SIGNAL_TIMEOUT_SECONDS, max(k.bound for k in kills))
            listed = envd.list_processes(timeout=bound)
        except E2BProviderError as exc:
            log.info("e2b_provider: listing the processes of sandbox %s for a kill failed (no "
                     "pid signalled): %s", sid, exc)
            return set()
        return {(p["pid"], p["tag"]) for p in listed
                if isinstance(p.get("pid"), int) and isinstance(p.get("tag"), str)}

    def _signal(self, envd: EnvdClient, sid: str, k: _Kill, pid: int) -> None:
        """SIGKILL, by pid, the process envd started for ``k``."""
        try:
            envd.send_signal(pid, timeout=min(SIGNAL_TIMEOUT_SECONDS, k.bound))
        except E2BProviderError as exc:
            log.info("e2b_provider: SIGKILL of an exec in sandbox %s failed: %s", sid, exc)


def _log_closed(sid: str, n: int) -> None:
    log.info(
        "e2b_provider: the provider was closed; %d command(s) in sandbox %s that timed out or "
        "were cancelled were not confirmed stopped (the in-sandbox timeout stops them)",
        n,
        sid,
    )


def _resolve(k: _Kill, verdict: Optional[bool]) -> None:
    if not k.future.done():
        k.future.set_result(verdict)
