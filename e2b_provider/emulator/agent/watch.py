"""Filesystem watchers of the envd look-alike agent (``WatchDir`` and the polling watchers).

envd watches directories with inotify through its fork of fsnotify; this module does the
same inside the sandbox with libc's ``inotify_init1``/``inotify_add_watch`` (ctypes), and
reproduces what a client sees:

* events ``EVENT_TYPE_CREATE`` (``IN_CREATE``, ``IN_MOVED_TO``), ``EVENT_TYPE_WRITE``
  (``IN_MODIFY``), ``EVENT_TYPE_REMOVE`` (``IN_DELETE``, and ``IN_DELETE_SELF`` of the watched
  directory itself), ``EVENT_TYPE_RENAME`` (``IN_MOVED_FROM``, ``IN_MOVE_SELF`` of the
  watched directory) and ``EVENT_TYPE_CHMOD`` (``IN_ATTRIB``), one message per kind in that
  order, named relative to the watched path (``.`` for the directory itself);
* recursive watches: every directory below is watched, a directory created (or moved in)
  later is watched at once and what it already holds is reported as created; a directory
  moved within the tree keeps its watches under the new name;
* ``includeEntry``: create/write/chmod events carry the entry's ``EntryInfo`` when it can
  still be read;
* errors end a watcher with envd's ``watcher error: …`` (a kernel queue overflow, or more
  than :data:`MAX_PENDING` undelivered events: ``fsnotify: queue or buffer overflow``).

Two deliberate differences from envd: one inotify instance serves all watchers of the agent
(the per-user instance limit is small and shared), and a directory that vanishes while it is
being added to a recursive watch is skipped instead of ending the watch. Watchers are
removed when their stream ends, on ``RemoveWatcher`` and when the agent stops.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import errno
import logging
import os
import posixpath
import secrets
import stat
import string
import struct
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from .filesystem import entry_info, os_rpc_error
from .rpc import RpcError, errno_text

__all__ = [
    "MAX_PENDING",
    "InotifyHub",
    "Watcher",
    "WatcherRegistry",
    "check_watch_path",
]

log = logging.getLogger(__name__)

#: Undelivered events one watcher may hold before it ends with an overflow error.
MAX_PENDING = 10_000

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ISDIR = 0x40000000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
WATCH_MASK = (
    IN_CREATE
    | IN_MODIFY
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVED_TO
    | IN_MOVED_FROM
    | IN_MOVE_SELF
    | IN_ATTRIB
)
_EVENT = struct.Struct("iIII")

CREATE = "EVENT_TYPE_CREATE"
WRITE = "EVENT_TYPE_WRITE"
REMOVE = "EVENT_TYPE_REMOVE"
RENAME = "EVENT_TYPE_RENAME"
CHMOD = "EVENT_TYPE_CHMOD"
_WITH_ENTRY = (CREATE, WRITE, CHMOD)
OVERFLOW = "fsnotify: queue or buffer overflow"

# Filesystem magic numbers of network mounts (linux/magic.h): NFS, CIFS, SMB, SMB2, FUSE.
_NETWORK_FS = frozenset({0x6969, 0xFF534D42, 0x517B, 0xFE534D42, 0x65735546})

_libc = ctypes.CDLL(None, use_errno=True)


def _os_error(what: str = "") -> OSError:
    err = ctypes.get_errno()
    return OSError(err, os.strerror(err), what or None)


def _statfs_type(path: str) -> int:
    buf = ctypes.create_string_buffer(256)
    if _libc.statfs(os.fsencode(path), buf) != 0:
        raise _os_error(path)
    return int(struct.unpack_from("l", buf.raw, 0)[0]) & 0xFFFFFFFF


def check_watch_path(path: str, allow_network_mounts: bool) -> None:
    """envd's checks before watching: an existing directory, not on a network mount.

    Raises:
        RpcError: ``not_found``, ``invalid_argument`` or ``internal`` with envd's messages.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        raise os_rpc_error(
            exc, "stat", path, f"path {path} not found", f"error statting path {path}"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        # envd formats a nil error here, hence the odd suffix
        raise RpcError("invalid_argument", f"path {path} not a directory: %!w(<nil>)")
    if not allow_network_mounts:
        try:
            fs_type = _statfs_type(path)
        except OSError as exc:
            raise RpcError(
                "internal",
                f"error checking mount status: failed to statfs {path}: {errno_text(exc)}",
            ) from None
        if fs_type in _NETWORK_FS:
            raise RpcError("invalid_argument", f"cannot watch path on network filesystem: {path}")


