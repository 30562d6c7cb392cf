"""Connect-over-HTTP plumbing of the emulator's envd look-alike agent.

This module owns what every agent route shares: the Connect error type and its HTTP status
table, reading unary JSON and single-envelope streaming requests, writing unary answers and
server streams (envelopes, then the ``0x02`` end-of-stream frame), the OS user of a request
(``Authorization: Basic base64("<user>:")`` or ``?username=``) and envd's path resolution
(``~``, ``~/x``, paths relative to the user's home). It is used only inside the agent process
(``python -m e2b_provider.emulator.agent``); the client side of the library never imports it.
"""

from __future__ import annotations

import base64
import binascii
import grp
import json
import logging
import os
import posixpath
import pwd
import zlib
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Tuple

import attrs
from aiohttp import web

from ...errors import ProtocolError
from ...protocol.connect import EnvelopeDecoder, Message, encode_envelope

__all__ = [
    "CODE_TO_HTTP",
    "MAX_REQUEST_BYTES",
    "RpcError",
    "ServerStream",
    "UnsupportedMediaType",
    "UserInfo",
    "basic_username",
    "decode_b64",
    "errno_text",
    "error_response",
    "expand_and_resolve",
    "group_name",
    "json_response",
    "lookup_user",
    "os_error_text",
    "parse_timeout_ms",
    "read_stream_request",
    "read_unary_request",
    "request_user",
    "stream_messages",
    "unsupported_response",
    "user_name",
]

log = logging.getLogger(__name__)

#: Largest request message the agent accepts (a Start request carries argv and envs).
MAX_REQUEST_BYTES = 16 * 1024 * 1024

#: connect-go v1.18.1 ``connectCodeToHTTP``.
CODE_TO_HTTP: Mapping[str, int] = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}

_STREAM_TYPES = ("application/connect+json",)
_UNARY_TYPES = ("application/json",)


class RpcError(Exception):
    """A Connect error answered by the agent: ``code`` (snake_case) and ``message``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code if code in CODE_TO_HTTP else "unknown"
        self.message = message

    @property
    def http_status(self) -> int:
        """The HTTP status of this error on a unary call."""
        return CODE_TO_HTTP[self.code]

    def to_json(self) -> Dict[str, str]:
        """The Connect error object ``{"code", "message"}``."""
        return {"code": self.code, "message": self.message}


class UnsupportedMediaType(Exception):
    """The request's Content-Type is not one this route speaks (answered with HTTP 415)."""


def json_response(obj: Any, status: int = 200, *, charset: bool = False) -> web.Response:
    """A JSON answer with an exact ``Content-Type`` (connect-go sends no charset parameter)."""
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    ctype = "application/json; charset=utf-8" if charset else "application/json"
    return web.Response(status=status, body=body, headers={"Content-Type": ctype})


def error_response(err: RpcError) -> web.Response:
    """The unary answer for ``err``: its HTTP status and ``{"code", "message"}``."""
    return json_response(err.to_json(), err.http_status)


def _media_type(request: web.BaseRequest) -> str:
    return request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()


def _unsupported(accept: str) -> web.Response:
    return web.Response(status=415, headers={"Accept-Post": accept})


def _check_protocol_version(request: web.BaseRequest) -> None:
    version = request.headers.get("Connect-Protocol-Version")
    if version is not None and version.strip() != "1":
        raise RpcError(
            "invalid_argument",
            f'connect-protocol-version must be "1": got "{version.strip()}"',
        )


