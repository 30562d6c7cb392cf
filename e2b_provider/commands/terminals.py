"""Interactive terminals in a sandbox: a shell (or any program) on a pty, as ``docker exec -it``.

This module owns :class:`Terminals`, the provider's part behind ``terminal()``, ``attach()``
and the terminals ``commands`` lists; the handle they return is
:class:`~e2b_provider.commands.terminal_handle.Terminal`, and what runs in a terminal is
:mod:`e2b_provider.commands.terminal_wrapper`'s. A terminal is envd's own: a process
started by ``process.Process/Start`` with ``pty`` (envd gives it a new session whose
controlling terminal is the pty), typed into with ``SendInput`` (``input.pty``), resized with
``Update``, followed with ``Connect``.

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

import logging
import math
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ..cancel import WAIT_SLICE_SECONDS, CancelToken, Deadline
from ..clients.envd_requests import START_OPEN_SECONDS
from ..clients.envd_streams import PtyStream, StreamEnd
from ..commands.command import CommandInfo
from ..core.context import FILE_OP_TIMEOUT_SECONDS, ProviderContext, script_failed
from ..core.messages import mark_worded
from ..core.reboot import Reboots
from ..core.run_engine import wait_verdict
from ..errors import (
    Cancelled,
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
from ..protocol.process_events import EndEvent, StartEvent
from .kills import KillBatcher
from .terminal_handle import Terminal
from .terminal_wrapper import (
    MAX_PID,
    TERMINAL_STARTS_SCRIPT,
    listed_terminal,
    parse_starts,
    parse_terminal_id,
    terminal_env,
    terminal_id,
    terminal_wrapper,
)

__all__ = [
    "Terminals",
]

log = logging.getLogger("e2b_provider")

#: Pieces of input per ``SendInput`` request.
INPUT_PIECE = 64 * 1024
#: How long the first event (envd's answer that the process runs) may take.
OPEN_SECONDS = START_OPEN_SECONDS
#: An attach that finds the pid no longer listed waits this long for its end event.
_ENDED_WAIT_SECONDS = 5.0


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
        user: str = scripts.SANDBOX_USER,
    ) -> Terminal:
        ctx = self.ctx
        ctl = scripts.control_path(None)
        args = ["-c", terminal_wrapper(user), "capybara-exec", ctl, command or ""]
        run_env = terminal_env(env, ctl)
        # envd's kill (of its process only) comes after this process's kill of the whole
        # tree, as the exec's in-sandbox timeout: the backstop when nobody watches
        timeout_ms = None if timeout is None else (
            (math.ceil(timeout) + scripts.IN_SANDBOX_GRACE_SECONDS) * 1000
        )
        need = FILE_OP_TIMEOUT_SECONDS + (0 if timeout is None else math.ceil(timeout))

        def run(target: Target) -> Terminal:
            began = time.monotonic()
            envd = ctx.envd(target)
            events: Optional[PtyStream] = None
            try:
                events = PtyStream(envd.start_pty(
                    user=user, cmd="/bin/sh", args=args, cols=cols, rows=rows,
                    envs=run_env, cwd=cwd if cwd is not None else "/workspace", tag=ctl,
                    keepalive_seconds=ctx.bounds.keepalive, timeout_ms=timeout_ms,
                    cancel=cancel,
                ))
                pid = self._first(events, cancel, "opening")
                term = Terminal(self, sid, target, pid, ctl, events, command=command,
                                began=began, owned=True, user=user)
                term._arm(timeout, cancel)
                return term
            except BaseException as exc:
                opened = events is not None
                if events is not None:
                    events.close()
                # Once the start may have reached envd (its answer came, or the wait for it
                # was given up), stop what may run: by the control path, so a wrapper that
                # has not started yet refuses to. envd's refusal (a RemoteError: a missing
                # cwd, say) or an error answer started nothing.
                if (opened or isinstance(exc, (KeyboardInterrupt, Cancelled))) and not (
                    isinstance(exc, RemoteError)
                ):
                    self._kill_unknown(target, ctl, began, isinstance(exc, KeyboardInterrupt),
                                       user)
                raise

        return ctx.on_target(sid, cancel, run, need=need)

    def _first(self, events: PtyStream, cancel: Optional[CancelToken], doing: str) -> int:
        """Read the stream's start event (its pid) within :data:`OPEN_SECONDS`."""
        deadline = Deadline.after(OPEN_SECONDS)
        while True:
            if cancel is not None:
                cancel.raise_if_cancelled()
            if deadline.expired():
                raise OperationTimeout(f"envd did not answer within {OPEN_SECONDS:.0f} s while "
                                       f"{doing} the terminal")
            ev = events.poll(min(WAIT_SLICE_SECONDS, max(0.0, deadline.remaining())))
            if isinstance(ev, StartEvent):
                return ev.pid
            if isinstance(ev, (EndEvent, StreamEnd)):
                raise ProtocolError("the terminal's stream ended before its start event")

    def _kill_unknown(
        self, target: Target, ctl: str, began: float, interrupted: bool, user: str
    ) -> None:
        # no pid known: the kill script alone (by the control path and the marker)
        fut = self.kills.kill(target, ctl, began, self.ctx.bounds.kill, lambda: None,
                              user=user)
        bound = self.ctx.bounds.interrupt_kill if interrupted else self.ctx.bounds.kill + 1
        try:
            wait_verdict(fut, Deadline.after(bound))
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
        if pid > MAX_PID:
            raise CommandNotFound(f"no terminal {value[:120]} in sandbox {sid}: its pid {pid} "
                                  "is larger than any process's")
        ctx = self.ctx

        def run(target: Target) -> Terminal:
            envd = ctx.envd(target)
            try:
                events = PtyStream(envd.connect_pty(
                    pid, user=scripts.SANDBOX_USER, keepalive_seconds=ctx.bounds.keepalive,
                    cancel=cancel,
                ))
            except NotFound:
                raise self._not_found(value, sid) from None
            try:
                try:
                    self._first(events, cancel, "attaching to")
                except RemoteError as exc:
                    if exc.code == "not_found":
                        raise self._not_found(value, sid) from None
                    raise
                # whose it is, its id does not say: killed as root, which reaches either
                term = Terminal(self, sid, target, pid, ctl, events, command=None,
                                began=time.monotonic(), owned=False, user=scripts.ROOT_USER)
                listed = envd.list_processes(cancel=cancel)
                if any(p.get("pid") == pid and p.get("tag") == ctl for p in listed):
                    return term
                if not any(p.get("pid") == pid for p in listed):
                    # not running any more: ended within envd's 30 s, its end is on the way
                    deadline = Deadline.after(_ENDED_WAIT_SECONDS)
                    while not deadline.expired():
                        ev = events.poll(min(WAIT_SLICE_SECONDS, deadline.remaining()))
                        if ev is not None:
                            term._take(ev)
                        if term._ended:
                            return term
                raise self._not_found(value, sid)
            except BaseException:
                events.close()
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
            term = listed_terminal(p)
            if term is not None:
                found[term[0]] = (term[1], term[2])
        if not found:
            return []
        args = ["-c", TERMINAL_STARTS_SCRIPT, "capybara-ls", *(str(pid) for pid in found)]
        r = ctx.script_on(sid, args, cancel, max_output_bytes=64 * len(found) + 64)
        if r.exit_code != 0 or r.truncated:
            raise script_failed("cannot list terminals", r)
        started = parse_starts(r.stdout)
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
                envd.send_input(term.pid, bytes(piece), cancel=cancel, pty=True)

        self._on_terminal(term, cancel, send, "takes no more input")

    def resize(self, term: Terminal, cols: int, rows: int, cancel: Optional[CancelToken]
               ) -> None:
        def resize(target: Target) -> None:
            term._target = target
            self.ctx.envd(target).resize_pty(term.pid, cols, rows, cancel=cancel)

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
