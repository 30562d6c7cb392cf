"""The official ``e2b`` SDK needs Python 3.11+; on older Pythons this directory is not run.

On Python 3.9 and 3.10 the SDK cannot be installed (the test extra installs it only on 3.11+),
so these tests are skipped there with the reason printed in the summary. CI runs them on
3.11, where a missing SDK is an error, never a skip.
"""

from __future__ import annotations

import sys
from typing import Any

SDK_FLOOR = (3, 11)
REASON = (
    "SDK conformance tests not run: the official e2b SDK needs Python 3.11+, this is "
    f"{sys.version_info.major}.{sys.version_info.minor}"
)

if sys.version_info < SDK_FLOOR:
    collect_ignore_glob = ["test_*.py"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if sys.version_info < SDK_FLOOR:
        terminalreporter.write_line(REASON, yellow=True)
