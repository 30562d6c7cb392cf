"""Files in a sandbox: read (capped), write (as the sandbox user), stat.

This module owns :class:`Files`, the provider's part that reads, writes and examines files
with the sandbox user's permissions: reads and stats run the reference's scripts as user
``sandbox``; a write uploads to a root-only staging file, then a script copies it into place
as ``sandbox`` (or as root with mode 0644 under ``/skills``). Arguments arrive validated (the
provider facade checks them).
"""

from __future__ import annotations

import re
from typing import Optional

from . import _scripts as scripts
from ._context import STDERR_ROOM, ProviderContext, script_failed
from ._exec import RunOutcome
from .cancel import CancelToken
from .models import FileContent, FileStat, Target

__all__ = ["Files"]

_STAT_LINE = re.compile(r"([0-9]+) (file|directory)\n?")


class Files:
    """Read, write and stat files as the sandbox user (arguments already validated)."""

    def __init__(self, ctx: ProviderContext) -> None:
        self._ctx = ctx

    def read(
        self, sid: str, path: str, max_bytes: int, cancel: Optional[CancelToken]
    ) -> Optional[FileContent]:
        want = max_bytes + 1
        r = self._ctx.script_on(
            sid, scripts.read_args(path, want), cancel, max_output_bytes=want + STDERR_ROOM
        )
        if r.exit_code in (3, 4):
            return None
        if r.exit_code != 0:
            raise script_failed(f"cannot read {path}", r)
        truncated = len(r.stdout) > max_bytes
        return FileContent(r.stdout[:max_bytes] if truncated else r.stdout, truncated)

    def write(self, sid: str, path: str, payload: bytes, cancel: Optional[CancelToken]) -> None:
        ctx = self._ctx
        staging = scripts.staging_path()
        args = scripts.write_args(path, staging, scripts.is_skills_path(path))

        def upload_and_move(target: Target) -> RunOutcome:
            ctx.envd(target).upload(staging, payload, user=scripts.ROOT_USER, token=cancel)
            return ctx.run_script(target, scripts.ROOT_USER, args, STDERR_ROOM, cancel)

        r = ctx.on_target(sid, cancel, upload_and_move)
        if r.exit_code != 0:
            raise script_failed(f"cannot write {path}", r)

    def stat(self, sid: str, path: str, cancel: Optional[CancelToken]) -> Optional[FileStat]:
        r = self._ctx.script_on(sid, scripts.stat_args(path), cancel)
        if r.exit_code == 3:
            return None
        m = _STAT_LINE.fullmatch(r.stdout.decode("utf-8", "replace"))
        if r.exit_code != 0 or m is None:
            raise script_failed(f"cannot stat {path}", r)
        return FileStat(size=int(m.group(1)), is_dir=m.group(2) == "directory")
