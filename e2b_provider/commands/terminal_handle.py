"""The handle of one interactive terminal in a sandbox: read, wait, write, resize, kill.

This module owns :class:`Terminal`, the handle ``terminal()`` and ``attach()`` return (made
by :class:`~e2b_provider.commands.terminals.Terminals`, which drives its envd calls).

Output is read on the caller's thread, straight from the ``Start`` (or ``Connect``) stream
(a :class:`~e2b_provider.clients.envd_streams.PtyStream`: a timed-out read loses nothing), in
slices of :data:`WAIT_SLICE_SECONDS` so cancels and deadlines are seen promptly. No thread per
terminal: the terminal's timeout is a watchdog timer, its kills run on the watchdog's worker
pool. A kill by pid through envd (root) is sent only while envd lists that pid as the
terminal's (tagged with its control path): a handle that has not read the end may hold a pid
envd has forgotten and given to another process (see :mod:`e2b_provider.commands.kills`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Union

from ..cancel import WAIT_SLICE_SECONDS, CancelReason, CancelToken, Deadline
from ..clients.envd_streams import PtyStream, StreamEnd
from ..core.interrupts import caller_handling, calls_user_code, shorten_in_generator
from ..core.leases import LEASE_LOOK_SECONDS
from ..core.messages import describe, mark_worded
from ..core.run_engine import wait_verdict
from ..errors import (
    Cancelled,
    CommandEnded,
    CommandFailed,
    E2BProviderError,
    InvalidArgument,
    OperationTimeout,
    ProtocolError,
    RemoteError,
    SandboxGoneError,
    TransportError,
)
from ..models import Target
from ..protocol import scripts as scripts
from ..protocol import validate as v
from ..protocol.process_events import DataEvent, EndEvent, LiveText, ProcessEvent
from .arguments import check_wait_timeout
from .terminal_wrapper import terminal_id

if TYPE_CHECKING:
    from .terminals import Terminals

__all__ = ["Terminal"]

log = logging.getLogger("e2b_provider")


class Terminal:
    """An interactive program on a terminal (pty) in a sandbox: a shell, a REPL, an editor.

    Made by ``terminal()`` (a new one) or ``attach()`` (one that runs, from any process).
    Use it as a context manager: leaving the block (or :meth:`close`) kills a terminal this
    handle started, with its whole process tree, and lets go of one it attached to;
    :meth:`detach` lets go of either and leaves it running.

    Reading: :meth:`read` returns the output as it comes (bytes, as the terminal gives
    them: echoed input, escape sequences, ``\\r\\n`` line ends); ``b""`` only once the
    program ended and everything it wrote was read; when ``timeout`` passes with nothing,
    it raises :class:`~e2b_provider.OperationTimeout` and the terminal goes on (as a
    socket's ``recv`` with a timeout). Output nobody reads is held back: envd delivers it
    only as fast as it is read, so a program that writes a lot waits for its reader, as on
    any terminal; a handle may be left unread for any time and reads on where it was.
    :meth:`wait` reads to the end (giving the output to ``on_output``, or dropping it) and
    returns the exit status.

    Ctrl-C (``KeyboardInterrupt``) while a call of this handle waits kills the terminal's
    process tree (bounded by the provider's ``interrupt_kill_bound``; a second Ctrl-C gives
    up waiting), then propagates. To type a Ctrl-C *into* the terminal, :meth:`write`
    ``"\\x03"``.

    Thread-safety: one thread reads (:meth:`read`, :meth:`wait`) at a time; :meth:`write`,
    :meth:`resize` and :meth:`kill` may be called from any thread meanwhile.

    Attributes:
        id: names the terminal in any process (``<sandbox id>:pty-<pid>-<32 hex>``), for
            ``attach``.
        sandbox_id: the sandbox it runs in.
        pid: envd's process id of the terminal (its session leader).
        command: the shell command it runs, or None for the user's login shell (None also
            for an attached terminal: the id does not say).
    """

    def __init__(
        self,
        owner: Terminals,
        sid: str,
        target: Target,
        pid: int,
        ctl: str,
        events: PtyStream,
        *,
        command: Optional[str],
        began: float,
        owned: bool,
        user: str = scripts.SANDBOX_USER,
    ) -> None:
        self._owner = owner
        self._user = user
        self.sandbox_id = sid
        self._target = target
        self.pid = pid
        self._ctl = ctl
        self.id = terminal_id(sid, pid, ctl)
        self.command = command
        self._events = events
        self._began = began
        self._owned = owned
        self._lock = threading.Lock()
        self._reader = threading.Lock()
        self._out = bytearray()
        self._ended = False
        self._exit_code: Optional[int] = None
        self._no_status = False
        self._timed_out = False
        self._cancelled: Optional[CancelReason] = None
        self._broken: Optional[E2BProviderError] = None
        self._closed = False
        self._kill_future: Optional[concurrent.futures.Future[Optional[bool]]] = None
        self._kill_awaited = False
        self._undo: List[Callable[[], object]] = []
        self._lease_looked = time.monotonic()

    def __repr__(self) -> str:
        state = "ended" if self._ended else "closed" if self._closed else "running"
        return f"Terminal(id={self.id!r}, pid={self.pid}, {state})"

    # -- state ------------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """True once this handle saw the program end (its exit status came)."""
        return self._ended

    @property
    def exit_code(self) -> Optional[int]:
        """The exit status once it ended (see :meth:`wait`), else None."""
        return self._exit_code

    @property
    def timed_out(self) -> bool:
        """True when the terminal's ``timeout`` ended it."""
        return self._timed_out

    def fileno(self) -> int:
        """A descriptor for ``select``: readable when :meth:`read` may have more. Output
        already received is not seen by ``select``: after it says readable, call
        ``read(timeout=0)`` until it raises :class:`~e2b_provider.OperationTimeout` (or
        returns ``b""``) before waiting on the descriptor again."""
        return self._events.fileno()

    # -- lifetime hooks (set by Terminals) ----------------------------------------------------

    def _arm(self, timeout: Optional[float], cancel: Optional[CancelToken]) -> None:
        if timeout is not None:
            timer = self._owner.ctx.watchdog.call_later(timeout, self._expire)
            self._undo.append(timer.cancel)
        if cancel is not None:
            self._undo.append(cancel.on_cancel(self._on_cancel))

    def _expire(self) -> None:  # the watchdog thread: flips state, starts the kill
        if self._ended:
            return
        self._timed_out = True
        self._start_kill()

    def _on_cancel(self, reason: CancelReason) -> None:  # the cancelling thread
        if self._ended:
            return
        self._cancelled = reason
        self._start_kill()

    def _release_hooks(self) -> None:
        with self._lock:
            undo, self._undo = self._undo, []
        for fn in undo:
            fn()

    # -- reading ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument(f"terminal {self.id} was closed (close(), detach() or the "
                                  "end of its with block); attach() gives a new handle")

    def _check_stop(self, cancel: Optional[CancelToken]) -> None:
        if self._cancelled is not None:
            raise Cancelled(self._cancelled)
        if cancel is not None:
            cancel.raise_if_cancelled()

    def _ended_with(self, code: Optional[int], *, no_status: bool = False) -> None:
        """The program ended (on the reading thread): its output was all read, so the
        stream is closed now, not when the handle is."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            self._exit_code = code
            self._no_status = no_status
        self._release_hooks()
        self._events.close()

    def _take(self, ev: Union[ProcessEvent, StreamEnd]) -> None:
        if isinstance(ev, DataEvent):
            self._out += ev.stdout
            self._out += ev.stderr
        elif isinstance(ev, EndEvent):
            code = ev.exit_code
            if code is None:
                code = ev.raw_exit_code if ev.raw_exit_code is not None else -1
            self._ended_with(code)
        elif isinstance(ev, StreamEnd):
            self._ended_with(None, no_status=True)

    def _pull(self, deadline: Optional[Deadline], cancel: Optional[CancelToken]) -> bytes:
        """Output as soon as there is any (``b""`` at the end). Raises OperationTimeout at
        ``deadline`` (after one last look), Cancelled for either token."""
        tried = False
        while True:
            self._check_stop(cancel)
            if self._out:
                data = bytes(self._out)
                self._out.clear()
                return data
            if self._ended:
                self._killed()
                return b""
            if self._broken is not None:
                raise self._broken
            self._keep_lease()
            wait = WAIT_SLICE_SECONDS
            if deadline is not None:
                left = deadline.remaining()
                if left <= 0:
                    # what was received is read first, however long the timeout (a keepalive
                    # may come in one piece with output: ``select`` would not see the output)
                    if tried and not self._events.buffered():
                        raise mark_worded(OperationTimeout(
                            f"no output from terminal {self.id} within the read's timeout; "
                            "it still runs"
                        ))
                    tried = True
                    left = 0.0
                wait = min(wait, left)
            try:
                ev = self._events.poll(wait)
            except RemoteError as exc:
                if exc.code == "deadline_exceeded":  # envd's Connect-Timeout-Ms: killed
                    # envd killed its process only: the tree is killed as at this
                    # process's own timeout (what left the session would run on)
                    self._timed_out = True
                    self._start_kill()
                    self._ended_with(137)
                    continue
                self._broken = exc
                raise
            except (TransportError, ProtocolError) as exc:
                if self._closed:
                    self._check_open()
                # a pause or a delete cuts the stream: say so (one look-up of the sandbox)
                broken = self._owner.fate_error(self, f"reading terminal {self.id}", cancel)
                if broken is None:
                    broken = mark_worded(TransportError(
                        f"the stream of terminal {self.id} broke ({exc}); the terminal may "
                        "still run: attach() to it again (what it wrote meanwhile is lost) "
                        "or kill_all()"
                    ))
                broken.__cause__ = exc
                self._broken = broken
                raise broken from exc
            if ev is not None:
                self._take(ev)

    def _killed(self) -> None:
        """At the end: a kill of the tree under way (its timeout, a cancel) is waited for,
        bounded as :meth:`kill`, so what the program started is gone once its end is
        read."""
        fut = self._kill_future
        if fut is None or fut.done() or self._kill_awaited:
            return
        self._kill_awaited = True
        bound = self._owner.ctx.bounds.kill + 1.0
        finished, ok = wait_verdict(fut, Deadline.after(bound))
        if not (finished and ok):
            log.warning("e2b_provider: terminal %s ended, but the kill of its tree could not "
                        "be confirmed within %.0f s; kill_all() stops what is left", self.id,
                        bound)

    def _keep_lease(self) -> None:
        now = time.monotonic()
        if now - self._lease_looked < LEASE_LOOK_SECONDS:
            return
        self._lease_looked = now
        ctx = self._owner.ctx
        lease = ctx.leases.lease(self.sandbox_id)
        if lease is not None and lease.ends_at > ctx.leases.now():
            try:  # valid now: no I/O here; renewed in the background when half gone
                ctx.leases.get(self.sandbox_id, need=0.0, lease_seconds=ctx.lease_seconds())
            except E2BProviderError:
                pass

    @contextlib.contextmanager
    def _read_turn(self) -> Iterator[None]:
        """Around one reading of the output (:meth:`read`, :meth:`wait`): the handle open and
        this thread its only reader until the end; a Ctrl-C meanwhile kills the terminal's
        tree."""
        self._check_open()
        if not self._reader.acquire(blocking=False):
            raise RuntimeError(f"terminal {self.id} is already being read by another thread")
        outer = caller_handling()
        try:
            yield
        except KeyboardInterrupt as exc:
            self._interrupted()
            shorten_in_generator(exc, sys._getframe(), outer)
            raise
        finally:
            self._reader.release()

    def read(self, timeout: Optional[float] = None, *, cancel: Optional[CancelToken] = None
             ) -> bytes:
        """The terminal's output received since the last read, as soon as there is any.

        Args:
            timeout: the longest to wait, in seconds (0: do not wait; None: until output
                comes or the program ends).
            cancel: stops this read from any thread (the terminal goes on).

        Returns:
            The bytes; ``b""`` once the program ended and all its output was read.

        Raises:
            OperationTimeout: nothing came within ``timeout``; the terminal goes on.
            Cancelled: ``cancel`` fired, or the terminal's own ``cancel`` token (then it was
                killed).
            SandboxGoneError: the sandbox was deleted (the terminal ended with it).
            SandboxPaused: the sandbox was paused, which cut the stream (the terminal runs
                on once it is resumed: attach to it again).
            TransportError: the stream broke (the terminal may still run).
            ProviderClosed: the provider was closed meanwhile.
            InvalidArgument: the handle was closed, or bad arguments.
            KeyboardInterrupt: after the terminal's tree was killed (bounded).
        """
        check_wait_timeout(timeout)
        v.check_cancel(cancel)
        with self._read_turn():
            return self._pull(None if timeout is None else Deadline.after(timeout), cancel)

    def wait(
        self,
        timeout: Optional[float] = None,
        *,
        cancel: Optional[CancelToken] = None,
        on_output: Optional[Callable[[str], None]] = None,
    ) -> int:
        """Wait for the program to end, reading its output; return its exit status.

        Args:
            timeout: the longest to wait, in seconds (None: until it ends).
            cancel: stops the wait from any thread (the terminal goes on).
            on_output: called on this thread with the output as it arrives, decoded as
                UTF-8 incrementally (a character is never split; invalid bytes replaced);
                without it the output is dropped. An exception it raises kills the
                terminal's tree and is raised.

        Returns:
            The exit status as a shell gives it: the program's own, or ``128 + n`` when a
            signal ``n`` ended it (137 once killed: :meth:`kill`, its ``timeout``, Ctrl-C).

        Raises:
            OperationTimeout: ``timeout`` passed; the terminal goes on.
            Cancelled: ``cancel`` fired, or the terminal's own token (it was killed).
            ProtocolError: the stream ended without the exit status.
            SandboxGoneError, SandboxPaused, TransportError, ProviderClosed,
            InvalidArgument, KeyboardInterrupt: as :meth:`read`.
        """
        check_wait_timeout(timeout)
        if on_output is not None and not callable(on_output):
            raise InvalidArgument("on_output must be a callable taking a str, or None")
        v.check_cancel(cancel)
        with self._read_turn():
            live = LiveText() if on_output is not None else None
            deadline = None if timeout is None else Deadline.after(timeout)
            while True:
                try:
                    data = self._pull(deadline, cancel)
                except OperationTimeout:
                    raise mark_worded(OperationTimeout(
                        f"terminal {self.id} did not end within the wait's timeout; it still "
                        "runs"
                    )) from None
                if not data:
                    break
                if live is not None and on_output is not None:
                    piece = live.feed(data)
                    if piece:
                        self._call(on_output, piece)
            if live is not None and on_output is not None:
                rest = live.finish(False)
                if rest:
                    self._call(on_output, rest)
        if self._no_status or self._exit_code is None:
            raise ProtocolError(f"the stream of terminal {self.id} ended without its exit "
                                "status")
        return self._exit_code

    @calls_user_code
    def _call(self, fn: Callable[[str], None], text: str) -> None:
        try:
            fn(text)
        except Exception:
            self._interrupted()
            raise

    # -- input, size, kill ----------------------------------------------------------------

    def write(self, data: Union[bytes, str], *, cancel: Optional[CancelToken] = None) -> None:
        """Type ``data`` into the terminal (``str`` as UTF-8): what a keyboard sends, so
        ``"\\r"`` or ``"\\n"`` ends a line, ``"\\x03"`` is Ctrl-C (the terminal sends its
        foreground program SIGINT), ``"\\x04"`` Ctrl-D (end of input at a line's start).
        Bounded: 30 s per 64 KiB piece (a program that reads nothing fills the terminal's
        input buffer).

        Raises:
            CommandEnded: the program has ended.
            Cancelled: ``cancel`` (or the terminal's own token) fired.
            InvalidArgument: not bytes or str, or the handle was closed.
            SandboxGoneError: the sandbox was deleted (the terminal ended with it).
            TransportError, TransportTimeout, E2BProviderError.
            KeyboardInterrupt: after the terminal's tree was killed (bounded).
        """
        if isinstance(data, str):
            try:
                data = data.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidArgument("data is not valid Unicode text (it has a lone "
                                      "surrogate); pass bytes") from None
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument("data must be bytes or str")
        with self._acting(cancel, "takes no more input", f"typing into terminal {self.id}"):
            if data:
                self._owner.send(self, bytes(data), cancel)

    def resize(self, cols: int, rows: int, *, cancel: Optional[CancelToken] = None) -> None:
        """Give the terminal a new size (its programs get SIGWINCH; ``stty size`` says
        ``rows cols``).

        Raises:
            CommandEnded: the program has ended.
            InvalidArgument: a size outside 1-65535, or the handle was closed.
            SandboxGoneError: the sandbox was deleted (the terminal ended with it).
            Cancelled, TransportError, E2BProviderError.
        """
        v.check_terminal_size(cols, rows)
        with self._acting(cancel, "cannot be resized", f"resizing terminal {self.id}"):
            self._owner.resize(self, cols, rows, cancel)

    def kill(self, *, cancel: Optional[CancelToken] = None) -> None:
        """Kill the terminal's whole process tree (as a timed-out exec is killed: its
        session, every process carrying its exec marker, then envd's process, by pid only
        while envd still lists that pid as this terminal's). Killing one that has ended
        does nothing. Returns once the kill is done in the sandbox (bounded
        by the provider's ``kill_bound`` plus 1 s); :meth:`wait` then returns 137.

        Raises:
            CommandFailed: the kill failed in the sandbox.
            SandboxGoneError: the sandbox was deleted (the terminal ended with it).
            OperationTimeout: the kill was not confirmed within its bound.
            Cancelled: ``cancel`` fired (the kill goes on).
            InvalidArgument: the handle was closed.
        """
        v.check_cancel(cancel)
        self._check_open()
        if self._ended:
            return
        fut = self._start_kill()
        bound = self._owner.ctx.bounds.kill + 1.0
        deadline = Deadline.after(bound)
        while True:
            if cancel is not None:
                cancel.raise_if_cancelled()
            slice_seconds = min(WAIT_SLICE_SECONDS, max(0.0, deadline.remaining()))
            finished, ok = wait_verdict(fut, Deadline.after(slice_seconds))
            if finished:
                break
            if deadline.expired():
                raise mark_worded(OperationTimeout(
                    f"the kill of terminal {self.id} was not confirmed within {bound:.0f} s"
                ))
        if ok is False:
            with self._lock:
                self._kill_future = None  # another kill() may try again
            gone = self._owner.fate_error(self, f"killing terminal {self.id}", cancel,
                                          paused=False)
            if gone is not None:
                raise gone
            raise mark_worded(CommandFailed(
                f"killing terminal {self.id} failed in sandbox {self.sandbox_id} (its kill "
                "script did not run or failed); kill_all() tries again, destroy() ends it"
            ))

    def _start_kill(self) -> concurrent.futures.Future[Optional[bool]]:
        """Start the kill of the tree once (thread-safe, never blocks); its future."""
        with self._lock:
            fut = self._kill_future
            if fut is None:
                # the probe may be stale (the end may have come unread): the pid is
                # signalled only while envd still lists it as this terminal's (confirm)
                fut = self._kill_future = self._owner.kills.kill(
                    self._target, self._ctl, self._began, self._owner.ctx.bounds.kill,
                    lambda: None if self._ended else self.pid, confirm=True, user=self._user,
                )
        return fut

    def _interrupted(self) -> None:
        """Ctrl-C (or the caller's callback failed): kill the tree within the interrupt
        bound; a second Ctrl-C stops waiting for it."""
        if self._ended:
            return
        bound = self._owner.ctx.bounds.interrupt_kill
        try:
            finished, ok = wait_verdict(self._start_kill(), Deadline.after(bound))
            if not (finished and ok):
                log.warning(
                    "e2b_provider: interrupted; terminal %s could not be confirmed killed "
                    "within %.0f s and may still be running", self.id, bound,
                )
        except KeyboardInterrupt:
            log.warning("e2b_provider: second interrupt; abandoning the kill of terminal %s, "
                        "which may still be running", self.id)

    @contextlib.contextmanager
    def _acting(self, cancel: Optional[CancelToken], ended: str, doing: str) -> Iterator[None]:
        """Around one action on the running terminal (:meth:`write`, :meth:`resize`): the
        checks before it (``ended`` says why an ended terminal refuses it), its errors
        worded as ``doing``, a Ctrl-C meanwhile kills the terminal's tree."""
        v.check_cancel(cancel)
        self._check_open()
        self._check_stop(cancel)
        if self._ended:
            raise self._ended_error(ended)
        outer = caller_handling()
        try:
            with describe(doing):
                yield
        except KeyboardInterrupt as exc:
            self._interrupted()
            shorten_in_generator(exc, sys._getframe(), outer)
            raise

    def _ended_error(self, what: str) -> CommandEnded:
        return CommandEnded(f"terminal {self.id} has ended and {what}; wait() gives its exit "
                            "status")

    # -- letting go ---------------------------------------------------------------------------

    def detach(self) -> None:
        """Let go of the terminal and leave it running (its ``id`` still attaches to it).
        Idempotent; the handle cannot be used afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._release_hooks()
        self._events.close()

    def close(self) -> None:
        """End this handle: kill the terminal first if this handle started it and it still
        runs (bounded, as :meth:`kill`; a failure is logged, not raised), then let go.
        Idempotent. A handle from ``attach()`` only lets go (use :meth:`kill` to end it).
        A terminal whose sandbox was deleted ended with it: that is logged at INFO."""
        if self._closed:
            return
        if self._owned and not self._ended:
            try:
                finished, ok = wait_verdict(
                    self._start_kill(), Deadline.after(self._owner.ctx.bounds.kill + 1)
                )
                if not (finished and ok):
                    said = self._owner.fate_error(self, f"closing terminal {self.id}", None,
                                                  paused=False)
                    if isinstance(said, SandboxGoneError):
                        log.info("e2b_provider: %s", said)
                    else:
                        log.warning("e2b_provider: terminal %s could not be confirmed killed "
                                    "when it was closed; kill_all() stops it", self.id)
            except KeyboardInterrupt:
                self.detach()
                raise
        self.detach()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is KeyboardInterrupt and self._owned and not self._ended:
            self._interrupted()
        self.close()
