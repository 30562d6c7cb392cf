"""A sandbox's output lines, stamped with the host's time as they arrive.

This module owns :class:`SandboxOutput`: the lines PID 1 and the envd agent of one sandbox
write to their stdout/stderr (the log pipe :mod:`.boot` drains), each with the wall-clock time
in whole milliseconds at which the host read it. The times never go backwards within one
sandbox (a clock step back repeats the last time), so the lines are ordered by time. It keeps
the newest lines across the sandbox's boots, bounded in count and bytes (a line longer than
:data:`MAX_LINE` bytes is cut there). Written by the log pump's thread and read by the event
loop: every method takes a lock. No I/O.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Deque, List, Optional, Tuple

__all__ = ["MAX_BYTES", "MAX_LINE", "MAX_LINES", "SandboxOutput"]

#: Lines kept per sandbox (the oldest are dropped first).
MAX_LINES = 20000
#: Bytes of text kept per sandbox.
MAX_BYTES = 2 << 20
#: Longest line kept, in bytes; the rest of a longer line is dropped.
MAX_LINE = 16 << 10


class SandboxOutput:
    """The newest output lines of one sandbox as ``(unix ms, text)``, oldest first."""

    def __init__(self, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES) -> None:
        self._lock = threading.Lock()
        self._lines: Deque[Tuple[int, str]] = collections.deque()
        self._bytes = 0
        self._max_lines = max_lines
        self._max_bytes = max_bytes
        self._partial = bytearray()
        self._overlong = False
        self._last_ms = 0

    def feed(self, data: bytes, now_ms: Optional[int] = None) -> None:
        """Take bytes read from the pipe; every complete line is kept, stamped ``now_ms``."""
        stamp = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            start = 0
            while True:
                end = data.find(b"\n", start)
                if end < 0:
                    self._add_partial(data[start:])
                    return
                self._add_partial(data[start:end])
                self._finish_line(stamp)
                start = end + 1

    def end(self, now_ms: Optional[int] = None) -> None:
        """The pipe closed (the boot ended): keep an unterminated last line as it is."""
        stamp = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            if self._partial or self._overlong:
                self._finish_line(stamp)

    def lines(self) -> List[Tuple[int, str]]:
        """A copy of the kept lines, oldest first."""
        with self._lock:
            return list(self._lines)

    def clear(self) -> None:
        """Drop every kept line (the sandbox's logs are no longer served)."""
        with self._lock:
            self._lines.clear()
            self._bytes = 0

    def _add_partial(self, chunk: bytes) -> None:
        room = MAX_LINE - len(self._partial)
        if len(chunk) > room:
            self._overlong = True
            chunk = chunk[: max(0, room)]
        self._partial += chunk

    def _finish_line(self, stamp: int) -> None:
        text = bytes(self._partial).decode("utf-8", errors="replace").rstrip("\r")
        self._partial.clear()
        self._overlong = False
        stamp = max(stamp, self._last_ms)
        self._last_ms = stamp
        self._lines.append((stamp, text))
        self._bytes += len(text)
        while self._lines and (
            len(self._lines) > self._max_lines or self._bytes > self._max_bytes
        ):
            self._bytes -= len(self._lines.popleft()[1])
