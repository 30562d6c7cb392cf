"""``GET /files`` and ``POST /files`` of the emulator's envd look-alike agent.

This module owns envd 0.6.13's file transfer routes, step for step as envd's handlers take
them (``packages/envd/internal/api/download.go``, ``upload.go``, ``encoding.go``):

* download: resolve the user and path, ``stat`` (following symlinks, so ``/proc/<pid>/fd/<n>``
  reaches the open file), pick the coding (gzip when accepted, streamed without a length;
  ``Range`` and conditional requests force identity), then what Go's ``http.ServeContent``
  does: ``Last-Modified``, ``If-*`` preconditions (304/412), content type from the requested
  path's extension or sniffed, single ranges (206), several ranges (``multipart/byteranges``),
  416 for unsatisfiable ones;
* upload: ``Content-Encoding: gzip`` bodies decoded (other codings: 400), raw
  ``application/octet-stream`` bodies or ``multipart/*`` forms (parts named ``file``),
  parents created and chowned, an existing target chowned then truncated through its path
  (so a ``/proc/<pid>/fd/<n>`` magic link reaches the open file), ``X-Metadata-*`` headers
  written as ``user.e2b.*`` xattrs through the open descriptor.

Neither direction holds a whole file in memory. Errors are envd's plain JSON ``{"code":
<http status>, "message": …}``; the ``ServeContent`` errors are Go's plain text. The agent
checks no access token (the host server does); ``?username=`` picks the user (default: the
agent's).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import posixpath
import stat
import zlib
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set

from aiohttp import web

from . import gohttp, journal
from .bodies import BodyError, ByteSource, GzipSource, MultipartReader, multipart_boundary
from .filesystem import (
    ensure_dirs,
    go_base,
    read_metadata,
    validate_metadata,
    write_metadata_fd,
)
from .process_output import wait_writable
from .rpc import RpcError, UserInfo, errno_text, expand_and_resolve, lookup_user

__all__ = ["FILE_CHUNK", "download", "go_json", "upload"]

log = logging.getLogger(__name__)

#: Bytes read from disk / the request per step.
FILE_CHUNK = 64 * 1024
_GZIP_LEVEL = 6  # Go's gzip.DefaultCompression
_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_CONDITIONAL = ("Range", "If-Modified-Since", "If-None-Match", "If-Range")


def go_json(obj: Any) -> bytes:
    """JSON as Go's ``encoding/json`` writes it (compact, ``<``/``>``/``&`` escaped)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in _ESCAPES.items():
        text = text.replace(raw, escaped)
    return text.encode("utf-8", "surrogateescape")


def _error(status: int, message: str, headers: Optional[Dict[str, str]] = None) -> web.Response:
    """envd's ``jsonError``: ``{"code", "message"}`` plus a newline."""
    out = dict(headers or {})
    out["Content-Type"] = "application/json; charset=utf-8"
    out["X-Content-Type-Options"] = "nosniff"
    body = go_json({"code": status, "message": message}) + b"\n"
    return web.Response(status=status, body=body, headers=out)


def _serve_error(status: int, text: str, headers: Dict[str, str]) -> web.Response:
    """Go's ``serveError``/``http.Error``: plain text, caching headers dropped."""
    out = {
        k: v
        for k, v in headers.items()
        if k not in ("Cache-Control", "Content-Encoding", "Etag", "Last-Modified")
    }
    out["Content-Type"] = "text/plain; charset=utf-8"
    out["X-Content-Type-Options"] = "nosniff"
    return web.Response(status=status, body=(text + "\n").encode(), headers=out)


