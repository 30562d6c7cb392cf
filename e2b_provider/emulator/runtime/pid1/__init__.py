"""PID 1 of an emulator sandbox: :mod:`.init` is its entry, run by file path with ``python -S``.

Every module of this folder imports only the standard library and its siblings, by top-level
name (``sys.path[0]`` is this folder when ``init.py`` runs by path); PID 1 never imports this
package. The host imports the pure parts from here (:mod:`.pid1_accounts`, :mod:`.pid1_log`,
:mod:`.pid1_syscalls`).
"""
