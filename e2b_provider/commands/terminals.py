"""Interactive terminals in a sandbox: a shell (or any program) on a pty, as ``docker exec -it``.

This module owns :class:`Terminal`, the handle ``terminal()`` and ``attach()`` return, and
:class:`Terminals`, the provider's part behind them. A terminal is envd's own: a process
started by ``process.Process/Start`` with ``pty`` (envd gives it a new session whose
controlling terminal is the pty), typed into with ``SendInput`` (``input.pty``), resized with
``Update``, followed with ``Connect``.

What runs: :data:`TERMINAL_WRAPPER` (``/bin/sh``, as the ``sandbox`` user, with the
environment an exec gets plus ``TERM=xterm-256color``), which keeps what the exec wrapper
gives every command and a terminal needs: a pid file under the terminal's control path, the
``.kill`` refusal and the exec marker in the environment of every process it starts, so
``kill_all``, a reboot and :meth:`Terminal.kill` stop its whole tree exactly as they stop an
exec (the kills go through the exec's batched kill script, see :mod:`e2b_provider.commands.kills`; a
terminal has no holder tag, so ``kill_tagged`` leaves it alone). It leaves out what a terminal must
not have: ``setsid`` (the pty gives the session), ``timeout -s KILL`` (it would put the
program in a background process group of its terminal, where it cannot read it; a terminal's
``timeout`` is this process's watchdog, which kills the whole tree, and envd's
``Connect-Timeout-Ms`` :data:`~e2b_provider.protocol.scripts.IN_SANDBOX_GRACE_SECONDS` later, which
kills its process if nobody watched). The
wrapper stays the session leader, ignores the terminal's SIGINT and SIGQUIT itself (its
programs get them), runs ``bash -c COMMAND`` or, without a command, the user's login shell
from ``/etc/passwd`` (``-l``), then kills what the program left behind (its session, its
marker: :data:`TERMINAL_LEFTOVERS`; a job left running would hold the pty, and envd ends a
process only once its pty is closed) and exits with the program's status.

A kill by pid through envd (root) is sent only while envd lists that pid as the terminal's
(tagged with its control path): a handle that has not read the end may hold a pid envd has
forgotten and given to another process (see :mod:`e2b_provider.commands.kills`).

Output is read on the caller's thread, straight from the ``Start`` (or ``Connect``) stream
(:class:`~e2b_provider.transport.http.RawStream`: a timed-out read loses nothing), in slices of
:data:`_SLICE_S` so cancels and deadlines are seen promptly. No thread per terminal: the
terminal's timeout is a watchdog timer, its kills run on the watchdog's worker pool.

The ``id`` of a terminal (``<sandbox id>:pty-<pid>-<32 hex>``) names its envd pid and its
control path, so another process can :meth:`Terminals.attach` to it: envd's ``Connect`` by
pid gives its output from then on (envd keeps none), and ``List`` proves that pid is still
that terminal (its tag is the control path). ``List`` is also where :meth:`Terminals.list`
finds the terminals that run, whoever opened them (also a process killed since): envd
started each with this wrapper, as only a holder of the sandbox's access token can have it
do, so nothing the sandbox user does adds an entry.

A call whose stream or request broke says why when it can (one look-up of the sandbox):
the sandbox was deleted (:class:`~e2b_provider.SandboxGoneError`), or paused
(:class:`~e2b_provider.SandboxPaused`: the terminal is frozen with it), or the provider was
closed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import math
import re
import threading
import time
import uuid
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple, Union

from ..cancel import CancelReason, CancelToken, Deadline
from ..clients.envd import START_OPEN_SECONDS
from ..core.context import FILE_OP_TIMEOUT, ProviderContext, script_failed
from ..core.messages import describe, mark_worded
from ..core.reboot import Reboots
from ..errors import (
    Cancelled,
    CommandEnded,
    CommandFailed,
    CommandNotFound,
    E2BHttpError,
    E2BProviderError,
    InvalidArgument,
    NotFound,
    OperationTimeout,
    ProtocolError,
    RemoteError,
    SandboxGoneError,
    SandboxPaused,
    TransportError,
)
from ..models import Target
from ..protocol import scripts as scripts
from ..protocol import validate as v
from ..protocol.connect import EndStream, EnvelopeDecoder, Parsed
from ..protocol.process_events import (
    DataEvent,
    EndEvent,
    LiveText,
    ProcessEvent,
    StartEvent,
    event_from_wire,
    parse_output_message,
)
from ..transport.http import RawStream
from .background import CommandInfo
from .kills import KillBatcher

__all__ = [
    "DEFAULT_TERM",
    "TERMINAL_ID_PREFIX",
    "TERMINAL_LEFTOVERS",
    "TERMINAL_WRAPPER",
    "Terminal",
    "Terminals",
    "is_terminal_id",
    "parse_terminal_id",
    "terminal_env",
]

log = logging.getLogger("e2b_provider")

#: The ``TERM`` a terminal's programs see unless ``env`` says otherwise (envd sets none).
DEFAULT_TERM = "xterm-256color"
#: What comes after ``<sandbox id>:`` in a terminal's id.
TERMINAL_ID_PREFIX = "pty-"
#: Pieces of input per ``SendInput`` request.
INPUT_PIECE = 64 * 1024
#: How long the first event (envd's answer that the process runs) may take.
OPEN_SECONDS = START_OPEN_SECONDS
#: Slice of every wait on the caller's thread (cancels and Ctrl-C stay responsive).
_SLICE_S = 0.25
#: An attach that finds the pid no longer listed waits this long for its end event.
_ENDED_WAIT_S = 5.0
#: A terminal that is read keeps its sandbox's lease renewed, looked at this often.
_LEASE_LOOK_S = 30.0

#: What a terminal's wrapper becomes once its program has exited (``exec``, so it keeps its
#: pid: envd's process and the session's leader; ``$1`` the control path, ``$2`` the
#: program's status, the exec marker no longer in its environment): it kills what the
#: program left behind, then exits with the program's status. First, in up to five rounds
#: (children forked meanwhile), every process of its session but itself, listed from
#: ``/proc/*/stat`` by shell builtins alone, so the listing starts no process of its own
#: (a job the shell left running, ``nohup``'d or ignoring the hang-up, holds the terminal and
#: would keep envd from ever ending it); then every process carrying the terminal's exec
#: marker (``MARKED_KILL``: what left the session with ``setsid``). Nothing in it is quoted
#: with ``'``: :data:`TERMINAL_WRAPPER` quotes it so.
TERMINAL_LEFTOVERS = (
    scripts.MARKED_KILL
    + 'trap "" INT QUIT; c=$1; s=$2; r=0; while [ $r -lt 5 ]; do r=$((r+1)); g=; '
    'for f in /proc/[0-9]*/stat; do { read -r x < "$f"; } 2>/dev/null || continue; '
    'x=${x##*)}; set -- $x; [ "$4" = "$$" ] && [ "$1" != Z ] || continue; f=${f%/stat}; '
    'f=${f#/proc/}; [ "$f" = "$$" ] || g="$g $f"; done; [ -n "$g" ] || break; '
    'kill -9 $g 2>/dev/null; done; z -xF "' + scripts.EXEC_MARKER + '=$c"; exit $s'
)

#: Runs the terminal's program: ``$1`` its control path, ``$2`` a shell command for
#: ``/bin/bash -c`` (empty: the user's login shell). See the module's docstring. Its pid file
#: is removed in the foreground (the exec wrapper removes it in the background, off its
#: stream's end): a background ``rm`` would share the terminal's process group and die of
#: the hang-up the kernel sends it when the wrapper, the session's leader, exits. When the
#: program has exited, the wrapper becomes :data:`TERMINAL_LEFTOVERS` (without the exec
#: marker, so its sweep by the marker spares it; with SIGINT and SIGQUIT ignored, not
#: trapped, so a Ctrl-C typed meanwhile cannot end it before it ignores them itself): the
#: program's exit ends the terminal, and nothing it started outlives it.
TERMINAL_WRAPPER = (
    'c=$1; echo $$ > "$c.pid" 2>/dev/null; if [ -e "$c.kill" ]; then exit 137; fi; '
    "trap : INT QUIT; "
    'if [ -n "$2" ]; then /bin/bash -c "$2"; else u=${USER:-$(id -un)}; l=; '
    'while IFS=: read -r n _ _ _ _ _ l; do [ "$n" = "$u" ] && break; l=; done < /etc/passwd; '
    '[ -x "$l" ] || l=/bin/sh; "$l" -l; fi; s=$?; trap "" INT QUIT; rm -f "$c.pid" 2>/dev/null; '
    "unset " + scripts.EXEC_MARKER + "; exec /bin/sh -c '" + TERMINAL_LEFTOVERS
    + "' capybara-exec \"$c\" $s"
)

_ID_RE = re.compile(r"pty-(?P<pid>[1-9][0-9]{0,9})-(?P<hex>[0-9a-f]{32})")
_CONTROL_PREFIX = "/tmp/.capybara-exec-"
#: The largest pid envd can name (its pids are 32-bit): an id with a larger one names none.
_MAX_PID = 2**32 - 1
#: As the sandbox user, with the pids of terminals as arguments: the kernel's account of
#: when each started. Prints ``CLK_TCK UPTIME NOW`` (seconds since boot, and since the
#: epoch, read one after the other), then ``PID STARTTIME`` (clock ticks since boot, field
#: 22 of ``/proc/PID/stat``, read after the last ``) ``: the program's name before it is
#: the user's to choose) for each that still runs.
TERMINAL_STARTS_SCRIPT = (
    "set -f; t=$(getconf CLK_TCK 2>/dev/null) || t=100; "
    'read -r u _ < /proc/uptime; echo "$t $u $(date +%s.%N)"; '
    'for p; do l=; read -r l 2>/dev/null < "/proc/$p/stat" || continue; '
    'set -- ${l##*") "}; [ $# -ge 20 ] || continue; shift 19; echo "$p $1"; done'
)

class _StreamEnd:
    """The stream's end-of-stream message came (without an error)."""


