"""Background commands' formats, without I/O: ids, supervisor frames, kept output.

This module owns what the library and a background command's supervisor
(:mod:`e2b_provider.sandbox_side.supervisor`, or ``supervisor.sh`` beside it where the
sandbox has no ``python3``: the same record and ready frame) agree on: the command id a
user passes between processes (``<sandbox id>:<32 hex>``), the frames the supervisor writes
on its standard output for live followers (:class:`FrameDecoder`), :class:`KeptOutput`,
the last bytes of one stream as a follower assembles them from the record and the frames,
and :func:`supervisor_of`, what envd says a command's supervisor is (a record is the
sandbox user's to write, so what it says of a command's process is checked against it).

A command of root (``start(user="root")``) keeps its record in :data:`ROOT_RECORDS`, in
root's home, where no other account can make or replace a name; its id says so
(``<sandbox id>:root-<32 hex>``), so any process finds the record by the id alone.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Tuple

import attrs

from ..errors import InvalidArgument, ProtocolError
from .scripts import ROOT_USER, SANDBOX_USER

__all__ = [
    "COMMAND_TAG_PREFIX",
    "FRAME",
    "RECORDS",
    "ROOT_RECORDS",
    "Frame",
    "FrameDecoder",
    "KeptOutput",
    "command_id",
    "decode_tail",
    "parse_command_id",
    "records_of",
    "supervisor_tag",
    "supervisor_users",
    "supervisor_of",
    "tag_of_control_path",
]

#: Where the supervisor keeps the sandbox user's records (one directory per command).
RECORDS = "/tmp/.capybara-cmd"
#: Where a root supervisor keeps root's (in root's home, closed to every other account).
ROOT_RECORDS = "/root/.capybara-cmd"
#: What comes before the 32 hex digits in the id of a root command.
_ROOT_MARK = "root-"
#: envd tag of a supervisor: this prefix, then the command's 32 hex digits.
COMMAND_TAG_PREFIX = "capybara-bg-"
#: A frame's header: magic ``CB``, kind, stream offset, data length.
FRAME = struct.Struct(">2ssQI")
_MAGIC = b"CB"
_KINDS = frozenset({b"r", b"o", b"e", b"x"})
#: The largest frame a supervisor writes (its reads are 64 KiB; JSON frames are small).
_MAX_FRAME = 1 << 20
_CID_RE = re.compile(r"(?P<root>root-)?(?P<cid>[0-9a-f]{32})")
_CONTROL_RE = re.compile(
    r"/tmp/\.capybara-exec-(?:(?P<tag>[A-Za-z0-9_-]{1,64})-)?"
    r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}"
)


def command_id(sandbox_id: str, cid: str, user: str = SANDBOX_USER) -> str:
    """The id users see: unique across sandboxes, usable from any process; a root
    command's says so (``<sandbox id>:root-<32 hex>``)."""
    return f"{sandbox_id}:{_ROOT_MARK if user == ROOT_USER else ''}{cid}"


def parse_command_id(value: object) -> Tuple[str, str, str]:
    """``(sandbox id, 32 hex digits, user)`` of a command id.

    Raises:
        InvalidArgument: not a command id (before any I/O).
    """
    if not isinstance(value, str):
        raise InvalidArgument("a command id must be a string like '<sandbox id>:<32 hex>'")
    sid, sep, tail = value.rpartition(":")
    m = _CID_RE.fullmatch(tail)
    if not sep or not sid or m is None:
        raise InvalidArgument(
            f"{value[:100]!r} is not a command id (they look like '<sandbox id>:<32 hex>', "
            "or '<sandbox id>:root-<32 hex>' for root's, as Command.id and commands() give "
            "them)"
        )
    return sid, m.group("cid"), ROOT_USER if m.group("root") else SANDBOX_USER


def records_of(user: str) -> str:
    """Where the supervisor of a command of ``user`` keeps its record."""
    return ROOT_RECORDS if user == ROOT_USER else RECORDS


def tag_of_control_path(ctl: str) -> Optional[str]:
    """The exec tag carried in a control path (None when it has none)."""
    m = _CONTROL_RE.fullmatch(ctl)
    return m.group("tag") if m else None


def supervisor_tag(cid: str, user: str = SANDBOX_USER) -> str:
    """The envd tag of the supervisor of command ``cid`` of ``user`` (a root command's
    says so, as its id does)."""
    return COMMAND_TAG_PREFIX + (_ROOT_MARK if user == ROOT_USER else "") + cid


def supervisor_users(processes: Iterable[Mapping[str, Any]]) -> List[str]:
    """The users whose commands' supervisors envd's process list has (by their tags:
    :func:`supervisor_tag`), the sandbox user first."""
    root_tag = COMMAND_TAG_PREFIX + _ROOT_MARK
    tags = [str(p.get("tag") or "") for p in processes]
    users = []
    if any(t.startswith(COMMAND_TAG_PREFIX) and not t.startswith(root_tag) for t in tags):
        users.append(SANDBOX_USER)
    if any(t.startswith(root_tag) for t in tags):
        users.append(ROOT_USER)
    return users


