"""Many execs at once on one sandbox, from many threads, with a constant library thread count."""

from __future__ import annotations

import threading

import pytest
from waiting import run_in_threads

from e2b_provider import E2BSandboxProvider, SandboxHandle

pytestmark = pytest.mark.integration

N = 200


def _library_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("e2b-provider"))


def test_200_concurrent_execs_from_200_threads(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    results: dict = {}
    errors: list = []
    start = threading.Barrier(N)
    peak = [0]

    def run(i: int) -> None:
        try:
            start.wait(30)
            r = shared_provider.exec(
                sandbox, f"sleep 0.5; echo out-{i}; echo err-{i} >&2", timeout=120.0
            )
            peak[0] = max(peak[0], _library_threads())
            results[i] = r
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    run_in_threads(run, N, 180)
    assert not errors, errors[:3]
    assert len(results) == N
    for i, r in results.items():
        assert r.exit_code == 0, r
        assert r.stdout == f"out-{i}\n" and r.stderr == f"err-{i}\n"
    # one watchdog + a bounded worker pool, however many execs ran
    assert peak[0] <= 1 + 16
    assert _library_threads() <= 1 + 16
