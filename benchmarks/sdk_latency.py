"""The official SDK against the local emulator: sandbox create time and command latency.

- create: ``Sandbox.create()`` (boot of a namespaced sandbox, answer, first envd contact)
- run:    ``Sandbox.commands.run("true")`` on one sandbox, after a warm-up

Prints each create time, and the median and p95 of the command runs. A median above
``--budget-ms`` (default 500 ms) is reported, and makes the exit status 1, so a run on a quiet
machine can be used as a check; on a loaded machine the figure says little.

    python benchmarks/sdk_latency.py [--creates 3] [--runs 50] [--budget-ms 500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, List

from e2b import Sandbox

from e2b_provider.emulator import Emulator


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=3)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--budget-ms", type=float, default=500.0)
    args = ap.parse_args()

    with Emulator() as emu:
        os.environ.update(emu.sdk_env())  # the SDK reads its endpoints from the environment
        sandboxes: List[Sandbox] = []
        try:
            creates = []
            for _ in range(max(1, args.creates)):
                t0 = time.perf_counter()
                sandboxes.append(Sandbox.create(timeout=300))
                creates.append(time.perf_counter() - t0)
            sb = sandboxes[0]
            for _ in range(5):
                sb.commands.run("true")  # warm the connection pool
            runs = [timed(lambda: sb.commands.run("true")) for _ in range(max(2, args.runs))]
        finally:
            for s in sandboxes:
                s.kill()

    median_ms = statistics.median(runs) * 1000
    p95_ms = statistics.quantiles(runs, n=20)[-1] * 1000
    print("sandbox create:", ", ".join(f"{c:.3f} s" for c in creates))
    print(f'commands.run("true") over {len(runs)} runs: median {median_ms:.1f} ms, '
          f"p95 {p95_ms:.1f} ms")
    if median_ms > args.budget_ms:
        print(f"median above the budget of {args.budget_ms:.0f} ms", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
