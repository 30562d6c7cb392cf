"""Commands that outlive the call: start, follow, attach, list, stdin, kill.

This module owns :class:`Background`, the provider's part behind ``start``, ``attach``
and ``commands``: the start of a command under its supervisor, the reading of its record,
the listing, its input and its kill. The handle those return is
:class:`~e2b_provider.commands.command.Command`; following one is
:mod:`~e2b_provider.commands.following`'s.

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

Following (:meth:`~e2b_provider.commands.command.Command.wait`) reads on the caller's
thread: the record first (through the file agent, one request), then envd's ``Connect`` to
the supervisor (:mod:`e2b_provider.commands.following`).

Without ``python3`` in the sandbox, the same calls go through shell programs instead
(POSIX ``sh`` and GNU coreutils, as the library's other scripts): ``start`` first runs the
python supervisor as above; when envd says it could not run (exit 126 or 127), or the file
agents already found that the sandbox cannot run ``python3``, the sandbox is remembered
(a wrong guess costs only live frames, never a result) and its commands get
``supervisor.sh``, which keeps the same record (so either reader reads either
supervisor's record) and says ready with the same frame. Records are then read by
``records.sh`` (one ``Start`` each, as the sandbox user; its answers are turned into the
agent's by :mod:`e2b_provider.commands.record_scripts`, so one parser serves both), and a
follower of a command that has no live frames (its meta says ``"supervisor": "sh"``) reads
the record over and over instead. Rather than at a fixed pace, each read waits in the
sandbox up to :data:`~e2b_provider.commands.following.POLL_WAIT_SECONDS` for output past
what the follower has or for the end: new output shows within a tenth of a second and
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
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import attrs

from ..cancel import CancelToken, Deadline
from ..core.context import (
    FILE_OP_TIMEOUT_SECONDS,
    MAX_REMEMBERED_SANDBOXES,
    STDERR_ROOM,
    ProviderContext,
    script_failed,
)
from ..core.file_agents import AgentUnavailable, FileAgents
from ..core.marks import remember
from ..core.messages import clean_stderr, mark_worded
from ..errors import (
    CommandEnded,
    CommandFailed,
    CommandNotFound,
    E2BHttpError,
    InvalidArgument,
    NotFound,
)
from ..models import ExecResult, Target
from ..protocol import scripts as scripts
from ..protocol.boot import PACKED_BOOT, PROGRAM_VAR, SH_BOOT
from ..protocol.command_records import (
    FrameDecoder,
    command_id,
    parse_command_id,
    records_of,
    split_pieces,
    supervisor_of,
    supervisor_tag,
    supervisor_users,
    tag_of_control_path,
)
from ..protocol.process_events import DataEvent, EndEvent
from ..protocol.scripts import NO_PYTHON_STATUSES
from ..sandbox_side import packed, source
from .command import Command, CommandInfo, OnText
from .following import Follower, StreamGuard
from .record_scripts import load_json, parse_list, parse_read, say_bad
from .users import ROOT_KILL_BATCH_SCRIPT, exec_wrapper

# Command, CommandInfo and CommandOutput are commands.command's; named here too, as before.
__all__ = ["Background", ]

log = logging.getLogger("e2b_provider")

#: How long ``start`` may take until the supervisor says it runs.
START_SECONDS = 60.0
#: Pieces of standard input per ``SendInput`` request.
STDIN_PIECE = 256 * 1024
#: Exit status of ``records.sh read`` for a record that does not exist.
_ABSENT_EXIT = 3
#: Exit status of ``records.sh read`` for a record with a file that is not a regular file.
_BAD_RECORD_EXIT = 4
#: Exit status of a supervisor whose records directory is not its user's own.
_NOT_OWN_EXIT = 90
#: The longest piece of ``supervisor.sh``'s META in one argument (Linux takes 128 KiB).
_META_PIECE = 64 * 1024
#: The most ``records.sh list`` may print (the meta of every command that runs).
_LIST_MAX = 64 << 20
#: Room kept for a record's meta.json and status.json in a read's output (each at most
#: 1 MiB, as the readers take them).
_RECORD_ROOM = 2 << 20

#: Runs the supervisor with the flag it needs (``${LC_CTYPE+1}``: was ``LC_CTYPE`` set before
#: Python started, which may add one for itself). ``$1`` is ``PACKED_BOOT``: the program
#: comes in the environment, not on the command line ``ps`` shows.
_LAUNCH = (
    'exec python3 -I -S -X utf8 -c "$1" capybara-bg "$2" "$3" "$4" "$5" "$6" "${LC_CTYPE+1}" '
    '"$7" "$8"'
)
#: As ``sandbox``: mark the record ``$1`` killed (``touch`` opens without waiting: the
#: record is the sandbox user's, and may hold a FIFO there), then kill the exec ``$2`` as a
#: batch kill does.
_KILL = 'm=$1; touch -- "$m" 2>/dev/null; shift; ' + scripts.KILL_BATCH_SCRIPT
#: As root, for a root command: the mark goes into root's record (in root's home, where no
#: other account makes names), the kill is the root batch kill's.
_ROOT_KILL = 'm=$1; touch -- "$m" 2>/dev/null; shift; ' + ROOT_KILL_BATCH_SCRIPT


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
            remember(self._no_python, sid, None, MAX_REMEMBERED_SANDBOXES)

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
        user: str = scripts.SANDBOX_USER,
    ) -> Command:
        ctl = scripts.control_path(tag)
        wrapper = exec_wrapper(user)
        seconds = "0" if timeout is None else str(math.ceil(timeout))
        need = FILE_OP_TIMEOUT_SECONDS + (0 if timeout is None else math.ceil(timeout))

        def python_args(cid: str) -> List[str]:
            return ["-c", _LAUNCH, "capybara-bg", PACKED_BOOT, cid, ctl, seconds,
                    str(max_output_bytes), "1" if stdin else "0", wrapper, command]

        def shell_args(cid: str) -> List[str]:
            cap = max(1024, max_output_bytes)
            known = json.dumps({"id": cid, "command": command, "ctl": ctl, "cap": cap,
                                "stdin": stdin, "timeout": float(seconds),
                                "supervisor": "sh"})
            # without its closing brace, in pieces that each fit in one argument
            head = known[:-1]
            pieces = [head[i:i + _META_PIECE] for i in range(0, len(head), _META_PIECE)]
            return ["-c", SH_BOOT, "capybara-bg", cid, ctl, seconds, str(cap),
                    wrapper, command, *pieces]

        def run(target: Target) -> Command:
            deadline = Deadline.after(START_SECONDS)
            if not self.lacks_python(sid):
                cid = uuid.uuid4().hex
                try:
                    py_env = {**env, PROGRAM_VAR: packed("supervisor")}
                    return self._supervise(sid, target, cid, user, ctl, python_args(cid),
                                           py_env, cwd, stdin, deadline, cancel, python=True)
                except _NoPython:
                    self._mark_no_python(sid)
            cid = uuid.uuid4().hex  # a fresh one: nothing of the first try can be in the way
            sh_env = {**env, PROGRAM_VAR: source("supervisor.sh")}
            return self._supervise(sid, target, cid, user, ctl, shell_args(cid), sh_env, cwd,
                                   stdin, deadline, cancel, python=False)

        return self._ctx.on_target(sid, cancel, run, need=need)

    def _supervise(
        self, sid: str, target: Target, cid: str, user: str, ctl: str, args: List[str],
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
            user=user, cmd="/bin/sh", args=args, envs=env,
            cwd=cwd if cwd is not None else "/workspace",
            keepalive_seconds=self._ctx.bounds.keepalive, cancel=cancel,
            tag=supervisor_tag(cid, user), stdin=stdin,
        )
        with StreamGuard(self._ctx, stream, deadline, cancel):
            decoder = FrameDecoder()
            stderr = bytearray()
            for ev in stream:
                if isinstance(ev, DataEvent):
                    if ev.stderr and len(stderr) < 8192:
                        stderr += ev.stderr
                    for frame in decoder.feed(ev.stdout):
                        if frame.kind == "r":
                            meta = load_json(frame.data) or {}
                            meta["ctl"] = ctl
                            if stream.pid:
                                meta["pid"] = stream.pid
                            return Command(self, sid, cid, meta, user=user)
                elif isinstance(ev, EndEvent):
                    if python and ev.exit_code in NO_PYTHON_STATUSES:
                        raise _NoPython()
                    text = stderr.decode("utf-8", "replace").strip()
                    if ev.exit_code == _NOT_OWN_EXIT:
                        raise mark_worded(CommandFailed(
                            _not_own(sid, user), exit_code=ev.exit_code))
                    raise CommandFailed(
                        f"the background command could not be started (exit {ev.exit_code})",
                        exit_code=ev.exit_code, stderr=text[-2000:] or "no message",
                    )
        raise CommandFailed("the background command's supervisor ended without a word")

    # -- records ----------------------------------------------------------------------------

    def read(
        self, sid: str, cid: str, out_from: int, err_from: int, limit: int,
        cancel: Optional[CancelToken], wait: float = 0.0, user: str = scripts.SANDBOX_USER,
    ) -> _Record:
        """The command's record, and its output from the given offsets (-1: the last
        ``limit`` bytes kept). ``wait``: the longest the sandbox may wait, when both
        offsets are given, for output past them or for the end (only ``records.sh`` can;
        :attr:`_Record.waited` says whether it did). A root command's record is read by
        ``records.sh`` as root (the file agent, the sandbox user's, may not)."""
        fields = {"cid": cid, "out": out_from, "err": err_from, "max": limit}
        waited = False
        shown = command_id(sid, cid, user)
        if user == scripts.ROOT_USER or self.lacks_python(sid):
            answer, data, waited = self._read_by_script(sid, fields, cancel, wait, user)
        else:
            deadline = Deadline.after(FILE_OP_TIMEOUT_SECONDS)
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
                f"no background command {shown} in sandbox {sid} (was it "
                "started in this sandbox, through start?)"
            )
        if answer.get("error") == "EBADREC":
            raise CommandFailed(f"the record of command {shown} is damaged "
                                f"(not read): {answer.get('message', 'a file in it')}")
        if "error" in answer:
            raise CommandFailed(f"cannot read the record of command {shown}: "
                                f"{answer.get('message', answer['error'])}")
        o, e = answer["out"], answer["err"]
        out_data, err_data = split_pieces(data, [int(o[2]), int(e[2])])
        return _Record(answer["meta"], answer.get("status"), bool(answer.get("alive")),
                       (int(o[0]), int(o[1]), out_data), (int(e[0]), int(e[1]), err_data),
                       waited)

    def _read_by_script(
        self, sid: str, fields: Dict[str, Any], cancel: Optional[CancelToken], wait: float,
        user: str = scripts.SANDBOX_USER,
    ) -> Tuple[Dict[str, Any], bytes, bool]:
        """``cmd_read`` by ``records.sh`` as ``user``: the file agent's answer and data, and
        whether the script could wait for news."""
        cid = str(fields["cid"])
        limit = int(fields["max"])
        tenths = max(0, min(int(wait * 10), 600))
        args = ["-c", source("records.sh"), "capybara-cmd", "read", cid, str(fields["out"]),
                str(fields["err"]), str(limit), str(tenths)]
        r = self._ctx.script_on(sid, args, cancel,
                                max_output_bytes=2 * limit + _RECORD_ROOM + STDERR_ROOM, user=user)
        if r.exit_code == _ABSENT_EXIT:
            return {"absent": True}, b"", False
        if r.exit_code == _BAD_RECORD_EXIT:
            said = clean_stderr(r.stderr.decode("utf-8", "replace")).strip()
            return {"error": "EBADREC", "message": said[:500] or "a file in it"}, b"", False
        answer, data = parse_read(r, command_id(sid, cid, user))
        return answer, data, tenths > 0

    def attach(self, sid: str, value: str, cancel: Optional[CancelToken]) -> Command:
        owner, cid, user = parse_command_id(value)
        if owner != sid:
            raise InvalidArgument(
                f"command {value[:120]} belongs to sandbox {owner}, not to sandbox {sid}"
            )
        r = self.read(sid, cid, 0, 0, 0, cancel, user=user)
        found = supervisor_of(self._ctx.processes(sid, cancel), cid, user)
        meta = dict(r.meta)
        if found is None:
            return Command(self, sid, cid, meta, live=False, user=user)
        if (meta.get("pid"), meta.get("ctl")) != found:
            log.warning("e2b_provider: the record of command %s names another process than "
                        "the one envd runs for it (the record was altered): envd's is used",
                        command_id(sid, cid, user))
        meta["pid"], meta["ctl"] = found
        return Command(self, sid, cid, meta, user=user)

    def list(self, sid: str, cancel: Optional[CancelToken],
             processes: Callable[[], List[Dict[str, Any]]]) -> List[CommandInfo]:
        """The commands that run: envd's process list first (``processes()``: a sandbox where
        no supervisor runs costs only that request), then the records of each user whose
        supervisors envd runs (the sandbox user's by the file agent, root's by
        ``records.sh`` as root), each checked against that list."""
        listed = processes()
        out = []
        for user in supervisor_users(listed):
            for meta in self._metas(sid, user, cancel):
                info = self._listed(sid, user, meta, listed)
                if info is not None:
                    out.append(info)
        return sorted(out, key=lambda c: c.started_at)

    def _metas(self, sid: str, user: str, cancel: Optional[CancelToken]) -> List[Any]:
        """The meta of each command of ``user`` whose record says it runs."""
        if user == scripts.ROOT_USER or self.lacks_python(sid):
            return self._list_by_script(sid, cancel, user)
        deadline = Deadline.after(FILE_OP_TIMEOUT_SECONDS)
        try:
            got = self._ctx.on_target(
                sid, cancel,
                lambda _t: self._agents.call(sid, "cmd_list", {}, deadline=deadline,
                                             cancel=cancel),
            )
        except AgentUnavailable:
            return self._list_by_script(sid, cancel, user)
        say_bad(sid, got.answer.get("bad"))
        return list(got.answer.get("commands") or [])

    @staticmethod
    def _listed(sid: str, user: str, meta: Any,
                listed: List[Dict[str, Any]]) -> Optional[CommandInfo]:
        """What ``commands`` shows of one record, when envd runs its supervisor."""
        try:
            cid = str(meta["id"])
            found = supervisor_of(listed, cid, user)
            if found is None:
                # envd runs no supervisor of that id: it just ended, or the record was
                # made in the sandbox
                log.info("e2b_provider: sandbox %s: envd runs no command %s (it ended, "
                         "or its record was made in the sandbox); not listed", sid, cid[:32])
                return None
            if found[0] != meta.get("pid"):
                log.warning("e2b_provider: sandbox %s: the record %s names another "
                            "process than envd runs for it (it was altered in the "
                            "sandbox); not listed", sid, cid[:32])
                return None
            return CommandInfo(
                id=command_id(sid, cid, user), pid=found[0],
                tag=tag_of_control_path(found[1]),
                command=str(meta.get("command", "")),
                started_at=float(meta.get("started_at", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            return None  # a record the sandbox user altered: not ours to show

    def _list_by_script(self, sid: str, cancel: Optional[CancelToken],
                        user: str = scripts.SANDBOX_USER) -> List[Any]:
        """``cmd_list`` by ``records.sh`` as ``user``: the meta of each command of that user
        that still runs."""
        args = ["-c", source("records.sh"), "capybara-cmd", "list"]
        r = self._ctx.script_on(sid, args, cancel, max_output_bytes=_LIST_MAX, user=user)
        if r.exit_code != 0 or r.truncated:
            raise script_failed("cannot list background commands", r)
        bad = [line.split()[2].rstrip(":") for line in
               r.stderr.decode("ascii", "replace").splitlines()
               if line.startswith("capybara-cmd: record ") and len(line.split()) > 2]
        say_bad(sid, bad)
        return parse_list(r.stdout)

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
        f = Follower(self, cmd, deadline, cancel, on_stdout, on_stderr)
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
                envd.send_input(cmd.pid, bytes(piece), cancel=cancel)
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
                lambda t: self._ctx.envd(t).close_stdin(cmd.pid, cancel=cancel),
            )
        except NotFound:
            pass  # it ended: nothing to close

    def kill(self, cmd: Command, cancel: Optional[CancelToken]) -> None:
        """Kill the command through its control path: envd's (see :meth:`attach`), never
        a record's alone, so a record the sandbox user wrote cannot steer it elsewhere."""
        if not cmd._live:
            return  # envd ran no supervisor of it when attach looked: it has ended
        root = cmd._user == scripts.ROOT_USER
        args = ["-c", _ROOT_KILL if root else _KILL, "capybara-bgkill",
                f"{records_of(cmd._user)}/{cmd._cid}/killed", cmd._ctl]
        if not scripts.is_control_path(cmd._ctl):
            raise CommandFailed(f"the record of command {cmd.id} names no exec to kill")
        r = self._ctx.script_on(cmd.sandbox_id, args, cancel, user=cmd._user)
        if r.exit_code != 0:
            raise script_failed(f"cannot kill command {cmd.id}", r)


def _not_own(sid: str, user: str) -> str:
    """What a start says when the supervisor found its records directory not its own."""
    where = records_of(user)
    if user == scripts.ROOT_USER:
        return (f"starting a background command as root in sandbox {sid} failed: {where}, "
                "where root's background commands keep their records, or root's home "
                "/root, is not root's own directory closed to others (a link, another "
                "account's, or open to their writes); make /root root's own (mode 0700), "
                "then start again")
    return (f"starting a background command in sandbox {sid} failed: {where}, where "
            "background commands keep their records, is not the sandbox user's own "
            "directory closed to others (another account made it, or it is a link or open "
            "to others); remove that directory as root (the records in it are lost), then "
            "start again")
