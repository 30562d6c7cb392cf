"""The quickstart (``./dev quickstart`` runs ``examples/quickstart.py``) against the local
emulator, as a first-day user sees it: it ends well, and says nothing alarming."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def test_the_quickstart_runs_without_a_warning() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    r = subprocess.run([sys.executable, str(QUICKSTART)], env=env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=300)
    output = r.stdout + r.stderr
    assert r.returncode == 0 and "quickstart finished OK" in r.stdout, output[-3000:]
    # its own example causes none (a size requested that the template does not give did)
    assert "WARNING" not in output and "warning" not in output.lower(), output
    assert "created sandbox" in r.stdout and " CPUs, " in r.stdout, r.stdout
