"""What runs in a terminal, and how a terminal is named and found: its wrapper script and ids.

This module owns :data:`TERMINAL_WRAPPER` (``/bin/sh``, as the ``sandbox`` user, with the
environment an exec gets plus ``TERM=xterm-256color``), which keeps what the exec wrapper
gives every command and a terminal needs: a pid file under the terminal's control path, the
``.kill`` refusal and the exec marker in the environment of every process it starts, so
``kill_all``, a reboot and ``Terminal.kill`` stop its whole tree exactly as they stop an
exec (the kills go through the exec's batched kill script, see
:mod:`e2b_provider.commands.kills`; a terminal has no holder tag, so ``kill_tagged`` leaves it
alone). It leaves out what a terminal must not have: ``setsid`` (the pty gives the session),
``timeout -s KILL`` (it would put the program in a background process group of its terminal,
where it cannot read it; a terminal's ``timeout`` is this process's watchdog, which kills the
whole tree, and envd's ``Connect-Timeout-Ms``
:data:`~e2b_provider.protocol.scripts.IN_SANDBOX_GRACE_SECONDS` later, which kills its process
if nobody watched). The wrapper stays the session leader, ignores the terminal's SIGINT and
SIGQUIT itself (its programs get them), runs ``bash -c COMMAND`` or, without a command, the
user's login shell from ``/etc/passwd`` (``-l``), then kills what the program left behind
(its session, its marker: :data:`TERMINAL_LEFTOVERS`; a job left running would hold the pty,
and envd ends a process only once its pty is closed) and exits with the program's status.

It also owns a terminal's id (``<sandbox id>:pty-<pid>-<32 hex>``: its envd pid and its
control path), the environment its wrapper starts with, how an entry of envd's ``List`` is
recognised as a terminal this library opened, and the script that reads when terminals
started (the kernel's account). All of it is pure.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Dict, Mapping, Optional, Tuple

from ..errors import InvalidArgument, ProtocolError
from ..protocol import scripts as scripts
from ..protocol.scripts import CONTROL_PREFIX
from .users import as_root

__all__ = [
    "DEFAULT_TERM",
    "LEFTOVERS_VAR",
    "MAX_PID",
    "ROOT_TERMINAL_WRAPPER",
    "TERMINAL_ID_PREFIX",
    "TERMINAL_LEFTOVERS",
    "TERMINAL_STARTS_SCRIPT",
    "TERMINAL_WRAPPER",
    "is_terminal_id",
    "listed_terminal",
    "parse_starts",
    "parse_terminal_id",
    "terminal_env",
    "terminal_id",
    "terminal_wrapper",
]

#: The ``TERM`` a terminal's programs see unless ``env`` says otherwise (envd sets none).
DEFAULT_TERM = "xterm-256color"
#: What comes after ``<sandbox id>:`` in a terminal's id.
TERMINAL_ID_PREFIX = "pty-"

#: The environment variable that hands :data:`TERMINAL_LEFTOVERS` to the wrapper.
LEFTOVERS_VAR = "CAPYBARA_LEFTOVERS"

#: What a terminal's wrapper becomes once its program has exited (``exec``, so it keeps its
#: pid: envd's process and the session's leader; ``$1`` the control path, ``$2`` the
#: program's status, the exec marker no longer in its environment): it kills what the
#: program left behind, then exits with the program's status. First, in up to five rounds
#: (children forked meanwhile), every process of its session but itself, listed from
#: ``/proc/*/stat`` by shell builtins alone, so the listing starts no process of its own
#: (a job the shell left running, ``nohup``'d or ignoring the hang-up, holds the terminal and
#: would keep envd from ever ending it); then every process carrying the terminal's exec
#: marker (``MARKED_KILL``: what left the session with ``setsid``). The wrapper gets it in
#: :data:`LEFTOVERS_VAR`, not on its command line, which ``ps`` shows.
TERMINAL_LEFTOVERS = (
    scripts.MARKED_KILL
    + 'trap "" INT QUIT; c=$1; s=$2; r=0; while [ $r -lt 5 ]; do r=$((r+1)); g=; '
    'for f in /proc/[0-9]*/stat; do { read -r x < "$f"; } 2>/dev/null || continue; '
    'x=${x##*)}; set -- $x; [ "$4" = "$$" ] && [ "$1" != Z ] || continue; f=${f%/stat}; '
    'f=${f#/proc/}; [ "$f" = "$$" ] || g="$g $f"; done; [ -n "$g" ] || break; '
    'kill -9 $g 2>/dev/null; done; z -xF "' + scripts.EXEC_MARKER + '=$c"; exit $s'
)

#: Runs the terminal's program: ``$1`` its control path, ``$2`` a shell command for
#: ``/bin/bash -c`` (empty: the user's login shell). See the module's docstring. Its pid file
#: is removed in the foreground (the exec wrapper removes it in the background, off its
#: stream's end): a background ``rm`` would share the terminal's process group and die of
#: the hang-up the kernel sends it when the wrapper, the session's leader, exits. When the
#: program has exited, the wrapper becomes :data:`TERMINAL_LEFTOVERS` (without the exec
#: marker, so its sweep by the marker spares it; with SIGINT and SIGQUIT ignored, not
#: trapped, so a Ctrl-C typed meanwhile cannot end it before it ignores them itself): the
#: program's exit ends the terminal, and nothing it started outlives it. It takes that
#: script from :data:`LEFTOVERS_VAR` and out of the environment its program gets.
TERMINAL_WRAPPER = (
    'c=$1; k=$' + LEFTOVERS_VAR + '; unset ' + LEFTOVERS_VAR + '; '
    'echo $$ > "$c.pid" 2>/dev/null; if [ -e "$c.kill" ]; then exit 137; fi; '
    "trap : INT QUIT; "
    'if [ -n "$2" ]; then /bin/bash -c "$2"; else u=${USER:-$(id -un)}; l=; '
    'while IFS=: read -r n _ _ _ _ _ l; do [ "$n" = "$u" ] && break; l=; done < /etc/passwd; '
    '[ -x "$l" ] || l=/bin/sh; "$l" -l; fi; s=$?; trap "" INT QUIT; rm -f "$c.pid" 2>/dev/null; '
    "unset " + scripts.EXEC_MARKER + '; exec /bin/sh -c "$k" capybara-exec "$c" $s'
)

#: :data:`TERMINAL_WRAPPER` for a terminal of root: its pid file is written as
#: :func:`~e2b_provider.commands.users.as_root` says.
ROOT_TERMINAL_WRAPPER = as_root(TERMINAL_WRAPPER)


def terminal_wrapper(user: str) -> str:
    """The wrapper a terminal of ``user`` (``"sandbox"`` or ``"root"``) runs under."""
    return ROOT_TERMINAL_WRAPPER if user == scripts.ROOT_USER else TERMINAL_WRAPPER


_ID_RE = re.compile(r"pty-(?P<pid>[1-9][0-9]{0,9})-(?P<hex>[0-9a-f]{32})")
#: The largest pid envd can name (its pids are 32-bit): an id with a larger one names none.
MAX_PID = 2**32 - 1
#: As the sandbox user, with the pids of terminals as arguments: the kernel's account of
#: when each started. Prints ``CLK_TCK UPTIME NOW`` (seconds since boot, and since the
#: epoch, read one after the other), then ``PID STARTTIME`` (clock ticks since boot, field
#: 22 of ``/proc/PID/stat``, read after the last ``) ``: the program's name before it is
#: the user's to choose) for each that still runs.
TERMINAL_STARTS_SCRIPT = (
    "set -f; t=$(getconf CLK_TCK 2>/dev/null) || t=100; "
    'read -r u _ < /proc/uptime; echo "$t $u $(date +%s.%N)"; '
    'for p; do l=; read -r l 2>/dev/null < "/proc/$p/stat" || continue; '
    'set -- ${l##*") "}; [ $# -ge 20 ] || continue; shift 19; echo "$p $1"; done'
)


def terminal_env(env: Mapping[str, str], ctl: str) -> Dict[str, str]:
    """The environment envd starts a terminal's wrapper with: ``TERM`` (unless ``env`` has
    one), ``env``, the exec marker of control path ``ctl`` and :data:`LEFTOVERS_VAR` (these
    two never overridden)."""
    out = {"TERM": DEFAULT_TERM}
    out.update(env)
    out[scripts.EXEC_MARKER] = ctl
    out[LEFTOVERS_VAR] = TERMINAL_LEFTOVERS
    return out


def terminal_id(sandbox_id: str, pid: int, ctl: str) -> str:
    """The id of the terminal with envd pid ``pid`` and control path ``ctl``."""
    return f"{sandbox_id}:{TERMINAL_ID_PREFIX}{pid}-{uuid.UUID(ctl[len(CONTROL_PREFIX):]).hex}"


def is_terminal_id(value: object) -> bool:
    """Whether ``value`` has the shape of a terminal's id (not that it exists)."""
    if not isinstance(value, str):
        return False
    _, sep, tail = value.rpartition(":")
    return bool(sep) and _ID_RE.fullmatch(tail) is not None


