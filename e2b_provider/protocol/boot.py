"""How a sandbox-side program starts: the environment variable its text travels in, and
the one-line boots that take it out of there and run it.

This module owns :data:`PROGRAM_VAR`, :data:`PYTHON_BOOT` (a Python program as its text),
:data:`PACKED_BOOT` (one packed by ``sandbox_side.pack``: docstrings and comment lines
emptied, zlib, base64), :data:`SH_BOOT` (a shell program), :data:`PYTHON_LAUNCH` and
:func:`python_argv` (a packed program handed over as an argument). Strings only: no I/O.
"""

from __future__ import annotations

import shlex
from typing import List

__all__ = [
    "PACKED_BOOT",
    "PROGRAM_VAR",
    "PYTHON_BOOT",
    "PYTHON_LAUNCH",
    "SH_BOOT",
    "python_argv",
]

#: The environment variable a sandbox-side Python program's text travels in. Programs go
#: to ``python3`` this way, not as a ``-c`` argument: a process's arguments are public (``ps``
#: shows every user's), and the file agent's text is 17 KB even packed. A process's environment is
#: shown only to its own user and root, and can be changed by neither after it starts.
PROGRAM_VAR = "CAPYBARA_PROGRAM"
#: ``python3 -c`` text that runs the program in :data:`PROGRAM_VAR` as ``__main__``, taking
#: it out of the environment first (nothing the program starts inherits it). ``-I`` keeps
#: ``PYTHON*`` variables from changing what runs.
PYTHON_BOOT = f"import os;exec(os.environ.pop({PROGRAM_VAR!r}))"
#: :data:`PYTHON_BOOT` for a program packed by ``sandbox_side.pack`` (zlib, base64).
PACKED_BOOT = ("import os,zlib,binascii;exec(zlib.decompress(binascii.a2b_base64("
               f"os.environ.pop({PROGRAM_VAR!r}))))")
#: ``sh -c`` text that runs the shell program in :data:`PROGRAM_VAR`, taken out of the
#: environment first (``eval`` parses a copy of it).
SH_BOOT = f'p=${PROGRAM_VAR}; unset {PROGRAM_VAR}; eval "$p"'
#: Runs the packed Python program ``$1`` (``sandbox_side.pack``) with arguments ``$2...``
#: (``$0`` names it for ``ps``): for launches whose environment the caller cannot set; the
#: shell holds the text only until its ``exec``.
PYTHON_LAUNCH = (f'export {PROGRAM_VAR}="$1"; shift; '
                 f'exec python3 -I -S -X utf8 -c {shlex.quote(PACKED_BOOT)} "$@"')


def python_argv(name: str, program: str, *args: str) -> List[str]:
    """The argv that runs the packed Python program ``program`` (``sandbox_side.pack``) with
    ``args`` (``sys.argv[1:]``) by :data:`PYTHON_LAUNCH`, as ``name`` (``$0`` of its shell)."""
    return ["/bin/sh", "-c", PYTHON_LAUNCH, name, program, *args]
