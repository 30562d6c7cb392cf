"""Entry point of the envd agent inside a sandbox: ``python -m e2b_provider.emulator.agent``.

This module owns only the start: it runs :func:`.app.main` with the command line (see
``--help``) and exits with its status.
"""

import sys

from .app import main

if __name__ == "__main__":
    sys.exit(main())
