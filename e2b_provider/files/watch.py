"""Watching directories: envd's ``WatchDir`` stream, followed on the caller's thread.

This module owns :class:`Watches`, the provider's part behind ``watch`` and
``wait_for_file``, and :class:`Watch`, the iterator of :class:`~e2b_provider.FileEvent`
values a watch yields.

* **As the sandbox user.** envd watches as root, so before a watch a small script run as
  ``sandbox`` checks what inotify would check for that user: the path exists, is a
  directory, and ``sandbox`` may read it (and reach it: every directory on the way
  searchable). Each failure is its own error (:class:`~e2b_provider.PathNotFound`,
  :class:`~e2b_provider.NotADirectory`, :class:`~e2b_provider.PermissionDenied`), raised
  before the stream is opened. envd's ``WatchDir`` itself is asked as ``sandbox`` (its
  Basic-auth user). Below the watched directory envd sees everything: a recursive watch
  also reports changes in subdirectories ``sandbox`` may not read.
* **No thread per watch.** One ``WatchDir`` stream per watch, read by the thread that
  iterates, as :meth:`~e2b_provider.Command.wait` follows its stream: the shared watchdog's
  timer ends it at its timeout, a :class:`~e2b_provider.CancelToken` callback aborts the read
  from any thread, and Ctrl-C interrupts it (the ``KeyboardInterrupt`` propagates; leaving the
  ``with`` block closes the stream, which ends the watch in the sandbox). envd's keepalives
  (every ``keepalive_seconds``) bound each read: a stream silent for twice that plus 10 s is
  dead (:class:`~e2b_provider.TransportTimeout`).
* **Bounded memory.** Events are read only when the caller asks for the next one, at most
  :data:`~e2b_provider.clients.envd_streams.WATCH_READ_BYTES` of the stream at a time, in
  messages of at most :data:`~e2b_provider.clients.envd_streams.WATCH_MESSAGE_BYTES`;
  identical events that arrive together (a burst of writes to one file) are reported once.
  envd's ``WatchDir`` keeps no queue either: while the caller is busy, TCP's flow control
  stops envd, whose reader then leaves the kernel's inotify queue to fill; when it overflows
  envd ends the watch (``watcher error: fsnotify: queue or buffer overflow``) after every
  event queued before it. The iterator then yields one ``FileEvent("overflow", <watched
  directory>)`` and watches again (events between the two are lost: look at the directory
  again). Any other ``watcher error`` (a recursive watch whose new subdirectory vanished
  before envd could watch it, say) is reported and handled the same way; a watch restarted
  :data:`MAX_RESTARTS` times in a row without an event in between fails with the error.
* **Absolute paths.** envd names events relative to the watched directory (``.`` for the
  directory itself); they are joined to it here. A name that would lead outside it is a
  :class:`~e2b_provider.ProtocolError` (the sandbox is not trusted).
* **The end.** A watch ends at its ``timeout`` (iteration stops), when the watched
  directory itself is removed or renamed (after that event: envd's watch is dead), when the
  ``with`` block is left, or with an error.

The message parsing (:func:`parse_message`, :func:`event_path`) is pure; the rest does I/O
through :class:`~e2b_provider.core.context.ProviderContext`.
"""

from __future__ import annotations

import collections
import logging
import math
import posixpath
import threading
import time
import weakref
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple, Union, final

from ..cancel import CancelReason, CancelToken, Deadline
from ..clients.envd_requests import START_OPEN_SECONDS
from ..clients.envd_streams import WatchStream
from ..core.context import FILE_OP_TIMEOUT_SECONDS, ProviderContext, script_failed
from ..core.interrupts import caller_handling, shorten
from ..core.leases import LEASE_LOOK_SECONDS
from ..core.messages import is_ambiguous, mark_worded, reword
from ..errors import (
    Cancelled,
    CommandFailed,
    E2BProviderError,
    NotADirectory,
    OperationTimeout,
    PathNotFound,
    PermissionDenied,
    ProtocolError,
    ProviderClosed,
    RemoteError,
    SandboxGoneError,
    TransportError,
)
from ..models import FileEvent, FileEventType, FileStat, Target
from ..protocol import scripts as scripts
from ..protocol.connect import EndStream
from .answers import ACCESS_HINT
from .files import Files
from .watch_names import OwnNames