class _Fail(Exception):
    def __init__(self, status: int, message: str, headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers

    def response(self) -> web.Response:
        return _error(self.status, self.message, self.headers)


def _username(request: web.BaseRequest, default_user: str) -> str:
    """envd's ``ResolveDefaultUsername``: a given ``username`` (even empty) wins."""
    if "username" in request.query:
        return request.query["username"]
    if not default_user:
        raise _Fail(400, "username not provided")
    return default_user


def _lookup(name: str) -> UserInfo:
    info = lookup_user(name)
    if info is None:
        raise _Fail(401, f"error looking up user '{name}': user: unknown user {name}")
    return info


# ---- download -------------------------------------------------------------------------


async def download(
    request: web.Request, default_user: str, default_workdir: Optional[str]
) -> web.StreamResponse:
    """``GET /files?path=P[&username=U]``: stream a file (identity, ranges or gzip)."""
    raw_path = request.query.get("path", "")
    headers: Dict[str, str] = {}
    try:
        user = _lookup(_username(request, default_user))
        try:
            path = expand_and_resolve(raw_path, user, default_workdir)
        except RpcError as err:
            raise _Fail(
                400, f"error expanding and resolving path '{raw_path}': {err.message}"
            ) from None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise _Fail(404, f"path '{path}' does not exist") from None
        except OSError as exc:
            raise _Fail(
                500, f"error checking if path exists '{path}': stat {path}: {errno_text(exc)}"
            ) from None
        if stat.S_ISDIR(st.st_mode):
            raise _Fail(400, f"path '{path}' is a directory")
        accept = request.headers.get("Accept-Encoding")
        try:
            coding = gohttp.accept_encoding(accept)
        except gohttp.EncodingError as exc:
            raise _Fail(406, f"error parsing Accept-Encoding: {exc}") from None
        headers["Vary"] = "Accept-Encoding"
        if any(request.headers.get(h) for h in _CONDITIONAL):
            if not gohttp.identity_acceptable(accept):
                raise _Fail(
                    406,
                    "identity encoding not acceptable for Range or conditional request",
                    headers,
                )
            coding = gohttp.ENCODING_IDENTITY
        try:
            # O_NONBLOCK: a FIFO or terminal must not hang the agent (envd would block).
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise _Fail(
                500, f"error opening file '{path}': open {path}: {errno_text(exc)}"
            ) from None
    except _Fail as fail:
        return fail.response()
    journal.event(log, "file_read", "File read", path=path, username=user.name)
    try:
        headers["Content-Disposition"] = gohttp.format_media_type(
            "inline", {"filename": go_base(path)}
        )
        if coding == gohttp.ENCODING_GZIP:
            return await _send_gzip(request, fd, raw_path, headers)
        return await _serve_content(request, fd, raw_path, st, headers)
    finally:
        os.close(fd)


async def _send_gzip(
    request: web.Request, fd: int, name: str, headers: Dict[str, str]
) -> web.StreamResponse:
    headers["Content-Encoding"] = "gzip"
    headers["Content-Type"] = (
        gohttp.type_by_extension(gohttp.file_ext(name)) or "application/octet-stream"
    )
    resp = web.StreamResponse(status=200, headers=headers)
    await resp.prepare(request)
    comp = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)
    while True:
        try:
            chunk = os.read(fd, FILE_CHUNK)
        except BlockingIOError:
            chunk = b""
        except OSError as exc:
            log.warning("gzip download of %s stopped: %s", name, errno_text(exc))
            chunk = b""
        if not chunk:
            break
        data = comp.compress(chunk)
        if data:
            await resp.write(data)
    await resp.write(comp.flush())
    await resp.write_eof()
    return resp


async def _serve_content(
    request: web.Request, fd: int, name: str, st: os.stat_result, headers: Dict[str, str]
) -> web.StreamResponse:
    """Go's ``http.ServeContent`` for an open file (no ETag, like envd)."""
    mtime = st.st_mtime_ns // 1_000_000_000 if st.st_mtime_ns else 0
    if mtime:
        headers["Last-Modified"] = gohttp.http_date(mtime)
    status, range_header = gohttp.preconditions(request.method, request.headers, mtime)
    if status == 304:
        return web.Response(status=304, headers=headers)
    if status is not None:
        return web.Response(status=status, headers=headers)
    ctype = gohttp.type_by_extension(gohttp.file_ext(name))
    if not ctype:
        try:
            head = os.pread(fd, gohttp.SNIFF_LEN, 0)
        except OSError:
            head = b""
        ctype = gohttp.detect_content_type(head)
    headers["Content-Type"] = ctype
    try:
        size = gohttp.lseek_size(fd)
    except OSError:
        return _serve_error(500, "seeker can't seek", headers)
    try:
        ranges = gohttp.parse_range(range_header or "", size)
    except gohttp.RangeError as exc:
        if not (exc.no_overlap and size == 0):
            if exc.no_overlap:
                headers["Content-Range"] = f"bytes */{size}"
            return _serve_error(416, str(exc), headers)
        ranges = []
    if sum(length for _, length in ranges) > size:
        ranges = []  # more bytes asked for than the file has: serve it whole
    status = 200
    pieces: List[Any] = [(0, size)]
    send_size = size
    if len(ranges) == 1:
        status = 206
        start, send_size = ranges[0]
        headers["Content-Range"] = gohttp.content_range(start, send_size, size)
        pieces = [(start, send_size)]
    elif len(ranges) > 1:
        status = 206
        boundary = os.urandom(30).hex()
        parts, closing, send_size = gohttp.byte_range_parts(ranges, ctype, size, boundary)
        headers["Content-Type"] = "multipart/byteranges; boundary=" + boundary
        pieces = []
        for head, start, length in parts:
            pieces += [head, (start, length)]
        pieces.append(closing)
    headers["Accept-Ranges"] = "bytes"
    resp = web.StreamResponse(status=status, headers=headers)
    resp.content_length = send_size
    await resp.prepare(request)
    for piece in pieces:
        if isinstance(piece, bytes):
            await resp.write(piece)
        elif not await _send_range(resp, fd, *piece):
            # the file shrank while being sent: the body is short, so end the connection
            if request.transport is not None:
                request.transport.close()
            return resp
    await resp.write_eof()
    return resp


