"""Host-side Linux helpers for the emulator runtime: prctl, mountinfo, cgroups, namespaces.

This module owns the few kernel interfaces the host side of the runtime (and the
:class:`~e2b_provider.emulator.Emulator` handle) needs: ``prctl(PR_SET_PDEATHSIG)`` through
ctypes, parsing ``/proc/self/mountinfo`` (to find the cgroup2 and cgroup-v1 hierarchies and to
check that no mount is left behind), capability masks from ``/proc/<pid>/status``, process
states, children and namespace identities, and running host tools quietly (:func:`run_tool`,
with :data:`HOST_PATH`). No sockets, no aiohttp/requests/urllib3. The
sandbox side (mounts, pivot_root) lives in :mod:`.pid1`, which must stay runnable without this
package.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import attrs

__all__ = [
    "CAP_SYS_ADMIN",
    "HOST_PATH",
    "MAX_SOCKET_PATH",
    "MountInfo",
    "cap_effective",
    "cgroup1_mount",
    "cgroup2_mount",
    "child_pids",
    "is_zombie",
    "mountinfo",
    "mounts_under",
    "namespace_id",
    "own_cgroup_path",
    "pdeathsig_setter",
    "pids_in_pid_namespace",
    "process_state",
    "run_tool",
    "syncfs",
]

PR_SET_PDEATHSIG = 1
CAP_SYS_ADMIN = 21
#: The ``PATH`` host tools (``unshare``, ``rm``, ``newuidmap``, ``mkfs.ext4``) are looked up in.
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Longest unix socket path Linux accepts (sun_path is 108 bytes with the NUL).
MAX_SOCKET_PATH = 107


@attrs.frozen
class MountInfo:
    """One line of ``/proc/<pid>/mountinfo``.

    Attributes:
        mount_point: where it is mounted (octal escapes decoded).
        root: the path inside the mounted filesystem that is the mount's root.
        fstype: filesystem type, e.g. ``cgroup2``.
        super_options: the per-superblock options (for cgroup v1: the controllers).
    """

    mount_point: str
    root: str
    fstype: str
    super_options: Tuple[str, ...]


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    out: List[str] = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1 : i + 4]) == 3 and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> List[MountInfo]:
    """Parse the text of a ``mountinfo`` file.

    Args:
        text: the file's content.

    Returns:
        One :class:`MountInfo` per well-formed line, in file order.
    """
    result: List[MountInfo] = []
    for line in text.splitlines():
        parts = line.split()
        try:
            sep = parts.index("-")
        except ValueError:
            continue
        if sep < 5 or len(parts) < sep + 4:
            continue
        result.append(
            MountInfo(
                mount_point=_unescape(parts[4]),
                root=_unescape(parts[3]),
                fstype=parts[sep + 1],
                super_options=tuple(parts[sep + 3].split(",")),
            )
        )
    return result


def mountinfo(pid: str = "self") -> List[MountInfo]:
    """Return the mounts visible to process ``pid`` (default: this process)."""
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        return parse_mountinfo(f.read())


def mounts_under(path: str, pid: str = "self") -> List[str]:
    """Return the mount points at or below ``path`` in the mount namespace of ``pid``."""
    base = os.path.realpath(path).rstrip("/") or "/"
    prefix = base + "/" if base != "/" else "/"
    return [
        m.mount_point
        for m in mountinfo(pid)
        if m.mount_point == base or m.mount_point.startswith(prefix)
    ]


def cgroup2_mount() -> Optional[str]:
    """Return where the cgroup2 (unified) hierarchy is mounted, or None."""
    for m in mountinfo():
        if m.fstype == "cgroup2":
            return m.mount_point
    return None


def cgroup1_mount(controller: str) -> Optional[str]:
    """Return where the cgroup v1 hierarchy holding ``controller`` is mounted, or None."""
    for m in mountinfo():
        if m.fstype == "cgroup" and controller in m.super_options:
            return m.mount_point
    return None


def own_cgroup_path(controller: str) -> str:
    """Return this process's cgroup path in the v1 hierarchy of ``controller`` ("" = v2).

    Args:
        controller: a v1 controller name such as ``"memory"``, or ``""`` for cgroup2.

    Returns:
        A path starting with ``/`` (``/`` when not found).
    """
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            names = controllers.split(",") if controllers else []
            if (controller == "" and not names) or controller in names:
                return path or "/"
    return "/"


def cap_effective(pid: str = "self") -> int:
    """Return the effective capability mask of ``pid``."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def namespace_id(pid: int, kind: str) -> Optional[Tuple[int, int]]:
    """Return ``(st_dev, st_ino)`` of ``/proc/<pid>/ns/<kind>``, or None if it is gone."""
    try:
        st = os.stat(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def process_state(pid: int) -> Optional[str]:
    """Return the one-letter state of ``pid`` from ``/proc/<pid>/stat`` (``"T"`` = stopped),
    or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()[:1]
    return fields[0].decode("ascii", "replace") if fields else None


def is_zombie(pid: int) -> bool:
    """Return True if ``pid`` has exited but is not reaped yet (or is gone)."""
    return process_state(pid) in (None, "Z", "X")


def child_pids(pid: int) -> List[int]:
    """Return the pids of the children of ``pid``'s main thread (empty if it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def pids_in_pid_namespace(ns: Tuple[int, int]) -> List[int]:
    """Return the host pids of every live process (zombies excluded) in pid namespace ``ns``."""
    found: List[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        if namespace_id(pid, "pid") == ns and not is_zombie(pid):
            found.append(pid)
    return found


_libc_cache: Dict[str, ctypes.CDLL] = {}


def _libc() -> ctypes.CDLL:
    lib = _libc_cache.get("c")
    if lib is None:
        lib = ctypes.CDLL(None, use_errno=True)
        _libc_cache["c"] = lib
    return lib


def pdeathsig_setter(sig: int, parent_pid: int) -> Callable[[], None]:
    """Return a function for ``preexec_fn`` that sets ``PR_SET_PDEATHSIG``.

    The ctypes function is looked up now, in the parent, so the child only makes the call.
    The returned function also exits the child if ``parent_pid`` already died (the signal
    would never come).

    Args:
        sig: the signal the child gets when the spawning thread dies.
        parent_pid: the pid of the spawning process.

    Returns:
        A callable that raises OSError if prctl fails.
    """
    prctl = _libc().prctl
    prctl.restype = ctypes.c_int

    def apply() -> None:
        if prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        if os.getppid() != parent_pid:
            os._exit(1)

    return apply


def run_tool(argv: Sequence[str], timeout: float) -> Tuple[int, str]:
    """Run a host tool without stdin or stdout, ``PATH`` = :data:`HOST_PATH`; bounded.

    Returns:
        Its exit status and its stderr (decoded, stripped).

    Raises:
        OSError: it could not be started.
        subprocess.TimeoutExpired: it ran longer than ``timeout`` seconds (it is killed).
    """
    done = subprocess.run(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=timeout,
        check=False,
        env={"PATH": HOST_PATH, "LANG": "C.UTF-8"},
    )
    return done.returncode, done.stderr.decode(errors="replace").strip()


def syncfs(path: str) -> None:
    """Write the pending changes of the filesystem holding ``path`` to its device (syncfs(2)).

    Raises:
        OSError: ``path`` cannot be opened or the call failed.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc().syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {path}: {os.strerror(err)}")
    finally:
        os.close(fd)
