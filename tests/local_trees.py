"""Local directory trees the tests make: removed whatever their depth.

pytest removes old temporary directories recursively; a tree deeper than Python's recursion
limit left in one makes that clean-up fail in every later run. A test that makes such a tree
removes it itself, by :func:`removed_at_the_end`. Importable as ``local_trees`` from every
test directory (as ``waiting`` is).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from e2b_provider.files.local_fs import remove_tree as _remove_tree

__all__ = ["removed_at_the_end"]


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
