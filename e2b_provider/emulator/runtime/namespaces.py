"""Namespaces of the emulator's sandboxes: what this host can isolate, ids, and rootless mode.

This module owns the isolation check run before any sandbox boots (:func:`check_isolation`:
``unshare`` with pid/mount/uts/ipc/net/cgroup namespaces, user namespaces, mounting and
overlayfs must work, or sandboxes are refused with one message saying what is missing), the
host directories overlaid into every sandbox's mount namespace (:data:`OVERLAY_DIRS` plus the
host's usr-merge layout), the ``PATH`` used for host tools, the host ids of root-mode
sandboxes (:func:`root_id_range`), and rootless mode.

Root mode (the server is root): every process of a sandbox but its PID 1 runs in a user
namespace mapping ids 0-65535 to an unprivileged host range (root's range in /etc/subuid and
/etc/subgid when it has one of 65536 ids, else :data:`ROOT_MODE_ID_START`): the sandbox's root
is not host root and reads only the host files everyone may read.

Rootless mode (the server is not root): ``unshare --user --map-root-user --map-auto`` adds a
user namespace in which root is the calling user and ids 1-65535 are its subuid/subgid range
(so ``sandbox`` 1000 and ``user`` 1001 are real, distinct ids; on the host they show as
``<subuid start> + 999`` and ``+ 1000``). Same contract as root mode, except: no cgroups
(freeze = SIGSTOP of every process, no CPU/memory limits), the sandbox's root cannot modify
host-owned files of ``/usr``, ``/etc``, ``/var``, ``/opt`` (their owner is not mapped), and
state dirs are deleted from a user namespace (:func:`remove_tree`), since files written inside
belong to subuids. Without root and without those prerequisites, sandboxes are refused, never
run unisolated.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

from . import linux
from .disk import disk_support
from .errors import IsolationUnavailable, SandboxRuntimeError

__all__ = [
    "HOST_PATH",
    "OVERLAY_DIRS",
    "ROOTLESS_IDS",
    "ROOT_MODE_ID_START",
    "check_isolation",
    "remove_tree",
    "rootless_message",
    "rootless_missing",
    "root_id_range",
    "sandbox_id_extents",
    "subid_range",
    "usr_merge_links",
]

log = logging.getLogger(__name__)

#: The ``PATH`` host tools (``unshare``, ``rm``, ``newuidmap``) are looked up in.
HOST_PATH = linux.HOST_PATH
#: Host directories every sandbox sees through an overlay of its own.
OVERLAY_DIRS = ("usr", "etc", "var", "opt")
_USR_MERGE_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

def usr_merge_links() -> Tuple[Dict[str, str], List[str]]:
    """Mirror the host's top-level /bin, /lib… : symlinks as symlinks, real dirs as overlays."""
    links: Dict[str, str] = {}
    dirs: List[str] = []
    for name in _USR_MERGE_LINKS:
        path = "/" + name
        if os.path.islink(path):
            links[name] = os.readlink(path)
        elif os.path.isdir(path):
            dirs.append(name)
    return links, dirs


_isolation_ok = False
SUBUID_FILE = "/etc/subuid"
SUBGID_FILE = "/etc/subgid"
ROOTLESS_IDS = 65536  # ids a rootless sandbox needs: 0 (the user itself) + 1..65535 (sub ids)
#: Host uid and gid of a root-mode sandbox's root when /etc/subuid and /etc/subgid give root no
#: range: the last 65536 ids below 2**31, above the usual system, user and SSSD ranges.
ROOT_MODE_ID_START = 2**31 - ROOTLESS_IDS
_ROOTLESS_NEEDS = (
    "the E2B emulator needs root, or unprivileged user namespaces with newuidmap/newgidmap "
    "(Debian package uidmap) and a subuid/subgid range of {ids} ids for user {user} in "
    "{subuid} and {subgid}"
)
# Run by the rootless probe as PID 1 of fresh user/pid/mount/... namespaces: the id maps must
# cover uid/gid 65535, and overlayfs (userxattr) of every overlaid host dir and /proc must mount.
_ROOTLESS_PROBE = r"""
set -e
t=$1; ids=$2; shift 2
for f in uid_map gid_map; do
  n=0
  while read -r inner outer count; do n=$((n + count)); done < /proc/self/$f
  if [ "$n" -lt "$ids" ]; then
    echo "only $n ids in /proc/self/$f of the user namespace (need $ids)" >&2; exit 1
  fi
done
for d in "$@"; do
  mkdir "$t/u$d" "$t/w$d" "$t/m$d"
  mount -t overlay overlay -o "lowerdir=/$d,upperdir=$t/u$d,workdir=$t/w$d,userxattr" "$t/m$d" \
    || { echo "overlayfs (userxattr) of /$d failed" >&2; exit 1; }
done
mkdir "$t/proc"
mount -t proc proc "$t/proc" || { echo "mounting /proc failed" >&2; exit 1; }
"""


