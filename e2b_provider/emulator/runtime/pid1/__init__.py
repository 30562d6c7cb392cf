"""PID 1 of an emulator sandbox: :mod:`.init` is its entry, run by file path with ``python -S``.

Every module of this folder imports only the standard library and its siblings, by top-level
name (``sys.path[0]`` is this folder when ``init.py`` runs by path); PID 1 never imports this
package. PID 1 imports them all at its start, before it builds the sandbox; the folder is
inside the ``e2b_provider`` package, which every sandbox also sees read-only at the same path,
and ``-E -s -S`` leave nothing but the standard library on ``sys.path`` after it. Their names
(``pid1_*``) shadow no standard module; ``-B`` keeps PID 1 from writing their bytecode.
The host imports the pure parts from here (:mod:`.pid1_accounts`, :mod:`.pid1_log`,
:mod:`.pid1_syscalls`).
"""
