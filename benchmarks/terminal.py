"""Keystroke echo latency through a terminal on loopback, against envd's bare SendInput.

One sandbox runs ``stty raw -echo; exec cat`` on a terminal (``provider.terminal``): every
byte typed is echoed by the program, as an editor or a shell's line editor echoes a key.
Contenders, interleaved key by key (the order rotated every round):

- library echo: ``Terminal.write(b"x")``, then ``Terminal.read()`` until the ``x`` is back
  (what a person typing into ``e2b-provider shell`` waits for); ``write`` alone is timed too;
- SendInput floor: the same ``process.Process/SendInput`` (``input.pty``) as one bare
  ``requests`` POST over a kept connection, its answer read (its echo is read back off the
  clock, so the next key starts clean).

The goal: the library's echo within 2 ms of the bare SendInput round trip (median).

    python benchmarks/terminal.py [--keys 300]
"""

from __future__ import annotations

import argparse
import base64
import time
from typing import Dict, List

import _bench as b

from e2b_provider import OperationTimeout, Terminal

GOAL_MS = 2.0


def _read_until(t: Terminal, want: bytes, timeout: float = 10.0) -> None:
    seen = b""
    deadline = time.monotonic() + timeout
    while want not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"no {want!r} from the terminal within {timeout:g} s: {seen!r}")
        try:
            seen += t.read(timeout=left)
        except OperationTimeout:
            continue


def main() -> None:
    ap = argparse.ArgumentParser(description="terminal keystroke echo: library vs SendInput")
    ap.add_argument("--keys", type=int, default=300, help="measured keys per contender "
                    "(default 300)")
    args = ap.parse_args()

    with b.on_emulator("bn-term") as (ep, provider, (h,)):
        raw = b.RawEnvd(ep, h.id)
        url = f"{ep.sandbox_url}/process.Process/SendInput"
        headers = raw.rpc_headers("application/json")
        with provider.terminal(h, "stty raw -echo && echo ready && exec cat") as t:
            _read_until(t, b"ready")
            body = {"process": {"pid": t.pid},
                    "input": {"pty": base64.b64encode(b"y").decode()}}
            times: Dict[str, List[float]] = {"library echo": [], "library write()": [],
                                             "SendInput floor": []}

            def library() -> None:
                t0 = time.perf_counter()
                t.write(b"x")
                t1 = time.perf_counter()
                _read_until(t, b"x")
                t2 = time.perf_counter()
                times["library echo"].append(t2 - t0)
                times["library write()"].append(t1 - t0)

            def floor() -> None:
                t0 = time.perf_counter()
                r = raw.session.post(url, json=body, headers=headers, timeout=(10, 30))
                r.raise_for_status()
                _ = r.content
                times["SendInput floor"].append(time.perf_counter() - t0)
                _read_until(t, b"y")  # its echo, off the clock

            warmup = 20
            for r in range(warmup + args.keys):
                for fn in b.rotated([library, floor], r):
                    fn()
                if r < warmup:
                    for v in times.values():
                        v.clear()
        raw.close()

    med = {k: b.median(v) for k, v in times.items()}
    rows = [[k, b.ms(med[k]), b.ms(b.p95(v))] for k, v in times.items()]
    print(b.table(f"terminal keystroke echo on loopback, {args.keys} keys each",
                  ["contender", "median ms", "p95 ms"], rows))
    diff = (med["library echo"] - med["SendInput floor"]) * 1000
    verdict = "met" if diff <= GOAL_MS else "NOT met"
    print(f"echo through the library - bare SendInput round trip: {diff:+.2f} ms "
          f"(goal <= {GOAL_MS:g} ms: {verdict})")


if __name__ == "__main__":
    main()