def _probe(argv: Sequence[str]) -> Optional[str]:
    try:
        code, err = linux.run_tool(argv, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if code != 0:
        return " / ".join(err.splitlines()) or f"exit code {code}"
    return None


def subid_range(text: str, user: str, uid: int) -> Optional[Tuple[int, int]]:
    """Return the first ``(start, count)`` of ``user`` in a subuid/subgid file, or None.

    The first line naming the user (by name or by numeric id) counts, as for
    ``unshare --map-auto``; malformed lines and comments are skipped.

    Args:
        text: the content of ``/etc/subuid`` or ``/etc/subgid``.
        user: the user's name.
        uid: the user's numeric id.
    """
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) != 3 or fields[0] not in (user, str(uid)):
            continue
        try:
            start, count = int(fields[1]), int(fields[2])
        except ValueError:
            continue
        if start >= 0 and count >= 0:
            return start, count
    return None


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _rootless_overlays() -> List[str]:
    return list(OVERLAY_DIRS) + usr_merge_links()[1]


def rootless_missing() -> List[str]:
    """Return what this (non-root) user lacks for rootless sandboxes; empty if nothing.

    Checked: ``unshare``, ``newuidmap``/``newgidmap``, a first subuid and subgid range of at
    least 65536 ids for the user, that the kernel allows unprivileged user namespaces, and,
    when all of that is there, a probe run in the namespaces a sandbox gets (id maps covering
    65536 ids, overlayfs with ``userxattr`` of ``/usr``, ``/etc``, ``/var``, ``/opt``, ``/proc``).
    """
    uid = os.geteuid()
    user = _user_name(uid)
    missing: List[str] = []
    unshare = shutil.which("unshare", path=HOST_PATH)
    if unshare is None:
        missing.append("the unshare command (Debian package util-linux >= 2.38)")
    tools = [t for t in ("newuidmap", "newgidmap") if shutil.which(t, path=HOST_PATH) is None]
    if tools:
        missing.append(f"{' and '.join(tools)} (Debian package uidmap)")
    for kind, path in (("subuid", SUBUID_FILE), ("subgid", SUBGID_FILE)):
        text = _read_text(path)
        found = subid_range(text, user, uid) if text is not None else None
        line = f"{user}:<start>:{ROOTLESS_IDS}"
        if text is None:
            missing.append(f"{path} (unreadable or absent; add a line '{line}')")
        elif found is None:
            missing.append(f"a {kind} range for {user} in {path} (add '{line}')")
        elif found[1] < ROOTLESS_IDS:
            missing.append(
                f"a big enough {kind} range: the first one for {user} in {path} has "
                f"{found[1]} ids, need {ROOTLESS_IDS}"
            )
    if unshare is not None:
        err = _probe([unshare, "--user", "--map-root-user", "/bin/true"])
        if err is not None:
            missing.append(
                "unprivileged user namespaces: the kernel refused 'unshare --user "
                f"--map-root-user' ({err}); see sysctls user.max_user_namespaces, "
                "kernel.unprivileged_userns_clone, kernel.apparmor_restrict_unprivileged_userns"
            )
    if unshare is not None and not missing:
        with tempfile.TemporaryDirectory(prefix="e2b-emu-probe-") as tmp:
            err = _probe(
                [unshare, "--user", "--map-root-user", "--map-auto", "--pid", "--fork",
                 "--mount", "--uts", "--ipc", "--net", "--cgroup", "--propagation", "private",
                 "--kill-child", "--", "/bin/sh", "-c", _ROOTLESS_PROBE, "probe", tmp,
                 str(ROOTLESS_IDS), *_rootless_overlays()]
            )  # fmt: skip
        if err is not None:
            missing.append(f"a working rootless sandbox setup (probe failed: {err})")
    return missing