async def _read_body(request: web.BaseRequest, limit: int) -> bytes:
    """Read the whole (possibly chunked) request body, refusing more than ``limit`` bytes."""
    parts = []
    total = 0
    async for chunk in request.content.iter_any():
        total += len(chunk)
        if total > limit:
            raise RpcError("resource_exhausted", f"message size is larger than {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _decode_content(request: web.BaseRequest, body: bytes, header: str) -> bytes:
    encoding = request.headers.get(header, "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        try:
            return zlib.decompress(body, wbits=47)
        except zlib.error as exc:
            raise RpcError("invalid_argument", f"decompress gzip: {exc}") from None
    raise RpcError(
        "unimplemented", f'unknown compression "{encoding}": supported encodings are gzip'
    )


def _parse_object(payload: bytes) -> Dict[str, Any]:
    if not payload:
        raise RpcError("invalid_argument", "zero-length payload is not a valid JSON object")
    try:
        obj = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RpcError("invalid_argument", f"unmarshal message: {exc}") from None
    if not isinstance(obj, dict):
        raise RpcError("invalid_argument", "unmarshal message: not a JSON object")
    return obj


async def read_unary_request(request: web.BaseRequest) -> Dict[str, Any]:
    """Read a unary Connect JSON request body (``application/json``).

    Raises:
        RpcError: the body is empty, not a JSON object, too large or badly compressed.
        UnsupportedMediaType: the Content-Type is not JSON (callers answer 415).
    """
    if _media_type(request) not in _UNARY_TYPES:
        raise UnsupportedMediaType(", ".join(_UNARY_TYPES))
    _check_protocol_version(request)
    body = await _read_body(request, MAX_REQUEST_BYTES)
    return _parse_object(_decode_content(request, body, "Content-Encoding"))


async def read_stream_request(request: web.BaseRequest) -> Dict[str, Any]:
    """Read the single request message of a server-streaming RPC.

    ``application/connect+json`` bodies carry exactly one envelope (chunked or not); for
    robustness an ``application/json`` body is taken as the bare message.

    Raises:
        RpcError: malformed envelope or JSON, compressed envelope, too large.
        UnsupportedMediaType: any other Content-Type (callers answer 415).
    """
    media = _media_type(request)
    if media in _UNARY_TYPES:
        body = await _read_body(request, MAX_REQUEST_BYTES)
        return _parse_object(_decode_content(request, body, "Content-Encoding"))
    if media not in _STREAM_TYPES:
        raise UnsupportedMediaType(", ".join(_STREAM_TYPES + _UNARY_TYPES))
    _check_protocol_version(request)
    decoder = EnvelopeDecoder(
        max_message_bytes=MAX_REQUEST_BYTES, max_json_bytes=MAX_REQUEST_BYTES
    )
    messages: List[Any] = []
    try:
        async for chunk in request.content.iter_any():
            decoder.feed(chunk)
            messages.extend(decoder)
    except ProtocolError as exc:
        raise RpcError("invalid_argument", f"protocol error: {exc}") from None
    if decoder.buffered:
        raise RpcError("invalid_argument", "protocol error: incomplete envelope")
    data = [m.data for m in messages if isinstance(m, Message)]
    if len(data) != 1:
        raise RpcError(
            "invalid_argument",
            f"protocol error: expected exactly one request message, got {len(data)}",
        )
    return data[0]


async def stream_messages(request: web.BaseRequest) -> AsyncIterator[Dict[str, Any]]:
    """The messages of a client-streaming request (``application/connect+json``), each as
    soon as its envelope is complete.

    Raises:
        RpcError: a malformed or compressed envelope, a message that is not a JSON object,
            or a body that ends inside an envelope.
        UnsupportedMediaType: any other Content-Type (callers answer 415).
    """
    if _media_type(request) not in _STREAM_TYPES:
        raise UnsupportedMediaType(", ".join(_STREAM_TYPES))
    _check_protocol_version(request)
    decoder = EnvelopeDecoder(
        max_message_bytes=MAX_REQUEST_BYTES, max_json_bytes=MAX_REQUEST_BYTES
    )
    try:
        async for chunk in request.content.iter_any():
            decoder.feed(chunk)
            for message in decoder:
                if isinstance(message, Message):
                    if not isinstance(message.data, dict):
                        raise RpcError("invalid_argument", "unmarshal message: not a JSON object")
                    yield message.data
    except ProtocolError as exc:
        raise RpcError("invalid_argument", f"protocol error: {exc}") from None
    if decoder.buffered:
        raise RpcError("unknown", "error streaming input: protocol error: incomplete envelope")


def unsupported_response(exc: Exception) -> web.Response:
    """HTTP 415 for a request whose Content-Type the route does not speak."""
    return _unsupported(str(exc))


def parse_timeout_ms(request: web.BaseRequest) -> Optional[float]:
    """The ``Connect-Timeout-Ms`` header in seconds (``None`` when absent or zero).

    Raises:
        RpcError: ``invalid_argument`` when the header is not 1 to 10 decimal digits.
    """
    raw = request.headers.get("Connect-Timeout-Ms")
    if raw is None:
        return None
    raw = raw.strip()
    if not raw.isdigit() or not raw.isascii() or len(raw) > 10:
        raise RpcError("invalid_argument", f"protocol error: invalid timeout {raw!r}")
    value = int(raw)
    return value / 1000.0 if value > 0 else None


def decode_b64(value: Any, what: str) -> bytes:
    """Decode a proto3 JSON ``bytes`` value (standard or URL-safe base64, padding optional)."""
    if not isinstance(value, str):
        raise RpcError("invalid_argument", f"unmarshal message: {what} is not a base64 string")
    text = value.strip()
    text += "=" * (-len(text) % 4)
    try:
        if "-" in text or "_" in text:
            return base64.urlsafe_b64decode(text)
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RpcError(
            "invalid_argument", f"unmarshal message: {what} is not valid base64"
        ) from None


class ServerStream:
    """One Connect server-stream answer: HTTP 200, envelopes, then the end-of-stream frame.

    Headers are sent lazily by the first :meth:`send` or by :meth:`finish`, so an error found
    before anything was streamed still goes out as HTTP 200 with an end-of-stream error (what
    connect-go does). Writes await the transport's drain: a slow reader slows the producer.
    """

    def __init__(self, request: web.BaseRequest) -> None:
        self._request = request
        self._resp = web.StreamResponse(
            status=200, headers={"Content-Type": "application/connect+json"}
        )
        self._prepared = False
        self._finished = False

    @property
    def response(self) -> web.StreamResponse:
        """The underlying aiohttp response (return it from the handler)."""
        return self._resp

    async def _prepare(self) -> None:
        if not self._prepared:
            self._prepared = True
            await self._resp.prepare(self._request)

    async def send(self, message: Mapping[str, Any]) -> None:
        """Send one data envelope.

        Raises:
            ConnectionError: the client went away (stop streaming; the process lives on).
        """
        await self._prepare()
        await self._resp.write(encode_envelope(message))

    async def finish(self, error: Optional[RpcError] = None) -> web.StreamResponse:
        """Send the end-of-stream frame (``{}`` or ``{"error": …}``) and end the body.

        Never raises for a client that already went away.
        """
        if self._finished:
            return self._resp
        self._finished = True
        trailer: Dict[str, Any] = {"error": error.to_json()} if error is not None else {}
        try:
            await self._prepare()
            await self._resp.write(encode_envelope(trailer, end_stream=True))
            await self._resp.write_eof()
        except (ConnectionError, RuntimeError, OSError) as exc:
            log.debug("stream client gone before end-of-stream: %s", exc.__class__.__name__)
        return self._resp


@attrs.frozen
class UserInfo:
    """An OS account as envd sees it: name, ids, home directory and all group ids."""

    name: str
    uid: int
    gid: int
    home: str
    groups: Tuple[int, ...]


def lookup_user(name: str) -> Optional[UserInfo]:
    """Look ``name`` up in the passwd database (``None`` when unknown)."""
    if not name or "\x00" in name:
        return None
    try:
        entry = pwd.getpwnam(name)
    except (KeyError, UnicodeError, ValueError):
        return None
    try:
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except OSError:
        groups = (entry.pw_gid,)
    return UserInfo(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, groups)


def basic_username(header: Optional[str]) -> Optional[str]:
    """The user name of an ``Authorization: Basic`` header; ``None`` if absent or not Basic."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    user, sep, _ = decoded.partition(":")
    if not sep:
        return None
    return user


def request_user(request: web.BaseRequest, default_user: str) -> UserInfo:
    """The user of an RPC request: Basic auth's user name, else the default user.

    Raises:
        RpcError: ``unauthenticated`` ``invalid username: '<name>'`` for an unknown user.
    """
    name = basic_username(request.headers.get("Authorization"))
    if name is None:
        name = default_user
    info = lookup_user(name)
    if info is None:
        raise RpcError("unauthenticated", f"invalid username: '{name}'")
    return info


def group_name(gid: int) -> str:
    """A group's name, or its number as text when unknown."""
    try:
        return grp.getgrgid(gid).gr_name
    except (KeyError, OverflowError):
        return str(gid)


def user_name(uid: int) -> str:
    """A user's name, or its number as text when unknown."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def expand_and_resolve(path: str, user: UserInfo, default: Optional[str] = None) -> str:
    """envd's ``ExpandAndResolve``: ``~``/``~/x`` expand to the home, relative paths join it.

    An empty ``path`` becomes ``default`` when given, else the user's home. Absolute paths
    are returned unchanged (not normalised), as envd does.

    Raises:
        RpcError: ``invalid_argument`` for ``~other`` or a path containing NUL.
    """
    if "\x00" in path:
        raise RpcError("invalid_argument", "invalid path: contains a NUL byte")
    if not path and default:
        path = default
    if path.startswith("~"):
        if len(path) > 1 and path[1] not in "/\\":
            raise RpcError(
                "invalid_argument",
                f"failed to expand path '{path}' for user '{user.name}': "
                "cannot expand user-specific home dir",
            )
        path = posixpath.normpath(user.home + "/" + path[1:])
    if path.startswith("/"):
        return path
    return posixpath.normpath(posixpath.join(user.home, path))


def errno_text(exc: OSError) -> str:
    """Go's text for an errno: the C message with a lower-case first letter."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return reason[:1].lower() + reason[1:]


def os_error_text(op: str, path: str, exc: OSError) -> str:
    """Go's ``*PathError`` text: ``"<op> <path>: <lower-case strerror>"``."""
    return f"{op} {path}: {errno_text(exc)}"