async def _send_range(resp: web.StreamResponse, fd: int, offset: int, length: int) -> bool:
    """Write ``length`` bytes of the file from ``offset``; False if it ends early."""
    while length > 0:
        try:
            chunk = os.pread(fd, min(FILE_CHUNK, length), offset)
        except OSError:
            chunk = b""
        if not chunk:
            return False
        offset += len(chunk)
        length -= len(chunk)
        await resp.write(chunk)
    return True


# ---- upload ---------------------------------------------------------------------------


class _RequestSource:
    """The request body as a :class:`~.bodies.ByteSource`."""

    def __init__(self, request: web.BaseRequest) -> None:
        self._content = request.content

    async def read(self) -> bytes:
        return await self._content.readany()


def _metadata(request: web.BaseRequest) -> Dict[str, str]:
    raw: Dict[str, str] = {}
    for name, value in request.headers.items():
        if name.lower().startswith("x-metadata-") and len(name) > len("x-metadata-"):
            raw.setdefault(name[len("x-metadata-") :].lower(), value)
    try:
        return validate_metadata(raw)
    except RpcError as err:
        raise _Fail(400, f"invalid metadata: {err.message}") from None


async def upload(
    request: web.Request, default_user: str, default_workdir: Optional[str]
) -> web.Response:
    """``POST /files``: multipart (parts named ``file``) or octet-stream upload.

    Answers 200 with ``[{"name", "type": "file", "path"[, "metadata"]}, …]``.
    """
    try:
        name = _username(request, default_user)
        source: ByteSource = _RequestSource(request)
        try:
            coding = gohttp.content_encoding(request.headers.get("Content-Encoding"))
        except gohttp.EncodingError as exc:
            raise _Fail(400, f"error decompressing request body: {exc}") from None
        if coding == gohttp.ENCODING_GZIP:
            unzipped = GzipSource(source)
            try:
                await unzipped.open()
            except BodyError as exc:
                raise _Fail(
                    400,
                    f"error decompressing request body: failed to create gzip reader: {exc}",
                ) from None
            source = unzipped
        user = _lookup(name)
        meta = _metadata(request)
        content_type = request.headers.get("Content-Type", "")
        try:
            media, _ = gohttp.parse_media_type(content_type)
        except gohttp.MediaTypeError:
            media = ""
        writer = _Writer(user, meta, request.content_length or 0)
        query_path = request.query.get("path")
        if media == "application/octet-stream":
            if query_path is None:
                raise _Fail(400, "path query parameter is required for raw body upload")
            path = _resolve(query_path, user, default_workdir)
            results = [await writer.write(path, source.read)]
        elif media.startswith("multipart/"):
            results = await _multipart(source, content_type, query_path, writer, default_workdir)
        else:
            raise _Fail(
                400,
                f"unsupported content type: {content_type}, expected multipart/form-data or "
                "application/octet-stream",
            )
    except _Fail as fail:
        return fail.response()
    for result in results:
        journal.event(
            log, "file_processing", "File written", path=result.get("path"), username=name
        )
    body = go_json(results)
    # envd writes the JSON without a Content-Type, so Go's server sniffs one.
    ctype = gohttp.detect_content_type(body)
    return web.Response(status=200, body=body, headers={"Content-Type": ctype})


def _resolve(path: str, user: UserInfo, default_workdir: Optional[str]) -> str:
    try:
        return expand_and_resolve(path, user, default_workdir)
    except RpcError as err:
        raise _Fail(400, f"error resolving path: {err.message}") from None


