"""``python -m e2b_provider``: the command line (see :mod:`e2b_provider.cli.entry`)."""

from __future__ import annotations

import sys

from .cli.entry import main

if __name__ == "__main__":
    sys.exit(main())