_END = _StreamEnd()


def terminal_env(env: Mapping[str, str], ctl: str) -> Dict[str, str]:
    """The environment envd starts a terminal's wrapper with: ``TERM`` (unless ``env`` has
    one), ``env``, and the exec marker of control path ``ctl`` (never overridden)."""
    out = {"TERM": DEFAULT_TERM}
    out.update(env)
    out[scripts.EXEC_MARKER] = ctl
    return out


def terminal_id(sandbox_id: str, pid: int, ctl: str) -> str:
    """The id of the terminal with envd pid ``pid`` and control path ``ctl``."""
    return f"{sandbox_id}:{TERMINAL_ID_PREFIX}{pid}-{uuid.UUID(ctl[len(_CONTROL_PREFIX):]).hex}"


def is_terminal_id(value: object) -> bool:
    """Whether ``value`` has the shape of a terminal's id (not that it exists)."""
    if not isinstance(value, str):
        return False
    _, sep, tail = value.rpartition(":")
    return bool(sep) and _ID_RE.fullmatch(tail) is not None


def parse_terminal_id(value: object) -> Tuple[str, int, str]:
    """``(sandbox id, pid, control path)`` of a terminal id.

    Raises:
        InvalidArgument: not a terminal id (before any I/O).
    """
    if isinstance(value, str):
        sid, sep, tail = value.rpartition(":")
        m = _ID_RE.fullmatch(tail)
        if sep and sid and m is not None:
            return sid, int(m.group("pid")), _CONTROL_PREFIX + str(uuid.UUID(m.group("hex")))
    raise InvalidArgument(
        f"{str(value)[:100]!r} is not a terminal id (they look like "
        "'<sandbox id>:pty-<pid>-<32 hex>', as Terminal.id gives them)"
    )


