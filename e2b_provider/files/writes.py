"""Writes of files in a sandbox, as the sandbox user (as root under ``/skills``).

This module owns :class:`Writes`, the part of :class:`~e2b_provider.files.files.Files`
that writes files, each atomically: small files through the file agent (many in one
request), a file of up to :data:`~e2b_provider.protocol.scripts.INLINE_WRITE_MAX` bytes by
one script whose argument carries it in base64, a larger one through a FIFO in the
root-only staging directory that envd's ``POST /files`` fills while ``runuser -u sandbox …
cat > path`` (or root's ``cat`` under ``/skills``) writes the bytes as they arrive. A
write whose answer was lost is done once more: the same bytes written again give the same
file.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

from ..cancel import CancelToken, Deadline
from ..core.context import STDERR_ROOM
from ..core.file_agents import MAX_INLINE_FILE, MAX_PAYLOAD, AgentUnavailable
from ..core.messages import is_ambiguous
from ..errors import CommandFailed, E2BHttpError, E2BProviderError, UnsafePath
from ..models import Target
from ..protocol import scripts as scripts
from .answers import script_error, write_results
from .facts import STAGED
from .file_part import FilePart
from .helper import HELPER_GRACE_SECONDS, SETTLE_SECONDS, Helper

log = logging.getLogger("e2b_provider")

#: A write whose answer was lost is done again only with at least this many seconds left.
_RETRY_MIN_SECONDS = 1.0

_T = TypeVar("_T")


class Writes(FilePart):
    """Write files as the sandbox user (arguments already validated)."""

    def write(self, sid: str, path: str, payload: bytes, cancel: Optional[CancelToken]) -> None:
        deadline = self._bound()
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
                again = attempt == 1 and deadline.remaining() >= _RETRY_MIN_SECONDS
                self.ops.settle_lost(sid, exc, began, cancel,
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
            and self._agents.ready(sid, start=False) is not None
        ):
            try:
                answer = self._agents.call(
                    sid, "write", {"path": path}, payload, deadline=deadline, cancel=cancel
                )
            except AgentUnavailable:
                pass
            else:
                failure = write_results(answer, [path]).get(path)
                if failure is not None:
                    raise failure
                return
        if len(payload) <= scripts.INLINE_WRITE_MAX and not self._facts.lacks(sid, "base64"):
            user = scripts.ROOT_USER if skills else scripts.SANDBOX_USER
            args = scripts.inline_write_args(path, payload, skills)
            r = self.ops.script(sid, user, args, STDERR_ROOM, cancel, deadline, commit=True)
            if not skills:  # started once the script is done, for the calls that follow
                self._agents.ready(sid)
            if r.exit_code == 0:
                return
            if r.exit_code != scripts.MISSING_TOOL_EXIT:
                raise script_error("the write script failed", r)
            self._facts.mark_missing(sid, "base64")
        self._ctx.on_target(
            sid, cancel, lambda t: self._write_stream(t, path, payload, skills, cancel, deadline)
        )

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
        deadline = self._bound()
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
            return write_results(answer, [p for p, _ in batch])

        return self._written_once_more(
            sid, f"writing {len(batch)} files", cancel, deadline, write
        )

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
        bound = f"{max(1.0, deadline.remaining()) + HELPER_GRACE_SECONDS:.0f}"
        sid = target.sandbox_id
        prepare = not self._facts.known(sid, STAGED)
        argv = ["timeout", "-k", "5", bound, "/bin/sh",
                *scripts.stream_write_args(path, fifo, skills, op_id, prepare,
                                           size=len(payload))]

        def body(helper: Helper) -> None:
            if helper.first_line() != b"ready":
                helper.finish()
                self._facts.forget(sid, STAGED)
                raise script_error("the write script failed", helper.outcome())
            self._facts.remember(sid, STAGED)
            helper.posted = True
            try:
                helper.envd.upload_raw(
                    fifo, payload, user=scripts.ROOT_USER, cancel=helper.guard,
                    timeout=max(1.0, deadline.remaining()),
                )
            except E2BHttpError as exc:
                if exc.status == 502:
                    raise  # perhaps the edge: on_target decides whether to retry
                # envd answered, so no upload is on its way: stop the script (it may wait
                # for a writer that never came), then say what it said.
                helper.posted = False
                self.ops.cleanup_now(target, helper.op_id, fifo, helper.pid, interrupted=False)
                helper.finish()
                out = helper.outcome()
                if out.stderr.strip():
                    raise script_error("the write script failed", out) from None
                raise CommandFailed(
                    f"the upload was refused: HTTP {exc.status}: {exc.message}", exit_code=None
                ) from None
            except Exception:
                # cut (a cancel, the bound, a broken connection): if every byte had gone
                # and the script renamed the file, the write is done
                if helper.settle(min(SETTLE_SECONDS, self._ctx.bounds.kill)) and (
                    helper.exit_code == 0
                ):
                    return
                raise
            helper.finish()
            if helper.exit_code != 0:
                raise script_error("the write script failed", helper.outcome())

        self.ops.helped(target, op_id, argv, fifo, cancel, deadline, body, done=lambda: None)

