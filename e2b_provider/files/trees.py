"""Whole trees (or single files) moved between this machine and a sandbox as tar streams.

This module owns :class:`Trees`, the provider's part behind ``upload`` and ``download``,
and the two ends of each stream on this machine: :func:`plan_upload` and
:func:`tar_stream` (a local file or directory walked without following symbolic links,
written as a POSIX tar stream piece by piece, so memory stays flat whatever the size and
the number of files; each entry opened through directory descriptors, never through a
link, and checked to be what was planned: what is not any more is left out), and
:func:`extract_stream` (a tar stream from the sandbox written under the local target by
the rules of :mod:`tarfile`'s ``data`` filter: no absolute names, no ``..``, no device, and
no link leading outside the target in the finished tree — the sandbox is not trusted).

In the sandbox the other end is :mod:`e2b_provider.sandbox_side.file_agent`:

* upload: a root helper makes a FIFO in the root-only staging directory and says
  ``ready``; envd's ``POST /files`` streams the tar into it, and the agent's ``extract``
  (as ``sandbox``, or as root under ``/skills``) writes each file to a temporary name in its
  own directory and renames it into place once whole. The stream ends with a member named
  by a random marker, so a cut upload is never taken for a complete one. Two requests,
  whatever the number of files.
* download: the agent's ``pack`` (as ``sandbox``) writes the tar to its standard output,
  read here as it arrives. One request.

Both are file operations: cancelled, timed out or interrupted, every process they started
in the sandbox is killed and their FIFO removed before the error is raised.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import hashlib
import json
import logging
import os
import posixpath
import re
import stat as stat_mod
import struct
import tarfile
import uuid
from array import array
from collections import OrderedDict
from typing import (
    Any,
    Callable,
    Collection,
    Dict,
    Generator,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
)

import attrs

from ..cancel import CancelToken, Deadline
from ..core.context import ProviderContext
from ..core.messages import script_reason
from ..errors import (
    CommandFailed,
    E2BHttpError,
    E2BProviderError,
    InvalidArgument,
    ProtocolError,
    UnsafePath,
)
from ..models import Target, TransferSummary
from ..protocol import scripts as scripts
from ..sandbox_side import source
from .answers import ACCESS_HINT, unsafe_path
from .files import Files
from .helper import Helper

__all__ = [
    "Progress",
    "Trees",
    "Unsent",
    "UploadPlan",
    "extract_stream",
    "plan_upload",
    "tar_stream",
    "tree_bound",
]

log = logging.getLogger("e2b_provider")

#: ``progress(done_bytes, total_bytes_or_None)``: called as file content moves.
Progress = Callable[[int, Optional[int]], None]

_BLOCK = 512
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 20
#: A tree transfer may take this long, plus :data:`_MIN_RATE` seconds per byte.
_BASE_S = 120.0
_MIN_RATE = float(1 << 20)
#: Kept from a helper's standard error, for messages.
_ERR_KEEP = 64 * 1024


def tree_bound(total_bytes: int) -> float:
    """Seconds a transfer of ``total_bytes`` of content may take in all."""
    return _BASE_S + max(0, total_bytes) / _MIN_RATE


#: A directory of a tree is opened with these flags, by name in its parent's descriptor
#: (never through a symbolic link), and a file with these (nor waiting, should a FIFO have
#: taken its place); each is then checked to be what was planned (see :func:`_walk`).
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC
_FILE_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _O_CLOEXEC
#: Directory descriptors a walk of a tree keeps open at most (others are opened again).
_OPEN_DIRS = 32
#: An entry's kind, in a plan.
_FILE, _DIR, _LINK = 0, 1, 2
#: What :func:`_walk` gives for a directory or link to send as planned, and for an entry
#: not to be sent.
_SENT, _SKIP = -1, -2
#: The most a filler's pax header holds (the sandbox's reader refuses more than 1 MiB).
_FILL_MAX = 1 << 16
#: Why an entry is not sent: it is not what was planned, or is not there any more.
_REPLACED = "it was replaced or removed on this machine after the upload listed it"


@attrs.frozen
class _Item:
    rel: str
    mode: int
    mtime: float
    size: int
    link: str = ""
    is_dir: bool = False


@attrs.frozen(eq=False)
class UploadPlan:
    """What an upload will send: the entries under ``root`` (or ``root`` itself, one file
    or link, when not ``is_dir``), in order, and their total size.

    An entry is its name and a few numbers in arrays, not an object (some 100 bytes and
    its name: a plan of 100,000 files takes about 11 MiB); :attr:`items` makes each
    :class:`_Item` when it is reached. Each entry keeps its device and inode, so that
    what is sent can be checked to be what was planned (:func:`_walk`).
    """

    root: str
    is_dir: bool
    top: Tuple[int, int]  # root's device and inode
    names: List[str] = attrs.Factory(list)  # in its directory (one file's: its member name)
    parents: array[int] = attrs.Factory(lambda: array("q"))  # its directory's index; -1
    kinds: bytearray = attrs.Factory(bytearray)
    modes: array[int] = attrs.Factory(lambda: array("H"))
    mtimes: array[float] = attrs.Factory(lambda: array("d"))
    sizes: array[int] = attrs.Factory(lambda: array("q"))
    ids: array[int] = attrs.Factory(lambda: array("Q"))  # device, inode: two each
    links: Dict[int, str] = attrs.Factory(dict)  # a link's target, by index
    #: why each directory replaced while it was listed is left out, by index
    left_out: Dict[int, str] = attrs.Factory(dict)
    total: int = 0

    def __len__(self) -> int:
        return len(self.names)

    @property
    def items(self) -> Iterator[_Item]:
        """The entries, in order (no I/O)."""
        return (item for _, item in _entries(self, _Dirs(self)))

    def summary(self) -> TransferSummary:
        """What the plan writes when all of it arrives."""
        return TransferSummary(
            files=self.kinds.count(_FILE),
            dirs=self.kinds.count(_DIR),
            symlinks=self.kinds.count(_LINK),
            bytes=self.total,
        )

    def _add(self, parent: int, name: str, st: os.stat_result, dir_fd: Optional[int],
             link_name: str) -> None:
        mode = st.st_mode
        if stat_mod.S_ISLNK(mode):
            target = os.readlink(link_name, dir_fd=dir_fd)
            self.links[len(self.names)] = target
            kind, mode, size = _LINK, 0o777, 0
        else:
            kind = _DIR if stat_mod.S_ISDIR(mode) else _FILE
            mode, size = stat_mod.S_IMODE(mode), 0 if kind == _DIR else st.st_size
        self.names.append(name)
        self.parents.append(parent)
        self.kinds.append(kind)
        self.modes.append(mode)
        self.mtimes.append(st.st_mtime)
        self.sizes.append(size)
        self.ids.extend((st.st_dev, st.st_ino))


@attrs.define
class Unsent:
    """What :func:`tar_stream` did not send as planned: each entry left out (or sent
    damaged), as ``(relative name, why)``, and what the entries left out add up to (their
    own and those below a directory left out, which are not named)."""

    entries: List[Tuple[str, str]] = attrs.Factory(list)
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0

    def left_out(self, item: _Item, why: Optional[str]) -> None:
        """``item`` is not sent (``why``: named, for what is said of it)."""
        if why is not None:
            self.entries.append((item.rel, why))
        if item.is_dir:
            self.dirs += 1
        elif item.link:
            self.symlinks += 1
        else:
            self.files += 1
            self.bytes += item.size

    def less(self, summary: TransferSummary) -> TransferSummary:
        """``summary`` (of the whole plan) without what was left out."""
        return TransferSummary(
            files=max(0, summary.files - self.files),
            dirs=max(0, summary.dirs - self.dirs),
            symlinks=max(0, summary.symlinks - self.symlinks),
            bytes=max(0, summary.bytes - self.bytes),
        )

    def failures(self, dest: str) -> List[Dict[str, Any]]:
        """The entries named, as the sandbox reports those it refused (``dest``: where the
        plan's entries go)."""
        return [{"path": posixpath.join(dest, rel) if rel else dest, "message": why}
                for rel, why in self.entries]


class _Changed(Exception):
    """What was opened is not what was planned."""


def _replaced(exc: Exception) -> bool:
    """Whether ``exc`` says an entry is not what was planned, or is not there any more."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO)
    return isinstance(exc, _Changed)


def _why(exc: Exception) -> str:
    """Why an entry of a plan could not be opened as planned, in the user's terms."""
    if isinstance(exc, _Changed):
        return str(exc)
    if _replaced(exc):
        return _REPLACED
    said = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
    return said[:1].lower() + said[1:]


def _open_planned(name: str, dir_fd: Optional[int], is_dir: bool, dev: int, ino: int,
                  size: int = -1) -> int:
    """A descriptor of ``name`` (in ``dir_fd``), opened without following a symbolic link
    and checked to be the directory or regular file planned: its device and inode, and
    (``size`` >= 0) its size.

    Raises:
        OSError: it could not be opened.
        _Changed: it is not what was planned.
    """
    fd = os.open(name, _DIR_OPEN if is_dir else _FILE_OPEN, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        kind_ok = stat_mod.S_ISDIR(st.st_mode) if is_dir else stat_mod.S_ISREG(st.st_mode)
        if not kind_ok or st.st_dev != dev or st.st_ino != ino:
            raise _Changed(_REPLACED)
        if size >= 0 and st.st_size != size:
            raise _Changed("it changed size on this machine after the upload listed it")
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Dirs:
    """The directories of a plan from its top down to the one whose entries come now (a
    plan lists each directory's entries together, directories in depth-first order):
    their relative names, and their descriptors, each opened when first asked for, by name
    in its parent's without following a link and checked to be the directory planned; the
    top's and at most :data:`_OPEN_DIRS` others kept open (one closed is opened again, and
    checked again, when needed). A directory that is not the one planned any more is named
    once in :attr:`failed`; nothing below it is opened."""

    def __init__(self, plan: UploadPlan) -> None:
        self._plan = plan
        # each level: [index (-1: the top), relative name, descriptor (-1: closed), failed]
        self._levels: List[List[Any]] = [[-1, "", -1, False]]
        self._open = 0
        self._left_out: Set[int] = set()
        self.failed: List[Tuple[str, Exception]] = []

    def goto(self, index: int) -> None:
        """Make directory ``index`` (-1: the top) the current one (its parent is on the way
        to the current one, or is it)."""
        levels = self._levels
        up = self._plan.parents[index] if index >= 0 else -2
        while len(levels) > 1 and levels[-1][0] != up:
            fd = levels.pop()[2]
            if fd >= 0:
                os.close(fd)
                self._open -= 1
        if index >= 0:
            above = levels[-1]
            levels.append([index, self.join(self._plan.names[index]), -1,
                           above[3] or index in self._left_out])

    @property
    def rel(self) -> str:
        """The current directory's relative name ("": the top)."""
        return str(self._levels[-1][1])

    def join(self, name: str) -> str:
        """The relative name of ``name`` in the current directory."""
        here = self._levels[-1][1]
        return f"{here}/{name}" if here else name

    def left_out(self, index: int) -> None:
        """Directory ``index`` is not sent: nothing in it will be."""
        self._left_out.add(index)

    def fd(self) -> int:
        """The current directory's descriptor; -1 when it, or one above it, is not the one
        planned any more."""
        return self._fd(len(self._levels) - 1)

    def _fd(self, k: int) -> int:
        level = self._levels[k]
        if level[2] >= 0 or level[3]:
            return int(level[2])
        plan = self._plan
        parent: Optional[int] = None
        if k:
            parent = self._fd(k - 1)
            if parent < 0:
                level[3] = True
                return -1
            i = level[0]
            name, (dev, ino) = plan.names[i], (plan.ids[2 * i], plan.ids[2 * i + 1])
        else:
            name, (dev, ino) = plan.root, plan.top
        try:
            fd = _open_planned(name, parent, True, dev, ino)
        except (OSError, _Changed) as exc:
            level[3] = True
            self.failed.append((level[1], exc))
            return -1
        level[2] = fd
        self._open += 1
        if self._open > _OPEN_DIRS:
            for other in self._levels[1:k]:  # the shallowest open above it (not the top)
                if other[2] >= 0:
                    os.close(other[2])
                    other[2] = -1
                    self._open -= 1
                    break
        return fd

    def close(self) -> None:
        for level in self._levels:
            if level[2] >= 0:
                os.close(level[2])
                level[2] = -1
        self._open = 0


def _entries(plan: UploadPlan, dirs: _Dirs) -> Iterator[Tuple[int, _Item]]:
    """Each entry of ``plan`` as an :class:`_Item`, with its index; ``dirs`` follows."""
    parents, kinds, links = plan.parents, plan.kinds, plan.links
    modes, mtimes, sizes = plan.modes, plan.mtimes, plan.sizes
    last = -2
    for i, name in enumerate(plan.names):
        if plan.is_dir:
            p = parents[i]
            if p != last:
                dirs.goto(p)
                last = p
            rel = dirs.join(name)
        else:
            rel = name
        kind = kinds[i]
        yield i, _Item(rel, modes[i], mtimes[i], sizes[i],
                       links.get(i, "") if kind == _LINK else "", kind == _DIR)


def _walk(plan: UploadPlan, unsent: Unsent) -> Generator[Tuple[_Item, int], None, None]:
    """Each entry of ``plan`` in order, opened to be sent: a file with its descriptor
    (closed when the next entry is asked for), a directory or link with :data:`_SENT`.

    Nothing is opened by path: each directory by name in its parent's descriptor, each
    file by name in its directory's, never through a symbolic link, and each checked to
    be what was planned (device and inode; a file's size). An entry that is not, or
    could not be opened, is given with :data:`_SKIP` (and so is everything below a
    directory left out), and recorded in ``unsent``; so a file or directory replaced by a
    link (or another file) after planning is never read. A link is sent as planned (its
    target was read then).
    """
    dirs = _Dirs(plan)
    ids, parents = plan.ids, plan.parents
    dfd: Optional[int] = None
    last = -2
    try:
        for i, item in _entries(plan, dirs):
            name = plan.root
            if plan.is_dir:
                if parents[i] != last:  # the next directory's entries
                    last = parents[i]
                    dfd = dirs.fd()
                    for rel, exc in dirs.failed:
                        unsent.entries.append((rel, f"not sent: {_why(exc)}"))
                    dirs.failed.clear()
                if dfd is None or dfd < 0:
                    unsent.left_out(item, None)
                    yield item, _SKIP
                    continue
                name = plan.names[i]
            if item.link:
                yield item, _SENT
                continue
            if i in plan.left_out:  # replaced while it was listed
                unsent.left_out(item, f"not sent: {plan.left_out[i]}")
                dirs.left_out(i)
                yield item, _SKIP
                continue
            try:
                fd = _open_planned(name, dfd, item.is_dir, ids[2 * i], ids[2 * i + 1],
                                   -1 if item.is_dir else item.size)
            except (OSError, _Changed) as exc:
                unsent.left_out(item, f"not sent: {_why(exc)}")
                if item.is_dir:
                    dirs.left_out(i)
                yield item, _SKIP
                continue
            if item.is_dir:
                os.close(fd)
                yield item, _SENT
                continue
            try:
                yield item, fd
            finally:
                os.close(fd)
    finally:
        dirs.close()


def _excluded(rel: str, name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


def plan_upload(local_path: str, name: str, exclude: Sequence[str]) -> UploadPlan:
    """Walk ``local_path`` (not following symbolic links; a directory's entries sorted).

    Each directory is listed through a descriptor opened by name in its parent's, without
    following a link, and checked to be the directory seen there: one that is not any more
    is planned as left out (:attr:`UploadPlan.left_out`, named when the upload ends), an
    entry gone meanwhile is not planned.

    Args:
        local_path: a file, a symbolic link or a directory on this machine.
        name: the member name a single file gets.
        exclude: ``fnmatch`` patterns matched against each relative path and base name.

    Raises:
        InvalidArgument: ``local_path`` does not exist, is neither a file, a link nor a
            directory, or a directory in it cannot be listed (before any I/O in the
            sandbox).
    """
    try:
        top = os.lstat(local_path)
    except OSError as exc:
        raise InvalidArgument(f"cannot upload {local_path!r}: {exc.strerror}") from None
    plan = UploadPlan(local_path, stat_mod.S_ISDIR(top.st_mode), (top.st_dev, top.st_ino))
    if not plan.is_dir:
        if not (stat_mod.S_ISREG(top.st_mode) or stat_mod.S_ISLNK(top.st_mode)):
            raise InvalidArgument(f"cannot upload {local_path!r}: not a file or directory")
        try:
            plan._add(-1, name, top, None, local_path)
        except OSError as exc:  # a link no more
            raise InvalidArgument(f"cannot upload {local_path!r}: {_why(exc)}") from None
        return attrs.evolve(plan, total=plan.sizes[0])
    dirs = _Dirs(plan)
    pending = [-1]
    try:
        while pending:
            index = pending.pop()
            dirs.goto(index)
            here = f"{local_path}/{dirs.rel}" if index >= 0 else local_path
            fd = dirs.fd()
            if fd < 0:
                # (nothing said: a directory above it was replaced, and said so)
                failure = dirs.failed.pop()[1] if dirs.failed else _Changed(_REPLACED)
                if index >= 0 and _replaced(failure):  # as if replaced a moment later
                    plan.left_out[index] = _why(failure)
                    continue
                raise InvalidArgument(f"cannot upload {here!r}: {_why(failure)}")
            try:
                names = sorted(os.listdir(fd))
            except OSError as exc:
                raise InvalidArgument(f"cannot upload {here!r}: {exc.strerror}") from None
            below: List[int] = []
            for entry in names:
                if exclude and _excluded(dirs.join(entry), entry, exclude):
                    continue
                try:
                    st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                    mode = st.st_mode
                    if stat_mod.S_ISDIR(mode):
                        below.append(len(plan.names))
                    elif not (stat_mod.S_ISREG(mode) or stat_mod.S_ISLNK(mode)):
                        log.info("e2b_provider: upload skips %s/%s (not a file, directory "
                                 "or link)", here, entry)
                        continue
                    plan._add(index, entry, st, fd, entry)
                except OSError as exc:
                    if _replaced(exc) or exc.errno == errno.EINVAL:
                        continue  # gone meanwhile (or a link replaced as it was read)
                    path = f"{here}/{entry}"
                    raise InvalidArgument(f"cannot upload {path!r}: {_why(exc)}") from None
            pending.extend(reversed(below))
    finally:
        dirs.close()
    return attrs.evolve(plan, total=sum(plan.sizes))


_USTAR = struct.Struct("100s8s8s8s12s12s8s1s100s6s2s32s32s8s8s155s12s")
#: Numbers below this fit a ustar header's 12-byte octal fields.
_OCTAL_11 = 8**11
#: The checksum of a plain header's constant fields: uid and gid "0000000\0", the
#: checksum field as eight spaces, "ustar\0" and "00".
_CHECK_BASE = sum(b"0000000\0" * 2 + b" " * 8 + b"ustar\0" + b"00")


def _plain(item: _Item, size: int) -> bool:
    """Whether ``item``'s header is one ustar block (ASCII name and link of at most 100
    bytes, numbers that fit): :func:`_header` packs it directly."""
    name, link = item.rel, item.link
    if size < 0 and not item.link and not name.endswith("/"):
        name += "/"  # as tarfile names a directory
    return (
        name.isascii() and link.isascii() and len(name) <= 100 and len(link) <= 100
        and 0 <= max(size, 0) < _OCTAL_11 and 0 <= int(item.mtime) < _OCTAL_11
    )


def _header(item: _Item, size: int) -> bytes:
    """The tar header of ``item`` (``size`` -1: a directory), as ``tarfile`` writes it in
    PAX format. A plain member (see :func:`_plain`) is packed directly, which is several
    times faster for trees of many small files; the rest goes through ``tarfile``."""
    kind = b"2" if item.link else (b"5" if size < 0 else b"0")
    length = max(size, 0)
    mtime = int(item.mtime)
    name, link = item.rel, item.link
    if kind == b"5" and not name.endswith("/"):
        name += "/"  # as tarfile names a directory
    if _plain(item, size):
        raw_name, raw_link = name.encode("ascii"), link.encode("ascii")
        numbers = b"%07o\0" % (item.mode & 0o777) + b"%011o\0%011o\0" % (length, mtime)
        # the checksum is the sum of the header's bytes with its own field as spaces
        check = _CHECK_BASE + sum(raw_name) + sum(raw_link) + sum(numbers) + kind[0]
        return _USTAR.pack(
            raw_name, numbers[:8], b"0000000\0", b"0000000\0", numbers[8:20], numbers[20:],
            b"%06o\0 " % check, kind, raw_link, b"ustar\0", b"00",
            b"", b"", b"", b"", b"", b"",
        )
    ti = tarfile.TarInfo(item.rel)
    ti.mode = item.mode & 0o777
    ti.mtime = mtime
    if item.link:
        ti.type = tarfile.SYMTYPE
        ti.linkname = link
    elif size < 0:
        ti.type = tarfile.DIRTYPE
    else:
        ti.size = size
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_stream(
    plan: UploadPlan,
    end_name: str,
    *,
    progress: Optional[Progress] = None,
    cancel: Optional[CancelToken] = None,
    unsent: Optional[Unsent] = None,
) -> Iterator[bytes]:
    """The tar stream of ``plan``, in pieces of about :data:`_CHUNK` bytes (small members
    are gathered into one piece), ending with an empty member named ``end_name`` and the
    end-of-archive blocks; always :func:`tar_length` bytes.

    Entries are read as :func:`_walk` opens them: never through a symbolic link, each
    checked to be what was planned. One that is not any more (replaced, by a link or
    anything else, removed, or a file whose size changed since it was planned) is not
    sent, nor is anything below a directory left out: its place in the stream is taken
    by pax global headers holding only a comment, which tar readers skip, and it is
    recorded in ``unsent``. A file that shrinks while it is read is padded with zeros to
    its planned size (and recorded); one that grows is cut at it.

    Raises:
        Cancelled: ``cancel`` fired (checked between pieces).
        OSError: a local file could not be read.
    """
    if unsent is None:
        unsent = Unsent()
    done = 0
    out = bytearray()
    if progress is not None:
        progress(0, plan.total)
    walk = _walk(plan, unsent)
    try:
        for item, fd in walk:
            if cancel is not None:
                cancel.raise_if_cancelled()
            if len(out) >= _CHUNK:  # the headers of many small entries
                yield bytes(out)
                out.clear()
                if progress is not None:
                    progress(done, plan.total)
            size = -1 if item.is_dir else (0 if item.link else item.size)
            if fd == _SKIP:
                for piece in _filler(_length(item, size)):
                    if out and len(out) + len(piece) > _CHUNK:
                        yield bytes(out)
                        out.clear()
                    out += piece
                done += item.size
                continue
            out += _header(item, size)
            if fd == _SENT:
                continue
            left = item.size
            while left > 0:
                if len(out) >= _CHUNK:
                    yield bytes(out)
                    out.clear()
                    if cancel is not None:
                        cancel.raise_if_cancelled()
                    if progress is not None:
                        progress(done, plan.total)
                if not out and left >= _CHUNK:
                    # a large file's pieces go out as read: no copy on this side
                    piece = os.read(fd, _CHUNK)
                    if len(piece) == _CHUNK:
                        left -= _CHUNK
                        done += _CHUNK
                        yield piece
                        if cancel is not None:
                            cancel.raise_if_cancelled()
                        if progress is not None:
                            progress(done, plan.total)
                        continue
                else:
                    piece = os.read(fd, min(max(_CHUNK - len(out), _BLOCK), left))
                if not piece:
                    log.warning("e2b_provider: %s shrank while it was uploaded; its end is "
                                "padded with zeros",
                                f"{plan.root}/{item.rel}" if plan.is_dir else plan.root)
                    unsent.entries.append(
                        (item.rel, "it shrank while it was uploaded: its end was sent as zeros"))
                    while left > 0:
                        pad = min(_CHUNK, left)
                        out += bytes(pad)
                        left -= pad
                        done += pad
                        if len(out) >= _CHUNK:
                            yield bytes(out)
                            out.clear()
                    break
                left -= len(piece)
                done += len(piece)
                out += piece
            out += b"\0" * (-item.size % _BLOCK)
    finally:
        walk.close()
    out += _end_header(end_name)
    out += b"\0" * (2 * _BLOCK)
    yield bytes(out)
    if progress is not None:
        progress(done, plan.total)


def _length(item: _Item, size: int) -> int:
    """The bytes ``item`` (``size`` as for :func:`_header`) takes in the stream: its header,
    and a file's data padded to a whole block."""
    head = _BLOCK if _plain(item, size) else len(_header(item, size))
    return head + (size + (-size % _BLOCK) if size > 0 else 0)


def tar_length(plan: UploadPlan, end_name: str) -> int:
    """The exact length of :func:`tar_stream` ``(plan, end_name)``."""
    total = len(_end_header(end_name)) + 2 * _BLOCK
    for item in plan.items:
        total += _length(item, -1 if item.is_dir else (0 if item.link else item.size))
    return total


def _end_header(end_name: str) -> bytes:
    return tarfile.TarInfo(end_name).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _filler(length: int) -> Iterator[bytes]:
    """``length`` bytes (whole blocks) of pax global headers holding only a ``comment``
    record, which a tar reader skips: the place of an entry not sent, in a stream whose
    length was announced."""
    while length > 0:
        size = min(length - _BLOCK, _FILL_MAX)
        yield _comment(size)
        length -= _BLOCK + size


@functools.lru_cache(maxsize=4)
def _comment(size: int) -> bytes:
    """A pax global header whose ``size`` bytes (whole blocks) are one ``comment``."""
    ti = tarfile.TarInfo("pax_global_header")
    ti.type = tarfile.XGLTYPE
    ti.size = size
    head = ti.tobuf(tarfile.USTAR_FORMAT)
    if not size:
        return head
    record = b"%d comment=" % size
    return head + record + b"x" * (size - len(record) - 1) + b"\n"


def _read_upto(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes of ``fd``, fewer only at its end."""
    parts: List[bytes] = []
    while n > 0:
        piece = os.read(fd, n)
        if not piece:
            break
        parts.append(piece)
        n -= len(piece)
    return b"".join(parts)


class _Chunks:
    """A file object over pieces of bytes pulled from ``pull`` (None: the end), read
    without gathering them: :meth:`read` hands out (a part of) one piece at a time."""

    def __init__(self, pull: Callable[[], Optional[bytes]]) -> None:
        self._pull = pull
        self._piece = b""
        self._pos = 0
        self._eof = False

    def _next_piece(self) -> bool:
        """Move to the next non-empty piece; False at the end."""
        while not self._eof:
            piece = self._pull()
            if piece is None:
                self._eof = True
                break
            if piece:
                self._piece, self._pos = piece, 0
                return True
        self._piece, self._pos = b"", 0
        return False

    def read_line(self, limit: int) -> bytes:
        """The first line (without its newline), at most ``limit`` bytes; ``b""`` if none."""
        line = bytearray()
        while True:
            nl = self._piece.find(b"\n", self._pos)
            if nl >= 0:
                line += self._piece[self._pos : nl]
                self._pos = nl + 1
                return bytes(line) if len(line) <= limit else b""
            line += self._piece[self._pos :]
            if len(line) > limit or not self._next_piece():
                return b""

    def read(self, n: int) -> bytes:
        """At least one and at most ``n`` bytes (``n`` > 0), from one piece; ``b""`` at the
        end."""
        if self._pos >= len(self._piece) and not self._next_piece():
            return b""
        piece, pos = self._piece, self._pos
        if pos == 0 and n >= len(piece):
            self._pos = len(piece)
            return piece  # a whole piece: not copied
        out = piece[pos : pos + n]
        self._pos = pos + len(out)
        return out


class _TarReader:
    """The members of a tar stream, read in order at the speed of the stream: ustar headers
    and pax records parsed here, each member handed out as a :class:`tarfile.TarInfo` (for
    the ``data`` filter) and its data read with :meth:`read`. ``tarfile``'s own stream mode
    costs several times as much per member."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self._left = 0
        self._pad = 0
        #: Set when a global header said the member before it was not read whole (see
        #: :data:`FAILED_KEY`); the caller clears it.
        self.failed = False

    def _upto(self, n: int) -> bytes:
        """``n`` bytes, fewer only at the end of the stream."""
        data = self._read(n) if n else b""
        if len(data) == n or not data:
            return data
        parts = [data]
        got = len(data)
        while got < n:
            more = self._read(n - got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def _exactly(self, n: int) -> bytes:
        data = self._upto(n)
        if len(data) != n:
            raise tarfile.ReadError("unexpected end of data")
        return data

    def read(self, n: int) -> bytes:
        """At least one and at most ``n`` bytes of the current member's data; ``b""`` after
        its end."""
        n = min(n, self._left)
        if n <= 0:
            return b""
        data = self._read(n)
        if not data:
            raise tarfile.ReadError("unexpected end of data")
        self._left -= len(data)
        return data

    def next(self) -> Optional[tarfile.TarInfo]:
        """The next member, or None at the end of the archive."""
        while self._left:
            self.read(self._left)
        if self._pad:
            self._exactly(self._pad)
            self._pad = 0
        pax: Dict[str, str] = {}
        while True:
            block = self._upto(_BLOCK)
            if block == bytes(_BLOCK):
                return None
            if not block:  # cut between two members: not the end of the archive
                raise tarfile.ReadError("unexpected end of data")
            if len(block) != _BLOCK:
                raise tarfile.ReadError("unexpected end of data")
            if _number(block[148:156]) != sum(block) - sum(block[148:156]) + 256:
                raise tarfile.ReadError("a header's checksum is wrong")
            kind = block[156:157]
            size = _number(block[124:136])
            if kind in (b"x", b"g"):
                if not 0 <= size <= (1 << 20):
                    raise tarfile.ReadError("an extended header is too large")
                data = self._exactly(size)
                self._exactly(-size % _BLOCK)
                if kind == b"x":
                    pax.update(_pax_records(data))
                elif FAILED_KEY in _pax_records(data):
                    self.failed = True
                continue
            name = block[0:100].split(b"\0", 1)[0]
            prefix = block[345:500].split(b"\0", 1)[0]
            if prefix and block[257:262] == b"ustar":
                name = prefix + b"/" + name
            ti = tarfile.TarInfo(pax.get("path") or name.decode("utf-8", "surrogateescape"))
            ti.type = kind if kind != b"\0" else tarfile.REGTYPE
            ti.mode = _number(block[100:108]) & 0o7777
            ti.mtime = float(pax["mtime"]) if "mtime" in pax else _number(block[136:148])
            ti.size = int(pax["size"]) if "size" in pax else size
            ti.linkname = pax.get("linkpath") or block[157:257].split(b"\0", 1)[0].decode(
                "utf-8", "surrogateescape"
            )
            if ti.size < 0:
                raise tarfile.ReadError("a negative size")
            data_size = ti.size if ti.type in tarfile.REGULAR_TYPES else 0
            self._left, self._pad = data_size, -data_size % _BLOCK
            return ti


#: The record of a global pax header that the file agent's ``pack`` writes right after a
#: member it could not read whole (it shrank): that member is not to be written.
FAILED_KEY = "CAPYBARA.failed"


def _number(field: bytes) -> int:
    """A tar header's number: octal text, or base-256 (a first byte with its high bit)."""
    if field[:1] and field[0] & 0x80:
        value = field[0] & 0x3F
        for byte in field[1:]:
            value = value * 256 + byte
        return -value if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise tarfile.ReadError("a header number is not octal") from None


def _pax_records(data: bytes) -> Dict[str, str]:
    """The ``length key=value`` records of a pax extended header."""
    out: Dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            length = 0
        if length <= 0 or pos + length > len(data):
            raise tarfile.ReadError("a malformed pax record")
        key, eq, value = data[space + 1 : pos + length - 1].partition(b"=")
        if not eq:
            raise tarfile.ReadError("a malformed pax record")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


#: Local temporary names: ``.capybara-part-<pid>-<host>-<hex>``, ``host`` naming the machine,
#: its boot and its pid namespace (:func:`_host_tag`), so that the owner's liveness can be
#: told from the name alone.
_PART = ".capybara-part-"
_PART_NAME = re.compile(r"\.capybara-part-([0-9]{1,10})-([0-9a-f]{8})-[0-9a-f]{12}")
#: The most symbolic links one link may lead through (the kernel's ``MAXSYMLINKS``).
_MAX_HOPS = 40
#: The longest member name written (``PATH_MAX`` less its NUL): deeper is refused.
MAX_NAME_BYTES = 4095
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC
_host: List[str] = []


def _host_tag() -> str:
    """Eight hex digits naming this machine, its boot and this process's pid namespace:
    a part file whose name carries them has an owner whose pid means something here."""
    if not _host:
        seen = [os.uname().nodename]
        for path in ("/proc/sys/kernel/random/boot_id",):
            try:
                with open(path, encoding="ascii") as f:
                    seen.append(f.read().strip())
            except OSError:
                seen.append("")
        try:
            seen.append(os.readlink("/proc/self/ns/pid"))
        except OSError:
            seen.append("")
        _host.append(hashlib.sha256("\0".join(seen).encode()).hexdigest()[:8])
    return _host[0]


def _part_name() -> str:
    return f"{_PART}{os.getpid()}-{_host_tag()}-{uuid.uuid4().hex[:12]}"


def _gone(pid: int) -> bool:
    """Whether no process ``pid`` runs (here: the caller has checked the host tag)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def sweep_parts(dir_fd: int) -> int:
    """Remove from directory ``dir_fd`` the temporary files (and staging directories) that
    downloads of processes now gone left (killed: nothing could remove them); how many.

    Only a name that is exactly a part name of this machine, boot and pid namespace whose
    process is gone, owned by this user, is removed; a part of a live process, of another
    machine or of an older version is left."""
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return 0
    removed = 0
    tag = _host_tag()
    for name in names:
        if not name.startswith(_PART):
            continue
        m = _PART_NAME.fullmatch(name)
        if m is None or m.group(2) != tag or not _gone(int(m.group(1))):
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if st.st_uid != os.geteuid():
                continue
            if stat_mod.S_ISDIR(st.st_mode):
                _remove_tree(dir_fd, name)
            else:
                os.unlink(name, dir_fd=dir_fd)
            removed += 1
        except OSError as exc:
            log.info("e2b_provider: could not remove %s: %s", name, exc.strerror)
    return removed


def _remove_tree(dir_fd: int, name: str) -> None:
    """Remove directory ``name`` of ``dir_fd`` and everything below it, never following a
    link, whatever its depth: one descriptor at a time (a directory's subdirectories are
    kept by name), climbing back by ``..`` checked against the directory left."""
    top = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    # each level: (its name, its (st_dev, st_ino), subdirectories still to remove)
    levels: List[Tuple[str, Tuple[int, int], List[str]]] = []
    fd = top
    try:
        entered = name
        while True:
            st = os.fstat(fd)
            subdirs: List[str] = []
            for entry in os.listdir(fd):
                try:
                    os.unlink(entry, dir_fd=fd)
                except IsADirectoryError:
                    subdirs.append(entry)
                except FileNotFoundError:
                    pass
                except PermissionError:  # Linux's unlink of a directory
                    if not stat_mod.S_ISDIR(os.stat(entry, dir_fd=fd,
                                                    follow_symlinks=False).st_mode):
                        raise
                    subdirs.append(entry)
            levels.append((entered, (st.st_dev, st.st_ino), subdirs))
            while levels and not levels[-1][2]:
                done, _, _ = levels.pop()
                if not levels:
                    os.close(fd)
                    fd = -1
                    os.rmdir(done, dir_fd=dir_fd)
                    return
                up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = up
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != levels[-1][1]:
                    raise OSError(errno.EBUSY, "the tree moved while it was removed", done)
                os.rmdir(done, dir_fd=fd)
            entered = levels[-1][2].pop()
            child = os.open(entered, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        if fd >= 0:
            os.close(fd)


_Key = Tuple[str, ...]


class _LocalTree:
    """Writes members under one local directory through directory descriptors opened
    without following a symbolic link (``O_NOFOLLOW`` on every component), so no link —
    planted by the archive or already there — is ever gone through, however long its
    path; at most :data:`_HELD` of them open at once (the most recently used), found
    again without recursion, so any depth takes time in proportion. The admission rules
    (:func:`_admit`) decide what may be written, this decides how.

    A file is written to a temporary name and kept :meth:`pending` until the next member
    says it arrived whole (:meth:`commit`, or :meth:`discard`). Symbolic links are kept
    until the end (:meth:`links`), when each is judged against the finished tree."""

    _HELD = 64

    def __init__(self, root: int, swept: Iterable[Tuple[int, int]] = ()) -> None:
        self.root = root
        self.open: OrderedDict[_Key, int] = OrderedDict()
        #: each directory member: its path, mode, time, and (st_dev, st_ino)
        self.dir_modes: List[Tuple[_Key, Optional[int], float, Tuple[int, int]]] = []
        self.swept: Set[Tuple[int, int]] = set(swept)
        #: the file written last, not yet in place: (path, temporary name, member name, size)
        self.pending: Optional[Tuple[_Key, str, str, int]] = None
        self.planned: OrderedDict[_Key, Tuple[str, str]] = OrderedDict()
        self._sweep(root)

    def _sweep(self, fd: int) -> None:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) not in self.swept:
            self.swept.add((st.st_dev, st.st_ino))
            sweep_parts(fd)

    def close(self) -> None:
        """Give directories their modes (deepest first), then close every descriptor."""
        last: Tuple[_Key, int] = ((), -1)  # the directory done last, held: up by ".."
        try:
            for parts, mode, mtime, ident in sorted(self.dir_modes, key=lambda d: -len(d[0])):
                fd = -1
                try:
                    if last[1] >= 0 and parts == last[0][:-1]:
                        fd = os.open("..", os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC,
                                     dir_fd=last[1])
                    else:
                        fd = os.dup(self.dir_fd(parts, make=False))
                    st = os.fstat(fd)
                    if (st.st_dev, st.st_ino) == ident:  # not something moved there since
                        if mode is not None:
                            os.chmod(fd, mode)
                        os.utime(fd, (mtime, mtime))
                except OSError:
                    pass
                if last[1] >= 0:
                    os.close(last[1])
                last = (parts, fd)
        finally:
            if last[1] >= 0:
                os.close(last[1])
            for fd in self.open.values():
                os.close(fd)
            self.open.clear()

    def dir_fd(self, parts: _Key, make: bool = True) -> int:
        """The descriptor of directory ``parts`` (made if missing, with ``make``)."""
        if not parts:
            return self.root
        fd = self.open.get(parts)
        if fd is not None:
            self.open.move_to_end(parts)
            return fd
        start = len(parts) - 1
        fd = self.open.get(parts[:-1]) if start else self.root
        if fd is None:  # the deepest ancestor held, else the root
            start, fd = 0, self.root
            for held, held_fd in self.open.items():
                if start < len(held) < len(parts) and parts[: len(held)] == held:
                    start, fd = len(held), held_fd
        for depth in range(start + 1, len(parts) + 1):
            fd = self._open_below(fd, parts[:depth], make)
        return fd

    def _open_below(self, parent: int, parts: _Key, make: bool) -> int:
        made = False
        try:
            fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not make:
                raise
            os.mkdir(parts[-1], 0o777, dir_fd=parent)
            made = True
            fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise OSError(exc.errno, "a symbolic link or file is in the way",
                              "/".join(parts)) from None
            raise
        try:
            if made:
                st = os.fstat(fd)
                self.swept.add((st.st_dev, st.st_ino))
            else:
                self._sweep(fd)
            while len(self.open) >= self._HELD:
                os.close(self.open.popitem(last=False)[1])
        except BaseException:
            os.close(fd)
            raise
        self.open[parts] = fd
        return fd

    def _temp(self, parts: _Key, make: Callable[[int, str], None]) -> Tuple[int, str]:
        """``make`` a temporary file beside ``parts`` (refused if a directory is there)."""
        dfd = self.dir_fd(parts[:-1])
        try:
            old = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat_mod.S_ISDIR(old.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a directory is in the way", "/".join(parts))
        tmp = _part_name()
        try:
            make(dfd, tmp)
        except BaseException:
            _unlink_quietly(tmp, dfd)
            raise
        return dfd, tmp

    def file(self, parts: _Key, src: Any, mode: int, mtime: float, name: str, size: int) -> None:
        """Write the file to a temporary name: :attr:`pending` until committed."""
        def make(dfd: int, tmp: str) -> None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                while True:
                    piece = src.read(_CHUNK)  # as it came: no copy on this side
                    if not piece:
                        break
                    written = os.write(fd, piece)
                    if written < len(piece):
                        with memoryview(piece) as view:
                            while written < len(piece):
                                written += os.write(fd, view[written:])
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)

        self.planned.pop(parts, None)  # a later member replaces an earlier one
        _, tmp = self._temp(parts, make)
        self.pending = (parts, tmp, name, size)

    def commit(self) -> None:
        """Rename the pending file into place."""
        if self.pending is None:
            return
        parts, tmp, _, _ = self.pending
        self.pending = None
        dfd = self.dir_fd(parts[:-1])
        try:
            os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            _unlink_quietly(tmp, dfd)
            raise

    def discard(self) -> None:
        """Remove the pending file: what it would have replaced stays."""
        if self.pending is not None:
            parts, tmp, _, _ = self.pending
            self.pending = None
            _unlink_quietly(tmp, self.dir_fd(parts[:-1], make=False))

    def directory(self, parts: _Key, mode: Optional[int], mtime: float) -> None:
        self.planned.pop(parts, None)
        st = os.fstat(self.dir_fd(parts))
        self.dir_modes.append((parts, mode, mtime, (st.st_dev, st.st_ino)))

    def symlink(self, parts: _Key, target: str, name: str) -> None:
        """Keep link ``parts`` -> ``target`` (member ``name``) for :meth:`links`."""
        self.dir_fd(parts[:-1])  # its directory, as for any member
        self.planned.pop(parts, None)
        self.planned[parts] = (target, name)

    def links(self, refused: List[Dict[str, Any]]) -> int:
        """Write the links kept, each only if it leads nowhere outside the root (judged
        against the tree as it will be with all of them: see :meth:`_judge`); the others
        go to ``refused``. How many were written."""
        planned = self.planned
        for parts in list(planned):
            try:
                st = os.stat(parts[-1], dir_fd=self.dir_fd(parts[:-1], make=False),
                             follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                refused.append({"path": planned.pop(parts)[1], "message": f"refused: {exc}"})
                continue
            if stat_mod.S_ISDIR(st.st_mode):
                refused.append({"path": planned.pop(parts)[1],
                                "message": "refused: a directory is in the way"})
        memo: Dict[_Key, Any] = {}
        good = []
        for parts, (_, name) in planned.items():
            why = self._judge(parts, planned, memo, 0)
            if why is None:
                good.append(parts)
            else:
                refused.append({"path": name, "message": f"refused: {name!r} is a symbolic "
                                f"link that {why}"})
        written: List[_Key] = []
        failed = False
        for parts in good:
            target, name = planned[parts]
            try:
                dfd, tmp = self._temp(parts, functools.partial(_symlink, target))
                try:
                    os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
                except BaseException:
                    _unlink_quietly(tmp, dfd)
                    raise
                written.append(parts)
            except OSError as exc:
                failed = True
                refused.append({"path": name, "message": f"refused: {exc}"})
        self.planned = OrderedDict()
        while failed:  # the tree is not the one judged: judge what was written again
            failed = False
            memo = {}
            for parts in list(written):
                why = self._judge(parts, {}, memo, 0)
                if why is not None:
                    failed = True
                    written.remove(parts)
                    _unlink_quietly(parts[-1], self.dir_fd(parts[:-1], make=False))
                    name = planned[parts][1]
                    refused.append({"path": name, "message": f"refused: {name!r} is a "
                                    f"symbolic link that {why}"})
        return len(written)

    def _judge(self, link: _Key, planned: Dict[_Key, Tuple[str, str]], memo: Dict[_Key, Any],
               hops: int) -> Optional[str]:
        """Why link ``link`` (one of ``planned``, or one already there) may lead outside
        the root, or None. Its target is followed component by component from the link's
        directory over the tree as it will be: a directory is entered, a link is followed
        (judged the same way, once); ``..`` may climb only out of a directory reached
        without going through a link or something missing (a link written later could
        change where ``..`` leads), and never above the root."""
        seen = memo.get(link)
        if seen is not None:
            return "is part of a loop of links" if seen is _BUSY else seen[0]
        if hops > _MAX_HOPS:
            return f"leads through more than {_MAX_HOPS} links"
        memo[link] = _BUSY
        if link in planned:
            target = planned[link][0]
        else:
            try:
                target = os.readlink(link[-1], dir_fd=self.dir_fd(link[:-1], make=False))
            except OSError:
                memo[link] = ("cannot be read",)
                return "cannot be read"
        why, _ = self._follow(link[:-1], target, planned, memo, hops)
        memo[link] = (why, _)
        return why

    def _follow(self, start: _Key, target: str, planned: Dict[_Key, Tuple[str, str]],
                memo: Dict[_Key, Any], hops: int) -> Tuple[Optional[str], Optional[_Key]]:
        """Why ``target`` followed from directory ``start`` may lead outside, or None; and
        the directory it leads to when known (None: a file, or something missing)."""
        if target.startswith("/"):
            return "leads to an absolute path", None
        cur = list(start)
        linked, known = False, True
        for comp in target.split("/"):
            if comp in ("", "."):
                continue
            if comp == "..":
                if linked or not known:
                    return ("climbs (..) out of a symbolic link or of something missing, "
                            "which may lead anywhere"), None
                if not cur:
                    return "leads outside the destination", None
                cur.pop()
                continue
            cur.append(comp)
            if not known:
                continue
            key = tuple(cur)
            kind = "link" if key in planned else self._kind(key)
            if kind == "dir":
                continue
            if kind == "link":
                why = self._judge(key, planned, memo, hops + 1)
                if why is not None:
                    return f"leads through {'/'.join(key)!r}, which {why}", None
                linked = True
                there = memo[key][1]
                if there is None:
                    known = False
                else:
                    cur = list(there)
                continue
            known = False  # a file or nothing: nothing is below it now
        return None, (tuple(cur) if known else None)

    def _kind(self, key: _Key) -> str:
        """``dir``, ``link`` or ``other`` (a file, or nothing): what ``key`` is now."""
        try:
            st = os.stat(key[-1], dir_fd=self.dir_fd(key[:-1], make=False),
                         follow_symlinks=False)
        except OSError:
            return "other"
        if stat_mod.S_ISDIR(st.st_mode):
            return "dir"
        return "link" if stat_mod.S_ISLNK(st.st_mode) else "other"


_BUSY = object()


def _symlink(target: str, dir_fd: int, name: str) -> None:
    os.symlink(target, name, dir_fd=dir_fd)


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _parts(name: str) -> Tuple[str, ...]:
    split = name.rstrip("/").split("/")  # a directory's name may end with "/"
    if "" in split or "." in split:
        split = [p for p in split if p not in ("", ".")]
    parts = tuple(split)
    if not parts or ".." in parts:
        raise ValueError(f"{name!r} leaves the destination")
    return parts


def _admit(member: tarfile.TarInfo) -> Tuple[_Key, Optional[int]]:
    """The path and mode (None: the default) ``member`` is written with, by the rules of
    :mod:`tarfile`'s ``data`` filter, without its look at the disk (which follows links,
    and costs in proportion to the depth for every member): leading ``/`` stripped, no
    ``..``; only files, directories and symbolic links (not to an absolute path; where a
    relative one leads is judged once the tree is whole, :meth:`_LocalTree.links`); a
    file's set-id, sticky and group/other write bits cleared, its owner's read and write
    bits set, its execute bits only if its owner's was set.

    Raises:
        ValueError: the member is refused (why).
    """
    name = member.name
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise ValueError(f"its name is longer than {MAX_NAME_BYTES} bytes")
    parts = _parts(name.lstrip("/"))
    if member.isfile():
        mode = member.mode & 0o755
        if not mode & 0o100:
            mode &= ~0o111
        return parts, mode | 0o600
    if member.isdir():
        return parts, None
    if member.issym():
        if member.linkname.startswith("/"):
            raise ValueError(f"{name!r} is a link to an absolute path")
        return parts, None
    if member.islnk():
        raise ValueError(f"{name!r} is a hard link")
    raise ValueError(f"{name!r} is a special file")


def extract_stream(
    read: Callable[[int], bytes],
    local_path: str,
    *,
    single: bool,
    max_bytes: int,
    refused: List[Dict[str, Any]],
    progress: Optional[Progress] = None,
    total: Optional[int] = None,
    settle: Optional[Callable[[], Collection[str]]] = None,
) -> TransferSummary:
    """Write the tar stream ``read`` gives under ``local_path``, safely. ``read(n)`` gives
    at least one and at most ``n`` bytes, ``b""`` at the end (as a raw file's ``read``).

    With ``single``, the stream holds one member, written to ``local_path`` itself;
    otherwise ``local_path`` is the directory the members are written under. A directory
    that does not exist yet is written whole or not at all: the tree goes to a staging
    directory beside it (``.capybara-part-…``), renamed into place once the stream has
    ended; cut, cancelled or failed, it is removed. Into one that exists, entries are
    written one by one (a cut leaves those already written).

    Each member goes through the rules of :mod:`tarfile`'s ``data`` filter (:func:`_admit`:
    leading ``/`` stripped; ``..``, absolute links, devices, hard links refused; set-id and
    group/other write bits cleared), then is written through directory descriptors that
    never follow a link (:class:`_LocalTree`); each file to a temporary name in its
    directory, renamed into place once whole (one the sandbox marked as not read whole
    (it shrank) is dropped: what was there stays). Symbolic links are written last, each
    only if it leads nowhere outside the destination in the finished tree, whatever the
    order of the members. A member refused on the way is not written: it is added to
    ``refused``. Temporary files and staging directories of downloads whose process is
    gone (killed) are removed from each directory written in (:func:`sweep_parts`).

    ``settle``, for a sandbox that says which files it could not read whole only once the
    stream has ended (GNU ``tar``): every file is kept under its temporary name until the
    stream ends, then ``settle()`` gives the names of those to drop; the others are put in
    place.

    Raises:
        CommandFailed: the stream holds more than ``max_bytes`` of content.
        tarfile.TarError: the stream is not a tar stream.
        OSError: the destination could not be written.
    """
    files = dirs = links = size = written = 0
    dest = os.path.abspath(local_path)
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    staging = ""
    tree: Optional[_LocalTree] = None
    held: List[Tuple[_Key, str, str, int]] = []  # with settle: the files not yet in place
    try:
        sweep_parts(pfd)
        swept = [(os.fstat(pfd).st_dev, os.fstat(pfd).st_ino)]
        if single:
            root = os.dup(pfd)
        elif os.path.lexists(dest):
            root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        else:
            staging = _part_name()
            os.mkdir(staging, 0o777, dir_fd=pfd)
            root = os.open(staging, _DIR_FLAGS, dir_fd=pfd)
        try:
            tree = _LocalTree(root, swept)
        except BaseException:
            os.close(root)
            raise
        tf = _TarReader(read)
        while True:
            member = tf.next()
            if tree.pending is not None:
                _, _, pending_name, pending_size = tree.pending
                if tf.failed:  # the sandbox could not read it whole: what was there stays
                    tree.discard()
                    files, written = files - 1, written - pending_size
                elif settle is not None:
                    held.append(tree.pending)
                    tree.pending = None
                else:
                    try:
                        tree.commit()
                    except OSError as exc:
                        files, written = files - 1, written - pending_size
                        refused.append({"path": pending_name, "message": f"refused: {exc}"})
            tf.failed = False
            if member is None:
                break
            if member.isfile():
                if size + member.size > max_bytes:
                    raise CommandFailed(
                        f"the download is larger than max_bytes ({max_bytes} bytes); "
                        "nothing more was written: pass a larger max_bytes, or exclude= "
                        "what is not needed"
                    )
                size += member.size
            name = member.name
            if single:
                if not (member.isfile() or member.issym()):
                    raise CommandFailed("the sandbox sent something other than one file")
                member = member.replace(name=os.path.basename(dest), deep=False)
            sent, name = name, member.name
            try:
                parts, mode = _admit(member)
                mtime = member.mtime if member.mtime is not None else 0
                if member.isfile():
                    tree.file(parts, tf, 0o644 if mode is None else mode, mtime, sent,
                              member.size)
                    files, written = files + 1, written + member.size
                    if progress is not None:
                        progress(size, total)
                elif member.isdir():
                    tree.directory(parts, None if mode is None else mode & 0o777, mtime)
                    dirs += 1
                else:
                    tree.symlink(parts, member.linkname, name)
            except (ValueError, OSError) as exc:
                refused.append({"path": name, "message": f"refused: {exc}"})
        if settle is not None:
            drop = settle()
            for one in held:  # (one put in place already is gone from under its name)
                tree.pending = one
                _, _, pending_name, pending_size = one
                try:
                    if pending_name in drop:
                        tree.discard()
                    else:
                        tree.commit()
                        continue
                except OSError as exc:
                    refused.append({"path": pending_name, "message": f"refused: {exc}"})
                files, written = files - 1, written - pending_size
            held.clear()
        links = tree.links(refused)
    except BaseException:
        try:
            if tree is not None:
                leftover: List[Optional[Tuple[_Key, str, str, int]]] = [tree.pending, *held]
                for left in leftover:
                    tree.pending = left
                    try:
                        tree.discard()
                    except OSError:
                        pass
                tree.close()
                os.close(tree.root)
            if staging:
                _remove_tree(pfd, staging)
        except OSError as exc:  # the error that stopped the download is the one to raise
            log.warning("e2b_provider: the staging directory of %s could not be removed: %s",
                        dest, exc)
        finally:
            os.close(pfd)
        raise
    try:
        tree.close()
        os.close(tree.root)
        if staging:
            try:
                os.rename(staging, os.path.basename(dest), src_dir_fd=pfd, dst_dir_fd=pfd)
            except OSError as exc:
                _remove_tree(pfd, staging)
                raise OSError(exc.errno, f"{dest} could not be put in place ({exc.strerror}); "
                              "nothing was written", dest) from None
    finally:
        os.close(pfd)
    return TransferSummary(files=files, dirs=dirs, symlinks=links, bytes=written)


class Trees:
    """Upload and download files and directory trees (arguments already validated)."""

    def __init__(self, ctx: ProviderContext, files: Files) -> None:
        self._ctx = ctx
        self._files = files

    def upload(
        self,
        sid: str,
        local_path: str,
        remote_path: str,
        *,
        exclude: Sequence[str],
        cancel: Optional[CancelToken],
        progress: Optional[Progress],
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
        """Send ``local_path`` to ``remote_path``; what was written, and the entries the
        sandbox refused (each ``{"path", "message", ...}``)."""
        single_name = posixpath.basename(remote_path)
        plan = plan_upload(local_path, single_name, exclude)
        dest = remote_path if plan.is_dir else posixpath.dirname(remote_path) or "/"
        skills = scripts.is_skills_path(dest)
        if skills and self._files.lacks_python(sid):
            return self._upload_by_files(sid, plan, dest, cancel, progress)
        deadline = Deadline.after(tree_bound(plan.total))
        try:
            return self._ctx.on_target(
                sid, cancel,
                lambda t: self._upload(t, plan, dest, cancel, deadline, progress),
                need=min(86400.0, tree_bound(plan.total)),
            )
        except _NoPython:
            self._files.mark_missing(sid, "python3")
            return self._upload_by_files(sid, plan, dest, cancel, progress)

    def _upload_by_files(
        self,
        sid: str,
        plan: UploadPlan,
        dest: str,
        cancel: Optional[CancelToken],
        progress: Optional[Progress],
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
        """An upload under ``/skills`` without ``python3`` (whose extractor applies root's
        rules to a tree): each regular file written as :meth:`Files.write` writes one
        there (same rules, each whole); symbolic links and empty directories are reported
        as not written."""
        refused: List[Dict[str, Any]] = []
        unsent = Unsent()
        files = dirs = 0
        done = 0
        parents = {posixpath.dirname(i.rel) for i in plan.items if not i.is_dir}
        if progress is not None:
            progress(0, plan.total)
        walk = _walk(plan, unsent)  # each file read as the stream reads it
        try:
            for item, fd in walk:
                path = posixpath.join(dest, item.rel) if item.rel else dest
                if fd == _SKIP:
                    continue
                if item.is_dir:
                    if item.rel in parents or any(p.startswith(item.rel + "/")
                                                  for p in parents):
                        dirs += 1
                        continue
                    why = "an empty directory under /skills needs python3 in the sandbox"
                elif item.link:
                    why = "a symbolic link under /skills needs python3 in the sandbox"
                else:
                    data = _read_upto(fd, item.size + 1)
                    if len(data) < item.size:  # whole or not at all
                        refused.append({"path": path, "message": "not sent: it shrank while "
                                        "it was uploaded"})
                        continue
                    try:
                        self._files.write(sid, path, data[: item.size], cancel)
                    except (CommandFailed, UnsafePath) as exc:
                        refused.append({"path": path, "message": str(exc)})
                        continue
                    files += 1
                    done += item.size
                    if progress is not None:
                        progress(done, plan.total)
                    continue
                refused.append({"path": path, "message": f"not written: {why}"})
        finally:
            walk.close()
        summary = TransferSummary(files=files, dirs=dirs, symlinks=0, bytes=done)
        return summary, unsent.failures(dest) + refused

    def _upload(
        self,
        target: Target,
        plan: UploadPlan,
        dest: str,
        cancel: Optional[CancelToken],
        deadline: Deadline,
        progress: Optional[Progress],
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
        fifo = scripts.staging_path()
        op_id = uuid.uuid4().hex
        end = ".capybara-end-" + uuid.uuid4().hex
        skills = scripts.is_skills_path(dest)
        bound = f"{max(1.0, deadline.remaining()) + 60.0:.0f}"
        sid = target.sandbox_id
        settle_s = min(5.0, self._ctx.bounds.kill)
        argv = ["timeout", "-k", "5", bound, "/bin/sh",
                *scripts.tree_upload_args(dest, fifo, end, skills, op_id, source("file_agent"),
                                          prepare=self._files.needs_staging(sid))]

        def body(helper: Helper) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
            length = tar_length(plan, end)  # while the sandbox makes the FIFO
            unsent = Unsent()
            ready = helper.first_line() == b"ready"
            self._files.staged(sid, ready)
            if not ready:
                helper.finish()
                if skills and helper.exit_code == scripts.MISSING_TOOL_EXIT:
                    raise _NoPython()
                raise _helper_failed("the upload could not start", helper, dest)
            helper.posted = True
            try:
                helper.envd.upload_stream(
                    fifo,
                    tar_stream(plan, end, progress=progress, cancel=helper.guard,
                               unsent=unsent),
                    user=scripts.ROOT_USER,
                    token=helper.guard,
                    timeout=max(1.0, deadline.remaining()),
                    length=length,
                )
            except E2BHttpError as exc:
                if exc.status == 502:
                    raise
                helper.finish()
                raise _upload_failed(f"the upload was refused: HTTP {exc.status}", helper,
                                     dest) from None
            except Exception:
                # cut (a cancel, the bound, a broken connection): if all of it had gone,
                # the upload is done
                if not (helper.settle(settle_s) and helper.exit_code == 0):
                    raise
                summary = _summary(helper)
                if summary is None or not summary.get("complete"):
                    raise
                return _outcome(plan, summary, helper, dest, unsent)
            helper.finish()
            summary = _summary(helper)
            if summary is None or not summary.get("complete"):
                raise _upload_failed("the upload did not arrive whole", helper, dest)
            return _outcome(plan, summary, helper, dest, unsent)

        return self._files.ops.helped(target, op_id, argv, fifo, cancel, deadline, body)

    def download(
        self,
        sid: str,
        remote_path: str,
        local_path: str,
        *,
        exclude: Sequence[str],
        max_bytes: int,
        cancel: Optional[CancelToken],
        progress: Optional[Progress],
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
        """Fetch ``remote_path`` to ``local_path``; what was written, and the entries the
        sandbox could not read."""
        deadline = Deadline.after(tree_bound(max_bytes))

        def run(shell: bool) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
            # the lease is asked to last the base bound only: how much comes is not known
            # yet (a lease that would end sooner is renewed first)
            return self._ctx.on_target(
                sid, cancel,
                lambda t: self._download(t, remote_path, local_path, exclude, max_bytes,
                                         cancel, deadline, progress, shell),
                need=_BASE_S,
            )

        if self._files.lacks_python(sid):
            return run(True)
        try:
            return run(False)
        except _NoPython:
            self._files.mark_missing(sid, "python3")
            return run(True)

    def _download(
        self,
        target: Target,
        remote_path: str,
        local_path: str,
        exclude: Sequence[str],
        max_bytes: int,
        cancel: Optional[CancelToken],
        deadline: Deadline,
        progress: Optional[Progress],
        shell: bool = False,
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
        """``shell``: GNU ``tar`` packs the tree
        (:data:`~e2b_provider.protocol.scripts.PACK_SCRIPT`), for a sandbox without ``python3``;
        else the file agent's ``pack``."""
        op_id = uuid.uuid4().hex
        if shell:
            args = scripts.pack_args(remote_path, exclude)
            argv = ["/bin/sh", args[0], args[1], scripts.fileop_name(op_id), *args[3:]]
        else:
            argv = ["python3", "-I", "-S", "-X", "utf8", "-c", source("file_agent"), "pack",
                    remote_path, scripts.fileop_name(op_id), *exclude]

        def body(helper: Helper) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
            reader = _Chunks(helper.next_output)
            line = reader.read_line(64 * 1024)
            try:
                head = json.loads(line.decode("utf-8", "surrogateescape"))
            except ValueError:
                head = None
            if not isinstance(head, dict):
                helper.finish()
                if not shell and helper.exit_code in (126, 127):
                    raise _NoPython()
                raise _pack_failed(remote_path, helper, None)
            if "absent" in head:
                helper.finish()
                raise _pack_failed(remote_path, helper, head["absent"])
            refused: List[Dict[str, Any]] = []

            def shrank() -> List[str]:
                helper.finish()
                return shrank_members(helper.stderr_lines())

            summary = extract_stream(
                reader.read, local_path, single=bool(head.get("single")),
                max_bytes=max_bytes, refused=refused, progress=progress,
                total=_int(head.get("total")), settle=shrank if shell else None,
            )
            helper.finish()
            if shell:  # tar's status: 2 when some entries could not be read
                if helper.exit_code not in (0, 1, 2):
                    raise _pack_failed(remote_path, helper, None)
                return summary, _unread(helper, remote_path) + refused
            tail = _stderr_json(helper) or {}
            if helper.exit_code not in (0, 1):
                raise _pack_failed(remote_path, helper, None)
            return summary, list(tail.get("errors") or []) + refused

        return self._files.ops.helped(
            target, op_id, argv, "", cancel, deadline, body, user=scripts.SANDBOX_USER
        )


def _outcome(
    plan: UploadPlan, summary: Dict[str, Any], helper: Helper, dest: str, unsent: Unsent
) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
    """What a complete upload wrote, and the entries not sent (``unsent``) or that the
    sandbox refused."""
    if summary.get("whole"):  # a new destination, written as one: all that was sent is there
        return unsent.less(plan.summary()), unsent.failures(dest)
    if summary.get("merged"):  # merged into what was there by the shell: E lines refused
        said = helper.outcome().stdout.splitlines()
        refused = [
            {"path": posixpath.join(dest, line[2:].decode("utf-8", "surrogateescape")),
             "message": "not written: something there could not be replaced by it"}
            for line in said if line.startswith(b"E ")
        ]
        whole = unsent.less(plan.summary())
        return (attrs.evolve(whole, files=max(0, whole.files - len(refused))),
                unsent.failures(dest) + refused)
    refused = []
    for e in summary.get("errors") or []:
        if isinstance(e, dict) and isinstance(e.get("path"), str) and not e["path"].startswith(
            "/"
        ):  # the extractor names a member by its path in the tree
            e = dict(e, path=posixpath.join(dest, e["path"].rstrip("/")))
        refused.append(e)
    return _transfer(summary), unsent.failures(dest) + refused


class _NoPython(Exception):
    """The sandbox has no ``python3``, which this path needs: take the shell's."""


#: What ``find`` or ``tar`` says of an entry it could not read: ``find: './x': reason`` or
#: ``tar: x: Cannot open: reason``.
_UNREAD = re.compile(r"(?:find: '\./(.*)'|tar: (.*?)(?:: Cannot \w+)?): ([^:]+)")


def _unread(helper: Helper, remote_path: str) -> List[Dict[str, Any]]:
    """The entries :data:`~e2b_provider.protocol.scripts.PACK_SCRIPT` reported as not read, as the
    file agent's ``pack`` reports them (``{"path", "message"}``)."""
    out: List[Dict[str, Any]] = []
    for line in helper.stderr_lines():
        m = _UNREAD.fullmatch(line.decode("utf-8", "surrogateescape").strip())
        if m is None or "Exiting with failure" in line.decode("utf-8", "replace"):
            continue
        rel = m.group(1) if m.group(1) is not None else m.group(2)
        said = m.group(3)
        shrank = _SHRANK.fullmatch(m.group(0))
        if shrank is not None:  # not written: what was there stays
            rel, said = shrank.group(1), "the file shrank while it was read"
        out.append({"path": posixpath.join(remote_path, rel), "message": said})
    return out


#: What GNU ``tar`` says of a file that shrank while it was read.
_SHRANK = re.compile(r"(?:[^:]*/)?tar: (.*): File shrank by [0-9]+ bytes; padding with zeros")


def shrank_members(stderr_lines: Sequence[bytes]) -> List[str]:
    """The members GNU ``tar`` (:data:`~e2b_provider.protocol.scripts.PACK_SCRIPT`'s) says it sent
    padded with zeros (they shrank while it read them), from its standard error."""
    out = []
    for line in stderr_lines:
        m = _SHRANK.fullmatch(line.decode("utf-8", "surrogateescape").strip())
        if m is not None:
            out.append(m.group(1))
    return out


def _stderr_json(helper: Helper) -> Optional[Dict[str, Any]]:
    """The last line of the helper's standard error, as a JSON object (or None)."""
    lines = helper.stderr_lines()
    if not lines:
        return None
    try:
        value = json.loads(lines[-1].decode("utf-8", "surrogateescape"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _summary(helper: Helper) -> Optional[Dict[str, Any]]:
    for line in reversed(helper.outcome().stdout.splitlines()):
        try:
            value = json.loads(line.decode("utf-8", "surrogateescape"))
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _refusal(helper: Helper) -> Optional[E2BProviderError]:
    """The error for an upload the sandbox refused as a whole (``/skills`` rules), if so."""
    summary = _summary(helper)
    if summary is None or not summary.get("refused"):
        return None
    errors = summary.get("errors") or [{}]
    first = errors[0] if isinstance(errors[0], dict) else {}
    message = str(first.get("message") or "the path is not safe for root")
    return unsafe_path(message.removeprefix("refused: "))


def _transfer(summary: Dict[str, Any]) -> TransferSummary:
    try:
        return TransferSummary(
            files=int(summary.get("files", 0)),
            dirs=int(summary.get("dirs", 0)),
            symlinks=int(summary.get("symlinks", 0)),
            bytes=int(summary.get("bytes", 0)),
        )
    except (TypeError, ValueError):
        raise ProtocolError("the sandbox sent a malformed upload summary") from None


def _upload_failed(what: str, helper: Helper, dest: str) -> E2BProviderError:
    """The error for an upload to ``dest`` that did not complete: refused under
    ``/skills``, a destination the user may not write into, or what its helper said."""
    refused = _refusal(helper)
    if refused is not None:
        return refused
    summary = _summary(helper) or {}
    if summary.get("unwritable"):
        first = (summary.get("errors") or [{}])[0]
        said = str(first.get("message") or "it cannot be written") if isinstance(
            first, dict) else "it cannot be written"
        denied = isinstance(first, dict) and first.get("error") in ("EACCES", "EPERM")
        return CommandFailed(
            f"cannot upload into {dest}: {said[:1].lower()}{said[1:]}; "
            + (ACCESS_HINT if denied else "upload to a directory, or to a path that does "
               "not exist yet")
        )
    return _helper_failed(what, helper, dest)


def _helper_failed(what: str, helper: Helper, dest: str) -> CommandFailed:
    """The error for an upload to ``dest`` whose helper failed: why, in the user's terms
    (no temporary or staging name, no program's traceback), from its standard error."""
    text = helper.outcome().stderr.decode("utf-8", "replace")
    if "Traceback (most recent call last)" in text:  # a crash: its last line says what
        text = text.strip().splitlines()[-1]
    code = helper.exit_code
    if code in (126, 127) and "python3" in text:
        return CommandFailed(f"{what}: the sandbox has no python3", exit_code=code)
    reason = script_reason(text[-2000:], code)
    if reason.startswith(("permission denied", "operation not permitted")):
        return CommandFailed(f"permission denied (cannot create {dest}); {ACCESS_HINT}",
                             exit_code=code)
    return CommandFailed(f"{what}: {reason}", exit_code=code)


def _pack_failed(
    remote_path: str, helper: Helper, absent: Optional[Dict[str, Any]]
) -> CommandFailed:
    if isinstance(absent, dict):
        if absent.get("missing"):
            return CommandFailed(f"{remote_path} does not exist")
        if "noentry" in absent:
            return CommandFailed(
                f"permission denied: user 'sandbox' may not enter {absent['noentry']}, so "
                f"{remote_path} cannot be read"
            )
        said = str(absent.get("message", "cannot be read"))
        return CommandFailed(
            f"{remote_path}: {said}"
            + ("; only files, directories and symbolic links are downloaded"
               if said.startswith("it is ") else "")
        )
    code = helper.exit_code
    said = helper.outcome().stderr.decode("utf-8", "replace").strip()
    if code == 3:
        return CommandFailed(f"{remote_path} does not exist")
    if code == scripts.NO_ENTRY_EXIT:
        return CommandFailed(
            f"permission denied: user 'sandbox' may not enter {said or 'a directory on the way'}"
            f", so {remote_path} cannot be read"
        )
    if code == scripts.CLOSED_DIR_EXIT:
        return CommandFailed(f"permission denied: user 'sandbox' may not read {remote_path}")
    if code == scripts.NOT_REGULAR_EXIT:
        return CommandFailed(f"{said or remote_path + ' is not a file'}: only files, "
                             "directories and symbolic links are downloaded")
    if code == scripts.MISSING_TOOL_EXIT:
        return CommandFailed("the sandbox has neither python3 nor tar, one of which "
                             "downloads need", exit_code=code)
    if code in (126, 127):
        return CommandFailed("the sandbox has no python3, which downloads need",
                             exit_code=code)
    text = helper.outcome().stderr.decode("utf-8", "replace").strip()[-300:]
    return CommandFailed(
        f"the download of {remote_path} failed (status {helper.exit_code})"
        + (f": {text}" if text else ""),
        exit_code=helper.exit_code,
    )