class _Events:
    """The process events of a terminal's stream, polled with a timeout (sans threads)."""

    def __init__(self, raw: RawStream) -> None:
        self.raw = raw
        self._decoder = EnvelopeDecoder(large=parse_output_message)
        self._pending: Deque[ProcessEvent] = collections.deque()
        self._end: Optional[EndStream] = None
        self.done = False

    def buffered(self) -> bool:
        """True when an event (or the end) was received and not polled yet: ``select`` on
        the socket does not see it."""
        return bool(self._pending) or self._end is not None

    def poll(self, timeout: Optional[float]) -> Union[ProcessEvent, _StreamEnd, None]:
        """The next event; :data:`_END` after the end-of-stream message; None when none
        was complete within ``timeout`` seconds (or a part of one came).

        Raises:
            RemoteError: the stream ended with a Connect error.
            ProtocolError, TransportError, TransportTimeout: as the stream's reads.
        """
        if self._pending:
            return self._pending.popleft()
        if self._end is not None or self.done:
            end, self._end = self._end, None
            self.done = True
            if end is not None and end.error_code is not None:
                raise RemoteError(end.error_code, end.error_message, operation="terminal stream")
            return _END
        data = self.raw.read(timeout)
        if data is None:
            return None
        if not data:
            self._decoder.close()  # raises: the body ended inside a message
            raise ProtocolError("the terminal's stream ended without an end-of-stream message")
        self._decoder.feed(data)
        for item in self._decoder:
            if isinstance(item, EndStream):
                self._end = item
                continue
            ev = item.value if isinstance(item, Parsed) else event_from_wire(item.data)
            if ev is not None:
                self._pending.append(ev)
        if self._pending:
            return self._pending.popleft()
        if self._end is not None:
            return self.poll(0)
        return None


