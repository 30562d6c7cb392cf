"""Commands that outlive the call: start, follow, attach, list, stdin, kill.

This module owns :class:`Background`, the provider's part behind ``start``, ``attach``
and ``commands``, and :class:`Command`, the handle they return.

A background command runs under a supervisor in the sandbox
(:mod:`e2b_provider.sandbox_side.supervisor`, ``python3`` as ``sandbox``), which envd
starts and keeps (its pid is the command's pid; its standard input, the command's). The
supervisor runs the exec wrapper (own session, pid file, exec marker, tag, and an
in-sandbox ``timeout -s KILL`` when a timeout is given), so ``kill_all``, ``kill_tagged``,
a reboot and ``destroy`` reach the command's whole tree as they reach an exec's. It keeps
the last bytes of stdout and of stderr and, once the command ended, its status, in a record
under :data:`~._command_records.RECORDS`: any process can read them later, also long after
the command ended and the process that started it exited.

Following (:meth:`Command.wait`) reads on the caller's thread: the record first (through
the file agent, one request), then envd's ``Connect`` to the supervisor, whose frames carry
stream offsets, so nothing is shown twice and a gap (frames the supervisor dropped while
nobody read fast enough) is read from the record. No thread per command: deadlines and
cancels go through the shared watchdog.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import attrs

from . import _scripts as scripts
from . import _validate as v
from ._agent import AgentUnavailable, FileAgents
from ._command_records import (
    COMMAND_TAG_PREFIX,
    RECORDS,
    FrameDecoder,
    KeptOutput,
    command_id,
    decode_tail,
    parse_command_id,
    split_pieces,
    tag_of_control_path,
)
from ._context import FILE_OP_TIMEOUT, ProviderContext, script_failed
from ._messages import describe, mark_worded
from ._process import DataEvent, EndEvent
from .cancel import CancelToken, Deadline
from .envd import ProcessStream
from .errors import (
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
    TransportError,
)
from .models import ExecResult, Target
from .sandbox_side import source

__all__ = ["Background", "Command", "CommandInfo", "CommandOutput"]

log = logging.getLogger("e2b_provider")

#: A live-output callback (decoded text, on the waiting thread).
OnText = Callable[[str], None]
#: How long ``start`` may take until the supervisor says it runs.
START_SECONDS = 60.0
#: The most output of one stream a follower holds (``start`` accepts no larger cap).
MAX_KEPT = 1 << 30
#: Pieces of standard input per ``SendInput`` request.
STDIN_PIECE = 256 * 1024
#: A follower reconnects after a broken stream at most this many times in a row without
#: progress.
_RECONNECTS = 3

#: Runs the supervisor with the flag it needs (``${LC_CTYPE+1}``: was ``LC_CTYPE`` set before
#: Python started, which may add one for itself).
_LAUNCH = (
    'exec python3 -I -S -X utf8 -c "$1" capybara-bg "$2" "$3" "$4" "$5" "$6" "${LC_CTYPE+1}" '
    '"$7" "$8"'
)
#: As ``sandbox``: mark the record ``$1`` killed, then kill the exec ``$2`` as a batch kill does.
_KILL = 'm=$1; : > "$m" 2>/dev/null; shift; ' + scripts.KILL_BATCH_SCRIPT


@attrs.frozen
class CommandInfo:
    """A background command that still runs (see ``commands``).

    Attributes:
        id: the command's id (for ``attach``, from any process).
        pid: its process id in the sandbox (its supervisor's, which envd knows).
        tag: the tag it was started with, or None.
        command: the shell command line.
        started_at: when it started, in seconds since the epoch (the sandbox's clock).
    """

    id: str
    pid: int
    tag: Optional[str]
    command: str
    started_at: float


@attrs.frozen
class CommandOutput:
    """What a background command printed, as far as the sandbox keeps it.

    Attributes:
        stdout: the last ``max_output_bytes`` of standard output, decoded as UTF-8.
        stderr: likewise for standard error.
        truncated: True when earlier output was dropped (either stream).
    """

    stdout: str
    stderr: str
    truncated: bool


@attrs.frozen
class _Record:
    meta: Dict[str, Any]
    status: Optional[Dict[str, Any]]
    alive: bool
    out: Tuple[int, int, bytes]  # first offset returned, stream total, bytes
    err: Tuple[int, int, bytes]


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


class Command:
    """A command started with ``start`` (or found with ``attach``) that may still run.

    A handle, not a thread: nothing runs in this process while nobody calls it. The
    sandbox keeps the command's output (the last ``max_output_bytes`` of stdout and,
    separately, of stderr) and its exit status until the sandbox is destroyed, so any
    process can :meth:`wait` for it, read its :meth:`output`, or stop it.

    Attributes:
        id: a string naming the command in any process (``<sandbox id>:<32 hex>``).
        sandbox_id: the sandbox it runs in.
        pid: its process id in the sandbox (envd's: its supervisor's).
        tag: the tag it was started with, or None.
        command: the shell command line.
        started_at: when it started, in seconds since the epoch (the sandbox's clock).
        stdin: whether it was started with a standard input (``stdin=True``).
    """

    def __init__(self, owner: Background, sid: str, cid: str, meta: Dict[str, Any]) -> None:
        self._owner = owner
        self.sandbox_id = sid
        self._cid = cid
        self.id = command_id(sid, cid)
        try:
            self.pid = int(meta["pid"])
            self._ctl = str(meta.get("ctl", ""))
            self.command = str(meta.get("command", ""))
            self.started_at = float(meta.get("started_at", 0.0))
            # the record is the sandbox user's: a cap past what start accepts is not believed
            self._cap = max(1024, min(int(meta.get("cap", 1 << 20)), MAX_KEPT))
        except (KeyError, TypeError, ValueError):
            raise CommandFailed(f"the record of command {self.id} is damaged") from None
        self.tag = tag_of_control_path(self._ctl)
        self.stdin = meta.get("stdin") is True
        self._stdin_closed = False

    def __repr__(self) -> str:
        return f"Command(id={self.id!r}, pid={self.pid}, tag={self.tag!r})"

    @property
    def running(self) -> bool:
        """Whether the command still runs (asks the sandbox: one request)."""
        with describe(f"asking whether command {self.id} runs"):
            return self._owner.read(self.sandbox_id, self._cid, 0, 0, 0, None).alive

    def output(self, *, cancel: Optional[CancelToken] = None) -> CommandOutput:
        """What the command printed so far (the last ``max_output_bytes`` of each stream).

        Raises:
            CommandNotFound: the record is gone (the sandbox was replaced).
            InvalidArgument: ``cancel`` is not a CancelToken (before any I/O).
            Cancelled, SandboxGoneError, E2BProviderError.
        """
        v.check_cancel(cancel)
        with describe(f"reading the output of command {self.id}"):
            r = self._owner.read(self.sandbox_id, self._cid, -1, -1, self._cap, cancel)
        out, err = KeptOutput(self._cap), KeptOutput(self._cap)
        out.reset(r.out[0], r.out[2])
        err.reset(r.err[0], r.err[2])
        return CommandOutput(decode_tail(out.data, out.cut), decode_tail(err.data, err.cut),
                             out.cut or err.cut)

    def wait(
        self,
        timeout: Optional[float] = None,
        *,
        cancel: Optional[CancelToken] = None,
        on_stdout: Optional[OnText] = None,
        on_stderr: Optional[OnText] = None,
    ) -> ExecResult:
        """Wait for the command to end, following its output.

        ``on_stdout`` / ``on_stderr`` get the output the sandbox still keeps first (from the
        start, for a command that printed less than ``max_output_bytes``), then the output
        as it comes, on the calling thread, decoded incrementally.

        Stopping the wait never stops the command: when ``timeout`` passes,
        :class:`~e2b_provider.OperationTimeout` is raised; when ``cancel`` fires,
        :class:`~e2b_provider.Cancelled`; on Ctrl-C, ``KeyboardInterrupt`` is raised as
        usual. The command goes on in each case (:meth:`kill` stops it).

        Args:
            timeout: the longest to wait, in seconds (None: until it ends).
            cancel: stops the wait from any thread.
            on_stdout: called with standard output text as it arrives.
            on_stderr: the same for standard error.

        Returns:
            The :class:`~e2b_provider.ExecResult`: ``exit_code`` (None when it timed out,
            was killed with :meth:`kill`, or its end was not recorded because the sandbox
            restarted or its supervisor was killed), the last ``max_output_bytes`` of
            stdout and of stderr (``truncated`` when earlier output was dropped),
            ``timed_out`` (its own ``timeout`` fired), ``cancelled`` (:meth:`kill` stopped it).

        Raises:
            OperationTimeout: ``timeout`` passed; the command still runs.
            Cancelled: ``cancel`` fired; the command still runs.
            CommandNotFound: the record is gone.
            SandboxGoneError, E2BProviderError.
        """
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
                math.isfinite(timeout) and timeout >= 0
            ):
                raise InvalidArgument("timeout must be a non-negative number of seconds, or None")
        for name, cb in (("on_stdout", on_stdout), ("on_stderr", on_stderr)):
            if cb is not None and not callable(cb):
                raise InvalidArgument(f"{name} must be a callable taking a str, or None")
        v.check_cancel(cancel)
        with describe(f"waiting for command {self.id}"):
            return self._owner.follow(self, timeout, cancel, on_stdout, on_stderr)

    def send_stdin(self, data: Union[bytes, str], *, cancel: Optional[CancelToken] = None) -> None:
        """Write ``data`` (``str`` as UTF-8) to the command's standard input.

        Raises:
            InvalidArgument: not started with ``stdin=True``, its input already closed, or
                ``data`` not bytes or str (before any I/O).
            CommandEnded: the command has ended, or its input is closed (by
                :meth:`close_stdin` elsewhere, or by the command).
            Cancelled, SandboxGoneError, E2BProviderError.
        """
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument("data must be bytes or str")
        self._check_stdin()
        v.check_cancel(cancel)
        with describe(f"sending input to command {self.id}"):
            self._owner.send_stdin(self, bytes(data), cancel)

    def close_stdin(self, *, cancel: Optional[CancelToken] = None) -> None:
        """Close the command's standard input (it reads end of file). Closing it again, or
        after the command ended, does nothing.

        Raises:
            InvalidArgument: not started with ``stdin=True`` (before any I/O).
            Cancelled, SandboxGoneError, E2BProviderError.
        """
        if not self.stdin:
            raise InvalidArgument(f"command {self.id} was started without stdin=True")
        v.check_cancel(cancel)
        if self._stdin_closed:
            return
        with describe(f"closing the input of command {self.id}"):
            self._owner.close_stdin(self, cancel)
        self._stdin_closed = True

    def kill(self, *, cancel: Optional[CancelToken] = None) -> None:
        """Stop the command and its whole process tree (as a timed-out exec is stopped).
        Its end is then recorded as ``cancelled``. Killing an ended command does nothing.

        Raises:
            InvalidArgument: ``cancel`` is not a CancelToken (before any I/O).
            CommandFailed: the kill script failed.
            Cancelled, SandboxGoneError, E2BProviderError.
        """
        v.check_cancel(cancel)
        with describe(f"killing command {self.id}"):
            self._owner.kill(self, cancel)

    def _check_stdin(self) -> None:
        if not self.stdin:
            raise InvalidArgument(f"command {self.id} was started without stdin=True")
        if self._stdin_closed:
            raise InvalidArgument(f"the standard input of command {self.id} was closed")


class Background:
    """Start, find and follow background commands (arguments already validated)."""

    def __init__(self, ctx: ProviderContext, agents: FileAgents) -> None:
        self._ctx = ctx
        self._agents = agents

    # -- start ------------------------------------------------------------------------------

    def start(
        self,
        sid: str,
        command: str,
        *,
        timeout: Optional[float],
        cwd: Optional[str],
        env: Dict[str, str],
        tag: Optional[str],
        max_output_bytes: int,
        stdin: bool,
        cancel: Optional[CancelToken],
    ) -> Command:
        ctl = scripts.control_path(tag)
        cid = uuid.uuid4().hex
        seconds = "0" if timeout is None else str(math.ceil(timeout))
        args = ["-c", _LAUNCH, "capybara-bg", source("supervisor"), cid, ctl, seconds,
                str(max_output_bytes), "1" if stdin else "0", scripts.LEAN_EXEC_WRAPPER,
                command]
        need = FILE_OP_TIMEOUT if timeout is None else math.ceil(timeout) + FILE_OP_TIMEOUT

        def run(target: Target) -> Command:
            deadline = Deadline.after(START_SECONDS)
            stream = self._ctx.envd(target).start(
                user=scripts.SANDBOX_USER, cmd="/bin/sh", args=args, envs=env,
                cwd=cwd if cwd is not None else "/workspace",
                keepalive_seconds=self._ctx.bounds.keepalive, token=cancel,
                tag=COMMAND_TAG_PREFIX + cid, stdin=stdin,
            )
            with _Guard(self._ctx, stream, deadline, cancel):
                decoder = FrameDecoder()
                stderr = bytearray()
                for ev in stream:
                    if isinstance(ev, DataEvent):
                        if ev.stderr and len(stderr) < 8192:
                            stderr += ev.stderr
                        for frame in decoder.feed(ev.stdout):
                            if frame.kind == "r":
                                meta = json.loads(frame.data.decode("utf-8"))
                                return Command(self, sid, cid, meta)
                    elif isinstance(ev, EndEvent):
                        text = stderr.decode("utf-8", "replace").strip()
                        raise CommandFailed(
                            "the background command could not be started (exit "
                            f"{ev.exit_code}): {text[-500:] or 'no message'}; it needs "
                            "python3 in the sandbox",
                            exit_code=ev.exit_code, stderr=text[-2000:],
                        )
            raise CommandFailed("the background command's supervisor ended without a word")

        return self._ctx.on_target(sid, cancel, run, need=need)

    # -- records ----------------------------------------------------------------------------

    def read(
        self, sid: str, cid: str, out_from: int, err_from: int, limit: int,
        cancel: Optional[CancelToken],
    ) -> _Record:
        """The command's record, and its output from the given offsets (-1: the last
        ``limit`` bytes kept)."""
        deadline = Deadline.after(FILE_OP_TIMEOUT)
        fields = {"cid": cid, "out": out_from, "err": err_from, "max": limit}
        try:
            got = self._ctx.on_target(
                sid, cancel,
                lambda _t: self._agents.call(sid, "cmd_read", fields, deadline=deadline,
                                             cancel=cancel),
            )
        except AgentUnavailable as exc:
            raise CommandFailed(f"cannot read background commands' records: {exc}") from None
        a = got.answer
        if a.get("absent"):
            raise CommandNotFound(
                f"no background command {command_id(sid, cid)} in sandbox {sid} (was it "
                "started in this sandbox, through start?)"
            )
        if "error" in a:
            raise CommandFailed(f"cannot read the record of command {command_id(sid, cid)}: "
                                f"{a.get('message', a['error'])}")
        o, e = a["out"], a["err"]
        out_data, err_data = split_pieces(got.data, [int(o[2]), int(e[2])])
        return _Record(a["meta"], a.get("status"), bool(a.get("alive")),
                       (int(o[0]), int(o[1]), out_data), (int(e[0]), int(e[1]), err_data))

    def attach(self, sid: str, value: str, cancel: Optional[CancelToken]) -> Command:
        owner, cid = parse_command_id(value)
        if owner != sid:
            raise InvalidArgument(
                f"command {value[:120]} belongs to sandbox {owner}, not to sandbox {sid}"
            )
        r = self.read(sid, cid, 0, 0, 0, cancel)
        return Command(self, sid, cid, r.meta)

    def list(self, sid: str, cancel: Optional[CancelToken]) -> List[CommandInfo]:
        deadline = Deadline.after(FILE_OP_TIMEOUT)
        try:
            got = self._ctx.on_target(
                sid, cancel,
                lambda _t: self._agents.call(sid, "cmd_list", {}, deadline=deadline,
                                             cancel=cancel),
            )
        except AgentUnavailable as exc:
            raise CommandFailed(f"cannot list background commands: {exc}") from None
        out = []
        for meta in got.answer.get("commands") or []:
            try:
                out.append(CommandInfo(
                    id=command_id(sid, str(meta["id"])), pid=int(meta["pid"]),
                    tag=tag_of_control_path(str(meta.get("ctl", ""))),
                    command=str(meta.get("command", "")),
                    started_at=float(meta.get("started_at", 0.0)),
                ))
            except (KeyError, TypeError, ValueError):
                continue  # a record the sandbox user altered: not ours to show
        return sorted(out, key=lambda c: c.started_at)

    # -- following --------------------------------------------------------------------------

    def follow(
        self,
        cmd: Command,
        timeout: Optional[float],
        cancel: Optional[CancelToken],
        on_stdout: Optional[OnText],
        on_stderr: Optional[OnText],
    ) -> ExecResult:
        deadline = Deadline.after(timeout)
        f = _Follower(self, cmd, deadline, cancel, on_stdout, on_stderr)
        return f.run()

    # -- input and kill ---------------------------------------------------------------------

    def send_stdin(self, cmd: Command, data: bytes, cancel: Optional[CancelToken]) -> None:
        def send(target: Target) -> None:
            envd = self._ctx.envd(target)
            view = memoryview(data)
            while True:
                piece, view = view[:STDIN_PIECE], view[STDIN_PIECE:]
                envd.send_input(cmd.pid, bytes(piece), token=cancel)
                if not view:
                    return

        try:
            self._ctx.on_target(cmd.sandbox_id, cancel, send)
        except NotFound:
            raise CommandEnded(
                f"command {cmd.id} has ended: its input is gone; wait() gives its result"
            ) from None
        except E2BHttpError as exc:
            if exc.status != 500 or "stdin" not in exc.message.lower():
                raise
            # envd: "error writing to stdin ...": closed by close_stdin, or by the command
            # itself (broken pipe: it stopped reading, or is ending)
            raise CommandEnded(
                f"command {cmd.id} takes no more input: its standard input is closed (the "
                "command closed it or is ending); wait() gives its result"
            ) from None

    def close_stdin(self, cmd: Command, cancel: Optional[CancelToken]) -> None:
        try:
            self._ctx.on_target(
                cmd.sandbox_id, cancel,
                lambda t: self._ctx.envd(t).close_stdin(cmd.pid, token=cancel),
            )
        except NotFound:
            pass  # it ended: nothing to close

    def kill(self, cmd: Command, cancel: Optional[CancelToken]) -> None:
        args = ["-c", _KILL, "capybara-bgkill", f"{RECORDS}/{cmd._cid}/killed", cmd._ctl]
        if not scripts.is_control_path(cmd._ctl):
            raise CommandFailed(f"the record of command {cmd.id} names no exec to kill")
        r = self._ctx.script_on(cmd.sandbox_id, args, cancel)
        if r.exit_code != 0:
            raise script_failed(f"cannot kill command {cmd.id}", r)


class _Guard:
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

    def __enter__(self) -> _Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._undo is not None:
            self._undo()
        self._stream.close()  # a stream not read to its end closes its connection


class _Follower:
    """One :meth:`Command.wait`: the record, then envd's ``Connect`` to the supervisor."""

    def __init__(self, owner: Background, cmd: Command, deadline: Deadline,
                 cancel: Optional[CancelToken], on_stdout: Optional[OnText],
                 on_stderr: Optional[OnText]) -> None:
        from ._process import LiveText

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

    def _deliver(self, kind: str, data: bytes) -> None:
        cb, text = self.live[kind]
        if cb is not None and data:
            piece = text.feed(data)
            if piece:
                cb(piece)

    def _catch_up(self) -> None:
        """Read the record from where each stream was read to (at first: the last bytes
        kept) and deliver what is new; note the end if the record has it."""
        out, err = self.kept["o"], self.kept["e"]
        while True:
            r = self.owner.read(
                self.cmd.sandbox_id, self.cmd._cid,
                out.end if out.known else -1, err.end if err.known else -1,
                self.cmd._cap, self.cancel,
            )
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
                return
            self._ended(r.status)
            if self._complete() or not (r.out[2] or r.err[2]):
                return

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
                pause = min(0.2 * failures, max(0.0, self.deadline.remaining()))
                if self.cancel is not None:
                    self.cancel.wait(pause)
                else:
                    time.sleep(pause)
        for cb, text in self.live.values():
            if cb is not None:
                rest = text.finish(False)
                if rest:
                    cb(rest)
        return _result(self.status, self.kept["o"], self.kept["e"])

    def _connect_once(self) -> None:
        """Follow the supervisor's frames until its last one (or the stream's end)."""
        owner, cmd = self.owner, self.cmd
        ctx = owner._ctx

        def open_stream(target: Target) -> ProcessStream:
            return ctx.envd(target).connect(
                cmd.pid, user=scripts.SANDBOX_USER,
                keepalive_seconds=ctx.bounds.keepalive, token=self.cancel,
            )

        stream = ctx.on_target(cmd.sandbox_id, self.cancel, open_stream)
        with _Guard(ctx, stream, self.deadline, self.cancel):
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
