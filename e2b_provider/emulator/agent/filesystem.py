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
    "os_rpc_error",
    "read_metadata",
    "remove",
    "rfc3339",
    "stat_path",
    "eval_symlinks",
    "go_base",
    "validate_metadata",
    "write_metadata_fd",
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
    """The ``user.e2b.*`` xattrs of ``path`` (prefix stripped; symlinks followed).

    Empty when there are none or the filesystem has no xattrs; entries that are not valid
    UTF-8 are skipped, as envd does.
    """
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
            key = name[len(METADATA_PREFIX) :]
            key.encode("utf-8")
            out[key] = value.decode("utf-8")
        except (OSError, UnicodeError):
            continue
    return out


def validate_metadata(meta: Mapping[str, str]) -> Dict[str, str]:
    """Check metadata as envd does: printable ASCII, key length, total size.

    Keys must already be lower-cased (``X-Metadata-*`` header names are).

    Raises:
        RpcError: ``invalid_argument`` with envd's message for the first problem found.
    """
    total = 0
    for key, value in meta.items():
        if not key:
            raise RpcError("invalid_argument", "metadata key must not be empty")
        raw_key = key.encode("utf-8", "surrogateescape")
        if len(raw_key) > _MAX_METADATA_KEY:
            raise RpcError(
                "invalid_argument",
                f"metadata key {_go_quote(key)} exceeds {_MAX_METADATA_KEY} bytes",
            )
        _check_printable("key", raw_key)
        raw_value = value.encode("utf-8", "surrogateescape")
        _check_printable(f"value for key {_go_quote(key)}", raw_value)
        total += len(METADATA_PREFIX) + len(raw_key) + len(raw_value)
    if total > _MAX_METADATA_TOTAL:
        raise RpcError(
            "invalid_argument", f"total metadata size {total} exceeds {_MAX_METADATA_TOTAL} bytes"
        )
    return dict(meta)


def _go_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _check_printable(label: str, raw: bytes) -> None:
    for i, c in enumerate(raw):
        if c < 0x20 or c > 0x7E:
            raise RpcError(
                "invalid_argument",
                f"metadata {label} contains non-printable-ASCII byte 0x{c:02x} at offset {i}",
            )


def write_metadata_fd(fd: int, meta: Mapping[str, str]) -> None:
    """Replace the ``user.e2b.*`` xattrs of an open file with ``meta`` (already validated).

    An empty ``meta`` clears them, so an overwrite does not keep a previous upload's.

    Raises:
        OSError: the filesystem refused (e.g. no xattr support, no space).
    """
    for name in os.listxattr(fd):
        if name.startswith(METADATA_PREFIX) and name[len(METADATA_PREFIX) :] not in meta:
            try:
                os.removexattr(fd, name)
            except OSError as exc:
                if exc.errno != errno.ENODATA:
                    raise
    for key, value in meta.items():
        os.setxattr(fd, METADATA_PREFIX + key, value.encode("ascii"))


def go_base(path: str) -> str:
    """Go's ``filepath.Base``: the last element, trailing slashes ignored (``/``, ``.``)."""
    if not path:
        return "."
    stripped = path.rstrip("/")
    return posixpath.basename(stripped) if stripped else "/"


class TooManyLinks(OSError):
    """Go's ``EvalSymlinks: too many links`` (more than 255 symlinks on the way)."""

    def __init__(self) -> None:
        super().__init__(errno.ELOOP, "EvalSymlinks: too many links")

    def __str__(self) -> str:
        return "EvalSymlinks: too many links"


def eval_symlinks(path: str) -> str:
    """Go's ``filepath.EvalSymlinks``: ``path`` with every symlink resolved, cleaned.

    Each component is ``lstat``-ed; a link's text replaces it (an absolute one restarts from
    ``/``), ``..`` drops the previous component lexically. ``/proc`` magic links whose text is
    not a path (``pipe:[…]``) therefore fail, as in Go.

    Raises:
        OSError: a component is missing (``ENOENT``), a non-directory has more path after it
            (``ENOTDIR``), or :class:`TooManyLinks`.
    """
    vol_len = 1 if path.startswith("/") else 0
    dest = path[:vol_len]
    links = 0
    start = end = vol_len
    while start < len(path):
        while start < len(path) and path[start] == "/":
            start += 1
        end = start
        while end < len(path) and path[end] != "/":
            end += 1
        part = path[start:end]
        if not part:
            break
        if part == ".":
            start = end
            continue
        if part == "..":
            r = dest.rfind("/", vol_len)
            if r < vol_len or dest[r + 1 :] == "..":
                if len(dest) > vol_len:
                    dest += "/"
                dest += ".."
            else:
                dest = dest[:r]
            start = end
            continue
        if dest and not dest.endswith("/"):
            dest += "/"
        dest += part
        st = os.lstat(dest)
        if not stat.S_ISLNK(st.st_mode):
            if not stat.S_ISDIR(st.st_mode) and end < len(path):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), dest)
            start = end
            continue
        links += 1
        if links > 255:
            raise TooManyLinks()
        link = os.readlink(dest)
        path = link + path[end:]
        if link.startswith("/"):
            dest = "/"
            vol_len = 1
            start = end = 1
        else:
            r = dest.rfind("/", vol_len)
            dest = dest[:vol_len] if r < vol_len else dest[:r]
            start = end = 0
    return posixpath.normpath(dest) if dest else "."