class InotifyHub:
    """One inotify instance for the whole agent, shared by every :class:`Watcher`.

    Watches are reference-counted per watch descriptor: two watchers of one directory share
    the kernel watch, which is removed when the last of them lets go.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise _os_error()
        self._fd = fd
        self._loop = loop
        self._subs: Dict[int, Set[Watcher]] = {}
        loop.add_reader(fd, self._on_readable)

    def add(self, path: str, watcher: Watcher) -> int:
        """Watch ``path`` for ``watcher``; its watch descriptor.

        Raises:
            OSError: ``inotify_add_watch`` failed (missing path, watch limit, …).
        """
        wd = _libc.inotify_add_watch(self._fd, os.fsencode(path), WATCH_MASK)
        if wd < 0:
            raise _os_error()
        self._subs.setdefault(wd, set()).add(watcher)
        return int(wd)

    def release(self, wd: int, watcher: Watcher) -> None:
        """``watcher`` no longer needs ``wd``; the kernel watch goes with the last user."""
        subs = self._subs.get(wd)
        if subs is None:
            return
        subs.discard(watcher)
        if not subs:
            del self._subs[wd]
            _libc.inotify_rm_watch(self._fd, wd)  # EINVAL when the kernel dropped it already

    def _on_readable(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            except OSError as exc:
                log.warning("inotify read failed: %s", exc)
                return
            if not data:
                return
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size
            raw = data[offset : offset + length].split(b"\0", 1)[0]
            offset += length
            name = raw.decode("utf-8", "replace")
            if mask & IN_Q_OVERFLOW:
                for subs in list(self._subs.values()):
                    for watcher in list(subs):
                        watcher.fail(OVERFLOW)
                continue
            for watcher in list(self._subs.get(wd, ())):
                watcher.handle(wd, mask, cookie, name)
            if mask & IN_IGNORED:
                self._subs.pop(wd, None)  # the kernel dropped it: the number may be reused

    def close(self) -> None:
        """Stop reading and close the inotify instance."""
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._subs.clear()


class _Node:
    """One watched directory of a watcher (fsnotify's ``watch``)."""

    __slots__ = ("by_user", "path", "recursive", "wd")

    def __init__(self, wd: int, path: str, recursive: bool, by_user: bool) -> None:
        self.wd = wd
        self.path = path
        self.recursive = recursive
        self.by_user = by_user


def _ops(mask: int) -> List[str]:
    """envd's event kinds of one inotify mask, in envd's order."""
    ops = []
    if mask & (IN_CREATE | IN_MOVED_TO):
        ops.append(CREATE)
    if mask & (IN_MOVE_SELF | IN_MOVED_FROM):
        ops.append(RENAME)
    if mask & IN_ATTRIB:
        ops.append(CHMOD)
    if mask & IN_MODIFY:
        ops.append(WRITE)
    if mask & (IN_DELETE_SELF | IN_DELETE):
        ops.append(REMOVE)
    return ops


_VANISHED = (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.EPERM)


class Watcher:
    """One directory watch: inotify events in, envd ``FilesystemEvent`` messages out.

    Args:
        hub: the agent's inotify instance.
        watch_path: the resolved directory (names are relative to it).
        recursive: watch the whole tree.
        include_entry: attach ``EntryInfo`` to create/write/chmod events.
        on_event: called with each event message.
        on_error: called once with the error text that ends the watcher.
    """

    def __init__(
        self,
        hub: InotifyHub,
        watch_path: str,
        recursive: bool,
        include_entry: bool,
        on_event: Callable[[Dict[str, Any]], None],
        on_error: Callable[[str], None],
    ) -> None:
        self._hub = hub
        self.watch_path = watch_path
        self.recursive = recursive
        self.include_entry = include_entry
        self._on_event = on_event
        self._on_error = on_error
        self._nodes: Dict[int, _Node] = {}
        self._paths: Dict[str, int] = {}
        self._cookies: Deque[Tuple[int, str]] = collections.deque(maxlen=10)
        self.closed = False

    # ---- setup and teardown -------------------------------------------------------------

    def start(self) -> None:
        """Add the watches (the whole tree when recursive).

        Raises:
            RpcError: ``internal`` ``error adding path … to watcher: …``.
        """
        root = posixpath.normpath(self.watch_path)
        try:
            self._register(root, recursive=self.recursive, by_user=True)
            if self.recursive:
                self._add_below(root, None, strict=True)
        except OSError as exc:
            self.close()
            raise RpcError(
                "internal", f"error adding path {self.watch_path} to watcher: {_err_text(exc)}"
            ) from None

    def _register(self, path: str, recursive: bool, by_user: bool) -> None:
        wd = self._hub.add(path, self)
        if wd in self._nodes:
            return  # already watched under another name (a moved directory)
        self._nodes[wd] = _Node(wd, path, recursive, by_user)
        self._paths[path] = wd

    @staticmethod
    def _children(directory: str, strict: bool) -> List[Tuple[str, bool]]:
        try:
            with os.scandir(directory) as it:
                found = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError as exc:
            if not strict and exc.errno in _VANISHED:
                return []
            raise
        return [(posixpath.join(directory, name), is_dir) for name, is_dir in sorted(found)]

    def _add_below(self, root: str, created: Optional[List[str]], strict: bool) -> None:
        """Watch every directory below ``root``, depth first in lexical order (Go's
        ``filepath.WalkDir``), appending every path below to ``created``."""
        stack = [iter(self._children(root, strict))]
        while stack:
            item = next(stack[-1], None)
            if item is None:
                stack.pop()
                continue
            child, is_dir = item
            if created is not None:
                created.append(child)
            if not is_dir:
                continue
            try:
                self._register(child, recursive=True, by_user=False)
            except OSError as exc:
                if exc.errno in _VANISHED:
                    continue  # gone (or unreadable) meanwhile: skipped
                raise
            stack.append(iter(self._children(child, strict=False)))

    def _forget(self, node: _Node) -> None:
        self._nodes.pop(node.wd, None)
        if self._paths.get(node.path) == node.wd:
            del self._paths[node.path]
        self._hub.release(node.wd, self)

    def _remove_tree(self, node: _Node) -> None:
        self._forget(node)
        if node.recursive:
            prefix = node.path
            for other in [n for n in self._nodes.values() if n.path.startswith(prefix)]:
                self._forget(other)

    def close(self) -> None:
        """Drop every watch (idempotent)."""
        self.closed = True
        for node in list(self._nodes.values()):
            self._forget(node)

    def fail(self, message: str) -> None:
        """End the watcher with ``watcher error: <message>``."""
        if self.closed:
            return
        self.close()
        self._on_error(f"watcher error: {message}")

    # ---- events -----------------------------------------------------------------------

    def handle(self, wd: int, mask: int, cookie: int, raw_name: str) -> None:
        """Turn one inotify event into envd events (fsnotify's rules)."""
        node = self._nodes.get(wd)
        if node is None or self.closed:
            return
        name = node.path + "/" + raw_name if raw_name else node.path
        if mask & (IN_IGNORED | IN_UNMOUNT):
            self._forget(node)
            return
        if mask & IN_DELETE_SELF:
            self._forget(node)
        if mask & IN_MOVE_SELF:
            if node.recursive and not node.by_user:
                return
            self._remove_tree(node)
            if node.recursive:
                self._send(node.path, [RENAME])
                return
        if mask & IN_DELETE_SELF and posixpath.dirname(node.path) in self._paths:
            return  # the parent's IN_DELETE reports it
        ops = _ops(mask)
        renamed_from = ""
        if cookie:
            if mask & IN_MOVED_FROM:
                self._cookies.append((cookie, name))
            elif mask & IN_MOVED_TO:
                renamed_from = next((p for c, p in self._cookies if c == cookie), "")
        created: List[str] = []
        if node.recursive and mask & IN_ISDIR and CREATE in ops:
            try:
                created = self._new_directory(node, name, renamed_from)
            except OSError as exc:
                self.fail(_err_text(exc))
                return
        self._send(name, ops)
        for path in created:
            self._send(path, [CREATE])

    def _new_directory(self, parent: _Node, name: str, renamed_from: str) -> List[str]:
        """Watch a directory that appeared in a recursive watch; what it already holds.

        A directory moved within the tree keeps its watches, renamed; one created or moved in
        from outside is walked, and everything in it is reported as created.
        """
        try:
            self._register(name, recursive=True, by_user=False)
        except OSError as exc:
            if exc.errno in _VANISHED:
                return []
            raise
        if renamed_from:
            for node in self._nodes.values():
                if node.wd == parent.wd or node.path == name:
                    continue
                if node.path == renamed_from or node.path.startswith(renamed_from + "/"):
                    old = node.path
                    node.path = name + node.path[len(renamed_from) :]
                    if self._paths.get(old) == node.wd:
                        del self._paths[old]
                    self._paths[node.path] = node.wd
            return []
        created: List[str] = []
        self._add_below(name, created, strict=False)
        return created

    def _send(self, path: str, ops: List[str]) -> None:
        if not ops or self.closed:
            return
        rel = posixpath.relpath(path, self.watch_path)
        for op in ops:
            event: Dict[str, Any] = {"name": rel, "type": op}
            if self.include_entry and op in _WITH_ENTRY:
                try:
                    event["entry"] = entry_info(path)
                except OSError:
                    pass  # gone already: the event carries no entry
            self._on_event(event)
            if self.closed:
                return


def _err_text(exc: OSError) -> str:
    """Go's text: ``open <dir>: <reason>`` for a directory read, else the errno's text."""
    if exc.filename:
        return f"open {exc.filename}: {errno_text(exc)}"
    return errno_text(exc)


_ID_ALPHABET = string.ascii_lowercase + string.digits


class _Polled:
    """A polling watcher: its events wait in memory until ``GetWatcherEvents``."""

    def __init__(self) -> None:
        self.events: List[Dict[str, Any]] = []
        self.error: Optional[str] = None
        self.watcher: Optional[Watcher] = None

    def on_event(self, event: Dict[str, Any]) -> None:
        if len(self.events) >= MAX_PENDING:
            assert self.watcher is not None
            self.watcher.fail(OVERFLOW)
            return
        self.events.append(event)

    def on_error(self, message: str) -> None:
        self.error = message


class WatcherRegistry:
    """The agent's watchers: the shared inotify instance and the polling watchers by id."""

    def __init__(self) -> None:
        self._hub: Optional[InotifyHub] = None
        self._polled: Dict[str, _Polled] = {}

    def hub(self) -> InotifyHub:
        """The agent's inotify instance (created on first use).

        Raises:
            RpcError: ``internal`` ``error creating watcher: …``.
        """
        if self._hub is None:
            try:
                self._hub = InotifyHub(asyncio.get_running_loop())
            except OSError as exc:
                raise RpcError("internal", f"error creating watcher: {errno_text(exc)}") from None
        return self._hub

    def watcher(
        self,
        path: str,
        recursive: bool,
        include_entry: bool,
        on_event: Callable[[Dict[str, Any]], None],
        on_error: Callable[[str], None],
    ) -> Watcher:
        """A started watcher of ``path`` (already checked with :func:`check_watch_path`).

        Raises:
            RpcError: it could not be set up.
        """
        watcher = Watcher(self.hub(), path, recursive, include_entry, on_event, on_error)
        watcher.start()
        return watcher

    def create(self, path: str, recursive: bool, include_entry: bool) -> str:
        """``CreateWatcher``: a polling watcher's id (``w`` + 20 characters)."""
        polled = _Polled()
        polled.watcher = self.watcher(
            path, recursive, include_entry, polled.on_event, polled.on_error
        )
        watcher_id = "w" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(20))
        self._polled[watcher_id] = polled
        return watcher_id

    def _get(self, watcher_id: str) -> _Polled:
        polled = self._polled.get(watcher_id)
        if polled is None:
            raise RpcError("not_found", f"watcher with id {watcher_id} not found")
        return polled

    def events(self, watcher_id: str) -> List[Dict[str, Any]]:
        """``GetWatcherEvents``: the events since the last call (the watcher's error, if any).

        Raises:
            RpcError: ``not_found`` for an unknown id, ``internal`` once the watcher failed.
        """
        polled = self._get(watcher_id)
        if polled.error is not None:
            raise RpcError("internal", polled.error)
        events, polled.events = polled.events, []
        return events

    def remove(self, watcher_id: str) -> None:
        """``RemoveWatcher``.

        Raises:
            RpcError: ``not_found`` for an unknown id.
        """
        polled = self._get(watcher_id)
        if polled.watcher is not None:
            polled.watcher.close()
        del self._polled[watcher_id]

    def close(self) -> None:
        """Remove every watcher and close the inotify instance."""
        for polled in self._polled.values():
            if polled.watcher is not None:
                polled.watcher.close()
        self._polled.clear()
        if self._hub is not None:
            self._hub.close()
            self._hub = None
