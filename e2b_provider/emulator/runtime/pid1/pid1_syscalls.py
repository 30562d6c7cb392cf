"""PID 1's system calls through libc and ioctls: mount, pivot_root, loop devices, the
loopback interface, the capability bounding set, the sandbox's user namespace and the agent's
listening sockets.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import time
from typing import Iterable, Mapping, Optional, Tuple

__all__ = [
    "KEEP_CAPS",
    "drop_bounding_set",
    "enter_userns",
    "listen",
    "locked_flags",
    "loop_attach",
    "loopback_up",
    "make_userns",
    "mount",
    "pivot_root",
]

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


_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(
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


def pivot_root(new_root: str) -> None:
    nr = _PIVOT_ROOT_NR.get(os.uname().machine)
    if nr is None:
        raise OSError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    os.chdir(new_root)
    _check(_libc.syscall(ctypes.c_long(nr), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "umount old root")
    os.chdir("/")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def drop_bounding_set(keep: Iterable[int]) -> None:
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


def loop_attach(image: str) -> Tuple[str, int]:
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


def make_userns(ids: Mapping[str, int]) -> int:
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


def enter_userns(fd: int) -> None:
    """Become root of the sandbox's user namespace (in a child, before exec)."""
    _check(_libc.setns(fd, CLONE_NEWUSER), "setns into the sandbox's user namespace")
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    # Joining a user namespace gives every capability in it: bound them again.
    drop_bounding_set(KEEP_CAPS)


def listen(path: str) -> socket.socket:
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
