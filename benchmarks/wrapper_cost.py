"""What the in-sandbox exec wrapper costs, measured inside one sandbox (no HTTP at all).

Every ``exec`` runs a wrapper: ``setsid -w`` → ``sh`` (pid file, ``.kill`` refusal) →
``timeout -s KILL`` → ``bash -c`` → the command. The reference plugin's wrapper then removes
the pid file with ``rm`` before it exits, and runs all of it with ``LANG=C.UTF-8``; the
library's (``LEAN_EXEC_WRAPPER``) runs its own programs in the C locale, gives the command
its ``LANG`` back, and removes the pid file in the background. The official SDK runs
``bash -l -c`` (without ``LANG``). This script times, inside one sandbox of a local
emulator, ``--calls`` runs of each variant, one call of each in turn (the order rotated
every call), with bash's ``$EPOCHREALTIME``, and prints the medians and their ratios to the
SDK's command line:

* ``reference``: the reference's wrapper, as every exec ran it before;
* ``lean (sent now)``: the library's wrapper, with the environment an exec starts it with;
* ``reference, no LANG``: the reference's without ``LANG`` (each of ``setsid``,
  ``timeout``, ``bash`` and ``rm`` otherwise loads the UTF-8 locale);
* ``reference, no rm``: the reference's without removing the pid file;
* ``bash -l (SDK)`` and a bare ``/bin/true``.

Each line starts the command with ``env``, which is counted in every variant alike.

    python benchmarks/wrapper_cost.py [--calls 400]
"""

from __future__ import annotations

import argparse
import re
from typing import Dict, List

import _bench as b

from e2b_provider import E2BSandboxProvider
from e2b_provider.emulator import Emulator
from e2b_provider.protocol import scripts as scripts

#: The reference's wrapper ends with this; ``no rm`` ends with KEEP_PID instead.
TAIL = 's=$?; rm -f "$c.pid"; exit $s'
KEEP_PID = "s=$?; exit $s"

VARIANTS = {
    "reference": 'env LANG=C.UTF-8 setsid -w /bin/sh -c "$W" x /tmp/.wc true 10',
    "lean (sent now)": 'env LANG=C setsid -w /bin/sh -c "$L" x /tmp/.wc true 10 C.UTF-8',
    "reference, no LANG": 'env -u LANG setsid -w /bin/sh -c "$W" x /tmp/.wc true 10',
    "reference, no rm": 'env LANG=C.UTF-8 setsid -w /bin/sh -c "$W2" x /tmp/.wc true 10',
    "bash -l (SDK)": "env -u LANG /bin/bash -l -c true",
    "bare /bin/true": "env -u LANG /bin/true",
}
SDK = "bash -l (SDK)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=400, help="runs of each variant")
    args = ap.parse_args()

    wrapper = scripts.EXEC_WRAPPER
    assert wrapper.endswith(TAIL), "the reference's wrapper changed: update this benchmark"
    names = list(VARIANTS)
    timed = [
        f'a=$EPOCHREALTIME; {VARIANTS[n]} >/dev/null; z=$EPOCHREALTIME; echo "{i} $a $z"'
        for i, n in enumerate(names)
    ]
    lines = ["W=$(cat /tmp/.w1); W2=$(cat /tmp/.w2); L=$(cat /tmp/.w3)",
             f"for r in $(seq {args.calls}); do case $((r % {len(names)})) in"]
    for k in range(len(names)):
        lines.append(f"{k}) " + "; ".join(timed[k:] + timed[:k]) + ";;")
    lines.append("esac; done")
    with Emulator() as emu, E2BSandboxProvider(emu.config(template="base")) as p:
        h = p.create("wrapper-cost")
        try:
            p.write_file(h, "/tmp/.w1", wrapper.encode())
            p.write_file(h, "/tmp/.w2", (wrapper[: -len(TAIL)] + KEEP_PID).encode())
            p.write_file(h, "/tmp/.w3", scripts.LEAN_EXEC_WRAPPER.encode())
            res = p.exec(h, "\n".join(lines), timeout=1800.0)
        finally:
            p.destroy(h)
    if res.exit_code != 0:
        print(res.stderr)
        return 1
    ms: Dict[str, List[float]] = {n: [] for n in names}
    for m in re.finditer(r"^(\d+) ([0-9.]+) ([0-9.]+)$", res.stdout, re.M):
        ms[names[int(m.group(1))]].append((float(m.group(3)) - float(m.group(2))) * 1000)
    sdk = b.median(ms[SDK])
    rows = [[n, f"{b.median(ms[n]):.2f}", b.ratio(b.median(ms[n]), sdk)] for n in names]
    print(b.table(
        f"in-sandbox command lines, median ms per run ({args.calls} interleaved runs each)",
        ["variant", "ms", "x bash -l"],
        rows,
    ))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
