"""What this machine reads in ``/proc`` of a sandbox's processes, where the sandbox itself
cannot look (the file agent is not dumpable: even the sandbox's root cannot read its /proc
files). Importable as ``host_proc`` from every test directory (as ``waiting`` is).
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["inotify_watches_on"]


def inotify_watches_on(emulator: Any, sandbox_id: str, inode: int) -> int:
    """How many inotify watches the sandbox's processes hold on ``inode`` (the emulator
    names the sandbox's processes: ``emulator.sandbox_pids``)."""
    pattern = re.compile(rf"^inotify wd:\S+ ino:{inode:x} ", re.MULTILINE)
    count = 0
    for pid in emulator.sandbox_pids(sandbox_id):
        try:
            names = os.listdir(f"/proc/{pid}/fdinfo")
        except OSError:
            continue
        for name in names:
            try:
                with open(f"/proc/{pid}/fdinfo/{name}") as f:
                    count += len(pattern.findall(f.read()))
            except OSError:
                continue
    return count
