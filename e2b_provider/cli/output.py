"""What the command line writes: a progress line on a terminal, live writers for a command's
output, one line per file event or directory entry, and noticing that the reader of our
output went away (``| head``)."""

from __future__ import annotations

import json
import os
import re
import select
import stat
import threading
import time
from typing import IO, Callable, Optional, TextIO

from ..models import FileEvent

#: Transfers at least this large show a progress line on a terminal.
PROGRESS_FROM_BYTES = 4 << 20


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class Progress:
    """A one-line progress display on a terminal, fed by a transfer's ``progress``
    callback (at most 8 updates a second; nothing when stderr is not a terminal)."""

    def __init__(self, what: str, stream: TextIO) -> None:
        self._what = what
        self._stream = stream
        self._on = stream.isatty()
        self._t0 = time.monotonic()
        self._last = 0.0
        self._done = 0
        self._total: Optional[int] = None
        self.shown = False

    def __call__(self, done: int, total: Optional[int]) -> None:
        self._done, self._total = done, total
        now = time.monotonic()
        if not self._on or now - self._last < 0.125:
            return
        self._last = now
        took = now - self._t0
        if took < 0.5 and (total or 0) < PROGRESS_FROM_BYTES:
            return
        share = f" {100 * done / total:.0f}%" if total else ""
        of = f" of {_mib(total)}" if total else ""
        self._stream.write(f"\r{self._what}: {_mib(done)}{of}{share} {took:.1f} s\033[K")
        self._stream.flush()
        self.shown = True

    def finish(self, ok: bool) -> None:
        """End the line: the total and rate when it went well, else just clear it."""
        if not self.shown:
            return
        took = time.monotonic() - self._t0
        if ok:
            rate = self._done / took if took > 0 else 0.0
            line = f"\r{self._what}: {_mib(self._done)} in {took:.1f} s ({_mib(rate)}/s)\033[K\n"
        else:
            line = "\r\033[K"
        self._stream.write(line)
        self._stream.flush()


def writer(stream: IO[str]) -> Callable[[str], None]:
    """A callback that writes a command's output to ``stream`` as it comes (flushed)."""

    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def event_line(event: FileEvent, as_json: bool) -> str:
    """One line for one event: ``create /workspace/a.txt`` (control characters in the path
    escaped, so one event stays one line), or a JSON object."""
    if as_json:
        return json.dumps({"type": event.type, "path": event.path})
    path = _CONTROL.sub(lambda m: repr(m.group())[1:-1], event.path)
    return f"{event.type} {path}"


def mode_text(mode: int) -> str:
    """``rwxr-xr-x`` for the permission bits of ``mode``."""
    bits = "rwxrwxrwx"
    return "".join(b if mode & (1 << (8 - i)) else "-" for i, b in enumerate(bits))


def on_reader_gone(stream: TextIO, stop: Callable[[], None]) -> None:
    """Call ``stop`` (once, from a daemon thread) when the reader of ``stream`` goes away
    (a pipe whose other end closed: ``| head``), even while nothing is written to it."""
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return  # a terminal or a file: its reader does not go away
        poller = select.poll()
        poller.register(fd, select.POLLERR | select.POLLHUP)
    except (OSError, ValueError, AttributeError):
        return

    def wait() -> None:
        try:
            while not poller.poll(3600 * 1000):
                pass
        except (OSError, ValueError):
            return
        stop()

    threading.Thread(target=wait, name="e2b-provider-cli-stdout", daemon=True).start()
