"""The reference plugin's shell snippets, byte-exact, and the argument lists that run them.

This module owns every shell script the provider sends into a sandbox (``EXEC_WRAPPER``,
``KILL_TREE``, ``KILL_*_SCRIPT``, ``READ_SCRIPT``, ``STAT_SCRIPT``, ``*_WRITE_SCRIPT``, and the
library's own file and kill scripts below them), the constants they depend on (among them
the exec marker every exec's processes inherit), and small builders for
the ``args`` lists passed to envd's ``process.Process/Start``. The reference's scripts are
copied byte for byte from its bundle (``plugin-sandbox-e2b.mjs``) with its JavaScript
template literals expanded (``${KILL_TREE}``, ``${SANDBOX_USER}``); a change of a single
character changes behaviour in every sandbox, so tests compare them against the reference.
Execs run :data:`LEAN_EXEC_WRAPPER`, the reference's wrapper with the same guarantees and
less work per exec (its docstring says what differs, and why).

Strings only: it does no I/O and imports no requests, urllib3 or socket.
"""

from __future__ import annotations

import base64
import math
import re
import shlex
import uuid
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from ..errors import InvalidArgument
from .boot import PACKED_BOOT, PROGRAM_VAR, PYTHON_BOOT

__all__ = [
    "AGENT_RETIRE_SCRIPT",
    "BIG_PIPE",
    "EXEC_MARKER",
    "EXEC_WRAPPER",
    "FILEOP_CLEANUP_SCRIPT",
    "FILEOP_MARKER",
    "HELPER_LANG",
    "HOLD_PROGRAM",
    "HOLD_SCRIPT",
    "INLINE_SKILLS_WRITE_SCRIPT",
    "INLINE_USER_WRITE_SCRIPT",
    "INLINE_WRITE_MAX",
    "IN_SANDBOX_GRACE_SECONDS",
    "KILL_ALL_MARKED_SCRIPT",
    "KILL_ALL_SCRIPT",
    "KILL_BATCH_MAX",
    "KILL_BATCH_SCRIPT",
    "KILL_SCRIPT",
    "KILL_TAGGED_MARKED_SCRIPT",
    "KILL_TAGGED_SCRIPT",
    "KILL_TREE",
    "LARGE_READ_EXIT",
    "LARGE_READ_MIN",
    "LEAN_EXEC_WRAPPER",
    "MARKED_KILL",
    "METADATA_NAME",
    "MISSING_TOOL_EXIT",
    "NOT_THERE",
    "NOT_REGULAR_EXIT",
    "NO_ENTRY_EXIT",
    "PART_PREFIX",
    "READ_PROBE_SCRIPT",
    "READ_SCRIPT",
    "REFUSED_EXIT",
    "ROOT_PARTS_DIR",
    "ROOT_USER",
    "SANDBOX_USER",
    "SKILLS_WRITE_SCRIPT",
    "STAT_PROBE_SCRIPT",
    "STAT_SCRIPT",
    "STREAM_WRITE_SCRIPT",
    "TAG_PATTERN",
    "TREE_UPLOAD_SCRIPT",
    "TREE_WHOLE_SCRIPT",
    "UPLOAD_DIR",
    "USER_PARTS_PREFIX",
    "USER_WRITE_SCRIPT",
    "check_tag",
    "control_path",
    "exec_args",
    "fileop_cleanup_args",
    "fileop_name",
    "hold_args",
    "inline_write_args",
    "exec_env",
    "is_skills_path",
    "kill_all_args",
    "kill_args",
    "kill_batch_args",
    "kill_tagged_args",
    "read_args",
    "read_probe_args",
    "staging_path",
    "stat_args",
    "stat_probe_args",
    "stream_write_args",
    "tree_upload_args",
    "write_args",
    "agent_retire_args",
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
#: The reference's text, kept for comparison: execs run :data:`LEAN_EXEC_WRAPPER`.
EXEC_WRAPPER = (
    'c=$1; echo $$ > "$c.pid" 2>/dev/null; if [ -e "$c.kill" ]; then exit 137; fi; '
    'timeout -s KILL "$3" /bin/bash -c "$2"; s=$?; rm -f "$c.pid"; exit $s'
)

#: The ``LANG`` the exec wrapper's own programs run with (see :func:`exec_env`): the C
#: locale, which glibc has built in, so none of them opens a locale file.
HELPER_LANG = "C"

#: What every exec runs (:func:`exec_args`): :data:`EXEC_WRAPPER` with the same session,
#: pid file, ``.kill`` refusal, ``timeout -s KILL "$3"``, ``/bin/bash -c "$2"`` and exit
#: status, and two changes that take work off each exec's critical path (each program of
#: the reference's wrapper loaded the UTF-8 locale, and its last one, ``rm``, held the end of
#: the stream):
#:
#: * envd starts it with ``LANG`` = :data:`HELPER_LANG` (:func:`exec_env`), so envd's own
#:   ``nice``, ``setsid`` and ``sh`` skip the locale; the ``LANG`` the caller asked for is
#:   ``$4`` and is assigned just before ``timeout`` starts the command. The variable keeps
#:   its place in the environment, so ``bash -c "$2"`` and everything it starts see exactly
#:   the environment :data:`EXEC_WRAPPER` gives them, byte for byte. Without ``$4`` the
#:   environment is passed on untouched.
#: * the pid file is removed in the background (by an ``rm`` in the C locale, reading and
#:   writing ``/dev/null``): the wrapper exits with the command's status at once, and envd's
#:   end event (which waits for the wrapper's exit and the end of its output pipes) does not
#:   wait for ``rm``. The pid file exists from before the ``.kill`` check until the command
#:   has ended, as the kill scripts need; it is gone a moment after the exec's result.
LEAN_EXEC_WRAPPER = (
    'c=$1; echo $$ > "$c.pid" 2>/dev/null; if [ -e "$c.kill" ]; then exit 137; fi; '
    '[ $# -lt 4 ] || export LANG="$4"; timeout -s KILL "$3" /bin/bash -c "$2"; s=$?; '
    "LANG=" + HELPER_LANG + ' rm -f "$c.pid" </dev/null >/dev/null 2>&1 & exit $s'
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
#: wrapper still matching the control path. The reference's text (the library kills with
#: :data:`KILL_BATCH_SCRIPT`, which opens the mark read-write: a FIFO there does not stop it).
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

#: Exit statuses that say the sandbox could not run ``python3`` (not found, not runnable).
NO_PYTHON_STATUSES = (126, 127)
#: The start of every exec's control path (its pid file, kill refusal and records).
CONTROL_PREFIX = "/tmp/.capybara-exec-"


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
        return f"{CONTROL_PREFIX}{uuid.uuid4()}"
    return f"{CONTROL_PREFIX}{check_tag(tag)}-{uuid.uuid4()}"


def exec_args(
    ctl: str, command: str, timeout_seconds: float, env: Mapping[str, str]
) -> List[str]:
    """The args for cmd ``setsid`` that run ``command`` under :data:`LEAN_EXEC_WRAPPER`.

    Args:
        ctl: the exec's control path (from :func:`control_path`).
        command: the shell command, run by ``/bin/bash -c``.
        timeout_seconds: the caller's timeout; the in-sandbox ``timeout -s KILL`` gets
            ``ceil(timeout_seconds) + IN_SANDBOX_GRACE_SECONDS``.
        env: the environment the command is to see, the one given to :func:`exec_env`:
            its ``LANG``, if any, is passed as the wrapper's ``$4``.

    Raises:
        InvalidArgument: ``timeout_seconds`` is negative or not finite.
    """
    t = float(timeout_seconds)
    if not math.isfinite(t) or t < 0:
        raise InvalidArgument("timeout must be a finite, non-negative number of seconds")
    seconds = math.ceil(t) + IN_SANDBOX_GRACE_SECONDS
    args = ["-w", "/bin/sh", "-c", LEAN_EXEC_WRAPPER, "capybara-exec", ctl, command, str(seconds)]
    lang = env.get("LANG")
    if lang is not None:
        args.append(lang)
    return args


def kill_args(ctl: str) -> List[str]:
    """The args for cmd ``/bin/sh`` that kill the exec with control path ``ctl``."""
    return ["-c", KILL_SCRIPT, "capybara-kill", ctl]


def kill_all_args() -> List[str]:
    """The args for cmd ``/bin/sh`` that kill every exec in the sandbox (also the processes
    that left an exec's session: :data:`KILL_ALL_MARKED_SCRIPT`)."""
    return ["-c", KILL_ALL_MARKED_SCRIPT, "capybara-killall"]


def kill_tagged_args(tags: Iterable[str]) -> List[str]:
    """The args for cmd ``/bin/sh`` that kill the execs started with any of ``tags`` (also
    the processes that left their sessions: :data:`KILL_TAGGED_MARKED_SCRIPT`).

    Raises:
        InvalidArgument: a tag is not a valid exec tag.
    """
    if isinstance(tags, str):
        raise InvalidArgument("tags must be a list of tags, not one string")
    checked = [check_tag(t) for t in tags]
    return ["-c", KILL_TAGGED_MARKED_SCRIPT, "capybara-killtagged", *checked]


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


# ---- the provider's own file scripts (not the reference's) ------------------------------
#
# Everything below is this library's, not a copy from the reference: one-request small
# writes, the probe that sends large reads to the fast path, the streamed large write and
# the clean-up of file operations that ended early. Each keeps the reference's semantics
# (who writes, ownership, parent creation, ``/skills`` rules).

#: Content up to this many bytes travels inside the ``process.Process/Start`` request
#: (base64 in one argument: 64 KiB → 87,384 characters, well under Linux's 128 KiB limit
#: for one argument string and the ~2 MiB limit for all of them).
INLINE_WRITE_MAX = 64 * 1024
#: A read asking for more than this, of a regular file larger than this, takes the fast
#: path (``GET /files`` of a file the sandbox user opened); anything smaller is printed by
#: ``head -c`` in the one request that examined it.
LARGE_READ_MIN = 2 * 1024 * 1024
#: Prefix of the name (``$0``, so in ``/proc/<pid>/cmdline``) that marks the top process of
#: one file operation; the operation's id (32 hex digits) follows. The clean-up finds the
#: top by it and then every descendant by parent pid (``runuser`` puts its child in a
#: session of its own, so neither sessions nor process groups hold the whole tree; and
#: another user's ``/proc/<pid>/environ`` is closed to a root without CAP_SYS_PTRACE).
FILEOP_MARKER = "capybara-fileop-"
#: Exit status of a file script that found a tool it needs missing (``base64``,
#: ``python3``): the provider then takes the slower path that needs only the reference's.
MISSING_TOOL_EXIT = 97
#: Exit status of the read probe when the read should take the fast path.
LARGE_READ_EXIT = 10

#: Exit status of a root write (under ``/skills``) refused because of where it would write:
#: a symbolic link, something that is not a regular file, or a directory on the way that
#: is not root's or that others may write. One line on standard error names the path and
#: why (``/skills/a.md is a symbolic link``).
REFUSED_EXIT = 80
#: Exit status of the read probe for a FIFO, a character or block device or a socket
#: (reading one may block or never end); standard error says which it is.
NOT_REGULAR_EXIT = 6
#: Every write goes to ``<target's directory>/.capybara-part-<pid>-<hex op id>`` (``pid``:
#: the writing shell's) and is renamed over the target only when complete.
PART_PREFIX = ".capybara-part-"
#: While a temporary file exists, a symbolic link ``<pid>-<hex op id>`` to its absolute path
#: stands in the writing user's registry ``/tmp/.capybara-parts-<user name>`` (0700, the
#: user's; the Python file agent keeps the same layout), so that a clean-up can remove what
#: a killed writer left.
USER_PARTS_PREFIX = "/tmp/.capybara-parts-"
#: Root's registry of temporary files (root-only, in the staging directory).
ROOT_PARTS_DIR = UPLOAD_DIR + "/parts"
#: A marked write script renames its temporary file over the target only once it has
#: created ``<this><op id>`` (exclusively: ``set -C``); a cancel creates it first to withdraw
#: the write (see :data:`FILEOP_CLEANUP_SCRIPT`). Whoever made it, the write is either
#: withdrawn before its rename or owns it: never both.
COMMIT_PREFIX = "/tmp/.capybara-commit-"
#: Exit status of a write script whose rename was withdrawn (its target left as it was).
WITHDRAWN_EXIT = 96

# The write scripts below are put together from these pieces (shell text; each ends "; ").

#: Shell function ``no MESSAGE [STATUS]``: says MESSAGE on standard error after the script's
#: name (which users never read) and exits with STATUS (1 if none).
_NO = 'no() { echo "$0: $1" >&2; exit "${2:-1}"; }; '
#: Shell function ``ty PATH``: ``k`` becomes what PATH, not a regular file, is, in words.
#: Builtins only.
_KIND = (
    'ty() { if [ -p "$1" ]; then k="a FIFO"; elif [ -c "$1" ]; then k="a character device"; '
    'elif [ -b "$1" ]; then k="a block device"; elif [ -S "$1" ]; then k="a socket"; '
    'else k="a special file"; fi; }; '
)
#: ``o``: the operation's id, the hex digits that end ``$0`` (:func:`fileop_name`); 0 when
#: ``$0`` is not a marked name.
_OP_ID = 'o=${0##*-}; case $o in ""|*[!0-9a-f]*) o=0;; esac; '
#: As the user, for the path ``$1``: ``t`` is the file to replace (a symbolic link at ``$1``
#: is followed), refused (exit 1) if it is a directory, not a regular file or not writable
#: by the user; ``m`` is set when it exists (its mode is kept); ``p`` is the temporary file
#: beside it; its directory is made if missing and must be writable; a file of another
#: user's in a sticky directory such as ``/tmp`` is refused too (the rename could not
#: replace it; ``[ -O / ]``: root, who may, is the owner of ``/``).
_USER_TARGET = (
    't=$1; if [ -L "$t" ]; then t=$(readlink -f -- "$t") || '
    'no "cannot create $1: its symbolic link cannot be followed (a loop, or a missing '
    'directory)"; fi; case $t in /*) ;; *) t=${PWD%/}/$t;; esac; m=; '
    'if [ -d "$t" ] || [ "${t%/}" != "$t" ]; then no "cannot create $1: Is a directory"; '
    'elif [ -e "$t" ]; then if [ ! -f "$t" ]; then ty "$t"; '
    'no "cannot write $1: it is $k, not a regular file"; fi; '
    '[ -w "$t" ] || no "cannot create $1: Permission denied"; m=1; fi; '
    "d=${t%/*}; p=$d/" + PART_PREFIX + "$$-$o; d=${d:-/}; "
    '[ -d "$d" ] || mkdir -p -- "$d" || exit; [ -w "$d" ] && [ -x "$d" ] || '
    'if [ -n "$m" ]; then no "cannot replace $1: its directory $d is not writable: '
    'Permission denied"; else no "cannot create $1: Permission denied"; fi; '
    'if [ -n "$m" ] && [ -k "$d" ] && [ ! -O "$t" ] && [ ! -O "$d" ] && [ ! -O / ]; then '
    'no "cannot replace $1: it belongs to another user in a sticky directory ($d), where '
    'only its owner may replace it: Permission denied"; fi; '
    'u=$USER; case $u in ""|[.-]*|*[!A-Za-z0-9._-]*) u=$(id -u);; esac; '
    "r=" + USER_PARTS_PREFIX + "$u; "
)
#: As root, for the path ``$t``: refuses (exit :data:`REFUSED_EXIT`) unless every existing
#: directory from ``/`` down to its parent is a real directory (no symbolic link) owned by
#: root that neither group nor others may write, and the target, if it exists, is a
#: regular file; then makes the missing directories (0755, in a directory that passed).
#: One ``stat`` for all the components: it prints one word per existing one, in order, up
#: to the first missing one (every later one is missing too: a directory that passed is
#: closed to everyone but root). Nothing the check passed can change afterwards. (``%f`` is
#: the raw mode in hex; 61440 is ``S_IFMT``, 32768 a regular file, 40960 a symbolic link,
#: 16384 a directory; 18 is 0o022, group or other write.)
_ROOT_CHECK = (
    'nr() { no "$1" ' + str(REFUSED_EXIT) + '; }; '
    'rc() { case $t in /*) ;; *) nr "$t is not an absolute path";; esac; '
    'case $t/ in */./*|*/../*) nr "$t has a . or .. component";; esac; '
    'case $t in */) nr "$t names a directory";; esac; '
    'a=$t; set -- "$t"; while [ -n "$a" ]; do a=${a%/*}; set -- "${a:-/}" "$@"; done; k=; '
    'for x in $(stat -c %f:%u -- "$@" 2>/dev/null); do k=1; n=$1; shift; y=$((0x${x%:*})); '
    'case $#:$((y & 61440)) in 0:32768) ;; *:40960) nr "$n is a symbolic link";; '
    '0:16384) nr "$n is a directory";; 0:*) nr "$n is not a regular file";; '
    '*:16384) [ "${x#*:}" = 0 ] || nr "$n is not owned by root"; '
    '[ $((y & 18)) = 0 ] || nr "$n is writable by other users";; '
    '*) nr "$n is not a directory";; esac; done; [ -n "$k" ] || no "cannot examine $t"; '
    '[ $# -le 1 ] || mkdir -p -- "${t%/*}" || exit; }; '
    'p=${t%/*}/' + PART_PREFIX + "$$-$o; r=" + ROOT_PARTS_DIR + "; "
)
#: Registers the temporary file ``$p`` as ``$r/<pid>-<op id>`` (``e``; empty when the
#: registry is not a directory of the user's own: the write goes on unregistered; ``MKREG``
#: makes a missing one), and sets the traps that remove the temporary file (once ``c`` says
#: it was created), the registry entry and the commit mark ``$w`` (once ``g`` says this
#: script made it) whenever the script ends.
_REGISTER = (
    "e=$r/$$-$o; c=; g=; w=" + COMMIT_PREFIX + "$o; "
    "trap '[ -z \"$c$e$g\" ] || rm -f -- ${c:+\"$p\"} ${e:+\"$e\"} ${g:+\"$w\"}' EXIT; "
    "trap 'exit 143' HUP INT TERM; { [ -d \"$r\" ] || MKREG; } 2>/dev/null; "
    '[ -d "$r" ] && [ ! -L "$r" ] && [ -O "$r" ] && ln -s -T -- "$p" "$e" 2>/dev/null || e=; '
)
_USER_REGISTER = _REGISTER.replace("MKREG", 'mkdir -m 0700 -- "$r"')
_ROOT_REGISTER = _REGISTER.replace("MKREG", 'mkdir -p -m 0700 -- ' + UPLOAD_DIR + ' "$r"')
#: An overwrite as the user keeps the old file's mode (a new file has ``0666 & ~umask``).
_USER_MODE = '[ -z "$m" ] || chmod --reference="$t" -- "$p" || exit; '
_ROOT_MODE = 'chmod 0644 -- "$p" || exit; '


def _put(fill: str, mode: str, size: str = "") -> str:
    """Shell text that writes what ``fill`` prints to the new temporary file ``$p``
    (noclobber: it never opens a file that exists), checks (``size``: the shell word of the
    expected size) that exactly that many bytes arrived, gives it its ``mode`` and renames
    it over ``$t`` once it made the commit mark (:data:`COMMIT_PREFIX`; a marked operation
    only: exit :data:`WITHDRAWN_EXIT` if a cancel made it first); the traps remove whatever
    is left on any failure."""
    check = ""
    if size:
        check = (
            'n=$(stat -c %s -- "$p") || exit; [ "$n" = "' + size + '" ] || '
            'no "the upload was incomplete ($n of ' + size + ' bytes arrived); $t was left '
            'unchanged"; '
        )
    return (
        'set -C; { c=1; ' + fill + '; } > "$p" || exit; ' + check + mode
        + 'if [ "$o" != 0 ]; then { command : > "$w"; } 2>/dev/null || '
        + 'no "the write was withdrawn" ' + str(WITHDRAWN_EXIT) + '; g=1; fi; '
        + 'mv -f -T -- "$p" "$t" || exit; c=; exit 0'
    )


_BASE64_FILL = 'printf %s "$2" | base64 -d'

#: As the sandbox user: writes the base64 content ``$2`` to ``$1`` (the reference's
#: :data:`USER_WRITE_SCRIPT`, with the bytes in the request), atomically: to a temporary
#: file beside the target (registered, see :data:`USER_PARTS_PREFIX`), renamed over it when
#: complete; an overwrite keeps the old mode; missing directories are made. A symbolic
#: link at ``$1`` is followed; a directory, a FIFO, device or socket, or a file the user
#: may not write is refused (exit 1, the reason on standard error). Exit
#: :data:`MISSING_TOOL_EXIT` without ``base64``. Starts ``base64``, ``ln``, ``mv``, ``rm``
#: (plus ``chmod`` for an overwrite, ``mkdir`` for a missing directory or registry,
#: ``readlink`` for a symbolic link, ``id`` when ``$USER`` is unset).
INLINE_USER_WRITE_SCRIPT = (
    f"command -v base64 >/dev/null 2>&1 || exit {MISSING_TOOL_EXIT}; "
    + _NO + _KIND + _OP_ID + _USER_TARGET + _USER_REGISTER + _put(_BASE64_FILL, _USER_MODE)
)

#: As root: writes the base64 content ``$2`` to ``$1`` (under ``/skills``) with mode 0644
#: (the reference's :data:`SKILLS_WRITE_SCRIPT`, with the bytes in the request), only where
#: the sandbox user can interfere with nothing (see :data:`REFUSED_EXIT`), atomically as
#: :data:`INLINE_USER_WRITE_SCRIPT` (registered in :data:`ROOT_PARTS_DIR`). Starts
#: ``stat``, ``base64``, ``ln``, ``chmod``, ``mv``, ``rm`` (plus ``mkdir`` for missing
#: directories or registry).
INLINE_SKILLS_WRITE_SCRIPT = (
    f"command -v base64 >/dev/null 2>&1 || exit {MISSING_TOOL_EXIT}; umask 022; "
    + _NO + _OP_ID + "t=$1; " + _ROOT_CHECK + "rc; " + _ROOT_REGISTER
    + _put(_BASE64_FILL, _ROOT_MODE)
)

#: Exit status of the read and stat probes when a directory on the way to the path is
#: closed to the user: it names that directory on standard error.
NO_ENTRY_EXIT = 5
#: Shell function ``gone PATH`` for a path that does not seem to exist: exit 3 when it is
#: missing, or :data:`NO_ENTRY_EXIT` when the nearest ancestor that exists is a directory
#: the user may not enter (so the path may well exist: "permission denied", not "missing").
NOT_THERE = (
    'gone() { p=$1; while [ ! -e "$p" ] && [ ! -L "$p" ]; do p=$(dirname -- "$p"); done; '
    f'if [ -d "$p" ] && [ ! -x "$p" ]; then echo "$p" >&2; exit {NO_ENTRY_EXIT}; fi; '
    "exit 3; }; "
)

#: As the sandbox user: :data:`READ_SCRIPT`, except that a regular file larger than ``$3``
#: bytes (when ``$2`` is larger too) exits :data:`LARGE_READ_EXIT` instead of printing, a
#: path behind a directory the user may not enter exits :data:`NO_ENTRY_EXIT` (see
#: :data:`NOT_THERE`), and ``head`` runs as a child (not ``exec``), so the marked shell stays
#: its parent. A FIFO, a device or a socket exits :data:`NOT_REGULAR_EXIT` at once (what it
#: is on standard error), never opened: ``head`` could block on it or never end.
READ_PROBE_SCRIPT = (
    NOT_THERE + _KIND + 'if [ ! -e "$1" ]; then gone "$1"; fi; if [ -d "$1" ]; then exit 4; fi; '
    'if [ ! -f "$1" ]; then ty "$1"; echo "$0: cannot read $1: it is $k, not a regular file" '
    f'>&2; exit {NOT_REGULAR_EXIT}; fi; '
    'if [ "$2" -gt "$3" ]; then s=$(stat -L -c %s -- "$1" 2>/dev/null) && '
    f'[ "$s" -gt "$3" ] && exit {LARGE_READ_EXIT}; fi; '
    'head -c "$2" -- "$1"'
)

#: As the sandbox user: :data:`STAT_SCRIPT`, except that a path behind a directory the user
#: may not enter exits :data:`NO_ENTRY_EXIT` (see :data:`NOT_THERE`) instead of 3.
STAT_PROBE_SCRIPT = NOT_THERE + STAT_SCRIPT.replace(
    'if [ ! -e "$1" ]; then exit 3; fi; ', 'if [ ! -e "$1" ]; then gone "$1"; fi; ', 1
)

#: Exit status of :data:`LIST_SCRIPT` and :data:`PACK_SCRIPT` for a directory the user may
#: not read (or enter); its path is on standard error.
CLOSED_DIR_EXIT = 7
#: Exit status of :data:`LIST_SCRIPT` for a path that is not a directory.
NOT_DIR_EXIT = 8

#: As the sandbox user, without ``python3`` (the file agent's ``list``): the entries below
#: directory ``$1`` (a symbolic link to one is followed, the entries' own links never),
#: ``$2`` levels down, one record each on standard output — ``TYPE SIZE MODE MTIME
#: DEPTH``, NUL, the path, NUL, the link's target (empty unless a link), NUL; ``TYPE`` is
#: GNU find's ``%y`` letter, ``MODE`` octal. A directory below that the user may not read
#: is listed, not entered (find says so on standard error). Exit 3: missing;
#: :data:`NO_ENTRY_EXIT`; :data:`NOT_DIR_EXIT`; :data:`CLOSED_DIR_EXIT`.
LIST_SCRIPT = (
    NOT_THERE + 'if [ ! -e "$1" ]; then gone "$1"; fi; '
    f'if [ ! -d "$1" ]; then exit {NOT_DIR_EXIT}; fi; '
    f'if [ ! -r "$1" ] || [ ! -x "$1" ]; then exit {CLOSED_DIR_EXIT}; fi; '
    'exec find -H "$1" -mindepth 1 -maxdepth "$2" -printf "%y %s %m %T@ %d\\0%p\\0%l\\0"'
)


def list_args(path: str, depth: int) -> List[str]:
    """The args for cmd ``/bin/sh`` (as ``sandbox``) that run :data:`LIST_SCRIPT`."""
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 64:
        raise InvalidArgument("depth must be an int from 1 to 64")
    return ["-c", LIST_SCRIPT, "capybara-list", path, str(depth)]


#: As the sandbox user, without ``python3`` (the file agent's ``pack``, with GNU ``tar``):
#: writes one line of JSON (``{"total": bytes, "files": count, "single": bool}``), then a
#: POSIX tar stream of ``$1`` — a directory's contents, names relative to it, or one file
#: (or symbolic link) by its own name — leaving out what matches an ``fnmatch`` pattern of
#: ``$2...`` by its relative path or its name. Links are kept as links, anything but files,
#: directories and links is left out; what the user may not read is reported on standard
#: error (``find:``/``tar:`` lines) and skipped (exit 2, as tar's). Exit 3: missing;
#: :data:`NO_ENTRY_EXIT`; :data:`CLOSED_DIR_EXIT`; :data:`NOT_REGULAR_EXIT`: neither a
#: file, a directory nor a link (what it is on standard error); :data:`MISSING_TOOL_EXIT`:
#: no ``tar``.
PACK_SCRIPT = (
    NOT_THERE + _KIND + 's=$1; shift; '
    f'command -v tar >/dev/null 2>&1 || exit {MISSING_TOOL_EXIT}; '
    'if [ ! -e "$s" ] && [ ! -L "$s" ]; then gone "$s"; fi; '
    'if [ -d "$s" ] && [ ! -L "$s" ]; then '
    f'[ -r "$s" ] && [ -x "$s" ] && cd -- "$s" 2>/dev/null || exit {CLOSED_DIR_EXIT}; '
    'n=$#; for x in "$@"; do set -- "$@" -o -path "./$x" -o -name "$x"; done; shift "$n"; '
    'if [ $# -gt 0 ]; then shift; set -- "(" "$@" ")" -prune -o; fi; '
    "t=$(find . -mindepth 1 \"$@\" -printf '%y %s\\n' | "
    "awk '$1 == \"f\" { n++; b += $2 } END { printf \"%d %d\", b, n }'); "
    'printf \'{"total": %s, "files": %s, "single": false}\\n\' "${t% *}" "${t#* }"; '
    "find . -mindepth 1 \"$@\" \\( -type f -o -type d -o -type l \\) -printf '%P\\0' | "
    "tar --null --no-recursion -T - -c -f - -b 2048 --format=pax; exit $?; fi; "
    'if [ -f "$s" ] || [ -L "$s" ]; then z=0; [ -L "$s" ] || z=$(stat -c %s -- "$s") || exit 1; '
    'printf \'{"total": %s, "files": 1, "single": true}\\n\' "$z"; '
    'q=${s%/*}; cd -- "${q:-/}" || exit 1; '
    'exec tar -c -f - -b 2048 --format=pax -- "${s##*/}"; fi; '
    f'ty "$s"; echo "$s is $k" >&2; exit {NOT_REGULAR_EXIT}'
)


def pack_args(path: str, exclude: Sequence[str]) -> List[str]:
    """The args for cmd ``/bin/sh`` (as ``sandbox``) that run :data:`PACK_SCRIPT`."""
    return ["-c", PACK_SCRIPT, "capybara-pack", path, *exclude]


#: The fast read's holder (Python, run as root). A forked child drops to user ``argv[2]``
#: for good (its groups, gid, uid), opens ``argv[1]`` and passes the descriptor back over a
#: socket pair (SCM_RIGHTS), then exits; the holder itself never changes its credentials,
#: so it stays a plain root process (the sandbox user can neither signal nor trace it, and
#: root needs no extra capability to open ``/proc/<pid>/fd``). For a regular file larger
#: than ``argv[4]`` it prints ``hold <pid> <fd> <size>`` and waits (at most ``argv[3]``
#: seconds, an interval timer) while envd serves ``/proc/<pid>/fd/<fd>``. Exit 3: missing;
#: 4: a directory; 11: no longer a large regular file (read it the ordinary way); 1: the
#: user may not open it. It imports only modules built into the interpreter (``_socket``,
#: ``_signal``, no ``array`` or ``stat``), which halves its start-up time.
HOLD_PROGRAM = """\
import errno, os, pwd, sys, _signal, _socket
path, name, bound, large = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
_signal.setitimer(_signal.ITIMER_REAL, bound)
pw = pwd.getpwnam(name)
a, b = _socket.socketpair()
child = os.fork()
if child == 0:
    try:
        a.close()
        os.setgroups(os.getgrouplist(name, pw.pw_gid))
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as e:
            b.sendall(b"E%d" % e.errno)
        else:
            rights = fd.to_bytes(4, sys.byteorder)
            b.sendmsg([b"F"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
    finally:
        os._exit(0)
b.close()
msg, anc, _, _ = a.recvmsg(32, _socket.CMSG_SPACE(4))
os.waitpid(child, 0)
fds = []
for level, typ, data in anc:
    if level == _socket.SOL_SOCKET and typ == _socket.SCM_RIGHTS:
        fds += [int.from_bytes(data[i:i + 4], sys.byteorder) for i in range(0, len(data) - 3, 4)]
if msg[:1] != b"F" or len(fds) != 1:
    err = int(msg[1:]) if msg[:1] == b"E" and msg[1:].isdigit() else errno.EIO
    sys.stderr.write("cannot open %s: %s\\n" % (path, os.strerror(err)))
    sys.exit(3 if err in (errno.ENOENT, errno.ENOTDIR) else 1)
fd = fds[0]
st = os.fstat(fd)
kind = st.st_mode & 0o170000
if kind == 0o040000:
    sys.exit(4)
if kind != 0o100000 or st.st_size <= large:
    sys.exit(11)
sys.stdout.write("hold %d %d %d\\n" % (os.getpid(), fd, st.st_size))
sys.stdout.flush()
while True:
    _signal.pause()
"""

#: As root: runs :data:`HOLD_PROGRAM` with the first ``python3`` found (exit
#: :data:`MISSING_TOOL_EXIT` when there is none); ``exec`` keeps the pid envd knows.
HOLD_SCRIPT = (
    "for p in /usr/bin/python3 /usr/local/bin/python3 /bin/python3; do "
    f'if [ -x "$p" ]; then export {PROGRAM_VAR}="$0"; '
    f'exec "$p" -I -S -c {shlex.quote(PYTHON_BOOT)} "$@"; fi; done; '
    f"exit {MISSING_TOOL_EXIT}"
)

#: Shell snippet for a FIFO ``$f`` open on standard input: asks for a 1 MiB pipe buffer
#: (``F_SETPIPE_SZ``, Linux), so a large write crosses it in big steps instead of 64 KiB
#: ones, and removes its name (the pipe lives on). One ``perl`` in taint mode (so
#: ``PERL5OPT``/``PERL5LIB`` are ignored); without it ``rm`` removes the name and the pipe
#: keeps its size.
BIG_PIPE = (
    "{ perl -T -e 'fcntl(STDIN, 1031, 1048576); $ARGV[0] =~ /^(.+)$/s; unlink($1) or exit 1' "
    '-- "$f" 2>/dev/null || rm -f -- "$f"; }'
)

#: Shell text, as root, for the FIFO ``$f`` in the staging directory: makes it (0600; exit
#: 90 if it cannot be), says ``ready``, waits until envd opens it for an upload (a SIGTERM
#: meanwhile, or a failed open, removes it and exits 143), says ``open``, and leaves it on
#: standard input with its name removed (see :data:`BIG_PIPE`).
_FIFO_OPEN = (
    "trap 'rm -f -- \"$f\"; exit 143' HUP INT TERM; "
    'mkfifo -m 0600 -- "$f" || exit 90; echo ready; '
    # "command": a failed redirection of a plain exec would end the shell before the trap
    '{ command exec 3< "$f" 0<&3; } 2>/dev/null || { rm -f -- "$f"; exit 143; }; echo open; '
    + BIG_PIPE + " <&3 & exec 3<&-; trap - HUP INT TERM; "
)

#: As root: receives a large write through a FIFO. Makes the staging directory root-only
#: (0700, owned by root; a symlink is refused) and sweeps stale leftovers of operations
#: that were killed — when ``$4`` is 1 (the provider's first large write to the sandbox),
#: or when the directory is missing, a symlink or not root's — then creates the FIFO
#: ``$2`` (0600) in it, says ``ready``, and writes what arrives through the FIFO to ``$1``
#: as :data:`INLINE_USER_WRITE_SCRIPT` does (as ``sandbox``, ``$3`` = 0) or as
#: :data:`INLINE_SKILLS_WRITE_SCRIPT` does (as root, ``$3`` = 1; a refused path exits
#: :data:`REFUSED_EXIT` before ``ready``): envd's ``POST /files`` into the FIFO streams
#: straight into a temporary file beside the target, renamed over it only once exactly
#: ``$5`` bytes arrived (a cut or cancelled upload leaves the target as it was). Once envd
#: has opened the FIFO the script says ``open`` (from then on no other ``POST`` can reach
#: it) and the FIFO's name is removed (the pipe lives on); a script stopped by SIGTERM
#: before that (``timeout``'s first signal) removes it itself. The user's part replaces the
#: script (``exec``):
#: the top process, ``timeout``, still carries the operation's marked name (and so does
#: the user's shell, whose ``$0`` it is), so the clean-up finds all of it.
STREAM_WRITE_SCRIPT = (
    "d=" + UPLOAD_DIR + "; f=$2; " + _NO + _OP_ID
    + 'if [ "$4" = 1 ] || [ ! -d "$d" ] || [ -L "$d" ] || [ ! -O "$d" ]; then '
    'mkdir -p -- "$d" && [ ! -L "$d" ] && chown 0:0 -- "$d" && chmod 0700 -- "$d" || exit 90; '
    'find "$d" -mindepth 1 -maxdepth 1 ! -name parts -mmin +10 -exec rm -rf -- {} + '
    "2>/dev/null; fi; "
    'if [ "$3" = 1 ]; then umask 022; t=$1; ' + _ROOT_CHECK + "rc; fi; "
    + _FIFO_OPEN +
    'if [ "$3" = 1 ]; then ' + _ROOT_REGISTER + _put("cat", _ROOT_MODE, "$5") + "; fi; "
    "exec runuser -u " + SANDBOX_USER + " -- /bin/sh -c "
    + shlex.quote(
        _NO + _KIND + _OP_ID + _USER_TARGET + _USER_REGISTER + _put("cat", _USER_MODE, "$2")
    )
    + ' "$0" "$1" "$5"'
)

#: As root: stops file operation ``$1`` (the process whose command line carries
#: :data:`FILEOP_MARKER` ``$1``, and all its descendants: each is stopped before its
#: children are listed, so none can fork away, then all are killed; an empty ``$1`` means
#: every file operation and every file agent, whoever started them) and removes its FIFO
#: ``$2`` if given, after opening it once so
#: that a ``POST /files`` blocked on it fails instead of hanging. With ``$3`` = 1 (an upload
#: may still be on its way to envd, which would create a regular file if the name were
#: gone when it opens it) the FIFO is held open for half a second before its name is
#: removed: a late ``POST`` opens it meanwhile, then fails when it is closed (envd opens the
#: path as soon as a request's head arrives; this covers a cut request whose head came
#: just before the clean-up). Then removes the operation's temporary files: every
#: entry ``<pid>-$1<hex>`` of every registry (``/tmp/.capybara-parts-*``,
#: :data:`ROOT_PARTS_DIR`; one that is a symbolic link is skipped; a tree upload's
#: extractor adds a counter to the id, one name per directory) and the file it names (a
#: whole-tree upload's directory, with what is in it) — only if that file's name is
#: exactly ``.capybara-part-<the entry's name>`` (``rm`` removes a symbolic link, never what
#: it points to, and never follows one inside a directory it removes). With no ``$1``
#: (after every file operation was killed): every entry whose writer is no longer alive
#: (or was just killed) and its file the same way, and every FIFO, file and empty
#: directory in the staging directory (but its ``parts``), and every commit mark. Exit 0.
#:
#: With ``$4`` = 1 or 2 (a write being withdrawn), before anything else: makes the
#: operation's commit mark (:data:`COMMIT_PREFIX`) exclusively, holding ``w``, and says
#: ``claim withdrawn`` (also when an earlier withdrawal made it): the write's rename can no
#: longer happen; or, when the write made it first (empty),
#: lets the write end on its own (two seconds at most: its rename is under way) and says
#: ``claim committing``, then, once the rest is done, ``part 1`` if the write's temporary
#: file was still there (killed before its rename) or ``part 0``. A mark this clean-up made
#: is removed at its end with ``$4`` = 1 (the write's process had started and is gone now)
#: and kept with ``$4`` = 2 (its start may still be on its way: the mark stops it), saying
#: ``kept 1``: the caller removes it (:func:`commit_unmark_args`) once the write's process
#: is known to have ended; marks left so are removed after ten minutes, or by a clean-up of
#: every operation.
FILEOP_CLEANUP_SCRIPT = (
    't() { kill -STOP "$1" 2>/dev/null; echo "$1"; for c in $(pgrep -P "$1"); do t "$c"; '
    'done; }; al() { x=; { read -r x < "/proc/$1/stat"; } 2>/dev/null || return 1; '
    'x=${x##*") "}; case $x in [ZX]*) return 1;; esac; }; '
    'm=capybara-file; u=${1:-[0-9a-f]}; f=$2; q=; v=; k=0; cm=' + COMMIT_PREFIX + '$1; cl=${4:-0}; '
    'if [ -n "$1" ] && [ "$cl" != 0 ]; then '
    'if { set -C; command echo w > "$cm"; } 2>/dev/null || [ -s "$cm" ]; then v=withdrawn; '
    'else v=committing; i=0; '
    'while [ $i -lt 40 ] && pgrep -f -- "${m}op-$1" >/dev/null; do sleep 0.05; i=$((i+1)); '
    'done; fi; set +C; echo "claim $v"; fi; '
    'for p in $(pgrep -f -- "${m}op-$u"); do q="$q $(t "$p")"; done; '
    'if [ -z "$1" ]; then for p in $(pgrep -f -- "${m}s-[0-9a-f]{32}\\$"); do '
    'q="$q $(t "$p")"; done; fi; z=; '
    'for p in $q; do kill -9 "$p" 2>/dev/null; z="$z $p"; done; '
    'if [ -n "$f" ]; then if [ -p "$f" ]; then exec 3<>"$f"; '
    '[ "$3" != 1 ] || sleep 0.5; fi; rm -f -- "$f"; exec 3>&-; fi; '
    "o=$1; set --; for r in " + USER_PARTS_PREFIX + "* " + ROOT_PARTS_DIR + "; do "
    '[ -d "$r" ] && [ ! -L "$r" ] || continue; '
    'for e in "$r"/[0-9]*-${o:-[0-9a-f]}*; do [ -L "$e" ] || continue; n=${e##*/}; '
    "w=${n%%-*}; case $w in *[!0-9]*) continue;; esac; "
    'case ${n#*-} in ""|*[!0-9a-f]*) continue;; esac; if [ -z "$o" ]; then '
    'case "$z " in *" $w "*) ;; *) al "$w" && continue;; esac; fi; l=$(readlink -- "$e"); '
    'case $l in /*) [ "${l##*/}" != "' + PART_PREFIX + '$n" ] || { [ ! -e "$l" ] || k=1; '
    'set -- "$@" "$l"; };; esac; '
    'set -- "$@" "$e"; done; done; [ $# -eq 0 ] || rm -rf -- "$@" 2>/dev/null; '
    'if [ -z "$o" ]; then find ' + UPLOAD_DIR + " -mindepth 1 -maxdepth 1 ! -name parts "
    "\\( ! -type d -o -empty \\) -delete 2>/dev/null; rm -f -- " + COMMIT_PREFIX + "*; fi; "
    'if [ -n "$v" ]; then echo "part $k"; '
    'if [ "$v$cl" = withdrawn2 ]; then echo "kept 1"; else rm -f -- "$cm"; fi; fi; '
    'if [ "$cl" = 2 ]; then find /tmp -maxdepth 1 -name "' + COMMIT_PREFIX[5:] + '*" '
    "-mmin +10 -delete 2>/dev/null; fi; exit 0"
)


#: As the sandbox user: retires a file agent that did not answer (stopped, hung) or whose
#: start was given up: kills process ``$1`` if its command line still carries the agent's
#: name ``$2`` (so a reused pid is never hit; ``$1`` 0: the pid is not known, and the
#: process whose command line carries the name is found, retirements aside), waits (about a
#: second at most) until it is gone, then removes the temporary files it registered (each
#: entry ``<pid>-<hex>`` of the user's registry and the file it names, only if that file's
#: name is exactly ``.capybara-part-<entry>``). Exit 0.
AGENT_RETIRE_SCRIPT = (
    'p=$1; [ "$p" != 0 ] || for d in /proc/[0-9]*; do q=${d#/proc/}; [ "$q" != $$ ] && grep -qF '
    '-- "$2" "$d/cmdline" 2>/dev/null && ! grep -qF capybara-retire "$d/cmdline" && p=$q; done; '
    'if grep -qF -- "$2" "/proc/$p/cmdline" 2>/dev/null; then kill -9 "$p" 2>/dev/null; '
    'i=0; while [ -e "/proc/$p" ] && [ $i -lt 100 ]; do sleep 0.01; i=$((i+1)); done; fi; '
    'u=$USER; case $u in ""|[.-]*|*[!A-Za-z0-9._-]*) u=$(id -u);; esac; '
    "r=" + USER_PARTS_PREFIX + '$u; [ -d "$r" ] && [ ! -L "$r" ] && [ -O "$r" ] || exit 0; '
    'for e in "$r/$p"-*; do [ -L "$e" ] || continue; n=${e##*/}; l=$(readlink -- "$e"); '
    'case $l in /*) [ "${l##*/}" != "' + PART_PREFIX + '$n" ] || rm -f -- "$l";; esac; '
    'rm -f -- "$e"; done; exit 0'
)


def agent_retire_args(pid: int, name: str) -> List[str]:
    """The args for cmd ``/bin/sh`` (as the sandbox user) that retire the file agent
    ``pid`` named ``name`` (see :data:`AGENT_RETIRE_SCRIPT`); ``pid`` 0: the agent's pid is
    not known (its start was given up before envd said it), it is found by its name."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0 or pid == 1:
        raise InvalidArgument("pid must be 0 or an int above 1")
    if re.fullmatch(r"[A-Za-z0-9_-]{8,80}", name) is None:
        raise InvalidArgument("not a file agent's name")
    return ["-c", AGENT_RETIRE_SCRIPT, "capybara-retire", str(pid), name]


def fileop_name(op_id: str) -> str:
    """The marked ``$0`` of file operation ``op_id`` (32 hex digits)."""
    if re.fullmatch(r"[0-9a-f]{32}", op_id) is None:
        raise InvalidArgument("a file operation id is 32 hex digits")
    return FILEOP_MARKER + op_id


def inline_write_args(path: str, data: bytes, skills: bool) -> List[str]:
    """The args for cmd ``/bin/sh`` that write ``data`` (at most :data:`INLINE_WRITE_MAX`
    bytes, base64 in the request) to ``path``; run as ``sandbox``, or as root if ``skills``.

    Its ``$0`` (``capybara-write``) is to be replaced by the operation's marked name
    (:func:`fileop_name`): the temporary file and its registry entry carry that id, so the
    clean-up of the operation finds them. Exit 1: refused or failed (the reason on standard
    error); :data:`REFUSED_EXIT`: a root write refused because of its path;
    :data:`MISSING_TOOL_EXIT`: no ``base64``.
    """
    if len(data) > INLINE_WRITE_MAX:
        raise InvalidArgument(f"inline writes carry at most {INLINE_WRITE_MAX} bytes")
    script = INLINE_SKILLS_WRITE_SCRIPT if skills else INLINE_USER_WRITE_SCRIPT
    return ["-c", script, "capybara-write", path, base64.b64encode(data).decode("ascii")]


def read_probe_args(path: str, want: int, large: int) -> List[str]:
    """The args for cmd ``/bin/sh`` (as ``sandbox``) that print the first ``want`` bytes of
    ``path``, or exit :data:`LARGE_READ_EXIT` for a regular file larger than ``large`` (3:
    missing; 4: a directory; :data:`NO_ENTRY_EXIT`; :data:`NOT_REGULAR_EXIT`: a FIFO, a
    device or a socket)."""
    if isinstance(want, bool) or not isinstance(want, int) or want < 0:
        raise InvalidArgument("want must be a non-negative integer")
    return ["-c", READ_PROBE_SCRIPT, "capybara-read", path, str(want), str(large)]


def stat_probe_args(path: str) -> List[str]:
    """The args for cmd ``/bin/sh`` (as ``sandbox``) that run :data:`STAT_PROBE_SCRIPT`."""
    return ["-c", STAT_PROBE_SCRIPT, "capybara-stat", path]


def hold_args(path: str, user: str, bound: float, large: int, op_id: str) -> List[str]:
    """The args for cmd ``/bin/sh`` (as root) that run :data:`HOLD_PROGRAM` (its command
    line ends with the operation's marked name)."""
    return ["-c", HOLD_SCRIPT, HOLD_PROGRAM, path, user, f"{bound:g}", str(large),
            fileop_name(op_id)]


def stream_write_args(
    path: str, fifo: str, skills: bool, op_id: str, prepare: bool = True, *, size: int
) -> List[str]:
    """The args for cmd ``/bin/sh`` (as root) that run :data:`STREAM_WRITE_SCRIPT`
    (``prepare``: make the staging directory root-only and sweep it first in any case;
    ``size``: the bytes the upload carries, all of which must arrive).

    Raises:
        InvalidArgument: ``size`` is not a non-negative integer.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidArgument("size must be a non-negative integer")
    return ["-c", STREAM_WRITE_SCRIPT, fileop_name(op_id), path, fifo,
            "1" if skills else "0", "1" if prepare else "0", str(size)]


def fileop_cleanup_args(
    op_id: str, fifo: str = "", settle: bool = False, claim: int = 0
) -> List[str]:
    """The args for cmd ``/bin/sh`` (as root) that stop file operation ``op_id`` (all of
    them for ``""``), remove its FIFO (``settle``: an upload may still be on its way, so the
    FIFO is held open a moment first) and its registered temporary files (for ``""``: those
    of every writer no longer alive, and every FIFO, file and empty directory staged); see
    :data:`FILEOP_CLEANUP_SCRIPT`. ``claim`` (a write's, with ``op_id``): 1 to withdraw
    its rename first, 2 likewise while its process may not have started yet."""
    if op_id:
        fileop_name(op_id)  # checks it
    if claim not in (0, 1, 2) or (claim and not op_id):
        raise InvalidArgument("claim is 0, 1 or 2, and needs an operation id")
    return ["-c", FILEOP_CLEANUP_SCRIPT, "capybara-cleanup", op_id, fifo,
            "1" if settle else "0", str(claim)]


def commit_unmark_args(op_id: str) -> List[str]:
    """The args for cmd ``/bin/sh`` (as root) that remove the commit mark of write
    ``op_id`` (kept by a withdrawal while the write's start was on its way)."""
    fileop_name(op_id)  # checks it
    return ["-c", 'rm -f -- "$1"', "capybara-unmark", COMMIT_PREFIX + op_id]


# ---- the provider's own kill scripts (not the reference's) ---------------------------------
#
# The reference finds an exec's processes through its pid file, its session and process
# groups, and its wrapper's command line; a process that calls ``setsid`` (or is
# double-forked away) leaves all three. Every exec's processes also inherit
# :data:`EXEC_MARKER` (set in the environment envd starts the wrapper with), and the scripts
# below kill by it too, after everything the reference's scripts do.

#: The environment variable every process of an exec inherits; its value is the exec's
#: control path. ``/proc/<pid>/environ`` is the environment a process was started with, so
#: a process that leaves the exec's session keeps it; one started with an emptied
#: environment (``env -i``) is found only by the reference's means.
EXEC_MARKER = "CAPYBARA_EXEC"
#: Control paths one :data:`KILL_BATCH_SCRIPT` takes at most.
KILL_BATCH_MAX = 256

#: Shell function ``z GREP-ARGS...``: kills every process whose environment holds an entry
#: that ``grep -z GREP-ARGS`` matches. One scan of ``/proc/*/environ`` lists them (only
#: processes of the script's own user are readable, the only ones it may signal); they are
#: stopped, checked again, and only those that still match are killed: a pid reused between
#: the scan and the stop is continued (before any kill), never killed. (A process sharing a
#: process group with killed ones may still get the SIGHUP the kernel sends a group orphaned
#: while a member is stopped; only a process of the exec's own tree can share its groups.)
#: Up to five rounds catch children forked while a round ran (a stopped process forks no
#: more).
MARKED_KILL = (
    'z() { n=0; while [ $n -lt 5 ]; do n=$((n+1)); l=; '
    'for f in $(grep -lsz "$@" /proc/[0-9]*/environ); do f=${f#/proc/}; l="$l ${f%/environ}"; '
    'done; [ -n "$l" ] || return 0; kill -STOP $l 2>/dev/null; v=; '
    'for f in $(grep -lsz "$@" $(for p in $l; do echo "/proc/$p/environ"; done)); do '
    'f=${f#/proc/}; v="$v ${f%/environ}"; done; '
    'for p in $l; do case "$v " in *" $p "*) ;; *) kill -CONT "$p" 2>/dev/null;; esac; done; '
    'if [ -n "$v" ]; then kill -9 $v 2>/dev/null; fi; done; }; '
)

#: Kills the execs whose control paths are ``$@`` (at most :data:`KILL_BATCH_MAX`), as
#: :data:`KILL_SCRIPT` does for one, in one process: marks them all killed (a wrapper not yet
#: started refuses to; each mark opened read-write, so a FIFO the sandbox user put there does
#: not stop the kill), waits up to ~1 s in all for their pid files, kills each tree, sweeps
#: their wrappers (one ``pgrep`` for all), then kills every process carrying one of their
#: markers. The trees are killed as :data:`KILL_TREE` kills one — the process groups of the
#: wrapper's children, the wrapper's own group, its whole session (as the groups of its
#: members) — from one ``ps`` listing for all wrappers, not two scans of ``/proc`` per
#: wrapper; and a pid from a pid file counts only while its command line is still that
#: exec's wrapper (a pid file left over from before a reboot may name another process now).
#: Exit 0.
KILL_BATCH_SCRIPT = (
    KILL_TREE
    + MARKED_KILL
    + 'for c in "$@"; do : <> "$c.kill" 2>/dev/null; done; i=0; while [ $i -lt 20 ]; do w=; '
    'for c in "$@"; do [ -s "$c.pid" ] || { w=1; break; }; done; [ -z "$w" ] && break; '
    'sleep 0.05; i=$((i+1)); done; r=; w=; '
    'for c in "$@"; do p=; if [ -s "$c.pid" ]; then { read -r p < "$c.pid"; } 2>/dev/null; fi; '
    'case "$p" in ""|*[!0-9]*|0|1) ;; *) w="$w $p:$c"; rm -f "$c.kill";; esac; r="$r|$c"; '
    'done; if [ -n "$w" ]; then '
    'g=$(ps -ww -e -o pid= -o ppid= -o pgid= -o sid= -o args= | awk -v w="$w" '
    "'BEGIN { n = split(w, a, \" \"); for (i = 1; i <= n; i++) { split(a[i], b, \":\"); "
    'C[b[1]] = "capybara-exec " b[2] " " } } '
    "{ P[NR] = $1; Q[NR] = $2; G[NR] = $3; S[NR] = $4; "
    "if (($1 in C) && index($0, C[$1])) W[$1] = 1 } "
    "END { for (i = 1; i <= NR; i++) { if (((Q[i] in W) || (P[i] in W)) && P[i] > 1) "
    'print "-" P[i]; if ((S[i] in W) && G[i] > 1) print "-" G[i] } }'
    "' | sort -u); "
    'if [ -n "$g" ]; then kill -9 $g 2>/dev/null; fi; fi; '
    'for q in $(pgrep -f -- "capybara-exec (${r#|})( |$)"); do k "$q"; kill -9 "$q" 2>/dev/null; '
    'done; for c in "$@"; do rm -f "$c.pid"; set -- "$@" -e "' + EXEC_MARKER + '=$c"; shift; '
    'done; if [ $# -gt 0 ]; then z -xF "$@"; fi; exit 0'
)

_EXIT_0 = "exit 0"


def _then_marked(script: str, sweep: str) -> str:
    """The reference's kill ``script`` with ``sweep`` (a call of ``z``) run before its exit."""
    body = script[len(KILL_TREE) : -len(_EXIT_0)]
    return KILL_TREE + MARKED_KILL + body + sweep + "; " + _EXIT_0


#: :data:`KILL_ALL_SCRIPT`, then every process carrying any exec's marker is killed too.
KILL_ALL_MARKED_SCRIPT = _then_marked(
    KILL_ALL_SCRIPT, 'z -E -e "^' + EXEC_MARKER + '=/tmp/[.]capybara-exec-"'
)

#: :data:`KILL_TAGGED_SCRIPT`, then every process carrying the marker of an exec started
#: with one of the tags ``$@`` is killed too.
KILL_TAGGED_MARKED_SCRIPT = _then_marked(
    KILL_TAGGED_SCRIPT,
    'for t in "$@"; do set -- "$@" -e "^' + EXEC_MARKER + '=/tmp/[.]capybara-exec-$t-$u\\$"; '
    "shift; done; if [ $# -gt 0 ]; then z -E \"$@\"; fi",
)


def exec_env(env: Mapping[str, str], ctl: str) -> Dict[str, str]:
    """The environment envd starts an exec's wrapper with: ``env`` plus the exec's
    :data:`EXEC_MARKER` (which overrides a caller's value), and a ``LANG`` of
    :data:`HELPER_LANG` in place of the caller's (same place in the mapping), which
    :data:`LEAN_EXEC_WRAPPER` puts back for the command (:func:`exec_args` passes it)."""
    out = dict(env)
    if "LANG" in out:
        out["LANG"] = HELPER_LANG
    out[EXEC_MARKER] = ctl
    return out


def kill_batch_args(ctls: Sequence[str]) -> List[str]:
    """The args for cmd ``/bin/sh`` that kill the execs with control paths ``ctls``.

    Raises:
        InvalidArgument: more than :data:`KILL_BATCH_MAX` paths, or one that is not a
            control path from :func:`control_path`.
    """
    if len(ctls) > KILL_BATCH_MAX:
        raise InvalidArgument(f"one kill batch takes at most {KILL_BATCH_MAX} control paths")
    for ctl in ctls:
        if _CONTROL_RE.fullmatch(ctl) is None:
            raise InvalidArgument("not an exec control path")
    return ["-c", KILL_BATCH_SCRIPT, "capybara-killbatch", *ctls]


def is_control_path(value: str) -> bool:
    """Whether ``value`` is a control path :func:`control_path` makes."""
    return _CONTROL_RE.fullmatch(value) is not None


_CONTROL_RE = re.compile(
    re.escape(CONTROL_PREFIX)
    + r"(?:[A-Za-z0-9_-]{1,64}-)?[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}"
)


# ---- tree uploads (the provider's own) ----------------------------------------------------

#: As the sandbox user, for a tree upload into a destination that exists, without
#: ``python3``: ``$1`` is the destination, then the paths (``./rel``) of what was extracted
#: in the current directory, parents first. Each directory is made in the destination if
#: missing (with the extracted one's mode), each file or link renamed over its place there
#: (so each is replaced whole); what cannot take its place is named on a line ``E rel``.
TREE_MERGE_SCRIPT = (
    'd=$1; shift; for x; do r=${x#./}; if [ -d "$x" ] && [ ! -L "$x" ]; then '
    '[ -d "$d/$r" ] || { mkdir -- "$d/$r" && chmod --reference="$x" -- "$d/$r"; } '
    "|| printf 'E %s\\n' \"$r\"; elif ! mv -f -T -- \"$x\" \"$d/$r\"; then "
    "printf 'E %s\\n' \"$r\"; fi; done"
)

#: As the sandbox user, for a tree upload to ``$1``: GNU ``tar`` extracts the stream into a
#: new directory ``.capybara-part-<pid>-<op id>`` beside the destination (registered as a
#: temporary file is, see :data:`INLINE_USER_WRITE_SCRIPT`), and only when the stream's end
#: marker ``$2`` arrived is the marker removed and the directory renamed to ``$1``: the
#: whole tree appears at once, or not at all (the traps remove the directory on any
#: failure). Prints ``{"complete": ..., "whole": true}``; the caller knows what it sent.
#: Into a destination that exists, the file agent's ``extract`` (``-c "$3"``,
#: :data:`PYTHON_BOOT`) writes each file atomically into what is there; without ``python3``,
#: the tree is
#: extracted the same way into a new directory inside it (its parent may be closed to the
#: user, as ``/`` is to ``/workspace``) and then merged into it by
#: :data:`TREE_MERGE_SCRIPT` (``{"complete": true, "merged": true}`` after the ``E``
#: lines). ``tar`` reads 1 MiB records (``-b 2048``; a pipe's short reads are fine): fewer,
#: larger reads let the writer fill the FIFO in large pieces (2,000 files / 50 MiB:
#: 0.29-0.34 s -> 0.24-0.26 s).
TREE_WHOLE_SCRIPT = (
    'd=$1; o=${0##*-}; case $o in ""|*[!0-9a-f]*) o=0;; esac; m=; '
    'if [ -e "$d" ] || [ -L "$d" ]; then '
    'if command -v python3 >/dev/null 2>&1 || ! command -v tar >/dev/null 2>&1; then '
    'exec python3 -I -S -X utf8 -c "$3" extract "$d" "$2" "$4"; fi; '
    '[ -d "$d" ] || { echo "cannot upload into $d: it is not a directory" >&2; exit 1; }; m=1; '
    'elif ! command -v tar >/dev/null 2>&1; then '
    'exec python3 -I -S -X utf8 -c "$3" extract "$d" "$2" "$4"; fi; '
    'if [ -n "$m" ]; then q=$d; else q=${d%/*}; q=${q:-/}; fi; '
    '[ -d "$q" ] || mkdir -p -- "$q" || exit 1; '
    'u=$USER; case $u in ""|[.-]*|*[!A-Za-z0-9._-]*) u=$(id -u);; esac; '
    "r=" + USER_PARTS_PREFIX + '$u; p=$q/' + PART_PREFIX + '$$-$o; e=$r/$$-$o; c=; '
    "trap '[ -z \"$c$e\" ] || rm -rf -- ${c:+\"$p\"} ${e:+\"$e\"}' EXIT; "
    "trap 'exit 143' HUP INT TERM; { [ -d \"$r\" ] || mkdir -m 0700 -- \"$r\"; } 2>/dev/null; "
    '[ -d "$r" ] && [ ! -L "$r" ] && [ -O "$r" ] && ln -s -T -- "$p" "$e" 2>/dev/null || e=; '
    'mkdir -- "$p" || exit 1; c=1; '
    'if tar -x -p -b 2048 -f - -C "$p" && [ -f "$p/$2" ] && [ ! -L "$p/$2" ] && rm -f -- "$p/$2"; '
    'then if [ -n "$m" ]; then cd -- "$p" || exit 1; '
    "find . -mindepth 1 -exec /bin/sh -c " + shlex.quote(TREE_MERGE_SCRIPT) + ' sh "$d" {} +; '
    'cd /; echo \'{"complete": true, "merged": true}\'; exit 0; fi; '
    'if mv -T -- "$p" "$d"; then c=; echo \'{"complete": true, "whole": true}\'; exit 0; fi; fi; '
    'echo \'{"complete": false, "whole": true}\'; exit 3'
)

#: As root: receives a tree upload through a FIFO. Prepares the staging directory and the
#: FIFO ``$2`` exactly as :data:`STREAM_WRITE_SCRIPT` does (``$5`` = 1: make it root-only
#: and sweep it in any case), says ``ready`` and ``open``, then writes what arrives: as ``sandbox``
#: (``$4`` = 0) by :data:`TREE_WHOLE_SCRIPT` (a new destination appears whole; into one
#: that exists, the file agent's ``extract`` writes each file atomically), or, under
#: ``/skills`` (``$4`` = 1), as root by ``extract`` with the ``/skills`` rules. ``$1`` is
#: the destination directory, ``$3`` the name of the stream's end marker, ``$6`` the file
#: agent's program text (handed on in :data:`PROGRAM_VAR`). Either prints a JSON summary.
#: Under ``/skills`` without ``python3`` it exits :data:`MISSING_TOOL_EXIT` at once (before
#: ``ready``).
TREE_UPLOAD_SCRIPT = (
    'if [ "$4" = 1 ] && ! command -v python3 >/dev/null 2>&1; then exit '
    + str(MISSING_TOOL_EXIT) + '; fi; '
    "d=" + UPLOAD_DIR + '; f=$2; '
    'if [ "$5" = 1 ] || [ ! -d "$d" ] || [ -L "$d" ] || [ ! -O "$d" ]; then '
    'mkdir -p -- "$d" && [ ! -L "$d" ] && chown 0:0 -- "$d" && chmod 0700 -- "$d" || exit 90; '
    'find "$d" -mindepth 1 -maxdepth 1 ! -name parts -mmin +10 -exec rm -rf -- {} + '
    '2>/dev/null; fi; '
    + _FIFO_OPEN +
    f'o=op=${{0##*-}}; export {PROGRAM_VAR}="$6"; b={shlex.quote(PACKED_BOOT)}; '
    'if [ "$4" = 1 ]; then exec python3 -I -S -X utf8 -c "$b" extract "$1" "$3" root "$o"; fi; '
    "exec runuser -u " + SANDBOX_USER + " -- /bin/sh -c " + shlex.quote(TREE_WHOLE_SCRIPT)
    + ' "$0" "$1" "$3" "$b" "$o"'
)


def tree_upload_args(
    dest: str, fifo: str, end: str, skills: bool, op_id: str, program: str,
    prepare: bool = True,
) -> List[str]:
    """The args for cmd ``/bin/sh`` (as root) that run :data:`TREE_UPLOAD_SCRIPT`."""
    return ["-c", TREE_UPLOAD_SCRIPT, fileop_name(op_id), dest, fifo, end,
            "1" if skills else "0", "1" if prepare else "0", program]
