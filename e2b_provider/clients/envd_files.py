"""The ``/files`` calls of envd: upload and download a file's bytes.

This module owns :class:`EnvdFiles`, the part of the envd client that writes files
(multipart, raw or streamed ``POST /files``) and reads them (``GET /files``, whole or its
first bytes), each bounded by its ``timeout`` in total. envd reads and writes as root
whatever ``username`` says (it only resolves relative paths and owns a new file to it).
"""

from __future__ import annotations

import posixpath
import urllib.parse
from typing import Any, Callable, Dict, Iterable, Iterator, Optional

from ..cancel import CancelToken
from ..errors import InvalidArgument, ProtocolError
from ..transport.error_mapping import error_from_response
from ..transport.response import HttpResponse
from .envd_requests import ERROR_BODY_BYTES, EnvdBase, check_path, check_user, within

__all__ = ["EnvdFiles"]


class _Sized:
    """An upload body of a known length (``requests`` sends it with ``Content-Length``);
    raises instead of sending more, or ending sooner, than that length."""

    def __init__(self, pieces: Iterable[bytes], length: int) -> None:
        self._pieces = pieces
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        left = self._length
        for piece in self._pieces:
            left -= len(piece)
            if left < 0:
                raise ProtocolError("an upload body grew past its announced length")
            yield piece
        if left:
            raise ProtocolError("an upload body ended before its announced length")


