"""Filesystem side of the emulator's envd look-alike agent (``filesystem.Filesystem`` RPCs).

This module owns envd 0.6.13's ``EntryInfo`` (Go ``FileMode`` strings, proto3 JSON with
int64 sizes as strings, RFC 3339 times, symlink type/target, ``user.e2b.*`` metadata
xattrs), the ``Stat``/``ListDir``/``MakeDir``/``Remove``/``Move`` operations with envd's
error codes and messages, and ``ensure_dirs`` (create missing parents one level at a time,
mode 0755, owned by the requesting user), which ``/files`` uploads share. The agent runs as
root, like envd: the user only decides ownership of what is created and how relative paths
resolve. Functions here are synchronous (the agent runs them in a worker thread) and take
already-resolved absolute paths. It imports no aiohttp/requests/urllib3/socket.
"""

from __future__ import annotations

import datetime
import errno
import os
import posixpath
import shutil
import stat
from typing import Any, Dict, List, Mapping, Optional

from .rpc import RpcError, UserInfo, errno_text, group_name, os_error_text, user_name

__all__ = [
    "METADATA_PREFIX",
    "ensure_dirs",
    "entry_info",
    "go_mode_string",
    "list_dir",
    "make_dir",
    "move",
    "read_metadata",
    "remove",
    "rfc3339",
    "stat_path",
    "validate_metadata",
    "write_metadata",
]

#: xattr namespace of user metadata on files (``X-Metadata-<key>`` on upload).
METADATA_PREFIX = "user.e2b."
_MAX_METADATA_KEY = 255 - len(METADATA_PREFIX)
_MAX_METADATA_TOTAL = 4096

FILE = "FILE_TYPE_FILE"
DIRECTORY = "FILE_TYPE_DIRECTORY"

# Go os.FileMode type/permission letters, highest bit first ("dalTLDpSugct?").
_MODE_DIR = 1 << 31
_MODE_SYMLINK = 1 << 27
_MODE_DEVICE = 1 << 26
_MODE_NAMED_PIPE = 1 << 25
_MODE_SOCKET = 1 << 24
_MODE_SETUID = 1 << 23
_MODE_SETGID = 1 << 22
_MODE_CHAR_DEVICE = 1 << 21
_MODE_STICKY = 1 << 20
_LETTERS = "dalTLDpSugct?"


def _go_mode(st_mode: int) -> int:
    mode = st_mode & 0o777
    kind = stat.S_IFMT(st_mode)
    if kind == stat.S_IFBLK:
        mode |= _MODE_DEVICE
    elif kind == stat.S_IFCHR:
        mode |= _MODE_DEVICE | _MODE_CHAR_DEVICE
    elif kind == stat.S_IFDIR:
        mode |= _MODE_DIR
    elif kind == stat.S_IFIFO:
        mode |= _MODE_NAMED_PIPE
    elif kind == stat.S_IFLNK:
        mode |= _MODE_SYMLINK
    elif kind == stat.S_IFSOCK:
        mode |= _MODE_SOCKET
    if st_mode & stat.S_ISGID:
        mode |= _MODE_SETGID
    if st_mode & stat.S_ISUID:
        mode |= _MODE_SETUID
    if st_mode & stat.S_ISVTX:
        mode |= _MODE_STICKY
    return mode


def go_mode_string(st_mode: int) -> str:
    """Go's ``os.FileMode.String()`` of a stat mode, e.g. ``-rw-r--r--``, ``drwxrwxrwt``."""
    mode = _go_mode(st_mode)
    out = [c for i, c in enumerate(_LETTERS) if mode & (1 << (31 - i))]
    if not out:
        out.append("-")
    for i, c in enumerate("rwxrwxrwx"):
        out.append(c if mode & (1 << (8 - i)) else "-")
    return "".join(out)


def rfc3339(ns: int) -> str:
    """A protobuf JSON ``Timestamp``: UTC, ``Z``, 0/3/6/9 fractional digits."""
    sec, nanos = divmod(ns, 1_000_000_000)
    base = datetime.datetime.fromtimestamp(sec, tz=datetime.timezone.utc)
    text = base.strftime("%Y-%m-%dT%H:%M:%S")
    if nanos == 0:
        frac = ""
    elif nanos % 1_000_000 == 0:
        frac = f".{nanos // 1_000_000:03d}"
    elif nanos % 1_000 == 0:
        frac = f".{nanos // 1_000:06d}"
    else:
        frac = f".{nanos:09d}"
    return f"{text}{frac}Z"


def _file_type(st_mode: int) -> Optional[str]:
    if stat.S_ISREG(st_mode):
        return FILE
    if stat.S_ISDIR(st_mode):
        return DIRECTORY
    return None