def _wait_verdict(fut: concurrent.futures.Future[Optional[bool]], bound: float
                  ) -> Tuple[bool, Optional[bool]]:
    """Wait for a kill's verdict in slices for at most ``bound`` seconds: ``(finished,
    verdict)``."""
    deadline = Deadline.after(bound)
    while True:
        left = deadline.remaining()
        try:
            value = fut.result(timeout=max(0.0, min(left, _SLICE_S)))
            return True, None if value is None else bool(value)
        except concurrent.futures.TimeoutError:
            if left <= 0:
                return False, None
        except Exception:
            return True, False


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
        raw: RawStream,
        events: _Events,
        *,
        command: Optional[str],
        began: float,
        owned: bool,
    ) -> None:
        self._owner = owner
        self.sandbox_id = sid
        self._target = target
        self.pid = pid
        self._ctl = ctl
        self.id = terminal_id(sid, pid, ctl)
        self.command = command
        self._raw = raw
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
        return self._raw.fileno()

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
        self._raw.close()

    def _take(self, ev: Union[ProcessEvent, _StreamEnd]) -> None:
        if isinstance(ev, DataEvent):
            self._out += ev.stdout
            self._out += ev.stderr
        elif isinstance(ev, EndEvent):
            code = ev.exit_code
            if code is None:
                code = ev.raw_exit_code if ev.raw_exit_code is not None else -1
            self._ended_with(code)
        elif isinstance(ev, _StreamEnd):
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
            wait = _SLICE_S
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
        finished, ok = _wait_verdict(fut, bound)
        if not (finished and ok):
            log.warning("e2b_provider: terminal %s ended, but the kill of its tree could not "
                        "be confirmed within %.0f s; kill_all() stops what is left", self.id,
                        bound)

    def _keep_lease(self) -> None:
        now = time.monotonic()
        if now - self._lease_looked < _LEASE_LOOK_S:
            return
        self._lease_looked = now
        ctx = self._owner.ctx
        lease = ctx.leases.lease(self.sandbox_id)
        if lease is not None and lease.ends_at > ctx.leases.now():
            try:  # valid now: no I/O here; renewed in the background when half gone
                ctx.leases.get(self.sandbox_id, need=0.0, lease_seconds=ctx.lease_seconds())
            except E2BProviderError:
                pass

    def _reading(self) -> None:
        if not self._reader.acquire(blocking=False):
            raise RuntimeError(f"terminal {self.id} is already being read by another thread")

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
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not (math.isfinite(timeout) and timeout >= 0)
        ):
            raise InvalidArgument("timeout must be a non-negative number of seconds, or None")
        v.check_cancel(cancel)
        self._check_open()
        self._reading()
        try:
            return self._pull(None if timeout is None else Deadline.after(timeout), cancel)
        except KeyboardInterrupt:
            self._interrupted()
            raise
        finally:
            self._reader.release()

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
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not (math.isfinite(timeout) and timeout >= 0)
        ):
            raise InvalidArgument("timeout must be a non-negative number of seconds, or None")
        if on_output is not None and not callable(on_output):
            raise InvalidArgument("on_output must be a callable taking a str, or None")
        v.check_cancel(cancel)
        self._check_open()
        self._reading()
        live = LiveText() if on_output is not None else None
        deadline = None if timeout is None else Deadline.after(timeout)
        try:
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
        except KeyboardInterrupt:
            self._interrupted()
            raise
        finally:
            self._reader.release()
        if self._no_status or self._exit_code is None:
            raise ProtocolError(f"the stream of terminal {self.id} ended without its exit "
                                "status")
        return self._exit_code

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
        v.check_cancel(cancel)
        self._check_open()
        self._check_stop(cancel)
        if self._ended:
            raise self._ended_error("takes no more input")
        if not data:
            return
        try:
            with describe(f"typing into terminal {self.id}"):
                self._owner.send(self, bytes(data), cancel)
        except KeyboardInterrupt:
            self._interrupted()
            raise

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
        v.check_cancel(cancel)
        self._check_open()
        self._check_stop(cancel)
        if self._ended:
            raise self._ended_error("cannot be resized")
        try:
            with describe(f"resizing terminal {self.id}"):
                self._owner.resize(self, cols, rows, cancel)
        except KeyboardInterrupt:
            self._interrupted()
            raise

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
            finished, ok = _wait_verdict(fut, min(_SLICE_S, max(0.0, deadline.remaining())))
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
                    lambda: None if self._ended else self.pid, confirm=True,
                )
        return fut

    def _interrupted(self) -> None:
        """Ctrl-C (or the caller's callback failed): kill the tree within the interrupt
        bound; a second Ctrl-C stops waiting for it."""
        if self._ended:
            return
        bound = self._owner.ctx.bounds.interrupt_kill
        try:
            finished, ok = _wait_verdict(self._start_kill(), bound)
            if not (finished and ok):
                log.warning(
                    "e2b_provider: interrupted; terminal %s could not be confirmed killed "
                    "within %.0f s and may still be running", self.id, bound,
                )
        except KeyboardInterrupt:
            log.warning("e2b_provider: second interrupt; abandoning the kill of terminal %s, "
                        "which may still be running", self.id)

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
        self._raw.close()

    def close(self) -> None:
        """End this handle: kill the terminal first if this handle started it and it still
        runs (bounded, as :meth:`kill`; a failure is logged, not raised), then let go.
        Idempotent. A handle from ``attach()`` only lets go (use :meth:`kill` to end it).
        A terminal whose sandbox was deleted ended with it: that is logged at INFO."""
        if self._closed:
            return
        if self._owned and not self._ended:
            try:
                finished, ok = _wait_verdict(self._start_kill(), self._owner.ctx.bounds.kill + 1)
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


