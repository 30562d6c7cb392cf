"""A burst of timeouts: reboots, bystander deaths and time past the bound (issue 8, item 1).

``--threads`` execs of ``sleep 60`` with ``timeout=2`` start together (a barrier), spread
over ``--sandboxes`` sandboxes, while one ordinary command per sandbox runs beside them (it
waits for a flag file, then prints ``survived``). Every exec must come back timed out and
not wedged, within ``timeout + kill_bound + 1 s + grace``; no sandbox may be rebooted and no
ordinary command may die. Printed: outcomes, reboots (the provider's ``rebooting sandbox``
log line), bystander deaths, the most time past the timeout and past the bound, the
library's threads at their peak, and the burst's commands still running afterwards.

    python benchmarks/timeout_burst.py [--threads 1000] [--sandboxes 10] [--timeout 2]
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from e2b_provider import E2BSandboxProvider, ExecResult, SandboxHandle
from e2b_provider.emulator import Emulator

#: The provider's bounds in this run (its defaults).
KILL_BOUND_SECONDS = 20.0
GRACE = 3.0
FLAG = "/workspace/burst-done"


class _Reboots(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "rebooting sandbox" in record.getMessage():
            self.count += 1


def _library_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("e2b-provider"))


def run_burst(emu: Emulator, threads: int, sandboxes: int, timeout: float = 2.0) -> Dict[str, Any]:
    """Run one burst on ``emu``; the figures as a dict (see the module's docstring)."""
    reboots = _Reboots()
    logger = logging.getLogger("e2b_provider")
    logger.addHandler(reboots)
    try:
        with E2BSandboxProvider(
            emu.config(template="base"), kill_bound=KILL_BOUND_SECONDS, kill_grace=GRACE
        ) as p:
            hs = [p.create(f"burst-{i}-{time.monotonic_ns()}") for i in range(sandboxes)]
            try:
                return _burst(p, hs, threads, timeout, reboots)
            finally:
                for h in hs:
                    p.destroy(h)
    finally:
        logger.removeHandler(reboots)


def _burst(
    p: E2BSandboxProvider,
    hs: List[SandboxHandle],
    n: int,
    timeout: float,
    reboots: _Reboots,
) -> Dict[str, Any]:
    bystanders: List[Any] = [None] * len(hs)

    def bystander(j: int) -> None:
        try:
            bystanders[j] = p.exec(
                hs[j], f"while [ ! -e {FLAG} ]; do sleep 0.1; done; echo survived", timeout=900
            )
        except Exception as exc:
            bystanders[j] = exc

    watchers = [threading.Thread(target=bystander, args=(j,)) for j in range(len(hs))]
    for t in watchers:
        t.start()
    for h in hs:  # the ordinary command runs before the burst starts
        while p.exec(h, "pgrep -fc '[w]hile .*burst-done' || true").stdout.strip() == "0":
            time.sleep(0.1)

    results: List[Optional[Any]] = [None] * n
    took = [0.0] * n
    go = threading.Barrier(n + 1)
    peak = [0]

    def one(i: int) -> None:
        go.wait()
        t0 = time.monotonic()
        try:
            results[i] = p.exec(hs[i % len(hs)], "sleep 60", timeout=timeout)
        except Exception as exc:
            results[i] = exc
        took[i] = time.monotonic() - t0
        peak[0] = max(peak[0], _library_threads())

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    t0 = time.monotonic()
    go.wait()
    for t in ts:
        t.join()
    wall = time.monotonic() - t0
    for h in hs:
        p.write_file(h, FLAG, b"")
    for t in watchers:
        t.join(120)

    def kind(r: Any) -> str:
        if isinstance(r, Exception):
            return type(r).__name__
        assert isinstance(r, ExecResult)
        return "wedged" if r.wedged else "timed_out" if r.timed_out else f"exit {r.exit_code}"

    deaths = sum(1 for r in bystanders if not isinstance(r, ExecResult) or r.stdout != "survived\n")
    left = 0
    for h in hs:
        end = time.monotonic() + 30.0
        while True:
            count = int(p.exec(h, "pgrep -xc sleep || true").stdout.strip() or "0")
            if count == 0 or time.monotonic() > end:
                break
            time.sleep(0.5)
        left += count
    bound = timeout + KILL_BOUND_SECONDS + 1.0 + GRACE
    return {
        "execs": n,
        "sandboxes": len(hs),
        "outcomes": dict(collections.Counter(kind(r) for r in results)),
        "reboots": reboots.count,
        "bystander_deaths": deaths,
        "max_past_timeout_s": round(max(took) - timeout, 2),
        "max_past_bound_s": round(max(took) - bound, 2),
        "wall_s": round(wall, 1),
        "library_threads_peak": peak[0],
        "burst_commands_left": left,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1000)
    ap.add_argument("--sandboxes", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=2.0)
    args = ap.parse_args()
    with Emulator(startup_timeout=60.0) as emu:
        out = run_burst(emu, args.threads, args.sandboxes, args.timeout)
    for key, value in out.items():
        print(f"{key:>22}: {value}")
    ok = (
        out["reboots"] == 0
        and out["bystander_deaths"] == 0
        and out["max_past_bound_s"] <= 0
        and set(out["outcomes"]) == {"timed_out"}
    )
    print(
        "goal (0 reboots, 0 bystander deaths, all timed out within the bound):",
        "met" if ok else "NOT met",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
