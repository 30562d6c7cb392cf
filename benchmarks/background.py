"""Background commands on loopback: start, a whole run followed live, and a late look.

Contenders, interleaved round by round (the order rotated):

- start: ``provider.start(h, "sleep 30")`` (returns once the supervisor runs) vs the SDK's
  ``commands.run("sleep 30", background=True)``; both are killed off the clock;
- follow: start ``seq 1 N`` and wait for its end with a live-output callback (provider:
  ``start`` + ``Command.wait(on_stdout=...)``; SDK: ``commands.run(..., background=True)``
  + ``handle.wait(on_stdout=...)``), the same bytes checked for both;
- late look: the output and exit status of a command that ended a while ago, from a new
  handle (provider: ``attach(h, id).wait()``; the SDK cannot: envd forgets ended
  processes, so it has no contender there).

    python benchmarks/background.py [--rounds 15] [--lines 20000]
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Dict, List

import _bench as b


def main() -> None:
    ap = argparse.ArgumentParser(description="background commands: provider vs SDK")
    ap.add_argument("--rounds", type=int, default=15, help="measured rounds (default 15)")
    ap.add_argument("--lines", type=int, default=20000, help="lines the followed command "
                    "prints (default 20000, about 110 KiB)")
    args = ap.parse_args()
    want = "".join(f"{i}\n" for i in range(1, args.lines + 1))

    with b.on_emulator("bn-bg") as (ep, provider, (h,)):
        sdk = b.sdk_connect(ep, h.id)
        started: List[Any] = []
        sdk_started: List[Any] = []
        ended = provider.start(h, f"seq 1 {args.lines}")
        ended.wait(timeout=60)

        def p_start() -> None:
            started.append(provider.start(h, "sleep 30"))

        def s_start() -> None:
            sdk_started.append(sdk.commands.run("sleep 30", background=True, user="sandbox"))

        def p_follow() -> None:
            got: List[str] = []
            r = provider.start(h, f"seq 1 {args.lines}").wait(timeout=60, on_stdout=got.append)
            assert "".join(got) == want and r.exit_code == 0

        def s_follow() -> None:
            got: List[str] = []
            handle = sdk.commands.run(f"seq 1 {args.lines}", background=True, user="sandbox")
            r = handle.wait(on_stdout=got.append)
            assert "".join(got) == want and r.exit_code == 0

        def p_late() -> None:
            r = provider.attach(h, ended.id).wait(timeout=60)
            assert r.stdout == want

        contenders: Dict[str, Callable[[], object]] = {
            "provider start": p_start,
            "sdk start": s_start,
            "provider follow": p_follow,
            "sdk follow": s_follow,
            "provider late look": p_late,
        }
        res = b.interleaved(contenders, args.rounds, warmup=2)
        for c in started:
            c.kill()
        for handle in sdk_started:
            handle.kill()

    med = {k: b.median(v) for k, v in res.items()}
    rows = [[k, b.ms(med[k]), b.ms(b.p95(v))] for k, v in res.items()]
    print(b.table(f"background commands on loopback, {args.rounds} rounds",
                  ["contender", "median ms", "p95 ms"], rows))
    print(f"start: {med['provider start'] / med['sdk start']:.2f}x the SDK's; "
          f"follow {args.lines} lines to the end: "
          f"{med['provider follow'] / med['sdk follow']:.2f}x the SDK's; "
          f"late look (the SDK has none): {b.ms(med['provider late look'])} ms")


if __name__ == "__main__":
    main()