def _listed_terminal(p: Mapping[str, Any]) -> Optional[Tuple[int, str, str]]:
    """``(pid, control path, command)`` when envd's ``List`` entry ``p`` is a terminal this
    library opened (its wrapper, as :meth:`Terminals.open` starts it), else None."""
    ctl, pid, config = p.get("tag"), p.get("pid"), p.get("config")
    if not (isinstance(ctl, str) and isinstance(pid, int) and not isinstance(pid, bool)
            and 0 < pid <= _MAX_PID and isinstance(config, dict)):
        return None
    args, envs = config.get("args"), config.get("envs")
    if (config.get("cmd") != "/bin/sh" or not isinstance(args, list) or len(args) != 5
            or args[:4] != ["-c", TERMINAL_WRAPPER, "capybara-exec", ctl]
            or not isinstance(args[4], str) or not isinstance(envs, dict)
            or envs.get(scripts.EXEC_MARKER) != ctl):
        return None
    try:  # a control path without a tag, as terminals have, that their ids name exactly
        if _CONTROL_PREFIX + str(uuid.UUID(ctl[len(_CONTROL_PREFIX):])) != ctl:
            return None
    except ValueError:
        return None
    return pid, ctl, args[4]


def _parse_starts(out: bytes) -> Dict[int, float]:
    """What :data:`TERMINAL_STARTS_SCRIPT` printed: each pid's start, in seconds since the
    epoch (the sandbox's clock).

    Raises:
        ProtocolError: its output is not what it prints.
    """
    lines = out.decode("ascii", "replace").splitlines()
    try:
        tick_s, up_s, now_s = lines[0].split()
        tick, up, now = int(tick_s), float(up_s), float(now_s)
        starts = {}
        for line in lines[1:]:
            pid, ticks = (int(w) for w in line.split())
            starts[pid] = now - up + ticks / tick
    except (IndexError, ValueError, ZeroDivisionError):
        raise ProtocolError("the start times of the terminals were read as something else"
                            ) from None
    return starts


