"""Deadlines and cancellation tokens: the library's AbortSignal.

This module owns :class:`Deadline` (an absolute point on the monotonic clock),
:class:`CancelReason` and :class:`CancelToken`. A token can be cancelled from any thread;
callbacks registered with :meth:`CancelToken.on_cancel` run once, on the cancelling thread,
outside the token's lock, and must not block. :meth:`CancelToken.wait` is the library's only
sleep: it returns early when the token fires.

It does no I/O and imports no requests, urllib3 or socket.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, List, Literal, Optional, final

import attrs

from .errors import Cancelled

__all__ = ["CancelReason", "CancelToken", "Deadline"]

#: How long one blocking wait of the library sleeps before it looks again at its cancel token
#: and deadline (so a cancel or Ctrl-C is seen within this).
WAIT_SLICE_SECONDS = 0.25

Clock = Callable[[], float]
Source = Literal["deadline", "explicit", "interrupt", "shutdown"]


@attrs.frozen
class Deadline:
    """An absolute deadline on a monotonic clock (``math.inf``: none).

    Attributes:
        at: the deadline, in the clock's seconds.
    """

    at: float
    clock: Clock = attrs.field(default=time.monotonic, eq=False, repr=False)

    @classmethod
    def after(cls, seconds: Optional[float], clock: Clock = time.monotonic) -> Deadline:
        """A deadline ``seconds`` from now; ``None`` means no deadline."""
        if seconds is None:
            return cls(math.inf, clock)
        return cls(clock() + max(0.0, float(seconds)), clock)

    @classmethod
    def never(cls) -> Deadline:
        """A deadline that never expires."""
        return cls(math.inf)

    def remaining(self) -> float:
        """Seconds left (never negative; ``math.inf`` for no deadline)."""
        if self.at == math.inf:
            return math.inf
        return max(0.0, self.at - self.clock())

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return self.remaining() <= 0.0

    def clamp(self, seconds: float) -> float:
        """``min(seconds, remaining())``: the bound for one blocking step."""
        return min(float(seconds), self.remaining())

    def earliest(self, *others: Deadline) -> Deadline:
        """The earliest of this deadline and ``others``."""
        return min((self, *others), key=lambda d: d.at)


@attrs.frozen
class CancelReason:
    """Why a token was cancelled.

    Attributes:
        source: ``"explicit"`` (``token.cancel()``), ``"deadline"``, ``"interrupt"``
            (Ctrl-C) or ``"shutdown"`` (the provider was closed).
        message: free text for humans.
    """

    source: Source = "explicit"
    message: str = ""

    def __str__(self) -> str:
        return self.message or self.source


Callback = Callable[[CancelReason], None]


@final
@attrs.define(eq=False)
class CancelToken:
    """A thread-safe, one-shot cancellation flag with callbacks.

    Example::

        tok = CancelToken()
        threading.Timer(5.0, tok.cancel, args=("user pressed stop",)).start()
        result = provider.exec(handle, "sleep 60", timeout=120.0, cancel=tok)
        assert result.cancelled
    """

    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)
    _event: threading.Event = attrs.field(factory=threading.Event, init=False, repr=False)
    _reason: Optional[CancelReason] = attrs.field(default=None, init=False)
    _callbacks: List[Callback] = attrs.field(factory=list, init=False, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` has been called."""
        return self._event.is_set()

    @property
    def reason(self) -> Optional[CancelReason]:
        """The first reason given, or None while not cancelled."""
        return self._reason

    def cancel(self, reason: CancelReason | str | None = None) -> bool:
        """Cancel the token (idempotent; the first reason wins).

        Args:
            reason: a :class:`CancelReason` or a message string.

        Returns:
            True if this call cancelled the token, False if it was already cancelled.
        """
        if not isinstance(reason, CancelReason):
            reason = CancelReason("explicit", reason or "")
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            callbacks, self._callbacks = self._callbacks, []
            self._event.set()
        for fn in callbacks:
            try:
                fn(reason)
            except Exception:  # a broken callback must not stop the others
                import logging

                logging.getLogger("e2b_provider").exception("cancel callback failed")
        return True

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~e2b_provider.Cancelled` if the token has fired."""
        if self._reason is not None:
            raise Cancelled(self._reason)

    def wait(self, timeout: Optional[float]) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on cancel.

        Waits in slices of at most 0.25 s so Ctrl-C stays responsive everywhere.

        Returns:
            True if the token is cancelled.
        """
        deadline = Deadline.after(timeout)
        while not self._event.is_set():
            left = deadline.remaining()
            if left <= 0:
                break
            self._event.wait(min(left, 0.25))
        return self._event.is_set()

    def on_cancel(self, fn: Callback) -> Callable[[], None]:
        """Register ``fn(reason)``; it runs at once if the token already fired.

        Returns:
            A function that unregisters ``fn`` (a no-op after it ran).
        """
        with self._lock:
            if self._reason is None:
                self._callbacks.append(fn)
                fired: Optional[CancelReason] = None
            else:
                fired = self._reason
        if fired is not None:
            fn(fired)

        def unregister() -> None:
            with self._lock:
                try:
                    self._callbacks.remove(fn)
                except ValueError:
                    pass

        return unregister

    @classmethod
    def linked(cls, *parents: Optional[CancelToken]) -> CancelToken:
        """A new token that is cancelled when any parent is (like ``AbortSignal.any``)."""
        child = cls()

        def forward(reason: CancelReason) -> None:
            child.cancel(reason)

        for p in parents:
            if p is not None:
                p.on_cancel(forward)
        return child
