"""Sandbox runtime of the local E2B emulator: boot, freeze, halt and destroy one sandbox.

This module owns the host side of a sandbox's life: its state directory, its cgroups, and the
``unshare`` process whose child (:mod:`.init`, PID 1 of fresh pid/mount/uts/ipc/net
namespaces) builds the sandbox's root filesystem and runs the envd agent on a unix socket.

Layout of a sandbox's ``state_dir`` (all of it stays on the host, none of it is visible inside)::

    root/          the sandbox's own root directory (persistent: /workspace, /home, /root, /tmp…)
    upper/<d>      overlayfs upper dirs of /usr, /etc, /var, /opt (the sandbox's changes)
    work/<d>       overlayfs work dirs
    e2b/           bound at /run/e2b inside (0700 root): envd.sock, sandbox.json
    boot.json      the configuration read by init.py
    init.log       PID 1's and the agent's stdout/stderr (truncated at each boot)

Cgroups: ``<cgroup2>/e2b-emulator-<server pid>/<sandbox id>`` (freeze/kill through
``cgroup.freeze`` / ``cgroup.kill``), else the v1 freezer, else SIGSTOP/SIGKILL of every pid.
Memory and CPU limits are applied where a controller is available (best effort).

Rootless mode (the server is not root; see :func:`check_isolation`): ``unshare --user
--map-root-user --map-auto`` adds a user namespace in which root is the calling user and ids
1-65535 are its subuid/subgid range (so ``sandbox`` 1000 and ``user`` 1001 are real, distinct
ids; on the host they show as ``<subuid start> + 999`` and ``+ 1000``). Same contract as root
mode, except: no cgroups (freeze = SIGSTOP of every process, no CPU/memory limits), the
sandbox's root cannot modify host-owned files of ``/usr``, ``/etc``, ``/var``, ``/opt`` (their
owner is not mapped), and state dirs are deleted from a user namespace
(:func:`remove_tree`), since files written inside belong to subuids. Without root and
without those prerequisites, sandboxes are refused, never run unisolated.

Every coroutine method must run on the server's event-loop thread: ``unshare`` is spawned with
``PR_SET_PDEATHSIG=SIGKILL``, which fires when the *spawning thread* dies, and ``unshare
--kill-child`` passes the death on to the sandbox's PID 1, so sandboxes never outlive the
server. Waits are bounded and use ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import errno
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import attrs

from . import _linux

__all__ = [
    "IsolationUnavailable",
    "SandboxRuntime",
    "SandboxRuntimeError",
    "SandboxSpec",
    "check_isolation",
    "default_agent_argv",
    "python_bind_paths",
    "remove_stale_cgroups",
    "remove_tree",
    "rootless_message",
    "rootless_missing",
    "subid_range",
]

log = logging.getLogger(__name__)

AGENT_SOCKET = "/run/e2b/envd.sock"
OVERLAY_DIRS = ("usr", "etc", "var", "opt")
_USR_MERGE_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_EGRESS = ("none", "allowlist", "open")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_SUN_PATH_MAX = 107
_INIT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "init.py")
_HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_WAIT_LIMIT = 10.0  # bound on freeze/thaw/halt waits, seconds


class SandboxRuntimeError(RuntimeError):
    """A sandbox could not be booted, frozen, thawed, halted or destroyed."""


class IsolationUnavailable(SandboxRuntimeError):
    """This host cannot isolate sandboxes; the message says what is missing and how to fix it."""


def _env_vars(value: Mapping[str, str]) -> Mapping[str, str]:
    return types.MappingProxyType(dict(value))


def _hosts(value: Sequence[str]) -> Tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError("allow_hosts must be a sequence of host names, not a string")
    return tuple(value)


def _check_id(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _ID_RE.match(value):
        raise ValueError(f"{attribute.name} must match {_ID_RE.pattern}: {value!r}")


def _check_hostname(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _HOSTNAME_RE.match(value):
        raise ValueError(f"{attribute.name} is not a valid host name: {value!r}")


def _check_env(
    _: object, attribute: attrs.Attribute[Mapping[str, str]], value: Mapping[str, str]
) -> None:
    for key, val in value.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"bad environment variable name {key!r}")
        if not isinstance(val, str) or "\0" in val:
            raise ValueError(f"bad value for environment variable {key!r}")


@attrs.frozen
class SandboxSpec:
    """What one sandbox is: identity, network mode, environment and resource limits.

    Attributes:
        sandbox_id: letters, digits, ``_`` and ``-`` (1 to 64 characters); names cgroups and logs.
        hostname: the sandbox's host name (an RFC 1123 label).
        egress: ``"none"``, ``"allowlist"`` or ``"open"``. Recorded only: every sandbox gets a
            network namespace with loopback alone, so there is no outside network in the
            emulator whatever the mode (fail closed).
        allow_hosts: the allowlist, recorded for the server.
        env_vars: the sandbox's environment variables (given to the agent, see
            :class:`SandboxRuntime`); kept out of ``repr``, they may hold secrets.
        cpu_count: CPUs (a CFS quota where a cpu controller is available).
        memory_mb: memory limit in MiB where a memory controller is available.
    """

    sandbox_id: str = attrs.field(validator=_check_id)
    hostname: str = attrs.field(validator=_check_hostname)
    egress: str = attrs.field(default="none", validator=attrs.validators.in_(_EGRESS))
    allow_hosts: Tuple[str, ...] = attrs.field(default=(), converter=_hosts)
    env_vars: Mapping[str, str] = attrs.field(
        factory=dict, converter=_env_vars, validator=_check_env, hash=False, repr=False
    )
    cpu_count: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    memory_mb: int = attrs.field(default=512, validator=attrs.validators.ge(16))


# --- isolation check ------------------------------------------------------------------------

_isolation_ok = False
SUBUID_FILE = "/etc/subuid"
SUBGID_FILE = "/etc/subgid"
ROOTLESS_IDS = 65536  # ids a rootless sandbox needs: 0 (the user itself) + 1..65535 (sub ids)
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
        done = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()
        return " / ".join(err.splitlines()) or f"exit code {done.returncode}"
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
    return list(OVERLAY_DIRS) + _usr_merge_links()[1]


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
    unshare = shutil.which("unshare", path=_HOST_PATH)
    if unshare is None:
        missing.append("the unshare command (Debian package util-linux >= 2.38)")
    tools = [t for t in ("newuidmap", "newgidmap") if shutil.which(t, path=_HOST_PATH) is None]
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


def check_isolation() -> None:
    """Check that this host can run isolated sandboxes, without booting one.

    As root: ``unshare`` with pid/mount/uts/ipc/net namespaces, mounting, and overlayfs must
    work (checked with two tiny probes, some milliseconds). A missing cgroup hierarchy is only
    logged: pause then falls back to SIGSTOP.

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
            "pause uses SIGSTOP, no CPU/memory limits, system dirs are read-only for root",
            os.geteuid(),
        )
        _isolation_ok = True
        return
    unshare = shutil.which("unshare", path=_HOST_PATH)
    if unshare is None:
        missing.append("the unshare command (Debian package util-linux)")
    if not _linux.cap_effective() >> _linux.CAP_SYS_ADMIN & 1:
        missing.append("CAP_SYS_ADMIN (run as real root or in a --privileged container)")
    for kind in ("pid", "mnt", "uts", "ipc", "net", "cgroup"):
        if not os.path.exists(f"/proc/self/ns/{kind}"):
            missing.append(f"{kind} namespaces (kernel option)")
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
    if _linux.cgroup2_mount() is None and _linux.cgroup1_mount("freezer") is None:
        log.warning("no cgroup2 or v1 freezer hierarchy: pause falls back to SIGSTOP, no limits")
    _isolation_ok = True