__all__ = [
    "MAX_RESTARTS",
    "WATCH_CHECK_SCRIPT",
    "Watch",
    "Watches",
    "event_path",
    "parse_message",
]

log = logging.getLogger("e2b_provider")

# WATCH_READ_BYTES, the most of the stream read at once (what a watch holds at most,
# decoded, besides one overflow event), and WATCH_MESSAGE_BYTES, the largest ``WatchDir`` message
# accepted, are the stream's (:mod:`e2b_provider.clients.envd_streams`).
#: A watch that envd ends this many times in a row, with no event in between, fails.
MAX_RESTARTS = 3
#: envd ends a watch with a timeout this much after its timeout passed here (a backstop
#: for a client that went away: the watchdog ends it here first).
SERVER_SLACK_SECONDS = 10.0
#: What envd calls the operation in its messages.
_OPERATION = "filesystem watch"

#: envd's event types (proto3 JSON: the enum's name, or its number).
_TYPES: Mapping[Union[str, int], FileEventType] = {
    "EVENT_TYPE_CREATE": "create",
    "EVENT_TYPE_WRITE": "write",
    "EVENT_TYPE_REMOVE": "remove",
    "EVENT_TYPE_RENAME": "rename",
    "EVENT_TYPE_CHMOD": "chmod",
    1: "create",
    2: "write",
    3: "remove",
    4: "rename",
    5: "chmod",
}
#: How envd says a watch ended because its watcher failed (fsnotify's error follows).
_WATCHER_ERROR = "watcher error: "

_MISSING_EXIT = 3
_NOT_DIR_EXIT = 4
_UNREADABLE_EXIT = 6
_LOOP_EXIT = 40
#: As the sandbox user: exit :data:`_LOOP_EXIT` when ``$1`` is a loop of symbolic links
#: (``ELOOP``), else go on (a shell function of the scripts below).
_LOOP_CHECK = (
    'l() { [ -L "$1" ] || return 0; e=$(LC_ALL=C stat -L -- "$1" 2>&1 >/dev/null) && return; '
    f'case $e in *"Too many levels of symbolic links"*) exit {_LOOP_EXIT};; esac; }}; '
)
#: As ``sandbox``: exit 0 when ``$1`` is a directory the user may read (what
#: ``inotify_add_watch`` asks of the user: read permission, every directory on the way
#: searchable); 3 when it does not exist, :data:`~e2b_provider.protocol.scripts.NO_ENTRY_EXIT` when
# a directory
#: on the way may not be entered (named on stderr), 4 when it is not a directory, 6 when
#: it may not be read; 40 when ``$2`` (the path waited for in it, if given) is a loop of
#: symbolic links, which never leads to a file.
WATCH_CHECK_SCRIPT = (
    scripts.NOT_THERE
    + _LOOP_CHECK
    + 'p=$1; if [ ! -e "$p" ]; then gone "$p"; fi; '
    + f'if [ ! -d "$p" ]; then exit {_NOT_DIR_EXIT}; fi; '
    + f'if [ ! -r "$p" ]; then exit {_UNREADABLE_EXIT}; fi; '
    + '[ -z "$2" ] || l "$2"; exit 0'
)
#: As the sandbox user: exit :data:`_LOOP_EXIT` when ``$1`` is a loop of symbolic links,
#: else 0.
LINK_LOOP_SCRIPT = _LOOP_CHECK + 'l "$1"; exit 0'


# -- sans-IO -----------------------------------------------------------------------------------

