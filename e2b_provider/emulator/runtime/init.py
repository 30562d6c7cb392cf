"""PID 1 of an emulator sandbox: builds the sandbox's filesystem, then reaps and runs the agent.

This module owns everything that happens inside a sandbox's fresh namespaces before the envd
agent serves: the sandbox's disk (an ext4 image on a loop device, when the boot config names
one), the root filesystem (a persistent per-sandbox root directory, overlayfs over the host's
``/usr``, ``/etc``, ``/var`` and ``/opt``, generated account files, the base template's
``sudo`` and ``python``, read-only binds of what the host Python needs, ``/proc`` with the
sandbox's own boot id, ``/sys``, a minimal ``/dev``, ``/run`` with ``/run/e2b``),
``pivot_root``, the hostname and loopback, the agent's listening sockets (``envd.sock`` for
envd traffic, ``ports.sock`` through which the host asks for connections to the sandbox's
ports), the sandbox's user namespace, the capability bounding set; and then the PID-1 job:
reap every orphan and keep the agent running until SIGTERM arrives from outside the sandbox.

Root mode (``"userns"`` in the boot config): PID 1 stays host root, the only process of the
sandbox that does; it builds everything above, then creates one user namespace mapping ids
0-65535 to an unprivileged host range, and starts the agent (and so every process of the
sandbox) in it as that namespace's root. Files PID 1 creates for the sandbox belong to the
mapped ids. Host files keep their owners, unmapped inside: the sandbox's root reads only what
the host lets everyone read, and cannot modify host files of the overlaid directories (it can
add new entries at their top level, and everything in its own directories).

Rootless mode (``"rootless": true`` in the boot config; PID 1 is then root of a user namespace
mapping the host user to root and its subuid/subgid range to ids 1-65535): the overlays use
``userxattr``, and bind remounts repeat the flags the kernel locked on inherited host mounts.
Host-owned files of the overlaid ``/usr``, ``/etc``, ``/var``, ``/opt`` stay read-only even for
the sandbox's root (their owner is not mapped); new top-level entries there and the sandbox's
own directories (``/workspace``, ``/home``, ``/root``, ``/tmp``, ``/opt/capybara``) are writable.

:mod:`.boot` starts it as ``unshare --pid --fork --mount … -- <python> -E -s -S
<path of this file> <config.json>``: run by path and with ``-S``, it must use the standard
library only (no ``attrs``, nothing from ``e2b_provider``). It does no networking besides
bringing ``lo`` up and listening on the agent's unix sockets; no requests/urllib3. The pure
helpers (``render_*``, ``locked_flags``) are importable for tests.
"""

from __future__ import annotations

import ctypes
import datetime
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import struct
import sys
import time
import traceback
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

__all__ = [
    "KEEP_CAPS",
    "LOGGER",
    "SANDBOX_USERS",
    "log_line",
    "main",
    "render_group",
    "render_gshadow",
    "render_hosts",
    "render_passwd",
    "render_shadow",
    "render_sudoers",
]

# (name, uid/gid, home) of the accounts every sandbox has besides the host's system accounts.
SANDBOX_USERS: Tuple[Tuple[str, int, str], ...] = (
    ("sandbox", 1000, "/home/sandbox"),
    ("user", 1001, "/home/user"),
)

# Docker-like bounding set (minus mknod): runuser, chown and copy-up writes keep working;
# mount, mknod, module loading, raw I/O, ptrace of PID 1 and the like do not.
KEEP_CAPS: Tuple[int, ...] = (
    0,  # chown
    1,  # dac_override
    3,  # fowner
    4,  # fsetid
    5,  # kill
    6,  # setgid
    7,  # setuid
    8,  # setpcap
    10,  # net_bind_service
    13,  # net_raw
    18,  # sys_chroot
    29,  # audit_write
    31,  # setfcap
)

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2
PR_CAPBSET_DROP = 24
CLONE_NEWUSER = 0x10000000
LOOP_CTL_GET_FREE = 0x4C82
LOOP_SET_FD = 0x4C00
LOOP_SET_STATUS64 = 0x4C04
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

_PIVOT_ROOT_NR = {
    "x86_64": 155,
    "aarch64": 41,
    "riscv64": 41,
    "i386": 217,
    "i686": 217,
    "s390x": 217,
    "ppc64le": 203,
    "ppc64": 203,
    "armv7l": 218,
}