# --- cgroups ------------------------------------------------------------------------------

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
    v2 = _linux.cgroup2_mount()
    if v2 is not None:
        dirs.append(v2)
    for ctrl in ("freezer", "memory", "cpu"):
        mount = _linux.cgroup1_mount(ctrl)
        if mount is not None:
            path = mount + _linux.own_cgroup_path(ctrl).rstrip("/")
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
class _Cgroups:
    """The cgroup directories of one sandbox (freezer/killer and limit holders)."""

    sandbox_id: str
    mode: str = "none"  # "v2" | "v1" | "none"
    control: Optional[str] = None  # dir with cgroup.freeze (v2) or freezer.state (v1)
    extra: List[str] = attrs.field(factory=list)  # v1 limit cgroups (memory, cpu)

    def create(self, cpu_count: int, memory_mb: int) -> None:
        v2 = _linux.cgroup2_mount()
        self.extra = []
        if v2 is not None:
            parent = _parent_dir(v2)
            path = os.path.join(parent, self.sandbox_id)
            os.makedirs(path, exist_ok=True)
            if os.path.exists(os.path.join(path, "cgroup.freeze")):
                self.mode, self.control = "v2", path
                self._v2_limits(parent, path, cpu_count, memory_mb)
                self._v1_limits(cpu_count, memory_mb, skip_v2=True)
                return
            _rmdir_quiet(path)
        freezer = _linux.cgroup1_mount("freezer")
        if freezer is not None:
            base = freezer + _linux.own_cgroup_path("freezer").rstrip("/")
            path = os.path.join(_parent_dir(base), self.sandbox_id)
            os.makedirs(path, exist_ok=True)
            self.mode, self.control = "v1", path
        else:
            self.mode, self.control = "none", None
        self._v1_limits(cpu_count, memory_mb, skip_v2=False)

    def _v2_limits(self, parent: str, path: str, cpu_count: int, memory_mb: int) -> None:
        try:
            available = _read(os.path.join(parent, "cgroup.controllers")).split()
            wanted = [c for c in ("memory", "cpu") if c in available]
            if wanted:
                _write(
                    os.path.join(parent, "cgroup.subtree_control"),
                    " ".join("+" + c for c in wanted),
                )
            if "memory" in wanted:
                _write(os.path.join(path, "memory.max"), str(memory_mb * 1024 * 1024))
            if "cpu" in wanted:
                _write(os.path.join(path, "cpu.max"), f"{cpu_count * 100000} 100000")
        except OSError as exc:
            log.info("cgroup2 limits not applied for %s: %s", self.sandbox_id, exc)

    def _v1_limits(self, cpu_count: int, memory_mb: int, skip_v2: bool) -> None:
        v2 = self.control if self.mode == "v2" else None
        for ctrl, files in (
            ("memory", {"memory.limit_in_bytes": str(memory_mb * 1024 * 1024)}),
            ("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(cpu_count * 100000)}),
        ):
            if skip_v2 and v2 is not None and os.path.exists(os.path.join(v2, f"{ctrl}.max")):
                continue
            mount = _linux.cgroup1_mount(ctrl)
            if mount is None:
                continue
            try:
                base = mount + _linux.own_cgroup_path(ctrl).rstrip("/")
                path = os.path.join(_parent_dir(base), self.sandbox_id)
                os.makedirs(path, exist_ok=True)
                self.extra.append(path)
                for name, value in files.items():
                    _write(os.path.join(path, name), value)
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


# --- the runtime ---------------------------------------------------------------------------


def _package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_agent_argv() -> List[str]:
    """Return the command line of the real envd agent, as run inside a sandbox."""
    return [
        sys.executable, "-E", "-s", "-m", "e2b_provider.emulator.agent",
        "--socket", AGENT_SOCKET, "--default-user", "user",
    ]


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def python_bind_paths() -> List[str]:
    """Return the host directories bound read-only into every sandbox, at the same paths.

    They are what ``sys.executable -m e2b_provider.emulator.agent`` needs: the interpreter's
    prefixes, the ``e2b_provider`` package and the directory holding ``aiohttp``. Paths under
    the overlaid ``/usr``, ``/etc``, ``/var`` and ``/opt`` are visible anyway and left out.
    """
    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        _package_dir(),
    ]
    spec = importlib.util.find_spec("aiohttp")
    if spec is not None and spec.origin:
        candidates.append(os.path.dirname(os.path.dirname(spec.origin)))
    paths = sorted({os.path.realpath(p) for p in candidates if p})
    kept: List[str] = []
    for path in paths:
        if path == "/" or any(_under(path, "/" + d) for d in OVERLAY_DIRS):
            continue
        if any(_under(path, k) for k in kept):
            continue
        kept.append(path)
    return kept