def _gone_error(term: Terminal, doing: str) -> SandboxGoneError:
    """A call of ``term`` (``doing`` it, or "" when the caller words it) found its sandbox
    deleted."""
    err = SandboxGoneError(
        f"sandbox {term.sandbox_id} was deleted (by destroy() or another client, or by E2B) "
        f"and terminal {term.id} ended with it; create a new sandbox"
    )
    if doing:
        err.args = (f"{doing} failed: {err}",)
        mark_worded(err)
    return err


def _gone_tty(exc: E2BHttpError) -> bool:
    """envd's answer for input or a resize sent to a terminal whose process ended (its pty
    is closed) but is not yet forgotten."""
    text = exc.message.lower()
    return exc.status == 500 and ("tty" in text or "pty" in text)


class Terminals:
    """Open, attach and drive terminals (arguments already validated).

    Args:
        ctx: the provider's shared state.
        reboots: for the kills' "rebooted since" check.
    """

    def __init__(self, ctx: ProviderContext, reboots: Reboots) -> None:
        self.ctx = ctx
        self.kills = KillBatcher(ctx, reboots.rebooted_since)

    # -- open ---------------------------------------------------------------------------------

    def open(
        self,
        sid: str,
        command: Optional[str],
        *,
        cols: int,
        rows: int,
        cwd: Optional[str],
        env: Mapping[str, str],
        timeout: Optional[float],
        cancel: Optional[CancelToken],
    ) -> Terminal:
        ctx = self.ctx
        ctl = scripts.control_path(None)
        args = ["-c", TERMINAL_WRAPPER, "capybara-exec", ctl, command or ""]
        run_env = terminal_env(env, ctl)
        # envd's kill (of its process only) comes after this process's kill of the whole
        # tree, as the exec's in-sandbox timeout: the backstop when nobody watches
        timeout_ms = None if timeout is None else (
            (math.ceil(timeout) + scripts.IN_SANDBOX_GRACE_SECONDS) * 1000
        )
        need = FILE_OP_TIMEOUT if timeout is None else math.ceil(timeout) + FILE_OP_TIMEOUT

        def run(target: Target) -> Terminal:
            began = time.monotonic()
            envd = ctx.envd(target)
            raw: Optional[RawStream] = None
            try:
                raw = envd.start_pty(
                    user=scripts.SANDBOX_USER, cmd="/bin/sh", args=args, cols=cols, rows=rows,
                    envs=run_env, cwd=cwd if cwd is not None else "/workspace", tag=ctl,
                    keepalive_seconds=ctx.bounds.keepalive, timeout_ms=timeout_ms,
                    token=cancel,
                )
                events = _Events(raw)
                pid = self._first(events, cancel, "opening")
                term = Terminal(self, sid, target, pid, ctl, raw, events, command=command,
                                began=began, owned=True)
                term._arm(timeout, cancel)
                return term
            except BaseException as exc:
                opened = raw is not None
                if raw is not None:
                    raw.close()
                # Once the start may have reached envd (its answer came, or the wait for it
                # was given up), stop what may run: by the control path, so a wrapper that
                # has not started yet refuses to. envd's refusal (a RemoteError: a missing
                # cwd, say) or an error answer started nothing.
                if (opened or isinstance(exc, (KeyboardInterrupt, Cancelled))) and not (
                    isinstance(exc, RemoteError)
                ):
                    self._kill_unknown(target, ctl, began, isinstance(exc, KeyboardInterrupt))
                raise

        return ctx.on_target(sid, cancel, run, need=need)

    def _first(self, events: _Events, cancel: Optional[CancelToken], doing: str) -> int:
        """Read the stream's start event (its pid) within :data:`OPEN_SECONDS`."""
        deadline = Deadline.after(OPEN_SECONDS)
        while True:
            if cancel is not None:
                cancel.raise_if_cancelled()
            if deadline.expired():
                raise OperationTimeout(f"envd did not answer within {OPEN_SECONDS:.0f} s while "
                                       f"{doing} the terminal")
            ev = events.poll(min(_SLICE_S, max(0.0, deadline.remaining())))
            if isinstance(ev, StartEvent):
                return ev.pid
            if isinstance(ev, (EndEvent, _StreamEnd)):
                raise ProtocolError("the terminal's stream ended before its start event")

    def _kill_unknown(self, target: Target, ctl: str, began: float, interrupted: bool) -> None:
        # no pid known: the kill script alone (by the control path and the marker)
        fut = self.kills.kill(target, ctl, began, self.ctx.bounds.kill, lambda: None)
        bound = self.ctx.bounds.interrupt_kill if interrupted else self.ctx.bounds.kill + 1
        try:
            _wait_verdict(fut, bound)
        except KeyboardInterrupt:
            log.warning("e2b_provider: second interrupt; a terminal that was being opened may "
                        "still be running (kill_all() stops it)")

    # -- attach -------------------------------------------------------------------------------

    def attach(self, sid: str, value: str, cancel: Optional[CancelToken]) -> Terminal:
        owner, pid, ctl = parse_terminal_id(value)
        if owner != sid:
            raise InvalidArgument(
                f"terminal {value[:120]} belongs to sandbox {owner}, not to sandbox {sid}"
            )
        if pid > _MAX_PID:
            raise CommandNotFound(f"no terminal {value[:120]} in sandbox {sid}: its pid {pid} "
                                  "is larger than any process's")
        ctx = self.ctx

        def run(target: Target) -> Terminal:
            envd = ctx.envd(target)
            try:
                raw = envd.connect_pty(pid, user=scripts.SANDBOX_USER,
                                       keepalive_seconds=ctx.bounds.keepalive, token=cancel)
            except NotFound:
                raise self._not_found(value, sid) from None
            try:
                events = _Events(raw)
                try:
                    self._first(events, cancel, "attaching to")
                except RemoteError as exc:
                    if exc.code == "not_found":
                        raise self._not_found(value, sid) from None
                    raise
                term = Terminal(self, sid, target, pid, ctl, raw, events, command=None,
                                began=time.monotonic(), owned=False)
                listed = envd.list_processes(token=cancel)
                if any(p.get("pid") == pid and p.get("tag") == ctl for p in listed):
                    return term
                if not any(p.get("pid") == pid for p in listed):
                    # not running any more: ended within envd's 30 s, its end is on the way
                    deadline = Deadline.after(_ENDED_WAIT_S)
                    while not deadline.expired():
                        ev = events.poll(min(_SLICE_S, deadline.remaining()))
                        if ev is not None:
                            term._take(ev)
                        if term._ended:
                            return term
                raise self._not_found(value, sid)
            except BaseException:
                raw.close()
                raise

        return ctx.on_target(sid, cancel, run)

    @staticmethod
    def _not_found(value: str, sid: str) -> CommandNotFound:
        return CommandNotFound(
            f"no terminal {value[:120]} in sandbox {sid}: it ended (envd forgets a process "
            "30 s after its end) or was never there"
        )

    # -- what became of a terminal's sandbox ----------------------------------------------------

    def fate_error(self, term: Terminal, doing: str, cancel: Optional[CancelToken], *,
                   paused: bool = True) -> Optional[E2BProviderError]:
        """The error for a call of ``term`` (``doing`` it; "" for a caller that words its
        errors itself) whose connection broke or whose sandbox could not be reached: the
        provider was closed, or (one look-up of the sandbox's state) the sandbox was deleted
        or, with ``paused``, paused since the terminal was opened or attached; None when
        none of these says why."""
        ctx = self.ctx
        closed = ctx.closed_error()
        if closed is not None:
            return closed
        fate = ctx.fate_during(term.sandbox_id, term._began, cancel)
        if fate == "gone":
            ctx.leases.forget(term.sandbox_id)
            return _gone_error(term, doing)
        if fate == "paused" and paused:
            err = SandboxPaused(
                f"sandbox {term.sandbox_id} was paused (by suspend(), another client or "
                f"E2B), which cut the stream of terminal {term.id}: the terminal is frozen "
                "with the sandbox and runs on once it is resumed (any call resumes it); "
                "attach() to it again to go on; kill() or kill_all() stops it",
                sandbox_id=term.sandbox_id,
            )
            if doing:
                err.args = (f"{doing} failed: {err}",)
                mark_worded(err)
            return err
        return None

    # -- listing -----------------------------------------------------------------------------

    def list(self, sid: str, cancel: Optional[CancelToken],
             processes: Callable[[], List[Dict[str, Any]]]) -> List[CommandInfo]:
        """The terminals that run in the sandbox, whoever opened them: the processes envd
        lists (only a holder of the sandbox's access token can start one) that it started
        with this library's terminal wrapper and a control path as tag, with when each
        started (the kernel's account, one script)."""
        ctx = self.ctx
        listed = processes()
        found: Dict[int, Tuple[str, str]] = {}
        for p in listed:
            term = _listed_terminal(p)
            if term is not None:
                found[term[0]] = (term[1], term[2])
        if not found:
            return []
        args = ["-c", TERMINAL_STARTS_SCRIPT, "capybara-ls", *(str(pid) for pid in found)]
        r = ctx.script_on(sid, args, cancel, max_output_bytes=64 * len(found) + 64)
        if r.exit_code != 0 or r.truncated:
            raise script_failed("cannot list terminals", r)
        started = _parse_starts(r.stdout)
        out = []
        for pid, (ctl, command) in found.items():
            if pid in started:  # else it ended meanwhile
                out.append(CommandInfo(id=terminal_id(sid, pid, ctl), pid=pid, tag=None,
                                       command=command, started_at=started[pid],
                                       kind="terminal"))
        return sorted(out, key=lambda c: c.started_at)

    # -- input and size -----------------------------------------------------------------------

    def send(self, term: Terminal, data: bytes, cancel: Optional[CancelToken]) -> None:
        def send(target: Target) -> None:
            term._target = target
            envd = self.ctx.envd(target)
            view = memoryview(data)
            while view:
                piece, view = view[:INPUT_PIECE], view[INPUT_PIECE:]
                envd.send_input(term.pid, bytes(piece), token=cancel, pty=True)

        self._on_terminal(term, cancel, send, "takes no more input")

    def resize(self, term: Terminal, cols: int, rows: int, cancel: Optional[CancelToken]
               ) -> None:
        def resize(target: Target) -> None:
            term._target = target
            self.ctx.envd(target).resize_pty(term.pid, cols, rows, token=cancel)

        self._on_terminal(term, cancel, resize, "cannot be resized")

    def _on_terminal(self, term: Terminal, cancel: Optional[CancelToken],
                     fn: Callable[[Target], None], what: str) -> None:
        try:
            self.ctx.on_target(term.sandbox_id, cancel, fn)
        except SandboxGoneError as exc:  # a NotFound, but the terminal did not just end
            self.ctx.leases.forget(term.sandbox_id)
            raise _gone_error(term, "") from exc
        except (TransportError, ProtocolError) as exc:
            said = self.fate_error(term, "", cancel)
            if said is None:
                raise
            raise said from exc
        except NotFound:
            raise term._ended_error(what) from None
        except E2BHttpError as exc:
            if not _gone_tty(exc):
                raise
            raise term._ended_error(what) from None
