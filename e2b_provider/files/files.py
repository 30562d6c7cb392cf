"""Files in a sandbox: read (capped), write (as the sandbox user), stat.

This module owns :class:`Files`, the provider's part that reads, writes and examines files
with the sandbox user's permissions. Arguments arrive validated (the provider facade checks
them). Every path keeps the reference's semantics: reads and stats as user ``sandbox``;
writes by ``sandbox`` (parents created by it, the file owned by it), or by root with mode
0644 under ``/skills``.

How many requests each call costs on a warm sandbox:

* ``stat`` and a read of a small file: one ``process.Process/Start`` running a script as
  ``sandbox`` (``head -c`` prints the bytes).
* a write of up to :data:`~e2b_provider.protocol.scripts.INLINE_WRITE_MAX` bytes: one ``Start``; the
bytes
  travel base64 in an argument of that request.
* a larger write: a ``Start`` (as root) that makes a FIFO in the root-only staging
  directory and says ``ready``, then one ``POST /files`` into that FIFO; on the other end
  ``runuser -u sandbox … cat > path`` (or root's ``cat`` under ``/skills``) writes the bytes
  as they arrive, through a pipe buffer enlarged to 1 MiB. Nothing is staged at rest and
  envd never opens the destination. The staging directory is made root-only (and swept of
  what killed operations left) on the provider's first large write to a sandbox, and
  again whenever it is found missing, a symlink or not root's.
* a read asking for more than :data:`~e2b_provider.protocol.scripts.LARGE_READ_MIN` bytes of a
larger regular
  file: the first script says so instead of printing it; then a root holder opens the file
  *with the user's credentials* and prints its pid and descriptor, envd serves
  ``GET /files?path=/proc/<pid>/fd/<n>`` (a ``Range`` caps it; the body is read in one
  call into the bytes returned) at the wire's speed, and the holder is killed through envd
  while the body comes — which also proves it was alive while envd opened the descriptor,
  so the pid named a process of ours (see :meth:`Files._read_fast`). Without a
  ``python3`` in the template the read is streamed by ``head -c`` as before.

A file operation that ends early (cancel, timeout, Ctrl-C, a failed request) kills every
process it started — its top process is named :data:`~e2b_provider.protocol.scripts.FILEOP_MARKER`
``<id>``, the rest are found as its descendants, and the process envd started is killed by its pid —
and removes its FIFO and temporary files before the error reaches the caller. A transfer
cut half-way is first let end on its own (its helper refuses the short input and exits),
so a cancelled write leaves neither the new file, nor a part of it, nor anything staged.
envd's processes are never selected by tag: envd 0.6.13's lookup by tag stops at the
first process with another tag, so it misses whenever other tagged processes run.

When the answer is lost (the connection broke or went silent, or the stream could not be
read), the operation may or may not have taken effect. A write is then done once more
(its first attempt's processes stopped first): writing the same bytes again gives the same
file, so the caller gets the write's real outcome instead of an error for a write that
happened. A sandbox paused under the operation is reported as
:class:`~e2b_provider.SandboxPaused`; an answer that stopped coming within the bound, as
:class:`~e2b_provider.OperationTimeout`. A path that only *seems* missing because a
directory on the way is closed to the user is "permission denied", not None.
"""

from __future__ import annotations

import collections
import concurrent.futures
import datetime
import logging
import posixpath
import re
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

import attrs

from .._watchdog import TimerHandle
from ..cancel import CancelReason, CancelToken, Deadline
from ..clients.envd import EnvdClient, ProcessStream
from ..core.context import (
    FILE_OP_TIMEOUT,
    STDERR_ROOM,
    ProviderContext,
    script_failed,
    silence_is_timeout,
)
from ..core.file_agents import (
    MAX_INLINE_FILE,
    MAX_PAYLOAD,
    AgentAnswer,
    AgentUnavailable,
    FileAgents,
)
from ..core.messages import clean_stderr, is_ambiguous, script_reason, scrub
from ..core.run_engine import RunOutcome, run_process
from ..errors import (
    Cancelled,
    CommandFailed,
    E2BHttpError,
    E2BProviderError,
    OperationTimeout,
    ProtocolError,
    TransportError,
    TransportTimeout,
    UnsafePath,
)
from ..models import DirEntry, FileContent, FileStat, Target
from ..protocol import scripts as scripts
from ..protocol.process_events import DataEvent, EndEvent, ProcessEvent, StartEvent

__all__ = ["Files"]

log = logging.getLogger("e2b_provider")

_STAT_LINE = re.compile(r"([0-9]+) (file|directory)\n?")
_HOLD_LINE = re.compile(r"hold ([0-9]+) ([0-9]+) ([0-9]+)")
#: Seconds an in-sandbox helper outlives the operation's own bound at most.
_HELPER_GRACE = 60.0
#: Output kept from a helper (it prints one short line, or an error).
_HELPER_OUTPUT = 64 * 1024
#: Facts remembered about sandboxes (a tool the fast paths need is missing; the staging
#: directory was made root-only and swept by this provider).
_MAX_REMEMBERED = 1024
#: The fact that this provider made a sandbox's staging directory root-only and swept it.
_STAGED = "staged"
#: A write whose answer was lost is done again only with at least this many seconds left.
_RETRY_MIN_S = 1.0
#: How long a read waits for its holder's stop beyond the operation's deadline.
_STOP_WAIT_S = 5.0
#: How long a helper whose transfer was cut may take to end on its own.
_SETTLE_S = 5.0
#: How long after a transfer was cut its helper may take to say envd had opened its FIFO.
_OPEN_S = 0.5
#: How long a helper's start may go on after a cancel before it is cut.
_OPEN_GRACE_S = 2.0
#: What users are told when the sandbox user may not touch a path.
ACCESS_HINT = (
    "files are read and written as user 'sandbox' (as root under /skills): use a path it may "
    "access, such as one under /workspace"
)


def _timed_out() -> OperationTimeout:
    return OperationTimeout(f"it did not finish within {FILE_OP_TIMEOUT:.0f} s")