def _usr_merge_links() -> Tuple[Dict[str, str], List[str]]:
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
    unshare = shutil.which("unshare", path=_HOST_PATH)
    rm = shutil.which("rm", path=_HOST_PATH)
    if unshare is None or rm is None:
        raise SandboxRuntimeError(f"cannot remove {path}: unshare or rm is missing")
    try:
        done = subprocess.run(
            [unshare, "--user", "--map-root-user", "--map-auto", "--",
             rm, "-rf", "--one-file-system", "--", os.path.abspath(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
            env={"PATH": _HOST_PATH, "LANG": "C.UTF-8"},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxRuntimeError(f"cannot remove {path}: {exc}") from exc
    if done.returncode != 0 or os.path.lexists(path):
        err = done.stderr.decode(errors="replace").strip()
        raise SandboxRuntimeError(f"cannot remove {path}: {err or done.returncode}")


class SandboxRuntime:
    """One sandbox's namespaces, filesystem and processes, driven from the event-loop thread.

    As root, or rootless in a user namespace when the process is not root (:attr:`rootless`,
    see the module docstring for what differs).

    The agent runs as root inside the sandbox with ``cwd`` = the directory holding the
    ``e2b_provider`` package and an environment of ``PATH``, ``LANG``, ``HOME``, ``USER``,
    ``LOGNAME``, ``E2B_SANDBOX=true``, ``E2B_SANDBOX_ID`` plus ``spec.env_vars``; the spec is
    also written to ``/run/e2b/sandbox.json`` (``sandbox_id``, ``hostname``, ``egress``,
    ``allow_hosts``, ``env_vars``).

    Args:
        spec: what the sandbox is.
        state_dir: this sandbox's own directory (created if missing; must not be inside a
            directory bound into sandboxes).
        agent_argv: the agent's command line inside the sandbox (``argv[0]`` absolute); default
            :func:`default_agent_argv`. Tests pass a stand-in.

    Attributes:
        envd_socket: host path of the agent's unix socket (exists once :meth:`boot` returned).
        last_boot_seconds: wall time of the last successful :meth:`boot`.
    """

    def __init__(
        self, spec: SandboxSpec, state_dir: str, agent_argv: Optional[Sequence[str]] = None
    ) -> None:
        state_dir = os.path.abspath(state_dir)
        if len([p for p in os.path.realpath(state_dir).split("/") if p]) < 2:
            raise ValueError(f"state_dir must be a dedicated directory, not {state_dir!r}")
        if any(c in state_dir for c in ",:\\\n"):
            raise ValueError("state_dir must not contain ',', ':', '\\' or newlines (overlayfs)")
        self.spec = spec
        self.state_dir = state_dir
        self.envd_socket = os.path.join(state_dir, "e2b", "envd.sock")
        if len(self.envd_socket.encode()) > _SUN_PATH_MAX:
            raise ValueError(f"state_dir too long for a unix socket path: {self.envd_socket!r}")
        argv = list(agent_argv) if agent_argv is not None else default_agent_argv()
        if not argv or not os.path.isabs(argv[0]):
            raise ValueError("agent_argv[0] must be an absolute path")
        self._agent_argv = argv
        self._agent_cwd = os.path.dirname(_package_dir()) if agent_argv is None else "/"
        self._cgroups = _Cgroups(spec.sandbox_id)
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._init_pid: Optional[int] = None
        self._pid_ns: Optional[Tuple[int, int]] = None
        self._frozen = False
        self._lock: Optional[Tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = None
        self._rootless = os.geteuid() != 0
        self.last_boot_seconds: Optional[float] = None

    def __repr__(self) -> str:
        return (
            f"SandboxRuntime(id={self.spec.sandbox_id!r}, running={self.running}, "
            f"frozen={self.frozen}, state_dir={self.state_dir!r})"
        )

    @property
    def running(self) -> bool:
        """True from a successful boot until halt/destroy, or until PID 1 died by itself."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def frozen(self) -> bool:
        """True while the sandbox is frozen (its processes keep their memory)."""
        return self._frozen and self.running

    @property
    def rootless(self) -> bool:
        """True if the sandbox runs in a user namespace (the runtime is not root).

        Set at construction and at each :meth:`boot` from the effective uid.
        """
        return self._rootless

    @property
    def freeze_method(self) -> str:
        """How :meth:`freeze` works for the current boot.

        ``"cgroup2"`` (``cgroup.freeze``), ``"cgroup1-freezer"`` (``freezer.state``) or
        ``"sigstop"``: SIGSTOP to every process of the sandbox, SIGCONT on thaw (rootless mode,
        or no cgroup hierarchy). SIGSTOP is visible to the sandbox's processes (a parent may
        see its child stop, job-control shells print "Stopped"), unlike the cgroup freezer.
        """
        if self._cgroups.control is None:
            return "sigstop"
        return "cgroup2" if self._cgroups.mode == "v2" else "cgroup1-freezer"

    @property
    def init_pid(self) -> Optional[int]:
        """Host pid of the sandbox's PID 1 while it runs (for nsenter in tests)."""
        return self._init_pid if self.running else None

    def host_pids(self) -> List[int]:
        """Return the host pids of every process of the sandbox (``unshare`` included)."""
        pids = {p for p in self._cgroups.pids() if not _linux.is_zombie(p)}
        if self._pid_ns is not None and self._pid_ns != _linux.namespace_id(os.getpid(), "pid"):
            pids.update(_linux.pids_in_pid_namespace(self._pid_ns))
        if self._proc is not None and self._proc.poll() is None:
            pids.add(self._proc.pid)
        return sorted(pids)

    def _guard(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    # -- boot --

    def _prepare(self) -> str:
        """Create the state dir's skeleton and boot.json; return the boot.json path."""
        sd = self.state_dir
        for bind in python_bind_paths():
            if _under(os.path.realpath(sd), bind):
                raise SandboxRuntimeError(
                    f"state_dir {sd} is inside {bind}, which every sandbox sees read-only"
                )
        os.makedirs(sd, mode=0o700, exist_ok=True)
        os.chmod(sd, 0o700)
        for sub in ("root", "upper", "work"):
            os.makedirs(os.path.join(sd, sub), mode=0o755, exist_ok=True)
        os.chmod(os.path.join(sd, "root"), 0o755)
        e2b = os.path.join(sd, "e2b")
        os.makedirs(e2b, mode=0o700, exist_ok=True)
        os.chmod(e2b, 0o700)
        try:
            os.unlink(self.envd_socket)
        except FileNotFoundError:
            pass
        spec = self.spec
        info = {
            "sandbox_id": spec.sandbox_id,
            "hostname": spec.hostname,
            "egress": spec.egress,
            "allow_hosts": list(spec.allow_hosts),
            "env_vars": dict(spec.env_vars),
        }
        self._write_private(os.path.join(e2b, "sandbox.json"), info)
        links, real_dirs = _usr_merge_links()
        env = {
            "PATH": _HOST_PATH,
            "LANG": "C.UTF-8",
            "HOME": "/root",
            "USER": "root",
            "LOGNAME": "root",
            "E2B_SANDBOX": "true",
            "E2B_SANDBOX_ID": spec.sandbox_id,
        }
        env.update(spec.env_vars)
        cfg = {
            "sandbox_id": spec.sandbox_id,
            "hostname": spec.hostname,
            "root": os.path.join(sd, "root"),
            "upper": os.path.join(sd, "upper"),
            "work": os.path.join(sd, "work"),
            "e2b_dir": e2b,
            "overlays": list(OVERLAY_DIRS) + real_dirs,
            "symlinks": links,
            "ro_binds": python_bind_paths(),
            "agent_argv": self._agent_argv,
            "agent_env": env,
            "agent_cwd": self._agent_cwd,
            "rootless": self._rootless,
        }
        path = os.path.join(sd, "boot.json")
        self._write_private(path, cfg)
        return path

    @staticmethod
    def _write_private(path: str, obj: object) -> None:
        fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f)
        os.replace(path + ".new", path)

    def _spawn(self, boot_json: str) -> None:
        unshare = shutil.which("unshare", path=_HOST_PATH)
        if unshare is None:
            raise IsolationUnavailable("the unshare command is missing (package util-linux)")
        # Rootless: a user namespace mapping root to this user and 1-65535 to its subuid and
        # subgid ranges (newuidmap/newgidmap, --map-auto), so that sandbox users are real ids.
        userns = ["--user", "--map-root-user", "--map-auto"] if self._rootless else []
        argv = [
            unshare, *userns, "--pid", "--fork", "--mount", "--uts", "--ipc", "--net",
            "--cgroup", "--propagation", "private", "--kill-child", "--",
            sys.executable, "-E", "-s", "-S", _INIT_PATH, boot_json,
        ]  # fmt: skip
        if self._rootless:
            # No cgroups: an unprivileged user cannot create them (freeze = SIGSTOP, no limits).
            self._cgroups.mode, self._cgroups.control, self._cgroups.extra = "none", None, []
        else:
            self._cgroups.create(self.spec.cpu_count, self.spec.memory_mb)
        required, optional = self._cgroups.procs_fds()
        set_pdeathsig = _linux.pdeathsig_setter(signal.SIGKILL, os.getpid())

        def preexec() -> None:
            # Runs in the forked child before exec: die with the spawning thread, and join the
            # sandbox's cgroups so that every descendant is born inside them.
            set_pdeathsig()
            for fd in required:
                os.write(fd, b"0")
            for fd in optional:
                try:
                    os.write(fd, b"0")
                except OSError:
                    pass

        log_path = os.path.join(self.state_dir, "init.log")
        try:
            with open(log_path, "wb") as log_file:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=preexec,  # must run in the spawning (event-loop) thread
                    env={"PATH": _HOST_PATH, "LANG": "C.UTF-8"},
                    close_fds=True,
                )
        finally:
            for fd in required + optional:
                os.close(fd)

    def _find_init(self) -> Optional[int]:
        assert self._proc is not None
        pid = self._proc.pid
        try:
            children = _read(f"/proc/{pid}/task/{pid}/children").split()
        except OSError:
            children = []
        # Rootless, unshare first forks a helper (newuidmap/newgidmap) that stays in our pid
        # namespace: PID 1 is the child living in a pid namespace of its own.
        own = _linux.namespace_id(os.getpid(), "pid")
        for child in children:
            ns = _linux.namespace_id(int(child), "pid")
            if ns is not None and ns != own:
                return int(child)
        return None

    def log_tail(self, limit: int = 4000) -> str:
        """Return the end of ``init.log`` (PID 1's and the agent's output)."""
        try:
            with open(os.path.join(self.state_dir, "init.log"), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    async def _healthy(self, timeout: float) -> bool:
        writer = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.envd_socket), timeout
            )
            writer.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            line = await asyncio.wait_for(reader.readline(), timeout)
            parts = line.split()
            return len(parts) >= 2 and parts[1][:1] == b"2"
        except (OSError, asyncio.TimeoutError, ValueError):
            return False
        finally:
            if writer is not None:
                writer.close()

    async def boot(self, timeout: float = 30.0) -> None:
        """Cold-boot the sandbox (keeping the files of earlier boots) and wait for its agent.

        Returns when the agent answers ``GET /health`` on :attr:`envd_socket`.

        Args:
            timeout: seconds to wait for the agent.

        Raises:
            IsolationUnavailable: the host cannot isolate sandboxes.
            SandboxRuntimeError: already running, PID 1 failed, or no healthy agent in time
                (the sandbox is halted again; the message ends with its log).
        """
        async with self._guard():
            if self.running:
                raise SandboxRuntimeError(f"sandbox {self.spec.sandbox_id} is already running")
            check_isolation()
            await self._halt_locked()  # leftovers of a PID 1 that died by itself
            self._rootless = os.geteuid() != 0
            t0 = time.monotonic()
            deadline = t0 + timeout
            try:
                self._spawn(self._prepare())
                await self._wait_ready(deadline)
            except BaseException:
                await self._halt_locked()
                raise
            self.last_boot_seconds = time.monotonic() - t0
            log.info("sandbox %s booted in %.3f s", self.spec.sandbox_id, self.last_boot_seconds)

    async def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        delay = 0.002
        while True:
            if self._init_pid is None:
                self._init_pid = self._find_init()
                if self._init_pid is not None:
                    self._pid_ns = _linux.namespace_id(self._init_pid, "pid")
            if self._proc.poll() is not None:
                raise SandboxRuntimeError(
                    f"sandbox {self.spec.sandbox_id} failed to boot "
                    f"(PID 1 exited with {self._proc.returncode}):\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if self._init_pid is not None and os.path.exists(self.envd_socket):
                if await self._healthy(min(1.0, max(0.05, remaining))):
                    return
            if time.monotonic() >= deadline:
                raise SandboxRuntimeError(
                    f"sandbox {self.spec.sandbox_id}: agent not healthy in time:\n{self.log_tail()}"
                )
            await asyncio.sleep(delay)
            delay = min(0.02, delay * 1.5)

    # -- freeze / thaw --

    async def _poll(
        self, predicate: Callable[[], bool], what: str, limit: float = _WAIT_LIMIT
    ) -> None:
        deadline = time.monotonic() + limit
        delay = 0.001
        while not predicate():
            if time.monotonic() >= deadline:
                raise SandboxRuntimeError(
                    f"sandbox {self.spec.sandbox_id}: {what} not done within {limit:.0f} s"
                )
            await asyncio.sleep(delay)
            delay = min(0.05, delay * 2)

    def _signal_all(self, sig: int) -> None:
        for pid in self.host_pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    async def freeze(self) -> None:
        """Freeze every process of the sandbox, keeping its memory (pause with memory).

        Uses the cgroup freezer, or, rootless or without cgroups, SIGSTOP to every process
        (repeated for children forked meanwhile) until all are stopped; see
        :attr:`freeze_method`.

        Raises:
            SandboxRuntimeError: not running, or the freezer did not settle within 10 s.
        """
        async with self._guard():
            if not self.running:
                raise SandboxRuntimeError(f"sandbox {self.spec.sandbox_id} is not running")
            if self._frozen:
                return
            cg = self._cgroups
            if cg.control is not None:
                cg.set_frozen(True)
                self._frozen = True
                await self._poll(lambda: cg.is_frozen(True), "freeze")
            else:
                self._frozen = True
                await self._stop_all()

    def _all_stopped(self, signalled: Set[int]) -> bool:
        """SIGSTOP the processes not signalled yet; True once every process is stopped."""
        settled = True
        for pid in self.host_pids():
            if pid not in signalled:
                signalled.add(pid)
                settled = False
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            elif _linux.process_state(pid) not in ("T", "t", "Z", "X", None):
                settled = False
        return settled

    async def _stop_all(self) -> None:
        # SIGSTOP every process, again for any child forked meanwhile, until all are stopped.
        # If that does not settle, everything is continued: a failed freeze leaves it running.
        signalled: Set[int] = set()
        try:
            await self._poll(lambda: self._all_stopped(signalled), "freeze (SIGSTOP)")
        except BaseException:
            self._signal_all(signal.SIGCONT)
            self._frozen = False
            raise

    async def thaw(self) -> None:
        """Resume a frozen sandbox (no-op if it is not frozen).

        Raises:
            SandboxRuntimeError: the freezer did not settle within 10 s.
        """
        async with self._guard():
            if not self._frozen:
                return
            await self._thaw_locked()

    async def _thaw_locked(self) -> None:
        cg = self._cgroups
        if cg.control is not None:
            cg.set_frozen(False)
            await self._poll(lambda: cg.is_frozen(False), "thaw")
        else:
            self._signal_all(signal.SIGCONT)
        self._frozen = False

    # -- halt / destroy --

    async def halt(self) -> None:
        """Kill every process of the sandbox and wait until none is left; keep its files.

        A later :meth:`boot` reboots the sandbox on the same files. No-op if nothing runs.

        Raises:
            SandboxRuntimeError: some process survived 10 s.
        """
        async with self._guard():
            await self._halt_locked()

    async def _halt_locked(self) -> None:
        proc = self._proc
        if proc is None and not self.host_pids():
            self._reset()
            return

        def gone() -> bool:
            if proc is not None and proc.poll() is None:
                return False
            return not self.host_pids()

        # SIGKILL to PID 1 takes its whole pid namespace down, and leaves ``unshare`` alive to
        # reap it (were unshare killed first, PID 1 would linger as a zombie of the host's
        # init). A frozen sandbox is thawed so that unshare can run; killed tasks stay dead.
        init_pid = self._init_pid
        if init_pid is not None:
            try:
                os.kill(init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._frozen:
            try:
                if self._cgroups.control is not None:
                    self._cgroups.set_frozen(False)
                else:
                    self._signal_all(signal.SIGCONT)
            except OSError:
                pass
        if init_pid is None or not await self._poll_quietly(gone, 3.0):
            # No PID 1 known (boot failed early) or something resists: kill everything.
            if not self._cgroups.kill():
                self._signal_all(signal.SIGKILL)
            if proc is not None and proc.poll() is None:
                proc.kill()
            await self._poll(gone, "halt")
        self._reset()

    async def _poll_quietly(self, predicate: Callable[[], bool], limit: float) -> bool:
        try:
            await self._poll(predicate, "", limit)
        except SandboxRuntimeError:
            return False
        return True

    def _reset(self) -> None:
        self._proc = None
        self._init_pid = None
        self._pid_ns = None
        self._frozen = False

    async def destroy(self) -> None:
        """Halt the sandbox, delete every file of it and its cgroups.

        Raises:
            SandboxRuntimeError: processes survived, a mount is still under ``state_dir``
                (nothing is deleted then), or a cgroup could not be removed.
        """
        async with self._guard():
            await self._halt_locked()
            left = _linux.mounts_under(self.state_dir)
            if left:
                raise SandboxRuntimeError(
                    f"refusing to delete {self.state_dir}: still mounted: {', '.join(left)}"
                )
            if os.path.lexists(self.state_dir):
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, remove_tree, self.state_dir)
            self._cgroups.remove()
