"""Programs the library runs inside a sandbox, kept as source files.

This package owns the code that runs on the sandbox's side of the wire: the provider reads
a module's text (:func:`source`) and sends it to the sandbox's ``python3`` in the
``CAPYBARA_PROGRAM`` environment variable, run by a one-line ``-c`` that takes it out of the
environment first (``protocol.boot.PYTHON_BOOT``): a command line is public (``ps``).
Such a module imports only the standard library, runs on Python 3.6 and later,
and never imports :mod:`e2b_provider`; the library itself never imports it (tests do, to
run it locally).

* :mod:`.file_agent` — file work as the sandbox user: a request server for stat, read,
  atomic writes, batches and listings, and the tar packer and extractor behind tree
  uploads and downloads.
* :mod:`.supervisor` — a background command's supervisor: runs it under the exec
  wrapper, keeps its last output and its exit status in a record, and writes frames for
  live followers.

The Python programs travel packed (:func:`packed`: docstrings and comment lines emptied, the
line numbers kept, then zlib and base64; ``protocol.boot.PACKED_BOOT`` unpacks them): the
file agent's start request is 10 KiB instead of 37 KiB, which a new or idle connection sends
in one flight instead of three.

Two shell programs (POSIX ``sh`` and GNU coreutils) stand in for them where the sandbox has
no ``python3``; the provider sends their text to ``/bin/sh -c`` (``supervisor.sh`` likewise
in ``CAPYBARA_PROGRAM``, ``protocol.boot.SH_BOOT``):

* ``supervisor.sh`` — the same supervisor, writing the same record, without live frames.
* ``records.sh`` — the file agent's ``cmd_read`` and ``cmd_list`` over those records.
"""

from __future__ import annotations

import base64
import functools
import io
import os
import tokenize
import zlib

__all__ = ["pack", "packed", "source"]


@functools.cache
def source(module: str) -> str:
    """The text of the sandbox-side program ``module`` (e.g. ``"file_agent"``, or a shell
    program by its file name, ``"supervisor.sh"``).

    Raises:
        ValueError: ``module`` is not one of this package's programs.
    """
    if module in ("file_agent", "supervisor"):
        name = module + ".py"
    elif module in ("supervisor.sh", "records.sh"):
        name = module
    else:
        raise ValueError(f"no sandbox-side program named {module!r}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    with open(path, encoding="utf-8") as f:
        return f.read()


def _lean(text: str) -> bytes:
    """Python source ``text`` without its docstrings (each left as ``""``) and comment
    lines (left empty), as UTF-8: every statement stays on its line. A docstring here is a
    string alone on its statement that opens the module or a block (whatever the block:
    such a statement does nothing either way); ``tokenize`` finds both, so a ``#`` or a
    quote inside a string is never taken for one."""
    lines = text.split("\n")
    edits = []
    opening = True  # the next statement opens the module or a block
    pending = None  # a string that opened one, kept if its statement ends with it
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        kind = tok.type
        if kind == tokenize.COMMENT and not tok.line[:tok.start[1]].strip():
            edits.append((tok.start, tok.end))
        if kind in (tokenize.NL, tokenize.COMMENT, tokenize.ENCODING):
            continue
        if kind == tokenize.NEWLINE and pending is not None:
            edits.append(pending)
        pending = (tok.start, tok.end) if kind == tokenize.STRING and opening else None
        opening = kind == tokenize.INDENT or (opening and kind == tokenize.DEDENT)
    for (top, left), (bottom, right) in sorted(edits, reverse=True):
        blank = "" if lines[top - 1][left] == "#" else '""'
        kept = [lines[top - 1][:left] + blank] + [""] * (bottom - top)
        kept[-1] += lines[bottom - 1][right:]
        lines[top - 1:bottom] = kept
    return "\n".join(lines).encode("utf-8")


def pack(text: str) -> str:
    """Python source ``text`` as ``protocol.boot.PACKED_BOOT`` takes it: docstrings and
    comment lines emptied (a traceback's line numbers are still the source's), compressed
    (zlib) and in base64."""
    return base64.b64encode(zlib.compress(_lean(text), 9)).decode("ascii")


@functools.lru_cache(maxsize=None)
def packed(module: str) -> str:
    """:func:`pack` of the Python program ``module`` (``"file_agent"``, ``"supervisor"``)."""
    return pack(source(module))
