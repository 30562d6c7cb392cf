"""Local files written safely: descriptors that never follow a link, part names, clean-up.

This module owns the flags a local directory is opened with (:data:`DIR_OPEN`: by name in
its parent's descriptor, never through a symbolic link), the temporary names downloads
write under (``.capybara-part-<pid>-<host>-<hex>``, :func:`part_name`), the sweep of those
that processes now gone left behind (:func:`sweep_parts`), and :func:`remove_tree`, which
removes a directory tree of any depth one descriptor at a time.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import stat as stat_mod
from typing import List, Tuple

log = logging.getLogger("e2b_provider")

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: A local directory is opened with these flags: by name in its parent's descriptor, never
#: through a symbolic link.
DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | O_CLOEXEC


#: Local temporary names: ``.capybara-part-<pid>-<host>-<hex>``, ``host`` naming the machine,
#: its boot and its pid namespace (:func:`_host_tag`), so that the owner's liveness can be
#: told from the name alone.
_PART = ".capybara-part-"
_PART_NAME = re.compile(r"\.capybara-part-([0-9]{1,10})-([0-9a-f]{8})-[0-9a-f]{12}")
_host: List[str] = []


def _host_tag() -> str:
    """Eight hex digits naming this machine, its boot and this process's pid namespace:
    a part file whose name carries them has an owner whose pid means something here."""
    if not _host:
        seen = [os.uname().nodename]
        for path in ("/proc/sys/kernel/random/boot_id",):
            try:
                with open(path, encoding="ascii") as f:
                    seen.append(f.read().strip())
            except OSError:
                seen.append("")
        try:
            seen.append(os.readlink("/proc/self/ns/pid"))
        except OSError:
            seen.append("")
        _host.append(hashlib.sha256("\0".join(seen).encode()).hexdigest()[:8])
    return _host[0]


def part_name() -> str:
    return f"{_PART}{os.getpid()}-{_host_tag()}-{os.urandom(6).hex()}"


def _gone(pid: int) -> bool:
    """Whether no process ``pid`` runs (here: the caller has checked the host tag)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def sweep_parts(dir_fd: int) -> int:
    """Remove from directory ``dir_fd`` the temporary files (and staging directories) that
    downloads of processes now gone left (killed: nothing could remove them); how many.

    Only a name that is exactly a part name of this machine, boot and pid namespace whose
    process is gone, owned by this user, is removed; a part of a live process, of another
    machine or of an older version is left."""
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return 0
    removed = 0
    tag = _host_tag()
    for name in names:
        if not name.startswith(_PART):
            continue
        m = _PART_NAME.fullmatch(name)
        if m is None or m.group(2) != tag or not _gone(int(m.group(1))):
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if st.st_uid != os.geteuid():
                continue
            if stat_mod.S_ISDIR(st.st_mode):
                remove_tree(dir_fd, name)
            else:
                os.unlink(name, dir_fd=dir_fd)
            removed += 1
        except OSError as exc:
            log.info("e2b_provider: could not remove %s: %s", name, exc.strerror)
    return removed


def remove_tree(dir_fd: int, name: str) -> None:
    """Remove directory ``name`` of ``dir_fd`` and everything below it, never following a
    link, whatever its depth: one descriptor at a time (a directory's subdirectories are
    kept by name), climbing back by ``..`` checked against the directory left."""
    top = os.open(name, DIR_OPEN, dir_fd=dir_fd)
    # each level: (its name, its (st_dev, st_ino), subdirectories still to remove)
    levels: List[Tuple[str, Tuple[int, int], List[str]]] = []
    fd = top
    try:
        entered = name
        while True:
            st = os.fstat(fd)
            subdirs: List[str] = []
            for entry in os.listdir(fd):
                try:
                    os.unlink(entry, dir_fd=fd)
                except IsADirectoryError:
                    subdirs.append(entry)
                except FileNotFoundError:
                    pass
                except PermissionError:  # Linux's unlink of a directory
                    if not stat_mod.S_ISDIR(os.stat(entry, dir_fd=fd,
                                                    follow_symlinks=False).st_mode):
                        raise
                    subdirs.append(entry)
            levels.append((entered, (st.st_dev, st.st_ino), subdirs))
            while levels and not levels[-1][2]:
                done, _, _ = levels.pop()
                if not levels:
                    os.close(fd)
                    fd = -1
                    os.rmdir(done, dir_fd=dir_fd)
                    return
                up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = up
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != levels[-1][1]:
                    raise OSError(errno.EBUSY, "the tree moved while it was removed", done)
                os.rmdir(done, dir_fd=fd)
            entered = levels[-1][2].pop()
            child = os.open(entered, DIR_OPEN, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        if fd >= 0:
            os.close(fd)
