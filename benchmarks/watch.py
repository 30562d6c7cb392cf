"""Watch event latency: from a file's creation in the sandbox to its event in the client.

A writer in the sandbox (``python3``, started with ``start``) creates files one at a time,
``--interval`` ms apart, each named by the wall-clock time (ns) just before it made it; the
client takes the time as each event is handed to it, so latency = receipt - name (the
emulator's sandboxes share this machine's wall clock). Contenders, interleaved round by
round (the order rotated), each watching a fresh directory for a round of ``--writes``
files:

- floor: envd's ``filesystem.Filesystem/WatchDir`` read with a bare ``requests`` stream
  (``read1``, Connect envelopes decoded, nothing else);
- provider: ``watch(h, dir)``, iterated.

Then, once: a flood of ``--flood`` events while the client reads nothing, then read to the
first ``overflow`` (events seen before it, the client's peak traced memory: bounded).

    python benchmarks/watch.py [--rounds 6] [--writes 50] [--interval 20] [--flood 400000]
"""

from __future__ import annotations

import argparse
import json
import struct
import time
import tracemalloc
import uuid
from typing import Callable, Dict, List

import _bench as b

GOAL_MS = 50.0

WRITER = (
    "import os, sys, time\n"
    "d, n, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 1000\n"
    "time.sleep(0.5)  # the client reads by then (start has returned)\n"
    "for _ in range(n):\n"
    "    t = time.time_ns()\n"
    "    os.close(os.open(f'{d}/{t}', os.O_CREAT | os.O_WRONLY))\n"
    "    time.sleep(gap)\n"
)
FLOOD = (
    "import os, sys\n"
    "fds = [os.open(sys.argv[1] + n, os.O_CREAT | os.O_WRONLY) for n in ('/a', '/b')]\n"
    "for i in range(int(sys.argv[2])): os.write(fds[i % 2], b'x')\n"
)


def latency_ms(path: str, received_ns: int) -> float:
    return (received_ns - int(path.rsplit("/", 1)[1])) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description="watch: write-to-event latency vs a bare floor")
    ap.add_argument("--rounds", type=int, default=6, help="measured rounds (default 6)")
    ap.add_argument("--writes", type=int, default=50, help="files per round (default 50)")
    ap.add_argument("--interval", type=float, default=20.0,
                    help="ms between two files (default 20)")
    ap.add_argument("--flood", type=int, default=400_000,
                    help="events of the flood (default 400000)")
    args = ap.parse_args()

    with b.on_emulator("bn-watch") as (ep, provider, (h,)):
        raw = b.RawEnvd(ep, h.id)
        provider.write_file(h, "/workspace/writer.py", WRITER.encode())
        provider.write_file(h, "/workspace/flood.py", FLOOD.encode())

        def fresh() -> str:
            d = f"/workspace/w-{uuid.uuid4().hex[:8]}"
            assert provider.exec(h, f"mkdir {d}").ok
            return d

        def write(d: str) -> None:
            provider.start(h, f"python3 /workspace/writer.py {d} {args.writes} {args.interval}")

        samples: Dict[str, List[float]] = {"floor (bare WatchDir)": [], "provider watch": []}

        def floor_round() -> None:
            d = fresh()
            r = raw.session.post(
                f"{ep.sandbox_url}/filesystem.Filesystem/WatchDir",
                data=b.envelope({"path": d}),
                headers={**raw.rpc_headers(), "Keepalive-Ping-Interval": "50"},
                stream=True, timeout=(10, 120),
            )
            r.raise_for_status()
            buf = bytearray()
            started = False
            got = 0
            try:
                while got < args.writes:
                    chunk = r.raw.read1(65536)
                    if not chunk:
                        raise RuntimeError("the WatchDir stream ended")
                    now = time.time_ns()
                    buf += chunk
                    while len(buf) >= 5:
                        flags, n = struct.unpack_from(">BI", buf, 0)
                        if len(buf) < 5 + n:
                            break
                        msg = json.loads(bytes(buf[5 : 5 + n]))
                        del buf[: 5 + n]
                        if flags & 0x02:
                            raise RuntimeError(f"WatchDir ended: {msg}")
                        if "start" in msg and not started:
                            started = True
                            write(d)
                        fs = msg.get("filesystem")
                        if fs and fs.get("type") == "EVENT_TYPE_CREATE":
                            samples["floor (bare WatchDir)"].append(
                                latency_ms(f"{d}/{fs['name']}", now))
                            got += 1
            finally:
                r.close()

        def provider_round() -> None:
            d = fresh()
            got = 0
            with provider.watch(h, d, timeout=120) as events:
                write(d)
                for event in events:
                    now = time.time_ns()
                    if event.type == "create":
                        samples["provider watch"].append(latency_ms(event.path, now))
                        got += 1
                        if got == args.writes:
                            break

        contenders: Dict[str, Callable[[], object]] = {
            "floor (bare WatchDir)": floor_round,
            "provider watch": provider_round,
        }
        b.interleaved(contenders, args.rounds, warmup=1)
        for values in samples.values():
            del values[: args.writes]  # the warm-up round's

        # a flood while nobody reads, then read to the overflow
        d = fresh()
        tracemalloc.start()
        seen = 0
        overflow = False
        t0 = time.monotonic()
        with provider.watch(h, d, timeout=300) as events:
            assert provider.exec(h, f"python3 /workspace/flood.py {d} {args.flood}",
                                 timeout=300).ok
            for event in events:
                if event.type == "overflow":
                    overflow = True
                    break
                seen += 1
        flood_s = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()

    rows = [[name, len(v), f"{b.median(v):.2f}", f"{b.p95(v):.2f}", f"{max(v):.2f}"]
            for name, v in samples.items()]
    print(b.table(
        f"write -> event latency on loopback (emulator), {args.rounds} rounds of {args.writes} "
        f"files {args.interval:g} ms apart", ["contender", "events", "median ms", "p95 ms",
                                               "max ms"], rows))
    floor_med = b.median(samples["floor (bare WatchDir)"])
    ours_med, ours_p95 = b.median(samples["provider watch"]), b.p95(samples["provider watch"])
    print(f"provider adds {ours_med - floor_med:.2f} ms (median) to the floor "
          f"({b.ratio(ours_med, floor_med)}); goal <= {GOAL_MS:g} ms from write to event: "
          f"{'met' if ours_p95 <= GOAL_MS else 'NOT met'} (p95 {ours_p95:.2f} ms)")
    print(f"flood of {args.flood} events, nothing read meanwhile: {seen} events before the "
          f"{'overflow' if overflow else 'end (no overflow)'}, {flood_s:.1f} s, client peak "
          f"traced memory {peak / (1 << 20):.2f} MiB")


if __name__ == "__main__":
    main()