def _check_count(value: object, name: str, *, least: int) -> int:
    """``value``, an int of at least ``least`` (0 or 1); otherwise InvalidArgument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidArgument(f"{name} must be a {'positive' if least else 'non-negative'} int")
    return value


class EnvdFiles(EnvdBase):
    """The ``/files`` calls of the envd client
    (:class:`~e2b_provider.clients.envd.EnvdClient`)."""

    def upload(
        self,
        path: str,
        data: bytes,
        *,
        user: str,
        cancel: Optional[CancelToken] = None,
        timeout: float = 120.0,
    ) -> None:
        """Write a file: multipart ``POST /files?path=<path>&username=<user>``.

        One part named ``file`` (file name = the path's base name) carries the bytes. envd
        creates missing parent directories and owns the file to ``user``.

        Raises:
            E2BHttpError: a non-2xx answer (e.g. 507 disk full, 401 unknown user).
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        self._post_file(path, user, data, cancel, timeout, raw=False)

    def _post_file(
        self,
        path: str,
        user: str,
        data: bytes,
        cancel: Optional[CancelToken],
        timeout: float,
        *,
        raw: bool,
    ) -> None:
        """``POST /files``: one multipart part named ``file`` (file name = the path's base
        name), or (``raw``) the bare bytes."""
        check_path(path)
        check_user(user)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument("data must be bytes")
        if raw:
            body: Dict[str, Any] = {
                "headers": self._headers({"Content-Type": "application/octet-stream"}),
                "data": data,
            }
        else:
            name = posixpath.basename(path) or "file"
            body = {
                "headers": self._headers(),
                "files": {"file": (name, bytes(data), "application/octet-stream")},
            }
        self._send_file(path, user, cancel, timeout, **body)

    def _send_file(
        self, path: str, user: str, cancel: Optional[CancelToken], timeout: float, **body: Any
    ) -> None:
        """``POST /files`` with ``body`` (the request's headers and data); an error answer
        raises."""
        op = "file upload"
        resp = self._files("POST", path, user, op, cancel, timeout, **body)
        if not resp.ok:
            raise error_from_response(resp, op)

    def _files(
        self,
        method: str,
        path: str,
        user: str,
        op: str,
        cancel: Optional[CancelToken],
        timeout: float,
        *,
        max_body: int = ERROR_BODY_BYTES,
        **body: Any,
    ) -> HttpResponse:
        """One buffered request to ``/files?path=<path>&username=<user>``, within
        ``timeout`` seconds in total."""
        return self._transport.request(
            method,
            self._base + "/files",
            params={"path": path, "username": user},
            cancel=cancel,
            operation=op,
            max_body=max_body,
            **within(timeout),
            **body,
        )

    def download(
        self,
        path: str,
        *,
        user: str,
        max_bytes: int,
        cancel: Optional[CancelToken] = None,
        timeout: float = 120.0,
    ) -> Optional[bytes]:
        """Read a whole file: ``GET /files?path=<path>&username=<user>``.

        Note that envd reads as root whatever ``user`` says (``user`` only resolves
        relative paths), so this is no permission check.

        Args:
            max_bytes: the largest file accepted; a longer one raises (nothing partial is
                returned).

        Returns:
            The bytes, or None when the path does not exist (404).

        Raises:
            ProtocolError: the file is larger than ``max_bytes``.
            E2BHttpError: another error answer (e.g. 400 for a directory).
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        check_path(path)
        check_user(user)
        _check_count(max_bytes, "max_bytes", least=0)
        op = "file download"
        resp = self._files("GET", path, user, op, cancel, timeout,
                           max_body=max(max_bytes, ERROR_BODY_BYTES),
                           headers=self._headers({"Accept-Encoding": "identity"}))
        if resp.status == 404:
            return None
        if not resp.ok:
            raise error_from_response(resp, op)
        if len(resp.body) > max_bytes:
            raise ProtocolError(f"E2B {op}: the file is larger than {max_bytes} bytes")
        return resp.body

    def upload_raw(
        self,
        path: str,
        data: bytes,
        *,
        user: str,
        cancel: Optional[CancelToken] = None,
        timeout: float = 120.0,
    ) -> None:
        """Write a file from a raw body: ``POST /files?path=<path>&username=<user>`` with
        ``Content-Type: application/octet-stream`` (envd >= 0.5.7; no multipart encoding,
        so the bytes are sent as they are).

        Raises:
            E2BHttpError, InvalidArgument, Cancelled, TransportError, TransportTimeout:
                as :meth:`upload`.
        """
        self._post_file(path, user, data, cancel, timeout, raw=True)

    def upload_stream(
        self,
        path: str,
        body: Iterable[bytes],
        *,
        user: str,
        cancel: Optional[CancelToken] = None,
        timeout: float = 120.0,
        length: Optional[int] = None,
    ) -> None:
        """Write a file from pieces of bytes sent as they come:
        ``POST /files?path=<path>&username=<user>``, ``application/octet-stream``.

        With ``length`` (the exact number of bytes ``body`` yields) the request carries a
        ``Content-Length`` and the pieces go out as they are; without it, chunked transfer
        encoding (each piece copied once more into its chunk). An exception raised by
        ``body`` ends the request (the connection is dropped, so envd sees a cut upload)
        and propagates.

        Raises:
            E2BHttpError: a non-2xx answer.
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        check_path(path)
        check_user(user)
        self._send_file(path, user, cancel, timeout,
                        headers=self._headers({"Content-Type": "application/octet-stream"}),
                        data=iter(body) if length is None else _Sized(body, length))

    def download_head(
        self,
        path: str,
        *,
        user: str,
        length: int,
        cancel: Optional[CancelToken] = None,
        timeout: float = 120.0,
        on_open: Optional[Callable[[], None]] = None,
    ) -> bytes:
        """Read at most the first ``length`` bytes of a file: ``GET /files`` with
        ``Range: bytes=0-<length-1>`` (identity encoding).

        As :meth:`download`, envd reads as root: no permission check. A body of known
        length is read in one call, straight into the bytes returned.

        Args:
            path: the file.
            user: envd's ``username``.
            length: the most bytes wanted.
            cancel: aborts the request when it fires.
            timeout: the read timeout.
            on_open: called once the success answer's headers arrived, before its body is
                read (envd opens the file before it answers).

        Returns:
            The bytes (``b""`` for an empty file).

        Raises:
            E2BHttpError: an error answer (404 missing, 400 a directory, ...).
            ProtocolError: a whole-file answer longer than ``length``.
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        check_path(path)
        check_user(user)
        _check_count(length, "length", least=1)
        op = "file download"
        query = urllib.parse.urlencode({"path": path, "username": user})
        stream = self._transport.open_stream(
            "GET",
            f"{self._base}/files?{query}",
            headers=self._headers(
                {"Accept-Encoding": "identity", "Range": f"bytes=0-{length - 1}"}
            ),
            data=b"",
            cancel=cancel,
            operation=op,
            deadline_bounds_body=True,
            **within(timeout),
        )
        unregister = cancel.on_cancel(lambda _r: stream.abort()) if cancel is not None else None
        try:
            if stream.status == 416:
                return b""  # a range that starts past the end: the file is empty
            if not 200 <= stream.status < 300:
                raw = stream.read_all(ERROR_BODY_BYTES, truncate=True)
                raise error_from_response(HttpResponse(stream.status, stream.headers, raw), op)
            if on_open is not None:
                on_open()
            return stream.read_all(length)
        except BaseException:
            stream.abort()
            raise
        finally:
            if unregister is not None:
                unregister()
            stream.close()

