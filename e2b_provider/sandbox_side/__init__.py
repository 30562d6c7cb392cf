"""Programs the library runs inside a sandbox, kept as source files.

This package owns the code that runs on the sandbox's side of the wire: the provider reads
a module's text (:func:`source`) and sends it to the sandbox's ``python3`` in the
``CAPYBARA_PROGRAM`` environment variable, run by a one-line ``-c`` that takes it out of the
environment first (``protocol.scripts.PYTHON_BOOT``): a command line is public (``ps``).
Such a module imports only the standard library, runs on Python 3.6 and later,
and never imports :mod:`e2b_provider`; the library itself never imports it (tests do, to
run it locally).

* :mod:`.file_agent` — file work as the sandbox user: a request server for stat, read,
  atomic writes, batches and listings, and the tar packer and extractor behind tree
  uploads and downloads.
* :mod:`.supervisor` — a background command's supervisor: runs it under the exec
  wrapper, keeps its last output and its exit status in a record, and writes frames for
  live followers.

Two shell programs (POSIX ``sh`` and GNU coreutils) stand in for them where the sandbox has
no ``python3``; the provider sends their text to ``/bin/sh -c`` (``supervisor.sh`` likewise
in ``CAPYBARA_PROGRAM``, ``protocol.scripts.SH_BOOT``):

* ``supervisor.sh`` — the same supervisor, writing the same record, without live frames.
* ``records.sh`` — the file agent's ``cmd_read`` and ``cmd_list`` over those records.
"""

from __future__ import annotations

import functools
import os

__all__ = ["source"]


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