#: One ``WatchDir`` message: ``("start", None)``, ``("keepalive", None)``, ``("event",
#: (type, name))``, or ``("other", None)`` for anything else (an event type this library
#: does not know, a message of a newer envd), which is skipped.
Parsed = Tuple[str, Optional[Tuple[FileEventType, str]]]


def parse_message(data: Any) -> Parsed:
    """What one decoded ``WatchDir`` message says.

    Raises:
        ProtocolError: it is not a JSON object, or an event without a usable name.
    """
    if not isinstance(data, dict):
        raise ProtocolError("E2B sent a watch message that is not a JSON object")
    if "filesystem" in data:
        fs = data["filesystem"]
        if not isinstance(fs, dict):
            raise ProtocolError("E2B sent a watch event that is not a JSON object")
        kind = _TYPES.get(fs.get("type"))  # type: ignore[arg-type]
        name = fs.get("name", "")
        if not isinstance(name, str):
            raise ProtocolError("E2B sent a watch event whose name is not a string")
        if kind is None:
            return ("other", None)
        return ("event", (kind, name))
    if "start" in data:
        return ("start", None)
    if "keepalive" in data:
        return ("keepalive", None)
    return ("other", None)


def event_path(watched: str, name: str) -> str:
    """The absolute path of ``name`` (relative to the watched directory ``watched``).

    Raises:
        ProtocolError: ``name`` is absolute, holds NUL, or leads outside ``watched``.
    """
    if name in ("", "."):
        return watched
    parts = name.split("/")
    if "\x00" in name or name.startswith("/") or ".." in parts:
        raise ProtocolError(
            f"E2B sent a watch event for {name[:200]!r}, which is not a path inside the "
            f"watched directory {watched}"
        )
    return posixpath.normpath(posixpath.join(watched, name))


def _refusal(path: str, exc: RemoteError) -> Optional[E2BProviderError]:
    """envd's own refusal to watch ``path`` (it may vanish after our check), said as ours;
    None for any other error."""
    if exc.code == "not_found":
        return PathNotFound(f"{path} does not exist")
    if exc.code == "invalid_argument" and "not a directory" in exc.message:
        return NotADirectory(f"{path} is not a directory")
    if exc.code == "invalid_argument" and "network filesystem" in exc.message:
        return NotADirectory(
            f"{path} is on a network file system, where changes made elsewhere are not seen: "
            "envd does not watch it"
        )
    return None


# -- the iterator ------------------------------------------------------------------------------


