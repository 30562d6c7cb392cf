"""Unit tests of the lease cache (e2b_provider.core.leases), on a fake clock."""

from __future__ import annotations

import threading
from typing import Callable, List, Optional, Tuple

import pytest

from e2b_provider import Cancelled, CancelToken, E2BHttpError, SandboxGoneError
from e2b_provider.core.leases import LeaseCache
from e2b_provider.models import Target

from .fakeclock import FakeClock

SID = "isandboxaaaaaaaaaaaaa"


def target(n: int = 0, *, resumed: bool = False) -> Target:
    return Target(url=f"http://envd-{n}", sandbox_id=SID, access_token=f"tok{n}", resumed=resumed)


class Connector:
    """Records connects; answers ``target(n)`` with n = connects so far, or runs ``hook``."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, int]] = []
        self.hook: Optional[Callable[[], None]] = None
        self.error: Optional[BaseException] = None
        self._lock = threading.Lock()

    def __call__(self, sid: str, lease: int, cancel: Optional[CancelToken]) -> Target:
        with self._lock:
            self.calls.append((sid, lease))
            n = len(self.calls)
        if self.hook is not None:
            self.hook()
        if self.error is not None:
            raise self.error
        return target(n)

    def hold(
        self, *, first_only: bool = False, then: Optional[BaseException] = None
    ) -> Tuple[threading.Event, threading.Event]:
        """Make connects (only the first with ``first_only``) wait, bounded, for ``release``.

        Returns ``(entered, release)``: ``entered`` is set when a connect starts waiting; a
        released connect raises ``then`` if given.
        """
        entered = threading.Event()
        release = threading.Event()
        first = [True]

        def hook() -> None:
            if first_only and not first[0]:
                return
            first[0] = False
            entered.set()
            assert release.wait(10)
            if then is not None:
                raise then

        self.hook = hook
        return entered, release


class Submitted:
    """Collects background jobs so a test runs them when it wants."""

    def __init__(self) -> None:
        self.jobs: List[Callable[[], None]] = []

    def __call__(self, fn: Callable[[], None]) -> None:
        self.jobs.append(fn)

    def run_all(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            job()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def connector() -> Connector:
    return Connector()


@pytest.fixture
def submitted() -> Submitted:
    return Submitted()


@pytest.fixture
def cache(clock: FakeClock, connector: Connector, submitted: Submitted) -> LeaseCache:
    return LeaseCache(connector, lifetime=3600, submit=submitted, clock=clock)


def test_cold_sandbox_connects_once_then_is_served_from_memory(
    cache: LeaseCache, connector: Connector
) -> None:
    first = cache.get(SID, need=180, lease_seconds=3600)
    for _ in range(50):
        assert cache.get(SID, need=180, lease_seconds=3600) == first
    assert connector.calls == [(SID, 3600)]
    assert cache.connects == 1


def test_a_call_that_needs_more_than_is_left_connects(
    cache: LeaseCache, connector: Connector, clock: FakeClock
) -> None:
    cache.get(SID, need=180, lease_seconds=3600)
    clock.advance(3600 - 180)  # exactly 180 s left: still enough
    cache.get(SID, need=180, lease_seconds=3600)
    assert len(connector.calls) == 1
    clock.advance(0.001)
    cache.get(SID, need=180, lease_seconds=3600)
    assert len(connector.calls) == 2


def test_lease_end_counts_from_when_the_connect_was_sent(
    clock: FakeClock, connector: Connector
) -> None:
    connector.hook = lambda: clock.advance(5.0)  # the connect takes 5 s
    cache = LeaseCache(connector, lifetime=3600, clock=clock)
    cache.get(SID, need=10, lease_seconds=100)
    lease = cache.lease(SID)
    assert lease is not None
    assert lease.ends_at == pytest.approx(clock.now - 5.0 + 100)


def test_remembered_create_answer_serves_calls(
    cache: LeaseCache, connector: Connector, clock: FakeClock
) -> None:
    cache.remember(SID, target(7), 3600, clock.now)
    assert cache.get(SID, need=180, lease_seconds=3600) == target(7)
    assert connector.calls == []


def test_forget_makes_the_next_call_connect(cache: LeaseCache, connector: Connector) -> None:
    cache.get(SID, need=1, lease_seconds=3600)
    cache.forget(SID)
    cache.get(SID, need=1, lease_seconds=3600)
    assert len(connector.calls) == 2


def test_connect_always_connects(cache: LeaseCache, connector: Connector) -> None:
    cache.get(SID, need=1, lease_seconds=3600)
    cache.connect(SID, lease_seconds=3600)
    assert len(connector.calls) == 2


def test_renewal_runs_off_the_callers_path_once_half_the_lifetime_is_gone(
    cache: LeaseCache, connector: Connector, submitted: Submitted, clock: FakeClock
) -> None:
    first = cache.get(SID, need=180, lease_seconds=3600)
    clock.advance(1799)
    cache.get(SID, need=180, lease_seconds=3600)
    assert submitted.jobs == []  # more than half left
    clock.advance(2)
    for _ in range(5):  # served at once, and only one renewal is queued
        assert cache.get(SID, need=180, lease_seconds=3600) == first
    assert len(submitted.jobs) == 1
    assert len(connector.calls) == 1
    submitted.run_all()
    assert len(connector.calls) == 2
    lease = cache.lease(SID)
    assert lease is not None and lease.ends_at == pytest.approx(clock.now + 3600)
    clock.advance(1000)
    cache.get(SID, need=180, lease_seconds=3600)
    assert submitted.jobs == [] and len(connector.calls) == 2


def test_failed_renewal_is_logged_and_the_old_lease_kept(
    cache: LeaseCache, connector: Connector, submitted: Submitted, clock: FakeClock
) -> None:
    first = cache.get(SID, need=180, lease_seconds=3600)
    clock.advance(2000)
    cache.get(SID, need=180, lease_seconds=3600)
    connector.error = E2BHttpError(500, "boom")
    submitted.run_all()  # does not raise
    assert cache.get(SID, need=180, lease_seconds=3600) == first
    assert len(submitted.jobs) == 1  # tried again on the next call


def test_renewal_that_finds_the_sandbox_gone_forgets_it(
    cache: LeaseCache, connector: Connector, submitted: Submitted, clock: FakeClock
) -> None:
    cache.get(SID, need=180, lease_seconds=3600)
    clock.advance(2000)
    cache.get(SID, need=180, lease_seconds=3600)
    connector.error = SandboxGoneError("gone")
    submitted.run_all()
    assert cache.lease(SID) is None


def test_concurrent_callers_on_a_cold_sandbox_share_one_connect(
    cache: LeaseCache, connector: Connector
) -> None:
    entered, release = connector.hold()
    results: List[Target] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get(SID, need=1, lease_seconds=60)))
        for _ in range(20)
    ]
    for t in threads:
        t.start()
    assert entered.wait(10)
    release.set()
    for t in threads:
        t.join(10)
    assert len(results) == 20 and set(results) == {target(1)}
    assert len(connector.calls) == 1


def test_followers_get_the_leaders_error(cache: LeaseCache, connector: Connector) -> None:
    entered, release = connector.hold()
    connector.error = SandboxGoneError("gone")
    errors: List[BaseException] = []

    def call() -> None:
        try:
            cache.get(SID, need=1, lease_seconds=60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(5)]
    for t in threads:
        t.start()
    assert entered.wait(10)
    release.set()
    for t in threads:
        t.join(10)
    assert len(errors) == 5 and all(isinstance(e, SandboxGoneError) for e in errors)
    assert len(connector.calls) == 1


def _leader_and_follower(entered: threading.Event, leader: Callable[[], object],
                         follower: Callable[[], object], meanwhile: Callable[[], object]) -> None:
    """``leader`` in a thread until the connect it leads was entered, then ``follower`` in
    another; ``meanwhile`` runs, and both threads are joined."""
    lt = threading.Thread(target=leader)
    lt.start()
    assert entered.wait(10)
    ft = threading.Thread(target=follower)
    ft.start()
    meanwhile()
    lt.join(10)
    ft.join(10)


def test_a_cancelled_leader_does_not_cancel_its_followers(
    cache: LeaseCache, connector: Connector
) -> None:
    leader_token = CancelToken()
    entered = threading.Event()
    first = [True]

    def hook() -> None:
        if first[0]:
            first[0] = False
            entered.set()
            assert leader_token.wait(10)
            raise Cancelled(leader_token.reason)

    connector.hook = hook
    out: List[object] = []

    def leader() -> None:
        try:
            cache.get(SID, need=1, lease_seconds=60, cancel=leader_token)
        except Cancelled as exc:
            out.append(exc)

    _leader_and_follower(entered, leader,
                         lambda: out.append(cache.get(SID, need=1, lease_seconds=60)),
                         leader_token.cancel)
    assert any(isinstance(o, Cancelled) for o in out)
    assert target(2) in out  # the follower connected itself
    assert len(connector.calls) == 2


def test_a_follower_can_cancel_its_wait(cache: LeaseCache, connector: Connector) -> None:
    entered, release = connector.hold()
    lt = threading.Thread(target=lambda: cache.get(SID, need=1, lease_seconds=60))
    lt.start()
    assert entered.wait(10)
    tok = CancelToken()
    tok.cancel()
    with pytest.raises(Cancelled):
        cache.get(SID, need=1, lease_seconds=60, cancel=tok)
    release.set()
    lt.join(10)


def test_keyboard_interrupt_in_the_leader_is_not_raised_in_followers(
    cache: LeaseCache, connector: Connector
) -> None:
    entered, release = connector.hold(first_only=True, then=KeyboardInterrupt())
    out: List[object] = []

    def leader() -> None:
        try:
            cache.get(SID, need=1, lease_seconds=60)
        except KeyboardInterrupt as exc:
            out.append(exc)

    _leader_and_follower(entered, leader,
                         lambda: out.append(cache.get(SID, need=1, lease_seconds=60)),
                         release.set)
    assert any(isinstance(o, KeyboardInterrupt) for o in out) and target(2) in out


def test_stale_target_is_refreshed_once_for_many_callers(
    cache: LeaseCache, connector: Connector
) -> None:
    old = cache.get(SID, need=1, lease_seconds=60)
    fresh = cache.get(SID, need=1, lease_seconds=60, stale=old)
    assert fresh != old and len(connector.calls) == 2
    # a second caller that saw the same stale target takes the refreshed one
    assert cache.get(SID, need=1, lease_seconds=60, stale=old) == fresh
    assert len(connector.calls) == 2


def test_shared_answer_with_a_shorter_lease_is_not_enough(
    cache: LeaseCache, connector: Connector
) -> None:
    entered, release = connector.hold(first_only=True)
    got: List[Target] = []
    _leader_and_follower(entered, lambda: cache.get(SID, need=1, lease_seconds=60),
                         lambda: got.append(cache.get(SID, need=500, lease_seconds=600)),
                         release.set)
    assert [c[1] for c in connector.calls] == [60, 600]


def test_running_sandbox_lease_is_only_extended(cache: LeaseCache, clock: FakeClock) -> None:
    cache.get(SID, need=1, lease_seconds=3600)
    cache.remember(SID, target(1), 100, clock.now)  # same target, shorter TTL asked
    lease = cache.lease(SID)
    assert lease is not None and lease.seconds == 3600
    cache.remember(SID, target(1, resumed=True), 100, clock.now)  # resumed: a new TTL
    lease = cache.lease(SID)
    assert lease is not None and lease.seconds == 100


def test_size_is_bounded_least_recently_used_first(clock: FakeClock) -> None:
    cache = LeaseCache(Connector(), lifetime=3600, clock=clock, max_entries=3)
    ids = [f"isandbox{i:013d}" for i in range(5)]
    for sid in ids[:3]:
        cache.remember(sid, target(), 3600, clock.now)
    cache.get(ids[0], need=1, lease_seconds=3600)  # touch the oldest
    for sid in ids[3:]:
        cache.remember(sid, target(), 3600, clock.now)
    assert len(cache) == 3
    assert cache.lease(ids[0]) is not None
    assert cache.lease(ids[1]) is None and cache.lease(ids[2]) is None
