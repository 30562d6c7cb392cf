"""``cp`` with ``-`` on one side, as ``docker cp``: a sandbox file or tree written to our
standard output as a tar stream, or a tar stream on our standard input extracted into a
sandbox directory.

Both go through a private temporary directory on this machine and the library's own tree
transfers, with their safety checks; memory stays flat whatever the size:

* to standard output: the library's ``download`` writes the copy under the temporary
  directory (the sandbox is not trusted: no absolute name, no ``..``, no device, no link
  leading outside; see :func:`~e2b_provider.files.local_extract.extract_stream`), then
  :mod:`tarfile` writes it out, its entries named from the source's base name (``dir/``,
  ``dir/a.txt``), links as links.
* from standard input: :mod:`tarfile` reads the stream (plain, gzip, bzip2 or xz), each
  member through its ``data`` filter where this Python has it, and the library's
  :func:`~e2b_provider.files.local_extract.extract_stream` writes it under the temporary
  directory by the same rules as a download. A stream with any member refused is refused
  whole: nothing reaches the sandbox. Then the library's ``upload`` sends the tree into the
  sandbox directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tarfile
import tempfile
from typing import (
    Any,
    BinaryIO,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
)

from ..errors import E2BProviderError, FilesFailed
from ..files.local_extract import extract_stream
from ..files.tar_codec import CHUNK, Chunks
from ..models import SandboxHandle
from ..provider import E2BSandboxProvider
from .exits import UsageError

#: :mod:`tarfile`'s ``data`` filter, where this Python has it (3.9.17 and later).
_DATA_FILTER: Optional[Callable[[tarfile.TarInfo, str], tarfile.TarInfo]] = getattr(
    tarfile, "data_filter", None)
#: What that filter raises (none without it: the library's rules alone refuse then).
_FILTER_ERRORS: Tuple[Type[tarfile.TarError], ...] = tuple(
    getattr(tarfile, name) for name in ("FilterError",) if hasattr(tarfile, name))
_BLOCK = 512
#: The longest list of refused entries an error names.
_NAMED = 3


@contextlib.contextmanager
def _private_dir() -> Iterator[str]:
    """A temporary directory only we may enter, removed with all in it afterwards."""
    top = tempfile.mkdtemp(prefix="e2b-provider-cp-")
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def tar_to_stdout(p: E2BSandboxProvider, h: SandboxHandle, remote: str, *,
                  exclude: Sequence[str], progress: Callable[[int, Optional[int]], None],
                  where: str) -> None:
    """Write ``remote`` (a file or a directory of the sandbox) to standard output as a tar
    stream whose entries are named from its base name, as ``docker cp SRC -`` does
    (``where``: how the user named it).

    Raises:
        E2BProviderError: the copy failed; or some entries were left out (what could not
            be read, and what the download refused: links to absolute paths or leading
            outside, devices), after the stream of the others was written, as ``tar``
            writes what it could read and then fails.
    """
    name = remote.rstrip("/").rpartition("/")[2] or "."
    with _private_dir() as top:
        copy = os.path.join(top, "copy")
        left_out: Optional[FilesFailed] = None
        try:
            p.download(h, remote, copy, exclude=exclude, progress=progress)
        except FilesFailed as exc:  # the rest was copied: it is written out, as tar does
            if not os.path.lexists(copy):
                raise
            left_out = exc
        except tarfile.TarError as exc:  # the sandbox's stream was cut or damaged
            raise E2BProviderError(f"{where}: the copy from the sandbox failed ({exc}); "
                                   "nothing was written") from None
        sys.stdout.flush()
        out = sys.stdout.buffer
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tf:
            tf.add(copy, arcname=name, filter=_anonymous)
        out.flush()
    if left_out is not None:
        raise E2BProviderError(f"{where}: " + _listed(
            [{"path": path, "message": str(why)} for path, why in left_out.failed.items()],
            "left out of the tar stream"))


def _anonymous(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """A member without this machine's user and group names."""
    member.uname = member.gname = ""
    return member