def parse_terminal_id(value: object) -> Tuple[str, int, str]:
    """``(sandbox id, pid, control path)`` of a terminal id.

    Raises:
        InvalidArgument: not a terminal id (before any I/O).
    """
    if isinstance(value, str):
        sid, sep, tail = value.rpartition(":")
        m = _ID_RE.fullmatch(tail)
        if sep and sid and m is not None:
            return sid, int(m.group("pid")), CONTROL_PREFIX + str(uuid.UUID(m.group("hex")))
    raise InvalidArgument(
        f"{str(value)[:100]!r} is not a terminal id (they look like "
        "'<sandbox id>:pty-<pid>-<32 hex>', as Terminal.id gives them)"
    )


def listed_terminal(p: Mapping[str, Any]) -> Optional[Tuple[int, str, str]]:
    """``(pid, control path, command)`` when envd's ``List`` entry ``p`` is a terminal this
    library opened (its wrapper, as
    :meth:`~e2b_provider.commands.terminals.Terminals.open` starts it), else None."""
    ctl, pid, config = p.get("tag"), p.get("pid"), p.get("config")
    if not (isinstance(ctl, str) and isinstance(pid, int) and not isinstance(pid, bool)
            and 0 < pid <= MAX_PID and isinstance(config, dict)):
        return None
    args, envs = config.get("args"), config.get("envs")
    if (config.get("cmd") != "/bin/sh" or not isinstance(args, list) or len(args) != 5
            or args[0] != "-c" or args[1] not in (TERMINAL_WRAPPER, ROOT_TERMINAL_WRAPPER)
            or args[2:4] != ["capybara-exec", ctl]
            or not isinstance(args[4], str) or not isinstance(envs, dict)
            or envs.get(scripts.EXEC_MARKER) != ctl):
        return None
    try:  # a control path without a tag, as terminals have, that their ids name exactly
        if CONTROL_PREFIX + str(uuid.UUID(ctl[len(CONTROL_PREFIX):])) != ctl:
            return None
    except ValueError:
        return None
    return pid, ctl, args[4]


def parse_starts(out: bytes) -> Dict[int, float]:
    """What :data:`TERMINAL_STARTS_SCRIPT` printed: each pid's start, in seconds since the
    epoch (the sandbox's clock).

    Raises:
        ProtocolError: its output is not what it prints.
    """
    lines = out.decode("ascii", "replace").splitlines()
    try:
        tick_s, up_s, now_s = lines[0].split()
        tick, up, now = int(tick_s), float(up_s), float(now_s)
        starts = {}
        for line in lines[1:]:
            pid, ticks = (int(w) for w in line.split())
            starts[pid] = now - up + ticks / tick
    except (IndexError, ValueError, ZeroDivisionError):
        raise ProtocolError("the start times of the terminals were read as something else"
                            ) from None
    return starts
