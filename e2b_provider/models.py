"""Frozen value types of the public API and of the wire boundary.

This module owns the data the library hands out and takes in: :class:`SandboxLimits`,
:class:`SandboxHandle`, :class:`SandboxSummary`, :class:`ExecResult`, :class:`FileContent`,
:class:`FileStat`, :class:`FileEvent`, and the
internal :class:`Target` (where and how to reach one sandbox's envd). Values only: no I/O, no
requests, no threads. Secrets (the envd access token) are kept out of ``repr``.

In a notebook or IPython the values display readably (:class:`Displayed`): IPython's pretty
printer breaks a long value over lines, and a command's output is shown as text, its head and
tail, with what was left out said (``repr()`` stays the one-line ``attrs`` repr).
"""

from __future__ import annotations

import datetime
import html
import re
from typing import Any, Iterable, List, Literal, Optional, Tuple, Union, cast

import attrs

from .errors import register_secret

__all__ = [
    "Displayed",
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


#: A command's output in a notebook display: at most this many lines from its start and from
#: its end (the result's own ``stdout``/``stderr`` keep everything).
DISPLAY_HEAD_LINES = 20
DISPLAY_TAIL_LINES = 10
#: A longer line is cut in a display (the rest said in characters).
DISPLAY_LINE_CHARS = 300
#: Control characters other than tab and newline are shown as escapes in a display: the
#: sandbox's output must not drive the viewer's terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(line: str) -> str:
    line = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)
    if len(line) > DISPLAY_LINE_CHARS:
        left = len(line) - DISPLAY_LINE_CHARS
        line = f"{line[:DISPLAY_LINE_CHARS]}… ({left:,} more characters)"
    return line


def _plural(n: int, what: str) -> str:
    return f"{n:,} {what}" if n == 1 else f"{n:,} {what}s"


def _output_lines(name: str, text: str) -> Tuple[str, List[str]]:
    """The heading and the lines a display shows of one output stream."""
    if not text:
        return f"{name}: empty", []
    lines = text.splitlines()
    heading = f"{name}: {_plural(len(lines), 'line')}, {_plural(len(text), 'character')}"
    if not text.endswith(("\n", "\r")):
        heading += ", no newline at the end"
    if len(lines) <= DISPLAY_HEAD_LINES + DISPLAY_TAIL_LINES:
        return heading, [_visible(line) for line in lines]
    hidden = len(lines) - DISPLAY_HEAD_LINES - DISPLAY_TAIL_LINES
    return heading, [
        *(_visible(line) for line in lines[:DISPLAY_HEAD_LINES]),
        f"… {_plural(hidden, 'line')} not shown (.{name} has them all) …",
        *(_visible(line) for line in lines[-DISPLAY_TAIL_LINES:]),
    ]


class Displayed:
    """How the library's values show in IPython and Jupyter.

    ``_repr_pretty_`` (IPython's pretty printer) shows the fields ``repr()`` shows (never a
    field hidden from it, so never a secret), on one line when they fit, else one a line;
    the output fields of a command (``stdout``, ``stderr``) come after, as text: each
    stream's size, its first and last lines (what is left out is said), and a mark when the
    command's output was cut at ``max_output_bytes``. ``_repr_html_`` shows the same for a
    command's output, escaped.
    """

    __slots__ = ()

    #: Fields shown as text blocks, after the others.
    _TEXT_FIELDS: Tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # IPython takes the first class in the MRO that has ``_repr_pretty_`` or its own
        # ``__repr__`` (attrs gives each class one): the display goes in each class itself.
        cls._repr_pretty_ = Displayed._repr_pretty_  # type: ignore[method-assign]

    def _shown_fields(self) -> List[Tuple[str, Any]]:
        """The fields ``repr()`` shows, but the text blocks, and those at their default."""
        shown = []
        for a in attrs.fields(cast(Any, type(self))):
            if a.repr is False or a.name in self._TEXT_FIELDS:
                continue
            value = getattr(self, a.name)
            # (a factory's default is of another type than the value: shown)
            if type(value) is type(a.default) and value == a.default:
                continue
            shown.append((a.name, value))
        return shown

    def _texts(self) -> List[Tuple[str, List[str]]]:
        shown = [_output_lines(name, getattr(self, name)) for name in self._TEXT_FIELDS]
        if self._TEXT_FIELDS and getattr(self, "truncated", False):
            shown.append(("the output was cut at max_output_bytes (truncated=True)", []))
        return shown

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        name = type(self).__name__
        if cycle:
            p.text(f"{name}(...)")
            return
        if self._TEXT_FIELDS:
            # one line, then the text blocks (a forced line break would break a group)
            p.text(self._heading())
            for heading, lines in self._texts():
                p.break_()
                p.text(heading)
                for line in lines:
                    p.break_()
                    p.text(f"  {line}" if line else "")
            return
        with p.group(len(name) + 1, f"{name}(", ")"):
            for i, (field, value) in enumerate(self._shown_fields()):
                if i:
                    p.text(",")
                    p.breakable()
                p.text(f"{field}=")
                if field == "mode" and isinstance(value, int):
                    p.text(oct(value))
                elif isinstance(value, bytes) and len(value) > DISPLAY_LINE_CHARS:
                    p.text(f"{value[:DISPLAY_LINE_CHARS]!r}… ({len(value):,} bytes)")
                else:
                    p.pretty(value)

    def _heading(self) -> str:
        fields = ", ".join(f"{f}={v!r}" for f, v in self._shown_fields())
        return f"{type(self).__name__}({fields})"

    def _repr_html_(self) -> Optional[str]:
        if not self._TEXT_FIELDS:
            return None  # the plain text display
        parts = [f"<div><code>{html.escape(self._heading())}</code>"]
        for heading, lines in self._texts():
            parts.append(f"<div><b>{html.escape(heading)}</b></div>")
            if lines:
                body = html.escape("\n".join(lines))
                parts.append(f'<pre style="margin:0 0 0.5em 1em">{body}</pre>')
        parts.append("</div>")
        return "".join(parts)


def _tuple_of_str(value: Iterable[str]) -> Tuple[str, ...]:
    if isinstance(value, str):
        # A bare string would silently become a tuple of characters.
        raise TypeError("allow_hosts must be a sequence of host names, not a string")
    return tuple(value)


@attrs.frozen
class SandboxLimits(Displayed):
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
class SandboxHandle(Displayed):
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
class SandboxSummary(Displayed):
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
class ExecResult(Displayed):
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

    _TEXT_FIELDS = ("stdout", "stderr")

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
class FileContent(Displayed):
    """Bytes read from a sandbox file.

    Attributes:
        data: at most ``max_bytes`` bytes from the start of the file.
        truncated: True when the file is longer than what was returned.
    """

    data: bytes
    truncated: bool = False


@attrs.frozen
class FileStat(Displayed):
    """What ``stat`` reports about a path.

    Attributes:
        size: size in bytes (as ``stat -L`` reports it; directories have their inode size).
        is_dir: True for a directory.
    """

    size: int
    is_dir: bool


@attrs.frozen
class FileEvent(Displayed):
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
class DirEntry(Displayed):
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
class TransferSummary(Displayed):
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
