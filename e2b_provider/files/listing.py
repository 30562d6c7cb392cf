"""Listings of directories in a sandbox, as the sandbox user sees them.

This module owns :class:`Listing`, the part of :class:`~e2b_provider.files.files.Files`
that lists a directory's entries down to a depth: through the file agent (level by level,
sorted by name within each directory), or, without ``python3``, by GNU ``find`` run as
``sandbox`` (:data:`~e2b_provider.protocol.scripts.LIST_SCRIPT`), whose records are put in
the agent's order.
"""

from __future__ import annotations

import datetime
import posixpath
from typing import Any, Dict, List, Optional

from ..cancel import CancelToken, Deadline
from ..core.file_agents import AgentUnavailable
from ..errors import CommandFailed, ProtocolError
from ..models import DirEntry
from ..protocol import scripts as scripts
from .answers import ACCESS_HINT, absent, closed_dir, script_error
from .file_part import FilePart

#: Output kept from the listing script (about 100 bytes an entry; past it the listing is
#: cut at the last whole entry, as the agent cuts one at a million entries).
_LIST_OUTPUT = 128 << 20
_FIND_KINDS = {"f": "file", "d": "dir", "l": "symlink"}


class Listing(FilePart):
    """List directories as the sandbox user (arguments already validated)."""

    def list_dir(
        self, sid: str, path: str, depth: int, cancel: Optional[CancelToken]
    ) -> Optional[List[DirEntry]]:
        """The entries below ``path`` down to ``depth`` levels, as the sandbox user sees
        them; None when ``path`` does not exist."""
        deadline = self._bound()
        try:
            got = self._agents.call(
                sid, "list", {"path": path, "depth": depth}, deadline=deadline, cancel=cancel
            )
        except AgentUnavailable:
            return self._list_by_script(sid, path, depth, cancel, deadline)
        answer = got.answer
        if absent(path, answer):
            return None
        if answer.get("notdir"):
            raise CommandFailed(f"{path} is not a directory")
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
        r = self.ops.script(sid, scripts.SANDBOX_USER, scripts.list_args(path, depth),
                         _LIST_OUTPUT, cancel, deadline)
        if r.exit_code == 3:
            return None
        if r.exit_code == scripts.NO_ENTRY_EXIT:
            raise closed_dir(path, r.stderr.decode("utf-8", "replace").strip() or path)
        if r.exit_code == scripts.NOT_DIR_EXIT:
            raise CommandFailed(f"{path} is not a directory")
        if r.exit_code == scripts.CLOSED_DIR_EXIT:
            raise CommandFailed(f"permission denied (cannot open '{path}' for reading); "
                                f"{ACCESS_HINT}")
        if r.exit_code not in (0, 1):  # 1: find could not enter some directory below
            raise script_error("the listing script failed", r)
        return _found_entries(r.stdout, path)



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


