"""The streams' side of a process's output: bounded subscriber queues, and fd readiness.

This module owns :class:`Subscriber` (one stream's bounded queue of a process's events; a
full queue makes the process's reader wait: backpressure) and the waits for a non-blocking
descriptor to become readable or writable on the agent's event loop (used for process pipes
and PTYs, and by :mod:`.files` for uploads).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Deque, Dict, Optional, Tuple

__all__ = ["SUBSCRIBER_BUFFER", "Item", "Subscriber", "wait_readable", "wait_writable"]

#: Data events queued per subscriber before the process's reader waits for it.
SUBSCRIBER_BUFFER = 16

Item = Tuple[str, Dict[str, Any]]
"""A subscriber item: ``("data", event)``, ``("end", event)`` or ``("closed", {})``."""


class Subscriber:
    """One stream's view of a process: a bounded queue of items with blocking ``put``."""

    def __init__(self, limit: int = SUBSCRIBER_BUFFER) -> None:
        self._items: Deque[Item] = deque()
        self._limit = max(1, limit)
        self._closed = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    async def put(self, item: Item) -> None:
        """Queue ``item``, waiting while the queue is full; dropped once closed."""
        while not self._closed and len(self._items) >= self._limit:
            self._writable.clear()
            await self._writable.wait()
        if self._closed:
            return
        self._items.append(item)
        self._readable.set()

    async def get(self, timeout: Optional[float]) -> Optional[Item]:
        """The next item; ``None`` after ``timeout`` seconds; ``("closed", {})`` when closed."""
        if not self._items and not self._closed:
            self._readable.clear()
            try:
                await asyncio.wait_for(self._readable.wait(), timeout)
            except asyncio.TimeoutError:
                return None
        if self._items:
            item = self._items.popleft()
            self._writable.set()
            return item
        return ("closed", {})

    def close(self) -> None:
        """Stop accepting items and wake any waiting ``put``/``get``."""
        self._closed = True
        self._writable.set()
        self._readable.set()


def _wait_fd(loop: asyncio.AbstractEventLoop, fd: int, write: bool) -> asyncio.Future[None]:
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    if write:
        loop.add_writer(fd, ready)
    else:
        loop.add_reader(fd, ready)
    return fut


async def wait_readable(fd: int) -> None:
    """Wait until the non-blocking ``fd`` is readable (on the running loop)."""
    loop = asyncio.get_running_loop()
    fut = _wait_fd(loop, fd, False)
    try:
        await fut
    finally:
        loop.remove_reader(fd)


async def wait_writable(fd: int, timeout: Optional[float]) -> None:
    """Wait until the non-blocking ``fd`` is writable, at most ``timeout`` seconds (``None``:
    no bound).

    Raises:
        asyncio.TimeoutError: ``timeout`` passed first.
    """
    loop = asyncio.get_running_loop()
    fut = _wait_fd(loop, fd, True)
    try:
        await asyncio.wait_for(fut, timeout)
    finally:
        loop.remove_writer(fd)
