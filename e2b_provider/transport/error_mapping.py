"""The one seam between requests/urllib3 failures and the library's errors.

This module owns :func:`map_transport_errors` (a requests, urllib3, ``http.client`` or socket
error becomes :class:`~e2b_provider.errors.Cancelled`,
:class:`~e2b_provider.errors.TransportTimeout`, :class:`~e2b_provider.errors.ConfigError` or
:class:`~e2b_provider.errors.TransportError`, with the reason in plain words),
:func:`error_from_response` and :func:`parse_error_body` (an HTTP error answer becomes the right
:class:`~e2b_provider.errors.E2BHttpError` subclass), and :func:`safe_url`, the only form in
which a URL goes into a message: scheme, host, port and path, never a query string, user info
or header, where secrets (the API key, the envd access token, signed-URL signatures) could be.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import http.client
import json as json_mod
import socket
import urllib.parse
from typing import Iterator, Mapping, Optional, Tuple, Type, Union

import requests
import requests.utils
import urllib3
import urllib3.exceptions

from ..cancel import CancelToken
from ..errors import (
    AuthenticationError,
    Cancelled,
    ConfigError,
    Conflict,
    E2BHttpError,
    E2BProviderError,
    NotFound,
    TransportError,
    TransportTimeout,
)
from .response import HttpResponse

__all__ = [
    "error_from_response",
    "map_transport_errors",
    "parse_error_body",
    "redirect_error",
    "safe_url",
]


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the exceptions it wraps in ``args``, and its cause/context chain (bounded)."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < 32:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        for a in getattr(e, "args", ()):
            if isinstance(a, BaseException):
                todo.append(a)
        reason = getattr(e, "reason", None)
        if isinstance(reason, BaseException):
            todo.append(reason)
        if e.__cause__ is not None:
            todo.append(e.__cause__)
        if e.__context__ is not None:
            todo.append(e.__context__)


def _is_timeout(exc: BaseException) -> bool:
    for e in _chain(exc):
        if isinstance(e, (requests.exceptions.ConnectTimeout, requests.exceptions.ReadTimeout)):
            return True
        if isinstance(e, urllib3.exceptions.ReadTimeoutError):
            return True
        if isinstance(e, urllib3.exceptions.ConnectTimeoutError) and not isinstance(
            e, urllib3.exceptions.NewConnectionError
        ):
            return True
        if isinstance(e, socket.timeout):  # TimeoutError on 3.10+
            return True
    return False


def _detail(exc: BaseException) -> str:
    """Exception class names (outer/inner) and an errno name: never the text, which has URLs."""
    names = []
    err_name = ""
    for e in _chain(exc):
        n = type(e).__name__
        if n not in names:
            names.append(n)
        if not err_name and isinstance(e, OSError) and isinstance(e.errno, int):
            err_name = errno_mod.errorcode.get(e.errno, "")
    text = "/".join(names[:3])
    return f"{text}, {err_name}" if err_name else text


_TRANSPORT_EXCEPTIONS: Tuple[Type[BaseException], ...] = (
    requests.exceptions.RequestException,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    OSError,  # includes socket.timeout, ssl.SSLError, ConnectionError
)
_BAD_URL_EXCEPTIONS: Tuple[Type[BaseException], ...] = (
    requests.exceptions.InvalidURL,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidSchema,
    urllib3.exceptions.LocationValueError,
)


def safe_url(url: str) -> str:
    """``scheme://host:port/path`` of ``url``, for messages: never its user info, query or
    fragment, where a secret (a password, a signed URL's signature) could be."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "an unreadable URL"
    scheme = parts.scheme.lower()
    if ":" in host:
        host = f"[{host}]"
    port = port or {"http": 80, "https": 443}.get(scheme)
    netloc = f"{host}:{port}" if port else host
    return urllib.parse.urlunsplit((scheme, netloc, parts.path, "", ""))


#: What an errno means to a user whose connection failed.
_ERRNO_WHY = {
    errno_mod.ECONNREFUSED: "connection refused (nothing listens there)",
    errno_mod.ECONNRESET: "the connection was reset",
    errno_mod.ENETUNREACH: "the network is unreachable",
    errno_mod.EHOSTUNREACH: "the host is unreachable",
    errno_mod.ETIMEDOUT: "the connection timed out",
    errno_mod.EPIPE: "the connection was closed while sending",
}


def _why(exc: BaseException) -> str:
    """Why a connection failed, in plain words ("" when nothing better than the class)."""
    proxy = False
    why = ""
    for e in _chain(exc):
        if isinstance(e, urllib3.exceptions.ProxyError):
            proxy = True
        elif why:
            continue
        elif isinstance(e, socket.gaierror) or type(e).__name__ == "NameResolutionError":
            why = "the host name could not be resolved"
        elif isinstance(e, OSError) and e.errno in _ERRNO_WHY:
            why = _ERRNO_WHY[e.errno]
        elif isinstance(e, (http.client.RemoteDisconnected, http.client.IncompleteRead)):
            why = "the connection was closed before the answer was complete"
    if proxy:
        return f"the proxy failed: {why}" if why else "the proxy failed"
    return why


def _where(url: str, proxies: Optional[Mapping[str, str]]) -> str:
    """``url`` for a message, and the proxy it went through, if any (its origin only)."""
    where = safe_url(url) if url else "E2B"
    proxy = requests.utils.select_proxy(url, dict(proxies)) if url and proxies else None
    if proxy:
        where += f" through the proxy {safe_url(proxy).rstrip('/')}"
    return where


@contextlib.contextmanager
def map_transport_errors(
    cancel: Optional[CancelToken],
    operation: str,
    url: str = "",
    proxies: Optional[Mapping[str, str]] = None,
) -> Iterator[None]:
    """The one exception seam between requests/urllib3 and the library's errors.

    On entry, a token that already fired raises :class:`Cancelled`. On exit with a
    requests, urllib3, ``http.client`` or socket error: :class:`Cancelled` if the token has
    fired (the error was most likely our own abort), else :class:`TransportTimeout` for a
    connect or read timeout, :class:`ConfigError` for an unusable URL, and
    :class:`TransportError` for everything else (refused, reset, TLS, truncated answer).
    Messages say which URL failed (scheme, host, port and path only, see :func:`safe_url`),
    through which proxy, and why. The original exception is always chained
    (``raise ... from exc``). Library errors, ``KeyboardInterrupt`` and programming errors
    pass through unchanged.

    Args:
        cancel: the caller's cancel token, or None.
        operation: what is being done, e.g. ``"POST /v2/sandboxes"`` (goes into messages;
            must not contain secrets).
        url: the request's URL (only its safe part goes into messages).
        proxies: the proxies the request was sent with (to name the one used).

    Raises:
        Cancelled, TransportTimeout, TransportError, ConfigError: see above.
    """
    if cancel is not None:
        cancel.raise_if_cancelled()
    try:
        yield
    except E2BProviderError:
        raise
    except _TRANSPORT_EXCEPTIONS as exc:
        if cancel is not None and cancel.cancelled:
            raise Cancelled(cancel.reason) from exc
        what = f"E2B {operation}" if operation else "E2B request"
        if isinstance(exc, _BAD_URL_EXCEPTIONS):
            raise ConfigError(f"{what}: invalid URL ({type(exc).__name__})") from exc
        where = _where(url, proxies)
        if _is_timeout(exc):
            raise TransportTimeout(f"{what} timed out waiting for {where} ({_detail(exc)})"
                                   ) from exc
        if any(isinstance(e, requests.exceptions.SSLError) for e in _chain(exc)):
            raise TransportError(f"{what}: TLS failure with {where} ({_detail(exc)})") from exc
        why = _why(exc)
        raise TransportError(
            f"{what}: connection to {where} failed{': ' + why if why else ''} "
            f"({_detail(exc)})"
        ) from exc


def error_from_response(resp: HttpResponse, operation: str) -> E2BHttpError:
    """Build the exception for an HTTP error answer (the caller raises it).

    The body is parsed as the E2B/Connect error JSON ``{code, message, error_code}``; a body
    that is not JSON becomes the message. The error class is :class:`AuthenticationError`
    for 401/403, :class:`NotFound` for 404, :class:`Conflict` for 409, and plain
    :class:`E2BHttpError` otherwise. The message is cut to 300 characters by the error class.

    Args:
        resp: the answer.
        operation: what was being done, e.g. ``"POST /v2/sandboxes"``.

    Returns:
        The exception, with ``status``, ``code``, ``error_code`` and ``operation`` set.
    """
    message, code, error_code = parse_error_body(resp.body)
    cls: type = E2BHttpError
    if resp.status in (401, 403):
        cls = AuthenticationError
    elif resp.status == 404:
        cls = NotFound
    elif resp.status == 409:
        cls = Conflict
    err: E2BHttpError = cls(
        resp.status, message, code, error_code=error_code, operation=operation
    )
    return err


def parse_error_body(body: bytes) -> Tuple[str, Union[int, str, None], Optional[str]]:
    """``(message, code, error_code)`` from an error body; non-JSON text becomes the message."""
    text = body[:64 * 1024].decode("utf-8", errors="replace").strip()
    message = text
    code: Union[int, str, None] = None
    error_code: Optional[str] = None
    try:
        obj = json_mod.loads(text) if text else None
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        m = obj.get("message")
        message = m if isinstance(m, str) else text
        c = obj.get("code")
        if isinstance(c, (int, str)) and not isinstance(c, bool):
            code = c
        ec = obj.get("error_code")
        if isinstance(ec, str) and ec:
            error_code = ec
    return message, code, error_code


def redirect_error(status: int, operation: str) -> E2BHttpError:
    """The error of a 3xx answer (redirects are never followed). Its ``Location`` header is
    deliberately not echoed: its query could carry a secret."""
    return E2BHttpError(status, "unexpected redirect (redirects are never followed)",
                        operation=operation)

