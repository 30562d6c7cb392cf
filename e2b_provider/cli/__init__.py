"""The ``e2b-provider`` command line.

:mod:`.entry` (``main``, ``console_main``) parses with :mod:`.arguments` and runs the handler of
the command, found by what it acts on: :mod:`.sandboxes`, :mod:`.commands` (with
:mod:`.terminal_session` for ``exec -it`` and ``shell``), :mod:`.code` (the code
interpreter), :mod:`.files`, :mod:`.ports`, :mod:`.local_emulator`. Beside them:
:mod:`.exits` (exit statuses), :mod:`.inputs` (what the words become), :mod:`.lookup` (a
sandbox by name or id), :mod:`.output` (progress, lines).
Importing this package loads none of the library: a handler's module is imported when its
command runs. A Ctrl-C while it imports :mod:`.entry` is one line and exit 130, as one while
:mod:`.entry` imports (nothing here runs before that: not even ``__future__`` is imported).
"""

import sys

try:
    from .entry import console_main, main, parser
except KeyboardInterrupt:  # Ctrl-C while the command line starts: one line, no traceback
    sys.stderr.write("e2b-provider: interrupted\n")
    raise SystemExit(130) from None

__all__ = ["console_main", "main", "parser"]
