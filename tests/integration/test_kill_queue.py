"""The kill job behind a busy worker pool: bounded exec, and no stale kill after a reboot."""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterator, List

import pytest
from waiting import last_request

from e2b_provider import E2BSandboxProvider
from e2b_provider._watchdog import Watchdog

from .conftest import unique_name

pytestmark = pytest.mark.integration

TIMEOUT = 1.0
KILL_BOUND = 2.0
GRACE = 1.0


@pytest.fixture
def busy_pool() -> Iterator[tuple[Watchdog, threading.Event]]:
    """A private watchdog whose only worker is held until the event is set."""
    wd = Watchdog(workers=1)
    release = threading.Event()
    blocker = wd.submit(release.wait, 60.0)
    try:
        yield wd, release
    finally:
        release.set()
        blocker.result(timeout=10.0)
        wd.close()


def test_queued_kill_keeps_the_bound_and_never_runs_after_the_reboot(
    emu, busy_pool, caplog
) -> None:  # type: ignore[no-untyped-def]
    wd, release = busy_pool
    reboot_started: List[float] = []

    class Mark(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "rebooting sandbox" in record.getMessage():
                reboot_started.append(time.monotonic())

    mark = Mark()
    logging.getLogger("e2b_provider").addHandler(mark)
    try:
        with E2BSandboxProvider(
            emu.config(template="base"),
            watchdog=wd,
            kill_bound=KILL_BOUND,
            kill_grace=GRACE,
            reboot_bound=30.0,
        ) as p:
            h = p.create(unique_name("killq"))
            try:
                t0 = time.monotonic()
                r = p.exec(h, "sleep 30", timeout=TIMEOUT)
                assert r.timed_out and r.exit_code is None
                # The kill never got a worker: the sandbox counts as wedged once the kill's
                # bound (from its submission) is over, not a second bound later.
                assert r.wedged
                assert reboot_started, "the wedged sandbox was not rebooted"
                assert reboot_started[0] - t0 < TIMEOUT + KILL_BOUND + 1.0 + GRACE

                # Once the pool is free again, the kill of this finished exec must not run
                # against the rebooted sandbox (its pid may belong to a new process now).
                mark = last_request(emu)
                release.set()
                # The pool's one worker runs its queue in order, each job to its end: once
                # a job queued now has run, a kill job still in the queue would have sent
                # its requests already.
                wd.submit(lambda: None).result(timeout=30.0)
                late = [
                    e["path"]
                    for e in emu.requests(sandbox_id=h.id)
                    if e["seq"] > mark and "process.Process" in e["path"]
                ]
                assert late == []
            finally:
                p.destroy(h)
    finally:
        logging.getLogger("e2b_provider").removeHandler(mark)
