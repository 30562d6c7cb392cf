"""``python -m e2b_provider``: the command line (see :mod:`e2b_provider.cli.entry`).

A Ctrl-C while it imports the command line is one line and exit 130 (nothing here imports
anything before that, not even ``__future__``).
"""

import sys

try:
    from .cli.entry import main
except KeyboardInterrupt:  # Ctrl-C while the command line starts: one line, no traceback
    sys.stderr.write("e2b-provider: interrupted\n")
    raise SystemExit(130) from None

if __name__ == "__main__":
    sys.exit(main())