async def _multipart(
    source: ByteSource,
    content_type: str,
    query_path: Optional[str],
    writer: _Writer,
    default_workdir: Optional[str],
) -> List[Dict[str, Any]]:
    try:
        reader = MultipartReader(source, multipart_boundary(content_type))
    except BodyError as exc:
        raise _Fail(500, f"error parsing multipart form: {exc}") from None
    results: List[Dict[str, Any]] = []
    seen: Set[str] = set()
    while True:
        try:
            part = await reader.next_part()
        except BodyError as exc:
            raise _Fail(500, f"error reading form: {exc}") from None
        if part is None:
            return results
        if part.form_name() != "file":
            continue
        target = query_path
        if target is None:
            try:
                target = part.file_name_with_path()
            except BodyError as exc:
                raise _Fail(400, f"error getting multipart custom part file name: {exc}") from None
        path = _resolve(target, writer.user, default_workdir)
        if path in seen:
            others = [r["path"] for r in results if r["path"] != path]
            message = (
                f"you cannot upload multiple files to the same path '{path}' in one upload "
                "request, only the first specified file was uploaded"
            )
            if len(others) > 1:
                message += ", also the following files were uploaded: " + ", ".join(others)
            raise _Fail(400, message)
        seen.add(path)
        results.append(await writer.write(path, part.read))


async def _open_for_write(path: str) -> int:
    """Open ``path`` as envd does (create, truncate) without stopping the agent: a FIFO with
    no reader yet is retried until one comes (envd's open waits for it too)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK
    while True:
        try:
            return os.open(path, flags, 0o666)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
        await asyncio.sleep(0.01)


async def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (the descriptor is non-blocking: a full FIFO is waited for)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            await wait_writable(fd, None)


class _Writer:
    """envd's ``processFile`` for one upload request's user, metadata and length."""

    def __init__(self, user: UserInfo, meta: Dict[str, str], content_length: int) -> None:
        self.user = user
        self.meta = meta
        self.content_length = content_length

    async def write(self, path: str, read: Callable[[], Awaitable[bytes]]) -> Dict[str, Any]:
        """Write one file from ``read()`` chunks; its upload result entry."""
        user = self.user
        try:
            # envd: EnsureDirs(filepath.Dir(path)), and Go's Dir cleans ("/a/../b" is "/b")
            ensure_dirs(posixpath.normpath(posixpath.dirname(path) or "/"), user.uid, user.gid)
        except RpcError as err:
            raise _Fail(500, f"error ensuring directories: {err.message}") from None
        chowned = False
        try:
            st: Optional[os.stat_result] = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise _Fail(500, f"error getting file info: stat {path}: {errno_text(exc)}") from None
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise _Fail(400, f"path is a directory: {path}")
            # chown through the path first: a /proc/<pid>/fd/<n> link reaches the open file
            try:
                os.chown(path, user.uid, user.gid)
                chowned = True
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise _Fail(
                    500, f"error changing file ownership: chown {path}: {errno_text(exc)}"
                ) from None
        try:
            fd = await _open_for_write(path)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise _Fail(
                    507, f"not enough inodes available: open {path}: {errno_text(exc)}"
                ) from None
            raise _Fail(500, f"error opening file: open {path}: {errno_text(exc)}") from None
        try:
            if not chowned:
                try:
                    os.fchown(fd, user.uid, user.gid)
                except OSError as exc:
                    raise _Fail(
                        500, f"error changing file ownership: chown {path}: {errno_text(exc)}"
                    ) from None
            await self._copy(fd, path, read)
            self._metadata(fd, path)
        finally:
            os.close(fd)
        entry: Dict[str, Any] = {"path": path, "name": go_base(path), "type": "file"}
        persisted = read_metadata(path)
        if persisted:
            entry["metadata"] = persisted
        return entry

    async def _copy(self, fd: int, path: str, read: Callable[[], Awaitable[bytes]]) -> None:
        while True:
            try:
                chunk = await read()
            except BodyError as exc:
                raise _Fail(500, f"error writing file: {exc}") from None
            if not chunk:
                return
            try:
                await _write_all(fd, chunk)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    message = "not enough disk space available"
                    if self.content_length > 0:
                        message = f"attempted to write {self.content_length} bytes: {message}"
                    raise _Fail(507, message) from None
                raise _Fail(500, f"error writing file: write {path}: {errno_text(exc)}") from None

    def _metadata(self, fd: int, path: str) -> None:
        try:
            write_metadata_fd(fd, self.meta)
        except OSError as exc:
            reason = f"xattr.fset {path}: {errno_text(exc)}"
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                log.warning("%s does not support xattrs; metadata not persisted", path)
            elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _Fail(507, f"not enough space for file metadata: {reason}") from None
            else:
                raise _Fail(500, f"error writing file metadata: {reason}") from None
