"""What the words of a command become: ``--env KEY=VALUE`` pairs, the command after SANDBOX,
``SANDBOX:/path``, and our standard input for a command.

``exec`` and ``start`` take the command after SANDBOX, as ``docker exec`` does
(:mod:`.command_words` splits it off): one word is a shell command line (``'make &&
./run'``), run by ``bash -c``; several words are the command's argument vector, each
reaching it unchanged (``python3 -c 'print(1)'``): they are quoted with :func:`shlex.join`
for ``bash -c``.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import BinaryIO, Dict, Optional, Sequence, Tuple

from .exits import UsageError


def env_vars(items: Sequence[str]) -> Dict[str, str]:
    """The variables of the ``--env KEY=VALUE`` options given."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env takes KEY=VALUE, not {item!r}")
        env[key] = value
    return env


def command_line(argv: Sequence[str], cmd: str) -> str:
    """The line ``bash -c`` runs for the words after SANDBOX: one word is a shell command
    line, taken as it is; several are an argument vector, quoted so that each word reaches
    the command unchanged (as ``docker exec`` and ``kubectl exec`` pass them)."""
    if not argv:
        raise UsageError(f"{cmd} needs a command after SANDBOX")
    if len(argv) == 1:
        return argv[0]
    return shlex.join(argv)


def our_stdin(even_a_terminal: bool = False) -> Optional[BinaryIO]:
    """Our standard input for the command, unless it is a terminal (or closed); with
    ``even_a_terminal`` (``exec -i``), a terminal too.

    A raw reader of file descriptor 0, not ``sys.stdin.buffer``: the library reads it on
    a daemon thread, which may still be blocked in a read when we exit (the command ended
    without reading all of it), and a buffered reader's lock held there makes the
    interpreter's shutdown abort.
    """
    if sys.stdin is None:
        return None
    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd) and not even_a_terminal:
            return None
        return os.fdopen(fd, "rb", buffering=0, closefd=False)
    except (OSError, ValueError):
        return None


def split_remote(spec: str) -> Optional[Tuple[str, str]]:
    """``("SANDBOX", "/path")`` for ``SANDBOX:/path``; None for a local path."""
    head, sep, tail = spec.partition(":")
    if not sep or not head or not tail.startswith("/") or "/" in head:
        return None
    return head, tail.rstrip("/") or "/"