@final
class Watch:
    """The events of one watch, in order, as they come (see ``E2BSandboxProvider.watch``).

    Iterate it on one thread (each ``next`` blocks until an event comes, the watch's
    timeout passes, it is cancelled, or Ctrl-C); :meth:`close` (idempotent) ends it, also
    from another thread. Iteration stops at the timeout, after the watched directory itself
    was removed or renamed, and after :meth:`close`.

    Attributes:
        sandbox_id: the sandbox.
        path: the watched directory (absolute).
        recursive: whether the directories below are watched too.
    """

    def __init__(
        self,
        owner: Watches,
        sid: str,
        path: str,
        recursive: bool,
        timeout: Optional[float],
        cancel: Optional[CancelToken],
        doing: str,
    ) -> None:
        self.sandbox_id = sid
        self.path = path
        self.recursive = recursive
        self._owner = owner
        self._ctx = owner._ctx
        self._timeout = timeout
        self._cancel = cancel
        self._doing = doing
        self._lock = threading.Lock()
        self._stream: Optional[WatchStream] = None
        self._pending: Deque[FileEvent] = collections.deque()
        self._own = OwnNames(path)
        self._deadline = Deadline.never()
        self._timer: Any = None
        self._undo: Any = None
        self._expired = False
        self._closed = False
        self._done = False
        self._restart = False
        self._restarts = 0
        self._broken: Optional[E2BProviderError] = None
        self._cut = False  # closed by the provider's close()
        self._touched = 0.0

    def __repr__(self) -> str:
        return (f"Watch(sandbox_id={self.sandbox_id!r}, path={self.path!r}, "
                f"recursive={self.recursive})")

    # -- opening -------------------------------------------------------------------------

    def start(self) -> None:
        """Open the stream and wait for envd's word that the watch is set up; from then on
        every change is reported. The timeout starts now.

        Raises:
            PathNotFound, NotADirectory: envd refused the path (it changed after the check).
            Cancelled, E2BProviderError: the opening failed (the stream is closed).
        """
        try:
            self._open()
            if self._timeout is not None:
                self._deadline = Deadline.after(self._timeout)
                self._timer = self._ctx.watchdog.call_later(self._timeout, self._expire)
            if self._cancel is not None:
                self._undo = self._cancel.on_cancel(self._cancelled)
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        """One ``WatchDir`` stream, read up to its start message."""
        ctx = self._ctx
        server: Optional[float] = None
        if self._timeout is not None:
            left = self._timeout if self._deadline.at == math.inf else self._deadline.remaining()
            server = max(0.001, left) + SERVER_SLACK_SECONDS
        need = FILE_OP_TIMEOUT_SECONDS + (server or 0.0)

        began: List[float] = []

        def run(target: Target) -> WatchStream:
            began[:] = [time.monotonic()]
            return ctx.envd(target).watch_dir(
                self.path, user=scripts.SANDBOX_USER, recursive=self.recursive,
                keepalive_seconds=ctx.bounds.keepalive, cancel=self._cancel,
                server_timeout=server,
            )

        stream = ctx.on_target(self.sandbox_id, self._cancel, run, need=need)
        with self._lock:
            closed = self._closed
            if not closed:
                self._stream = stream
        if closed:  # close() ran meanwhile (from another thread): iteration stops
            stream.abort()
            stream.close()
            return
        # envd sends its start message once the watch is set up; nothing is reported
        # before it. Its wait is bounded like the opening (a timer aborts the read).
        late: List[bool] = []

        def too_late() -> None:
            late.append(True)
            self._abort_stream(stream)

        left = max(0.0, START_OPEN_SECONDS - (time.monotonic() - began[0]))
        opening = ctx.watchdog.call_later(left, too_late)
        undo = (self._cancel.on_cancel(lambda _r: self._abort_stream(stream))
                if self._cancel is not None else None)
        try:
            while True:
                item = self._next_item(stream)
                if isinstance(item, EndStream):
                    self._ended(item, opening=True)
                    raise ProtocolError("the sandbox ended the watch before it started")
                kind, _ = parse_message(item)
                if kind == "start":
                    return
                if kind == "event":
                    raise ProtocolError("the sandbox sent a watch event before its start")
        except TransportError:
            if self._cancel is not None and self._cancel.cancelled:
                raise Cancelled(self._cancel.reason) from None
            if late:
                raise OperationTimeout(
                    f"the sandbox did not start watching within {START_OPEN_SECONDS:.0f} s"
                ) from None
            raise
        finally:
            opening.cancel()
            if undo is not None:
                undo()

    @staticmethod
    def _next_item(stream: WatchStream) -> Union[Dict[str, Any], EndStream]:
        """The next message of ``stream`` (reading when none is decoded yet)."""
        while True:
            item = stream.take()
            if item is not None:
                return item
            stream.read()

    # -- stopping ------------------------------------------------------------------------

    def _abort_stream(self, stream: Optional[WatchStream] = None) -> None:
        with self._lock:
            current = self._stream
        target = stream if stream is not None else current
        if target is not None:
            target.abort()

    def _expire(self) -> None:
        self._expired = True
        self._abort_stream()

    def _cancelled(self, _reason: CancelReason) -> None:
        self._abort_stream()

    def close(self) -> None:
        """End the watch (idempotent, thread-safe): envd removes it when its stream closes.
        Iteration then stops."""
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if self._timer is not None:
            self._timer.cancel()
        if self._undo is not None:
            self._undo()
            self._undo = None
        if stream is not None:
            stream.abort()
            stream.close()

    def cut(self) -> None:
        """End the watch because its provider is closing: iteration raises
        :class:`~e2b_provider.ProviderClosed`."""
        self._cut = True
        self.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- iterating -----------------------------------------------------------------------

    def __iter__(self) -> Watch:
        return self

    def __next__(self) -> FileEvent:
        began = time.monotonic()
        outer = caller_handling()
        try:
            return self._next()
        except StopIteration:
            self.close()
            raise
        except E2BProviderError as exc:
            self.close()
            said = self._failure(exc, began)
            if said is exc:
                raise
            raise said from exc
        except BaseException as exc:
            self.close()
            shorten(exc, exc.__traceback__, outer)  # Ctrl-C: the caller's frames and this one
            raise

    def _failure(self, exc: E2BProviderError, began: float) -> E2BProviderError:
        """``exc`` in the caller's terms: a closed provider, a sandbox paused or deleted
        meanwhile (one look-up of its state), else reworded."""
        ctx = self._ctx
        closed = ctx.closed_error() if isinstance(exc, TransportError) else None
        if closed is not None:
            return closed
        if is_ambiguous(exc) and not ctx.closed:
            fate = ctx.fate_during(self.sandbox_id, began, self._cancel)
            if fate == "paused":
                return ctx.paused_error(self.sandbox_id, f"{self.path} was watched")
            if fate == "gone":
                self._owner._files.forget(self.sandbox_id)
                ctx.leases.forget(self.sandbox_id)
                return SandboxGoneError(
                    f"{self._doing} failed: sandbox {self.sandbox_id} was deleted meanwhile "
                    "(by destroy() or another client, or by E2B); create a new sandbox"
                )
        reword(exc, self._doing)
        return exc

    def _next(self) -> FileEvent:
        while True:
            if self._restart:
                # At once, before the overflow event is handed out: what happens after the
                # caller saw it is seen.
                self._again()
            if self._pending:
                return self._pending.popleft()
            if self._broken is not None:
                error, self._broken = self._broken, None
                raise error
            if self._cut:
                raise self._ctx.closed_error() or ProviderClosed("the provider was closed")
            if self._done or self._closed:
                raise StopIteration
            self._check()
            stream = self._stream
            if stream is None:
                raise StopIteration
            # Everything decoded from the last read first (identical neighbours merged),
            # then one more read.
            while not (self._done or self._restart):
                item = stream.take()
                if item is None:
                    break
                self._take(item)
            if self._pending or self._done or self._restart:
                continue
            try:
                stream.read()
            except TransportError:
                self._check()
                if self._closed:
                    continue  # closed meanwhile: said above
                raise

    def _check(self) -> None:
        """Stop at the timeout; raise when cancelled."""
        if self._expired or self._deadline.expired():
            self._done = True
            raise StopIteration
        if self._cancel is not None and self._cancel.cancelled:
            raise Cancelled(self._cancel.reason)

    def _take(self, item: Union[Dict[str, Any], EndStream]) -> None:
        if isinstance(item, EndStream):
            self._ended(item, opening=False)
            return
        self._touch_lease()
        _, change = parse_message(item)
        if change is None:
            return
        event = FileEvent(change[0], event_path(self.path, change[1]))
        self._restarts = 0
        if event.path == self.path and event.type in ("remove", "rename"):
            self._done = True  # envd's watch of a removed or moved directory is dead
        for kind, name in self._own.events(*change):  # the library's own files hidden
            event = FileEvent(kind, event_path(self.path, name))
            if not self._pending or self._pending[-1] != event:
                self._pending.append(event)  # identical events arriving together: once

    def _ended(self, end: EndStream, *, opening: bool) -> None:
        """envd ended the stream: an error, a restart after a watcher error, or done."""
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        code, message = end.error_code, end.error_message
        if code is None:
            if opening:
                return
            raise ProtocolError("the sandbox ended the watch without saying why")
        error = RemoteError(code, message, operation=_OPERATION)
        refused = _refusal(self.path, error)
        if refused is not None:
            raise refused from error
        if code == "deadline_exceeded" and self._timeout is not None:
            self._done = True  # envd's backstop for our timeout
            return
        if message.startswith(_WATCHER_ERROR) and not opening:
            self._restarts += 1
            if self._restarts > MAX_RESTARTS:
                raise error
            log.info("e2b_provider: the watch of %s in sandbox %s ended (%s); watching again",
                     self.path, self.sandbox_id, message)
            self._pending.append(FileEvent("overflow", self.path))
            self._restart = True
            return
        raise error

    def _again(self) -> None:
        """Watch again after envd ended the watch with a watcher error (a failure is raised
        once the events before it were handed out)."""
        self._restart = False
        try:
            self._check()
            self._open()
        except StopIteration:
            self._done = True
        except E2BProviderError as exc:
            self._broken = exc

    def _touch_lease(self) -> None:
        """Keep the sandbox's lease going while the watch lasts (a renewal, when one is due,
        runs off this thread)."""
        now = time.monotonic()
        if now - self._touched < LEASE_LOOK_SECONDS:
            return
        self._touched = now
        ctx = self._ctx
        try:
            ctx.leases.get(self.sandbox_id, need=FILE_OP_TIMEOUT_SECONDS,
                           lease_seconds=ctx.lease_seconds(), cancel=self._cancel)
        except (E2BProviderError, Cancelled) as exc:
            log.debug("e2b_provider: could not renew the lease of sandbox %s: %s",
                      self.sandbox_id, exc)


