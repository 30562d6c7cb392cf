"""One helper process of a file operation in the sandbox, read as its answer comes.

This module owns :class:`Helper`: a process started through envd (root's, unless told
otherwise) whose standard output is read in two halves — up to its first line, then, after
the caller's ``/files`` transfer, to its end — or as a stream of pieces. Every read is
bounded by the operation's deadline and stops on a cancel; a transfer that was cut is let
end on its own for a while (:data:`SETTLE_SECONDS`).
"""

from __future__ import annotations

from typing import Callable, Iterator, List, Optional

from .._watchdog import TimerHandle
from ..cancel import CancelReason, CancelToken, Deadline
from ..clients.envd import EnvdClient
from ..clients.envd_streams import ProcessStream
from ..core.context import ProviderContext
from ..core.run_engine import RunOutcome
from ..errors import Cancelled, E2BProviderError, ProtocolError
from ..models import Target
from ..protocol import scripts as scripts
from ..protocol.process_events import DataEvent, EndEvent, ProcessEvent, StartEvent
from .answers import timed_out

#: Seconds an in-sandbox helper outlives the operation's own bound at most.
HELPER_GRACE_SECONDS = 60.0
#: Output kept from a helper (it prints one short line, or an error).
_HELPER_OUTPUT = 64 * 1024
#: How long a helper whose transfer was cut may take to end on its own.
SETTLE_SECONDS = 5.0
#: How long after a transfer was cut its helper may take to say envd had opened its FIFO.
_OPEN_SECONDS = 0.5
#: How long a helper's start may go on after a cancel before it is cut.
_OPEN_GRACE_SECONDS = 2.0


def fileop_tag(op_id: str) -> str:
    """envd's tag for the process a file operation starts."""
    return scripts.fileop_name(op_id)


