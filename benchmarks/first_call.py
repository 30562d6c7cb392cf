"""The first file call on a fresh sandbox: provider vs the official SDK, on one emulator.

Each round creates fresh sandboxes (one per contender, off the clock) and times the first
file call made on each right after its create returned:

- one file: ``provider.write_file`` vs the SDK's ``files.write`` (as ``sandbox``);
- 50 files: ``provider.write_files`` vs the SDK's ``files.write_files`` (one multipart
  request), 1 KiB each, in 5 directories;
- 50 files as a tree: ``provider.upload`` of a local directory of the same 50 files;
- the floor of any write that runs a program in the sandbox: the SDK's
  ``commands.run("true")`` (as ``sandbox``) on a fresh sandbox. envd's ``POST /files``, which
  the SDK's writes use, writes as root and follows links (``O_TRUNC`` in place, then
  ``chown``), so the provider never writes a user's path through it: its first write runs
  a program (a script; later calls, the file agent), and this row says what that costs.

Contenders are interleaved round by round (the order rotated). For every first call the
emulator's request log gives the number of requests the sandbox received during it
(round trips on a fresh connection are at least that many, unless some went in parallel).
Prints medians, the requests, and each provider call's ratio to the SDK's call of the same
files measured in the same run (goal of the one-file and 50-file calls: <= 1.5x).

    python benchmarks/first_call.py [--rounds 7] [--files 50] [--size 1024]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

import _bench as b

GOAL = 1.5


def main() -> None:
    ap = argparse.ArgumentParser(description="the first file call on a fresh sandbox: "
                                 "provider vs SDK")
    ap.add_argument("--rounds", type=int, default=7, help="measured rounds (default 7)")
    ap.add_argument("--files", type=int, default=50, help="files in the batch (default 50)")
    ap.add_argument("--size", type=int, default=1024, help="bytes per file (default 1024)")
    args = ap.parse_args()

    from e2b import Sandbox

    from e2b_provider import E2BSandboxProvider
    from e2b_provider.emulator import Emulator

    data = {f"d{i % 5}/f{i}.txt": os.urandom(args.size) for i in range(args.files)}
    one = os.urandom(args.size)
    tmp = tempfile.mkdtemp(prefix="bn-first-")
    for rel, content in data.items():
        os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(tmp, rel), "wb") as f:
            f.write(content)
    times: Dict[str, List[float]] = {}
    calls: Dict[str, List[int]] = {}
    try:
        with Emulator() as emu:
            ep = b.Endpoint.of_emulator(emu)
            with E2BSandboxProvider(b.provider_config(ep)) as provider:
                def ours(first: Callable[[Any], object]) -> Callable[[], Tuple[str, Any]]:
                    def run() -> Tuple[str, Any]:
                        h = provider.create(f"bn-first-{time.monotonic_ns()}")
                        return h.id, lambda: first(h)
                    return run

                def sdk(first: Callable[[Any], object]) -> Callable[[], Tuple[str, Any]]:
                    def run() -> Tuple[str, Any]:
                        s = Sandbox.create("base", **b.sdk_opts(ep))
                        return s.sandbox_id, lambda: first(s)
                    return run

                batch = {f"/workspace/{rel}": d for rel, d in data.items()}
                contenders: Dict[str, Callable[[], Tuple[str, Any]]] = {
                    "provider write_file": ours(
                        lambda h: provider.write_file(h, "/workspace/one.txt", one)),
                    "sdk files.write": sdk(
                        lambda s: s.files.write("/workspace/one.txt", one, user="sandbox")),
                    "provider write_files": ours(lambda h: provider.write_files(h, batch)),
                    "sdk files.write_files": sdk(lambda s: s.files.write_files(
                        [{"path": k, "data": v} for k, v in batch.items()], user="sandbox")),
                    "provider upload": ours(lambda h: provider.upload(h, tmp, "/workspace/t")),
                    "sdk commands.run true": sdk(
                        lambda s: s.commands.run("true", user="sandbox")),
                }
                # each sandbox is destroyed after its call (the emulator's end takes any
                # left by a failure)
                for r in range(1 + args.rounds):  # round 0 warms up
                    for name in b.rotated(list(contenders), r):
                        sid, first = contenders[name]()
                        before = max([e["seq"] for e in emu.requests(sandbox_id=sid)] or [0])
                        t0 = time.perf_counter()
                        first()
                        took = time.perf_counter() - t0
                        n = len([e for e in emu.requests(sandbox_id=sid)
                                 if e["seq"] > before and e["kind"] == "envd"])
                        if r:
                            times.setdefault(name, []).append(took)
                            calls.setdefault(name, []).append(n)
                        if name.startswith("provider"):
                            provider.destroy(sid)
                        else:
                            Sandbox.kill(sid, **b.sdk_opts(ep))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: b.median(v) for k, v in times.items()}
    rows = [[k, b.ms(med[k]), b.ms(b.p95(v)), f"{b.median(calls[k]):.0f}"]
            for k, v in times.items()]
    print(b.table(f"first file call on a fresh sandbox, {args.rounds} rounds",
                  ["contender", "median ms", "p95 ms", "requests"], rows))
    for ours_name, theirs, goal in (
        ("provider write_file", "sdk files.write", GOAL),
        ("provider write_files", "sdk files.write_files", GOAL),
        ("provider upload", "sdk files.write_files", None),
        ("provider write_file", "sdk commands.run true", None),
    ):
        x = med[ours_name] / med[theirs]
        said = "" if goal is None else f" (goal <= {goal}: {'met' if x <= goal else 'NOT met'})"
        print(f"{ours_name} / {theirs}: {x:.2f}x{said}")


if __name__ == "__main__":
    main()