#: Why a root write under /skills is refused, for its error.
_SKILLS_RULE = (
    "a root write under /skills goes only through directories that are root's and closed to "
    "everyone else, and never through a symbolic link"
)
_REFUSED_DIR = re.compile(r"(/\S*) (?:is|has|names) ")


def _skills_fix(reason: str) -> str:
    """What to do about a root write refused for ``reason`` (it starts with the path)."""
    m = _REFUSED_DIR.match(reason)
    where = m.group(1) if m else ""
    if where and "symbolic link" in reason:
        return f"replace the symbolic link {where} by a directory, or write outside /skills"
    if where and ("owned" in reason or "writable" in reason or "alone" in reason):
        return (f"make {where} root's and closed to others (chown root {where}; chmod go-w "
                f"{where}), or write outside /skills")
    return "write to an absolute path without . or .. under root's own directories"


def unsafe_path(reason: str) -> UnsafePath:
    """The error for a root write refused because of its path (``reason`` names it)."""
    reason = scrub(reason).removeprefix("refused: ")
    return UnsafePath(f"refused: {reason} ({_SKILLS_RULE}); {_skills_fix(reason)}")


def _failed(what: str, r: RunOutcome) -> CommandFailed:
    """:func:`script_failed` with the access hint when the user was refused; a root write
    refused because of its path raises :class:`UnsafePath` instead."""
    if r.exit_code == scripts.REFUSED_EXIT:
        lines = clean_stderr(r.stderr.decode("utf-8", "replace")).splitlines()
        raise unsafe_path(lines[-1] if lines else "the path is not safe for root")
    reason = script_reason(r.stderr.decode("utf-8", "replace"), r.exit_code)
    denied = reason.startswith(("permission denied", "operation not permitted"))
    return script_failed(what, r, ACCESS_HINT if denied else _advice(reason))


#: What to do about a path of the wrong kind, by what its error says.
_KIND_ADVICE = (
    ("not a regular file", "only regular files are read and written (a FIFO or a device "
     "could block or never end)"),
    ("is a directory", "give the path of a file"),
    ("not a directory", "a directory on the way is a file: remove it, or choose another path"),
    ("file exists", "a directory on the way is a file: remove it, or choose another path"),
)


def _advice(reason: str) -> str:
    """What to do about ``reason`` when it says a path is of the wrong kind ("" if not)."""
    said = reason.lower()
    for words, advice in _KIND_ADVICE:
        if words in said:
            return advice
    return ""


def _no_entry(path: str, r: RunOutcome) -> CommandFailed:
    """The error for a path behind a directory the sandbox user may not enter."""
    where = r.stderr.decode("utf-8", "replace").strip().splitlines()
    closed = where[-1] if where else "a directory on the way"
    return CommandFailed(
        f"permission denied: user 'sandbox' may not enter {closed}, so {path} cannot be "
        f"examined (it may exist); {ACCESS_HINT}",
        exit_code=r.exit_code,
    )

_T = TypeVar("_T")


class _Slow(Exception):
    """The fast path cannot serve this call; take the reference's path."""


