"""After ``mutmut run``: the mutation score, and every survivor explained or reported.

Run by ``tox -e mutation`` (from the repository root, where ``mutants/`` is). Reads the
results with ``mutmut results`` and ``mutmut export-cicd-stats``, prints the score
(killed and timed-out mutants over all mutants) and the survivors that
``tests/mutation-survivors.md`` does not explain (a line starting with the mutant's name in
backquotes). Exits 1 when the score is below ``--min`` or a survivor is unexplained; then
kill it with a test, or, if it cannot change behaviour, add it to the file with the reason.

    python tests/mutation_check.py [--min 90]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Set

EXPLAINED = Path(__file__).with_name("mutation-survivors.md")
#: ``mutmut results`` lines: "    <name>: <status>"
_RESULT = re.compile(r"^\s*(\S+): (.+)$")
_LISTED = re.compile(r"^\s*[-*]?\s*`([^`]+__mutmut_\d+)`")


def _mutmut(*args: str) -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "mutmut")
    done = subprocess.run([exe, *args], capture_output=True, text=True, check=True)
    return done.stdout


def explained() -> Set[str]:
    """The mutant names listed in ``tests/mutation-survivors.md``."""
    if not EXPLAINED.exists():
        return set()
    lines = EXPLAINED.read_text(encoding="utf-8").splitlines()
    return {m.group(1) for m in map(_LISTED.match, lines) if m}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min", type=float, default=90.0, help="lowest acceptable score, percent")
    args = ap.parse_args()

    _mutmut("export-cicd-stats")
    stats = json.loads(Path("mutants", "mutmut-cicd-stats.json").read_text())
    caught = stats["killed"] + stats["timeout"]
    score = 100.0 * caught / stats["total"] if stats["total"] else 0.0
    undetected = {
        m.group(1): m.group(2)
        for m in map(_RESULT.match, _mutmut("results").splitlines())
        if m and m.group(2) not in ("killed", "timeout")
    }
    listed = explained()
    unexplained = sorted(set(undetected) - listed)
    print(
        f"mutation score: {score:.1f}% ({caught} of {stats['total']} mutants killed or timed "
        f"out; {len(undetected)} not, {len(undetected) - len(unexplained)} of them explained "
        f"in {EXPLAINED.name})"
    )
    for name in unexplained:
        print(f"  unexplained: {name} ({undetected[name]}); see `mutmut show {name}`")
    stale = sorted(listed - set(undetected))
    if stale:
        print(f"  {len(stale)} names in {EXPLAINED.name} are no longer survivors (e.g. {stale[0]})")
    return 0 if score >= args.min and not unexplained else 1


if __name__ == "__main__":
    sys.exit(main())
