"""Back-to-back ``exec("echo hi")``: execs per second and client CPU per exec, on loopback.

One sandbox of one local emulator, one thread, each contender running N calls in a row:

- provider: ``E2BSandboxProvider.exec(h, "echo hi")``
- sdk:      the official SDK's ``commands.run("echo hi")`` (sync client)
- floor:    one bare ``process.Process/Start`` of ``/bin/echo hi`` with ``requests`` over a
            kept connection (no wrapper, no output decoding beyond finding the end event)

The calls run in blocks (default 10 blocks of 50 per contender, 500 each), contenders
interleaved block by block with the order rotated. Per contender: execs/s = calls / summed
block wall time; client CPU per exec = summed ``time.process_time`` (this whole process, all
threads) / calls. Ratios against the SDK, and for CPU also against the floor (a bare
``requests`` call).

    python benchmarks/back_to_back.py [--calls 500] [--block 50]
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Dict, List

import _bench as b

#: issue 7's goals, as revised: provider execs/s at least RATE_GOAL times the SDK's; client
#: CPU per exec at most CPU_GOAL times the floor's (a bare requests call)
RATE_GOAL, CPU_GOAL = 0.85, 1.1


def main() -> None:
    ap = argparse.ArgumentParser(
        description="500 back-to-back exec('echo hi'): execs/s and client CPU per exec, "
        "provider vs official SDK vs bare floor."
    )
    ap.add_argument("--calls", type=int, default=500, help="calls per contender (default 500)")
    ap.add_argument("--block", type=int, default=50, help="calls per block (default 50)")
    args = ap.parse_args()
    blocks = max(1, args.calls // args.block)

    with b.on_emulator("bn-b2b") as (ep, provider, (h,)):
        sdk = b.sdk_connect(ep, h.id)
        floor = b.RawEnvd(ep, h.id)

        def via_provider() -> None:
            if provider.exec(h, "echo hi").stdout != "hi\n":
                raise AssertionError("provider: wrong output")

        def via_sdk() -> None:
            if sdk.commands.run("echo hi").stdout != "hi\n":
                raise AssertionError("sdk: wrong output")

        def via_floor() -> None:
            if floor.start("/bin/echo", ["hi"]) != 0:
                raise AssertionError("floor: exit code")

        contenders: Dict[str, Callable[[], None]] = {
            "provider": via_provider,
            "sdk": via_sdk,
            "floor": via_floor,
        }
        for fn in contenders.values():  # warm up: connections, imports
            for _ in range(5):
                fn()
        wall: Dict[str, List[float]] = {n: [] for n in contenders}
        cpu: Dict[str, List[float]] = {n: [] for n in contenders}
        for r in range(blocks):
            for name in b.rotated(list(contenders), r):
                fn = contenders[name]
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(args.block):
                    fn()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)

    n = blocks * args.block
    rate = {k: n / sum(v) for k, v in wall.items()}
    cpu_ms = {k: sum(v) / n * 1000 for k, v in cpu.items()}
    rows = [
        [
            name,
            f"{rate[name]:.0f}",
            b.ratio(rate[name], rate["sdk"]),
            f"{1000 / rate[name]:.2f}",
            f"{cpu_ms[name]:.2f}",
            b.ratio(cpu_ms[name], cpu_ms["sdk"]),
            b.ratio(cpu_ms[name], cpu_ms["floor"]),
        ]
        for name in wall
    ]
    print(
        b.table(
            f"{n} back-to-back exec('echo hi') per contender, {blocks} interleaved blocks",
            ["contender", "execs/s", "x sdk", "ms/exec", "client CPU ms/exec", "CPU x sdk",
             "CPU x floor"],
            rows,
        )
    )
    ok_rate = rate["provider"] >= RATE_GOAL * rate["sdk"]
    ok_cpu = cpu_ms["provider"] <= CPU_GOAL * cpu_ms["floor"]
    print(
        f"goals: execs/s >= {RATE_GOAL}x sdk: {'ok' if ok_rate else 'not met'}; "
        f"client CPU <= {CPU_GOAL}x floor: {'ok' if ok_cpu else 'not met'}"
    )


if __name__ == "__main__":
    main()
