"""The library's own files in a watch: hidden, and a staged write said as its target's.

Every write of the library goes to a staging file beside its target (``.capybara-part-…``,
:data:`~e2b_provider.protocol.scripts.PART_PREFIX`), renamed onto the target when whole;
commands and file operations keep their control files and registries in ``/tmp``
(``.capybara-exec-…``, ``.capybara-parts-…``, ``.capybara-commit-…``, ``.capybara-cmd``),
and uploads pass through :data:`~e2b_provider.protocol.scripts.UPLOAD_DIR`. envd reports
changes to all of them like any other. :class:`OwnNames` drops every event on such a name
(below the watched directory: a watch of one of them sees it), and says a staging file
renamed onto its target as envd says a direct write of the target: ``create`` (the name
moved in, as envd reports it), then ``write`` when content was written to the staging file.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import collections
import posixpath
from typing import Dict, List, Optional, Tuple

from ..models import FileEventType
from ..protocol import scripts as scripts

__all__ = ["INTERNAL_PREFIX", "OwnNames", "is_internal"]

#: A name starting with this is one of the library's own files in a sandbox.
INTERNAL_PREFIX = ".capybara-"
#: Staging files whose writes are remembered at most (the oldest forgotten first).
MAX_STAGED = 256


def is_internal(watched: str, name: str) -> bool:
    """Whether the event on ``name`` (relative to the watched directory ``watched``) is
    about one of the library's own files."""
    if any(part.startswith(INTERNAL_PREFIX) for part in name.split("/")):
        return True
    upload = scripts.UPLOAD_DIR
    if watched == upload or watched.startswith(upload + "/"):
        return False
    path = posixpath.join(watched, name)
    return path == upload or path.startswith(upload + "/")


class OwnNames:
    """The events a watch of ``watched`` reports, the library's own files taken out.

    Args:
        watched: the watched directory (absolute).
    """

    def __init__(self, watched: str) -> None:
        self._watched = watched
        #: staging files (relative names) that content was written to
        self._written: Dict[str, None] = collections.OrderedDict()
        #: the directory of the staging file renamed by the event just before, and whether
        #: content was written to it
        self._renamed: Optional[Tuple[str, bool]] = None

    def events(self, kind: FileEventType, name: str) -> List[Tuple[FileEventType, str]]:
        """What to report for envd's event ``kind`` on ``name`` (relative to the watched
        directory): nothing, the event, or a staged write said as its target's."""
        renamed, self._renamed = self._renamed, None
        if not is_internal(self._watched, name):
            if renamed is not None and kind == "create" and posixpath.dirname(name) == renamed[0]:
                # the move-in that ended a staged write: the target's create, then its write
                return [(kind, name), ("write", name)] if renamed[1] else [(kind, name)]
            return [(kind, name)]
        if posixpath.basename(name).startswith(scripts.PART_PREFIX):
            if kind == "write":
                self._written[name] = None
                while len(self._written) > MAX_STAGED:
                    del self._written[next(iter(self._written))]
            elif kind in ("rename", "remove"):
                wrote = name in self._written
                self._written.pop(name, None)
                if kind == "rename":
                    self._renamed = (posixpath.dirname(name), wrote)
        return []
