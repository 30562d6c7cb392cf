"""The ``e2b-provider`` command line.

:mod:`.entry` (``main``, ``console_main``) parses with :mod:`.arguments` and runs the handler of
the command, found by what it acts on: :mod:`.sandboxes`, :mod:`.commands` (with
:mod:`.terminal_session` for ``exec -it`` and ``shell``), :mod:`.files`, :mod:`.ports`,
:mod:`.local_emulator`. Beside them: :mod:`.exits` (exit statuses), :mod:`.inputs` (what the
words become), :mod:`.lookup` (a sandbox by name or id), :mod:`.output` (progress, lines).
Importing this package loads none of the library: a handler's module is imported when its
command runs.
"""

from __future__ import annotations

from .entry import console_main, main, parser

__all__ = ["console_main", "main", "parser"]