def rootless_message(missing: Sequence[str]) -> str:
    """Return the one-message refusal for a non-root user lacking ``missing``."""
    uid = os.geteuid()
    needs = _ROOTLESS_NEEDS.format(
        ids=ROOTLESS_IDS, user=_user_name(uid), subuid=SUBUID_FILE, subgid=SUBGID_FILE
    )
    return f"{needs}; running as uid {uid}, missing: " + "; ".join(missing)


def root_id_range() -> Tuple[int, int]:
    """Return the host ``(uid, gid)`` of root-mode sandboxes' root; ids 1-65535 follow.

    Root's own first range in /etc/subuid and /etc/subgid when it holds 65536 ids (for hosts
    that reserve one, e.g. for containers), else :data:`ROOT_MODE_ID_START` for both.
    """
    found = []
    for path in (SUBUID_FILE, SUBGID_FILE):
        text = _read_text(path)
        entry = subid_range(text, "root", 0) if text is not None else None
        found.append(entry[0] if entry is not None and entry[1] >= ROOTLESS_IDS else None)
    if found[0] is not None and found[1] is not None:
        return found[0], found[1]
    return ROOT_MODE_ID_START, ROOT_MODE_ID_START


Extent = Tuple[int, int, int]


def sandbox_id_extents() -> Tuple[Tuple[Extent, ...], Tuple[Extent, ...]]:
    """How the uids and the gids sandboxes see map to host ids, for this process's mode:
    ``(inside, host, count)`` extents as in ``/proc/<pid>/uid_map``.

    Root mode: ids 0-65535 from :func:`root_id_range`. Rootless: 0 is this user (and its
    group), 1-65535 its first subuid/subgid range (``unshare --map-auto``); an id it lacks is
    left unmapped.
    """
    uid = os.geteuid()
    if uid == 0:
        base_uid, base_gid = root_id_range()
        return ((0, base_uid, ROOTLESS_IDS),), ((0, base_gid, ROOTLESS_IDS),)
    user = _user_name(uid)
    out: List[Tuple[Extent, ...]] = []
    for own, path in ((uid, SUBUID_FILE), (os.getegid(), SUBGID_FILE)):
        text = _read_text(path)
        found = subid_range(text, user, uid) if text is not None else None
        extents: List[Extent] = [(0, own, 1)]
        if found is not None and found[1] > 0:
            extents.append((1, found[0], min(found[1], ROOTLESS_IDS - 1)))
        out.append(tuple(extents))
    return out[0], out[1]


def _user_namespaces_missing() -> Optional[str]:
    if not os.path.exists("/proc/self/ns/user"):
        return "user namespaces (kernel option CONFIG_USER_NS)"
    limit = _read_text("/proc/sys/user/max_user_namespaces")
    if limit is not None and limit.strip() == "0":
        return "user namespaces (sysctl user.max_user_namespaces is 0)"
    return None