class Helper:
    """One helper process in the sandbox (root's, unless ``user`` says otherwise), read in
    two halves: up to its first line, then (after the caller's ``/files`` transfer) to its
    end — or read as a stream of standard output pieces (:meth:`next_output`).

    Every read is bounded by the operation's deadline and stops when ``cancel`` fires
    (both abort the stream); the stream's own read timeout bounds a silent envd.
    """

    def __init__(
        self,
        ctx: ProviderContext,
        target: Target,
        argv: List[str],
        op_id: str,
        cancel: Optional[CancelToken],
        deadline: Deadline,
        user: str = scripts.ROOT_USER,
    ) -> None:
        self._ctx = ctx
        self._user = user
        self.target = target
        self.envd: EnvdClient = ctx.envd(target)
        self._argv = argv
        self.op_id = op_id
        self.tag = fileop_tag(op_id)
        self._cancel = cancel
        self._deadline = deadline
        #: Fires on the caller's cancel or at the deadline; guards every request.
        self.guard = CancelToken()
        self._stream: Optional[ProcessStream] = None
        self._events: Optional[Iterator[ProcessEvent]] = None
        self.pid: Optional[int] = None
        self.exit_code: Optional[int] = None
        self.ended = False
        self._stdout = bytearray()
        self._stderr = bytearray()
        self._undo: List[Callable[[], None]] = []
        self._timed_out = False
        #: A transfer to the helper was sent (its request may have reached envd): a cancel
        #: then cuts the transfer and leaves the helper's stream to be read to its end.
        self.posted = False
        #: Lines the helper printed after its first (``open``: envd opened its FIFO).
        self._said: List[bytes] = []
        self._settling: Optional[TimerHandle] = None
        self._settled = False  # settle() was tried (once is enough)
        self._cut_opening: Optional[TimerHandle] = None

    def __enter__(self) -> Helper:
        if self._cancel is not None:
            self._cancel.raise_if_cancelled()
            self._undo.append(self._cancel.on_cancel(self._stop))
        left = self._deadline.remaining()
        if left <= 0:
            raise timed_out()
        timer = self._ctx.watchdog.call_later(left, self._expire)

        def cancel_timer() -> None:
            timer.cancel()

        self._undo.append(cancel_timer)
        # A start cut while its request is on its way may still start the helper after
        # the clean-up looked for it (envd answers once it runs): so a cancel lets the
        # start finish (a round trip), and cuts it only if that takes over _OPEN_GRACE_SECONDS.
        opening = CancelToken()

        def cut() -> None:
            opening.cancel(CancelReason("deadline", "start"))

        def cut_later(_reason: object = None) -> None:
            self._cut_opening = self._ctx.watchdog.call_later(_OPEN_GRACE_SECONDS, cut)

        self._undo.append(self.guard.on_cancel(cut_later))
        try:
            stream = self.envd.start(
                user=self._user,
                cmd=self._argv[0],
                args=self._argv[1:],
                cwd="/",
                keepalive_seconds=self._ctx.bounds.keepalive,
                cancel=opening,
                tag=self.tag,
            )
        except BaseException as exc:
            self.__exit__()
            if isinstance(exc, Cancelled):
                self.raise_stopped()
            raise
        self._stream = stream
        self._events = iter(stream)
        if self.guard.cancelled:
            stream.abort()
        return self

    def __exit__(self, *exc: object) -> None:
        for undo in self._undo:
            undo()
        for timer in (self._settling, self._cut_opening):
            if timer is not None:
                timer.cancel()
        stream = self._stream
        if stream is not None:
            stream.close()

    def _expire(self) -> None:
        self._timed_out = True
        self._stop(CancelReason("deadline", "file operation bound"))

    def _stop(self, reason: CancelReason) -> None:
        self.guard.cancel(reason)  # cuts a transfer under way (its request has the guard)
        stream = self._stream
        if stream is None:
            return
        if not self.posted:
            stream.abort()
        elif self._settling is None:  # a cut transfer's helper ends on its own: a while
            self._settling = self._ctx.watchdog.call_later(SETTLE_SECONDS, stream.abort)

    @property
    def opened(self) -> bool:
        """Whether the helper said ``open``: envd had opened its FIFO for the transfer."""
        return b"open" in self._said or b"open" in bytes(self._stdout).splitlines()

    def settle(self, bound: float) -> bool:
        """Read the helper to its end within ``bound`` seconds (its transfer was cut: it
        ends on its own); True if it ended. A helper with a FIFO that has not said ``open``
        within :data:`_OPEN_SECONDS` never got the transfer (envd opens the FIFO as soon as the
        request's head arrives): it is not waited for. Never raises a library error."""
        if self.ended:
            return True
        stream = self._stream
        if stream is None or self._settled:
            return False
        self._settled = True

        def unopened() -> None:
            if not self.opened:
                stream.abort()

        timers = [self._ctx.watchdog.call_later(bound, stream.abort)]
        if self.posted and not self.opened:
            timers.append(self._ctx.watchdog.call_later(min(bound, _OPEN_SECONDS), unopened))
        try:
            while self._next():
                pass
        except E2BProviderError:
            return False
        finally:
            for t in timers:
                t.cancel()
        return self.ended

    def raise_stopped(self) -> None:
        """Raise what stopped the helper, if it was stopped (a cancel or the deadline)."""
        if self._cancel is not None and self._cancel.cancelled:
            raise Cancelled(self._cancel.reason)
        if self._timed_out:
            raise timed_out()

    def _next(self) -> bool:
        """Take in one more event; False after the end."""
        if self.ended:
            return False
        try:
            assert self._events is not None
            ev = next(self._events)
        except StopIteration:
            raise ProtocolError(
                "the sandbox's answer ended without the helper's exit status"
            ) from None
        except E2BProviderError:
            self.raise_stopped()
            raise
        if isinstance(ev, StartEvent):
            self.pid = ev.pid
        elif isinstance(ev, DataEvent):
            if ev.stdout and len(self._stdout) < _HELPER_OUTPUT:
                self._stdout += ev.stdout
            if ev.stderr and len(self._stderr) < _HELPER_OUTPUT:
                self._stderr += ev.stderr
        elif isinstance(ev, EndEvent):
            self.exit_code = ev.exit_code
            self.ended = True
        return True

    def next_output(self) -> Optional[bytes]:
        """The next piece of standard output (standard error is kept, up to a bound); None
        after the end."""
        while not self._stdout:
            if not self._next():
                return None
        out = bytes(self._stdout)
        self._stdout.clear()
        return out

    def stderr_lines(self) -> List[bytes]:
        """The standard error kept so far, by line."""
        return bytes(self._stderr).splitlines()

    def first_line(self) -> Optional[bytes]:
        """The first line the helper printed (without its newline); None if it ended first."""
        while b"\n" not in self._stdout:
            if not self._next():
                return None
        line, _, rest = bytes(self._stdout).partition(b"\n")
        self._stdout = bytearray(rest)
        self._said.append(line)
        return line

    def finish(self) -> Optional[int]:
        """Read to the end event; the exit code."""
        while self._next():
            pass
        # the stream ends with its end-of-stream message after the end event
        try:
            for _ in self._events or ():
                pass
        except E2BProviderError:
            pass
        return self.exit_code

    def outcome(self) -> RunOutcome:
        """What the helper produced, as a script's outcome (for error messages)."""
        return RunOutcome(
            exit_code=self.exit_code, stdout=bytes(self._stdout), stderr=bytes(self._stderr),
            truncated=False, timed_out=False, cancelled=False, wedged=False, pid=self.pid,
        )
