"""Latency of a trivial command on loopback, four ways, against one local emulator.

- provider: ``E2BSandboxProvider.exec(h, "true")`` (everything the library does per exec)
- sdk:      the official SDK's ``Sandbox.commands.run("true")`` on a sandbox it connected to
- floor:    one bare ``requests`` ``process.Process/Start`` stream of ``/bin/true`` over a
            kept connection, with no provider logic (the HTTP + envd floor)
- wrapped:  the same bare stream running the reference's in-sandbox wrapper (``setsid`` ->
            ``sh`` writing a pid file -> ``timeout -s KILL`` -> ``bash -c true``, copied
            below from the reference plugin) that lets an exec's tree be killed: the floor
            for that command line

Contenders are interleaved call by call (order rotated). Prints median and p95 of each and
the ratios of the provider's median to the others'.

    python benchmarks/exec_latency.py [--runs 200]
"""

from __future__ import annotations

import argparse
import uuid
from typing import Callable, Dict

import _bench as b

#: The reference plugin's exec wrapper (``$1`` control path, ``$2`` command, ``$3`` seconds).
REFERENCE_WRAPPER = (
    'c=$1; echo $$ > "$c.pid" 2>/dev/null; if [ -e "$c.kill" ]; then exit 137; fi; '
    'timeout -s KILL "$3" /bin/bash -c "$2"; s=$?; rm -f "$c.pid"; exit $s'
)
#: issue 7's goal: provider median at most this times the SDK's
GOAL = 1.0


def main() -> None:
    ap = argparse.ArgumentParser(
        description="exec('true') latency on loopback: provider vs official SDK vs bare floor."
    )
    ap.add_argument("--runs", type=int, default=200, help="measured calls each (default 200)")
    args = ap.parse_args()

    with b.on_emulator("bn-exec-latency") as (ep, provider, (h,)):
        sdk = b.sdk_connect(ep, h.id)
        floor = b.RawEnvd(ep, h.id)

        def wrapped() -> None:
            ctl = f"/tmp/.bn-exec-{uuid.uuid4()}"
            argv = ["-w", "/bin/sh", "-c", REFERENCE_WRAPPER, "bn-exec", ctl, "true", "65"]
            if floor.start("setsid", argv) != 0:
                raise AssertionError("wrapped: exit code")

        contenders: Dict[str, Callable[[], object]] = {
            "provider": lambda: provider.exec(h, "true"),
            "sdk": lambda: sdk.commands.run("true"),
            "floor": lambda: floor.start("/bin/true"),
            "wrapped": wrapped,
        }
        results = b.interleaved(contenders, args.runs, warmup=10)

    med = {k: b.median(v) for k, v in results.items()}
    rows = [
        [name, b.ms(med[name]), b.ms(b.p95(xs)), b.ratio(med["provider"], med[name])]
        for name, xs in results.items()
    ]
    print(
        b.table(
            f"exec('true') latency on loopback, {args.runs} interleaved calls each",
            ["contender", "median ms", "p95 ms", "provider x this"],
            rows,
        )
    )
    ok = med["provider"] <= GOAL * med["sdk"]
    print(
        "provider x wrapped = the library's own overhead over the wrapper it runs; "
        f"goal: provider <= {GOAL}x sdk: {'ok' if ok else 'not met'}"
    )


if __name__ == "__main__":
    main()