def entry_info(path: str) -> Dict[str, Any]:
    """envd's ``EntryInfo`` JSON for ``path`` (lstat; a symlink reports its target's type).

    For a symlink (shared ``filesystem.GetEntryInfo``), ``symlinkTarget`` is the fully
    resolved path (``path`` itself when it cannot be resolved: dangling, a loop, a non-path
    magic link), ``type`` and ``mode`` are the final target's (omitted when it does not
    resolve); ``size``, ``permissions``, owner, group and time are the link's own. envd
    0.6.13's ``EntryInfo`` has no ``is_symlink``: only ``symlinkTarget`` tells a link apart
    (newer SDKs map a set ``isSymlink`` to ``SYMLINK``, so it must stay unset).

    Raises:
        OSError: ``lstat`` failed.
    """
    lst = os.lstat(path)
    entry: Dict[str, Any] = {"name": go_base(path)}
    target: Optional[str] = None
    ftype: Optional[str]
    if stat.S_ISLNK(lst.st_mode):
        try:
            target = eval_symlinks(path)
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
    return entry


def ensure_dirs(path: str, uid: int, gid: int) -> None:
    """Create each missing directory of ``path`` (mode 0755) and chown it to ``uid:gid``.

    Existing directories are left alone (one created concurrently is chowned too).

    Raises:
        RpcError: ``internal`` ``path is a file: …`` when a component is not a directory,
            or the stat/mkdir/chown failure.
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
                pass
            except OSError as exc:
                raise RpcError(
                    "internal",
                    "failed to create directory: " + os_error_text("mkdir", current, exc),
                ) from None
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


def os_rpc_error(exc: OSError, op: str, path: str, missing: str, other: str) -> RpcError:
    """envd's wrapping of a failed ``op`` on ``path``: ``not_found`` with the ``missing``
    prefix for ENOENT, else ``internal`` with the ``other`` prefix."""
    detail = os_error_text(op, path, exc)
    if isinstance(exc, FileNotFoundError):
        return RpcError("not_found", f"{missing}: {detail}")
    return RpcError("internal", f"{other}: {detail}")


def _entry_or_error(path: str) -> Dict[str, Any]:
    try:
        return entry_info(path)
    except OSError as exc:
        raise os_rpc_error(
            exc, "lstat", path, "file not found", "error getting file info"
        ) from None


def stat_path(path: str) -> Dict[str, Any]:
    """``Stat``: ``{"entry": EntryInfo}``.

    Raises:
        RpcError: ``not_found`` for a missing path, ``internal`` for other failures.
    """
    return {"entry": _entry_or_error(path)}


def _resolve_dir(path: str) -> str:
    try:
        resolved = eval_symlinks(path)
    except TooManyLinks:
        raise RpcError(
            "failed_precondition", f'cyclic symlink or chain >255 links at "{path}"'
        ) from None
    except FileNotFoundError as exc:
        raise RpcError(
            "not_found", "path not found: " + os_error_text("lstat", exc.filename or path, exc)
        ) from None
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            raise RpcError("internal", "error resolving symlink: not a directory") from None
        raise RpcError(
            "internal",
            "error resolving symlink: " + os_error_text("lstat", exc.filename or path, exc),
        ) from None
    try:
        st = os.stat(resolved)
    except OSError as exc:
        raise os_rpc_error(
            exc, "stat", resolved, "directory not found", "error getting file info"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise RpcError("invalid_argument", f"path is not a directory: {resolved}")
    return resolved


def list_dir(path: str, depth: int) -> Dict[str, Any]:
    """``ListDir``: entries under ``path`` (a symlinked dir is followed) to ``depth`` levels.

    Entries are in lexical depth-first order, like Go's ``filepath.WalkDir``; symlinks inside
    the tree are not followed. Each entry's ``path`` is under the requested ``path`` (not
    the resolved one). ``depth`` 0 means 1.

    Raises:
        RpcError: ``not_found``, ``failed_precondition`` (symlink loop), ``invalid_argument``
            (not a directory) or ``internal``.
    """
    depth = depth or 1
    resolved = _resolve_dir(path)
    entries: List[Dict[str, Any]] = []

    def walk(directory: str, rel: str, level: int) -> None:
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            raise RpcError(
                "internal",
                f"error reading directory {resolved}: " + os_error_text("open", directory, exc),
            ) from None
        for name in names:
            child = posixpath.join(directory, name)
            child_rel = posixpath.join(rel, name) if rel else name
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
            info["path"] = posixpath.normpath(posixpath.join(path, child_rel))
            entries.append(info)
            if is_dir and level < depth:
                walk(child, child_rel, level + 1)

    walk(resolved, "", 1)
    return {"entries": entries}


def make_dir(path: str, user: UserInfo) -> Dict[str, Any]:
    """``MakeDir``: create ``path`` and missing parents, owned by ``user``.

    Returns:
        ``{"entry": EntryInfo}`` of the new directory.

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
    return stat_path(path)


def remove(path: str) -> Dict[str, Any]:
    """``Remove`` (Go's ``os.RemoveAll``): a file, symlink or whole tree; missing is fine.

    Raises:
        RpcError: ``internal`` when something could not be removed (also for a path ending
            in ``/.`` and for a path below a file).
    """
    if path == "." or path.endswith("/."):
        raise RpcError(
            "internal", f"error removing file or directory: RemoveAll {path}: invalid argument"
        )
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        name = exc.filename if isinstance(exc.filename, str) else path
        raise RpcError(
            "internal", "error removing file or directory: " + os_error_text("unlinkat", name, exc)
        ) from None
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        name = exc.filename if isinstance(exc.filename, str) else path
        raise RpcError(
            "internal", "error removing file or directory: " + os_error_text("unlinkat", name, exc)
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