def read_metadata(path: str) -> Dict[str, str]:
    """The ``user.e2b.*`` xattrs of ``path`` (prefix stripped); empty when none or unsupported."""
    out: Dict[str, str] = {}
    try:
        names = os.listxattr(path)
    except OSError:
        return out
    for name in names:
        if not name.startswith(METADATA_PREFIX):
            continue
        try:
            value = os.getxattr(path, name)
        except OSError:
            continue
        out[name[len(METADATA_PREFIX) :]] = value.decode("utf-8", "replace")
    return out


def validate_metadata(meta: Mapping[str, str]) -> Dict[str, str]:
    """Lower-case keys and check printable ASCII, key length and total size.

    Raises:
        RpcError: ``invalid_argument`` describing the first problem.
    """
    out: Dict[str, str] = {}
    total = 0
    for key, value in meta.items():
        low = key.lower()
        if not low or not _printable(low) or len(low) > _MAX_METADATA_KEY:
            raise RpcError("invalid_argument", f"invalid metadata key: {key!r}")
        if not _printable(value):
            raise RpcError("invalid_argument", f"invalid metadata value for key {low!r}")
        total += len(low) + len(value)
        out[low] = value
    if total > _MAX_METADATA_TOTAL:
        raise RpcError("invalid_argument", f"metadata exceeds {_MAX_METADATA_TOTAL} bytes")
    return out


def _printable(text: str) -> bool:
    return all(0x20 <= ord(c) < 0x7F for c in text)


def write_metadata(path: str, meta: Mapping[str, str]) -> None:
    """Replace the ``user.e2b.*`` xattrs of ``path`` with ``meta`` (already validated).

    Raises:
        OSError: the filesystem refused (e.g. no xattr support, no space).
    """
    try:
        existing = [n for n in os.listxattr(path) if n.startswith(METADATA_PREFIX)]
    except OSError:
        if not meta:
            return
        raise
    for name in existing:
        if name[len(METADATA_PREFIX) :] not in meta:
            os.removexattr(path, name)
    for key, value in meta.items():
        os.setxattr(path, METADATA_PREFIX + key, value.encode("ascii"))


def _base_name(path: str) -> str:
    stripped = path.rstrip("/")
    return posixpath.basename(stripped) if stripped else "/"


def _eval_symlinks(path: str) -> str:
    """The fully resolved path (symlinks followed); raises ``OSError`` if it does not exist."""
    os.stat(path)
    return os.path.realpath(path)


def entry_info(path: str) -> Dict[str, Any]:
    """envd's ``EntryInfo`` JSON for ``path`` (lstat; a symlink reports its target's type).

    Raises:
        OSError: ``lstat`` failed.
    """
    lst = os.lstat(path)
    entry: Dict[str, Any] = {"name": _base_name(path)}
    target: Optional[str] = None
    ftype: Optional[str]
    if stat.S_ISLNK(lst.st_mode):
        try:
            target = _eval_symlinks(path)
        except OSError:
            target = path
        try:
            tst = os.stat(target)
        except OSError:
            ftype, mode = None, 0
        else:
            ftype, mode = _file_type(tst.st_mode), tst.st_mode & 0o777
    else:
        ftype, mode = _file_type(lst.st_mode), lst.st_mode & 0o777
    if ftype is not None:
        entry["type"] = ftype
    entry["path"] = path
    if lst.st_size:
        entry["size"] = str(lst.st_size)
    if mode:
        entry["mode"] = mode
    entry["permissions"] = go_mode_string(lst.st_mode)
    entry["owner"] = user_name(lst.st_uid)
    entry["group"] = group_name(lst.st_gid)
    if lst.st_mtime_ns:
        entry["modifiedTime"] = rfc3339(lst.st_mtime_ns)
    if target is not None:
        entry["symlinkTarget"] = target
    meta = read_metadata(path)
    if meta:
        entry["metadata"] = meta
    if target is not None:
        entry["isSymlink"] = True
    return entry


def ensure_dirs(path: str, uid: int, gid: int) -> None:
    """Create each missing directory of ``path`` (mode 0755) and chown it to ``uid:gid``.

    Existing directories are left alone.

    Raises:
        RpcError: ``internal`` ``path is a file: …`` when a component is not a directory,
            or the mkdir/chown failure.
    """
    parts = [p for p in path.split("/") if p]
    current = ""
    for part in parts:
        current += "/" + part
        try:
            st = os.stat(current)
        except FileNotFoundError:
            try:
                os.mkdir(current, 0o755)
            except FileExistsError:
                st = os.stat(current)
            except OSError as exc:
                raise RpcError(
                    "internal",
                    "failed to create directory: " + os_error_text("mkdir", current, exc),
                ) from None
            else:
                try:
                    os.chown(current, uid, gid)
                except OSError as exc:
                    raise RpcError(
                        "internal",
                        "failed to chown directory: " + os_error_text("chown", current, exc),
                    ) from None
                continue
        except OSError as exc:
            raise RpcError(
                "internal", "failed to stat directory: " + os_error_text("stat", current, exc)
            ) from None
        if not stat.S_ISDIR(st.st_mode):
            raise RpcError("internal", f"path is a file: {current}")


