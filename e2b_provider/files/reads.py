"""Reads and stats of files in a sandbox, as the sandbox user.

This module owns :class:`Reads`, the part of :class:`~e2b_provider.files.files.Files`
that reads files (capped) and examines them: through the file agent when it is ready,
else by a script run as ``sandbox`` (``head -c`` prints the bytes). A read asking for
more than :data:`~e2b_provider.protocol.scripts.LARGE_READ_MIN` bytes of a larger regular
file takes the fast path (:meth:`Reads._read_fast`): a root holder opens the file *with the
user's credentials*, envd serves its descriptor at the wire's speed, and the holder is
killed through envd while the body comes.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
import uuid
from concurrent.futures import Future
from typing import Dict, List, Optional, Tuple

from ..cancel import CancelToken, Deadline
from ..core.context import STDERR_ROOM
from ..core.file_agents import AgentUnavailable
from ..errors import (
    CommandFailed,
    E2BHttpError,
    ProtocolError,
    TransportError,
    TransportTimeout,
)
from ..models import FileContent, FileStat, Target
from ..protocol import scripts as scripts
from .answers import (
    LARGE,
    capped_content,
    content_of,
    no_entry,
    script_error,
    stat_of,
    timed_out,
)
from .file_part import FilePart
from .helper import HELPER_GRACE_SECONDS, Helper

log = logging.getLogger("e2b_provider")

_STAT_LINE = re.compile(r"([0-9]+) (file|directory)\n?")
_HOLD_LINE = re.compile(r"hold ([0-9]+) ([0-9]+) ([0-9]+)")
#: How long a read waits for its holder's stop beyond the operation's deadline.
_STOP_WAIT_SECONDS = 5.0


class _Slow(Exception):
    """The fast path cannot serve this call; take the reference's path."""


class Reads(FilePart):
    """Read and stat files as the sandbox user (arguments already validated)."""

    def read(
        self, sid: str, path: str, max_bytes: int, cancel: Optional[CancelToken]
    ) -> Optional[FileContent]:
        with self.ops.lost_answer_said(sid, cancel, f"reading {path}"):
            return self._read(sid, path, max_bytes, cancel)

    def _read(
        self, sid: str, path: str, max_bytes: int, cancel: Optional[CancelToken]
    ) -> Optional[FileContent]:
        want = max_bytes + 1
        deadline = self._bound()
        if self._agents.ready(sid, start=False) is not None:
            try:
                return self._read_by_agent(sid, path, max_bytes, cancel, deadline)
            except AgentUnavailable:
                pass
        fast = want > scripts.LARGE_READ_MIN and not self._facts.lacks(sid, "python3")
        # the probe never asks for the fast path when the threshold is ``want`` itself
        args = scripts.read_probe_args(path, want, scripts.LARGE_READ_MIN if fast else want)
        r = self.ops.script(sid, scripts.SANDBOX_USER, args, want + STDERR_ROOM, cancel, deadline)
        self._agents.ready(sid)  # started once the script is done, for the calls that follow
        if r.exit_code == scripts.LARGE_READ_EXIT and fast:
            try:
                return self._ctx.on_target(
                    sid, cancel, lambda t: self._read_fast(t, path, want, cancel, deadline)
                )
            except _Slow:
                args = scripts.read_probe_args(path, want, want)
                r = self.ops.script(
                    sid, scripts.SANDBOX_USER, args, want + STDERR_ROOM, cancel, deadline
                )
        if r.exit_code in (3, 4):
            return None
        if r.exit_code == scripts.NO_ENTRY_EXIT:
            raise no_entry(path, r)
        if r.exit_code != 0:
            raise script_error("the read script failed", r)
        return capped_content(r.stdout, max_bytes)

    def stat(self, sid: str, path: str, cancel: Optional[CancelToken]) -> Optional[FileStat]:
        deadline = self._bound()
        with self.ops.lost_answer_said(sid, cancel, f"examining {path}"):
            if self._agents.ready(sid, start=False) is not None:
                try:
                    answer = self._agents.call(
                        sid, "stat", {"path": path}, deadline=deadline, cancel=cancel
                    ).answer
                except AgentUnavailable:
                    pass
                else:
                    return stat_of(path, answer)
            r = self.ops.script(
                sid, scripts.SANDBOX_USER, scripts.stat_probe_args(path), STDERR_ROOM, cancel,
                deadline,
            )
            self._agents.ready(sid)  # started once the script is done
        if r.exit_code == 3:
            return None
        if r.exit_code == scripts.NO_ENTRY_EXIT:
            raise no_entry(path, r)
        m = _STAT_LINE.fullmatch(r.stdout.decode("utf-8", "replace"))
        if r.exit_code != 0 or m is None:
            raise script_error("the stat script failed", r)
        return FileStat(size=int(m.group(1)), is_dir=m.group(2) == "directory")

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
        content = content_of(path, got.answer, got.data, max_bytes)
        if content is not LARGE:
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
            content = content_of(path, got.answer, got.data, max_bytes)
            assert content is not LARGE
            return content

    def read_many(
        self,
        sid: str,
        paths: List[str],
        max_bytes: int,
        cancel: Optional[CancelToken],
    ) -> Tuple[Dict[str, Optional[FileContent]], Dict[str, CommandFailed]]:
        """Read every path (at most ``max_bytes`` each): the contents (None: missing or a
        directory) and the failures, by path."""
        deadline = self._bound()
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
                    content = content_of(path, part.answer, part.data, max_bytes)
                except CommandFailed as exc:
                    failed[path] = exc
                    continue
                if content is LARGE:
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
        bound = max(1.0, deadline.remaining()) + HELPER_GRACE_SECONDS
        argv = ["/bin/sh", *scripts.hold_args(
            path, scripts.SANDBOX_USER, bound, scripts.LARGE_READ_MIN, op_id)]

        def body(helper: Helper) -> Optional[FileContent]:
            line = helper.first_line()
            m = _HOLD_LINE.fullmatch(line.decode("ascii", "replace")) if line else None
            if m is None or int(m.group(1)) != helper.pid:
                code = helper.finish()
                if code in (3, 4):
                    return None
                if code == scripts.MISSING_TOOL_EXIT:
                    self._facts.mark_missing(target.sandbox_id, "python3")
                    raise _Slow()
                if code == 11 or code == 0:
                    raise _Slow()  # no longer a large regular file, or not our pid
                raise script_error("the read helper failed", helper.outcome())
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
                    length=want, cancel=helper.guard, timeout=max(1.0, deadline.remaining()),
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
            return capped_content(data, max_bytes)

        return self.ops.helped(target, op_id, argv, "", cancel, deadline, body)


def _stop_holder(helper: Helper, deadline: Deadline) -> bool:
    """Kill the read's holder by its pid; True if envd still had it (see _read_fast)."""
    assert helper.pid is not None  # its hold line named it
    return helper.envd.send_signal(
        helper.pid, cancel=helper.guard, timeout=max(1.0, deadline.remaining())
    )


def _stopped(stops: List[Future[bool]], helper: Helper, deadline: Deadline) -> bool:
    """The outcome of :func:`_stop_holder` submitted in ``stops`` (done here if it was not
    submitted, or is still queued behind other work on the pool)."""
    if not stops or stops[0].cancel():
        return _stop_holder(helper, deadline)
    try:  # bounded: the request's own timeout, and the guard aborts it at the deadline
        return stops[0].result(timeout=max(1.0, deadline.remaining()) + _STOP_WAIT_SECONDS)
    except concurrent.futures.TimeoutError:
        raise timed_out() from None