class Files:
    """Read, write and stat files as the sandbox user (arguments already validated)."""

    def __init__(self, ctx: ProviderContext, agents: FileAgents) -> None:
        self._ctx = ctx
        self._agents = agents
        self._lock = threading.Lock()
        # (sandbox id, fact), most recent last: a tool missing there ("base64",
        # "python3"), or _STAGED
        self._facts: collections.OrderedDict[Tuple[str, str], None] = (
            collections.OrderedDict()
        )
        ctx.on_fork(self._forget_all)

    # -- what a sandbox lacks -------------------------------------------------------------

    def _forget_all(self) -> None:
        with self._lock:
            self._facts.clear()

    def _known(self, sid: str, fact: str) -> bool:
        with self._lock:
            return (sid, fact) in self._facts

    def _remember(self, sid: str, fact: str) -> None:
        with self._lock:
            self._facts[(sid, fact)] = None
            self._facts.move_to_end((sid, fact))
            while len(self._facts) > _MAX_REMEMBERED:
                self._facts.popitem(last=False)

    def _forget(self, sid: str, fact: str) -> None:
        with self._lock:
            self._facts.pop((sid, fact), None)

    def _lacks(self, sid: str, tool: str) -> bool:
        return self._known(sid, tool)

    def _mark_missing(self, sid: str, tool: str) -> None:
        log.info("e2b_provider: sandbox %s has no %s; using the slower file path", sid, tool)
        self._remember(sid, tool)

    def lacks_python(self, sid: str) -> bool:
        """Whether the sandbox was found to have no ``python3`` (the file agent could not
        start there, or a helper that needs it could not run)."""
        return self._lacks(sid, "python3") or self._agents.unavailable(sid) is not None

    def mark_missing(self, sid: str, tool: str) -> None:
        """Remember that the sandbox has no ``tool`` (the slower paths are taken)."""
        self._mark_missing(sid, tool)

    # -- the three operations -------------------------------------------------------------

    def read(
        self, sid: str, path: str, max_bytes: int, cancel: Optional[CancelToken]
    ) -> Optional[FileContent]:
        began = time.monotonic()
        try:
            return self._read(sid, path, max_bytes, cancel)
        except E2BProviderError as exc:
            if is_ambiguous(exc):
                self._settle(sid, exc, began, cancel, f"reading {path}", retry=False)
            raise

    def _read(
        self, sid: str, path: str, max_bytes: int, cancel: Optional[CancelToken]
    ) -> Optional[FileContent]:
        want = max_bytes + 1
        deadline = Deadline.after(FILE_OP_TIMEOUT)
        if self._agents.ready(sid) is not None:
            try:
                return self._read_by_agent(sid, path, max_bytes, cancel, deadline)
            except AgentUnavailable:
                pass
        fast = want > scripts.LARGE_READ_MIN and not self._lacks(sid, "python3")
        # the probe never asks for the fast path when the threshold is ``want`` itself
        args = scripts.read_probe_args(path, want, scripts.LARGE_READ_MIN if fast else want)
        r = self._script(sid, scripts.SANDBOX_USER, args, want + STDERR_ROOM, cancel, deadline)
        if r.exit_code == scripts.LARGE_READ_EXIT and fast:
            try:
                return self._ctx.on_target(
                    sid, cancel, lambda t: self._read_fast(t, path, want, cancel, deadline)
                )
            except _Slow:
                args = scripts.read_probe_args(path, want, want)
                r = self._script(
                    sid, scripts.SANDBOX_USER, args, want + STDERR_ROOM, cancel, deadline
                )
        if r.exit_code in (3, 4):
            return None
        if r.exit_code == scripts.NO_ENTRY_EXIT:
            raise _no_entry(path, r)
        if r.exit_code != 0:
            raise _failed("the read script failed", r)
        return _content(r.stdout, max_bytes)

    def write(self, sid: str, path: str, payload: bytes, cancel: Optional[CancelToken]) -> None:
        deadline = Deadline.after(FILE_OP_TIMEOUT)
        self._written_once_more(
            sid, f"writing {path}", cancel, deadline,
            lambda: self._write(sid, path, payload, cancel, deadline),
        )

    def _written_once_more(
        self,
        sid: str,
        what: str,
        cancel: Optional[CancelToken],
        deadline: Deadline,
        write: Callable[[], _T],
    ) -> _T:
        """``write()``, done once more when its answer was lost (and time is left): the
        write may or may not have happened, what it started was stopped, and the same bytes
        written again give the same files."""
        for attempt in (1, 2):
            began = time.monotonic()
            try:
                return write()
            except E2BProviderError as exc:
                if not is_ambiguous(exc):
                    raise
                again = attempt == 1 and deadline.remaining() >= _RETRY_MIN_S
                self._settle(sid, exc, began, cancel,
                             f"{what} (it may or may not have been written)", retry=again)
                log.info("e2b_provider: the answer to %s in sandbox %s was lost (%s); "
                         "writing again", what, sid, exc)
        raise AssertionError("unreachable")

    def _write(
        self,
        sid: str,
        path: str,
        payload: bytes,
        cancel: Optional[CancelToken],
        deadline: Deadline,
    ) -> None:
        skills = scripts.is_skills_path(path)
        if (
            not skills
            and len(payload) <= MAX_INLINE_FILE
            and self._agents.ready(sid) is not None
        ):
            try:
                answer = self._agents.call(
                    sid, "write", {"path": path}, payload, deadline=deadline, cancel=cancel
                )
            except AgentUnavailable:
                pass
            else:
                failure = _write_results(answer, [path]).get(path)
                if failure is not None:
                    raise failure
                return
        if len(payload) <= scripts.INLINE_WRITE_MAX and not self._lacks(sid, "base64"):
            user = scripts.ROOT_USER if skills else scripts.SANDBOX_USER
            args = scripts.inline_write_args(path, payload, skills)
            r = self._script(sid, user, args, STDERR_ROOM, cancel, deadline, commit=True)
            if r.exit_code == 0:
                return
            if r.exit_code != scripts.MISSING_TOOL_EXIT:
                raise _failed("the write script failed", r)
            self._mark_missing(sid, "base64")
        self._ctx.on_target(
            sid, cancel, lambda t: self._write_stream(t, path, payload, skills, cancel, deadline)
        )

    def stat(self, sid: str, path: str, cancel: Optional[CancelToken]) -> Optional[FileStat]:
        deadline = Deadline.after(FILE_OP_TIMEOUT)
        began = time.monotonic()
        try:
            if self._agents.ready(sid) is not None:
                try:
                    answer = self._agents.call(
                        sid, "stat", {"path": path}, deadline=deadline, cancel=cancel
                    ).answer
                except AgentUnavailable:
                    pass
                else:
                    return _stat_of(path, answer)
            r = self._script(
                sid, scripts.SANDBOX_USER, scripts.stat_probe_args(path), STDERR_ROOM, cancel,
                deadline,
            )
        except E2BProviderError as exc:
            if is_ambiguous(exc):
                self._settle(sid, exc, began, cancel, f"examining {path}", retry=False)
            raise
        if r.exit_code == 3:
            return None
        if r.exit_code == scripts.NO_ENTRY_EXIT:
            raise _no_entry(path, r)
        m = _STAT_LINE.fullmatch(r.stdout.decode("utf-8", "replace"))
        if r.exit_code != 0 or m is None:
            raise _failed("the stat script failed", r)
        return FileStat(size=int(m.group(1)), is_dir=m.group(2) == "directory")

    def _settle(
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

    def needs_staging(self, sid: str) -> bool:
        """Whether an upload to ``sid`` should make the staging directory root-only (and
        sweep it) first: this provider has not done so yet, or lost track."""
        return not self._known(sid, _STAGED)

    def staged(self, sid: str, ok: bool) -> None:
        """Note that an upload's helper found (``ok``) or could not make the staging
        directory."""
        if ok:
            self._remember(sid, _STAGED)
        else:
            self._forget(sid, _STAGED)

    def forget(self, sid: str) -> None:
        """Drop what is kept about a sandbox that is being paused or destroyed."""
        self._agents.forget(sid)

    def close(self) -> None:
        """End the file agent sessions (the provider is closing)."""
        self._agents.close()

    # -- through the file agent ------------------------------------------------------------

    def _read_by_agent(
        self,
        sid: str,
        path: str,
        max_bytes: int,
        cancel: Optional[CancelToken],
        deadline: Deadline,
    ) -> Optional[FileContent]:
        want = max_bytes + 1
        large = scripts.LARGE_READ_MIN if want > scripts.LARGE_READ_MIN else 0
        got = self._agents.call(
            sid, "read", {"path": path, "max": want, "large": large},
            deadline=deadline, cancel=cancel,
        )
        content = _content_of(path, got.answer, got.data, max_bytes)
        if content is not _LARGE:
            return content
        try:
            return self._ctx.on_target(
                sid, cancel, lambda t: self._read_fast(t, path, want, cancel, deadline)
            )
        except _Slow:
            # the file changed under the fast path: read it through the agent after all
            got = self._agents.call(
                sid, "read", {"path": path, "max": want, "large": 0},
                deadline=deadline, cancel=cancel,
            )
            content = _content_of(path, got.answer, got.data, max_bytes)
            assert content is not _LARGE
            return content

    def write_many(
        self,
        sid: str,
        files: List[Tuple[str, bytes]],
        cancel: Optional[CancelToken],
    ) -> Dict[str, E2BProviderError]:
        """Write every file (each atomically); the failures, by path (empty: all written).

        Small files travel together, as few requests as :data:`MAX_PAYLOAD` allows; files
        under ``/skills`` and files larger than :data:`MAX_INLINE_FILE` are written one by
        one.
        """
        deadline = Deadline.after(FILE_OP_TIMEOUT)
        failed: Dict[str, E2BProviderError] = {}
        alone = [(p, d) for p, d in files
                 if scripts.is_skills_path(p) or len(d) > MAX_INLINE_FILE]
        together = [(p, d) for p, d in files
                    if not (scripts.is_skills_path(p) or len(d) > MAX_INLINE_FILE)]
        batch: List[Tuple[str, bytes]] = []
        size = 0
        for i, (path, data) in enumerate(together):
            batch.append((path, data))
            size += len(data)
            last = i == len(together) - 1
            if last or size + len(together[i + 1][1]) > MAX_PAYLOAD or len(batch) >= 4096:
                try:
                    failed.update(self._write_batch(sid, batch, cancel, deadline))
                except AgentUnavailable:
                    alone.extend(batch)
                batch, size = [], 0
        for path, data in alone:
            try:
                self.write(sid, path, data, cancel)
            except (CommandFailed, UnsafePath) as exc:  # this file's own failure
                failed[path] = exc
        return failed

    def _write_batch(
        self,
        sid: str,
        batch: List[Tuple[str, bytes]],
        cancel: Optional[CancelToken],
        deadline: Deadline,
    ) -> Dict[str, CommandFailed]:
        fields = {"files": [{"path": p, "len": len(d)} for p, d in batch]}
        payload = b"".join(d for _, d in batch)

        def write() -> Dict[str, CommandFailed]:
            answer = self._agents.call(
                sid, "write_many", fields, payload, deadline=deadline, cancel=cancel
            )
            return _write_results(answer, [p for p, _ in batch])

        return self._written_once_more(
            sid, f"writing {len(batch)} files", cancel, deadline, write
        )

    def read_many(
        self,
        sid: str,
        paths: List[str],
        max_bytes: int,
        cancel: Optional[CancelToken],
    ) -> Tuple[Dict[str, Optional[FileContent]], Dict[str, CommandFailed]]:
        """Read every path (at most ``max_bytes`` each): the contents (None: missing or a
        directory) and the failures, by path."""
        deadline = Deadline.after(FILE_OP_TIMEOUT)
        out: Dict[str, Optional[FileContent]] = {}
        failed: Dict[str, CommandFailed] = {}
        want = max_bytes + 1
        large = scripts.LARGE_READ_MIN if want > scripts.LARGE_READ_MIN else 0
        unique = list(dict.fromkeys(paths))
        alone: List[str] = []
        step = max(1, min(1024, (256 << 20) // want))
        for start in range(0, len(unique), step):
            chunk = unique[start : start + step]
            try:
                got = self._agents.call(
                    sid, "read_many", {"paths": chunk, "max": want, "large": large},
                    deadline=deadline, cancel=cancel,
                )
            except AgentUnavailable:
                alone.extend(chunk)
                continue
            for part in got.parts:
                i = part.answer.get("i")
                if not isinstance(i, int) or not 0 <= i < len(chunk) or chunk[i] in out:
                    raise ProtocolError("the file agent answered a read it was not asked for")
                path = chunk[i]
                try:
                    content = _content_of(path, part.answer, part.data, max_bytes)
                except CommandFailed as exc:
                    failed[path] = exc
                    continue
                if content is _LARGE:
                    alone.append(path)
                else:
                    out[path] = content
            if len(got.parts) != len(chunk):
                raise ProtocolError("the file agent did not answer every read")
        for path in alone:
            try:
                out[path] = self.read(sid, path, max_bytes, cancel)
            except CommandFailed as exc:
                failed[path] = exc
        return out, failed

    def list_dir(
        self, sid: str, path: str, depth: int, cancel: Optional[CancelToken]
    ) -> Optional[List[DirEntry]]:
        """The entries below ``path`` down to ``depth`` levels, as the sandbox user sees
        them; None when ``path`` does not exist."""
        deadline = Deadline.after(FILE_OP_TIMEOUT)
        try:
            got = self._agents.call(
                sid, "list", {"path": path, "depth": depth}, deadline=deadline, cancel=cancel
            )
        except AgentUnavailable:
            return self._list_by_script(sid, path, depth, cancel, deadline)
        answer = got.answer
        if answer.get("missing"):
            return None
        if "noentry" in answer:
            raise _closed_dir(path, str(answer["noentry"]))
        if answer.get("notdir"):
            raise CommandFailed(f"{path} is not a directory")
        if "error" in answer:
            raise _agent_failure(path, answer)
        entries: List[DirEntry] = []
        for part in got.parts:
            raw = part.answer.get("entries")
            if not isinstance(raw, list):
                raise ProtocolError("the file agent sent a listing that is not a list")
            entries.extend(_entry_of(e) for e in raw)
        return entries

    def _list_by_script(
        self,
        sid: str,
        path: str,
        depth: int,
        cancel: Optional[CancelToken],
        deadline: Deadline,
    ) -> Optional[List[DirEntry]]:
        """:meth:`list_dir` without the file agent (no ``python3``): GNU ``find`` as the
        sandbox user, its records put in the agent's order (level by level, sorted by name
        within each directory)."""
        r = self._script(sid, scripts.SANDBOX_USER, scripts.list_args(path, depth),
                         _LIST_OUTPUT, cancel, deadline)
        if r.exit_code == 3:
            return None
        if r.exit_code == scripts.NO_ENTRY_EXIT:
            raise _closed_dir(path, r.stderr.decode("utf-8", "replace").strip() or path)
        if r.exit_code == scripts.NOT_DIR_EXIT:
            raise CommandFailed(f"{path} is not a directory")
        if r.exit_code == scripts.CLOSED_DIR_EXIT:
            raise CommandFailed(f"permission denied (cannot open '{path}' for reading); "
                                f"{ACCESS_HINT}")
        if r.exit_code not in (0, 1):  # 1: find could not enter some directory below
            raise _failed("the listing script failed", r)
        return _found_entries(r.stdout, path)

    def sweep(self, sid: str, cancel: Optional[CancelToken]) -> None:
        """Kill every file operation's processes in the sandbox and remove staged FIFOs."""
        deadline = Deadline.after(FILE_OP_TIMEOUT)
        args = scripts.fileop_cleanup_args("")
        with silence_is_timeout():
            r = self._ctx.on_target(
                sid, cancel,
                lambda t: self._run(t, scripts.ROOT_USER, args, cancel, deadline, marked=False),
            )
        if r.exit_code != 0:
            raise script_failed("the clean-up script failed", r)

    # -- one script, killed with its whole tree when it ends early ------------------------

    def _script(
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
        return self._ctx.on_target(
            sid,
            cancel,
            lambda t: self._run(t, user, args, cancel, deadline, max_output_bytes,
                                commit=commit),
        )

    def _run(
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
            raise _timed_out()
        if marked:  # the script's $0 becomes the operation's marked name
            args = [args[0], args[1], scripts.fileop_name(op_id), *args[3:]]
        try:
            r = run_process(
                ctx.envd(target),
                user=user,
                cmd="/bin/sh",
                args=args,
                tag=_tag(op_id) if marked else None,
                cwd="/",
                max_output_bytes=max_output_bytes,
                timeout=left,
                token=cancel,
                watchdog=ctx.watchdog,
                killer=(lambda pid, bound: self._cleanup(
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
                self._cleanup_now(target, op_id, "", None, interrupted=False)
            raise
        if commit and marked and (r.cancelled or r.timed_out) and self._committed(
            target, op_id, r, said
        ):
            return attrs.evolve(r, exit_code=0, cancelled=False, timed_out=False)
        if r.cancelled:
            raise Cancelled(cancel.reason if cancel is not None else None)
        if r.timed_out:
            raise _timed_out()
        return r

    def _committed(self, target: Target, op_id: str, r: RunOutcome, said: List[str]) -> bool:
        """Whether the write script ``op_id``, stopped (``r``), had renamed its file into
        place, from its exit status and what its withdrawal (``said``) found: a write
        withdrawn before its rename never renames, one that owned its rename did it unless
        it failed or was killed with its temporary file still there. When the withdrawal
        gave no verdict in time, it is done again now (bounded)."""
        if _said(said, "kept") == "1" and r.exited is not None:
            self._unmark(target, op_id)  # the write's process has ended
        if r.exited == 0:
            return True
        claim = _said(said, "claim")
        if claim is None:
            said = []  # a late answer of the first withdrawal may still add to the other
            self._cleanup(target, op_id, "", self._ctx.bounds.kill,
                          claim=1 if r.exited is not None else 2, said=said)
            claim = _said(said, "claim")
            if _said(said, "kept") == "1" and r.exited is not None:
                self._unmark(target, op_id)
        if claim is None:
            log.warning("e2b_provider: the withdrawal of a write in sandbox %s gave no "
                        "verdict; the write may yet take effect", target.sandbox_id)
            return False
        if claim == "withdrawn":
            return False
        if r.exited is not None and r.exited < 128:
            return False  # it ended on its own, and not well: its rename failed
        return _said(said, "part") == "0"

    def _cleanup(
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
                token=guard,
                watchdog=self._ctx.watchdog,
                keepalive_seconds=self._ctx.bounds.keepalive,
            )
            if said is not None and r.exit_code == 0:
                said.extend(r.stdout.decode("ascii", "replace").splitlines())
            if pid is not None:
                envd.send_signal(pid, token=guard, timeout=max(0.5, bound / 4))
            return r.exit_code == 0 and not guard.cancelled
        except E2BProviderError as exc:
            log.warning("e2b_provider: file operation clean-up failed in sandbox %s: %s",
                        target.sandbox_id, exc)
            return False
        finally:
            timer.cancel()

    def _unmark(self, target: Target, op_id: str) -> None:
        """Remove the commit mark a withdrawal kept for write ``op_id`` (bounded; best
        effort: one left is removed after ten minutes, or by ``kill_all``)."""
        try:
            run_process(
                self._ctx.envd(target), user=scripts.ROOT_USER, cmd="/bin/sh",
                args=scripts.commit_unmark_args(op_id), cwd="/", max_output_bytes=STDERR_ROOM,
                timeout=self._ctx.bounds.kill, token=None, watchdog=self._ctx.watchdog,
                keepalive_seconds=self._ctx.bounds.keepalive,
            )
        except E2BProviderError as exc:
            log.info("e2b_provider: could not remove a write's commit mark in sandbox %s: %s",
                     target.sandbox_id, exc)

    def _cleanup_now(
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
        """:meth:`_cleanup` on the caller's thread; a second Ctrl-C abandons it."""
        b = self._ctx.bounds
        bound = b.interrupt_kill if interrupted else b.kill
        try:
            if not self._cleanup(target, op_id, fifo, bound, settle=settle, pid=pid,
                                 claim=claim, said=said):
                log.warning("e2b_provider: a file operation in sandbox %s may have left "
                            "processes behind", target.sandbox_id)
        except KeyboardInterrupt:
            log.warning("e2b_provider: second interrupt; abandoning the clean-up of a file "
                        "operation in sandbox %s", target.sandbox_id)

    # -- two-request paths: a root helper, then a /files transfer --------------------------

    def _helped(
        self,
        target: Target,
        op_id: str,
        argv: List[str],
        fifo: str,
        cancel: Optional[CancelToken],
        deadline: Deadline,
        body: Callable[[_Helper], _T],
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
        helper = _Helper(self._ctx, target, argv, op_id, cancel, deadline, user)
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
        self, helper: _Helper, fifo: str, interrupted: bool, *, commit: bool = False
    ) -> bool:
        """After an early end: let a cut transfer's helper end, then clean up what is left
        (bounded; a second Ctrl-C abandons it). ``commit``: the helper is a write, whose
        rename the clean-up withdraws first; True if the write was found done (it ended
        well, or owned its rename and its temporary file is gone)."""
        b = self._ctx.bounds
        try:
            if helper.posted and not helper.ended:
                helper.settle(min(_SETTLE_S, b.interrupt_kill if interrupted else b.kill))
            exited = helper.ended and helper.exit_code is not None and helper.exit_code < 128
            if commit and helper.ended and helper.exit_code == 0:
                return True
            if exited and (not fifo or helper.opened):
                return False  # it ended on its own and removed what it made
            said: List[str] = []
            self._cleanup_now(
                helper.target, helper.op_id, fifo, None if helper.ended else helper.pid,
                interrupted=interrupted,
                settle=bool(fifo) and helper.posted and not helper.opened,
                # a write that never got its bytes cannot rename: only one that did is
                # withdrawn (its helper had said "ready", so its pid is known)
                claim=(1 if helper.pid is not None else 2) if commit and helper.posted else 0,
                said=said,
            )
            if _said(said, "kept") == "1" and helper.ended:
                self._unmark(helper.target, helper.op_id)  # its process has ended
            return (commit and not exited and _said(said, "claim") == "committing"
                    and _said(said, "part") == "0")
        except KeyboardInterrupt:
            log.warning("e2b_provider: second interrupt; abandoning the clean-up of a file "
                        "operation in sandbox %s", helper.target.sandbox_id)
            return False

    def _write_stream(
        self,
        target: Target,
        path: str,
        payload: bytes,
        skills: bool,
        cancel: Optional[CancelToken],
        deadline: Deadline,
    ) -> None:
        fifo = scripts.staging_path()
        op_id = uuid.uuid4().hex
        bound = f"{max(1.0, deadline.remaining()) + _HELPER_GRACE:.0f}"
        sid = target.sandbox_id
        prepare = not self._known(sid, _STAGED)
        argv = ["timeout", "-k", "5", bound, "/bin/sh",
                *scripts.stream_write_args(path, fifo, skills, op_id, prepare,
                                           size=len(payload))]

        def body(helper: _Helper) -> None:
            if helper.first_line() != b"ready":
                helper.finish()
                self._forget(sid, _STAGED)
                raise _failed("the write script failed", helper.outcome())
            self._remember(sid, _STAGED)
            helper.posted = True
            try:
                helper.envd.upload_raw(
                    fifo, payload, user=scripts.ROOT_USER, token=helper.guard,
                    timeout=max(1.0, deadline.remaining()),
                )
            except E2BHttpError as exc:
                if exc.status == 502:
                    raise  # perhaps the edge: on_target decides whether to retry
                # envd answered, so no upload is on its way: stop the script (it may wait
                # for a writer that never came), then say what it said.
                helper.posted = False
                self._cleanup_now(target, helper.op_id, fifo, helper.pid, interrupted=False)
                helper.finish()
                out = helper.outcome()
                if out.stderr.strip():
                    raise _failed("the write script failed", out) from None
                raise CommandFailed(
                    f"the upload was refused: HTTP {exc.status}: {exc.message}", exit_code=None
                ) from None
            except Exception:
                # cut (a cancel, the bound, a broken connection): if every byte had gone
                # and the script renamed the file, the write is done
                if helper.settle(min(_SETTLE_S, self._ctx.bounds.kill)) and (
                    helper.exit_code == 0
                ):
                    return
                raise
            helper.finish()
            if helper.exit_code != 0:
                raise _failed("the write script failed", helper.outcome())

        self._helped(target, op_id, argv, fifo, cancel, deadline, body, done=lambda: None)

    def _read_fast(
        self,
        target: Target,
        path: str,
        want: int,
        cancel: Optional[CancelToken],
        deadline: Deadline,
    ) -> Optional[FileContent]:
        """Read through a descriptor opened with the sandbox user's credentials.

        Why this never serves what the user could not read, and never a wrong file:

        * The holder is root's process (only its *effective* ids are the user's while it
          opens), so the user can neither kill nor trace it, and its ``/proc/<pid>/fd`` is
          not the user's to touch. The open is the permission check: a symlink swapped in
          before it is resolved with the user's rights (``/etc/shadow`` fails), one swapped
          in after it changes nothing — ``/proc/<pid>/fd/<n>`` is a magic link to the open
          file itself, no path is resolved again.
        * envd opens ``/proc/<pid>/fd/<n>`` before it answers the ``GET``. Once the
          answer's headers arrived the holder is killed through envd by its pid (on the
          worker pool, while the body comes; the bytes are returned only after the kill's
          answer): envd signals only a process it started and has not yet finalised, so
          success proves the holder was still alive when envd opened the descriptor (the
          user cannot kill a root process, and it dies on its own only after the
          operation's bound plus a minute; for its pid to name another process by then,
          envd would have had to start one with that very pid meanwhile). If the holder
          was gone the bytes are thrown away and the file is read the ordinary way.
        """
        max_bytes = want - 1
        op_id = uuid.uuid4().hex
        bound = max(1.0, deadline.remaining()) + _HELPER_GRACE
        argv = ["/bin/sh", *scripts.hold_args(
            path, scripts.SANDBOX_USER, bound, scripts.LARGE_READ_MIN, op_id)]

        def body(helper: _Helper) -> Optional[FileContent]:
            line = helper.first_line()
            m = _HOLD_LINE.fullmatch(line.decode("ascii", "replace")) if line else None
            if m is None or int(m.group(1)) != helper.pid:
                code = helper.finish()
                if code in (3, 4):
                    return None
                if code == scripts.MISSING_TOOL_EXIT:
                    self._mark_missing(target.sandbox_id, "python3")
                    raise _Slow()
                if code == 11 or code == 0:
                    raise _Slow()  # no longer a large regular file, or not our pid
                raise _failed("the read helper failed", helper.outcome())
            stops: List[Future[bool]] = []

            def opened() -> None:
                # envd has opened the descriptor (it answers only after): the holder may be
                # stopped now, on the worker pool, while the body comes.
                try:
                    stops.append(self._ctx.watchdog.submit(_stop_holder, helper, deadline))
                except RuntimeError:  # no pool (closing): stopped after the body instead
                    pass

            try:
                data = helper.envd.download_head(
                    f"/proc/{m.group(1)}/fd/{m.group(2)}", user=scripts.ROOT_USER,
                    length=want, token=helper.guard, timeout=max(1.0, deadline.remaining()),
                    on_open=opened,
                )
            except E2BHttpError as exc:
                if exc.status == 502:
                    raise
                log.info("e2b_provider: GET of a held file failed (%s); reading %s the slow "
                         "way", exc, path)
                raise _Slow() from None
            except TransportError as exc:
                if helper.guard.cancelled or isinstance(exc, TransportTimeout):
                    raise
                # envd ends the body early when the file shrank after it was opened (it
                # promised the length it had then): read what the file holds now
                log.info("e2b_provider: the transfer of %s broke off (%s); it may have "
                         "shrunk: reading it again the ordinary way", path, exc)
                raise _Slow() from None
            alive = _stopped(stops, helper, deadline)
            helper.finish()
            if not alive:
                log.warning("e2b_provider: the file holder in sandbox %s ended before it was "
                            "stopped; reading %s the slow way", target.sandbox_id, path)
                raise _Slow()
            return _content(data, max_bytes)

        return self._helped(target, op_id, argv, "", cancel, deadline, body)


def _said(lines: List[str], key: str) -> Optional[str]:
    """The word after ``key`` on the clean-up's line that starts with it, if any."""
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == key and rest:
            return rest.strip()
    return None


def _stop_holder(helper: _Helper, deadline: Deadline) -> bool:
    """Kill the read's holder by its pid; True if envd still had it (see _read_fast)."""
    assert helper.pid is not None  # its hold line named it
    return helper.envd.send_signal(
        helper.pid, token=helper.guard, timeout=max(1.0, deadline.remaining())
    )


def _stopped(stops: List[Future[bool]], helper: _Helper, deadline: Deadline) -> bool:
    """The outcome of :func:`_stop_holder` submitted in ``stops`` (done here if it was not
    submitted, or is still queued behind other work on the pool)."""
    if not stops or stops[0].cancel():
        return _stop_holder(helper, deadline)
    try:  # bounded: the request's own timeout, and the guard aborts it at the deadline
        return stops[0].result(timeout=max(1.0, deadline.remaining()) + _STOP_WAIT_S)
    except concurrent.futures.TimeoutError:
        raise _timed_out() from None


def _tag(op_id: str) -> str:
    """envd's tag for the process a file operation starts."""
    return scripts.fileop_name(op_id)


def _content(data: bytes, max_bytes: int) -> FileContent:
    truncated = len(data) > max_bytes
    return FileContent(data[:max_bytes] if truncated else data, truncated)


#: The system's words for a refusal, which "permission denied" already says.
_GENERIC_DENIALS = ("permission denied", "operation not permitted", "eacces", "eperm")
#: Said by :func:`_content_of` for a file the fast large-read path should read.
_LARGE = FileContent(b"", True)


def _agent_failure(path: str, answer: Dict[str, Any], doing: str = "open") -> CommandFailed:
    """The error for a file agent's ``{"error": ...}`` answer about ``path``, worded as the
    per-call scripts word theirs (``doing``: ``"open"`` for reads, ``"create"`` for
    writes): the caller's message already names the operation and the path."""
    code = str(answer.get("error", "EIO"))
    message = str(answer.get("message", "")) or code
    where = str(answer.get("path") or path)
    if code in ("EACCES", "EPERM"):
        said = f"cannot open '{where}' for reading" if doing == "open" else (
            f"cannot create {where}")
        why = said if message.lower() in _GENERIC_DENIALS else message
        return CommandFailed(f"permission denied ({why}); {ACCESS_HINT}", exit_code=None)
    if code == "EISDIR":
        return CommandFailed(f"it is a directory; {_advice('is a directory')}", exit_code=None)
    reason = f"{message[:1].lower()}{message[1:]}"
    if where != path and where not in reason:
        reason = f"{reason} ({where})"
    advice = _advice(reason)
    return CommandFailed(f"{reason}; {advice}" if advice else reason, exit_code=None)


def _closed_dir(path: str, closed: str) -> CommandFailed:
    return CommandFailed(
        f"permission denied: user 'sandbox' may not enter {closed}, so {path} cannot be "
        f"examined (it may exist); {ACCESS_HINT}",
        exit_code=None,
    )


def _content_of(
    path: str, answer: Dict[str, Any], data: bytes, max_bytes: int
) -> Optional[FileContent]:
    """A file agent's read answer as :meth:`Files.read` returns it (``_LARGE``: take the
    fast path)."""
    if answer.get("missing"):
        return None
    if "noentry" in answer:
        raise _closed_dir(path, str(answer["noentry"]))
    if "error" in answer:
        raise _agent_failure(path, answer)
    kind = answer.get("kind")
    if kind == "dir":
        return None
    if kind == "other":
        raise CommandFailed(
            f"{path} is {answer.get('type', 'not a regular file')}: only regular files are "
            "read (a FIFO or device could block or never end)"
        )
    if kind != "file":
        raise ProtocolError("the file agent answered a read with something unknown")
    if answer.get("large"):
        return _LARGE
    return _content(data, max_bytes)


def _stat_of(path: str, answer: Dict[str, Any]) -> Optional[FileStat]:
    if answer.get("missing"):
        return None
    if "noentry" in answer:
        raise _closed_dir(path, str(answer["noentry"]))
    if "error" in answer:
        raise _agent_failure(path, answer)
    size = answer.get("size")
    if answer.get("kind") not in ("file", "dir", "other") or not isinstance(size, int):
        raise ProtocolError("the file agent answered a stat with something unknown")
    return FileStat(size=size, is_dir=answer["kind"] == "dir")


def _write_results(answer: AgentAnswer, paths: List[str]) -> Dict[str, CommandFailed]:
    """The failures in a file agent's write answer, by path."""
    results = answer.answer.get("results")
    if not isinstance(results, list) or len(results) != len(paths):
        if "error" in answer.answer:
            failure = _agent_failure(paths[0] if paths else "", answer.answer, "create")
            return {p: failure for p in paths}
        raise ProtocolError("the file agent answered a write with something unknown")
    failed: Dict[str, CommandFailed] = {}
    for path, r in zip(paths, results):
        if not isinstance(r, dict) or r.get("ok") is True:
            continue
        failed[path] = _agent_failure(path, r, "create")
    return failed


#: Output kept from the listing script (about 100 bytes an entry; past it the listing is
#: cut at the last whole entry, as the agent cuts one at a million entries).
_LIST_OUTPUT = 128 << 20
_FIND_KINDS = {"f": "file", "d": "dir", "l": "symlink"}


def _found_entries(printed: bytes, top: str) -> List[DirEntry]:
    """The entries of :data:`~e2b_provider.protocol.scripts.LIST_SCRIPT`'s records, in the file
    agent's order: level by level, each directory's entries sorted by name, directories in the order
    they were listed."""
    fields = printed.split(b"\0")
    by_level: Dict[int, List[DirEntry]] = {}
    for i in range(0, len(fields) - 3, 3):  # whole records only
        head, name, link = fields[i : i + 3]
        try:
            kind, size, mode, mtime, level_text = head.decode("ascii").split(" ")
            path = name.decode("utf-8", "surrogateescape")
            typ = _FIND_KINDS.get(kind, "other")
            entry = DirEntry(
                name=posixpath.basename(path), path=path, type=typ, size=int(size),
                mode=int(mode, 8),
                mtime=datetime.datetime.fromtimestamp(float(mtime), datetime.timezone.utc),
                symlink_target=link.decode("utf-8", "surrogateescape")
                if typ == "symlink" else None,
            )
            by_level.setdefault(int(level_text), []).append(entry)
        except (ValueError, OverflowError, OSError):
            raise ProtocolError("the listing script printed a malformed entry") from None
    out: List[DirEntry] = []
    place = {top.rstrip("/") or "/": 0}  # a directory's place in the level above
    for depth in sorted(by_level):
        level = sorted(by_level[depth],
                       key=lambda e: (place.get(posixpath.dirname(e.path), 0), e.name))
        place = {e.path: n for n, e in enumerate(level)}
        out += level
    return out


def _entry_of(raw: Any) -> DirEntry:
    if not isinstance(raw, dict):
        raise ProtocolError("the file agent sent a listing entry that is not an object")
    try:
        kind = str(raw["type"])
        return DirEntry(
            name=str(raw["name"]),
            path=str(raw["path"]),
            type=kind if kind in ("file", "dir", "symlink") else "other",
            size=int(raw["size"]),
            mode=int(raw["mode"]),
            mtime=datetime.datetime.fromtimestamp(float(raw["mtime"]), datetime.timezone.utc),
            symlink_target=str(raw["target"]) if kind == "symlink" else None,
        )
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        raise ProtocolError("the file agent sent a malformed listing entry") from None


class _Helper:
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
        self.tag = _tag(op_id)
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

    def __enter__(self) -> _Helper:
        if self._cancel is not None:
            self._cancel.raise_if_cancelled()
            self._undo.append(self._cancel.on_cancel(self._stop))
        left = self._deadline.remaining()
        if left <= 0:
            raise _timed_out()
        timer = self._ctx.watchdog.call_later(left, self._expire)

        def cancel_timer() -> None:
            timer.cancel()

        self._undo.append(cancel_timer)
        # A start cut while its request is on its way may still start the helper after
        # the clean-up looked for it (envd answers once it runs): so a cancel lets the
        # start finish (a round trip), and cuts it only if that takes over _OPEN_GRACE_S.
        opening = CancelToken()

        def cut() -> None:
            opening.cancel(CancelReason("deadline", "start"))

        def cut_later(_reason: object = None) -> None:
            self._cut_opening = self._ctx.watchdog.call_later(_OPEN_GRACE_S, cut)

        self._undo.append(self.guard.on_cancel(cut_later))
        try:
            stream = self.envd.start(
                user=self._user,
                cmd=self._argv[0],
                args=self._argv[1:],
                cwd="/",
                keepalive_seconds=self._ctx.bounds.keepalive,
                token=opening,
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
            self._settling = self._ctx.watchdog.call_later(_SETTLE_S, stream.abort)

    @property
    def opened(self) -> bool:
        """Whether the helper said ``open``: envd had opened its FIFO for the transfer."""
        return b"open" in self._said or b"open" in bytes(self._stdout).splitlines()

    def settle(self, bound: float) -> bool:
        """Read the helper to its end within ``bound`` seconds (its transfer was cut: it
        ends on its own); True if it ended. A helper with a FIFO that has not said ``open``
        within :data:`_OPEN_S` never got the transfer (envd opens the FIFO as soon as the
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
            timers.append(self._ctx.watchdog.call_later(min(bound, _OPEN_S), unopened))
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
            raise _timed_out()

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