_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
#: The fd on which the agent finds its listening socket (systemd's LISTEN_FDS convention).
LISTEN_FD = 3

# Rootless mode (set by setup() from the boot config): PID 1 is root of a user namespace
# that maps only root (the host user) and the subuid range, not the host's root.
_rootless = False
# Root mode with a user namespace: the host ids of the sandbox's uid 0 and gid 0 (ids 0-65535
# inside are these plus 0-65535 on the host). 0 otherwise: PID 1 is already the sandbox's root.
_uid_base = 0
_gid_base = 0
_OUTSIDE_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Every signal whose disposition can be set (all but SIGKILL and SIGSTOP).
_RESETTABLE_SIGNALS = tuple(
    sig for sig in sorted(signal.valid_signals()) if sig not in (signal.SIGKILL, signal.SIGSTOP)
)
#: What the base template's sudo needs from the host, besides /usr/bin/sudo.
_SUDO_DIRS = ("/usr/libexec/sudo", "/usr/lib/sudo")


#: The ``logger`` of PID 1's log lines (the agent's are envd's: ``process``, ``filesystem``…).
LOGGER = "init"


def log_line(message: str, level: str = "info") -> str:
    """One of PID 1's log lines: a JSON object with the agent's keys (``level``, ``time``,
    ``logger``, ``message``) on one line, so every line of the sandbox's logs is JSON (E2B's
    ``e2b sandbox logs`` parses each as JSON)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
    record = {"level": level, "time": stamp, "logger": LOGGER, "message": message}
    return json.dumps(record, ensure_ascii=False) + "\n"


def _log(msg: str, level: str = "info") -> None:
    sys.stderr.write(log_line(msg, level))
    sys.stderr.flush()


# --- generated account files (pure) -------------------------------------------------------


def _system_entry(fields: Sequence[str], reserved: Set[str]) -> bool:
    if len(fields) < 4 or fields[0] in reserved:
        return False
    try:
        ident = int(fields[2])
    except ValueError:
        return False
    return ident < 1000 or ident == 65534


def render_passwd(host_passwd: str) -> str:
    """Return the sandbox's ``/etc/passwd``: the host's system accounts plus the sandbox users.

    Host accounts with uid >= 1000 (real people, CI users) never show inside.

    Args:
        host_passwd: the host's ``/etc/passwd`` text.
    """
    reserved = {name for name, _, _ in SANDBOX_USERS}
    lines = [
        line
        for line in host_passwd.splitlines()
        if line and not line.startswith("#") and _system_entry(line.split(":"), reserved)
    ]
    for name, ident, home in SANDBOX_USERS:
        lines.append(f"{name}:x:{ident}:{ident}:{name}:{home}:/bin/bash")
    return "\n".join(lines) + "\n"


def _names(passwd: str) -> List[str]:
    return [line.split(":", 1)[0] for line in passwd.splitlines() if line]


def render_group(host_group: str, passwd: str) -> str:
    """Return the sandbox's ``/etc/group``: the host's system groups plus the sandbox groups.

    Members that are not accounts of the sandbox are dropped from every group.

    Args:
        host_group: the host's ``/etc/group`` text.
        passwd: the sandbox's ``/etc/passwd`` (from :func:`render_passwd`).
    """
    reserved = {name for name, _, _ in SANDBOX_USERS}
    known = set(_names(passwd))
    lines: List[str] = []
    for line in host_group.splitlines():
        fields = line.split(":")
        if not line or line.startswith("#") or not _system_entry(fields, reserved):
            continue
        members = [m for m in fields[3].split(",") if m and m in known]
        lines.append(":".join([fields[0], fields[1], fields[2], ",".join(members)]))
    for name, ident, _ in SANDBOX_USERS:
        lines.append(f"{name}:x:{ident}:")
    return "\n".join(lines) + "\n"


def render_shadow(passwd: str) -> str:
    """Return a ``/etc/shadow`` with no usable password for any account of ``passwd``."""
    return "".join(f"{name}:*:20000:0:99999:7:::\n" for name in _names(passwd))


def render_gshadow(group: str) -> str:
    """Return a ``/etc/gshadow`` with no group passwords for the groups of ``group``."""
    out = []
    for line in group.splitlines():
        if line:
            fields = line.split(":")
            out.append(f"{fields[0]}:!::{fields[3] if len(fields) > 3 else ''}\n")
    return "".join(out)


def render_hosts(hostname: str) -> str:
    """Return the sandbox's ``/etc/hosts`` (loopback names and the sandbox's hostname)."""
    return (
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"127.0.1.1\t{hostname}\n"
    )


def render_sudoers() -> str:
    """Return the sandbox's ``/etc/sudoers``: E2B's base lets ``user`` sudo without a password.

    The host's rules never apply inside (the sandbox gets its own, empty ``/etc/sudoers.d``).
    """
    return (
        "# e2b emulator sandbox: the base template's sudoers\n"
        "Defaults\tenv_reset\n"
        'Defaults\tsecure_path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n'
        "root\tALL=(ALL:ALL) ALL\n"
        "%sudo\tALL=(ALL:ALL) ALL\n"
        "user\tALL=(ALL:ALL) NOPASSWD: ALL\n"
        "@includedir /etc/sudoers.d\n"
    )


RESOLV_CONF = (
    "# e2b emulator: sandboxes have no outside network (loopback only).\n"
    "nameserver 127.0.0.1\n"
)


# --- syscalls -----------------------------------------------------------------------------


_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(
    source: Optional[str], target: str, fstype: Optional[str], flags: int, data: Optional[str]
) -> None:
    _check(
        _libc.mount(
            source.encode() if source is not None else None,
            target.encode(),
            fstype.encode() if fstype is not None else None,
            ctypes.c_ulong(flags),
            data.encode() if data is not None else None,
        ),
        f"mount {source} on {target} ({fstype})",
    )


def locked_flags(st_flag: int) -> int:
    """Map ``statvfs().f_flag`` of a mount to the ``MS_*`` flags a bind remount must keep.

    In a user namespace, the flags of mounts inherited from the host are locked: a remount
    that would drop ``ro``, ``nosuid``, ``nodev``, ``noexec`` or change the atime mode fails
    with EPERM, so rootless remounts repeat them.
    """
    flags = st_flag & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    if st_flag & os.ST_RELATIME:
        flags |= MS_RELATIME
    elif not st_flag & os.ST_NOATIME:
        flags |= MS_STRICTATIME
    return flags


def _bind(source: str, target: str, readonly: bool = False, extra: int = 0) -> None:
    _mount(source, target, None, MS_BIND, None)
    if readonly or extra:
        flags = MS_BIND | MS_REMOUNT | extra | (MS_RDONLY if readonly else 0)
        if _rootless:
            flags |= locked_flags(os.statvfs(target).f_flag)
        _mount(None, target, None, flags, None)


def _pivot_root(new_root: str) -> None:
    nr = _PIVOT_ROOT_NR.get(os.uname().machine)
    if nr is None:
        raise OSError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    os.chdir(new_root)
    _check(_libc.syscall(ctypes.c_long(nr), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "umount old root")
    os.chdir("/")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def _drop_bounding_set(keep: Iterable[int]) -> None:
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
        last = int(f.read())
    kept = set(keep)
    for cap in range(last + 1):
        if cap not in kept:
            _check(_libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0), f"drop cap {cap}")


def _open_loop_device(path: str) -> int:
    # A device that LOOP_CTL_GET_FREE has just created may need a moment to show in /dev.
    deadline = time.monotonic() + 2.0
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _loop_configure(dev: int, image: int) -> None:
    config = bytearray(304)  # struct loop_config: fd, block_size, loop_info64, reserved
    struct.pack_into("=II", config, 0, image, 0)
    struct.pack_into("=I", config, 8 + 52, LO_FLAGS_AUTOCLEAR)  # loop_info64.lo_flags
    try:
        fcntl.ioctl(dev, LOOP_CONFIGURE, config)
        return
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTTY):  # kernels before 5.8
            raise
    fcntl.ioctl(dev, LOOP_SET_FD, image)
    info = bytearray(232)
    struct.pack_into("=I", info, 52, LO_FLAGS_AUTOCLEAR)
    fcntl.ioctl(dev, LOOP_SET_STATUS64, info)


def _loop_attach(image: str) -> Tuple[str, int]:
    """Attach ``image`` to a free loop device that detaches itself once unused (autoclear).

    Returns the device's path and an open descriptor of it: keep the descriptor until the
    device is mounted (closing the last user of an autoclear device detaches it).
    """
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        img = os.open(image, os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(64):
                path = f"/dev/loop{fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)}"
                dev = _open_loop_device(path)
                try:
                    _loop_configure(dev, img)
                except OSError as exc:
                    os.close(dev)
                    if exc.errno == errno.EBUSY:  # another process took it meanwhile
                        continue
                    raise
                return path, dev
            raise OSError(errno.EBUSY, "no free loop device")
        finally:
            os.close(img)
    finally:
        os.close(ctl)


def _make_userns(ids: Mapping[str, int]) -> int:
    """Create the sandbox's user namespace; return a descriptor of it.

    Ids 0 to ``count - 1`` inside map to host uids from ``uid`` and gids from ``gid``. A child
    creates it, PID 1 (host root, in the parent namespace) writes the maps; the descriptor
    keeps the namespace alive for every agent started later.
    """
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(ready_r)
            os.close(go_w)
            if _libc.unshare(CLONE_NEWUSER) == 0:
                os.write(ready_w, b"u")
                os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) != b"u":
            raise OSError("unshare(CLONE_NEWUSER) failed in the namespace's first process")
        for name, start in (("uid_map", ids["uid"]), ("gid_map", ids["gid"])):
            with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as f:
                f.write(f"0 {start} {ids['count']}\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(go_w)  # the child reads EOF and exits
        os.close(ready_r)
        os.waitpid(pid, 0)


def _enter_userns(fd: int) -> None:
    """Become root of the sandbox's user namespace (in a child, before exec)."""
    _check(_libc.setns(fd, CLONE_NEWUSER), "setns into the sandbox's user namespace")
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    # Joining a user namespace gives every capability in it: bound them again.
    _drop_bounding_set(KEEP_CAPS)


