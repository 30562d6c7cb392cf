"""What the file operations learnt about each sandbox, kept for the next ones.

This module owns :class:`SandboxFacts`: that a sandbox lacks a tool the fast paths need
(``base64``, ``python3``), and that this provider made its staging directory root-only and
swept it (:data:`STAGED`). At most :data:`MAX_REMEMBERED_SANDBOXES` facts are kept, the least
recently learnt dropped first.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Tuple

from ..core.context import MAX_REMEMBERED_SANDBOXES
from ..core.marks import remember

log = logging.getLogger("e2b_provider")

#: The fact that this provider made a sandbox's staging directory root-only and swept it.
STAGED = "staged"


class SandboxFacts:
    """Facts about sandboxes, by sandbox id (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (sandbox id, fact), most recent last: a tool missing there ("base64",
        # "python3"), or STAGED
        self._facts: collections.OrderedDict[Tuple[str, str], None] = (
            collections.OrderedDict()
        )

    def forget_all(self) -> None:
        """Drop every fact (the process forked: the sandboxes may have changed since)."""
        with self._lock:
            self._facts.clear()

    def known(self, sid: str, fact: str) -> bool:
        """Whether ``fact`` is known about sandbox ``sid``."""
        with self._lock:
            return (sid, fact) in self._facts

    def remember(self, sid: str, fact: str) -> None:
        """Keep ``fact`` about sandbox ``sid``."""
        with self._lock:
            remember(self._facts, (sid, fact), None, MAX_REMEMBERED_SANDBOXES)

    def forget(self, sid: str, fact: str) -> None:
        """Drop ``fact`` about sandbox ``sid``, if it was known."""
        with self._lock:
            self._facts.pop((sid, fact), None)

    def lacks(self, sid: str, tool: str) -> bool:
        """Whether sandbox ``sid`` was found to have no ``tool``."""
        return self.known(sid, tool)

    def mark_missing(self, sid: str, tool: str) -> None:
        """Remember that sandbox ``sid`` has no ``tool`` (the slower paths are taken)."""
        log.info("e2b_provider: sandbox %s has no %s; using the slower file path", sid, tool)
        self.remember(sid, tool)
