"""Per-sandbox leases: where a sandbox's envd is, its token, and how long it stays ours.

This module owns :class:`LeaseCache`. A ``POST /v2/sandboxes/{id}/connect`` answers with the
sandbox's envd address and access token and extends its time to live (TTL); the cache
remembers that answer and when the TTL it asked for ends, so a call on a warm sandbox needs
no control-plane request at all:

* a call asks for a target it needs for ``need`` more seconds (an exec: its timeout plus a
  margin); the remembered lease serves it if it lasts that long, else the caller connects;
* concurrent callers on a cold or expiring sandbox share one connect (single flight): one
  leads, the others wait for its answer (cancellably) and take it;
* use keeps a sandbox alive: once less than half of the configured lifetime is left, a
  renewal connect runs off the caller's path (on the worker pool), once per sandbox;
* a target that provably failed (the request never reached envd: a paused or deleted
  sandbox) is refreshed once, single-flight too, so N callers that hit the same stale
  target cause one connect.

A lease's end is counted from the moment its connect was *sent*, so it is never later than
the server's. The cache holds at most ``max_entries`` sandboxes (least recently used
dropped). It does no I/O itself: ``connect`` and ``submit`` are given to it, and the clock
is injectable for tests.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from typing import Callable, Dict, Optional

import attrs

from ..cancel import WAIT_SLICE_SECONDS, CancelToken
from ..errors import Cancelled, E2BProviderError, MissingAccessToken, SandboxGoneError
from ..models import Target
from .marks import remember

__all__ = ["DEFAULT_MAX_ENTRIES", "LEASE_LOOK_SECONDS", "Lease", "LeaseCache"]

log = logging.getLogger("e2b_provider")

#: Sandboxes remembered at most (least recently used forgotten first).
DEFAULT_MAX_ENTRIES = 4096
#: A long use of a sandbox (a terminal that is read, a watch) looks at the sandbox's lease
#: this often at most, so that it keeps the sandbox alive as any other use does.
LEASE_LOOK_SECONDS = 30.0

#: ``connect(sandbox_id, lease_seconds, cancel) -> Target``: one attach (may raise).
Connector = Callable[[str, int, Optional[CancelToken]], Target]
#: ``submit(fn)``: run ``fn()`` on a worker thread, soon.
Submitter = Callable[[Callable[[], None]], object]


@attrs.frozen
class Lease:
    """One remembered connect answer.

    Attributes:
        target: the sandbox's envd address and access token.
        ends_at: when the TTL asked for ends (monotonic clock; never after the server's).
        seconds: the TTL asked for.
    """

    target: Target
    ends_at: float
    seconds: int


class LeaseCache:
    """Remembered leases of many sandboxes, shared by all threads of one provider.

    Args:
        connect: performs one attach (connect with conflict handling) and returns the
            target; it is called without the cache's lock held.
        lifetime: the configured sandbox lifetime in seconds; a lease with less than half
            of it left is renewed in the background.
        submit: runs a renewal off the caller's path; None disables background renewal.
        clock: a monotonic clock (injectable for tests).
        max_entries: sandboxes remembered at most.
    """

    def __init__(
        self,
        connect: Connector,
        *,
        lifetime: float,
        submit: Optional[Submitter] = None,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._connect = connect
        self._renew_below = lifetime / 2.0
        self._submit = submit
        self._clock = clock
        self._max = max_entries
        self._lock = threading.Lock()
        self._leases: collections.OrderedDict[str, Lease] = collections.OrderedDict()
        self._flights: Dict[str, concurrent.futures.Future[Lease]] = {}
        self._renewing: set[str] = set()
        #: Connects made (for tests and benchmarks).
        self.connects = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    def lease(self, sandbox_id: str) -> Optional[Lease]:
        """The remembered lease of ``sandbox_id``, or None."""
        with self._lock:
            return self._leases.get(sandbox_id)

    # -- what callers use ----------------------------------------------------------------

    def get(
        self,
        sandbox_id: str,
        *,
        need: float,
        lease_seconds: int,
        cancel: Optional[CancelToken] = None,
        stale: Optional[Target] = None,
    ) -> Target:
        """A target for ``sandbox_id`` that stays valid for at least ``need`` seconds.

        Args:
            sandbox_id: the sandbox.
            need: seconds from now the call needs the sandbox for.
            lease_seconds: the TTL to ask for if a connect is needed.
            cancel: cancels the connect, or the wait for another caller's.
            stale: a target that just failed in a way that proves the sandbox is not where
                it was (paused, gone): it is not served again; a fresh connect is made
                unless another caller already replaced it.

        Raises:
            Cancelled: ``cancel`` fired.
            SandboxGoneError, E2BHttpError, ...: the connect failed.
        """
        with self._lock:
            lease = self._leases.get(sandbox_id)
            if lease is not None and stale is not None and lease.target == stale:
                del self._leases[sandbox_id]
                lease = None
            if lease is not None:
                left = lease.ends_at - self._clock()
                if left >= need:
                    self._leases.move_to_end(sandbox_id)
                    if left < self._renew_below:
                        self._renew_soon(sandbox_id, lease.seconds)
                    return lease.target
        return self._join(sandbox_id, lease_seconds, cancel).target

    def connect(
        self, sandbox_id: str, *, lease_seconds: int, cancel: Optional[CancelToken] = None
    ) -> Target:
        """Connect now (joining a connect already in flight) and remember the answer."""
        return self._join(sandbox_id, lease_seconds, cancel).target

    def remember(self, sandbox_id: str, target: Target, lease_seconds: int, sent_at: float) -> None:
        """Remember a target obtained elsewhere (a create answer), asked at ``sent_at``."""
        self._store(sandbox_id, Lease(target, sent_at + lease_seconds, lease_seconds))

    def forget(self, sandbox_id: str) -> None:
        """Drop what is remembered of ``sandbox_id`` (paused, destroyed, rebooted)."""
        with self._lock:
            self._leases.pop(sandbox_id, None)

    def now(self) -> float:
        """The cache's clock."""
        return self._clock()

    # -- single flight ----------------------------------------------------------------------

    def _join(self, sandbox_id: str, lease_seconds: int, cancel: Optional[CancelToken]) -> Lease:
        while True:
            if cancel is not None:
                cancel.raise_if_cancelled()
            with self._lock:
                flight = self._flights.get(sandbox_id)
                lead = flight is None
                if flight is None:
                    flight = concurrent.futures.Future()
                    self._flights[sandbox_id] = flight
            if lead:
                return self._lead(sandbox_id, lease_seconds, cancel, flight)
            try:
                lease = self._follow(flight, cancel)
            except Cancelled:
                if cancel is not None and cancel.cancelled:
                    raise
                # The leader was cancelled, not us: try again (one of us leads now).
                continue
            if lease.seconds >= lease_seconds:
                return lease
            # The shared answer asked for a shorter TTL than we need: connect for ours.

    def _lead(
        self,
        sandbox_id: str,
        lease_seconds: int,
        cancel: Optional[CancelToken],
        flight: concurrent.futures.Future[Lease],
    ) -> Lease:
        try:
            sent_at = self._clock()
            self.connects += 1
            target = self._connect(sandbox_id, lease_seconds, cancel)
            lease = Lease(target, sent_at + lease_seconds, lease_seconds)
        except BaseException as exc:
            if isinstance(exc, (SandboxGoneError, MissingAccessToken)):
                self.forget(sandbox_id)  # what was remembered is no use any more
            with self._lock:
                self._flights.pop(sandbox_id, None)
            # Followers get the leader's error; a Ctrl-C of the leader's thread is its own
            # business: followers see a cancel that is not theirs, and try again.
            flight.set_exception(exc if isinstance(exc, Exception) else Cancelled(None))
            raise
        self._store(sandbox_id, lease)
        with self._lock:
            self._flights.pop(sandbox_id, None)
        flight.set_result(lease)
        return lease

    @staticmethod
    def _follow(flight: concurrent.futures.Future[Lease], cancel: Optional[CancelToken]) -> Lease:
        while True:
            if cancel is not None and cancel.cancelled:
                raise Cancelled(cancel.reason)
            try:
                return flight.result(timeout=WAIT_SLICE_SECONDS)
            except concurrent.futures.TimeoutError:
                continue

    def _store(self, sandbox_id: str, lease: Lease) -> None:
        with self._lock:
            old = self._leases.get(sandbox_id)
            if (
                old is not None
                and not lease.target.resumed
                and old.target == attrs.evolve(lease.target, resumed=old.target.resumed)
                and old.ends_at > lease.ends_at
            ):
                lease = old  # a running sandbox's TTL is only ever extended
            remember(self._leases, sandbox_id, lease, self._max)

    # -- renewal ahead of time ------------------------------------------------------------

    def _renew_soon(self, sandbox_id: str, lease_seconds: int) -> None:
        """Start one background renewal of ``sandbox_id`` (caller holds the lock)."""
        if self._submit is None or sandbox_id in self._renewing or sandbox_id in self._flights:
            return
        self._renewing.add(sandbox_id)

        def renew() -> None:
            try:
                self._join(sandbox_id, lease_seconds, None)
            except SandboxGoneError:
                log.info(
                    "e2b_provider: sandbox %s is gone (found while renewing its lease)", sandbox_id
                )
            except E2BProviderError as exc:
                log.info(
                    "e2b_provider: renewing the lease of sandbox %s failed: %s", sandbox_id, exc
                )
            finally:
                with self._lock:
                    self._renewing.discard(sandbox_id)

        try:
            self._submit(renew)
        except RuntimeError:  # the worker pool is shut down (interpreter exit)
            self._renewing.discard(sandbox_id)