def _listen(path: str) -> socket.socket:
    """The agent's listening socket, made by PID 1 so that the sandbox cannot replace it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(1024)
    return sock


# --- filesystem ---------------------------------------------------------------------------


def _own(path: str, uid: int = 0, gid: int = 0) -> None:
    """Give ``path`` (not followed) to the sandbox's ids ``uid``:``gid``."""
    os.lchown(path, _uid_base + uid, _gid_base + gid)


def _mkdir(path: str, mode: int, uid: int = 0, gid: int = 0) -> None:
    """Create ``path`` with this owner (sandbox ids) and mode if it does not exist."""
    if os.path.lexists(path):
        return
    os.mkdir(path)
    _own(path, uid, gid)
    os.chmod(path, mode)


def _makedirs(path: str) -> None:
    """Create ``path`` and its missing parents, 0755 and owned by the sandbox's root."""
    parent = os.path.dirname(path)
    if parent != path and not os.path.lexists(parent):
        _makedirs(parent)
    _mkdir(path, 0o755)


def _write_new(path: str, text: str, mode: int, gid: int = 0) -> None:
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.e2b-new")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    _own(tmp, 0, gid)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return ""


def _group_id(group_text: str, name: str) -> int:
    for line in group_text.splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[0] == name and fields[2].isdigit():
            return int(fields[2])
    return 0


