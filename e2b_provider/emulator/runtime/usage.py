"""Resource usage of one sandbox, as the host sees it (for the control plane's metrics).

This module owns reading a sandbox's CPU time, memory and disk use: from its cgroups where it
has them (cgroup v2 ``cpu.stat``/``memory.current``/``memory.stat``, or the v1 ``cpuacct``
and ``memory`` controllers), else by summing ``/proc/<pid>`` of its processes (rootless mode,
or a host without those controllers); disk use is the size of the files it wrote (its root
directory and overlay upper directories). Every read is best effort: a value the host cannot
give is ``None`` and :attr:`ResourceUsage.sources` says where each value came from.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import attrs

__all__ = ["ResourceUsage", "read_usage"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_NO_LIMIT = 1 << 60  # v1 reports "no limit" as a huge number


@attrs.frozen
class ResourceUsage:
    """One reading of a sandbox's resource use.

    Attributes:
        cpu_usec: CPU time used by the sandbox's processes since boot, in microseconds.
        mem_used: memory in use, page cache excluded, in bytes.
        mem_cache: page cache charged to the sandbox, in bytes.
        mem_limit: the enforced memory limit in bytes, if any.
        disk_used: bytes of the files the sandbox wrote (allocated blocks).
        sources: where each value came from, e.g. ``{"cpu": "cgroup2", "memory": "proc"}``.
    """

    cpu_usec: Optional[int]
    mem_used: Optional[int]
    mem_cache: Optional[int]
    mem_limit: Optional[int]
    disk_used: Optional[int]
    sources: Dict[str, str]


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def _int(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _stat_map(text: Optional[str]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _cgroup_cpu(dirs: Sequence[str]) -> Optional[Tuple[int, str]]:
    for d in dirs:
        usec = _stat_map(_read(os.path.join(d, "cpu.stat"))).get("usage_usec")
        if usec is not None:
            return usec, "cgroup2"
        nsec = _int(_read(os.path.join(d, "cpuacct.usage")))
        if nsec is not None:
            return nsec // 1000, "cgroup1"
    return None


def _cgroup_memory(dirs: Sequence[str]) -> Optional[Tuple[int, int, Optional[int], str]]:
    """(used without cache, cache, limit, source) from the first dir with memory files."""
    for d in dirs:
        current = _int(_read(os.path.join(d, "memory.current")))
        if current is not None:
            cache = _stat_map(_read(os.path.join(d, "memory.stat"))).get("file", 0)
            limit = _int(_read(os.path.join(d, "memory.max")))  # "max" → None
            return max(0, current - cache), cache, limit, "cgroup2"
        usage = _int(_read(os.path.join(d, "memory.usage_in_bytes")))
        if usage is not None:
            stat = _stat_map(_read(os.path.join(d, "memory.stat")))
            cache = stat.get("total_cache", stat.get("cache", 0))
            limit = _int(_read(os.path.join(d, "memory.limit_in_bytes")))
            if limit is not None and limit >= _NO_LIMIT:
                limit = None
            return max(0, usage - cache), cache, limit, "cgroup1"
    return None


def _proc_cpu_usec(pids: Iterable[int]) -> int:
    ticks = 0
    for pid in pids:
        text = _read(f"/proc/{pid}/stat")
        if not text:
            continue
        fields = text.rsplit(")", 1)[-1].split()
        try:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        except (IndexError, ValueError):
            continue
    return ticks * 1_000_000 // _CLOCK_TICKS


def _proc_rss(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        fields = (_read(f"/proc/{pid}/statm") or "").split()
        if len(fields) >= 3 and fields[1].isdigit() and fields[2].isdigit():
            total += (int(fields[1]) - int(fields[2])) * _PAGE_SIZE  # resident minus shared
    return total


def _tree_bytes(roots: Iterable[str]) -> int:
    """Allocated bytes under ``roots`` (no symlinks followed, hard links counted once)."""
    seen: Set[Tuple[int, int]] = set()
    total = 0
    stack: List[str] = [r for r in roots if os.path.isdir(r)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total


def read_usage(
    cgroup_dirs: Sequence[str], pids: Sequence[int], file_dirs: Sequence[str]
) -> ResourceUsage:
    """Read a sandbox's resource use now (blocking: walks its files; run it off the loop).

    Args:
        cgroup_dirs: the sandbox's cgroup directories (any hierarchy), empty when it has none.
        pids: host pids of every process of the sandbox (the ``/proc`` fallback).
        file_dirs: the directories holding the files the sandbox wrote.
    """
    sources: Dict[str, str] = {}
    cpu = _cgroup_cpu(cgroup_dirs)
    if cpu is not None:
        cpu_usec: Optional[int] = cpu[0]
        sources["cpu"] = cpu[1]
    else:
        cpu_usec = _proc_cpu_usec(pids)
        sources["cpu"] = "proc"
    mem = _cgroup_memory(cgroup_dirs)
    mem_limit: Optional[int]
    if mem is not None:
        mem_used, mem_cache, mem_limit, sources["memory"] = mem
    else:
        mem_used, mem_cache, mem_limit = _proc_rss(pids), 0, None
        sources["memory"] = "proc"
    sources["disk"] = "files"
    return ResourceUsage(
        cpu_usec=cpu_usec,
        mem_used=mem_used,
        mem_cache=mem_cache,
        mem_limit=mem_limit,
        disk_used=_tree_bytes(file_dirs),
        sources=sources,
    )
