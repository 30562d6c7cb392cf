"""Where a running ``e2b-provider emulator`` can be found: its record, and how the other
commands read it.

While it serves, ``e2b-provider emulator`` keeps one record, ``emulator.json``, in a
directory only its user may enter: ``$XDG_RUNTIME_DIR/e2b-provider/`` when that variable
names a directory, else ``/tmp/e2b-provider-<uid>/`` (made mode 0700). The record (mode 0600,
written whole to a temporary file and renamed into place) holds the emulator's pid and the
start time of that process, its URLs, its template and its API key; the emulator removes it
when it stops (its normal end, Ctrl-C, SIGTERM). A record whose process is gone (SIGKILL, a
closed terminal, a reboot) is stale: the reader removes it and goes on as if there were none.

The other commands use the record only when ``E2B_API_KEY`` is unset or empty: a
configuration in the environment always wins, and the record's key is never sent to a URL
from the environment. The library itself never reads it (``DeploymentConfig.from_env`` reads
the environment and nothing else).

The machine may be shared: a directory or record that is not the user's own, is reachable
by others (group or other permission bits) or is a symbolic link is refused with an error
naming the path, never used. The key is never printed. Standard library only, plus the
library's errors.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from typing import Dict, Mapping, Optional

from ..errors import ConfigError

__all__ = [
    "RECORD_NAME",
    "RecordRefused",
    "emulator_settings",
    "read",
    "record_dir",
    "record_path",
    "remove",
    "running_pid",
    "write",
]

RECORD_NAME = "emulator.json"
#: The most a record may hold (a key, two URLs, a template name: far less).
MAX_RECORD_BYTES = 64 * 1024
_FIELDS = ("api_key", "api_url", "sandbox_url", "template")


class RecordRefused(ConfigError):
    """The record (or its directory) is not safe to use: not the user's own, open to others,
    or not a plain file or directory (exit status 2 on the command line)."""


def record_dir(environ: Optional[Mapping[str, str]] = None) -> str:
    """The directory of the record: ``$XDG_RUNTIME_DIR/e2b-provider`` when that variable
    names a directory (an absolute path), else ``/tmp/e2b-provider-<uid>``."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return os.path.join(runtime, "e2b-provider")
    return os.path.join("/tmp", f"e2b-provider-{os.geteuid()}")


def record_path(environ: Optional[Mapping[str, str]] = None) -> str:
    """Where the record is (see :func:`record_dir`)."""
    return os.path.join(record_dir(environ), RECORD_NAME)


def _check_private(path: str, st: os.stat_result, kind: str) -> None:
    """Refuse ``path`` unless it is ours, of ``kind`` (``"directory"`` or ``"file"``), and
    closed to group and others."""
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "directory" else stat.S_ISREG(st.st_mode)
    if not is_kind:
        raise RecordRefused(f"refusing the emulator record at {path}: it is not a {kind} "
                            "(a link or something else); remove it")
    if st.st_uid != os.geteuid():
        raise RecordRefused(f"refusing the emulator record at {path}: it belongs to uid "
                            f"{st.st_uid}, not to you (uid {os.geteuid()}); remove it")
    if st.st_mode & 0o077:
        raise RecordRefused(f"refusing the emulator record at {path}: others may use it "
                            f"(mode {stat.S_IMODE(st.st_mode):04o}, must be "
                            f"{'0700' if kind == 'directory' else '0600'}); remove it")