def _mount_disk(disk: Mapping[str, str]) -> None:
    """Mount the sandbox's ext4 image in this mount namespace only.

    The loop device detaches itself when the namespace dies with the sandbox's last process,
    whatever kills it, so nothing is left on the host.
    """
    device, fd = _loop_attach(disk["image"])
    try:
        _mount(device, disk["mount"], "ext4", MS_NODEV | MS_NOATIME, "noinit_itable")
    finally:
        os.close(fd)


def _skeleton(cfg: Mapping[str, Any]) -> None:
    root = cfg["root"]
    _mkdir(root, 0o755)
    _own(root)  # the sandbox's / is its root's
    for name in ("usr", "etc", "var", "opt", "proc", "sys", "dev", "run", "mnt", "media", "srv"):
        _mkdir(os.path.join(root, name), 0o755)
    _mkdir(os.path.join(root, "tmp"), 0o1777)
    _mkdir(os.path.join(root, "root"), 0o700)
    _mkdir(os.path.join(root, "skills"), 0o755)
    _mkdir(os.path.join(root, "workspace"), 0o755, 1000, 1000)
    _mkdir(os.path.join(root, "home"), 0o755)
    for _name, ident, home in SANDBOX_USERS:
        _mkdir(root + home, 0o755, ident, ident)
    for name, target in cfg["symlinks"].items():
        link = os.path.join(root, name)
        if not os.path.lexists(link):
            os.symlink(target, link)
            _own(link)


