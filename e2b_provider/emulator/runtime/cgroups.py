"""Cgroups of the emulator's sandboxes: freeze, kill and resource limits.

This module owns each sandbox's cgroups: ``<cgroup2>/e2b-emulator-<server pid>/<sandbox id>``
(freeze/kill through ``cgroup.freeze`` / ``cgroup.kill``), else the v1 freezer, else none
(the runtime then freezes with SIGSTOP and kills every pid). Memory, CPU and process-count
(``pids.max``) limits are applied where a controller is available (cgroup2 first, else v1), and
:attr:`SandboxCgroups.enforced` says which were. The ``e2b-emulator-<pid>`` parents of servers
that died are removed (:func:`remove_stale_cgroups`). Rootless sandboxes get no cgroups.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from typing import Dict, List, Optional, Tuple

import attrs

from . import linux
from .errors import SandboxRuntimeError

__all__ = ["SandboxCgroups", "remove_stale_cgroups"]

log = logging.getLogger(__name__)

_V1_CONTROLLERS = ("freezer", "memory", "cpu", "pids")
_LIMITED = ("memory", "cpu", "pids")

_cleaned_parents: Dict[str, bool] = {}


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _rmdir_quiet(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _hierarchy_dirs() -> List[str]:
    """Where this process puts its ``e2b-emulator-<pid>`` cgroup parents, per hierarchy."""
    dirs: List[str] = []
    v2 = linux.cgroup2_mount()
    if v2 is not None:
        dirs.append(v2)
    for ctrl in _V1_CONTROLLERS:
        mount = linux.cgroup1_mount(ctrl)
        if mount is not None:
            path = mount + linux.own_cgroup_path(ctrl).rstrip("/")
            if path not in dirs:
                dirs.append(path)
    return dirs


def _remove_stale_in(hierarchy_dir: str) -> List[str]:
    removed: List[str] = []
    try:
        names = os.listdir(hierarchy_dir)
    except OSError:
        return removed
    for name in names:
        m = re.match(r"^e2b-emulator-(\d+)$", name)
        if not m or int(m.group(1)) == os.getpid() or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        stale = os.path.join(hierarchy_dir, name)
        try:
            children = [c for c in os.listdir(stale) if os.path.isdir(os.path.join(stale, c))]
        except OSError:
            continue
        for child in children:
            _rmdir_quiet(os.path.join(stale, child))
        _rmdir_quiet(stale)
        if not os.path.exists(stale):
            removed.append(stale)
    return removed


def remove_stale_cgroups() -> List[str]:
    """Remove the empty cgroups left by emulator processes that died (e.g. by SIGKILL).

    Only ``e2b-emulator-<pid>`` directories whose pid is not running are touched, and only
    when empty of processes (the kernel refuses the others). Runs once per hierarchy
    automatically when this process creates its first sandbox cgroup.

    Returns:
        The removed ``e2b-emulator-<pid>`` directories.
    """
    removed: List[str] = []
    for hierarchy in _hierarchy_dirs():
        removed.extend(_remove_stale_in(hierarchy))
    return removed


def _parent_dir(hierarchy_dir: str) -> str:
    """Create ``<hierarchy_dir>/e2b-emulator-<our pid>``, first removing dead servers' ones."""
    if not _cleaned_parents.get(hierarchy_dir):
        _cleaned_parents[hierarchy_dir] = True
        _remove_stale_in(hierarchy_dir)
    parent = os.path.join(hierarchy_dir, f"e2b-emulator-{os.getpid()}")
    os.makedirs(parent, exist_ok=True)
    return parent


