"""The files of one volume, reached safely from the host: what the volume content API does.

This module owns :class:`VolumeRoot` (every content operation on one volume's directory:
stat, list with depth, make a directory, write, open for reading, change owner and mode,
remove), :class:`IdMap` (the ids a sandbox sees against the host's), :class:`VolumeError` (a
refused operation with its HTTP status) and the entry E2B's content API answers with.

Paths are resolved as E2B resolves them, as if the volume's directory were the root: ``..``
stops at the root, absolute symlink targets start from it, at most 40 symlinks per path.
Resolution walks one component at a time from a descriptor of the volume's directory
(``openat`` with ``O_NOFOLLOW``, symlinks read with ``readlinkat`` and resolved by this module),
so no path, ``..`` or symlink a sandbox plants reaches a host file outside the volume; every
final operation acts on a descriptor or a name relative to its parent's descriptor, never on a
host path. Blocking: the server runs these in its executor. Standard library only, no aiohttp.
"""

from __future__ import annotations

import datetime
import errno
import os
import posixpath
import stat
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import attrs

__all__ = [
    "DEFAULT_DIR_MODE",
    "DEFAULT_FILE_MODE",
    "DEFAULT_OWNER",
    "IdMap",
    "VolumeError",
    "VolumeRoot",
    "clean_path",
]