def _overlays(cfg: Mapping[str, Any]) -> None:
    root = cfg["root"]
    for name in cfg["overlays"]:
        upper = os.path.join(cfg["upper"], name)
        work = os.path.join(cfg["work"], name)
        os.makedirs(upper, mode=0o755, exist_ok=True)
        os.makedirs(work, mode=0o700, exist_ok=True)
        # The top of each overlay is the sandbox root's (as it is rootless): it may add entries
        # there; what the host owns below stays the host's.
        os.lchown(upper, _uid_base, _gid_base)
        _mkdir(os.path.join(root, name), 0o755)
        # Rootless, overlayfs keeps its metadata in user.* xattrs (trusted.* needs real root).
        _mount(
            "overlay",
            os.path.join(root, name),
            "overlay",
            0,
            f"lowerdir=/{name},upperdir={upper},workdir={work}"
            + (",userxattr" if _rootless else ""),
        )


def _upper_path(cfg: Mapping[str, Any], host_path: str) -> Optional[str]:
    """The path in the upper layers that overlays ``host_path``, or None if not overlaid.

    Missing parent directories are created the way a copy-up makes them: with the host
    directory's mode and, as host root, its owner. Call it before the overlays are mounted.
    """
    rel = host_path.strip("/")
    if rel.split("/", 1)[0] not in cfg["overlays"]:
        return None
    current = cfg["upper"]
    os.makedirs(current, mode=0o755, exist_ok=True)
    for part in os.path.dirname(rel).split("/"):
        current = os.path.join(current, part)
        if os.path.lexists(current):
            continue
        st = os.stat("/" + os.path.relpath(current, cfg["upper"]))
        os.mkdir(current)
        os.chmod(current, st.st_mode & 0o7777)
        if not _rootless:
            os.lchown(current, st.st_uid, st.st_gid)
    return os.path.join(cfg["upper"], rel)


def _copy_up(cfg: Mapping[str, Any], host_path: str) -> None:
    """Put a copy of a host file (or symlink) owned by the sandbox's root in the upper layer.

    Kept if the sandbox already has its own version (or deleted it).
    """
    dest = _upper_path(cfg, host_path)
    if dest is None or os.path.lexists(dest):
        return
    if os.path.islink(host_path):
        os.symlink(os.readlink(host_path), dest)
        _own(dest)
        return
    shutil.copyfile(host_path, dest)
    _own(dest)
    os.chmod(dest, os.stat(host_path).st_mode & 0o7777)  # after chown, which clears setuid


def _base_template(cfg: Mapping[str, Any]) -> None:
    """Give the sandbox E2B's base template's ``sudo`` and ``python`` (before the overlays).

    ``sudo`` is the host's, copied into the sandbox's upper layer with its helpers and
    ``/etc/sudo.conf`` so that they belong to the sandbox's root (a set-user-ID binary of an
    owner the sandbox does not map would not raise privileges, and sudo checks owners); the
    rules are the sandbox's own (:func:`render_sudoers` and an empty ``/etc/sudoers.d``).
    ``python`` is a symlink to ``python3`` when the host has no ``python``.
    """
    if os.path.isfile("/usr/bin/sudo"):
        _copy_up(cfg, "/usr/bin/sudo")
        for directory in _SUDO_DIRS:
            if os.path.isdir(directory) and not os.path.islink(directory):
                for name in sorted(os.listdir(directory)):
                    path = os.path.join(directory, name)
                    if os.path.islink(path) or os.path.isfile(path):
                        _copy_up(cfg, path)
        if os.path.isfile("/etc/sudo.conf"):
            _copy_up(cfg, "/etc/sudo.conf")
        rules = _upper_path(cfg, "/etc/sudoers.d")
        if rules is not None and not os.path.lexists(rules):
            os.mkdir(rules)
            _own(rules)
            os.chmod(rules, 0o755)
            # opaque: the host's own rules never show inside
            xattr = "user.overlay.opaque" if _rootless else "trusted.overlay.opaque"
            os.setxattr(rules, xattr, b"y")
    without = [str(name) for name in cfg.get("without") or ()]
    if "python" not in without and not os.path.lexists("/usr/bin/python") and (
        os.path.exists("/usr/bin/python3")
    ):
        link = _upper_path(cfg, "/usr/bin/python")
        if link is not None and not os.path.lexists(link):
            os.symlink("python3", link)
            _own(link)
    for name in without:
        _hide_program(cfg, name)


