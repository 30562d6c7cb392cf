"""Frozen value types of the public API and of the wire boundary.

This module owns the data the library hands out and takes in: :class:`SandboxLimits`,
:class:`SandboxHandle`, :class:`SandboxSummary`, :class:`ExecResult`, :class:`FileContent`,
:class:`FileStat`, :class:`FileEvent`, and the
internal :class:`Target` (where and how to reach one sandbox's envd). Values only: no I/O, no
requests, no threads. Secrets (the envd access token) are kept out of ``repr``.
"""

from __future__ import annotations

import datetime
from typing import Iterable, Literal, Optional, Tuple, Union

import attrs

from .errors import register_secret

__all__ = [
    "DirEntry",
    "Egress",
    "ExecResult",
    "FileContent",
    "FileEvent",
    "FileEventType",
    "FileStat",
    "SandboxHandle",
    "SandboxLimits",
    "SandboxRef",
    "SandboxSummary",
    "Target",
    "TransferSummary",
]

Egress = Literal["none", "allowlist", "open"]
#: What happened to a path, as :class:`FileEvent` says it.
FileEventType = Literal["create", "write", "remove", "rename", "chmod", "overflow"]


def _tuple_of_str(value: Iterable[str]) -> Tuple[str, ...]:
    if isinstance(value, str):
        # A bare string would silently become a tuple of characters.
        raise TypeError("allow_hosts must be a sequence of host names, not a string")
    return tuple(value)


@attrs.frozen
class SandboxLimits:
    """What a sandbox may use.

    The sizes are a request, not a setting: E2B sizes every sandbox by its template (a
    create carries no CPU, memory or disk), so the sandbox gets the template's sizes
    whatever is asked here. :meth:`~e2b_provider.E2BSandboxProvider.create` compares each
    size given with what E2B reports for the new sandbox, logs one warning (logger
    ``"e2b_provider"``) for each that differs, and returns a handle carrying the real sizes.
    To get other sizes, build a template with them.

    Attributes:
        cpu: CPUs requested (> 0), or None (default): no request, the template's.
        memory_mb: memory requested in MiB (> 0), or None (default).
        disk_mb: disk requested in MiB (> 0), or None (default).
        egress: ``"none"`` (no network), ``"allowlist"`` (only ``allow_hosts``) or ``"open"``
            (refused unless the deployment sets ``allow_open_egress``).
        allow_hosts: host names, ``*.`` wildcards, IPs or CIDRs for ``"allowlist"``.
        public_traffic: whether the sandbox's ports answer anyone who has their URL (True,
            the default) or only requests carrying the sandbox's traffic token (False;
            see :meth:`~e2b_provider.E2BSandboxProvider.traffic_headers`, which
            :meth:`~e2b_provider.E2BSandboxProvider.forward` adds by itself).
    """

    cpu: Optional[float] = None
    memory_mb: Optional[int] = None
    disk_mb: Optional[int] = None
    egress: Egress = "none"
    allow_hosts: Tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    public_traffic: bool = True


@attrs.frozen
class SandboxHandle:
    """A sandbox created by the provider. Every method also accepts the id string.

    Two handles are equal when their ``id`` and ``name`` are (the sizes are not compared).

    Attributes:
        id: the E2B sandbox id.
        name: the name it was created under, if known.
        cpu_count: the CPUs E2B gave the sandbox (its template's), or None when not known
            (a handle made by hand, or E2B did not say).
        memory_mb: its memory in MiB, or None.
        disk_mb: its disk in MiB, or None.
    """

    id: str
    name: Optional[str] = None
    cpu_count: Optional[int] = attrs.field(default=None, eq=False, kw_only=True)
    memory_mb: Optional[int] = attrs.field(default=None, eq=False, kw_only=True)
    disk_mb: Optional[int] = attrs.field(default=None, eq=False, kw_only=True)

    def __str__(self) -> str:
        return self.id


SandboxRef = Union[SandboxHandle, str]


@attrs.frozen
class SandboxSummary:
    """One sandbox as a listing shows it.

    Attributes:
        id: the E2B sandbox id.
        name: the name it was created under by this library, or None.
        state: ``"running"`` or ``"paused"``.
        started_at: when it was (last) started, as a timezone-aware UTC datetime, or None
            when the server did not say.
        template_id: its template's id ("" when the server did not say).
        cpu_count: its CPUs (the template's), or None when the server did not say.
        memory_mb: its memory in MiB, or None.
        disk_mb: its disk in MiB, or None.
    """

    id: str
    name: Optional[str]
    state: str
    started_at: Optional[datetime.datetime] = None
    template_id: str = ""
    cpu_count: Optional[int] = attrs.field(default=None, kw_only=True)
    memory_mb: Optional[int] = attrs.field(default=None, kw_only=True)
    disk_mb: Optional[int] = attrs.field(default=None, kw_only=True)

    @property
    def handle(self) -> SandboxHandle:
        """A handle for the other calls (with the sizes)."""
        return SandboxHandle(
            self.id, self.name,
            cpu_count=self.cpu_count, memory_mb=self.memory_mb, disk_mb=self.disk_mb,
        )


