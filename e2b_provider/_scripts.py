"""The reference plugin's shell snippets, byte-exact, and the argument lists that run them.

This module owns every shell script the provider sends into a sandbox (``EXEC_WRAPPER``,
``KILL_TREE``, ``KILL_*_SCRIPT``, ``READ_SCRIPT``, ``STAT_SCRIPT``, ``*_WRITE_SCRIPT``), the
constants they depend on, and small builders for the ``args`` lists the reference passes to
envd's ``process.Process/Start``. The scripts are copied byte for byte from the reference
bundle (``plugin-sandbox-e2b.mjs``) with its JavaScript template literals expanded
(``${KILL_TREE}``, ``${SANDBOX_USER}``); a change of a single character changes behaviour in
every sandbox, so tests compare them against the reference.

Strings only: it does no I/O and imports no requests, urllib3 or socket.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Iterable, List, Optional

from .errors import InvalidArgument

__all__ = [
    "EXEC_WRAPPER",
    "IN_SANDBOX_GRACE_SECONDS",
    "KILL_ALL_SCRIPT",
    "KILL_SCRIPT",
    "KILL_TAGGED_SCRIPT",
    "KILL_TREE",
    "METADATA_NAME",
    "READ_SCRIPT",
    "ROOT_USER",
    "SANDBOX_USER",
    "SKILLS_WRITE_SCRIPT",
    "STAT_SCRIPT",
    "TAG_PATTERN",
    "UPLOAD_DIR",
    "USER_WRITE_SCRIPT",
    "check_tag",
    "control_path",
    "exec_args",
    "is_skills_path",
    "kill_all_args",
    "kill_args",
    "kill_tagged_args",
    "read_args",
    "staging_path",
    "stat_args",
    "write_args",
]

#: Sandbox metadata key that records the platform's sandbox name.
METADATA_NAME = "capybara-sandbox-name"
#: The unprivileged user commands and most file operations run as.
SANDBOX_USER = "sandbox"
#: The user uploads and writes under ``/skills`` run as.
ROOT_USER = "root"
#: Where uploads are staged before a write script moves them into place.
UPLOAD_DIR = "/opt/capybara/upload"
#: Seconds the in-sandbox ``timeout -s KILL`` waits beyond the caller's timeout.
IN_SANDBOX_GRACE_SECONDS = 5

#: An exec tag: embedded in a file name and in a ``pgrep -f`` regular expression, so it may
#: hold no regular-expression metacharacter.
TAG_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")

#: Runs ``$2`` under ``/bin/bash -c`` with an in-sandbox ``timeout -s KILL "$3"``; records the
#: wrapper's pid in ``$1.pid`` and refuses to start (exit 137) once ``$1.kill`` exists.
EXEC_WRAPPER = (
    'c=$1; echo $$ > "$c.pid" 2>/dev/null; if [ -e "$c.kill" ]; then exit 137; fi; '
    'timeout -s KILL "$3" /bin/bash -c "$2"; s=$?; rm -f "$c.pid"; exit $s'
)

#: Shell function ``k PID``: SIGKILL the process groups of PID's children, PID's own group and
#: its whole session. Prefix of the kill scripts.
KILL_TREE = (
    'k() { for t in $(pgrep -P "$1"); do kill -9 -"$t" 2>/dev/null; done; '
    'kill -9 -"$1" 2>/dev/null; pkill -9 -s "$1" 2>/dev/null; }; '
)

#: Kills every exec wrapper (and its tree) in the sandbox.
KILL_ALL_SCRIPT = (
    KILL_TREE + 'for q in $(pgrep -f -- "capybara-exec /tmp/[.]capybara-exec-"); do k "$q"; '
    'kill -9 "$q" 2>/dev/null; done; exit 0'
)

#: Kills the exec wrappers (and trees) whose control path carries one of the tags ``$@``.
KILL_TAGGED_SCRIPT = (
    KILL_TREE + "u='[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'; "
    'for t in "$@"; do for q in $(pgrep -f -- "capybara-exec /tmp/[.]capybara-exec-$t-$u( |$)"); '
    'do k "$q"; kill -9 "$q" 2>/dev/null; done; done; exit 0'
)

#: Kills the exec whose control path is ``$1``: marks it killed (so a wrapper that has not
#: started yet refuses to), waits up to ~1 s for its pid file, kills its tree, then sweeps any
#: wrapper still matching the control path.
KILL_SCRIPT = (
    KILL_TREE + 'c=$1; : > "$c.kill" 2>/dev/null; i=0; while [ ! -s "$c.pid" ] && [ $i -lt 20 ]; '
    'do sleep 0.05; i=$((i+1)); done; p=$(cat "$c.pid" 2>/dev/null); '
    'if [ -n "$p" ]; then k "$p"; rm -f "$c.kill"; fi; '
    'for q in $(pgrep -f -- "capybara-exec $c"); do k "$q"; kill -9 "$q" 2>/dev/null; done; '
    'rm -f "$c.pid"; exit 0'
)

#: Prints the first ``$2`` bytes of ``$1``; exit 3 if it does not exist, 4 if a directory.
READ_SCRIPT = (
    'if [ ! -e "$1" ]; then exit 3; fi; if [ -d "$1" ]; then exit 4; fi; exec head -c "$2" -- "$1"'
)

#: Prints ``"<size> file"`` or ``"<size> directory"``; exit 3 if ``$1`` does not exist.
STAT_SCRIPT = (
    'if [ ! -e "$1" ]; then exit 3; fi; '
    's=$(stat -L -c %s -- "$1" 2>/dev/null) || s=$(($(wc -c < "$1"))); '
    'if [ -d "$1" ]; then echo "$s directory"; else echo "$s file"; fi'
)

#: As the sandbox user, creates ``$1``'s directory and copies the staged upload ``$2`` into
#: ``$1``; always removes ``$2``.
USER_WRITE_SCRIPT = (
    "s=1; runuser -u "
    + SANDBOX_USER
    + ' -- /bin/sh -c \'set -e; mkdir -p -- "$(dirname -- "$1")"; cat > "$1"\' '
    'capybara-write "$1" < "$2" && s=0; rm -f -- "$2"; exit $s'
)

#: As root, writes the staged upload ``$2`` to ``$1`` (under ``/skills``) with mode 0644;
#: always removes ``$2``.
SKILLS_WRITE_SCRIPT = (
    'umask 022; s=1; mkdir -p -- "$(dirname -- "$1")" && cat -- "$2" > "$1" && '
    'chmod 0644 "$1" && s=0; rm -f -- "$2"; exit $s'
)

_CONTROL_PREFIX = "/tmp/.capybara-exec-"


def check_tag(tag: str) -> str:
    """Return ``tag`` if it is a valid exec tag.

    Args:
        tag: 1-64 characters from ``A-Z a-z 0-9 _ -``.

    Raises:
        InvalidArgument: the tag has another shape (it would break the kill scripts' regex).
    """
    if not isinstance(tag, str) or TAG_PATTERN.fullmatch(tag) is None:
        raise InvalidArgument("invalid sandbox tag: use 1-64 characters from A-Z a-z 0-9 _ -")
    return tag


def control_path(tag: Optional[str] = None) -> str:
    """A fresh control path for one exec (the wrapper writes ``<path>.pid``).

    Args:
        tag: optional exec tag, so :data:`KILL_TAGGED_SCRIPT` can find the exec later.

    Returns:
        ``/tmp/.capybara-exec-<uuid4>`` or ``/tmp/.capybara-exec-<tag>-<uuid4>``.

    Raises:
        InvalidArgument: ``tag`` is not a valid exec tag.
    """
    if tag is None:
        return f"{_CONTROL_PREFIX}{uuid.uuid4()}"
    return f"{_CONTROL_PREFIX}{check_tag(tag)}-{uuid.uuid4()}"


def exec_args(ctl: str, command: str, timeout_seconds: float) -> List[str]:
    """The args for cmd ``setsid`` that run ``command`` under :data:`EXEC_WRAPPER`.

    Args:
        ctl: the exec's control path (from :func:`control_path`).
        command: the shell command, run by ``/bin/bash -c``.
        timeout_seconds: the caller's timeout; the in-sandbox ``timeout -s KILL`` gets
            ``ceil(timeout_seconds) + IN_SANDBOX_GRACE_SECONDS``.

    Raises:
        InvalidArgument: ``timeout_seconds`` is negative or not finite.
    """
    t = float(timeout_seconds)
    if not math.isfinite(t) or t < 0:
        raise InvalidArgument("timeout must be a finite, non-negative number of seconds")
    seconds = math.ceil(t) + IN_SANDBOX_GRACE_SECONDS
    return ["-w", "/bin/sh", "-c", EXEC_WRAPPER, "capybara-exec", ctl, command, str(seconds)]


def kill_args(ctl: str) -> List[str]:
    """The args for cmd ``/bin/sh`` that kill the exec with control path ``ctl``."""
    return ["-c", KILL_SCRIPT, "capybara-kill", ctl]


def kill_all_args() -> List[str]:
    """The args for cmd ``/bin/sh`` that kill every exec in the sandbox."""
    return ["-c", KILL_ALL_SCRIPT, "capybara-killall"]


def kill_tagged_args(tags: Iterable[str]) -> List[str]:
    """The args for cmd ``/bin/sh`` that kill the execs started with any of ``tags``.

    Raises:
        InvalidArgument: a tag is not a valid exec tag.
    """
    if isinstance(tags, str):
        raise InvalidArgument("tags must be a list of tags, not one string")
    checked = [check_tag(t) for t in tags]
    return ["-c", KILL_TAGGED_SCRIPT, "capybara-killtagged", *checked]


def read_args(path: str, want: int) -> List[str]:
    """The args for cmd ``/bin/sh`` that print the first ``want`` bytes of ``path``.

    Exit 3: no such file; exit 4: a directory.

    Raises:
        InvalidArgument: ``want`` is not a non-negative integer.
    """
    if isinstance(want, bool) or not isinstance(want, int) or want < 0:
        raise InvalidArgument("want must be a non-negative integer")
    return ["-c", READ_SCRIPT, "capybara-read", path, str(want)]


def stat_args(path: str) -> List[str]:
    """The args for cmd ``/bin/sh`` that print ``"<size> file|directory"`` (exit 3: missing)."""
    return ["-c", STAT_SCRIPT, "capybara-stat", path]


def is_skills_path(path: str) -> bool:
    """True for ``/skills`` and paths below it (written as root, mode 0644)."""
    return path == "/skills" or path.startswith("/skills/")


def write_args(path: str, staging: str, skills: bool) -> List[str]:
    """The args for cmd ``/bin/sh`` (run as root) that move the upload ``staging`` to ``path``.

    Args:
        path: the destination in the sandbox.
        staging: the uploaded file (from :func:`staging_path`); always removed.
        skills: use :data:`SKILLS_WRITE_SCRIPT` (see :func:`is_skills_path`) instead of
            :data:`USER_WRITE_SCRIPT`.
    """
    script = SKILLS_WRITE_SCRIPT if skills else USER_WRITE_SCRIPT
    return ["-c", script, "capybara-write", path, staging]


def staging_path() -> str:
    """A fresh upload path ``/opt/capybara/upload/<uuid4>``."""
    return f"{UPLOAD_DIR}/{uuid.uuid4()}"
