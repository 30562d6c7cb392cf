"""PID 1 of an emulator sandbox: builds the sandbox's filesystem, then reaps and runs the agent.

This module owns everything that happens inside a sandbox's fresh namespaces before the envd
agent serves: the root filesystem (a persistent per-sandbox root directory, overlayfs over the
host's ``/usr``, ``/etc``, ``/var`` and ``/opt``, generated account files, read-only binds of
what the host Python needs, ``/proc``, ``/sys``, a minimal ``/dev``, ``/run`` with ``/run/e2b``),
``pivot_root``, the hostname and loopback, the capability bounding set; and then the PID-1 job:
reap every orphan and keep the agent running until SIGTERM arrives from outside the sandbox.

Rootless mode (``"rootless": true`` in the boot config; PID 1 is then root of a user namespace
mapping the host user to root and its subuid/subgid range to ids 1-65535): the overlays use
``userxattr``, and bind remounts repeat the flags the kernel locked on inherited host mounts.
Host-owned files of the overlaid ``/usr``, ``/etc``, ``/var``, ``/opt`` stay read-only even for
the sandbox's root (their owner is not mapped); new top-level entries there and the sandbox's
own directories (``/workspace``, ``/home``, ``/root``, ``/tmp``, ``/opt/capybara``) are writable.

:mod:`.boot` starts it as ``unshare --pid --fork --mount … -- <python> -E -s -S
<path of this file> <config.json>``: run by path and with ``-S``, it must use the standard
library only (no ``attrs``, nothing from ``e2b_provider``). It does no networking besides
bringing ``lo`` up; no requests/urllib3. The pure helpers (``render_*``) are importable for tests.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

__all__ = [
    "KEEP_CAPS",
    "SANDBOX_USERS",
    "main",
    "render_group",
    "render_gshadow",
    "render_hosts",
    "render_passwd",
    "render_shadow",
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
MS_REC = 16384
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2
PR_CAPBSET_DROP = 24
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

# Rootless mode (set by setup() from the boot config): PID 1 is root of a user namespace
# that maps only root (the host user) and the subuid range, not the host's root.
_rootless = False
_OUTSIDE_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _log(msg: str) -> None:
    sys.stderr.write(f"e2b-init: {msg}\n")
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


# --- filesystem ---------------------------------------------------------------------------


def _mkdir(path: str, mode: int, uid: int = 0, gid: int = 0) -> None:
    """Create ``path`` with this owner and mode if it does not exist (kept as is otherwise)."""
    if os.path.lexists(path):
        return
    os.mkdir(path)
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def _write_new(path: str, text: str, mode: int, gid: int = 0) -> None:
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.e2b-new")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chown(tmp, 0, gid)
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


def _skeleton(cfg: Mapping[str, Any]) -> None:
    root = cfg["root"]
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


def _overlays(cfg: Mapping[str, Any]) -> None:
    root = cfg["root"]
    for name in cfg["overlays"]:
        upper = os.path.join(cfg["upper"], name)
        work = os.path.join(cfg["work"], name)
        os.makedirs(upper, mode=0o755, exist_ok=True)
        os.makedirs(work, mode=0o700, exist_ok=True)
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


def _accounts(cfg: Mapping[str, Any]) -> None:
    """Write the generated /etc files into the overlay, once (later edits persist)."""
    etc = os.path.join(cfg["root"], "etc")
    upper = os.path.join(cfg["upper"], "etc")
    hostname = cfg["hostname"]

    def fresh(name: str) -> bool:
        return not os.path.lexists(os.path.join(upper, name))

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
    os.makedirs(upload, mode=0o700, exist_ok=True)
    os.chmod(upload, 0o700)  # the staging directory is root-only


def _ro_binds(cfg: Mapping[str, Any]) -> None:
    root = cfg["root"]
    for path in cfg["ro_binds"]:
        target = root + path
        os.makedirs(target, mode=0o755, exist_ok=True)
        _bind(path, target, readonly=True, extra=MS_NOSUID | MS_NODEV)


def _kernel_fs(cfg: Mapping[str, Any]) -> None:
    root = cfg["root"]
    proc = os.path.join(root, "proc")
    _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    _bind(proc + "/sys", proc + "/sys", readonly=True, extra=MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for masked in ("sysrq-trigger", "kcore"):
        if os.path.exists(os.path.join(proc, masked)):
            _bind("/dev/null", os.path.join(proc, masked))
    ro_flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount("sysfs", os.path.join(root, "sys"), "sysfs", ro_flags, None)

    dev = os.path.join(root, "dev")
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
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
        "newinstance,ptmxmode=0666,mode=0620,gid=5",
    )
    os.symlink("pts/ptmx", dev + "/ptmx")
    os.mkdir(dev + "/shm")
    _mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    os.symlink("/proc/self/fd", dev + "/fd")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{dev}/{name}")

    run = os.path.join(root, "run")
    _mount("tmpfs", run, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    os.mkdir(run + "/e2b", 0o700)
    _bind(cfg["e2b_dir"], run + "/e2b", extra=MS_NOSUID | MS_NODEV)
    os.mkdir(run + "/lock")
    os.chmod(run + "/lock", 0o1777)


def setup(cfg: Mapping[str, Any]) -> None:
    """Build the sandbox's root and enter it. Runs as PID 1 in the new namespaces.

    Args:
        cfg: the boot configuration written by :class:`.boot.SandboxRuntime`.
    """
    global _rootless
    _rootless = bool(cfg.get("rootless", False))
    root = cfg["root"]
    _skeleton(cfg)
    _bind(root, root)  # pivot_root needs the new root to be a mount point
    _overlays(cfg)
    _accounts(cfg)
    _ro_binds(cfg)
    _kernel_fs(cfg)
    _pivot_root(root)
    socket.sethostname(cfg["hostname"])
    _loopback_up()
    _drop_bounding_set(KEEP_CAPS)


# --- PID 1 --------------------------------------------------------------------------------


def _spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, *_OUTSIDE_SIGNALS):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            os.chdir(cwd)
            os.execve(argv[0], list(argv), dict(env))
        except BaseException as exc:  # report, then leave the child
            os.write(2, f"e2b-init: cannot start the agent: {exc!r}\n".encode())
        os._exit(127)
    return pid


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def serve(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> int:
    """Run PID 1's loop: keep the agent alive, reap orphans, exit on SIGTERM from outside.

    Signals sent from inside the sandbox (``kill 1``) are ignored, as for a real init.

    Args:
        argv: the agent's command line (argv[0] is an absolute path).
        env: the agent's environment.
        cwd: the agent's working directory.

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
            agent = _spawn(argv, env, cwd)
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
                _log(f"agent {_describe(status)} after {ran:.1f}s; restarting in {delay:.2f}s")
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
        _log("usage: init.py <boot-config.json>")
        return 2
    t0 = time.monotonic()
    try:
        if os.getpid() != 1:
            raise OSError("init must run as PID 1 of a new pid namespace")
        cfg = _load(args[0])
        setup(cfg)
    except BaseException:  # the log is the only channel out
        _log("setup failed:\n" + traceback.format_exc())
        return 1
    _log(f"sandbox {cfg['sandbox_id']} set up in {1000 * (time.monotonic() - t0):.0f} ms")
    return serve(cfg["agent_argv"], cfg["agent_env"], cfg["agent_cwd"])


if __name__ == "__main__":
    sys.exit(main())
