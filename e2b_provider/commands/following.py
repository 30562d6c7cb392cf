"""Following a background command: its record, then its supervisor's live frames.

This module owns :class:`Follower` (one :meth:`~e2b_provider.commands.command.Command.wait`)
and :class:`StreamGuard` (a deadline and a cancel on one envd stream).

Following reads on the caller's thread: the record first (through the file agent, one
request), then envd's ``Connect`` to the supervisor, whose frames carry stream offsets, so
nothing is shown twice and a gap (frames the supervisor dropped while nobody read fast
enough) is read from the record. No thread per command: deadlines and cancels go through
the shared watchdog. A command without live frames (``supervisor.sh``'s) is followed by
reading its record over and over, each read waiting in the sandbox up to
:data:`POLL_WAIT_SECONDS` for news.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from ..cancel import CancelToken, Deadline
from ..clients.envd_streams import ProcessStream
from ..core.context import ProviderContext
from ..core.interrupts import calls_user_code
from ..core.messages import mark_worded
from ..errors import (
    Cancelled,
    E2BProviderError,
    NotFound,
    OperationTimeout,
    ProtocolError,
    RemoteError,
    TransportError,
)
from ..models import ExecResult, Target
from ..protocol import scripts as scripts
from ..protocol.command_records import FrameDecoder, KeptOutput, decode_tail
from ..protocol.process_events import DataEvent, EndEvent
from .command import Command, OnText

if TYPE_CHECKING:
    from .background import Background

__all__ = ["POLL_WAIT_SECONDS", "Follower", "StreamGuard"]

log = logging.getLogger("e2b_provider")

#: A follower reconnects after a broken stream at most this many times in a row without
#: progress.
_RECONNECTS = 3
#: How long one read of a record may wait in the sandbox for news (output past what the
#: follower has, or the end) when the command has no live frames (``supervisor.sh``).
POLL_WAIT_SECONDS = 2.0
#: The pause between two reads of a record that could not wait in the sandbox (the file
#: agent's) and brought nothing new.
_POLL_PAUSE_SECONDS = 0.25


def _result(status: Optional[Dict[str, Any]], out: KeptOutput, err: KeptOutput) -> ExecResult:
    code: Optional[int] = None
    timed_out = killed = False
    if status is not None:
        timed_out = bool(status.get("timed_out"))
        killed = bool(status.get("killed"))
        raw = status.get("exit_code")
        if isinstance(raw, int) and not isinstance(raw, bool) and not (timed_out or killed):
            code = raw
    return ExecResult(
        exit_code=code,
        stdout=decode_tail(out.data, out.cut),
        stderr=decode_tail(err.data, err.cut),
        truncated=out.cut or err.cut,
        timed_out=timed_out,
        cancelled=killed,
    )


class StreamGuard:
    """Aborts ``stream`` when ``deadline`` passes or ``cancel`` fires (watchdog timer and
    token callback, both undone on exit); says which stopped it."""

    def __init__(self, ctx: ProviderContext, stream: ProcessStream, deadline: Deadline,
                 cancel: Optional[CancelToken]) -> None:
        self._stream = stream
        self._deadline = deadline
        self.expired = False
        self._timer = None
        if math.isfinite(deadline.remaining()):
            self._timer = ctx.watchdog.call_later(deadline.remaining(), self._expire)
        self._undo = cancel.on_cancel(lambda _r: stream.abort()) if cancel is not None else None

    def _expire(self) -> None:
        self.expired = True
        self._stream.abort()

    def __enter__(self) -> StreamGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._undo is not None:
            self._undo()
        self._stream.close()  # a stream not read to its end closes its connection


class Follower:
    """One :meth:`Command.wait`: the record, then envd's ``Connect`` to the supervisor."""

    def __init__(self, owner: Background, cmd: Command, deadline: Deadline,
                 cancel: Optional[CancelToken], on_stdout: Optional[OnText],
                 on_stderr: Optional[OnText]) -> None:
        from ..protocol.process_events import LiveText

        self.owner = owner
        self.cmd = cmd
        self.deadline = deadline
        self.cancel = cancel
        self.kept = {"o": KeptOutput(cmd._cap), "e": KeptOutput(cmd._cap)}
        self.live: Dict[str, Tuple[Optional[OnText], Any]] = {
            "o": (on_stdout, LiveText()), "e": (on_stderr, LiveText()),
        }
        self.status: Optional[Dict[str, Any]] = None
        self.ended = False

    def _check(self) -> None:
        if self.cancel is not None:
            self.cancel.raise_if_cancelled()
        if self.deadline.expired():
            raise mark_worded(OperationTimeout(
                f"command {self.cmd.id} did not end within the wait's timeout; it still runs"
            ))

    @calls_user_code
    def _deliver(self, kind: str, data: bytes) -> None:
        cb, text = self.live[kind]
        if cb is not None and data:
            piece = text.feed(data)
            if piece:
                cb(piece)

    def _catch_up(self, wait: float = 0.0) -> bool:
        """Read the record from where each stream was read to (at first: the last bytes
        kept) and deliver what is new; note the end if the record has it. ``wait``: the
        first read may wait that long in the sandbox for news (see :meth:`Background.read`).
        Returns whether it did."""
        out, err = self.kept["o"], self.kept["e"]
        waited = False
        while True:
            r = self.owner.read(
                self.cmd.sandbox_id, self.cmd._cid,
                out.end if out.known else -1, err.end if err.known else -1,
                self.cmd._cap, self.cancel, wait if out.known and err.known else 0.0,
                user=self.cmd._user,
            )
            waited = waited or r.waited
            wait = 0.0
            for kind, (first, _total, data) in (("o", r.out), ("e", r.err)):
                kept = self.kept[kind]
                if not kept.known or first > kept.end:
                    # first read, or the record dropped bytes never seen: go on from there
                    kept.reset(first, data)
                    self._deliver(kind, data)
                else:
                    self._deliver(kind, kept.add(first, data))
            if r.status is None:
                if not r.alive:
                    self.ended = True  # its supervisor is gone without a status: a restart
                return waited
            self._ended(r.status)
            if self._complete() or not (r.out[2] or r.err[2]):
                return waited

    def _ended(self, status: Dict[str, Any]) -> None:
        self.status = status
        self.ended = True

    def _complete(self) -> bool:
        """Whether everything the ended command wrote was read (the status has totals)."""
        assert self.status is not None
        for kind, key in (("o", "stdout_total"), ("e", "stderr_total")):
            total = self.status.get(key)
            if isinstance(total, int) and self.kept[kind].end < total:
                return False
        return True

    def run(self) -> ExecResult:
        if self.cancel is not None:
            self.cancel.raise_if_cancelled()
        if not self.cmd._live:
            # ended before attach found it: the record says the rest (its pid is only the
            # record's word: nothing is followed there)
            self._catch_up()
            self.ended = True
            return self._finish()
        if not self.cmd._frames:
            self._poll()
            return self._finish()
        failures = 0
        while True:
            error: Optional[E2BProviderError] = None
            try:
                self._connect_once()
            except (TransportError, RemoteError, NotFound, ProtocolError, Cancelled) as exc:
                if self.cancel is not None and self.cancel.cancelled:
                    raise Cancelled(self.cancel.reason) from None
                error = exc
            if not self.ended or not self._complete():
                self._catch_up()  # what the stream did not bring, and whether it ended
            if self.ended:
                break
            self._check()
            if error is not None:
                failures += 1
                if failures > _RECONNECTS:
                    raise error
                log.info("e2b_provider: following command %s: %s; connecting again",
                         self.cmd.id, error)
                self._pause(0.2 * failures)
        return self._finish()

    def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` at most up to the deadline; a cancel cuts it short."""
        pause = min(seconds, max(0.0, self.deadline.remaining()))
        if self.cancel is not None:
            self.cancel.wait(pause)
        else:
            time.sleep(pause)

    def _finish(self) -> ExecResult:
        for cb, text in self.live.values():
            if cb is not None:
                rest = text.finish(False)
                if rest:
                    cb(rest)
        return _result(self.status, self.kept["o"], self.kept["e"])

    def _poll(self) -> None:
        """Follow a command without live frames (``supervisor.sh``'s): read its record until
        it ended, each read waiting in the sandbox for news when it can, else pausing
        :data:`_POLL_PAUSE_SECONDS` after a read that brought nothing."""
        out, err = self.kept["o"], self.kept["e"]
        self._catch_up()
        while not self.ended:
            self._check()
            before = (out.end, err.end)
            wait = min(POLL_WAIT_SECONDS, self.deadline.remaining())
            waited = self._catch_up(wait)
            if not self.ended and not waited and (out.end, err.end) == before:
                self._pause(_POLL_PAUSE_SECONDS)

    def _connect_once(self) -> None:
        """Follow the supervisor's frames until its last one (or the stream's end)."""
        owner, cmd = self.owner, self.cmd
        ctx = owner._ctx

        def open_stream(target: Target) -> ProcessStream:
            return ctx.envd(target).connect(
                cmd.pid, user=cmd._user,
                keepalive_seconds=ctx.bounds.keepalive, cancel=self.cancel,
            )

        stream = ctx.on_target(cmd.sandbox_id, self.cancel, open_stream)
        with StreamGuard(ctx, stream, self.deadline, self.cancel):
            decoder = FrameDecoder()
            started = False
            for ev in stream:
                if not started:
                    started = True
                    self._catch_up()  # subscribed: what came before is in the record
                    if self.ended:
                        return
                if isinstance(ev, DataEvent) and ev.stdout:
                    for frame in decoder.feed(ev.stdout):
                        if frame.kind in ("o", "e"):
                            kept = self.kept[frame.kind]
                            if frame.offset > kept.end:
                                self._catch_up()  # frames were dropped: read them
                            if frame.offset <= kept.end:
                                self._deliver(frame.kind, kept.add(frame.offset, frame.data))
                        elif frame.kind == "x":
                            try:
                                status = json.loads(frame.data.decode("utf-8"))
                            except ValueError:
                                return  # the record has it
                            if isinstance(status, dict):
                                self._ended(status)
                            return
                elif isinstance(ev, EndEvent):
                    return