def private_dir(path: str, *, create: bool) -> bool:
    """Check (and with ``create``, make) the record's directory; False when it is missing."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    _check_private(path, st, "directory")
    return True


def _start_time(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (clock ticks after boot, from ``/proc``), which
    tells it from a later process given the same pid; None when it is gone or unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # the command name (field 2) may hold spaces and ")": the fields after its last ")"
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def write(settings: Mapping[str, str], environ: Optional[Mapping[str, str]] = None) -> str:
    """Record this process as the running emulator with ``settings`` (``api_key``,
    ``api_url``, ``sandbox_url``, ``template``); returns the record's path.

    The record replaces any other one whole (a temporary file renamed into place).

    Raises:
        RecordRefused: the directory is not safe to use.
        OSError: it could not be written.
    """
    directory = record_dir(environ)
    private_dir(directory, create=True)
    pid = os.getpid()
    body = {"pid": pid, "start_time": _start_time(pid),
            **{k: str(settings[k]) for k in _FIELDS}}
    path = os.path.join(directory, RECORD_NAME)
    part = os.path.join(directory, f".{RECORD_NAME}.{pid}.{secrets.token_hex(8)}")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, path)
    except BaseException:
        try:
            os.unlink(part)
        except OSError:
            pass
        raise
    return path


def remove(environ: Optional[Mapping[str, str]] = None, *, pid: Optional[int] = None) -> None:
    """Remove the record if it is this process's (or ``pid``'s); another emulator's record,
    or none, is left as it is."""
    path = record_path(environ)
    try:
        record = _load(path)
    except (ConfigError, OSError):
        return
    if record is not None and record.get("pid") == (os.getpid() if pid is None else pid):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _load(path: str) -> Optional[Dict[str, object]]:
    """The record at ``path`` as it is (checked to be private), or None when there is none."""
    if not private_dir(os.path.dirname(path), create=False):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RecordRefused(f"refusing the emulator record at {path}: it is a symbolic "
                                "link; remove it") from None
        raise
    with os.fdopen(fd, "rb") as f:
        _check_private(path, os.fstat(f.fileno()), "file")
        data = f.read(MAX_RECORD_BYTES + 1)
    try:
        record = json.loads(data) if len(data) <= MAX_RECORD_BYTES else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise RecordRefused(f"the emulator record at {path} is not one this version writes; "
                            "remove it (and start e2b-provider emulator again)")
    return record


def _alive(record: Mapping[str, object]) -> bool:
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: the pid was given to someone else since
    started = record.get("start_time")
    return started is None or started == _start_time(pid)


def running_pid(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """The pid of the emulator whose record is there (and whose process runs), or None."""
    found = read(environ)
    return int(found["pid"]) if found is not None else None


def read(environ: Optional[Mapping[str, str]] = None) -> Optional[Dict[str, str]]:
    """The settings of the running emulator (``api_key``, ``api_url``, ``sandbox_url``,
    ``template``, and its ``pid`` in decimal), or None when none runs. A stale record is
    removed.

    Raises:
        RecordRefused: the record or its directory is not safe to use, or is not a record.
    """
    path = record_path(environ)
    record = _load(path)
    if record is None:
        return None
    if not _alive(record):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return None
    values = {k: record.get(k) for k in _FIELDS}
    if not all(isinstance(v, str) and v for v in values.values()):
        raise RecordRefused(f"the emulator record at {path} is not one this version writes; "
                            "remove it (and start e2b-provider emulator again)")
    return {"pid": str(record["pid"]), **{k: str(v) for k, v in values.items()}}


NOT_CONFIGURED = (
    "no E2B configured: set E2B_API_KEY (and E2B_TEMPLATE) for E2B, or start a local "
    "emulator with 'e2b-provider emulator -d' (or 'e2b-provider emulator' in another "
    "terminal): the other commands find it while it runs"
)


def emulator_settings(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """What ``DeploymentConfig.from_env`` should read when ``E2B_API_KEY`` is unset: the
    environment with the running emulator's key, URLs and (unless ``E2B_TEMPLATE`` is set)
    template.

    Raises:
        ConfigError: no emulator runs (the message names ``E2B_API_KEY`` and
            ``e2b-provider emulator``), or its record is refused.
    """
    env = dict(os.environ if environ is None else environ)
    found = read(env)
    if found is None:
        raise ConfigError(NOT_CONFIGURED, [NOT_CONFIGURED])
    # the key goes only to the emulator's own URLs, never to a URL from the environment
    env.update(E2B_API_KEY=found["api_key"], E2B_API_URL=found["api_url"],
               E2B_SANDBOX_URL=found["sandbox_url"])
    env.pop("E2B_DOMAIN", None)
    if not env.get("E2B_TEMPLATE"):
        env["E2B_TEMPLATE"] = found["template"]
    return env