# -- the part -----------------------------------------------------------------------------------


def _link_loop(path: str) -> CommandFailed:
    """The error for a path waited for that is a loop of symbolic links."""
    return CommandFailed(f"{path} is a loop of symbolic links (too many levels of symbolic "
                         "links): it never leads to a file; replace the link",
                         exit_code=_LOOP_EXIT)


class Watches:
    """The provider's part behind ``watch`` and ``wait_for_file`` (arguments validated)."""

    def __init__(self, ctx: ProviderContext, files: Files) -> None:
        self._ctx = ctx
        self._files = files
        self._lock = threading.Lock()
        self._open: weakref.WeakSet[Watch] = weakref.WeakSet()

    def close(self) -> None:
        """End every watch still open (the provider is closing): their loops raise
        :class:`~e2b_provider.ProviderClosed`."""
        with self._lock:
            watches = list(self._open)
            self._open.clear()
        for watch in watches:
            watch.cut()

    def check(self, sid: str, path: str, cancel: Optional[CancelToken],
              waited: Optional[str] = None) -> None:
        """Raise unless ``sandbox`` may watch the directory ``path`` (one script), or when
        ``waited`` (a path in it) is a loop of symbolic links.

        Raises:
            PathNotFound, NotADirectory, PermissionDenied: what the check found.
            CommandFailed: ``waited`` is a loop of symbolic links.
        """
        args = ["-c", WATCH_CHECK_SCRIPT, "capybara-watch", path]
        r = self._ctx.script_on(sid, args + ([waited] if waited else []), cancel)
        if r.exit_code == 0:
            return
        if r.exit_code == _LOOP_EXIT and waited:
            raise _link_loop(waited)
        if r.exit_code == _MISSING_EXIT:
            raise PathNotFound(f"{path} does not exist", exit_code=r.exit_code)
        if r.exit_code == _NOT_DIR_EXIT:
            raise NotADirectory(f"{path} is not a directory: only directories are watched "
                                "(watch its parent for changes to a file)", exit_code=r.exit_code)
        if r.exit_code == _UNREADABLE_EXIT:
            raise PermissionDenied(
                f"permission denied: user 'sandbox' may not read the directory {path}; "
                f"{ACCESS_HINT}", exit_code=r.exit_code)
        if r.exit_code == scripts.NO_ENTRY_EXIT:
            lines = r.stderr.decode("utf-8", "replace").strip().splitlines()
            closed = lines[-1] if lines else "a directory on the way"
            raise PermissionDenied(
                f"permission denied: user 'sandbox' may not enter {closed}, so {path} cannot "
                f"be watched (it may exist); {ACCESS_HINT}", exit_code=r.exit_code)
        raise script_failed("the check of the directory to watch failed", r)

    def open(
        self,
        sid: str,
        path: str,
        *,
        recursive: bool,
        timeout: Optional[float],
        cancel: Optional[CancelToken],
        doing: str,
        waited: Optional[str] = None,
    ) -> Watch:
        """A started watch of ``path`` (checked first; ``waited``: see :meth:`check`)."""
        self.check(sid, path, cancel, waited)
        watch = Watch(self, sid, path, recursive, timeout, cancel, doing)
        watch.start()
        with self._lock:
            self._open.add(watch)
        return watch

    def wait_for_file(
        self, sid: str, path: str, timeout: float, cancel: Optional[CancelToken], doing: str
    ) -> FileStat:
        """Return once ``path`` exists (see ``E2BSandboxProvider.wait_for_file``)."""
        guard = CancelToken()

        def expire() -> None:
            guard.cancel(CancelReason("deadline", "the wait's timeout"))

        def forward(reason: CancelReason) -> None:
            guard.cancel(reason)

        timer = self._ctx.watchdog.call_later(timeout, expire)
        undo = cancel.on_cancel(forward) if cancel is not None else None
        try:
            return self._wait(sid, path, guard, doing)
        except Cancelled:
            if cancel is not None and cancel.cancelled:
                raise Cancelled(cancel.reason) from None
            if guard.cancelled:
                raise mark_worded(OperationTimeout(
                    f"{doing} failed: {path} did not appear within {timeout:g} s"
                )) from None
            raise
        finally:
            timer.cancel()
            if undo is not None:
                undo()

    def _stat(self, sid: str, path: str, guard: CancelToken) -> Optional[FileStat]:
        """:meth:`Files.stat`, a refusal said as :class:`PermissionDenied`."""
        try:
            return self._files.stat(sid, path, guard)
        except CommandFailed as exc:
            if type(exc) is CommandFailed and str(exc).startswith("permission denied"):
                raise PermissionDenied(str(exc), exit_code=exc.exit_code) from exc
            raise

    def _check_loop(self, sid: str, path: str, cancel: Optional[CancelToken]) -> None:
        """Raise when ``path`` is a loop of symbolic links (one script).

        Raises:
            CommandFailed: it is, as other files calls say ``ELOOP``.
        """
        r = self._ctx.script_on(sid, ["-c", LINK_LOOP_SCRIPT, "capybara-loop", path], cancel)
        if r.exit_code == _LOOP_EXIT:
            raise _link_loop(path)

    def _wait(self, sid: str, path: str, guard: CancelToken, doing: str) -> FileStat:
        found = self._stat(sid, path, guard)
        if found is not None:
            return found
        target = path
        while True:
            parent = posixpath.dirname(target)
            try:
                watch = self.open(sid, parent, recursive=False, timeout=None, cancel=guard,
                                  doing=doing, waited=target)
            except PathNotFound:
                # Its directory is not there yet: wait for that first (the same way, one
                # level up; "/" always exists).
                target = parent
                continue
            with watch:
                # The watch is set up: from here on no creation can be missed.
                found = self._stat(sid, target, guard)
                if found is None:
                    for event in watch:
                        if event.path == target or event.type == "overflow":
                            found = self._stat(sid, target, guard)
                            if found is not None:
                                break
                            if event.path == target and event.type == "create":
                                # made, yet not there: a link, maybe one that loops
                                self._check_loop(sid, target, guard)
            if found is None:
                continue  # the watch ended: its directory was removed or moved; again
            if target == path:
                return found
            # A directory on the way appeared: start again from the path itself (what was
            # made with it may already be there).
            target = path
            found = self._stat(sid, path, guard)
            if found is not None:
                return found
