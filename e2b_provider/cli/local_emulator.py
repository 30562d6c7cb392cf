"""``e2b-provider emulator``: the local E2B emulator in the foreground, as ``python -m
e2b_provider.emulator`` runs it (exit 0 once Ctrl-C or SIGTERM stopped it, 1 when it cannot
run here)."""

from __future__ import annotations

import argparse

from ..emulator.__main__ import run
from ..emulator.handle import EXIT_UNAVAILABLE
from .exits import EXIT_ERROR, PROG


def cmd_emulator(args: argparse.Namespace) -> int:
    """``emulator``: run the emulator until it is stopped."""
    # The same options, output and signal handling as python -m e2b_provider.emulator: the
    # export lines alone on stdout, the ready line on stderr; Ctrl-C and SIGTERM stop it.
    status = run(args, name=f"{PROG} emulator")
    # "cannot run here" is a runtime error for this command line (2 is for usage errors)
    return EXIT_ERROR if status == EXIT_UNAVAILABLE else status
