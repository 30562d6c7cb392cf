"""Many small files on loopback: 200 x 1 KiB up and down, provider vs the official SDK.

- up:   ``provider.write_files(h, {200 paths})`` vs the SDK's ``files.write_files([...])``
        (one multipart request) and vs 200 SDK ``files.write`` calls;
- down: ``provider.read_files(h, [200 paths])`` vs 200 SDK ``files.read`` calls (the SDK
        has no batch read).

Rounds are interleaved (the order rotated), each contender writing its own directory.
Prints medians and the ratios issue 15 asks about: our write_files / SDK write_files
(goal <= 1.0) and our read_files / SDK's 200 reads (goal <= 0.2).

    python benchmarks/batch_files.py [--rounds 15] [--files 200] [--size 1024]
"""

from __future__ import annotations

import argparse
import os
from typing import Callable, Dict

import _bench as b

GOAL_WRITE = 1.0
GOAL_READ = 0.2


def main() -> None:
    ap = argparse.ArgumentParser(description="200 x 1 KiB up and down: provider vs SDK.")
    ap.add_argument("--rounds", type=int, default=15, help="measured rounds (default 15)")
    ap.add_argument("--files", type=int, default=200, help="files per batch (default 200)")
    ap.add_argument("--size", type=int, default=1024, help="bytes per file (default 1024)")
    args = ap.parse_args()

    with b.on_emulator("bn-batch") as (ep, provider, (h,)):
        sdk = b.sdk_connect(ep, h.id)
        data = {i: os.urandom(args.size) for i in range(args.files)}

        def paths(who: str) -> Dict[str, bytes]:
            return {f"/workspace/{who}/d{i % 10}/f{i}": d for i, d in data.items()}

        ours, sdk_batch, sdk_each = paths("p"), paths("s"), paths("e")
        provider.write_files(h, ours)  # warm: the agent is up, the directories exist
        sdk.files.write_files([{"path": k, "data": v} for k, v in sdk_batch.items()],
                              user="sandbox")
        for k, v in sdk_each.items():
            sdk.files.write(k, v, user="sandbox")

        def sdk_reads() -> None:
            for k in sdk_batch:
                sdk.files.read(k, format="bytes", user="sandbox")

        def sdk_writes() -> None:
            for k, v in sdk_each.items():
                sdk.files.write(k, v, user="sandbox")

        contenders: Dict[str, Callable[[], object]] = {
            "provider write_files": lambda: provider.write_files(h, ours),
            "sdk write_files": lambda: sdk.files.write_files(
                [{"path": k, "data": v} for k, v in sdk_batch.items()], user="sandbox"
            ),
            "sdk 200 x write": sdk_writes,
            "provider read_files": lambda: provider.read_files(h, list(ours)),
            "sdk 200 x read": sdk_reads,
        }
        res = b.interleaved(contenders, args.rounds, warmup=2)

    med = {k: b.median(v) for k, v in res.items()}
    rows = [[k, b.ms(med[k]), b.ms(b.p95(v))] for k, v in res.items()]
    print(b.table(f"{args.files} x {args.size} B on loopback, {args.rounds} rounds",
                  ["contender", "median ms", "p95 ms"], rows))
    w = med["provider write_files"] / med["sdk write_files"]
    r = med["provider read_files"] / med["sdk 200 x read"]
    print(f"write_files / SDK write_files: {w:.2f}x (goal <= {GOAL_WRITE}: "
          f"{'met' if w <= GOAL_WRITE else 'NOT met'})")
    print(f"write_files / SDK 200 x write: "
          f"{med['provider write_files'] / med['sdk 200 x write']:.2f}x")
    print(f"read_files / SDK 200 x read:   {r:.2f}x (goal <= {GOAL_READ}: "
          f"{'met' if r <= GOAL_READ else 'NOT met'})")


if __name__ == "__main__":
    main()