def supervisor_of(
    processes: Iterable[Mapping[str, Any]], cid: str, user: str = SANDBOX_USER,
) -> Optional[Tuple[int, str]]:
    """``(pid, control path)`` of the supervisor envd runs for command ``cid`` of ``user``,
    from envd's process list (``process.Process/List``): the process envd started with the
    tag :func:`supervisor_tag`, and the control path it was started with (the
    argument after ``cid``, which follows ``capybara-bg`` in the shell supervisor's
    arguments, and the program text in the python one's). None when envd runs no such
    supervisor (the command ended, or never ran). Only envd and the library set these: the
    sandbox user, who can write any record, cannot.
    """
    tag = supervisor_tag(cid, user)
    for info in processes:
        if info.get("tag") != tag:
            continue
        pid = info.get("pid")
        config = info.get("config")
        args = config.get("args") if isinstance(config, Mapping) else None
        if (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0
                or not isinstance(args, list) or "capybara-bg" not in args):
            continue
        at = args.index("capybara-bg") + 1
        for i in (at, at + 1):
            ctl = args[i + 1] if i + 1 < len(args) else None
            if args[i:i + 1] == [cid] and isinstance(ctl, str) and _CONTROL_RE.fullmatch(ctl):
                return pid, ctl
    return None


@attrs.frozen
class Frame:
    """One supervisor frame: ``kind`` ``r`` ready, ``o``/``e`` output, ``x`` ended."""

    kind: str
    offset: int
    data: bytes


class FrameDecoder:
    """Frames out of a supervisor's standard output, fed in pieces as they arrive."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[Frame]:
        """Append ``data``; yield every frame it completes.

        Raises:
            ProtocolError: bytes that are not a supervisor's frames.
        """
        self._buf += data
        pos = 0
        try:
            while len(self._buf) - pos >= FRAME.size:
                magic, kind, offset, length = FRAME.unpack_from(self._buf, pos)
                if magic != _MAGIC or kind not in _KINDS or length > _MAX_FRAME:
                    raise ProtocolError("a background command's supervisor wrote something "
                                        "that is not one of its frames")
                end = pos + FRAME.size + length
                if len(self._buf) < end:
                    break
                yield Frame(kind.decode("ascii"), offset, bytes(self._buf[pos + FRAME.size:end]))
                pos = end
        finally:
            del self._buf[:pos]


def decode_tail(buf: bytes, cut: bool) -> str:
    """Decode the last bytes of a stream: when its start was cut (``cut``), UTF-8
    continuation bytes at the start (at most three: the rest of a character whose start
    was dropped) are dropped rather than shown as replacement characters."""
    if cut:
        skip = 0
        while skip < 3 and skip < len(buf) and 0x80 <= buf[skip] <= 0xBF:
            skip += 1
        buf = buf[skip:]
    return buf.decode("utf-8", errors="replace")


class KeptOutput:
    """The last ``cap`` bytes of one stream from offset ``start`` on, and how far it has
    been read (``end``): pieces are added at their stream offsets; overlaps are dropped,
    and a piece past :attr:`end` is refused (the gap must be read first).
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.start = 0
        self.end = 0
        self._buf = bytearray()
        self.known = False  # whether start/end come from the record yet

    def reset(self, first: int, data: bytes) -> None:
        """Everything kept, as the record says: ``data`` starts at stream offset ``first``."""
        self.known = True
        self._buf = bytearray(data[-self.cap:]) if self.cap else bytearray()
        self.end = first + len(data)
        self.start = self.end - len(self._buf)

    def add(self, offset: int, data: bytes) -> bytes:
        """Add ``data`` found at ``offset``; returns the bytes that were new.

        Raises:
            ValueError: ``offset`` is past :attr:`end` (a gap).
        """
        if offset > self.end:
            raise ValueError("gap")
        fresh = data[self.end - offset:] if offset < self.end else data
        if not fresh:
            return b""
        self._buf += fresh
        self.end += len(fresh)
        extra = len(self._buf) - self.cap
        if extra > 0:
            del self._buf[:extra]
            self.start += extra
        return bytes(fresh)

    @property
    def data(self) -> bytes:
        return bytes(self._buf)

    @property
    def cut(self) -> bool:
        """Whether bytes before the kept ones were dropped."""
        return self.start > 0


def split_pieces(data: bytes, sizes: List[int]) -> List[bytes]:
    """``data`` cut into consecutive pieces of ``sizes``."""
    out = []
    pos = 0
    for n in sizes:
        out.append(data[pos:pos + n])
        pos += n
    return out