#: E2B's owner (uid and gid) of what the content API creates when none is given.
DEFAULT_OWNER = 9090
#: E2B's mode of a directory the content API creates when none is given.
DEFAULT_DIR_MODE = 0o777
#: E2B's mode of a file the content API creates when none is given.
DEFAULT_FILE_MODE = 0o666
#: The id a sandbox sees for a host id its user namespace does not map (the kernel's).
OVERFLOW_ID = 65534
#: The deepest ``depth`` a listing accepts (E2B's).
MAX_DEPTH = 10
_MAX_SYMLINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class VolumeError(Exception):
    """A content operation refused: HTTP ``status``, E2B's error ``code`` and a message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _not_found(path: str) -> VolumeError:
    return VolumeError(404, "path_not_found", f"path '{path}' not found")


def _already_exists(what: str, path: str) -> VolumeError:
    return VolumeError(409, "path_already_exists", f"{what}: path '{path}' already exists")


def _os_error(exc: OSError, what: str, path: str) -> VolumeError:
    """E2B's answer for an ``OSError`` of ``what`` on ``path``."""
    if exc.errno == errno.ENOENT:
        return _not_found(path)
    if exc.errno == errno.EEXIST:
        return _already_exists(what, path)
    if exc.errno == errno.ENOTDIR:
        return VolumeError(
            400,
            "invalid_request",
            f"{what}: a component of the path is a file, but must be a directory",
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return VolumeError(403, "permission_denied", f"{what}: permission denied on '{path}'")
    if exc.errno == errno.ELOOP:
        return VolumeError(400, "invalid_request", f"{what}: too many symbolic links in '{path}'")
    if exc.errno == errno.ENOSPC:
        return VolumeError(507, "no_space", f"{what}: no space left on the volume")
    return VolumeError(500, "internal_error", f"{what}: {os.strerror(exc.errno or 0)}")


def _owner(uid: Optional[int], gid: Optional[int]) -> Tuple[int, int]:
    """The sandbox ids a new entry gets: those given, else E2B's :data:`DEFAULT_OWNER`."""
    return (
        uid if uid is not None else DEFAULT_OWNER,
        gid if gid is not None else DEFAULT_OWNER,
    )


def clean_path(path: str) -> str:
    """The volume path E2B makes of a request's ``path``: absolute, ``..`` stopped at ``/``."""
    cleaned = posixpath.normpath("/" + path)
    return "/" + cleaned.lstrip("/")


@attrs.frozen
class IdMap:
    """How the ids a sandbox sees map to host ids: ``(inside, host, count)`` extents, as in
    ``/proc/<pid>/uid_map``.

    Attributes:
        uids: the uid extents.
        gids: the gid extents.
        can_chown: whether this process may give files to other host ids (root).
    """

    uids: Tuple[Tuple[int, int, int], ...]
    gids: Tuple[Tuple[int, int, int], ...]
    can_chown: bool

    @staticmethod
    def _inside(extents: Sequence[Tuple[int, int, int]], host: int) -> int:
        for inside, outside, count in extents:
            if outside <= host < outside + count:
                return inside + host - outside
        return OVERFLOW_ID

    @staticmethod
    def _outside(extents: Sequence[Tuple[int, int, int]], inside_id: int) -> Optional[int]:
        for inside, outside, count in extents:
            if inside <= inside_id < inside + count:
                return outside + inside_id - inside
        return None

    def inside(self, uid: int, gid: int) -> Tuple[int, int]:
        """The sandbox's view of host ids ``uid``:``gid``."""
        return self._inside(self.uids, uid), self._inside(self.gids, gid)

    def outside(self, uid: int, gid: int) -> Tuple[Optional[int], Optional[int]]:
        """The host ids of sandbox ids ``uid``:``gid`` (None where unmapped)."""
        return self._outside(self.uids, uid), self._outside(self.gids, gid)


def _iso(ns: int) -> str:
    seconds, rest = divmod(ns, 1_000_000_000)
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.replace(microsecond=rest // 1000).isoformat().replace("+00:00", "Z")


#: The volume API's word for each kind of file, by its ``stat`` test; any other is "unknown".
_KINDS: Tuple[Tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symlink"),
)


def _kind(mode: int) -> str:
    return next((word for test, word in _KINDS if test(mode)), "unknown")


class _Resolved:
    """A path resolved to its parent directory's descriptor and its last name (``""`` for
    the root itself) and the volume path it stands for."""

    def __init__(self, parent: int, name: str, path: str) -> None:
        self.parent = parent
        self.name = name
        self.path = path

    def close(self) -> None:
        os.close(self.parent)


class VolumeRoot:
    """One volume's directory on the host, every path inside it resolved safely.

    Args:
        directory: the host directory holding the volume's files (not a symlink).
        ids: the sandbox's ids against the host's (entries report the sandbox's view; owners
            given by clients are sandbox ids).
    """

    def __init__(self, directory: str, ids: IdMap) -> None:
        self.directory = directory
        self.ids = ids

    # -- resolution ---------------------------------------------------------------------------

    def _open_root(self) -> int:
        try:
            return os.open(self.directory, _DIR_FLAGS)
        except OSError as exc:
            raise VolumeError(404, "volume_not_found", "volume not found") from exc

    def _resolve(
        self, path: str, *, follow: bool, create_parents: Optional[Tuple[int, int]] = None
    ) -> _Resolved:
        """Resolve ``path`` (already clean) inside the volume.

        Args:
            follow: follow a symlink in the last component too.
            create_parents: create missing parent directories, owned by these sandbox ids
                (mode :data:`DEFAULT_DIR_MODE`).

        Raises:
            VolumeError: a missing parent (404), a parent that is a file (400), a symlink loop.
        """
        root = self._open_root()
        stack: List[Tuple[int, str]] = [(root, "")]
        todo: Deque[str] = deque(p for p in path.split("/") if p)
        links = 0
        try:
            while todo:
                name = todo.popleft()
                if name == ".":
                    continue
                if name == "..":
                    if len(stack) > 1:
                        os.close(stack.pop()[0])
                    continue
                fd, where = stack[-1]
                last = not todo
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        break
                    if create_parents is None:
                        raise _not_found(path) from None
                    self._mkdir_at(fd, name, DEFAULT_DIR_MODE, *create_parents, exist_ok=True)
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode) and (follow or not last):
                    links += 1
                    if links > _MAX_SYMLINKS:
                        raise VolumeError(
                            400, "invalid_request", f"too many symbolic links in '{path}'"
                        )
                    target = os.readlink(name, dir_fd=fd)
                    if target.startswith("/"):
                        while len(stack) > 1:
                            os.close(stack.pop()[0])
                    todo.extendleft(reversed([p for p in target.split("/") if p]))
                    continue
                if last:
                    break
                if not stat.S_ISDIR(st.st_mode):
                    raise _os_error(OSError(errno.ENOTDIR, ""), "resolve", path)
                stack.append((os.open(name, _DIR_FLAGS, dir_fd=fd), f"{where}/{name}"))
            else:
                name = ""
            parent, where = stack.pop()
            return _Resolved(parent, name, f"{where}/{name}" if name else (where or "/"))
        except OSError as exc:
            raise _os_error(exc, "resolve", path) from None
        finally:
            for fd, _ in stack:
                os.close(fd)

    def _open_final(self, res: _Resolved, flags: int = _PATH_FLAGS) -> int:
        """A descriptor of what ``res`` names (never through a symlink)."""
        if not res.name:
            return os.dup(res.parent)
        return os.open(res.name, flags, dir_fd=res.parent)

    # -- entries ------------------------------------------------------------------------------

    def _symlink_target(self, path: str) -> Tuple[Optional[str], Optional[os.stat_result]]:
        """Where the symlink at volume path ``path`` leads inside the volume, and what is there."""
        try:
            res = self._resolve(path, follow=True)
        except VolumeError:
            return self._lexical_target(path), None
        try:
            fd = self._open_final(res)
            try:
                return res.path, os.fstat(fd)
            finally:
                os.close(fd)
        except OSError:
            return res.path, None
        finally:
            res.close()

    def _lexical_target(self, path: str) -> Optional[str]:
        """The volume path the symlink at ``path`` names, as written (for one that leads
        nowhere inside the volume)."""
        try:
            res = self._resolve(path, follow=False)
        except VolumeError:
            return None
        try:
            raw = os.readlink(res.name, dir_fd=res.parent)
        except OSError:
            return None
        finally:
            res.close()
        return clean_path(raw if raw.startswith("/") else f"{posixpath.dirname(path)}/{raw}")

    def _entry(self, path: str, st: os.stat_result) -> Dict[str, Any]:
        """E2B's ``VolumeEntryStat`` of ``path``: a symlink reports its target's type and mode."""
        kind, mode = _kind(st.st_mode), st.st_mode & 0o777
        target: Optional[str] = None
        if stat.S_ISLNK(st.st_mode):
            target, target_st = self._symlink_target(path)
            kind = _kind(target_st.st_mode) if target_st is not None else "unknown"
            mode = target_st.st_mode & 0o777 if target_st is not None else 0
        uid, gid = self.ids.inside(st.st_uid, st.st_gid)
        out: Dict[str, Any] = {
            "name": posixpath.basename(path) or "/",
            "type": kind,
            "path": path,
            "size": st.st_size,
            "mode": mode,
            "uid": uid,
            "gid": gid,
            "atime": _iso(st.st_atime_ns),
            "mtime": _iso(st.st_mtime_ns),
            "ctime": _iso(st.st_ctime_ns),
        }
        if target is not None:
            out["target"] = target
        return out

    def _stat_entry(self, res: _Resolved) -> Dict[str, Any]:
        try:
            if res.name:
                st = os.stat(res.name, dir_fd=res.parent, follow_symlinks=False)
            else:
                st = os.fstat(res.parent)
        except OSError as exc:
            raise _os_error(exc, "stat", res.path) from None
        return self._entry(res.path, st)

    # -- owner and mode -----------------------------------------------------------------------

    def _set_owner_mode(
        self, fd: int, uid: Optional[int], gid: Optional[int], mode: Optional[int]
    ) -> None:
        """Give what ``fd`` names to sandbox ids ``uid``/``gid`` and set ``mode`` (umask
        ignored). Without the right to change owners (rootless), owners are left as they are."""
        if stat.S_ISLNK(os.fstat(fd).st_mode):  # swapped for a symlink meanwhile: never follow
            raise OSError(errno.ELOOP, "symbolic link")
        proc = f"/proc/self/fd/{fd}"
        if (uid is not None or gid is not None) and self.ids.can_chown:
            host_uid, host_gid = self.ids.outside(
                uid if uid is not None else 0, gid if gid is not None else 0
            )
            if (uid is not None and host_uid is None) or (gid is not None and host_gid is None):
                raise VolumeError(400, "invalid_request", "uid or gid outside the sandbox's ids")
            os.chown(
                proc,
                host_uid if uid is not None and host_uid is not None else -1,
                host_gid if gid is not None and host_gid is not None else -1,
            )
        if mode is not None:
            os.chmod(proc, mode & 0o7777)

    def _mkdir_at(
        self, parent: int, name: str, mode: int, uid: int, gid: int, *, exist_ok: bool
    ) -> bool:
        """Make directory ``name`` in ``parent``; False when it existed (and ``exist_ok``)."""
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            if exist_ok:
                return False
            raise
        fd = os.open(name, _PATH_FLAGS, dir_fd=parent)
        try:
            self._set_owner_mode(fd, uid, gid, mode)
        finally:
            os.close(fd)
        return True

    # -- operations ---------------------------------------------------------------------------

    def stat(self, path: str) -> Dict[str, Any]:
        """The entry at ``path`` (a symlink itself, reported with its target's type)."""
        path = clean_path(path)
        res = self._resolve(path, follow=False)
        try:
            return self._stat_entry(res)
        finally:
            res.close()

    def list_dir(self, path: str, depth: int) -> List[Dict[str, Any]]:
        """The entries under directory ``path``, ``depth`` levels deep, each directory's entries
        sorted by name and followed by its own (symlinked directories are not entered).

        Raises:
            VolumeError: 400 for a depth above :data:`MAX_DEPTH` or a path that is not a
                directory, 404 for a missing one.
        """
        path = clean_path(path)
        depth = max(depth, 1)
        if depth > MAX_DEPTH:
            raise VolumeError(
                400, "depth_out_of_range", f"depth must be between 1 and {MAX_DEPTH}"
            )
        res = self._resolve(path, follow=True)
        try:
            fd = self._open_final(res, _DIR_FLAGS)
        except OSError as exc:
            raise _os_error(exc, "list directory", path) from None
        finally:
            res.close()
        try:
            return list(self._walk(fd, res.path, depth))
        finally:
            os.close(fd)

    def _walk(self, fd: int, path: str, depth: int) -> Iterator[Dict[str, Any]]:
        for name in sorted(os.listdir(fd)):
            child = posixpath.join(path, name)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while listing
            yield self._entry(child, st)
            if depth > 1 and stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                try:
                    yield from self._walk(sub, child, depth - 1)
                finally:
                    os.close(sub)

    def make_dir(
        self,
        path: str,
        *,
        uid: Optional[int],
        gid: Optional[int],
        mode: Optional[int],
        force: bool,
    ) -> Dict[str, Any]:
        """Make directory ``path``; with ``force``, its missing parents too, and an existing
        directory is no error. 409 when it exists otherwise."""
        path = clean_path(path)
        owner = _owner(uid, gid)
        res = self._resolve(path, follow=False, create_parents=owner if force else None)
        try:
            if not res.name:
                if force:
                    return self._stat_entry(res)
                raise _already_exists("failed to create directory", path)
            mode = mode if mode is not None else DEFAULT_DIR_MODE
            try:
                self._mkdir_at(res.parent, res.name, mode, *owner, exist_ok=force)
            except OSError as exc:
                raise _os_error(exc, "failed to create directory", path) from None
            entry = self._stat_entry(res)
            if entry["type"] != "directory":
                raise _already_exists("failed to create directory", path)
            return entry
        finally:
            res.close()

    def open_write(
        self,
        path: str,
        *,
        uid: Optional[int],
        gid: Optional[int],
        mode: Optional[int],
        force: bool,
    ) -> Tuple[int, str]:
        """Open ``path`` to write a new file: ``(descriptor, volume path)``. Without ``force``
        an existing file is 409; with it the file is truncated and missing parents made."""
        path = clean_path(path)
        res = self._resolve(path, follow=True, create_parents=_owner(uid, gid) if force else None)
        try:
            if not res.name:
                raise VolumeError(400, "invalid_request", "cannot write to the volume's root")
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            flags |= os.O_TRUNC if force else os.O_EXCL
            try:
                fd = os.open(res.name, flags, 0o600, dir_fd=res.parent)
            except OSError as exc:
                raise _os_error(exc, "failed to open file for create", path) from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise VolumeError(400, "invalid_request", f"'{path}' is not a regular file")
                os.set_blocking(fd, True)
            except BaseException:
                os.close(fd)
                raise
            return fd, res.path
        finally:
            res.close()

    def finish_write(
        self,
        fd: int,
        path: str,
        *,
        uid: Optional[int],
        gid: Optional[int],
        mode: Optional[int],
    ) -> Dict[str, Any]:
        """Sync, own and chmod a written file (E2B's defaults where not given); its entry."""
        try:
            os.fsync(fd)
            self._set_owner_mode(
                fd, *_owner(uid, gid), mode if mode is not None else DEFAULT_FILE_MODE
            )
            return self._entry(path, os.fstat(fd))
        except OSError as exc:
            raise _os_error(exc, "failed to write file", path) from None

    def open_read(self, path: str) -> Tuple[int, int]:
        """Open the regular file at ``path`` (symlinks followed inside the volume):
        ``(descriptor, size)``. 400 for a directory or anything but a regular file."""
        path = clean_path(path)
        res = self._resolve(path, follow=True)
        try:
            fd = self._open_final(res, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise _os_error(exc, "failed to open file", path) from None
        finally:
            res.close()
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise VolumeError(400, "invalid_request", f"'{path}' is not a regular file")
        os.set_blocking(fd, True)
        return fd, st.st_size

    def update(
        self, path: str, *, uid: Optional[int], gid: Optional[int], mode: Optional[int]
    ) -> Dict[str, Any]:
        """Change the owner and/or mode of what ``path`` names (symlinks followed inside the
        volume, as ``chmod`` does); its entry."""
        path = clean_path(path)
        res = self._resolve(path, follow=True)
        try:
            try:
                fd = self._open_final(res)
            except OSError as exc:
                raise _os_error(exc, "failed to update", path) from None
            try:
                self._set_owner_mode(fd, uid, gid, mode)
                return self._entry(res.path, os.fstat(fd))
            except OSError as exc:
                raise _os_error(exc, "failed to update", path) from None
            finally:
                os.close(fd)
        finally:
            res.close()

    def remove(self, path: str) -> None:
        """Remove what ``path`` names: a file, a symlink (not its target) or a whole directory.
        400 for the volume's root, 404 when missing."""
        path = clean_path(path)
        if path == "/":
            raise VolumeError(400, "cannot_delete_root", "cannot delete the volume's root")
        res = self._resolve(path, follow=False)
        try:
            if not res.name:
                raise VolumeError(400, "cannot_delete_root", "cannot delete the volume's root")
            try:
                st = os.stat(res.name, dir_fd=res.parent, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    _remove_tree_at(res.parent, res.name)
                else:
                    os.unlink(res.name, dir_fd=res.parent)
            except OSError as exc:
                raise _os_error(exc, "failed to delete path", path) from None
        finally:
            res.close()


def _remove_tree_at(parent: int, name: str) -> None:
    """Remove directory ``name`` of ``parent`` with everything in it, never following a
    symlink (each level opened with ``O_NOFOLLOW`` relative to the one above)."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        for child in os.listdir(fd):
            try:
                st = os.stat(child, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                _remove_tree_at(fd, child)
            else:
                try:
                    os.unlink(child, dir_fd=fd)
                except FileNotFoundError:
                    pass
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
