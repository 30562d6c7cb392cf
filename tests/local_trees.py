"""Local directory trees the tests make: removed whatever their depth; tar streams built
in memory (:func:`tar_of`, :func:`tar_entry`).

pytest removes old temporary directories recursively; a tree deeper than Python's recursion
limit left in one makes that clean-up fail in every later run. A test that makes such a tree
removes it itself, by :func:`removed_at_the_end`. Importable as ``local_trees`` from every
test directory (as ``waiting`` is).
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from pathlib import Path
from typing import Dict, Iterator, Optional

from e2b_provider.files.local_fs import remove_tree as _remove_tree

__all__ = ["removed_at_the_end", "tar_entry", "tar_of"]


@contextlib.contextmanager
def removed_at_the_end(top: Path) -> Iterator[None]:
    """Remove the directory ``top`` (if there is one) when the block ends, however it ends."""
    try:
        yield
    finally:
        if os.path.lexists(top):
            fd = os.open(top.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                _remove_tree(fd, top.name)
            finally:
                os.close(fd)


def tar_of(
    *entries: tarfile.TarInfo, data: Optional[Dict[str, bytes]] = None, mode: str = "w"
) -> bytes:
    """A tar stream of ``entries`` (a file's bytes from ``data`` by its name), in memory."""
    data = data or {}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:  # type: ignore[call-overload]
        for ti in entries:
            body = data.get(ti.name)
            if body is not None:
                ti.size = len(body)
            tf.addfile(ti, io.BytesIO(body) if body is not None else None)
    return buf.getvalue()


def tar_entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644
              ) -> tarfile.TarInfo:
    """A tar member header: its name, type, link target and mode."""
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mode = kind, link, mode
    return ti