@attrs.define(eq=False)
class SandboxCgroups:
    """The cgroup directories of one sandbox (freezer/killer and limit holders).

    Attributes:
        enforced: the limits applied by :meth:`create`, ``"cpu"``, ``"memory"`` and
            ``"pids"``, each mapped to the file that holds it (e.g. ``"cgroup v1 pids.max"``).
    """

    sandbox_id: str
    mode: str = "none"  # "v2" | "v1" | "none"
    control: Optional[str] = None  # dir with cgroup.freeze (v2) or freezer.state (v1)
    extra: List[str] = attrs.field(factory=list)  # v1 limit cgroups (memory, cpu, pids)
    enforced: Dict[str, str] = attrs.field(factory=dict)

    def create(self, cpu_count: int, memory_mb: int, max_processes: int) -> None:
        """Create the sandbox's cgroups and apply the limits the host's controllers allow."""
        values = {
            "memory": {"memory.max": str(memory_mb * 1024 * 1024)},
            "cpu": {"cpu.max": f"{cpu_count * 100000} 100000"},
            "pids": {"pids.max": str(max_processes)},
        }
        values_v1 = {
            "memory": {"memory.limit_in_bytes": str(memory_mb * 1024 * 1024)},
            "cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(cpu_count * 100000)},
            "pids": {"pids.max": str(max_processes)},
        }
        v2 = linux.cgroup2_mount()
        self.extra = []
        self.enforced = {}
        if v2 is not None:
            parent = _parent_dir(v2)
            path = os.path.join(parent, self.sandbox_id)
            os.makedirs(path, exist_ok=True)
            if os.path.exists(os.path.join(path, "cgroup.freeze")):
                self.mode, self.control = "v2", path
                self._v2_limits(parent, path, values)
                self._v1_limits(values_v1)
                return
            _rmdir_quiet(path)
        freezer = linux.cgroup1_mount("freezer")
        if freezer is not None:
            base = freezer + linux.own_cgroup_path("freezer").rstrip("/")
            path = os.path.join(_parent_dir(base), self.sandbox_id)
            os.makedirs(path, exist_ok=True)
            self.mode, self.control = "v1", path
        else:
            self.mode, self.control = "none", None
        self._v1_limits(values_v1)

    def _v2_limits(self, parent: str, path: str, values: Dict[str, Dict[str, str]]) -> None:
        try:
            available = _read(os.path.join(parent, "cgroup.controllers")).split()
            wanted = [c for c in _LIMITED if c in available]
            if wanted:
                _write(
                    os.path.join(parent, "cgroup.subtree_control"),
                    " ".join("+" + c for c in wanted),
                )
            for ctrl in wanted:
                for name, value in values[ctrl].items():
                    _write(os.path.join(path, name), value)
                self.enforced[ctrl] = "cgroup2 " + " ".join(values[ctrl])
        except OSError as exc:
            log.info("cgroup2 limits not applied for %s: %s", self.sandbox_id, exc)

    def _v1_limits(self, values: Dict[str, Dict[str, str]]) -> None:
        for ctrl in _LIMITED:
            if ctrl in self.enforced:  # by cgroup2
                continue
            mount = linux.cgroup1_mount(ctrl)
            if mount is None:
                continue
            try:
                base = mount + linux.own_cgroup_path(ctrl).rstrip("/")
                path = os.path.join(_parent_dir(base), self.sandbox_id)
                os.makedirs(path, exist_ok=True)
                self.extra.append(path)
                for name, value in values[ctrl].items():
                    _write(os.path.join(path, name), value)
                self.enforced[ctrl] = "cgroup v1 " + " ".join(values[ctrl])
            except OSError as exc:
                log.info("cgroup v1 %s limit not applied for %s: %s", ctrl, self.sandbox_id, exc)

    def procs_fds(self) -> Tuple[List[int], List[int]]:
        """Open the cgroup.procs files: (required, best effort), for the child to write to."""
        required: List[int] = []
        optional: List[int] = []
        if self.control is not None:
            required.append(os.open(os.path.join(self.control, "cgroup.procs"), os.O_WRONLY))
        for path in self.extra:
            try:
                optional.append(os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY))
            except OSError:
                pass
        return required, optional

    def pids(self) -> List[int]:
        if self.control is None:
            return []
        try:
            return [int(x) for x in _read(os.path.join(self.control, "cgroup.procs")).split()]
        except OSError:
            return []

    def set_frozen(self, frozen: bool) -> None:
        assert self.control is not None
        if self.mode == "v2":
            _write(os.path.join(self.control, "cgroup.freeze"), "1" if frozen else "0")
        else:
            _write(os.path.join(self.control, "freezer.state"), "FROZEN" if frozen else "THAWED")

    def is_frozen(self, frozen: bool) -> bool:
        assert self.control is not None
        if self.mode == "v2":
            events = _read(os.path.join(self.control, "cgroup.events"))
            return f"frozen {1 if frozen else 0}" in events.splitlines()
        state = _read(os.path.join(self.control, "freezer.state")).strip()
        return state == ("FROZEN" if frozen else "THAWED")

    def kill(self) -> bool:
        """SIGKILL every member atomically if the kernel can (cgroup.kill); True if done."""
        if self.mode == "v2" and self.control is not None:
            try:
                _write(os.path.join(self.control, "cgroup.kill"), "1")
                return True
            except OSError:
                return False
        return False

    def remove(self) -> None:
        for path in ([self.control] if self.control else []) + self.extra:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise SandboxRuntimeError(f"cannot remove cgroup {path}: {exc}") from exc
            _rmdir_quiet(os.path.dirname(path))  # the server's parent, once empty
        self.control, self.extra, self.mode = None, [], "none"
        self.enforced = {}