def stat_path(path: str) -> Dict[str, Any]:
    """``Stat``: ``{"entry": EntryInfo}``.

    Raises:
        RpcError: ``not_found`` for a missing path, ``internal`` for other failures.
    """
    try:
        return {"entry": entry_info(path)}
    except FileNotFoundError as exc:
        raise RpcError(
            "not_found", "file not found: " + os_error_text("lstat", path, exc)
        ) from None
    except OSError as exc:
        raise RpcError(
            "internal", "error getting file info: " + os_error_text("lstat", path, exc)
        ) from None


def list_dir(path: str, depth: int) -> Dict[str, Any]:
    """``ListDir``: entries under ``path`` (a symlinked dir is followed) to ``depth`` levels.

    Entries are in lexical depth-first order, like Go's ``filepath.WalkDir``; symlinks inside
    the tree are not followed. ``depth`` 0 means 1.

    Raises:
        RpcError: ``not_found``, ``failed_precondition`` (symlink loop), ``invalid_argument``
            (not a directory) or ``internal``.
    """
    depth = depth or 1
    try:
        resolved = _eval_symlinks(path)
    except FileNotFoundError as exc:
        raise RpcError(
            "not_found", "path not found: " + os_error_text("lstat", path, exc)
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RpcError(
                "failed_precondition", f'cyclic symlink or chain >255 links at "{path}"'
            ) from None
        raise RpcError(
            "internal", "error resolving symlink: " + os_error_text("lstat", path, exc)
        ) from None
    if not os.path.isdir(resolved):
        raise RpcError("invalid_argument", f"path is not a directory: {resolved}")
    entries: List[Dict[str, Any]] = []

    def walk(directory: str, level: int) -> None:
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            raise RpcError(
                "internal",
                f"error reading directory {resolved}: " + os_error_text("open", directory, exc),
            ) from None
        for name in names:
            child = posixpath.join(directory, name)
            try:
                info = entry_info(child)
                is_dir = stat.S_ISDIR(os.lstat(child).st_mode)
            except FileNotFoundError:
                continue  # vanished while listing
            except OSError as exc:
                raise RpcError(
                    "internal",
                    f"error reading directory {resolved}: " + os_error_text("lstat", child, exc),
                ) from None
            entries.append(info)
            if is_dir and level < depth:
                walk(child, level + 1)

    walk(resolved, 1)
    return {"entries": entries}


def make_dir(path: str, user: UserInfo) -> Dict[str, Any]:
    """``MakeDir``: create ``path`` and missing parents, owned by ``user``.

    Raises:
        RpcError: ``already_exists`` if it is a directory already, ``invalid_argument`` if it
            exists as something else, ``internal`` for other failures.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise RpcError(
            "internal", "error getting file info: " + os_error_text("stat", path, exc)
        ) from None
    else:
        if stat.S_ISDIR(st.st_mode):
            raise RpcError("already_exists", f"directory already exists: {path}")
        raise RpcError("invalid_argument", f"path already exists but it is not a directory: {path}")
    ensure_dirs(path, user.uid, user.gid)
    return {"entry": {"name": _base_name(path), "type": DIRECTORY, "path": path}}


def remove(path: str) -> Dict[str, Any]:
    """``Remove``: delete a file, symlink or whole directory tree; a missing path is fine.

    Raises:
        RpcError: ``internal`` when something could not be removed.
    """
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError as exc:
        raise RpcError(
            "internal",
            "error removing file or directory: " + os_error_text("lstat", path, exc),
        ) from None
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise RpcError(
            "internal",
            "error removing file or directory: "
            + os_error_text("unlinkat", exc.filename or path, exc),
        ) from None
    return {}


def move(source: str, destination: str, user: UserInfo) -> Dict[str, Any]:
    """``Move``: rename ``source`` to ``destination``, creating the destination's parents.

    Raises:
        RpcError: ``not_found`` for a missing source, ``internal`` for other failures.
    """
    ensure_dirs(posixpath.dirname(destination) or "/", user.uid, user.gid)
    try:
        os.rename(source, destination)
    except FileNotFoundError as exc:
        raise RpcError(
            "not_found",
            f"source file not found: rename {source} {destination}: " + errno_text(exc),
        ) from None
    except OSError as exc:
        raise RpcError(
            "internal",
            f"error renaming: rename {source} {destination}: " + errno_text(exc),
        ) from None
    return stat_path(destination)
