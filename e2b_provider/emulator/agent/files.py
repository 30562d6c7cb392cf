"""``GET /files`` and ``POST /files`` of the emulator's envd look-alike agent.

This module owns envd's file transfer routes: downloads streamed from disk in bounded chunks
(identity with ``Content-Length``, single ``Range`` and ``If-Modified-Since``, or on-the-fly
gzip when the client accepts it), and uploads streamed to disk (``multipart/*`` with one or
more parts named ``file``, or a raw ``application/octet-stream`` body): parents are created
and chowned to the user, new and existing files are chowned to the user, ``X-Metadata-*``
headers become ``user.e2b.*`` xattrs. Neither direction ever holds a whole file in memory.
Errors are envd's plain JSON ``{"code": <http status>, "message": …}``. The agent checks no
access token (the host server does); ``?username=`` picks the user (default: the agent's).
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import logging
import mimetypes
import os
import posixpath
import re
import stat
import zlib
from typing import Any, AsyncIterator, Dict, Optional, Set, Tuple, Union
from urllib.parse import quote, unquote

from aiohttp import BodyPartReader, web

from .filesystem import ensure_dirs, validate_metadata, write_metadata
from .process import _wait_writable
from .rpc import (
    RpcError,
    UserInfo,
    errno_text,
    expand_and_resolve,
    json_response,
    lookup_user,
)

__all__ = ["FILE_CHUNK", "download", "part_filename", "upload"]

log = logging.getLogger(__name__)

#: Bytes read from disk / the request per step.
FILE_CHUNK = 64 * 1024
_GZIP_LEVEL = 6  # Go's gzip.DefaultCompression
# Bytes that make Go's http.DetectContentType call data binary.
_BINARY = frozenset([*range(0x00, 0x09), 0x0B, *range(0x0E, 0x1B), *range(0x1C, 0x20)])


def _error(status: int, message: str) -> web.Response:
    return json_response({"code": status, "message": message}, status, charset=True)


class _Fail(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> web.Response:
        return _error(self.status, self.message)


def _user(request: web.BaseRequest, default_user: str) -> UserInfo:
    name = request.query.get("username") or default_user
    if not name:
        raise _Fail(400, "no user specified")
    info = lookup_user(name)
    if info is None:
        raise _Fail(401, f"error looking up user '{name}': user: unknown user {name}")
    return info


def _resolve(path: str, user: UserInfo, default_workdir: Optional[str]) -> str:
    try:
        return expand_and_resolve(path, user, default_workdir)
    except RpcError as err:
        raise _Fail(400, err.message) from None


# ---- download -------------------------------------------------------------------------


def _accept_gzip(header: Optional[str]) -> Tuple[bool, bool]:
    """``(use_gzip, identity_ok)`` for an ``Accept-Encoding`` header."""
    if header is None:
        return False, True
    q: Dict[str, float] = {}
    for item in header.split(","):
        token, _, params = item.strip().partition(";")
        token = token.strip().lower()
        if not token:
            continue
        weight = 1.0
        m = re.search(r"q\s*=\s*([0-9.]+)", params)
        if m:
            try:
                weight = float(m.group(1))
            except ValueError:
                weight = 0.0
        q[token] = weight
    gzip_q = q.get("gzip", q.get("*", 0.0))
    if "identity" in q:
        identity_q = q["identity"]
        identity_listed = True
    else:
        identity_q = 0.0 if q.get("*", 1.0) == 0.0 else 1.0
        identity_listed = False
    use_gzip = gzip_q > 0 and (not identity_listed or gzip_q >= identity_q)
    return use_gzip, identity_q > 0


def _content_type(path: str, fd: int) -> str:
    guessed, _ = mimetypes.guess_type(path, strict=False)
    if guessed:
        if guessed.startswith("text/") and "charset" not in guessed:
            guessed += "; charset=utf-8"
        return guessed
    head = os.pread(fd, 512, 0)
    if any(b in _BINARY for b in head):
        return "application/octet-stream"
    return "text/plain; charset=utf-8"


def _disposition(path: str) -> str:
    name = posixpath.basename(path)
    if name.isascii() and name.isprintable():
        escaped = name.replace("\\", "\\\\").replace('"', '\\"')
        return f'inline; filename="{escaped}"'
    return "inline; filename*=utf-8''" + quote(name, safe="")


def _parse_range(header: str, size: int) -> Union[Tuple[int, int], str, None]:
    """``(start, end_inclusive)``; ``"unsatisfiable"``/``"invalid"``; ``None`` to ignore."""
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if m is None:
        if header.strip().startswith("bytes=") and "," in header:
            return None  # several ranges: served whole
        return "invalid"
    first, last = m.group(1), m.group(2)
    if not first:
        if not last:
            return "invalid"
        length = int(last)
        if length == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - length), size - 1
    start = int(first)
    if start >= size:
        return "unsatisfiable"
    end = int(last) if last else size - 1
    if end < start:
        return "invalid"
    return start, min(end, size - 1)


async def download(
    request: web.Request, default_user: str, default_workdir: Optional[str]
) -> web.StreamResponse:
    """``GET /files?path=P[&username=U]``: stream a file (identity, range or gzip)."""
    try:
        user = _user(request, default_user)
        path = _resolve(request.query.get("path", ""), user, default_workdir)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise _Fail(404, f"path '{path}' does not exist") from None
        except OSError as exc:
            raise _Fail(500, f"error checking if path exists: {errno_text(exc)}") from None
        if stat.S_ISDIR(st.st_mode):
            raise _Fail(400, f"path '{path}' is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise _Fail(400, f"path '{path}' is not a regular file")
        use_gzip, identity_ok = _accept_gzip(request.headers.get("Accept-Encoding"))
        range_header = request.headers.get("Range")
        if range_header is not None:
            use_gzip, identity_ok = False, True
        if not use_gzip and not identity_ok:
            raise _Fail(406, "no acceptable encoding found")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _Fail(500, f"error opening file '{path}': {errno_text(exc)}") from None
    except _Fail as fail:
        return fail.response()
    try:
        return await _send_file(request, fd, path, os.fstat(fd), use_gzip, range_header)
    finally:
        os.close(fd)


async def _send_file(
    request: web.Request,
    fd: int,
    path: str,
    st: os.stat_result,
    use_gzip: bool,
    range_header: Optional[str],
) -> web.StreamResponse:
    size = st.st_size
    headers = {
        "Content-Type": _content_type(path, fd),
        "Content-Disposition": _disposition(path),
        "Vary": "Accept-Encoding",
    }
    if use_gzip:
        headers["Content-Encoding"] = "gzip"
        resp = web.StreamResponse(status=200, headers=headers)
        await resp.prepare(request)
        if request.method != "HEAD":
            comp = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)
            offset = 0
            while True:
                chunk = os.pread(fd, FILE_CHUNK, offset)
                if not chunk:
                    break
                offset += len(chunk)
                data = comp.compress(chunk)
                if data:
                    await resp.write(data)
            await resp.write(comp.flush())
        await resp.write_eof()
        return resp
    headers["Accept-Ranges"] = "bytes"
    headers["Last-Modified"] = email.utils.formatdate(int(st.st_mtime), usegmt=True)
    since = request.headers.get("If-Modified-Since")
    if since is not None and range_header is None:
        try:
            parsed = email.utils.parsedate_to_datetime(since)
        except (TypeError, ValueError):
            parsed = None
        if parsed is not None and int(st.st_mtime) <= parsed.timestamp():
            return web.Response(status=304, headers={"Last-Modified": headers["Last-Modified"]})
    start, end, status = 0, size - 1, 200
    if range_header is not None:
        parsed_range = _parse_range(range_header, size)
        if parsed_range in ("unsatisfiable", "invalid"):
            return web.Response(
                status=416,
                text="invalid range: failed to overlap"
                if parsed_range == "unsatisfiable"
                else "invalid range",
                headers={"Content-Range": f"bytes */{size}"},
            )
        if isinstance(parsed_range, tuple):
            start, end = parsed_range
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    length = max(0, end - start + 1)
    resp = web.StreamResponse(status=status, headers=headers)
    resp.content_length = length
    await resp.prepare(request)
    if request.method != "HEAD":
        offset, remaining = start, length
        while remaining > 0:
            chunk = os.pread(fd, min(FILE_CHUNK, remaining), offset)
            if not chunk:
                break  # the file shrank while being sent: the client sees a short body
            offset += len(chunk)
            remaining -= len(chunk)
            await resp.write(chunk)
    await resp.write_eof()
    return resp


# ---- upload ---------------------------------------------------------------------------


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_SEP = re.compile(r"\s*;\s*")
_EQ = re.compile(r"\s*=\s*")
_EXT_VALUE = re.compile(r"(?i)(utf-8|us-ascii)'[^']*'(.*)")


def _disposition_params(header: str) -> Dict[str, str]:
    """Parameters of a Content-Disposition value, Go ``mime.ParseMediaType`` style.

    Quoted strings keep every character (``\\x`` unescapes to ``x``); nothing is stripped
    (aiohttp's own parser drops leading slashes, which would turn ``/tmp/f`` into ``tmp/f``).
    """
    params: Dict[str, str] = {}
    pos = header.find(";")
    if pos < 0:
        return params
    while True:
        m = _SEP.match(header, pos)
        if m is None:
            break
        m = _TOKEN.match(header, m.end())
        if m is None:
            break
        key = m.group(0).lower()
        m = _EQ.match(header, m.end())
        if m is None:
            break
        pos = m.end()
        if header.startswith('"', pos):
            pos += 1
            buf = []
            while pos < len(header) and header[pos] != '"':
                if header[pos] == "\\" and pos + 1 < len(header):
                    pos += 1
                buf.append(header[pos])
                pos += 1
            if pos >= len(header):
                break  # unterminated quoted string
            pos += 1
            value = "".join(buf)
        else:
            m = _TOKEN.match(header, pos)
            if m is None:
                break
            value = m.group(0)
            pos = m.end()
        params.setdefault(key, value)
    return params


def part_filename(header: Optional[str]) -> Optional[str]:
    """The ``filename`` of a multipart part (RFC 2231 ``filename*`` wins), unmodified."""
    if not header:
        return None
    params = _disposition_params(header)
    extended = params.get("filename*")
    if extended is not None:
        m = _EXT_VALUE.fullmatch(extended)
        if m is not None:
            return unquote(m.group(2), "utf-8", "replace")
    return params.get("filename")


def _metadata(request: web.BaseRequest) -> Dict[str, str]:
    raw = {}
    for name, value in request.headers.items():
        if name.lower().startswith("x-metadata-"):
            raw[name[len("x-metadata-") :]] = value
    try:
        return validate_metadata(raw)
    except RpcError as err:
        raise _Fail(400, err.message) from None


async def upload(
    request: web.Request, default_user: str, default_workdir: Optional[str]
) -> web.Response:
    """``POST /files``: multipart (parts named ``file``) or octet-stream upload.

    Answers 200 with ``[{"name", "type": "file", "path"[, "metadata"]}, …]``.
    """
    try:
        user = _user(request, default_user)
        meta = _metadata(request)
        query_path = request.query.get("path") or None
        media = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        results = []
        if media.startswith("multipart/"):
            reader = await request.multipart()
            seen: Set[str] = set()
            while True:
                part = await reader.next()
                if part is None:
                    break
                if not isinstance(part, BodyPartReader) or part.name != "file":
                    await part.release()
                    continue
                target = query_path or part_filename(part.headers.get("Content-Disposition"))
                if not target:
                    raise _Fail(400, "no path given for the file part")
                path = _resolve(target, user, default_workdir)
                if path in seen:
                    raise _Fail(400, f"cannot upload multiple files to same path '{path}'")
                seen.add(path)
                results.append(await _write_file(path, user, _part_chunks(part), meta))
        elif media == "application/octet-stream":
            if not query_path:
                raise _Fail(400, "path is required for octet-stream upload")
            path = _resolve(query_path, user, default_workdir)
            results.append(
                await _write_file(path, user, request.content.iter_chunked(FILE_CHUNK), meta)
            )
        else:
            raise _Fail(400, f"unsupported content type: {media or '(none)'}")
    except _Fail as fail:
        return fail.response()
    return json_response(results)


async def _part_chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while True:
        chunk = await part.read_chunk(FILE_CHUNK)
        if not chunk:
            return
        yield chunk


async def _open_for_write(path: str) -> int:
    """Open ``path`` as envd does (create, truncate), without stopping the agent: a FIFO
    without a reader yet is retried until one comes (envd's open waits for it too)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK
    while True:
        try:
            return os.open(path, flags, 0o666)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
        await asyncio.sleep(0.01)


async def _write_all_async(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a descriptor opened non-blocking (a full FIFO is waited for)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            await _wait_writable(fd, None)


def _disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


async def _write_file(
    path: str, user: UserInfo, chunks: AsyncIterator[bytes], meta: Dict[str, str]
) -> Dict[str, Any]:
    try:
        ensure_dirs(posixpath.dirname(path) or "/", user.uid, user.gid)
    except RpcError as err:
        raise _Fail(500, err.message) from None
    if os.path.isdir(path):
        raise _Fail(400, f"path is a directory: {path}")
    try:
        fd = await _open_for_write(path)
    except OSError as exc:
        if _disk_full(exc):
            raise _Fail(507, f"not enough inodes available: {errno_text(exc)}") from None
        if exc.errno == errno.EISDIR:
            raise _Fail(400, f"path is a directory: {path}") from None
        raise _Fail(500, f"error opening file '{path}': {errno_text(exc)}") from None
    try:
        try:
            os.fchown(fd, user.uid, user.gid)
        except OSError as exc:
            raise _Fail(500, f"error changing file ownership: {errno_text(exc)}") from None
        async for chunk in chunks:
            try:
                await _write_all_async(fd, chunk)
            except OSError as exc:
                if _disk_full(exc):
                    raise _Fail(
                        507,
                        f"attempted to write {len(chunk)} bytes: not enough disk space available",
                    ) from None
                raise _Fail(500, f"error writing file '{path}': {errno_text(exc)}") from None
    finally:
        os.close(fd)
    try:
        write_metadata(path, meta)
    except OSError as exc:
        if _disk_full(exc):
            raise _Fail(507, "not enough disk space available for metadata") from None
        raise _Fail(500, f"error setting metadata on '{path}': {errno_text(exc)}") from None
    entry: Dict[str, Any] = {"name": posixpath.basename(path), "type": "file", "path": path}
    if meta:
        entry["metadata"] = meta
    return entry
