"""The checks of file and transfer arguments that the provider facade makes before any I/O,
and the wording of the entries a transfer could not write.

This module owns the checks of ``write_file``'s and ``write_files``' contents,
``read_files``' paths, ``list_dir``'s depth, a watch's flags, the local paths, exclude
patterns, progress callbacks and byte limits of ``upload`` and ``download``, and
:func:`entry_failures` (a transfer's per-entry errors said in the caller's terms).
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ..core.messages import scrub
from ..errors import CommandFailed, InvalidArgument
from ..files.tar_codec import Progress
from ..protocol import validate as v
from .answers import ACCESS_HINT

__all__ = [
    "MAX_DOWNLOAD_BYTES",
    "check_data",
    "check_depth",
    "check_download_bytes",
    "check_paths",
    "check_progress",
    "check_watch",
    "checked_files",
    "entry_failures",
    "download_arguments",
    "exclude_patterns",
    "local_path",
    "upload_arguments",
]

#: Content a download accepts at most.
MAX_DOWNLOAD_BYTES = 1 << 40


def checked_files(
    files: Mapping[str, Union[bytes, bytearray, memoryview, str]],
) -> List[Tuple[str, bytes]]:
    """``files`` as (path, bytes) pairs, every path and content checked."""
    if not isinstance(files, Mapping):
        raise InvalidArgument("files must be a mapping of path to content")
    out: List[Tuple[str, bytes]] = []
    for path, data in files.items():
        v.check_path(path)
        if isinstance(data, str):
            try:
                raw = data.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidArgument(
                    f"the content for {v.show(path)} is not valid UTF-8 text (it has a lone "
                    "surrogate); pass bytes"
                ) from None
        elif isinstance(data, (bytes, bytearray, memoryview)):
            raw = bytes(data)
        else:
            raise InvalidArgument(f"the content for {v.show(path)} must be bytes or str")
        out.append((path, raw))
    return out


def check_paths(paths: Iterable[str]) -> List[str]:
    """The sandbox paths of ``read_files``, each checked."""
    return v.check_each(paths, v.check_path, "paths must be a list of paths, not one string")


def check_depth(depth: int) -> None:
    """Check ``list_dir``'s depth (1-64)."""
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 64:
        raise InvalidArgument("depth must be an int from 1 to 64")


def local_path(path: Union[str, os.PathLike[str]], what: str) -> str:
    """A local path argument as a string."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgument(f"{what} must be a path (str or os.PathLike)")
    text = os.fspath(path)
    if not isinstance(text, str) or not text or "\x00" in text:
        raise InvalidArgument(f"{what} must be a non-empty path without NUL")
    return text


def exclude_patterns(exclude: Iterable[str]) -> List[str]:
    """A transfer's exclude patterns, each checked (at most 1000)."""
    if isinstance(exclude, str):
        raise InvalidArgument("exclude must be a list of patterns, not one string")
    out = list(exclude)
    for pattern in out:
        if not isinstance(pattern, str) or not pattern or "\x00" in pattern:
            raise InvalidArgument("each exclude pattern must be a non-empty string")
        if len(out) > 1000:
            raise InvalidArgument("at most 1000 exclude patterns")
    return out


def upload_arguments(
    local: Union[str, os.PathLike[str]],
    remote_path: str,
    exclude: Iterable[str],
    progress: Optional[Progress],
) -> Tuple[str, List[str]]:
    """Check an upload's arguments; its local path as a string, and its exclude patterns."""
    src = local_path(local, "local_path")
    v.check_path(remote_path)
    patterns = exclude_patterns(exclude)
    check_progress(progress)
    return src, patterns


def download_arguments(
    remote_path: str,
    local: Union[str, os.PathLike[str]],
    exclude: Iterable[str],
    max_bytes: int,
    progress: Optional[Progress],
) -> Tuple[str, List[str]]:
    """Check a download's arguments; its local path as a string, and its exclude patterns."""
    v.check_path(remote_path)
    dst = local_path(local, "local_path")
    patterns = exclude_patterns(exclude)
    check_download_bytes(max_bytes)
    check_progress(progress)
    return dst, patterns


def check_progress(progress: Optional[Progress]) -> None:
    """Check a transfer's progress callback (a callable or None)."""
    if progress is not None and not callable(progress):
        raise InvalidArgument("progress must be callable")


def check_download_bytes(max_bytes: int) -> None:
    """Check a download's ``max_bytes`` (1 to :data:`MAX_DOWNLOAD_BYTES`)."""
    if (
        isinstance(max_bytes, bool)
        or not isinstance(max_bytes, int)
        or not 0 < max_bytes <= MAX_DOWNLOAD_BYTES
    ):
        raise InvalidArgument(f"max_bytes must be an int from 1 to {MAX_DOWNLOAD_BYTES}")


def entry_failures(errors: List[Dict[str, object]]) -> Dict[str, CommandFailed]:
    """The entries a transfer reported as not written, as :class:`FilesFailed` wants (said
    without the library's internal names; a refusal with what to do)."""
    out: Dict[str, CommandFailed] = {}
    for e in errors:
        path = str(e.get("path") or "?")
        said = scrub(str(e.get("message") or e.get("error") or "failed"))
        if said.lower().startswith(("permission denied", "operation not permitted")):
            said = f"{said[:1].lower()}{said[1:]}; {ACCESS_HINT}"
        out[path] = CommandFailed(said)
    return out


def check_data(data: object) -> None:
    """Check ``write_file``'s content (bytes-like)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgument("data must be bytes")


def check_watch(recursive: object, timeout: Optional[float]) -> None:
    """Check a watch's ``recursive`` flag and ``timeout`` (None: until the block is left)."""
    if not isinstance(recursive, bool):
        raise InvalidArgument("recursive must be True or False")
    if timeout is not None:
        v.check_timeout(timeout)