@attrs.frozen
class ExecResult:
    """The outcome of one command.

    A command that ran to completion has an ``exit_code`` (128 + n when killed by signal n).
    A timed-out command has ``exit_code=None, timed_out=True``; one cancelled by its token
    has ``exit_code=None, cancelled=True``. Output collected so far is kept either way.

    Attributes:
        exit_code: the exit status, or None (timed out, cancelled, or unknown signal).
        stdout: standard output, decoded as UTF-8 (invalid bytes replaced).
        stderr: standard error, likewise.
        truncated: True when stdout + stderr exceeded ``max_output_bytes`` and were cut; a
            UTF-8 sequence cut at the end is then dropped rather than mangled.
        timed_out: True when the timeout fired.
        cancelled: True when the cancel token fired.
        wedged: True when the command could not be stopped cleanly: its kill failed, or ran
            past the kill bound in the sandbox, or its output did not end within the grace
            period after a kill that worked. The sandbox is then rebooted (its processes are
            lost, its files kept), unless the provider was closed meanwhile (logged). False
            when there was no such evidence about the sandbox: also when the kill could not
            be confirmed in time (it still runs) or was never sent (the provider was
            closed); the command is then left to its in-sandbox timeout.
    """

    exit_code: Optional[int]
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    timed_out: bool = False
    cancelled: bool = False
    wedged: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.exit_code == 0


@attrs.frozen
class FileContent:
    """Bytes read from a sandbox file.

    Attributes:
        data: at most ``max_bytes`` bytes from the start of the file.
        truncated: True when the file is longer than what was returned.
    """

    data: bytes
    truncated: bool = False


@attrs.frozen
class FileStat:
    """What ``stat`` reports about a path.

    Attributes:
        size: size in bytes (as ``stat -L`` reports it; directories have their inode size).
        is_dir: True for a directory.
    """

    size: int
    is_dir: bool


@attrs.frozen
class FileEvent:
    """One change a watch saw (see :meth:`~e2b_provider.E2BSandboxProvider.watch`).

    Attributes:
        type: ``"create"`` (made, or moved in: a rename's new name), ``"write"`` (content
            changed), ``"remove"``, ``"rename"`` (moved away: the old name; the new one, if
            still in the watched tree, comes as ``"create"``), ``"chmod"`` (mode, owner or
            times changed), or ``"overflow"``: events were lost (too many came faster than
            they were read, or the sandbox restarted the watch); look at the directory
            again, the watch goes on.
        path: the absolute sandbox path it happened to (the watched directory itself for
            ``"overflow"``, and when the change was to the directory).
    """

    type: FileEventType
    path: str

    def __str__(self) -> str:
        return f"{self.type} {self.path}"


@attrs.frozen
class DirEntry:
    """One entry of a directory listing, as the ``sandbox`` user sees it.

    Attributes:
        name: its name in its directory.
        path: its absolute path.
        type: ``"file"``, ``"dir"``, ``"symlink"`` (the link itself, never followed) or
            ``"other"`` (a FIFO, socket or device).
        size: its size in bytes (a symbolic link's: the length of its target).
        mode: its permission bits (e.g. ``0o644``).
        mtime: when its content last changed, timezone-aware UTC.
        symlink_target: what a symbolic link points to; None for other types.
    """

    name: str
    path: str
    type: str
    size: int
    mode: int
    mtime: datetime.datetime
    symlink_target: Optional[str] = None


@attrs.frozen
class TransferSummary:
    """What an upload or download of a file or tree moved.

    Attributes:
        files: regular files written.
        dirs: directories made (or found).
        symlinks: symbolic links written.
        bytes: bytes of file content written.
    """

    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0


@attrs.frozen
class Target:
    """How to reach one sandbox's envd: base URL, id and access token (hidden from repr),
    and the traffic token its other ports want when its traffic is private (hidden too).

    The token is a known secret (scrubbed from every library error) for as long as a target
    holding it exists.
    """

    url: str
    sandbox_id: str
    access_token: str = attrs.field(repr=False)
    domain: str = ""
    resumed: bool = False
    traffic_token: Optional[str] = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        register_secret(self.access_token, owner=self)
        register_secret(self.traffic_token, owner=self)
