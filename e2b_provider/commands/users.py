"""Who a command runs as: the users a caller may name, and the root variants of the scripts.

This module owns :data:`USERS` (``"sandbox"``, the default, and ``"root"``; envd itself
takes any account of the guest's passwd database, named by the Basic-auth user of its
``Start`` request), :func:`check_user`, and the variants of the exec wrapper, the
terminal's wrapper and the batched kill script that run as root.

A root command's control files live in ``/tmp`` beside everyone's, where the sandbox user
can make names before root does (its control path shows in the process list as soon as
envd starts the wrapper). So nothing root does there follows a name the sandbox user may
have made:

* the root wrappers (:data:`ROOT_EXEC_WRAPPER`, and the terminal's,
  :data:`~e2b_provider.commands.terminal_wrapper.ROOT_TERMINAL_WRAPPER`) write their pid
  file into a fresh file of their own (``mktemp``, which never opens an existing name) and
  rename it over ``<ctl>.pid`` (a rename replaces the name itself, link or not, and never
  writes through it);
* the root kill marks ``<ctl>.kill`` with ``mkdir`` (which never follows a link) instead
  of opening it, and removes a mark with ``rmdir`` (or ``rm``: the name, never what it
  names); its pid files are only read, and a pid counts only while that process's command
  line is still the exec's wrapper, as for the sandbox user's kills.

The kills of a root command (its timeout, cancel, Ctrl-C, a terminal's kill) run as root:
the sandbox user may not signal its processes. ``kill_all`` and ``kill_tagged`` sweep as the
sandbox user and then as root, so they reach root commands too.
"""

from __future__ import annotations

from typing import Tuple

from ..errors import InvalidArgument
from ..protocol import scripts as scripts

__all__ = [
    "ROOT_EXEC_WRAPPER",
    "ROOT_KILL_BATCH_SCRIPT",
    "USERS",
    "as_root",
    "check_user",
    "exec_wrapper",
]

#: The users a command may run as: the sandbox user (the default) and root.
USERS: Tuple[str, ...] = (scripts.SANDBOX_USER, scripts.ROOT_USER)

_PID_WRITE = 'echo $$ > "$c.pid" 2>/dev/null; '
_SAFE_PID_WRITE = (
    't=$(mktemp -- "$c.XXXXXXXX" 2>/dev/null) && { echo $$ > "$t" && '
    'mv -f -T -- "$t" "$c.pid" 2>/dev/null || rm -f -- "$t"; }; '
)


def _replace_once(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:  # pragma: no cover - a change of the scripts breaks this at import
        raise AssertionError(f"expected one {old!r} in a script")
    return text.replace(old, new)


def as_root(wrapper: str) -> str:
    """The root variant of a wrapper that writes ``$c.pid``: that pid file written without
    following a name the sandbox user made (see the module)."""
    return _replace_once(wrapper, _PID_WRITE, _SAFE_PID_WRITE)


#: :data:`~e2b_provider.protocol.scripts.LEAN_EXEC_WRAPPER` for root (:func:`as_root`).
ROOT_EXEC_WRAPPER = as_root(scripts.LEAN_EXEC_WRAPPER)
#: :data:`~e2b_provider.protocol.scripts.KILL_BATCH_SCRIPT` for root: the ``.kill`` marks
#: made by ``mkdir`` and removed by name (see the module).
ROOT_KILL_BATCH_SCRIPT = _replace_once(
    _replace_once(
        scripts.KILL_BATCH_SCRIPT,
        'for c in "$@"; do : <> "$c.kill" 2>/dev/null; done; ',
        'for c in "$@"; do mkdir -m 0700 -- "$c.kill" 2>/dev/null; done; ',
    ),
    'rm -f "$c.kill";',
    'rmdir -- "$c.kill" 2>/dev/null || rm -f -- "$c.kill";',
)


def check_user(user: str) -> str:
    """Return ``user`` if a command may run as it.

    Args:
        user: ``"sandbox"`` or ``"root"``.

    Raises:
        InvalidArgument: any other value (before any I/O).
    """
    if not isinstance(user, str) or user not in USERS:
        shown = repr(user)[:80] if isinstance(user, str) else type(user).__name__
        raise InvalidArgument(
            f"user must be 'sandbox' or 'root', not {shown}: commands run as the sandbox "
            "user unless they need root (apt-get install, say)"
        )
    return user


def exec_wrapper(user: str) -> str:
    """The exec wrapper a command of ``user`` runs under."""
    return ROOT_EXEC_WRAPPER if user == scripts.ROOT_USER else scripts.LEAN_EXEC_WRAPPER