#: Where a sandbox's programs are found (its ``PATH``, as envd's).
_PROGRAM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _hide_program(cfg: Mapping[str, Any], name: str) -> None:
    """Hide ``name`` (and ``name.*``, ``name-*``) from every directory of the sandbox's
    ``PATH``: an overlay whiteout (a 0/0 character device in the upper layer) over each,
    unless the sandbox already has its own version. Root mode only."""
    seen = set()
    for directory in _PROGRAM_DIRS:
        real = os.path.realpath(directory)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        for entry in sorted(os.listdir(real)):
            if entry != name and not entry.startswith((name + ".", name + "-")):
                continue
            dest = _upper_path(cfg, os.path.join(real, entry))
            if dest is not None and not os.path.lexists(dest):
                os.mknod(dest, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def _accounts(cfg: Mapping[str, Any]) -> None:
    """Write the generated /etc files into the overlay, once (later edits persist)."""
    etc = os.path.join(cfg["root"], "etc")
    upper = os.path.join(cfg["upper"], "etc")
    hostname = cfg["hostname"]

    def fresh(name: str) -> bool:
        return not os.path.lexists(os.path.join(upper, name))

    # A copy of another sandbox's files (fork, snapshot) gets its own names: the generated
    # files the source never changed are made again for this hostname.
    marker = cfg.get("hostname_file")
    previous = _read(marker).strip() if marker else ""
    if previous and previous != hostname:
        for name, old, new in (
            ("hostname", previous + "\n", hostname + "\n"),
            ("hosts", render_hosts(previous), render_hosts(hostname)),
        ):
            path = os.path.join(etc, name)
            if not fresh(name) and _read(path) == old:
                _write_new(path, new, 0o644)
    if marker and previous != hostname:
        with open(marker, "w", encoding="utf-8") as f:
            f.write(hostname + "\n")

    passwd = render_passwd(_read("/etc/passwd"))
    group = render_group(_read("/etc/group"), passwd)
    shadow_gid = _group_id(group, "shadow")
    files = (
        ("passwd", passwd, 0o644, 0),
        ("group", group, 0o644, 0),
        ("shadow", render_shadow(passwd), 0o640, shadow_gid),
        ("gshadow", render_gshadow(group), 0o640, shadow_gid),
        ("hostname", hostname + "\n", 0o644, 0),
        ("hosts", render_hosts(hostname), 0o644, 0),
        ("sudoers", render_sudoers(), 0o440, 0),
    )
    for name, text, mode, gid in files:
        if fresh(name):
            _write_new(os.path.join(etc, name), text, mode, gid)
    resolv = os.path.join(etc, "resolv.conf")
    if fresh("resolv.conf") or os.path.islink(resolv):
        if os.path.islink(resolv):
            os.unlink(resolv)
        _write_new(resolv, RESOLV_CONF, 0o644)
    upload = os.path.join(cfg["root"], "opt", "capybara", "upload")
    _makedirs(os.path.dirname(upload))
    _mkdir(upload, 0o700)
    _own(upload)
    os.chmod(upload, 0o700)  # the staging directory is root-only


def _ro_binds(cfg: Mapping[str, Any]) -> None:
    root = cfg["root"]
    for path in cfg["ro_binds"]:
        target = root + path
        _makedirs(target)
        _bind(path, target, readonly=True, extra=MS_NOSUID | MS_NODEV)


def _volume_binds(cfg: Mapping[str, Any]) -> None:
    """Bind each volume's host directory read-write at its mount point in the sandbox.

    The mount point is reached one component at a time from the sandbox's root, each opened
    with ``O_NOFOLLOW``: a missing directory is made (0755, the sandbox's root), a symlink or a
    file on the way fails the boot, so nothing the sandbox (or another sandbox sharing a
    volume) planted leads the mount anywhere else. The mount goes onto the opened directory.
    """
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    for source, target in cfg.get("volume_binds") or ():
        fd = os.open(cfg["root"], flags)
        try:
            for name in [p for p in target.split("/") if p]:
                try:
                    nxt = os.open(name, flags, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(name, 0o700, dir_fd=fd)
                    nxt = os.open(name, flags, dir_fd=fd)
                    os.chown(f"/proc/self/fd/{nxt}", _uid_base, _gid_base)  # the magic link
                    os.chmod(f"/proc/self/fd/{nxt}", 0o755)
                except OSError as exc:
                    raise OSError(
                        exc.errno,
                        f"volume mount point {target}: {name} is not a directory (symlinks "
                        "are not followed)",
                    ) from None
                os.close(fd)
                fd = nxt
            _mount(source, f"/proc/self/fd/{fd}", None, MS_BIND, None)
        finally:
            os.close(fd)


def _write_sysctl(proc: str, name: str, value: str) -> None:
    with open(os.path.join(proc, "sys", *name.split(".")), "w", encoding="ascii") as f:
        f.write(value)


def _kernel_fs(cfg: Mapping[str, Any]) -> None:
    root = cfg["root"]
    ids = f"uid={_uid_base},gid={_gid_base}"
    proc = os.path.join(root, "proc")
    _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    if cfg.get("userns"):
        # The network namespace belongs to the host's user namespace, in which the sandbox's
        # root has no capability: let it bind ports below 1024 and ping, as root can on E2B.
        _write_sysctl(proc, "net.ipv4.ip_unprivileged_port_start", "0")
        _write_sysctl(proc, "net.ipv4.ping_group_range", "0 2147483647")
    _bind(proc + "/sys", proc + "/sys", readonly=True, extra=MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if cfg.get("boot_id_file"):
        # This boot's own id (the host's otherwise): a cold boot is a boot.
        _bind(
            cfg["boot_id_file"],
            proc + "/sys/kernel/random/boot_id",
            readonly=True,
            extra=MS_NOSUID | MS_NODEV | MS_NOEXEC,
        )
    for masked in ("sysrq-trigger", "kcore"):
        if os.path.exists(os.path.join(proc, masked)):
            _bind("/dev/null", os.path.join(proc, masked))
    ro_flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount("sysfs", os.path.join(root, "sys"), "sysfs", ro_flags, None)

    dev = os.path.join(root, "dev")
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, f"mode=755,size=64k,{ids}")
    for name in _DEVICES:
        path = os.path.join(dev, name)
        with open(path, "w"):
            pass
        _bind("/dev/" + name, path)
    os.mkdir(dev + "/pts", 0o755)
    _mount(
        "devpts",
        dev + "/pts",
        "devpts",
        MS_NOSUID | MS_NOEXEC,
        f"newinstance,ptmxmode=0666,mode=0620,gid={_gid_base + 5}",
    )
    os.symlink("pts/ptmx", dev + "/ptmx")
    os.mkdir(dev + "/shm")
    _mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,{ids}")
    os.symlink("/proc/self/fd", dev + "/fd")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{dev}/{name}")

    run = os.path.join(root, "run")
    _mount("tmpfs", run, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=755,{ids}")
    os.mkdir(run + "/e2b", 0o700)
    _bind(cfg["e2b_dir"], run + "/e2b", extra=MS_NOSUID | MS_NODEV)
    _mkdir(run + "/lock", 0o1777)


class Boot:
    """What :func:`setup` leaves for PID 1's loop: the agent's sockets and user namespace."""

    def __init__(
        self,
        listener: socket.socket,
        userns: Optional[int],
        ports: Optional[socket.socket] = None,
    ) -> None:
        self.listener = listener
        self.userns = userns
        self.ports = ports


def setup(cfg: Mapping[str, Any]) -> Boot:
    """Build the sandbox's root and enter it. Runs as PID 1 in the new namespaces.

    Args:
        cfg: the boot configuration written by :class:`.boot.SandboxRuntime`.

    Returns:
        The agent's listening sockets and, in root mode, the sandbox's user namespace.
    """
    global _rootless, _uid_base, _gid_base
    _rootless = bool(cfg.get("rootless", False))
    userns = cfg.get("userns")
    _uid_base, _gid_base = (userns["uid"], userns["gid"]) if userns else (0, 0)
    if cfg.get("disk"):
        _mount_disk(cfg["disk"])
    root = cfg["root"]
    _skeleton(cfg)
    _base_template(cfg)
    _bind(root, root)  # pivot_root needs the new root to be a mount point
    _overlays(cfg)
    _accounts(cfg)
    _ro_binds(cfg)
    _kernel_fs(cfg)
    _volume_binds(cfg)
    _pivot_root(root)
    socket.sethostname(cfg["hostname"])
    _loopback_up()
    listener = _listen(cfg["agent_socket"])
    ports = _listen(cfg["ports_socket"]) if cfg.get("ports_socket") else None
    userns_fd = _make_userns(userns) if userns else None
    _drop_bounding_set(KEEP_CAPS)
    return Boot(listener, userns_fd, ports)


# --- PID 1 --------------------------------------------------------------------------------


def _spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str, boot: Boot) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            # every signal as a service manager gives envd: none blocked, none ignored. What
            # the emulator inherited must not reach the sandbox (started from a background job
            # it has SIGINT and SIGQUIT ignored, and a terminal's Ctrl-C would do nothing)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            for sig in _RESETTABLE_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            if boot.userns is not None:
                _enter_userns(boot.userns)
            wanted = [boot.listener.fileno()]
            if boot.ports is not None:
                wanted.append(boot.ports.fileno())
            # dup every socket above the target range first, so that no dup2 overwrites one
            # that is still to be moved
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, LISTEN_FD + len(wanted)) for fd in wanted]
            for target, fd in enumerate(high, LISTEN_FD):
                os.dup2(fd, target)  # the new descriptor is inheritable
                os.close(fd)
            agent_env = dict(env, LISTEN_FDS=str(len(wanted)), LISTEN_PID=str(os.getpid()))
            os.chdir(cwd)
            os.execve(argv[0], list(argv), agent_env)
        except BaseException as exc:  # report, then leave the child
            os.write(2, log_line(f"cannot start the agent: {exc!r}", "error").encode())
        os._exit(127)
    return pid


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def serve(argv: Sequence[str], env: Mapping[str, str], cwd: str, boot: Boot) -> int:
    """Run PID 1's loop: keep the agent alive, reap orphans, exit on SIGTERM from outside.

    Signals sent from inside the sandbox (``kill 1``) are ignored, as for a real init. The
    agent, and so every process of the sandbox, starts with no signal blocked or ignored. Every
    agent gets the envd listening socket as fd 3 and the ports socket as fd 4 (``LISTEN_FDS=2``,
    ``LISTEN_PID``; ``LISTEN_FDS=1`` when the boot config names no ports socket) and, in root
    mode, runs as root of the sandbox's user namespace.

    Args:
        argv: the agent's command line (argv[0] is an absolute path).
        env: the agent's environment.
        cwd: the agent's working directory.
        boot: what :func:`setup` made.

    Returns:
        The exit status for PID 1 (0 on a requested shutdown).
    """
    wanted = {signal.SIGCHLD, *_OUTSIDE_SIGNALS}
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    agent: Optional[int] = None
    started = 0.0
    failures = 0
    restart_at: Optional[float] = time.monotonic()
    while True:
        now = time.monotonic()
        if agent is None and restart_at is not None and now >= restart_at:
            agent = _spawn(argv, env, cwd, boot)
            started = now
            restart_at = None
            _log(f"agent started (pid {agent})")
        wait = 60.0 if restart_at is None else max(0.0, restart_at - now)
        info = signal.sigtimedwait(wanted, wait)
        if info is not None and info.si_signo in _OUTSIDE_SIGNALS:
            if info.si_pid == 0:  # sent from outside the sandbox's pid namespace
                _log(f"signal {info.si_signo} from outside: shutting down")
                return 0
            _log(f"ignoring signal {info.si_signo} from pid {info.si_pid}")
        while True:  # reap everything that exited, agent or orphan
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == agent:
                ran = time.monotonic() - started
                failures = failures + 1 if ran < 5.0 else 0
                delay = min(2.0, 0.05 * (2 ** min(failures, 6)))
                _log(
                    f"agent {_describe(status)} after {ran:.1f}s; restarting in {delay:.2f}s",
                    "warn",
                )
                agent = None
                restart_at = time.monotonic() + delay


def _load(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise ValueError("boot configuration must be a JSON object")
    return cfg


def main(args: Optional[Sequence[str]] = None) -> int:
    """Entry point: ``init.py <boot config json>``; must run as PID 1 of fresh namespaces."""
    args = list(sys.argv[1:] if args is None else args)
    if len(args) != 1:
        _log("usage: init.py <boot-config.json>", "error")
        return 2
    t0 = time.monotonic()
    try:
        if os.getpid() != 1:
            raise OSError("init must run as PID 1 of a new pid namespace")
        cfg = _load(args[0])
        boot = setup(cfg)
    except BaseException:  # the log is the only channel out
        _log("setup failed:\n" + traceback.format_exc(), "error")
        return 1
    _log(f"sandbox {cfg['sandbox_id']} set up in {1000 * (time.monotonic() - t0):.0f} ms")
    return serve(cfg["agent_argv"], cfg["agent_env"], cfg["agent_cwd"], boot)


if __name__ == "__main__":
    sys.exit(main())
