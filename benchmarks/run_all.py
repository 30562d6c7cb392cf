"""Run the benchmarks (issue 7's suite, the timeout burst, issue 15's files) in turn and print
their tables.

    python benchmarks/run_all.py [--only wan,files] [--quick]

Each script runs in its own process with its defaults (``--quick``: fewer runs and smaller
sizes, a smoke test whose figures are noisier). The WAN mode needs root and Debian's
``iptables``; when it cannot run here it says what is missing and the others still run.
Exit status 1 when a script failed (an unmet goal is reported, not a failure; a script
that cannot run here, exit status 3, is listed but is not a failure).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
#: a script's exit status when this machine lacks a prerequisite (it says which)
EXIT_UNAVAILABLE = 3

#: script -> the arguments of a quick run
SCRIPTS: Dict[str, List[str]] = {
    "exec_latency": ["--runs", "50"],
    "back_to_back": ["--calls", "100", "--block", "20"],
    "files": ["--runs", "1", "--sizes", "1,8,64"],
    "capped_output": ["--runs", "1", "--mib", "256"],
    "concurrency": ["--runs", "1", "--threads", "200"],
    "wan": ["--runs", "8", "--create-runs", "2"],
    "timeout_burst": ["--threads", "320", "--sandboxes", "4"],
    "notebook": ["--runs", "3", "--sdk-runs", "1", "--lines", "10"],
    "batch_files": ["--rounds", "5"],
    "first_call": ["--rounds", "3"],
    "trees": ["--rounds", "1", "--files", "500", "--mib", "10", "--big-mib", "128"],
    "background": ["--rounds", "5"],
    "forward": ["--rounds", "5"],
    "watch": ["--rounds", "2", "--writes", "20", "--flood", "100000"],
    "terminal": ["--keys", "100"],
    "code_interpreter": ["--runs", "30"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description="Run the benchmark suite (see benchmarks/README.md).")
    ap.add_argument("--only", help=f"comma-separated subset of: {','.join(SCRIPTS)}")
    ap.add_argument("--quick", action="store_true", help="fewer runs, smaller sizes")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(SCRIPTS)
    unknown = [n for n in names if n not in SCRIPTS]
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(unknown)}")
    failed, skipped = [], []
    for name in names:
        cmd = [sys.executable, os.path.join(HERE, f"{name}.py")]
        if args.quick:
            cmd += SCRIPTS[name]
        print(f"=== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        code = subprocess.call(cmd)
        print(f"=== {name}: exit {code} after {time.monotonic() - t0:.0f} s\n", flush=True)
        if code == EXIT_UNAVAILABLE:
            skipped.append(name)
        elif code != 0:
            failed.append(name)
    if skipped:
        print(f"could not run here (see above): {', '.join(skipped)}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
