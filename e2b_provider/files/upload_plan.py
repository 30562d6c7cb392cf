"""What an upload sends from this machine, and each entry opened as planned.

This module owns :func:`plan_upload` (a local file or directory walked without following
symbolic links: each directory listed through a descriptor opened by name in its
parent's), the :class:`UploadPlan` it makes (compact arrays, not an object per entry), the
:class:`Unsent` record of what was not sent as planned, and :func:`opened_entries`, which opens each
entry of a plan when it is sent and checks it to be what was planned (a file or directory
replaced by a link after planning is never read).
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import posixpath
import stat as stat_mod
from array import array
from typing import Any, Dict, Generator, Iterator, List, Optional, Sequence, Set, Tuple

import attrs

from ..errors import InvalidArgument
from ..models import TransferSummary
from .local_fs import DIR_OPEN, O_CLOEXEC

log = logging.getLogger("e2b_provider")

#: A file of a tree is opened with these flags (a directory with
#: :data:`~e2b_provider.files.local_fs.DIR_OPEN`), by name in its directory's descriptor:
#: never through a symbolic link, nor waiting, should a FIFO have taken its place; each is
#: then checked to be what was planned (see :func:`opened_entries`).
_FILE_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | O_CLOEXEC
#: Directory descriptors a walk of a tree keeps open at most (others are opened again).
_OPEN_DIRS = 32
#: An entry's kind, in a plan.
_FILE, _DIR, _LINK = 0, 1, 2
#: What :func:`opened_entries` gives for a directory or link to send as planned, and for an
#: entry not to be sent.
SENT, SKIP = -1, -2
#: Why an entry is not sent: it is not what was planned, or is not there any more.
_REPLACED = "it was replaced or removed on this machine after the upload listed it"


@attrs.frozen
class Item:
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
    :class:`Item` when it is reached. Each entry keeps its device and inode, so that
    what is sent can be checked to be what was planned (:func:`opened_entries`).
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
    def items(self) -> Iterator[Item]:
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
    """What :func:`~e2b_provider.files.tar_codec.tar_stream` did not send as planned: each
    entry left out (or sent damaged), as ``(relative name, why)``, and what the entries left
    out add up to (their own and those below a directory left out, which are not named)."""

    entries: List[Tuple[str, str]] = attrs.Factory(list)
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0

    def left_out(self, item: Item, why: Optional[str]) -> None:
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
    fd = os.open(name, DIR_OPEN if is_dir else _FILE_OPEN, dir_fd=dir_fd)
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


def _entries(plan: UploadPlan, dirs: _Dirs) -> Iterator[Tuple[int, Item]]:
    """Each entry of ``plan`` as an :class:`Item`, with its index; ``dirs`` follows."""
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
        yield i, Item(rel, modes[i], mtimes[i], sizes[i],
                       links.get(i, "") if kind == _LINK else "", kind == _DIR)


def opened_entries(plan: UploadPlan, unsent: Unsent) -> Generator[Tuple[Item, int], None, None]:
    """Each entry of ``plan`` in order, opened to be sent: a file with its descriptor
    (closed when the next entry is asked for), a directory or link with :data:`SENT`.

    Nothing is opened by path: each directory by name in its parent's descriptor, each
    file by name in its directory's, never through a symbolic link, and each checked to
    be what was planned (device and inode; a file's size). An entry that is not, or
    could not be opened, is given with :data:`SKIP` (and so is everything below a
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
                    yield item, SKIP
                    continue
                name = plan.names[i]
            if item.link:
                yield item, SENT
                continue
            if i in plan.left_out:  # replaced while it was listed
                unsent.left_out(item, f"not sent: {plan.left_out[i]}")
                dirs.left_out(i)
                yield item, SKIP
                continue
            try:
                fd = _open_planned(name, dfd, item.is_dir, ids[2 * i], ids[2 * i + 1],
                                   -1 if item.is_dir else item.size)
            except (OSError, _Changed) as exc:
                unsent.left_out(item, f"not sent: {_why(exc)}")
                if item.is_dir:
                    dirs.left_out(i)
                yield item, SKIP
                continue
            if item.is_dir:
                os.close(fd)
                yield item, SENT
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
