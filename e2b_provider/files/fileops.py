"""The processes of a file operation in the sandbox, and what they leave when it ends early.

This module owns :class:`FileOps`: a script run as a given user until it ends, or killed
with every process it started when it ends early (a timeout, a cancel, Ctrl-C, a lost
answer); a root :class:`~e2b_provider.files.helper.Helper` run for a two-request transfer,
whose FIFO and temporary files are removed after it; the withdrawal of a write's rename
when it is stopped (see :data:`~e2b_provider.protocol.scripts.COMMIT_PREFIX`); and what
an operation whose answer was lost is said to have run into.

Each operation's top process is named :data:`~e2b_provider.protocol.scripts.FILEOP_MARKER`
``<id>``; the rest are found as its descendants, and the process envd started is killed by
its pid. envd's processes are never selected by tag: envd 0.6.13's lookup by tag stops at
the first process with another tag, so it misses whenever other tagged processes run.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import Callable, Iterator, List, Optional, TypeVar

import attrs

from ..cancel import CancelReason, CancelToken, Deadline
from ..core.context import STDERR_ROOM, ProviderContext, silence_is_timeout
from ..core.messages import is_ambiguous
from ..core.run_engine import RunOutcome, run_process
from ..errors import Cancelled, E2BProviderError
from ..models import Target
from ..protocol import scripts as scripts
from .answers import timed_out
from .helper import SETTLE_SECONDS, Helper, fileop_tag

log = logging.getLogger("e2b_provider")

_T = TypeVar("_T")


class FileOps:
    """Run file operations' scripts and helpers in sandboxes, and clean up after them."""

    def __init__(self, ctx: ProviderContext) -> None:
        self._ctx = ctx

    def settle_lost(
        self,
        sid: str,
        exc: E2BProviderError,
        began: float,
        cancel: Optional[CancelToken],
        what: str,
        *,
        retry: bool,
    ) -> None:
        """Say what an operation whose answer was lost (``exc``) ran into: return when
        ``retry`` allows doing it again; else raise :class:`SandboxPaused` if a pause cut
        it, :class:`OperationTimeout` if the answer stopped coming, or ``exc`` itself."""
        if self._ctx.paused_during(sid, began, cancel):
            raise self._ctx.paused_error(sid, what) from exc
        if retry and not (cancel is not None and cancel.cancelled):
            return
        with silence_is_timeout():
            raise exc

    @contextlib.contextmanager
    def lost_answer_said(
        self, sid: str, cancel: Optional[CancelToken], what: str
    ) -> Iterator[None]:
        """Around an operation done once: an error that lost its answer is said as
        :meth:`settle_lost` says it (``what``: the operation, as in "reading <path>")."""
        began = time.monotonic()
        try:
            yield
        except E2BProviderError as exc:
            if is_ambiguous(exc):
                self.settle_lost(sid, exc, began, cancel, what, retry=False)
            raise

    # -- one script, killed with its whole tree when it ends early ------------------------

    def script(
        self,
        sid: str,
        user: str,
        args: List[str],
        max_output_bytes: int,
        cancel: Optional[CancelToken],
        deadline: Deadline,
        *,
        commit: bool = False,
    ) -> RunOutcome:
        """:meth:`run` in sandbox ``sid`` (its target found, and found again after a
        resume, by the context)."""
        return self._ctx.on_target(
            sid,
            cancel,
            lambda t: self.run(t, user, args, cancel, deadline, max_output_bytes,
                               commit=commit),
        )

    def run(
        self,
        target: Target,
        user: str,
        args: List[str],
        cancel: Optional[CancelToken],
        deadline: Deadline,
        max_output_bytes: int = STDERR_ROOM,
        *,
        marked: bool = True,
        commit: bool = False,
    ) -> RunOutcome:
        """Run ``/bin/sh args`` as ``user`` until ``deadline``; on a timeout, cancel or
        Ctrl-C — or when its answer is lost — every process it started is killed (the
        reference only dropped the stream).

        ``commit``: the script is a write that renames its temporary file only once it made
        its commit mark (see :data:`~e2b_provider.protocol.scripts.COMMIT_PREFIX`). A stop then
        first withdraws the rename, or finds that the write owns it and lets it end; a write found
        done is returned as done (exit status 0), whatever stopped it."""
        ctx = self._ctx
        op_id = uuid.uuid4().hex
        said: List[str] = []  # what the withdrawal of a write found
        left = deadline.remaining()
        if left <= 0:
            raise timed_out()
        if marked:  # the script's $0 becomes the operation's marked name
            args = [args[0], args[1], scripts.fileop_name(op_id), *args[3:]]
        try:
            r = run_process(
                ctx.envd(target),
                user=user,
                cmd="/bin/sh",
                args=args,
                tag=fileop_tag(op_id) if marked else None,
                cwd="/",
                max_output_bytes=max_output_bytes,
                timeout=left,
                cancel=cancel,
                watchdog=ctx.watchdog,
                killer=(lambda pid, bound: self.cleanup(
                    target, op_id, "", bound, pid=pid,
                    claim=(1 if pid is not None else 2) if commit else 0, said=said,
                )) if marked else None,
                kill_seconds=ctx.bounds.kill,
                grace_seconds=ctx.bounds.grace,
                interrupt_kill_seconds=ctx.bounds.interrupt_kill,
                keepalive_seconds=ctx.bounds.keepalive,
            )
        except E2BProviderError as exc:
            if marked and is_ambiguous(exc):
                # The answer was lost, not the script: stop whatever it still runs.
                self.cleanup_now(target, op_id, "", None, interrupted=False)
            raise
        if commit and marked and (r.cancelled or r.timed_out) and self._committed(
            target, op_id, r, said
        ):
            return attrs.evolve(r, exit_code=0, cancelled=False, timed_out=False)
        if r.cancelled:
            raise Cancelled(cancel.reason if cancel is not None else None)
        if r.timed_out:
            raise timed_out()
        return r

    def _committed(self, target: Target, op_id: str, r: RunOutcome, said: List[str]) -> bool:
        """Whether the write script ``op_id``, stopped (``r``), had renamed its file into
        place, from its exit status and what its withdrawal (``said``) found: a write
        withdrawn before its rename never renames, one that owned its rename did it unless
        it failed or was killed with its temporary file still there. When the withdrawal
        gave no verdict in time, it is done again now (bounded)."""
        if _said(said, "kept") == "1" and r.exited is not None:
            self.unmark(target, op_id)  # the write's process has ended
        if r.exited == 0:
            return True
        claim = _said(said, "claim")
        if claim is None:
            said = []  # a late answer of the first withdrawal may still add to the other
            self.cleanup(target, op_id, "", self._ctx.bounds.kill,
                          claim=1 if r.exited is not None else 2, said=said)
            claim = _said(said, "claim")
            if _said(said, "kept") == "1" and r.exited is not None:
                self.unmark(target, op_id)
        if claim is None:
            log.warning("e2b_provider: the withdrawal of a write in sandbox %s gave no "
                        "verdict; the write may yet take effect", target.sandbox_id)
            return False
        if claim == "withdrawn":
            return False
        if r.exited is not None and r.exited < 128:
            return False  # it ended on its own, and not well: its rename failed
        return _said(said, "part") == "0"

    def cleanup(
        self,
        target: Target,
        op_id: str,
        fifo: str,
        bound: float,
        *,
        settle: bool = False,
        pid: Optional[int] = None,
        claim: int = 0,
        said: Optional[List[str]] = None,
    ) -> bool:
        """Kill file operation ``op_id``'s processes and remove its FIFO and temporary files
        (bounded; ``settle``: an upload may still be on its way to the FIFO, see
        :data:`~e2b_provider.protocol.scripts.FILEOP_CLEANUP_SCRIPT`); True if the clean-up worked.
        ``claim``: withdraw a write's rename first (see
        :func:`~e2b_provider.protocol.scripts.fileop_cleanup_args`); the clean-up's lines are added
        to ``said`` once it finished.

        The clean-up script kills the marked process and its descendants; then the process
        envd started (``pid``) is killed, in case it had ``exec``-ed away its marked name.
        By pid, not by tag: envd 0.6.13's lookup by tag stops at the first process with
        another tag, so it misses whenever other tagged processes run (the file agent's).
        """
        guard = CancelToken()
        envd = self._ctx.envd(target)
        def expire() -> None:
            guard.cancel(CancelReason("deadline", "clean-up bound"))

        timer = self._ctx.watchdog.call_later(bound, expire)
        try:
            r = run_process(
                envd,
                user=scripts.ROOT_USER,
                cmd="/bin/sh",
                args=scripts.fileop_cleanup_args(op_id, fifo, settle, claim),
                cwd="/",
                max_output_bytes=STDERR_ROOM,
                timeout=bound,
                cancel=guard,
                watchdog=self._ctx.watchdog,
                keepalive_seconds=self._ctx.bounds.keepalive,
            )
            if said is not None and r.exit_code == 0:
                said.extend(r.stdout.decode("ascii", "replace").splitlines())
            if pid is not None:
                envd.send_signal(pid, cancel=guard, timeout=max(0.5, bound / 4))
            return r.exit_code == 0 and not guard.cancelled
        except E2BProviderError as exc:
            log.warning("e2b_provider: file operation clean-up failed in sandbox %s: %s",
                        target.sandbox_id, exc)
            return False
        finally:
            timer.cancel()

    def unmark(self, target: Target, op_id: str) -> None:
        """Remove the commit mark a withdrawal kept for write ``op_id`` (bounded; best
        effort: one left is removed after ten minutes, or by ``kill_all``)."""
        try:
            run_process(
                self._ctx.envd(target), user=scripts.ROOT_USER, cmd="/bin/sh",
                args=scripts.commit_unmark_args(op_id), cwd="/", max_output_bytes=STDERR_ROOM,
                timeout=self._ctx.bounds.kill, cancel=None, watchdog=self._ctx.watchdog,
                keepalive_seconds=self._ctx.bounds.keepalive,
            )
        except E2BProviderError as exc:
            log.info("e2b_provider: could not remove a write's commit mark in sandbox %s: %s",
                     target.sandbox_id, exc)

    def cleanup_now(
        self,
        target: Target,
        op_id: str,
        fifo: str,
        pid: Optional[int],
        *,
        interrupted: bool,
        settle: bool = False,
        claim: int = 0,
        said: Optional[List[str]] = None,
    ) -> None:
        """:meth:`cleanup` on the caller's thread; a second Ctrl-C abandons it."""
        b = self._ctx.bounds
        bound = b.interrupt_kill if interrupted else b.kill
        try:
            if not self.cleanup(target, op_id, fifo, bound, settle=settle, pid=pid,
                                 claim=claim, said=said):
                log.warning("e2b_provider: a file operation in sandbox %s may have left "
                            "processes behind", target.sandbox_id)
        except KeyboardInterrupt:
            log.warning("e2b_provider: second interrupt; abandoning the clean-up of a file "
                        "operation in sandbox %s", target.sandbox_id)

    # -- two-request paths: a root helper, then a /files transfer --------------------------

    def helped(
        self,
        target: Target,
        op_id: str,
        argv: List[str],
        fifo: str,
        cancel: Optional[CancelToken],
        deadline: Deadline,
        body: Callable[[Helper], _T],
        user: str = scripts.ROOT_USER,
        done: Optional[Callable[[], _T]] = None,
    ) -> _T:
        """Start ``argv`` as ``user`` (marked), run ``body`` with it, and clean up whatever
        it started or staged when ``body`` ends early (an error, a cancel, Ctrl-C) before
        the error reaches the caller. ``done``: the helper is a write that renames only
        once it made its commit mark (see :data:`~e2b_provider.protocol.scripts.COMMIT_PREFIX`); the
        clean-up withdraws the rename first, and a write found done after all returns ``done()``
        (after Ctrl-C the interrupt is raised in any case).

        A transfer to the helper's FIFO that was cut is first let end on its own: its
        input ended, the helper refuses what it got (a temporary file is never renamed
        unless whole) and exits, removing what it made. The clean-up then kills whatever
        still runs and removes the FIFO; only when the helper never said envd had opened
        the FIFO is it held open a moment first (a cut ``POST`` may yet reach it)."""
        helper = Helper(self._ctx, target, argv, op_id, cancel, deadline, user)
        entered = False
        try:
            with helper:
                entered = True
                try:
                    return body(helper)
                except BaseException as exc:  # tidied while the helper's stream is open
                    interrupted = isinstance(exc, KeyboardInterrupt)
                    if self._tidy(helper, fifo, interrupted, commit=done is not None) and (
                        done is not None and not interrupted
                    ):
                        return done()
                    raise
        except BaseException as exc:
            if not entered:  # its start failed: it may have started all the same
                self._tidy(helper, fifo, isinstance(exc, KeyboardInterrupt))
            if isinstance(exc, KeyboardInterrupt):
                raise
            if isinstance(exc, Cancelled) or (
                helper.guard.cancelled and isinstance(exc, E2BProviderError)
            ):
                # the caller's cancel, or the operation's bound, which shut the transfer
                # down (an aborted stream is said as what stopped it)
                helper.raise_stopped()
            raise

    def _tidy(
        self, helper: Helper, fifo: str, interrupted: bool, *, commit: bool = False
    ) -> bool:
        """After an early end: let a cut transfer's helper end, then clean up what is left
        (bounded; a second Ctrl-C abandons it). ``commit``: the helper is a write, whose
        rename the clean-up withdraws first; True if the write was found done (it ended
        well, or owned its rename and its temporary file is gone)."""
        b = self._ctx.bounds
        try:
            if helper.posted and not helper.ended:
                helper.settle(min(SETTLE_SECONDS, b.interrupt_kill if interrupted else b.kill))
            exited = helper.ended and helper.exit_code is not None and helper.exit_code < 128
            if commit and helper.ended and helper.exit_code == 0:
                return True
            if exited and (not fifo or helper.opened):
                return False  # it ended on its own and removed what it made
            said: List[str] = []
            self.cleanup_now(
                helper.target, helper.op_id, fifo, None if helper.ended else helper.pid,
                interrupted=interrupted,
                settle=bool(fifo) and helper.posted and not helper.opened,
                # a write that never got its bytes cannot rename: only one that did is
                # withdrawn (its helper had said "ready", so its pid is known)
                claim=(1 if helper.pid is not None else 2) if commit and helper.posted else 0,
                said=said,
            )
            if _said(said, "kept") == "1" and helper.ended:
                self.unmark(helper.target, helper.op_id)  # its process has ended
            return (commit and not exited and _said(said, "claim") == "committing"
                    and _said(said, "part") == "0")
        except KeyboardInterrupt:
            log.warning("e2b_provider: second interrupt; abandoning the clean-up of a file "
                        "operation in sandbox %s", helper.target.sandbox_id)
            return False


def _said(lines: List[str], key: str) -> Optional[str]:
    """The word after ``key`` on the clean-up's line that starts with it, if any."""
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == key and rest:
            return rest.strip()
    return None

