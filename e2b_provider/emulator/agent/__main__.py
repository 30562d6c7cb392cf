"""Entry point of the envd agent inside a sandbox: ``python -m e2b_provider.emulator.agent``.

This module owns only the start: it makes the process non-dumpable (the sandbox's processes,
which share its root user, can neither ptrace it nor open its descriptors through /proc:
its output pipe leads to the host's log), runs :func:`.app.main` with the command line (see
``--help``) and exits with its status.
"""

import ctypes
import sys

from .app import main

PR_SET_DUMPABLE = 4

if __name__ == "__main__":
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    sys.exit(main())
