"""What the in-sandbox exec wrapper costs, measured inside one sandbox (no HTTP at all).

Every ``exec`` runs the reference plugin's wrapper: ``setsid -w`` → ``sh`` (pid file, ``.kill``
refusal) → ``timeout -s KILL`` → ``bash -c`` → the command, then ``rm -f`` of the pid file,
all with the reference's ``LANG=C.UTF-8``. The official SDK runs ``bash -l -c``. This script
times, inside one sandbox of a local emulator, ``--calls`` runs of each variant per round,
round-robin over ``--rounds`` rounds (the order rotated), and prints the medians as ratios to
the SDK's command line:

* ``reference``: the wrapper as every exec runs it;
* ``no LANG``: the same without ``LANG`` (each of ``setsid``, ``timeout``, ``bash`` and ``rm``
  otherwise loads the UTF-8 locale);
* ``no rm``: without removing the pid file after the command;
* ``neither``: both changes;
* ``bash -l`` (the SDK's) and a bare ``/bin/true``.

    python benchmarks/wrapper_cost.py [--rounds 5] [--calls 100]
"""

from __future__ import annotations

import argparse
import re
from typing import Dict, List

import _bench as b

from e2b_provider import E2BSandboxProvider
from e2b_provider import _scripts as scripts
from e2b_provider.emulator import Emulator

KEEP_PID = 's=$?; exit $s'

VARIANTS = {
    "reference": 'env LANG=C.UTF-8 setsid -w /bin/sh -c "$W" x /tmp/.wc true 10',
    "no LANG": 'env -u LANG setsid -w /bin/sh -c "$W" x /tmp/.wc true 10',
    "no rm": 'env LANG=C.UTF-8 setsid -w /bin/sh -c "$W2" x /tmp/.wc true 10',
    "neither": 'env -u LANG setsid -w /bin/sh -c "$W2" x /tmp/.wc true 10',
    "bash -l (SDK)": "env LANG=C.UTF-8 /bin/bash -l -c true",
    "bare /bin/true": "env LANG=C.UTF-8 /bin/true",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100)
    args = ap.parse_args()

    wrapper = scripts.EXEC_WRAPPER
    tail = 's=$?; rm -f "$c.pid"; exit $s'
    assert wrapper.endswith(tail), "the wrapper changed: update this benchmark"
    names = list(VARIANTS)
    lines = ["W=$(cat /tmp/.w1); W2=$(cat /tmp/.w2)",
             "t() { a=$(date +%s%N); for i in $(seq " + str(args.calls) + '); do "$@" '
             ">/dev/null; done; echo $(( ($(date +%s%N) - a) / " + str(args.calls) + " )); }"]
    for r in range(args.rounds):
        for name in b.rotated(names, r):
            lines.append(f'echo "{names.index(name)} $(t {VARIANTS[name]})"')
    with Emulator() as emu, E2BSandboxProvider(emu.config(template="base")) as p:
        h = p.create("wrapper-cost")
        try:
            p.write_file(h, "/tmp/.w1", wrapper.encode())
            p.write_file(h, "/tmp/.w2", wrapper[: -len(tail)].encode() + KEEP_PID.encode())
            res = p.exec(h, "\n".join(lines), timeout=1800.0)
        finally:
            p.destroy(h)
    if res.exit_code != 0:
        print(res.stderr)
        return 1
    ns: Dict[str, List[float]] = {n: [] for n in names}
    for m in re.finditer(r"^(\d+) (\d+)$", res.stdout, re.M):
        ns[names[int(m.group(1))]].append(int(m.group(2)) / 1e6)
    sdk = b.median(ns["bash -l (SDK)"])
    rows = [[n, f"{b.median(ns[n]):.2f}", b.ratio(b.median(ns[n]), sdk)] for n in names]
    print(b.table(
        f"in-sandbox command lines, median ms per run ({args.rounds} rounds x {args.calls})",
        ["variant", "ms", "x bash -l"],
        rows,
    ))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
