"""A tar stream from the sandbox written under a local path, safely.

This module owns :func:`extract_stream`: each member goes through the rules of
:mod:`tarfile`'s ``data`` filter (no absolute names, no ``..``, no device, and no link
leading outside the target in the finished tree — the sandbox is not trusted) and is
written through directory descriptors that never follow a link (:class:`_LocalTree`).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat as stat_mod
import tarfile
from collections import OrderedDict
from typing import Any, Callable, Collection, Dict, Iterable, List, Optional, Set, Tuple

from ..errors import CommandFailed
from ..models import TransferSummary
from .local_fs import DIR_OPEN, O_CLOEXEC, part_name, remove_tree, sweep_parts
from .tar_codec import CHUNK, Progress, TarReader

log = logging.getLogger("e2b_provider")

#: The most symbolic links one link may lead through (the kernel's ``MAXSYMLINKS``).
_MAX_HOPS = 40
#: The longest member name written (``PATH_MAX`` less its NUL): deeper is refused.
MAX_NAME_BYTES = 4095

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
                        fd = os.open("..", os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC,
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
            fd = os.open(parts[-1], DIR_OPEN, dir_fd=parent)
        except FileNotFoundError:
            if not make:
                raise
            os.mkdir(parts[-1], 0o777, dir_fd=parent)
            made = True
            fd = os.open(parts[-1], DIR_OPEN, dir_fd=parent)
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
        tmp = part_name()
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
                    piece = src.read(CHUNK)  # as it came: no copy on this side
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
        _put_in_place(tmp, parts[-1], self.dir_fd(parts[:-1]))

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
                _put_in_place(tmp, parts[-1], dfd)
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


def _put_in_place(tmp: str, name: str, dir_fd: int) -> None:
    """Rename the temporary file ``tmp`` to ``name`` in directory ``dir_fd``; if that
    fails, remove ``tmp`` and raise."""
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(tmp, dir_fd)
        raise


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
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
    staging = ""
    tree: Optional[_LocalTree] = None
    held: List[Tuple[_Key, str, str, int]] = []  # with settle: the files not yet in place
    try:
        sweep_parts(pfd)
        swept = [(os.fstat(pfd).st_dev, os.fstat(pfd).st_ino)]
        if single:
            root = os.dup(pfd)
        elif os.path.lexists(dest):
            root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
        else:
            staging = part_name()
            os.mkdir(staging, 0o777, dir_fd=pfd)
            root = os.open(staging, DIR_OPEN, dir_fd=pfd)
        try:
            tree = _LocalTree(root, swept)
        except BaseException:
            os.close(root)
            raise
        tf = TarReader(read)
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
                remove_tree(pfd, staging)
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
                remove_tree(pfd, staging)
                raise OSError(exc.errno, f"{dest} could not be put in place ({exc.strerror}); "
                              "nothing was written", dest) from None
    finally:
        os.close(pfd)
    return TransferSummary(files=files, dirs=dirs, symlinks=links, bytes=written)