def check_isolation() -> None:
    """Check that this host can run isolated sandboxes, without booting one.

    As root: ``unshare`` with pid/mount/uts/ipc/net namespaces, user namespaces, mounting, and
    overlayfs must work (checked with two tiny probes, some milliseconds). A missing cgroup
    hierarchy or disk support is only logged: pause then falls back to SIGSTOP, limits that
    cannot be enforced are named in each sandbox's log line.

    Not root: rootless mode (see :func:`rootless_missing`). Sandboxes then run in a user
    namespace mapping root to the calling user and ids 1-65535 to the user's subuid/subgid
    range; there are no cgroups (pause = SIGSTOP of every process, no CPU/memory limits).
    Sandboxes never run without isolation.

    The first success is cached for the process.

    Raises:
        IsolationUnavailable: with one message listing everything that is missing.
    """
    global _isolation_ok
    if _isolation_ok:
        return
    missing: List[str] = []
    if not sys.platform.startswith("linux"):
        raise IsolationUnavailable(
            "the E2B emulator needs Linux (namespaces, overlayfs, cgroups); "
            f"this is {sys.platform}: run it in a Linux VM or a privileged container"
        )
    if os.geteuid() != 0:
        missing = rootless_missing()
        if missing:
            raise IsolationUnavailable(rootless_message(missing))
        log.warning(
            "rootless mode (uid %d): sandboxes run in user namespaces without cgroups; "
            "pause uses SIGSTOP, no CPU/memory/process limits, disks are not bounded, "
            "system dirs are read-only for root",
            os.geteuid(),
        )
        _isolation_ok = True
        return
    unshare = shutil.which("unshare", path=HOST_PATH)
    if unshare is None:
        missing.append("the unshare command (Debian package util-linux)")
    if not linux.cap_effective() >> linux.CAP_SYS_ADMIN & 1:
        missing.append("CAP_SYS_ADMIN (run as real root or in a --privileged container)")
    for kind in ("pid", "mnt", "uts", "ipc", "net", "cgroup"):
        if not os.path.exists(f"/proc/self/ns/{kind}"):
            missing.append(f"{kind} namespaces (kernel option)")
    userns = _user_namespaces_missing()
    if userns is not None:
        missing.append(userns)
    try:
        with open("/proc/filesystems", encoding="ascii") as f:
            if "overlay" not in f.read().split():
                missing.append("overlayfs (modprobe overlay)")
    except OSError:
        missing.append("/proc/filesystems (is /proc mounted?)")
    if unshare is not None and not missing:
        err = _probe(
            [unshare, "--pid", "--fork", "--mount", "--uts", "--ipc", "--net", "--cgroup",
             "--propagation", "private", "--kill-child", "--", "/bin/true"]
        )
        if err is not None:
            missing.append(f"namespaces via unshare ({err})")
        else:
            with tempfile.TemporaryDirectory(prefix="e2b-emu-probe-") as tmp:
                for d in ("l", "u", "w", "m"):
                    os.mkdir(os.path.join(tmp, d))
                opts = f"lowerdir={tmp}/l,upperdir={tmp}/u,workdir={tmp}/w"
                err = _probe(
                    [unshare, "--mount", "--propagation", "private", "--",
                     "mount", "-t", "overlay", "overlay", "-o", opts, f"{tmp}/m"]
                )
                if err is not None:
                    missing.append(f"an overlayfs mount ({err})")
    if missing:
        raise IsolationUnavailable(
            "the E2B emulator cannot isolate sandboxes on this host; missing: " + "; ".join(missing)
        )
    if linux.cgroup2_mount() is None and linux.cgroup1_mount("freezer") is None:
        log.warning("no cgroup2 or v1 freezer hierarchy: pause falls back to SIGSTOP, no limits")
    no_disk = disk_support()
    if no_disk is not None:
        log.warning("sandbox disks are not bounded (disk_mb is not enforced): %s", no_disk)
    _isolation_ok = True


def remove_tree(path: str) -> None:
    """Delete a tree that may hold sandboxes' files (a state dir), blocking, bounded to 60 s.

    As root this is :func:`shutil.rmtree`. Rootless, files written inside a sandbox belong to
    the user's subuids, which the user cannot delete directly: the tree is removed from a user
    namespace with the same id mapping as the sandboxes (``unshare --user --map-root-user
    --map-auto rm -rf``). Call it only when no sandbox runs on the tree.

    Raises:
        SandboxRuntimeError: the tree could not be removed (the message says why).
    """
    if not os.path.lexists(path):
        return
    if os.geteuid() == 0:
        shutil.rmtree(path)
        return
    unshare = shutil.which("unshare", path=HOST_PATH)
    rm = shutil.which("rm", path=HOST_PATH)
    if unshare is None or rm is None:
        raise SandboxRuntimeError(f"cannot remove {path}: unshare or rm is missing")
    try:
        code, err = linux.run_tool(
            [unshare, "--user", "--map-root-user", "--map-auto", "--",
             rm, "-rf", "--one-file-system", "--", os.path.abspath(path)],
            timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxRuntimeError(f"cannot remove {path}: {exc}") from exc
    if code != 0 or os.path.lexists(path):
        raise SandboxRuntimeError(f"cannot remove {path}: {err or code}")
