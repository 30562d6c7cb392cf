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
under :data:`~e2b_provider.protocol.command_records.RECORDS`: any process can read them later, also
long after the command ended and the process that started it exited.

A record is the sandbox user's to write (its commands run as that user), so nothing in one
decides what is signalled: ``attach`` takes a command's pid and control path from envd's
process list (:func:`~e2b_provider.protocol.command_records.supervisor_of`: the supervisor envd runs
with the command's tag), ``commands`` lists a record only when envd runs its supervisor, and the
readers open record files without waiting and only if they are regular files (a record
with a FIFO in it is named in an error, or left out of a listing).

Following (:meth:`Command.wait`) reads on the caller's thread: the record first (through
the file agent, one request), then envd's ``Connect`` to the supervisor, whose frames carry
stream offsets, so nothing is shown twice and a gap (frames the supervisor dropped while
nobody read fast enough) is read from the record. No thread per command: deadlines and
cancels go through the shared watchdog.

Without ``python3`` in the sandbox, the same calls go through shell programs instead
(POSIX ``sh`` and GNU coreutils, as the library's other scripts): ``start`` first runs the
python supervisor as above; when envd says it could not run (exit 126 or 127), or the file
agents already found that the sandbox cannot run ``python3``, the sandbox is remembered
(a wrong guess costs only live frames, never a result) and its commands get
``supervisor.sh``, which keeps the same record (so either reader reads either
supervisor's record) and says ready with the same frame. Records are then read by
``records.sh`` (one ``Start`` each, as the sandbox user; its answers are turned into the
agent's, so one parser serves both), and a follower of a command that has no live frames
(its meta says ``"supervisor": "sh"``) reads the record over and over instead. Rather than
at a fixed pace, each read waits in the sandbox up to :data:`POLL_WAIT_SECONDS` for output
past what the follower has or for the end: new output shows within a tenth of a second and
an idle command costs one request every two seconds, where a fixed 0.25 s poll would cost
eight and show output 0.125 s later on average. Kill, input and close go through envd and
the kill scripts either way. The remembering is per sandbox, as ``_files`` remembers a
missing tool, and not forgotten after a while as the file agents' is (a sandbox seldom
gains python3; one that does only loses live frames for new commands). The command's text
travels twice (once as the command, once inside the JSON of its meta, which the client
encodes so the shell never escapes it), the JSON cut into 64 KiB arguments for Linux's
128 KiB limit on one. The fallback's limits are in the README ("Long-running commands").
"""

from __future__ import annotations

import collections
import json
import logging
import math
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import attrs

from ..cancel import CancelToken, Deadline
from ..clients.envd import ProcessStream
from ..core.context import FILE_OP_TIMEOUT, STDERR_ROOM, ProviderContext, script_failed
from ..core.file_agents import AgentUnavailable, FileAgents
from ..core.messages import clean_stderr, describe, mark_worded
from ..core.run_engine import RunOutcome
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
    TransportError,
)
from ..models import ExecResult, Target
from ..protocol import scripts as scripts
from ..protocol import validate as v
from ..protocol.command_records import (
    COMMAND_TAG_PREFIX,
    RECORDS,
    FrameDecoder,
    KeptOutput,
    command_id,
    decode_tail,
    parse_command_id,
    split_pieces,
    supervisor_of,
    tag_of_control_path,
)
from ..protocol.process_events import DataEvent, EndEvent
from ..sandbox_side import source

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
#: How long one read of a record may wait in the sandbox for news (output past what the
#: follower has, or the end) when the command has no live frames (``supervisor.sh``).
POLL_WAIT_SECONDS = 2.0
#: The pause between two reads of a record that could not wait in the sandbox (the file
#: agent's) and brought nothing new.
_POLL_PAUSE = 0.25
#: Exit statuses that say the sandbox could not run ``python3`` (not found, not runnable).
_NO_PYTHON = (126, 127)
#: Sandboxes remembered as lacking ``python3`` at most (the least recent dropped).
_MAX_REMEMBERED = 1024
#: Exit status of ``records.sh read`` for a record that does not exist.
_ABSENT_EXIT = 3
#: Exit status of ``records.sh read`` for a record with a file that is not a regular file.
_BAD_RECORD_EXIT = 4
#: Exit status of a supervisor whose records directory is not the sandbox user's own.
_NOT_OWN_EXIT = 90
#: The longest piece of ``supervisor.sh``'s META in one argument (Linux takes 128 KiB).
_META_PIECE = 64 * 1024
#: The most ``records.sh list`` may print (the meta of every command that runs).
_LIST_MAX = 64 << 20
#: Room kept for a record's meta.json and status.json in a read's output (each at most
#: 1 MiB, as the readers take them).
_RECORD_ROOM = 2 << 20

#: Runs the supervisor with the flag it needs (``${LC_CTYPE+1}``: was ``LC_CTYPE`` set before
#: Python started, which may add one for itself).
_LAUNCH = (
    'exec python3 -I -S -X utf8 -c "$1" capybara-bg "$2" "$3" "$4" "$5" "$6" "${LC_CTYPE+1}" '
    '"$7" "$8"'
)
#: As ``sandbox``: mark the record ``$1`` killed (``touch`` opens without waiting: the
#: record is the sandbox user's, and may hold a FIFO there), then kill the exec ``$2`` as a
#: batch kill does.
_KILL = 'm=$1; touch -- "$m" 2>/dev/null; shift; ' + scripts.KILL_BATCH_SCRIPT


@attrs.frozen
class CommandInfo:
    """A background command or a terminal that still runs (see ``commands``).

    Attributes:
        id: the command's id (for ``attach``, from any process).
        pid: its process id in the sandbox (its supervisor's, which envd knows; a
            terminal's own).
        tag: the tag it was started with, or None (always None for a terminal).
        command: the shell command line ("" for a terminal running the login shell).
        started_at: when it started, in seconds since the epoch (the sandbox's clock).
        kind: ``"command"`` (started with ``start``) or ``"terminal"`` (opened with
            ``terminal``).
    """

    id: str
    pid: int
    tag: Optional[str]
    command: str
    started_at: float
    kind: str = "command"


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
    waited: bool = False  # the read waited in the sandbox for news (records.sh)


class _NoPython(Exception):
    """envd could not run ``python3`` for the supervisor (exit 126 or 127)."""


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

    def __init__(self, owner: Background, sid: str, cid: str, meta: Dict[str, Any],
                 *, live: bool = True) -> None:
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
        # supervisor.sh writes no live frames: a follower reads the record instead
        self._frames = meta.get("supervisor") != "sh"
        self._stdin_closed = False
        # whether its pid and control path are envd's (start, or attach while it ran):
        # else they are only the record's word, which the sandbox user can write, so
        # nothing is sent to them (the command ended before attach found it)
        self._live = live

    def __repr__(self) -> str:
        return f"Command(id={self.id!r}, pid={self.pid}, tag={self.tag!r})"

    @property
    def running(self) -> bool:
        """Whether the command still runs (asks the sandbox: one request; none for a
        command that had ended when :meth:`~e2b_provider.E2BSandboxProvider.attach` found
        it)."""
        if not self._live:
            return False  # envd ran no supervisor of it when attach looked
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
        self._lock = threading.Lock()
        # sandboxes whose supervisor could not run python3, most recent last
        self._no_python: collections.OrderedDict[str, None] = collections.OrderedDict()
        ctx.on_fork(self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the facts stay true in a child

    # -- what a sandbox lacks ---------------------------------------------------------------

    def lacks_python(self, sid: str) -> bool:
        """Whether the sandbox is known to be unable to run ``python3``: its supervisor
        could not run, or the file agents found so."""
        with self._lock:
            if sid in self._no_python:
                return True
        return self._agents.unavailable(sid) is not None

    def _mark_no_python(self, sid: str) -> None:
        log.info("e2b_provider: sandbox %s cannot run python3; background commands use the "
                 "shell supervisor there", sid)
        with self._lock:
            self._no_python[sid] = None
            self._no_python.move_to_end(sid)
            while len(self._no_python) > _MAX_REMEMBERED:
                self._no_python.popitem(last=False)

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
        seconds = "0" if timeout is None else str(math.ceil(timeout))
        need = FILE_OP_TIMEOUT if timeout is None else math.ceil(timeout) + FILE_OP_TIMEOUT

        def python_args(cid: str) -> List[str]:
            return ["-c", _LAUNCH, "capybara-bg", source("supervisor"), cid, ctl, seconds,
                    str(max_output_bytes), "1" if stdin else "0", scripts.LEAN_EXEC_WRAPPER,
                    command]

        def shell_args(cid: str) -> List[str]:
            cap = max(1024, max_output_bytes)
            known = json.dumps({"id": cid, "command": command, "ctl": ctl, "cap": cap,
                                "stdin": stdin, "timeout": float(seconds),
                                "supervisor": "sh"})
            # without its closing brace, in pieces that each fit in one argument
            head = known[:-1]
            pieces = [head[i:i + _META_PIECE] for i in range(0, len(head), _META_PIECE)]
            return ["-c", source("supervisor.sh"), "capybara-bg", cid, ctl, seconds, str(cap),
                    scripts.LEAN_EXEC_WRAPPER, command, *pieces]

        def run(target: Target) -> Command:
            deadline = Deadline.after(START_SECONDS)
            if not self.lacks_python(sid):
                cid = uuid.uuid4().hex
                try:
                    return self._supervise(sid, target, cid, ctl, python_args(cid), env, cwd,
                                           stdin, deadline, cancel, python=True)
                except _NoPython:
                    self._mark_no_python(sid)
            cid = uuid.uuid4().hex  # a fresh one: nothing of the first try can be in the way
            return self._supervise(sid, target, cid, ctl, shell_args(cid), env, cwd, stdin,
                                   deadline, cancel, python=False)

        return self._ctx.on_target(sid, cancel, run, need=need)

    def _supervise(
        self, sid: str, target: Target, cid: str, ctl: str, args: List[str],
        env: Dict[str, str], cwd: Optional[str], stdin: bool, deadline: Deadline,
        cancel: Optional[CancelToken], *, python: bool,
    ) -> Command:
        """Start one supervisor and read its stream up to its ready frame (its meta; the
        pid is envd's and the control path ``ctl``, whatever a record says).

        Raises:
            _NoPython: ``python`` and envd could not run ``python3``.
            CommandFailed: the supervisor ended before it said it was ready.
        """
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
                            meta = _load_json(frame.data) or {}
                            meta["ctl"] = ctl
                            if stream.pid:
                                meta["pid"] = stream.pid
                            return Command(self, sid, cid, meta)
                elif isinstance(ev, EndEvent):
                    if python and ev.exit_code in _NO_PYTHON:
                        raise _NoPython()
                    text = stderr.decode("utf-8", "replace").strip()
                    if ev.exit_code == _NOT_OWN_EXIT:
                        raise mark_worded(CommandFailed(
                            f"starting a background command in sandbox {sid} failed: "
                            f"{RECORDS}, where background commands keep their records, "
                            "is not the sandbox user's own directory closed to others "
                            "(another account made it, or it is a link or open to others); "
                            "remove that directory as root (the records in it are lost), "
                            "then start again",
                            exit_code=ev.exit_code,
                        ))
                    raise CommandFailed(
                        f"the background command could not be started (exit {ev.exit_code})",
                        exit_code=ev.exit_code, stderr=text[-2000:] or "no message",
                    )
        raise CommandFailed("the background command's supervisor ended without a word")

    # -- records ----------------------------------------------------------------------------

    def read(
        self, sid: str, cid: str, out_from: int, err_from: int, limit: int,
        cancel: Optional[CancelToken], wait: float = 0.0,
    ) -> _Record:
        """The command's record, and its output from the given offsets (-1: the last
        ``limit`` bytes kept). ``wait``: the longest the sandbox may wait, when both
        offsets are given, for output past them or for the end (only ``records.sh`` can;
        :attr:`_Record.waited` says whether it did)."""
        fields = {"cid": cid, "out": out_from, "err": err_from, "max": limit}
        waited = False
        if self.lacks_python(sid):
            answer, data, waited = self._read_by_script(sid, fields, cancel, wait)
        else:
            deadline = Deadline.after(FILE_OP_TIMEOUT)
            try:
                got = self._ctx.on_target(
                    sid, cancel,
                    lambda _t: self._agents.call(sid, "cmd_read", fields, deadline=deadline,
                                                 cancel=cancel),
                )
                answer, data = got.answer, got.data
            except AgentUnavailable:
                answer, data, waited = self._read_by_script(sid, fields, cancel, wait)
        if answer.get("absent"):
            raise CommandNotFound(
                f"no background command {command_id(sid, cid)} in sandbox {sid} (was it "
                "started in this sandbox, through start?)"
            )
        if answer.get("error") == "EBADREC":
            raise CommandFailed(f"the record of command {command_id(sid, cid)} is damaged "
                                f"(not read): {answer.get('message', 'a file in it')}")
        if "error" in answer:
            raise CommandFailed(f"cannot read the record of command {command_id(sid, cid)}: "
                                f"{answer.get('message', answer['error'])}")
        o, e = answer["out"], answer["err"]
        out_data, err_data = split_pieces(data, [int(o[2]), int(e[2])])
        return _Record(answer["meta"], answer.get("status"), bool(answer.get("alive")),
                       (int(o[0]), int(o[1]), out_data), (int(e[0]), int(e[1]), err_data),
                       waited)

    def _read_by_script(
        self, sid: str, fields: Dict[str, Any], cancel: Optional[CancelToken], wait: float,
    ) -> Tuple[Dict[str, Any], bytes, bool]:
        """``cmd_read`` by ``records.sh``: the file agent's answer and data, and whether
        the script could wait for news."""
        cid = str(fields["cid"])
        limit = int(fields["max"])
        tenths = max(0, min(int(wait * 10), 600))
        args = ["-c", source("records.sh"), "capybara-cmd", "read", cid, str(fields["out"]),
                str(fields["err"]), str(limit), str(tenths)]
        r = self._ctx.script_on(sid, args, cancel,
                                max_output_bytes=2 * limit + _RECORD_ROOM + STDERR_ROOM)
        if r.exit_code == _ABSENT_EXIT:
            return {"absent": True}, b"", False
        if r.exit_code == _BAD_RECORD_EXIT:
            said = clean_stderr(r.stderr.decode("utf-8", "replace")).strip()
            return {"error": "EBADREC", "message": said[:500] or "a file in it"}, b"", False
        answer, data = _parse_read(r, command_id(sid, cid))
        return answer, data, tenths > 0

    def attach(self, sid: str, value: str, cancel: Optional[CancelToken]) -> Command:
        owner, cid = parse_command_id(value)
        if owner != sid:
            raise InvalidArgument(
                f"command {value[:120]} belongs to sandbox {owner}, not to sandbox {sid}"
            )
        r = self.read(sid, cid, 0, 0, 0, cancel)
        found = supervisor_of(self._ctx.processes(sid, cancel), cid)
        meta = dict(r.meta)
        if found is None:
            return Command(self, sid, cid, meta, live=False)
        if (meta.get("pid"), meta.get("ctl")) != found:
            log.warning("e2b_provider: the record of command %s names another process than "
                        "the one envd runs for it (the record was altered): envd's is used",
                        command_id(sid, cid))
        meta["pid"], meta["ctl"] = found
        return Command(self, sid, cid, meta)

    def list(self, sid: str, cancel: Optional[CancelToken],
             processes: Callable[[], List[Dict[str, Any]]]) -> List[CommandInfo]:
        """The commands that run, by their records, each checked against envd's process list
        (``processes()``, asked only when there is a record)."""
        metas: List[Any]
        if self.lacks_python(sid):
            metas = self._list_by_script(sid, cancel)
        else:
            deadline = Deadline.after(FILE_OP_TIMEOUT)
            try:
                got = self._ctx.on_target(
                    sid, cancel,
                    lambda _t: self._agents.call(sid, "cmd_list", {}, deadline=deadline,
                                                 cancel=cancel),
                )
                metas = got.answer.get("commands") or []
                _say_bad(sid, got.answer.get("bad"))
            except AgentUnavailable:
                metas = self._list_by_script(sid, cancel)
        if not metas:
            return []
        listed = processes()
        out = []
        for meta in metas:
            try:
                cid = str(meta["id"])
                found = supervisor_of(listed, cid)
                if found is None:
                    # envd runs no supervisor of that id: it just ended, or the record was
                    # made in the sandbox
                    log.info("e2b_provider: sandbox %s: envd runs no command %s (it ended, "
                             "or its record was made in the sandbox); not listed", sid,
                             cid[:32])
                    continue
                if found[0] != meta.get("pid"):
                    log.warning("e2b_provider: sandbox %s: the record %s names another "
                                "process than envd runs for it (it was altered in the "
                                "sandbox); not listed", sid, cid[:32])
                    continue
                out.append(CommandInfo(
                    id=command_id(sid, cid), pid=found[0],
                    tag=tag_of_control_path(found[1]),
                    command=str(meta.get("command", "")),
                    started_at=float(meta.get("started_at", 0.0)),
                ))
            except (KeyError, TypeError, ValueError):
                continue  # a record the sandbox user altered: not ours to show
        return sorted(out, key=lambda c: c.started_at)

    def _list_by_script(self, sid: str, cancel: Optional[CancelToken]) -> List[Any]:
        """``cmd_list`` by ``records.sh``: the meta of each command that still runs."""
        args = ["-c", source("records.sh"), "capybara-cmd", "list"]
        r = self._ctx.script_on(sid, args, cancel, max_output_bytes=_LIST_MAX)
        if r.exit_code != 0 or r.truncated:
            raise script_failed("cannot list background commands", r)
        bad = [line.split()[2].rstrip(":") for line in
               r.stderr.decode("ascii", "replace").splitlines()
               if line.startswith("capybara-cmd: record ") and len(line.split()) > 2]
        _say_bad(sid, bad)
        return _parse_list(r.stdout)

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
        if not cmd._live:
            raise CommandEnded(
                f"command {cmd.id} has ended: its input is gone; wait() gives its result")

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
        if not cmd._live:
            return  # it ended: nothing to close
        try:
            self._ctx.on_target(
                cmd.sandbox_id, cancel,
                lambda t: self._ctx.envd(t).close_stdin(cmd.pid, token=cancel),
            )
        except NotFound:
            pass  # it ended: nothing to close

    def kill(self, cmd: Command, cancel: Optional[CancelToken]) -> None:
        """Kill the command through its control path: envd's (see :meth:`attach`), never
        a record's alone, so a record the sandbox user wrote cannot steer it elsewhere."""
        if not cmd._live:
            return  # envd ran no supervisor of it when attach looked: it has ended
        args = ["-c", _KILL, "capybara-bgkill", f"{RECORDS}/{cmd._cid}/killed", cmd._ctl]
        if not scripts.is_control_path(cmd._ctl):
            raise CommandFailed(f"the record of command {cmd.id} names no exec to kill")
        r = self._ctx.script_on(cmd.sandbox_id, args, cancel)
        if r.exit_code != 0:
            raise script_failed(f"cannot kill command {cmd.id}", r)


def _say_bad(sid: str, bad: object) -> None:
    """Log the records a listing left out because a file in them is not a regular file."""
    if isinstance(bad, list) and bad:
        log.warning("e2b_provider: sandbox %s: background command records left out of the "
                    "list (a file in them is not a regular file, so they were not read): %s",
                    sid, ", ".join(str(b)[:32] for b in bad[:20]))


def _load_json(raw: bytes) -> Optional[Dict[str, Any]]:
    """A JSON object, or None (not JSON, or not an object), as the file agent loads one."""
    try:
        value = json.loads(raw.decode("utf-8", "surrogateescape"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _parse_read(r: RunOutcome, what: str) -> Tuple[Dict[str, Any], bytes]:
    """What ``records.sh read`` printed (exit 0), as the file agent's ``cmd_read`` answer
    and data: ``{"meta", "status", "alive", "out": [first, total, length], "err": [...]}``.

    Raises:
        CommandFailed: the script failed.
        ProtocolError: its output is not what it prints.
    """
    if r.exit_code != 0 or r.truncated:
        raise script_failed(f"cannot read the record of command {what}", r)
    line, sep, rest = r.stdout.partition(b"\n")
    try:
        alive, meta_len, status_len, *streams = (int(w) for w in line.split())
    except ValueError:
        alive = meta_len = status_len = -1
        streams = []
    if (not sep or len(streams) != 6 or min(meta_len, status_len, *streams) < 0
            or len(rest) != meta_len + status_len + streams[2] + streams[5]):
        raise ProtocolError(f"the record of command {what} was read as something else")
    meta = _load_json(rest[:meta_len])
    if meta is None:
        return {"absent": True}, b""  # as the agent takes a meta.json that is not JSON
    status = _load_json(rest[meta_len:meta_len + status_len]) if status_len else None
    answer = {"meta": meta, "status": status, "alive": alive == 1 and status is None,
              "out": streams[:3], "err": streams[3:]}
    return answer, rest[meta_len + status_len:]


def _parse_list(out: bytes) -> List[Dict[str, Any]]:
    """What ``records.sh list`` printed (``LENGTH\\n`` and a meta.json, each command that
    runs), as the file agent's ``cmd_list`` gives it: the metas that are JSON objects.

    Raises:
        ProtocolError: the output is not what it prints.
    """
    metas = []
    pos = 0
    while pos < len(out):
        nl = out.find(b"\n", pos)
        head = out[pos:nl] if nl >= 0 else b""
        if not head.isdigit() or len(out) < nl + 1 + int(head):
            raise ProtocolError("the list of background commands was read as something else")
        end = nl + 1 + int(head)
        meta = _load_json(out[nl + 1:end])
        if meta is not None:
            metas.append(meta)
        pos = end
    return metas


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
        :data:`_POLL_PAUSE` after a read that brought nothing."""
        out, err = self.kept["o"], self.kept["e"]
        self._catch_up()
        while not self.ended:
            self._check()
            before = (out.end, err.end)
            wait = min(POLL_WAIT_SECONDS, self.deadline.remaining())
            waited = self._catch_up(wait)
            if not self.ended and not waited and (out.end, err.end) == before:
                self._pause(_POLL_PAUSE)

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
