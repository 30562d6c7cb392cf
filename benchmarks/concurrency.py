"""1,000 concurrent ``sleep 1`` over 10 sandboxes: errors, wall time and library threads.

Ten sandboxes of one local emulator; 1,000 caller threads (ours) released together by a
barrier, thread ``i`` running ``sleep 1`` in sandbox ``i % 10``:

- provider: ``E2BSandboxProvider.exec(h, "sleep 1")`` (one provider shared by all threads);
- sdk:      the official SDK's **sync** client, ``commands.run("sleep 1")`` on one ``Sandbox``
            object per sandbox, from the same 1,000 threads (its defaults, e.g. at most
            ``E2B_MAX_CONNECTIONS`` = 200 connections per address, are left as they are).

Each round runs in a fresh client process (this script with ``--child``), after one warm-up
call per sandbox. Per contender and round: errors (exceptions, or an exit code other than
0), wall time from the barrier to the last finished call, and the library's threads: every
OS thread of that process except the main thread, the sampler and the 1,000 callers
(Python and native, e.g. the SDK's Rust runtime), sampled every 20 ms: before the round
(after the warm-up), the peak during it and 0.5 s after it. Rounds alternate the
contenders' order. Ratio: provider wall / SDK wall.

    python benchmarks/concurrency.py [--runs 2] [--threads 1000] [--sandboxes 10]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import threading
import time
from typing import Any, Callable, Counter, Dict, List, Set

import _bench as b

from e2b_provider import E2BSandboxProvider

#: the goal: provider wall at most this times the SDK's (with 0 errors)
WALL_GOAL = 1.2


def tasks() -> Set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def one_round(
    call: Callable[[int], None], threads: int, ours: Set[int], stop_after: float
) -> Dict[str, Any]:
    """Run ``call(i)`` in ``threads`` new threads at once; errors, wall, library threads."""
    errors: Counter[str] = collections.Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(threads + 1)
    done = threading.Event()
    finished: List[float] = []
    peak = [0]

    def library_threads() -> int:
        return len(tasks() - ours)

    def sample() -> None:
        ours.add(threading.get_native_id())
        while not done.wait(0.02):
            peak[0] = max(peak[0], library_threads())

    def worker(i: int) -> None:
        with lock:
            ours.add(threading.get_native_id())
        barrier.wait()
        try:
            call(i)
        except Exception as exc:
            with lock:
                errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
        with lock:
            finished.append(time.perf_counter())

    before = library_threads()
    sampler = threading.Thread(target=sample, name="bn-sampler", daemon=True)
    sampler.start()
    workers = [
        threading.Thread(target=worker, args=(i,), name=f"bn-worker-{i}", daemon=True)
        for i in range(threads)
    ]
    for t in workers:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    deadline = time.monotonic() + stop_after
    for t in workers:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = sum(t.is_alive() for t in workers)
    done.set()
    sampler.join()
    wall = (max(finished) if finished else time.perf_counter()) - t0
    time.sleep(0.5)  # let finished library work settle before the "after" count
    return {
        "errors": sum(errors.values()) + hung,
        "kinds": dict(errors, **({"still running": hung} if hung else {})),
        "wall": wall,
        "threads": (before, peak[0], library_threads()),
    }


def child(args: argparse.Namespace) -> None:
    """One round in this fresh process (so every other thread here is the library's)."""
    ep = b.child_endpoint(args.url)
    ids = args.ids.split(",")
    ours: Set[int] = {threading.get_native_id()}
    if args.child == "provider":
        provider = E2BSandboxProvider(b.provider_config(ep))

        def call(i: int) -> None:
            r = provider.exec(ids[i % len(ids)], "sleep 1", timeout=120)
            if r.exit_code != 0:
                raise RuntimeError(f"exit {r.exit_code} {r.stderr[:80]}")

        for sid in ids:  # warm up on every sandbox
            provider.exec(sid, "true")
    else:
        boxes = [b.sdk_connect(ep, sid) for sid in ids]

        def call(i: int) -> None:
            boxes[i % len(boxes)].commands.run("sleep 1", timeout=120)

        for box in boxes:
            box.commands.run("true")
    print(json.dumps(one_round(call, args.threads, ours, 300)))


def main() -> None:
    ap = argparse.ArgumentParser(
        description="1,000 concurrent 'sleep 1' over 10 sandboxes: provider vs official SDK "
        "(sync client from 1,000 threads)."
    )
    ap.add_argument("--runs", type=int, default=2, help="rounds per contender (default 2)")
    ap.add_argument("--threads", type=int, default=1000, help="concurrent calls (default 1000)")
    ap.add_argument("--sandboxes", type=int, default=10, help="sandboxes (default 10)")
    ap.add_argument("--child", choices=("provider", "sdk"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    results: Dict[str, List[Dict[str, Any]]] = {"provider": [], "sdk": []}
    names = [f"bn-conc-{i}" for i in range(args.sandboxes)]
    with b.on_emulator(*names) as (ep, _, handles):
        ids = ",".join(h.id for h in handles)
        for r in range(args.runs):
            for name in b.rotated(list(results), r):
                child_args = ["--child", name, "--url", ep.sandbox_url, "--ids", ids]
                child_args += ["--threads", str(args.threads)]
                results[name].append(b.run_child(__file__, child_args, ep.api_key, 900))

    wall = {k: b.median([x["wall"] for x in v]) for k, v in results.items()}
    rows = []
    for name, runs in results.items():
        rows.append(
            [
                name,
                sum(x["errors"] for x in runs),
                f"{wall[name]:.2f}",
                " ".join(f"{x['wall']:.1f}" for x in runs),
                b.ratio(wall[name], wall["sdk"]),
                " ".join("{}/{}/{}".format(*x["threads"]) for x in runs),
            ]
        )
    print(
        b.table(
            f"{args.threads} concurrent 'sleep 1' over {args.sandboxes} sandboxes, "
            f"{args.runs} rounds each (order alternated)",
            [
                "contender",
                "errors",
                "median wall s",
                "each round s",
                "x sdk",
                "library threads before/peak/after",
            ],
            rows,
        )
    )
    for name, runs in results.items():
        for x in runs:
            for kind, count in x["kinds"].items():
                print(f"  {name} error x{count}: {kind}")
    errors = sum(x["errors"] for x in results["provider"])
    ok = errors == 0 and wall["provider"] <= WALL_GOAL * wall["sdk"]
    print(f"goal: 0 errors and wall <= {WALL_GOAL}x sdk: {'ok' if ok else 'not met'}")


if __name__ == "__main__":
    main()
