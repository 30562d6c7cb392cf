"""Batched kills, checked before the in-sandbox backstop could hide a dropped one.

Every exec also runs under ``timeout -s KILL`` in the sandbox (its timeout + 5 s), which
would end a command whose kill was lost: these tests look for leftovers well before that, so
one kill dropped from a batch fails them. Each command leaves children behind, in its
session and out of it (``setsid``, double forks).
"""

from __future__ import annotations

import threading
import time
from typing import List

import pytest
from waiting import run_in_threads

from e2b_provider import E2BSandboxProvider, ExecResult
from e2b_provider.protocol import scripts as scripts

from .conftest import root, unique_name

pytestmark = pytest.mark.integration

TIMEOUT = 2.0
#: The in-sandbox backstop fires this long after a command started.
BACKSTOP = TIMEOUT + scripts.IN_SANDBOX_GRACE_SECONDS

FAMILY = (
    "sleep 300{m}{i}1 & setsid sleep 300{m}{i}2 & ( (setsid sleep 300{m}{i}3 &) ); "
    "echo started; sleep 300{m}{i}4"
)


def _burst(p: E2BSandboxProvider, n: int, batch_max: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scripts, "KILL_BATCH_MAX", batch_max)
    m = f"{time.monotonic_ns() % 10**6}"
    h = p.create(unique_name("batch"))
    try:
        results: List[ExecResult] = []
        lock = threading.Lock()
        began = time.monotonic()

        def one(i: int) -> None:
            r = p.exec(h, FAMILY.format(m=m, i=i), timeout=TIMEOUT)
            with lock:
                results.append(r)

        run_in_threads(one, n, 60)
        assert len(results) == n and all(r.timed_out and not r.wedged for r in results)
        # every exec returned after its kill worked: nothing of any family is left, and it is
        # looked at before the first backstop could have fired
        left = root(p, h, f"pgrep -f -- '^(/bin/)?sleep 300{m}' || true").split()
        looked = time.monotonic() - began
        assert left == [], f"{len(left)} processes outlived their exec's kill"
        # (a kill that was lost also shows here: its exec waits out the kill bound)
        assert looked < BACKSTOP - 0.5, (
            f"looked after {looked:.1f} s: the backstop may have hidden a lost kill"
        )
    finally:
        p.destroy(h)


def test_a_burst_of_timeouts_in_one_batch_leaves_no_process(
    emu, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    with E2BSandboxProvider(emu.config(template="base")) as p:
        _burst(p, n=12, batch_max=scripts.KILL_BATCH_MAX, monkeypatch=monkeypatch)


def test_more_kills_than_a_batch_takes_all_arrive(
    emu, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    # the batch maximum made small, so 12 queued kills need three batches
    with E2BSandboxProvider(emu.config(template="base")) as p:
        _burst(p, n=12, batch_max=5, monkeypatch=monkeypatch)