def tar_from_stdin(p: E2BSandboxProvider, h: SandboxHandle, remote: str, *,
                   exclude: Sequence[str], progress: Callable[[int, Optional[int]], None],
                   where: str) -> None:
    """Extract the tar stream on our standard input into the sandbox directory ``remote``
    (``where``: how the user named it), as ``docker cp - DST`` does.

    Raises:
        UsageError: standard input is a terminal.
        E2BProviderError: ``remote`` is not a directory, standard input is not a tar
            stream, or a member of it was refused (nothing was copied then).
    """
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError("cp - reads a tar stream from standard input, which is a terminal")
    there = p.stat(h, remote)
    if there is None:
        raise E2BProviderError(f"{where}: no such directory in the sandbox")
    if not there.is_dir:
        raise E2BProviderError(f"{where}: not a directory (cp - extracts into a directory)")
    with _private_dir() as top:
        tree = os.path.join(top, "tree")
        extract_tar(sys.stdin.buffer, tree, "standard input")
        p.upload(h, tree, remote, exclude=exclude, progress=progress)


def extract_tar(stream: BinaryIO, tree: str, what: str) -> None:
    """Extract the tar stream ``stream`` (``what``: where it comes from) as the new local
    directory ``tree``: read by :mod:`tarfile` (plain, gzip, bzip2 or xz), each member
    through its ``data`` filter where this Python has it, then written by the library's
    :func:`~e2b_provider.files.local_extract.extract_stream` (the rules of that filter,
    links judged in the finished tree, nothing written through a link).

    Raises:
        E2BProviderError: ``stream`` is not a whole tar stream, or a member was refused
            (the error names it; ``tree`` is then not to be used).
    """
    refused: List[Dict[str, Any]] = []
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as tf:
            reader = Chunks(_as_pax(tf, tree).__next__)
            extract_stream(reader.read, tree, single=False, max_bytes=sys.maxsize,
                           refused=refused)
    except _FILTER_ERRORS as exc:
        member = getattr(exc, "tarinfo", None)
        refused.append({"path": getattr(member, "name", "?"), "message": str(exc)})
    except tarfile.TarError as exc:
        raise E2BProviderError(f"{what} is not a whole tar stream ({exc}); nothing was "
                               "copied") from None
    if refused:
        raise E2BProviderError(f"the tar stream on {what} was refused, nothing was "
                               "copied: " + _listed(refused, "refused"))


def _as_pax(tf: tarfile.TarFile, dest: str) -> Iterator[Optional[bytes]]:
    """The members of ``tf`` (read as a stream) as a POSIX tar stream of files, directories
    and links, in pieces, then None; each through :mod:`tarfile`'s ``data`` filter first,
    where this Python has it. Members of other kinds (hard links, devices...) are written
    as they are, for the extractor to refuse; the top directory itself (``./``) is left
    out (it is the destination)."""
    for member in tf:
        if member.name.strip("/") in ("", ".") and member.isdir():
            continue
        if _DATA_FILTER is not None:
            member = _DATA_FILTER(member, dest)
        ti = tarfile.TarInfo(member.name)
        ti.mtime = member.mtime
        # the data filter leaves a directory's and a link's mode unset: the default then
        ti.mode = member.mode if member.mode is not None else 0o755
        if member.isfile():
            ti.type, ti.size = tarfile.REGTYPE, member.size
        elif member.isdir() or member.issym() or member.islnk():
            ti.type, ti.linkname = member.type, member.linkname
        else:
            ti.type = member.type
        yield ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if ti.type != tarfile.REGTYPE:
            continue
        data = tf.extractfile(member)
        assert data is not None
        left = ti.size
        while left > 0:
            piece = data.read(min(CHUNK, left))
            if not piece:
                raise tarfile.ReadError("unexpected end of data")
            left -= len(piece)
            yield piece
        yield b"\0" * (-ti.size % _BLOCK)
    yield b"\0" * (2 * _BLOCK)
    while True:
        yield None


def _listed(entries: List[Dict[str, Any]], what: str) -> str:
    """``N entries {what}: path: why; ...`` (the first few, and how many)."""
    said = "; ".join(f"{r.get('path')}: {str(r.get('message')).removeprefix('refused: ')}"
                     for r in entries[:_NAMED])
    more = f" (and {len(entries) - _NAMED} more)" if len(entries) > _NAMED else ""
    n = len(entries)
    return f"{n} {'entry' if n == 1 else 'entries'} {what}: {said}{more}"
