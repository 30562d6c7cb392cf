"""The sandbox's root filesystem, built by PID 1 in its fresh mount namespace, and the rest
of its setup (:func:`setup`): the disk, the overlays, the generated accounts, the binds, the
kernel filesystems, ``pivot_root``, the hostname and loopback, the agent's sockets and user
namespace, the bounding set.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
from typing import TYPE_CHECKING, Any, Mapping, Optional

# siblings by top-level name for PID 1, through the package for type checkers (see init.py)
if TYPE_CHECKING:
    from . import pid1_accounts as accounts
    from . import pid1_syscalls as syscalls
else:
    import pid1_accounts as accounts
    import pid1_syscalls as syscalls

__all__ = [
    "Boot",
    "setup",
]

_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# Rootless mode (set by setup() from the boot config): PID 1 is root of a user namespace
# that maps only root (the host user) and the subuid range, not the host's root.
_rootless = False
# Root mode with a user namespace: the host ids of the sandbox's uid 0 and gid 0 (ids 0-65535
# inside are these plus 0-65535 on the host). 0 otherwise: PID 1 is already the sandbox's root.
_uid_base = 0
_gid_base = 0
#: What the base template's sudo needs from the host, besides /usr/bin/sudo.
_SUDO_DIRS = ("/usr/libexec/sudo", "/usr/lib/sudo")


def _bind(source: str, target: str, readonly: bool = False, extra: int = 0) -> None:
    syscalls.mount(source, target, None, syscalls.MS_BIND, None)
    if readonly or extra:
        flags = (
            syscalls.MS_BIND | syscalls.MS_REMOUNT | extra | (syscalls.MS_RDONLY if readonly else 0)
        )
        if _rootless:
            flags |= syscalls.locked_flags(os.statvfs(target).f_flag)
        syscalls.mount(None, target, None, flags, None)


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
    device, fd = syscalls.loop_attach(disk["image"])
    try:
        syscalls.mount(
            device, disk["mount"], "ext4", syscalls.MS_NODEV | syscalls.MS_NOATIME, "noinit_itable"
        )
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
    for _name, ident, home in accounts.SANDBOX_USERS:
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
        syscalls.mount(
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
    if (
        "python" not in without
        and not os.path.lexists("/usr/bin/python")
        and (os.path.exists("/usr/bin/python3"))
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
            ("hosts", accounts.render_hosts(previous), accounts.render_hosts(hostname)),
        ):
            path = os.path.join(etc, name)
            if not fresh(name) and _read(path) == old:
                _write_new(path, new, 0o644)
    if marker and previous != hostname:
        with open(marker, "w", encoding="utf-8") as f:
            f.write(hostname + "\n")

    passwd = accounts.render_passwd(_read("/etc/passwd"))
    group = accounts.render_group(_read("/etc/group"), passwd)
    shadow_gid = _group_id(group, "shadow")
    files = (
        ("passwd", passwd, 0o644, 0),
        ("group", group, 0o644, 0),
        ("shadow", accounts.render_shadow(passwd), 0o640, shadow_gid),
        ("gshadow", accounts.render_gshadow(group), 0o640, shadow_gid),
        ("hostname", hostname + "\n", 0o644, 0),
        ("hosts", accounts.render_hosts(hostname), 0o644, 0),
        ("sudoers", accounts.render_sudoers(), 0o440, 0),
    )
    for name, text, mode, gid in files:
        if fresh(name):
            _write_new(os.path.join(etc, name), text, mode, gid)
    resolv = os.path.join(etc, "resolv.conf")
    if fresh("resolv.conf") or os.path.islink(resolv):
        if os.path.islink(resolv):
            os.unlink(resolv)
        _write_new(resolv, accounts.RESOLV_CONF, 0o644)
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
        _bind(path, target, readonly=True, extra=syscalls.MS_NOSUID | syscalls.MS_NODEV)


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
            syscalls.mount(source, f"/proc/self/fd/{fd}", None, syscalls.MS_BIND, None)
        finally:
            os.close(fd)


def _write_sysctl(proc: str, name: str, value: str) -> None:
    with open(os.path.join(proc, "sys", *name.split(".")), "w", encoding="ascii") as f:
        f.write(value)


def _kernel_fs(cfg: Mapping[str, Any]) -> None:
    root = cfg["root"]
    ids = f"uid={_uid_base},gid={_gid_base}"
    proc = os.path.join(root, "proc")
    syscalls.mount(
        "proc", proc, "proc", syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC, None
    )
    if cfg.get("userns"):
        # The network namespace belongs to the host's user namespace, in which the sandbox's
        # root has no capability: let it bind ports below 1024 and ping, as root can on E2B.
        _write_sysctl(proc, "net.ipv4.ip_unprivileged_port_start", "0")
        _write_sysctl(proc, "net.ipv4.ping_group_range", "0 2147483647")
    _bind(
        proc + "/sys",
        proc + "/sys",
        readonly=True,
        extra=syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC,
    )
    if cfg.get("boot_id_file"):
        # This boot's own id (the host's otherwise): a cold boot is a boot.
        _bind(
            cfg["boot_id_file"],
            proc + "/sys/kernel/random/boot_id",
            readonly=True,
            extra=syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC,
        )
    for masked in ("sysrq-trigger", "kcore"):
        if os.path.exists(os.path.join(proc, masked)):
            _bind("/dev/null", os.path.join(proc, masked))
    ro_flags = syscalls.MS_RDONLY | syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC
    syscalls.mount("sysfs", os.path.join(root, "sys"), "sysfs", ro_flags, None)

    dev = os.path.join(root, "dev")
    syscalls.mount(
        "tmpfs", dev, "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NOEXEC, f"mode=755,size=64k,{ids}"
    )
    for name in _DEVICES:
        path = os.path.join(dev, name)
        with open(path, "w"):
            pass
        _bind("/dev/" + name, path)
    os.mkdir(dev + "/pts", 0o755)
    syscalls.mount(
        "devpts",
        dev + "/pts",
        "devpts",
        syscalls.MS_NOSUID | syscalls.MS_NOEXEC,
        f"newinstance,ptmxmode=0666,mode=0620,gid={_gid_base + 5}",
    )
    os.symlink("pts/ptmx", dev + "/ptmx")
    os.mkdir(dev + "/shm")
    syscalls.mount(
        "tmpfs", dev + "/shm", "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV, f"mode=1777,{ids}"
    )
    os.symlink("/proc/self/fd", dev + "/fd")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{dev}/{name}")

    run = os.path.join(root, "run")
    syscalls.mount("tmpfs", run, "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV, f"mode=755,{ids}")
    os.mkdir(run + "/e2b", 0o700)
    _bind(cfg["e2b_dir"], run + "/e2b", extra=syscalls.MS_NOSUID | syscalls.MS_NODEV)
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
    syscalls.pivot_root(root)
    socket.sethostname(cfg["hostname"])
    syscalls.loopback_up()
    listener = syscalls.listen(cfg["agent_socket"])
    ports = syscalls.listen(cfg["ports_socket"]) if cfg.get("ports_socket") else None
    userns_fd = syscalls.make_userns(userns) if userns else None
    syscalls.drop_bounding_set(syscalls.KEEP_CAPS)
    return Boot(listener, userns_fd, ports)
