"""Filesystem watchers of the envd look-alike agent (``WatchDir`` and the polling watchers).

envd watches directories with inotify through its fork of fsnotify (v0.0.1); this module does
the same inside the sandbox with libc's ``inotify_init1``/``inotify_add_watch`` (ctypes), and
reproduces what a client sees:

* events ``EVENT_TYPE_CREATE`` (``IN_CREATE``, ``IN_MOVED_TO``), ``EVENT_TYPE_WRITE``
  (``IN_MODIFY``), ``EVENT_TYPE_REMOVE`` (``IN_DELETE``, and ``IN_DELETE_SELF`` of the watched
  directory itself), ``EVENT_TYPE_RENAME`` (``IN_MOVED_FROM``, ``IN_MOVE_SELF`` of the
  watched directory) and ``EVENT_TYPE_CHMOD`` (``IN_ATTRIB``), one message per kind in that
  order, named relative to the watched path (``.`` for the directory itself);
* recursive watches: every directory below is watched, a directory created (or moved in)
  later is watched at once and what it already holds is reported as created (the directory's
  own event first, then each entry as Go's ``filepath.WalkDir`` meets it); a directory moved
  within the tree keeps its watches under the new name;
* ``includeEntry``: create/write/chmod events carry the entry's ``EntryInfo`` when it can
  still be read;
* errors end a watcher with envd's ``watcher error: …``.

As in envd, every watcher has **its own inotify instance** (fsnotify's ``NewWatcher``): a
kernel queue overflow (``IN_Q_OVERFLOW``) ends that watcher only, with ``watcher error:
fsnotify: queue or buffer overflow``. Instances count against the kernel's per-user limit
(``fs.inotify.max_user_instances``, 128 by default); past it a watch fails as envd's does,
``internal`` ``error creating watcher: too many open files``. On this emulator the sandboxes
of one host share that budget (their root is one unprivileged host user), where each E2B
sandbox has its own.

A ``WatchDir`` stream has no queue of its own, as in envd (whose fsnotify channel is
unbuffered): its instance is read only when the previous events have been written to the
client, so a client that reads slowly leaves events in the kernel's queue
(``fs.inotify.max_queued_events``, 16,384 by default) until it overflows; the client then gets
every event queued before the overflow, then the error.

A recursive watch ends, as fsnotify's does, when a directory appearing in the tree cannot be
watched or walked (it was removed again before the watcher got to it: ``watcher error: no
such file or directory``, or ``open <dir>: …`` when it vanished while being read); a
directory that vanishes while a recursive watch is being set up fails the set-up (``error
adding path P to watcher: …``). Directories the agent may not read are skipped (the agent's
root is not host root: host directories closed to others stay closed to it; envd, real root
in its VM, can read everything).

Two differences remain, on purpose: a polling watcher (``CreateWatcher``) keeps at most
:data:`MAX_PENDING` undelivered events and then ends with the overflow error, where envd's
slice grows without bound (the agent's memory counts against the sandbox's limit: a forgotten
watcher of a busy tree would otherwise take the sandbox's envd down with it); and a watcher
that ended with an error drops its kernel watches at once (envd's stay until
``RemoveWatcher``; nothing reads them either way). Watchers are removed when their stream
ends, on ``RemoveWatcher`` and when the agent stops.
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
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from .filesystem import entry_info, os_rpc_error
from .rpc import RpcError, errno_text

__all__ = [
    "MAX_PENDING",
    "OVERFLOW",
    "READ_BYTES",
    "Inotify",
    "WatchEnded",
    "Watcher",
    "WatcherRegistry",
    "check_watch_path",
]

log = logging.getLogger(__name__)

#: Undelivered events one polling watcher may hold before it ends with an overflow error.
MAX_PENDING = 100_000
#: One read of an inotify instance, as fsnotify's buffer (4,096 raw events).
READ_BYTES = 16 * 4096

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
#: Errors that make the agent skip a directory (it may not read it; envd as root can).
_CLOSED = (errno.EACCES, errno.EPERM)

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


class Inotify:
    """One inotify instance (non-blocking), as fsnotify's ``NewWatcher`` makes per watcher.

    Raises:
        OSError: ``inotify_init1`` failed (EMFILE past the per-user instance limit).
    """

    def __init__(self) -> None:
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise _os_error()
        self.fd = int(fd)

    def add(self, path: str) -> int:
        """Watch ``path``; its watch descriptor (the same one for a path watched already).

        Raises:
            OSError: ``inotify_add_watch`` failed (missing path, watch limit, …).
        """
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), WATCH_MASK)
        if wd < 0:
            raise _os_error()
        return int(wd)

    def remove(self, wd: int) -> None:
        """Drop one watch (EINVAL, when the kernel dropped it already, is ignored)."""
        _libc.inotify_rm_watch(self.fd, wd)

    def read(self) -> bytes:
        """What the kernel has queued, at most :data:`READ_BYTES` (``b""``: nothing now)."""
        try:
            return os.read(self.fd, READ_BYTES)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        """Close the instance (its watches go with it). Idempotent."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def raw_events(data: bytes) -> Iterator[Tuple[int, int, int, str]]:
    """The ``(wd, mask, cookie, name)`` of each inotify event in ``data``."""
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, cookie, length = _EVENT.unpack_from(data, offset)
        offset += _EVENT.size
        raw = data[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        yield wd, mask, cookie, raw.decode("utf-8", "replace")


class WatchEnded(Exception):
    """The watcher ended; ``str()`` is the text after ``watcher error: ``."""


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


class Watcher:
    """One directory watch with its own inotify instance: inotify events in, envd
    ``FilesystemEvent`` messages out.

    Args:
        watch_path: the resolved directory (names are relative to it).
        recursive: watch the whole tree.
        include_entry: attach ``EntryInfo`` to create/write/chmod events.

    Raises:
        RpcError: ``internal`` ``error creating watcher: …`` (no inotify instance).
    """

    def __init__(self, watch_path: str, recursive: bool, include_entry: bool) -> None:
        try:
            self._ino = Inotify()
        except OSError as exc:
            raise RpcError("internal", f"error creating watcher: {errno_text(exc)}") from None
        self.watch_path = watch_path
        self.recursive = recursive
        self.include_entry = include_entry
        self._nodes: Dict[int, _Node] = {}
        self._paths: Dict[str, int] = {}
        self._cookies: Deque[Tuple[int, str]] = collections.deque(maxlen=10)
        self.closed = False
        #: Called first by :meth:`close` (whoever reads the instance stops watching it).
        self.on_close: Optional[Callable[[], None]] = None

    @property
    def fd(self) -> int:
        """The inotify instance's descriptor (readable when events are queued)."""
        return self._ino.fd

    # ---- setup and teardown -------------------------------------------------------------

    def start(self) -> None:
        """Add the watches (the whole tree when recursive, as fsnotify's ``AddWith`` walks it:
        any directory that cannot be watched or read fails it, except one the agent may not
        read, which is skipped).

        Raises:
            RpcError: ``internal`` ``error adding path … to watcher: …``.
        """
        root = posixpath.normpath(self.watch_path)
        try:
            self._register(root, recursive=self.recursive, by_user=True)
            if self.recursive:
                for _ in self._walk(root, root_read_strictly=True):
                    pass
        except OSError as exc:
            self.close()
            raise RpcError(
                "internal", f"error adding path {self.watch_path} to watcher: {_err_text(exc)}"
            ) from None

    def _register(self, path: str, recursive: bool, by_user: bool) -> None:
        wd = self._ino.add(path)
        if wd in self._nodes:
            return  # already watched under another name (a moved directory)
        self._nodes[wd] = _Node(wd, path, recursive, by_user)
        self._paths[path] = wd

    @staticmethod
    def _children(directory: str) -> List[Tuple[str, bool]]:
        """The entries of ``directory``, sorted by name (``os.ReadDir``'s order).

        Raises:
            OSError: it cannot be read (``filename`` set: Go's ``open <dir>: …``).
        """
        with os.scandir(directory) as it:
            found = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        return [(posixpath.join(directory, name), is_dir) for name, is_dir in sorted(found)]

    def _walk(self, root: str, root_read_strictly: bool = False) -> Iterator[str]:
        """Watch every directory below ``root`` (already watched itself), depth first in
        lexical order (Go's ``filepath.WalkDir``), yielding every path below as it is met.

        A directory the agent may not watch or read is skipped (``root`` too, unless
        ``root_read_strictly``); any other failure raises.
        """
        try:
            first = self._children(root)
        except OSError as exc:
            if root_read_strictly or exc.errno not in _CLOSED:
                raise
            return
        stack = [iter(first)]
        while stack:
            item = next(stack[-1], None)
            if item is None:
                stack.pop()
                continue
            child, is_dir = item
            yield child
            if not is_dir:
                continue
            try:
                self._register(child, recursive=True, by_user=False)
                below = self._children(child)
            except OSError as exc:
                if exc.errno in _CLOSED:
                    continue  # the agent may not read it: skipped
                raise
            stack.append(iter(below))

    def _forget(self, node: _Node) -> None:
        self._nodes.pop(node.wd, None)
        if self._paths.get(node.path) == node.wd:
            del self._paths[node.path]
        if not self.closed:
            self._ino.remove(node.wd)

    def _remove_tree(self, node: _Node) -> None:
        self._forget(node)
        if node.recursive:
            prefix = node.path
            for other in [n for n in self._nodes.values() if n.path.startswith(prefix)]:
                self._forget(other)

    def close(self) -> None:
        """Drop every watch and the inotify instance (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.on_close is not None:
            self.on_close()
        self._nodes.clear()
        self._paths.clear()
        self._ino.close()

    # ---- events -----------------------------------------------------------------------

    def read(self) -> Iterator[Dict[str, Any]]:
        """The events of what the kernel has queued now (one read of the instance).

        Raises:
            WatchEnded: the watcher ended (overflow, or a new directory could not be
                watched); the events before it were yielded first. The watcher is closed.
        """
        if self.closed:
            return
        try:
            data = self._ino.read()
        except OSError as exc:
            self.close()
            raise WatchEnded(errno_text(exc)) from None
        for wd, mask, cookie, name in raw_events(data):
            if mask & IN_Q_OVERFLOW:
                self.close()
                raise WatchEnded(OVERFLOW)
            try:
                yield from self.handle(wd, mask, cookie, name)
            except OSError as exc:
                self.close()
                raise WatchEnded(_err_text(exc)) from None
            if self.closed:
                return

    def handle(self, wd: int, mask: int, cookie: int, raw_name: str) -> Iterator[Dict[str, Any]]:
        """Turn one inotify event into envd events (fsnotify's rules).

        Raises:
            OSError: a directory that appeared in a recursive watch could not be watched
                or walked (the events met before it were yielded).
        """
        node = self._nodes.get(wd)
        if node is None or self.closed:
            return
        name = node.path + "/" + raw_name if raw_name else node.path
        if mask & (IN_IGNORED | IN_UNMOUNT):
            self._nodes.pop(node.wd, None)
            if self._paths.get(node.path) == node.wd:
                del self._paths[node.path]
            return
        if mask & IN_DELETE_SELF:
            self._forget(node)
        if mask & IN_MOVE_SELF:
            if node.recursive and not node.by_user:
                return
            self._remove_tree(node)
            if node.recursive:
                yield from self._events(node.path, [RENAME])
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
        if node.recursive and mask & IN_ISDIR and CREATE in ops:
            yield from self._new_directory(node, name, ops, renamed_from)
            return
        yield from self._events(name, ops)

    def _new_directory(
        self, parent: _Node, name: str, ops: List[str], renamed_from: str
    ) -> Iterator[Dict[str, Any]]:
        """A directory appeared in a recursive watch: watch it, then its own event and, unless
        it was moved within the tree (its watches are renamed), an event for everything it
        already holds, each sent when the walk meets the next one (fsnotify's order: an
        entry whose directory cannot be watched or read is never reported).

        Raises:
            OSError: it, or a directory in it, could not be watched or read.
        """
        try:
            self._register(name, recursive=True, by_user=False)
        except OSError as exc:
            if exc.errno not in _CLOSED:
                raise
            yield from self._events(name, ops)
            return
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
            yield from self._events(name, ops)
            return
        pending: Tuple[str, List[str]] = (name, ops)
        for child in self._walk(name):
            yield from self._events(*pending)
            pending = (child, [CREATE])
        yield from self._events(*pending)

    def _events(self, path: str, ops: List[str]) -> Iterator[Dict[str, Any]]:
        rel = posixpath.relpath(path, self.watch_path)
        for op in ops:
            event: Dict[str, Any] = {"name": rel, "type": op}
            if self.include_entry and op in _WITH_ENTRY:
                try:
                    event["entry"] = entry_info(path)
                except OSError:
                    pass  # gone already: the event carries no entry
            yield event


def _err_text(exc: OSError) -> str:
    """Go's text: ``open <dir>: <reason>`` for a directory read, else the errno's text."""
    if exc.filename:
        return f"open {exc.filename}: {errno_text(exc)}"
    return errno_text(exc)


async def readable(fd: int, timeout: float) -> bool:
    """Wait until ``fd`` is readable, at most ``timeout`` seconds; whether it is."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await asyncio.wait_for(ready, max(0.0, timeout))
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
    return True


_ID_ALPHABET = string.ascii_lowercase + string.digits


class _Polled:
    """A polling watcher: read as soon as the kernel has events (envd's goroutine), its
    events waiting in memory until ``GetWatcherEvents``."""

    def __init__(self, watcher: Watcher, loop: asyncio.AbstractEventLoop) -> None:
        self.events: List[Dict[str, Any]] = []
        self.error: Optional[str] = None
        self.watcher = watcher
        loop.add_reader(watcher.fd, self._on_readable)

        def stop_reading() -> None:
            loop.remove_reader(watcher.fd)

        watcher.on_close = stop_reading

    def _on_readable(self) -> None:
        try:
            while not self.watcher.closed:
                before = len(self.events)
                for event in self.watcher.read():
                    if len(self.events) >= MAX_PENDING:
                        self.end(OVERFLOW)
                        return
                    self.events.append(event)
                if len(self.events) == before:
                    return  # nothing more queued now
        except WatchEnded as ended:
            self.end(str(ended))

    def end(self, message: str) -> None:
        """End the watcher with ``watcher error: <message>``."""
        if self.error is None:
            self.error = f"watcher error: {message}"
        self.close()

    def close(self) -> None:
        self.watcher.close()


class WatcherRegistry:
    """The agent's polling watchers by id (each with its own inotify instance)."""

    def __init__(self) -> None:
        self._polled: Dict[str, _Polled] = {}
        self._streams: List[Watcher] = []

    def watcher(self, path: str, recursive: bool, include_entry: bool) -> Watcher:
        """A started watcher of ``path`` (already checked with :func:`check_watch_path`),
        for a ``WatchDir`` stream: the caller reads it (:meth:`Watcher.read`) and closes it;
        :meth:`close` closes it too.

        Raises:
            RpcError: it could not be set up.
        """
        watcher = Watcher(path, recursive, include_entry)
        watcher.start()
        self._streams = [w for w in self._streams if not w.closed]
        self._streams.append(watcher)
        return watcher

    def create(self, path: str, recursive: bool, include_entry: bool) -> str:
        """``CreateWatcher``: a polling watcher's id (``w`` + 20 characters)."""
        watcher = Watcher(path, recursive, include_entry)
        watcher.start()
        watcher_id = "w" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(20))
        self._polled[watcher_id] = _Polled(watcher, asyncio.get_running_loop())
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
        self._get(watcher_id).close()
        del self._polled[watcher_id]

    def close(self) -> None:
        """Remove every watcher (polling ones and those of open streams)."""
        for polled in self._polled.values():
            polled.close()
        self._polled.clear()
        for watcher in self._streams:
            watcher.close()
        self._streams.clear()
