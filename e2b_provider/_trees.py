"""Whole trees (or single files) moved between this machine and a sandbox as tar streams.

This module owns :class:`Trees`, the provider's part behind ``upload`` and ``download``,
and the two ends of each stream on this machine: :func:`plan_upload` and
:func:`tar_stream` (a local file or directory walked without following symbolic links,
written as a POSIX tar stream piece by piece, so memory stays flat whatever the size and
the number of files; each entry opened through directory descriptors, never through a
link, and checked to be what was planned: what is not any more is left out), and
:func:`extract_stream` (a tar stream from the sandbox written under the local target
through :mod:`tarfile`'s ``data`` filter: no absolute names, no ``..``, no link or device
leading outside the target — the sandbox is not trusted).

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
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Sequence, Set, Tuple

import attrs

from . import _scripts as scripts
from ._context import ProviderContext
from ._files import ACCESS_HINT, Files, _Helper, unsafe_path
from ._messages import script_reason
from .cancel import CancelToken, Deadline
from .errors import (
    CommandFailed,
    E2BHttpError,
    E2BProviderError,
    InvalidArgument,
    ProtocolError,
    UnsafePath,
)
from .models import Target, TransferSummary
from .sandbox_side import source

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
            if not block or block == bytes(_BLOCK):
                return None
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


def _filter() -> Callable[..., Any]:
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:
        raise InvalidArgument(
            "downloads need tarfile's extraction filters (Python 3.9.17+, 3.10.12+, "
            "3.11.4+ or 3.12+)"
        )
    return data_filter  # type: ignore[no-any-return]


class _LocalTree:
    """Writes members under one local directory through directory descriptors opened
    without following a symbolic link (``O_NOFOLLOW`` on every component), so no link —
    planted by the archive or already there — is ever gone through, however long its
    path: the ``data`` filter decides what may be written, this decides how."""

    def __init__(self, base: str) -> None:
        self.root = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.open: Dict[Tuple[str, ...], int] = {}
        self.dir_modes: List[Tuple[Tuple[str, ...], Optional[int], float]] = []

    def close(self) -> None:
        """Give directories their modes (deepest first), then close every descriptor."""
        for parts, mode, mtime in sorted(self.dir_modes, key=lambda d: -len(d[0])):
            try:
                fd = self.dir_fd(parts)
                if mode is not None:
                    os.chmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            except OSError:
                pass
        for fd in self.open.values():
            os.close(fd)
        self.open.clear()
        os.close(self.root)

    def dir_fd(self, parts: Tuple[str, ...]) -> int:
        if not parts:
            return self.root
        fd = self.open.get(parts)
        if fd is not None:
            return fd
        parent = self.dir_fd(parts[:-1])
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(parts[-1], flags, dir_fd=parent)
        except FileNotFoundError:
            os.mkdir(parts[-1], 0o777, dir_fd=parent)
            fd = os.open(parts[-1], flags, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise OSError(exc.errno, "a symbolic link or file is in the way",
                              "/".join(parts)) from None
            raise
        if len(self.open) >= 64:
            for old in self.open.values():
                os.close(old)
            self.open.clear()
        self.open[parts] = fd
        return fd

    def _replace(self, parts: Tuple[str, ...], make: Callable[[int, str], None]) -> None:
        dfd = self.dir_fd(parts[:-1])
        try:
            old = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat_mod.S_ISDIR(old.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a directory is in the way", "/".join(parts))
        tmp = f".capybara-part-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            make(dfd, tmp)
            os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise

    def file(self, parts: Tuple[str, ...], src: Any, mode: int, mtime: float) -> None:
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

        self._replace(parts, make)

    def symlink(self, parts: Tuple[str, ...], target: str) -> None:
        self._replace(parts, lambda dfd, tmp: os.symlink(target, tmp, dir_fd=dfd))

    def directory(self, parts: Tuple[str, ...], mode: Optional[int], mtime: float) -> None:
        self.dir_fd(parts)
        self.dir_modes.append((parts, mode, mtime))


def _parts(name: str) -> Tuple[str, ...]:
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if not parts or ".." in parts:
        raise ValueError(f"{name!r} leaves the destination")
    return parts


def extract_stream(
    read: Callable[[int], bytes],
    local_path: str,
    *,
    single: bool,
    max_bytes: int,
    refused: List[Dict[str, Any]],
    progress: Optional[Progress] = None,
    total: Optional[int] = None,
) -> TransferSummary:
    """Write the tar stream ``read`` gives under ``local_path``, safely. ``read(n)`` gives
    at least one and at most ``n`` bytes, ``b""`` at the end (as a raw file's ``read``).

    With ``single``, the stream holds one member, written to ``local_path`` itself;
    otherwise ``local_path`` is the directory the members are written under (made if
    missing). Each member goes through :mod:`tarfile`'s ``data`` filter (leading ``/``
    stripped; ``..``, links leading outside or to an absolute path, devices, hard links
    refused; set-id and group/other write bits cleared), then is written through
    directory descriptors that never follow a link (:class:`_LocalTree`); each file to a
    temporary name in its directory, renamed into place once whole. A member refused on
    the way is not written: it is added to ``refused``.

    Raises:
        CommandFailed: the stream holds more than ``max_bytes`` of content.
        tarfile.TarError: the stream is not a tar stream.
    """
    data_filter = _filter()
    files = dirs = links = size = 0
    dest = os.path.abspath(local_path)
    base = os.path.dirname(dest) if single else dest
    os.makedirs(base, exist_ok=True)
    tree = _LocalTree(base)
    tf = _TarReader(read)
    try:
        while True:
            member = tf.next()
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
            if single:
                if not (member.isfile() or member.issym()):
                    raise CommandFailed("the sandbox sent something other than one file")
                member = member.replace(name=os.path.basename(dest), deep=False)
            name = member.name
            try:
                member = data_filter(member, base)
                parts = _parts(member.name)
                mode = member.mode  # the filter leaves None where none applies
                mtime = member.mtime if member.mtime is not None else 0
                if member.isfile():
                    tree.file(parts, tf,
                              0o644 if mode is None else mode & 0o777, mtime)
                    files += 1
                    if progress is not None:
                        progress(size, total)
                elif member.isdir():
                    tree.directory(parts, None if mode is None else mode & 0o777, mtime)
                    dirs += 1
                elif member.issym():
                    tree.symlink(parts, member.linkname)
                    links += 1
                else:
                    raise ValueError("not a file, directory or symbolic link")
            except (tarfile.FilterError, ValueError, OSError) as exc:
                refused.append({"path": name, "message": f"refused: {exc}"})
    finally:
        tree.close()
    return TransferSummary(files=files, dirs=dirs, symlinks=links, bytes=size)


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

        def body(helper: _Helper) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
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

        return self._files._helped(target, op_id, argv, fifo, cancel, deadline, body)

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
        """``shell``: GNU ``tar`` packs the tree (:data:`~._scripts.PACK_SCRIPT`), for a
        sandbox without ``python3``; else the file agent's ``pack``."""
        op_id = uuid.uuid4().hex
        if shell:
            args = scripts.pack_args(remote_path, exclude)
            argv = ["/bin/sh", args[0], args[1], scripts.fileop_name(op_id), *args[3:]]
        else:
            argv = ["python3", "-I", "-S", "-X", "utf8", "-c", source("file_agent"), "pack",
                    remote_path, scripts.fileop_name(op_id), *exclude]

        def body(helper: _Helper) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
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
            summary = extract_stream(
                reader.read, local_path, single=bool(head.get("single")),
                max_bytes=max_bytes, refused=refused, progress=progress,
                total=_int(head.get("total")),
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

        return self._files._helped(
            target, op_id, argv, "", cancel, deadline, body, user=scripts.SANDBOX_USER
        )


def _outcome(
    plan: UploadPlan, summary: Dict[str, Any], helper: _Helper, dest: str, unsent: Unsent
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


def _unread(helper: _Helper, remote_path: str) -> List[Dict[str, Any]]:
    """The entries :data:`~._scripts.PACK_SCRIPT` reported as not read, as the file
    agent's ``pack`` reports them (``{"path", "message"}``)."""
    out: List[Dict[str, Any]] = []
    for line in helper.stderr_lines():
        m = _UNREAD.fullmatch(line.decode("utf-8", "surrogateescape").strip())
        if m is None or "Exiting with failure" in line.decode("utf-8", "replace"):
            continue
        rel = m.group(1) if m.group(1) is not None else m.group(2)
        out.append({"path": posixpath.join(remote_path, rel), "message": m.group(3)})
    return out


def _stderr_json(helper: _Helper) -> Optional[Dict[str, Any]]:
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


def _summary(helper: _Helper) -> Optional[Dict[str, Any]]:
    for line in reversed(helper.outcome().stdout.splitlines()):
        try:
            value = json.loads(line.decode("utf-8", "surrogateescape"))
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _refusal(helper: _Helper) -> Optional[E2BProviderError]:
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


def _upload_failed(what: str, helper: _Helper, dest: str) -> E2BProviderError:
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


def _helper_failed(what: str, helper: _Helper, dest: str) -> CommandFailed:
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
    remote_path: str, helper: _Helper, absent: Optional[Dict[str, Any]]
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
