"""Large file transfers on loopback: provider vs official SDK vs the raw ``/files`` floor.

For each size (default 1, 8 and 64 MiB), reads and writes of random bytes in one sandbox
of one local emulator, all as user ``sandbox``:

- provider: ``read_file(h, path, max_bytes=size)`` / ``write_file(h, path, data)``
- sdk:      ``files.read(path, format="bytes", user="sandbox")`` / ``files.write(...)``
- floor:    one bare ``GET /files`` / ``POST /files`` (octet-stream) with ``requests``
            over a kept connection

Contenders are interleaved round by round. Prints the median time, MiB/s and the speed
ratios against the floor and the SDK (``speed x floor`` = floor time / contender time, so
1.00x is floor speed and higher is faster).

    python benchmarks/files.py [--runs 7] [--sizes 1,8,64]
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from typing import Any, Callable, Dict, List

import _bench as b

from e2b_provider import E2BSandboxProvider

#: issue 7's goals at 64 MiB: provider speed as a fraction of the floor's
GOALS = {"read": 0.5, "write": 0.8}


def check(got: Any, size: int) -> None:
    if len(got) != size:
        raise AssertionError(f"read {len(got)} bytes, not {size}")


def provider_read(provider: E2BSandboxProvider, h: Any, path: str, size: int) -> None:
    content = provider.read_file(h, path, max_bytes=size)
    if content is None:
        raise AssertionError(f"{path} not found")
    check(content.data, size)


def main() -> None:
    ap = argparse.ArgumentParser(
        description="1/8/64 MiB reads and writes: provider vs official SDK vs raw /files."
    )
    ap.add_argument("--runs", type=int, default=7, help="measured rounds (default 7)")
    ap.add_argument("--warmup", type=int, default=1, help="unrecorded rounds (default 1)")
    ap.add_argument("--sizes", default="1,8,64", help="sizes in MiB (default 1,8,64)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    rows: List[List[object]] = []
    with b.on_emulator("bn-files") as (ep, provider, (h,)):
        sdk = b.sdk_connect(ep, h.id)
        floor = b.RawEnvd(ep, h.id)
        for mib in sizes:
            size = mib * b.MiB
            data = os.urandom(size)
            src = f"/workspace/bn-src-{mib}"
            floor.write_file(src, data)

            reads: Dict[str, Callable[[], Any]] = {
                "provider": partial(provider_read, provider, h, src, size),
                "sdk": lambda src=src, size=size: check(
                    sdk.files.read(src, format="bytes", user="sandbox"), size
                ),
                "floor": lambda src=src, size=size: check(floor.read_file(src), size),
            }
            writes: Dict[str, Callable[[], Any]] = {
                "provider": lambda data=data, mib=mib: provider.write_file(
                    h, f"/workspace/bn-w-provider-{mib}", data
                ),
                "sdk": lambda data=data, mib=mib: sdk.files.write(
                    f"/workspace/bn-w-sdk-{mib}", data, user="sandbox"
                ),
                "floor": lambda data=data, mib=mib: floor.write_file(
                    f"/workspace/bn-w-floor-{mib}", data
                ),
            }
            for op, contenders in (("read", reads), ("write", writes)):
                times = b.interleaved(contenders, args.runs, args.warmup)
                med = {k: b.median(v) for k, v in times.items()}
                for name in contenders:
                    goal = GOALS.get(op) if name == "provider" and mib == 64 else None
                    speed = med["floor"] / med[name]
                    rows.append([
                        f"{op} {mib} MiB", name, b.ms(med[name]),
                        f"{mib / med[name]:.0f}",
                        f"{speed:.2f}x", b.ratio(med["sdk"], med[name]),
                        "-" if goal is None
                        else ("ok" if speed >= goal else f"< {goal}"),
                    ])  # fmt: skip
    print(
        b.table(
            f"file transfers on loopback, median of {args.runs} interleaved rounds",
            ["transfer", "contender", "ms", "MiB/s", "speed x floor", "speed x sdk", "goal"],
            rows,
        )
    )
    print("speed x floor = floor time / contender time (1.00x = as fast as raw /files)")


if __name__ == "__main__":
    main()
