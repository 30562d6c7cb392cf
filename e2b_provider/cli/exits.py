"""The command line's name and exit statuses, the usage error (exit 2), and the status a
command's result gives.

Standard library only: the entry point imports it at start-up.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models import ExecResult

PROG = "e2b-provider"
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TIMED_OUT = 124
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """A mistake in how the command was called (exit status 2)."""


def exit_status(r: ExecResult, timed_out: str) -> int:
    """The exit status to give for a command's result (``timed_out``: what to say then)."""
    if r.timed_out:
        print(f"{PROG}: {timed_out}", file=sys.stderr)
        return EXIT_TIMED_OUT
    if r.exit_code is None:
        why = "was killed" if r.cancelled else "ended without an exit status"
        print(f"{PROG}: the command {why}", file=sys.stderr)
        return EXIT_ERROR
    return r.exit_code if 0 <= r.exit_code <= 255 else EXIT_ERROR
