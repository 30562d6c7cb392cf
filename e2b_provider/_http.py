"""The HTTP transport: the only module that imports requests or urllib3.

This module owns :class:`Transport` (one composed ``requests.Session`` with a sized
``HTTPAdapter``, no retries, no redirects, no cookies, no ``~/.netrc``), the buffered
:meth:`Transport.request` that returns a frozen :class:`HttpResponse` and never raises for an
HTTP error status, the streaming :meth:`Transport.open_stream` whose :class:`Stream` can be
aborted from any thread, the one exception seam :func:`map_transport_errors`, and
:func:`error_from_response`, which turns an error answer into the right
:class:`~e2b_provider.errors.E2BHttpError` subclass.

Cancellation: a request registers a callback on its :class:`~e2b_provider.CancelToken`. When
the token fires, the callback shuts the request's socket down (``shutdown(2)`` is the only
call that reliably wakes a thread blocked in ``recv``; ``close()`` does not), so the caller's
thread wakes at once and raises :class:`~e2b_provider.errors.Cancelled`. The socket is found
through a small per-request "abort slot" that the pool's connections publish themselves into
while they serve that request, and leave again before they go back to the pool, so a late
cancel can never hit a connection that another request is already using. A cancel that
arrives while the TCP or TLS connection is still being set up takes effect as soon as it is
set up, or when the connect timeout ends, whichever comes first.

No message built here contains a URL, a query string or a header: secrets (the API key, the
envd access token, signed-URL signatures) could be in any of them. Messages name the
operation and the exception class only.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import http.client
import http.cookiejar
import json as json_mod
import logging
import socket
import threading
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple, Type, Union

import attrs
import requests
import requests.adapters
import requests.auth
import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.poolmanager

from ._version import __version__
from .cancel import CancelToken
from .errors import (
    AuthenticationError,
    Cancelled,
    ConfigError,
    Conflict,
    E2BHttpError,
    E2BProviderError,
    NotFound,
    ProtocolError,
    TransportError,
    TransportTimeout,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_BODY",
    "HttpResponse",
    "Stream",
    "Transport",
    "error_from_response",
    "map_transport_errors",
    "parse_error_body",
]

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = 10.0
#: Largest buffered body :meth:`Transport.request` accepts unless told otherwise.
DEFAULT_MAX_BODY = 1 << 20
_READ_CHUNK = 64 * 1024

Params = Union[Mapping[str, str], None]


# --------------------------------------------------------------------------------------
# values
# --------------------------------------------------------------------------------------


@attrs.frozen
class HttpResponse:
    """A complete, buffered HTTP answer.

    Attributes:
        status: the HTTP status code.
        headers: the response headers, keys in lower case (repeated headers joined by ", ").
        body: the body (at most the ``max_body`` the request allowed).
    """

    status: int
    headers: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    body: bytes = b""

    @property
    def ok(self) -> bool:
        """True for a 2xx status."""
        return 200 <= self.status < 300

    def json(self, operation: str = "") -> Any:
        """The body parsed as JSON (``None`` for an empty body).

        Raises:
            ProtocolError: the body is not UTF-8 JSON.
        """
        if not self.body.strip():
            return None
        try:
            return json_mod.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            what = f"E2B {operation}" if operation else "E2B"
            raise ProtocolError(
                f"{what} answered HTTP {self.status} with a body that is not JSON"
            ) from None


def _lower_headers(headers: Mapping[str, str]) -> Dict[str, str]:
    return {str(k).lower(): str(v) for k, v in headers.items()}


# --------------------------------------------------------------------------------------
# error mapping
# --------------------------------------------------------------------------------------


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


@contextlib.contextmanager
def map_transport_errors(token: Optional[CancelToken], operation: str) -> Iterator[None]:
    """The one exception seam between requests/urllib3 and the library's errors.

    On entry, a token that already fired raises :class:`Cancelled`. On exit with a
    requests, urllib3, ``http.client`` or socket error: :class:`Cancelled` if the token has
    fired (the error was most likely our own abort), else :class:`TransportTimeout` for a
    connect or read timeout, :class:`ConfigError` for an unusable URL, and
    :class:`TransportError` for everything else (refused, reset, TLS, truncated answer).
    The original exception is always chained (``raise ... from exc``). Library errors,
    ``KeyboardInterrupt`` and programming errors pass through unchanged.

    Args:
        token: the caller's cancel token, or None.
        operation: what is being done, e.g. ``"POST /v2/sandboxes"`` (goes into messages;
            must not contain secrets).

    Raises:
        Cancelled, TransportTimeout, TransportError, ConfigError: see above.
    """
    if token is not None:
        token.raise_if_cancelled()
    try:
        yield
    except E2BProviderError:
        raise
    except _TRANSPORT_EXCEPTIONS as exc:
        if token is not None and token.cancelled:
            raise Cancelled(token.reason) from exc
        what = f"E2B {operation}" if operation else "E2B request"
        if isinstance(exc, _BAD_URL_EXCEPTIONS):
            raise ConfigError(f"{what}: invalid URL ({type(exc).__name__})") from exc
        if _is_timeout(exc):
            raise TransportTimeout(f"{what} timed out ({_detail(exc)})") from exc
        if any(isinstance(e, requests.exceptions.SSLError) for e in _chain(exc)):
            raise TransportError(f"{what}: TLS failure ({_detail(exc)})") from exc
        raise TransportError(f"{what}: connection failed ({_detail(exc)})") from exc


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


def _redirect_error(status: int, operation: str) -> E2BHttpError:
    # The Location header is deliberately not echoed: its query could carry a secret.
    return E2BHttpError(status, "unexpected redirect (redirects are never followed)",
                        operation=operation)


def _refuse_redirects(operation: str) -> Callable[..., Any]:
    """A response hook that refuses a 3xx before requests looks at it.

    Even with ``allow_redirects=False`` requests reads a redirect's whole body to prepare
    the next request; the hook closes the answer first and raises.
    """

    def hook(r: requests.Response, *args: Any, **kwargs: Any) -> requests.Response:
        if 300 <= r.status_code < 400:
            r.close()
            raise _redirect_error(r.status_code, operation)
        return r

    return hook


# --------------------------------------------------------------------------------------
# abortable connections
# --------------------------------------------------------------------------------------

_tls = threading.local()


class _AbortSlot:
    """Where one request's connection is published so another thread can shut it down."""

    __slots__ = ("_conn", "_done", "_fired", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: Optional[urllib3.connection.HTTPConnection] = None
        self._fired = False
        self._done = False

    @property
    def fired(self) -> bool:
        return self._fired

    def attach(self, conn: urllib3.connection.HTTPConnection) -> None:
        with self._lock:
            if self._done:
                return
            self._conn = conn
            conn.__dict__["_e2b_slot"] = self
            if self._fired:
                _shutdown_conn(conn)

    def detach(self, conn: object) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None

    def fire(self) -> None:
        with self._lock:
            if self._done or self._fired:
                return
            self._fired = True
            if self._conn is not None:
                # shutdown(2) does not block; doing it under the lock means a connection
                # cannot be released to the pool (detach) half-way through.
                _shutdown_conn(self._conn)

    def finish(self) -> None:
        with self._lock:
            self._done = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.__dict__.pop("_e2b_slot", None)


def _shutdown_conn(conn: urllib3.connection.HTTPConnection) -> None:
    sock = getattr(conn, "sock", None)
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except (OSError, ValueError, AttributeError):
        pass


def _publish(conn: urllib3.connection.HTTPConnection) -> None:
    slot: Optional[_AbortSlot] = getattr(_tls, "slot", None)
    if slot is not None and conn.sock is not None:
        slot.attach(conn)


class _AbortableHTTPConnection(urllib3.connection.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _publish(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _publish(self)  # a pooled connection is already connected
        super().request(*args, **kwargs)


class _AbortableHTTPSConnection(urllib3.connection.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _publish(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _publish(self)
        super().request(*args, **kwargs)


def _leave_slot(conn: object) -> None:
    if conn is not None:
        slot = getattr(conn, "__dict__", {}).pop("_e2b_slot", None)
        if isinstance(slot, _AbortSlot):
            slot.detach(conn)


class _HTTPPool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _AbortableHTTPConnection

    def _put_conn(self, conn: Any) -> None:
        # Leave the abort slot *before* the connection is visible to other requests.
        _leave_slot(conn)
        super()._put_conn(conn)


class _HTTPSPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _AbortableHTTPSConnection

    def _put_conn(self, conn: Any) -> None:
        _leave_slot(conn)
        super()._put_conn(conn)


_POOL_CLASSES = {"http": _HTTPPool, "https": _HTTPSPool}


class _Adapter(requests.adapters.HTTPAdapter):
    """An HTTPAdapter whose pools hand out abortable connections."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOL_CLASSES)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if type(manager) is urllib3.poolmanager.ProxyManager:
            manager.pool_classes_by_scheme = dict(_POOL_CLASSES)
        return manager


class _NoCookies(http.cookiejar.CookiePolicy):
    """Never store or send cookies: sandboxes must not share state through a cookie jar."""

    netscape = True
    rfc2965 = False
    hide_cookie2 = True

    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False

    def return_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False

    def domain_return_ok(self, domain: str, request: Any) -> bool:
        return False

    def path_return_ok(self, path: str, request: Any) -> bool:
        return False


class _NoNetrc(requests.auth.AuthBase):
    """An explicit no-op auth, so requests never applies ``~/.netrc`` over our headers."""

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        return r


_NO_NETRC = _NoNetrc()


@contextlib.contextmanager
def _abortable(token: Optional[CancelToken]) -> Iterator[_AbortSlot]:
    """Publish a fresh abort slot for this thread's request and wire it to ``token``."""
    slot = _AbortSlot()
    unregister = token.on_cancel(lambda _r: slot.fire()) if token is not None else None
    prev = getattr(_tls, "slot", None)
    _tls.slot = slot
    try:
        yield slot
    finally:
        _tls.slot = prev
        if unregister is not None:
            unregister()
        slot.finish()


# --------------------------------------------------------------------------------------
# streams
# --------------------------------------------------------------------------------------


class Stream:
    """A streaming HTTP answer whose body is read in pieces as they arrive.

    :meth:`read1` returns as soon as any bytes are available (it never waits to fill its
    buffer). :meth:`abort` may be called from any thread at any time, also while another
    thread is blocked in :meth:`read1`: it shuts the socket down so that read wakes at once.
    After an abort every read raises ``TransportError("stream aborted")``; :attr:`aborted`
    tells that apart from a peer that dropped the connection (also a ``TransportError``).
    """

    def __init__(self, resp: requests.Response, operation: str) -> None:
        self._resp = resp
        self._raw: Any = resp.raw
        self._operation = operation
        self.status: int = resp.status_code
        self.headers: Mapping[str, str] = _lower_headers(resp.headers)
        self._lock = threading.Lock()
        self._aborted = False
        self._closed = False
        self._reading = False
        self._eof = False

    @property
    def aborted(self) -> bool:
        """True once :meth:`abort` was called."""
        return self._aborted

    @property
    def closed(self) -> bool:
        """True once the stream was closed (or aborted and released)."""
        return self._closed

    def read1(self, n: int = _READ_CHUNK) -> bytes:
        """Read up to ``n`` bytes, returning as soon as any are available.

        Returns:
            The bytes, or ``b""`` at the end of the body.

        Raises:
            TransportError: the stream was aborted ("stream aborted"), or the connection
                dropped or broke mid-body.
            TransportTimeout: no byte arrived within the read timeout.
        """
        with self._lock:
            if self._aborted:
                raise TransportError(f"E2B {self._operation}: stream aborted")
            if self._closed or self._eof:
                return b""
            if self._reading:
                raise RuntimeError("Stream.read1 called from two threads at once")
            self._reading = True
        data = b""
        try:
            try:
                data = self._raw.read1(n)
            except Exception as exc:
                if self._aborted:
                    raise TransportError(f"E2B {self._operation}: stream aborted") from exc
                with map_transport_errors(None, self._operation):
                    raise
        finally:
            with self._lock:
                self._reading = False
                close_now = self._aborted and not self._closed
            if close_now:
                self._release()
        if not data:
            if self._aborted:
                raise TransportError(f"E2B {self._operation}: stream aborted")
            self._eof = True
        return bytes(data)

    def read_all(self, max_bytes: int, *, truncate: bool = False) -> bytes:
        """Read the rest of the body.

        Args:
            max_bytes: the most bytes to accept.
            truncate: when True, stop quietly after ``max_bytes`` (for error bodies);
                otherwise a longer body raises.

        Raises:
            ProtocolError: the body is longer than ``max_bytes`` (and ``truncate`` is False).
            TransportError, TransportTimeout: as :meth:`read1`.
        """
        buf = bytearray()
        while True:
            chunk = self.read1(_READ_CHUNK)
            if not chunk:
                return bytes(buf)
            buf += chunk
            if len(buf) > max_bytes:
                if truncate:
                    return bytes(buf[:max_bytes])
                self.abort()
                raise ProtocolError(
                    f"E2B {self._operation}: answer is larger than {max_bytes} bytes"
                )

    def abort(self) -> None:
        """Shut the connection down now; thread-safe and idempotent, a no-op after close."""
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            if self._closed:
                return
            # shutdown() first: close() from another thread would block behind a read.
            # urllib3 >= 2.5 refuses (RuntimeError) once the connection went back to the pool.
            try:
                self._raw.shutdown()
            except (ValueError, RuntimeError, OSError, AttributeError, TypeError):
                pass
            reading = self._reading
        if not reading:
            self._release()

    def close(self) -> None:
        """Release the answer (idempotent). A reader blocked in another thread is woken."""
        with self._lock:
            if self._closed:
                return
            reading = self._reading
            if reading:
                # Never close under a reader's feet: wake it, it releases on its way out.
                self._aborted = True
                try:
                    self._raw.shutdown()
                except (ValueError, RuntimeError, OSError, AttributeError, TypeError):
                    pass
                return
        self._release()

    def _release(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._resp.close()
        except Exception:  # closing a broken connection must never mask the real error
            log.debug("closing a stream failed", exc_info=True)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------
# transport
# --------------------------------------------------------------------------------------


def _positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number of seconds")
    return float(value)


class Transport:
    """A thread-safe HTTP client for the control plane and envd.

    One ``requests.Session`` is shared by all threads. It is never mutated after
    construction, stores no cookies, ignores ``~/.netrc``, never follows redirects and
    never retries on its own. Size the pools for the workload: ``pool_connections`` is the
    number of hosts kept (every E2B sandbox is its own host), ``pool_maxsize`` the
    connections kept per host (concurrent commands on one sandbox).

    Args:
        pool_connections: hosts whose connection pools are kept.
        pool_maxsize: connections kept per host (more may be opened; they are not kept).
        connect_timeout: seconds to establish a connection (TCP and TLS).
        user_agent: the ``User-Agent`` header.
    """

    def __init__(
        self,
        *,
        pool_connections: int = 32,
        pool_maxsize: int = 256,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        user_agent: str = f"e2b-provider/{__version__}",
    ) -> None:
        for name, n in (("pool_connections", pool_connections), ("pool_maxsize", pool_maxsize)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"{name} must be a positive int")
        self._connect_timeout = _positive(connect_timeout, "connect_timeout")
        session = requests.Session()
        session.cookies.set_policy(_NoCookies())
        session.headers["User-Agent"] = user_agent
        adapter = _Adapter(
            pool_connections=pool_connections,
            pool_maxsize=pool_maxsize,
            max_retries=0,
            pool_block=False,
        )
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        self._session = session
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Close every pooled connection (idempotent). Later requests raise TransportError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._session.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise TransportError(f"E2B {operation}: the transport is closed")

    def _send(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]],
        params: Params,
        json: Any,
        data: Any,
        files: Any,
        read_timeout: float,
        connect_timeout: Optional[float],
        operation: str,
    ) -> requests.Response:
        return self._session.request(
            method,
            url,
            headers=dict(headers) if headers else None,
            params=dict(params) if params else None,
            json=json,
            data=data,
            files=files,
            auth=_NO_NETRC,
            timeout=(connect_timeout or self._connect_timeout, read_timeout),
            allow_redirects=False,
            hooks={"response": [_refuse_redirects(operation)]},
            stream=True,
        )

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        params: Params = None,
        json: Any = None,
        data: Any = None,
        files: Any = None,
        read_timeout: float,
        token: Optional[CancelToken] = None,
        operation: str,
        max_body: int = DEFAULT_MAX_BODY,
        connect_timeout: Optional[float] = None,
    ) -> HttpResponse:
        """Send one request and buffer its whole answer.

        HTTP error statuses are returned, not raised (the caller decides); a 3xx answer
        raises, because redirects are never followed.

        Args:
            method: the HTTP method.
            url: the absolute URL.
            headers: extra request headers.
            params: query parameters.
            json: a JSON body (sets ``Content-Type: application/json``).
            data: a raw body (bytes) or form fields.
            files: multipart files, as for ``requests``.
            read_timeout: seconds to wait for each piece of the answer.
            token: aborts the request at once when it fires.
            operation: names the call in messages, e.g. ``"POST /v2/sandboxes"``.
            max_body: the largest body accepted.
            connect_timeout: overrides the transport's connect timeout.

        Returns:
            The answer.

        Raises:
            Cancelled: ``token`` fired (before or during the request).
            E2BHttpError: the answer was a redirect.
            ProtocolError: the body is larger than ``max_body``.
            TransportError, TransportTimeout, ConfigError: see :func:`map_transport_errors`.
        """
        self._check_open(operation)
        read_timeout = _positive(read_timeout, "read_timeout")
        with _abortable(token) as slot:
            with map_transport_errors(token, operation):
                resp = self._send(
                    method, url, headers=headers, params=params, json=json, data=data,
                    files=files, read_timeout=read_timeout, connect_timeout=connect_timeout,
                    operation=operation,
                )
            try:
                length = resp.headers.get("content-length", "")
                if length.isdigit() and int(length) > max_body:
                    raise ProtocolError(
                        f"E2B {operation}: answer of {int(length)} bytes is larger than "
                        f"{max_body} bytes"
                    )
                buf = bytearray()
                with map_transport_errors(token, operation):
                    while True:
                        chunk = resp.raw.read(_READ_CHUNK, decode_content=True)
                        if not chunk:
                            break
                        buf += chunk
                        if len(buf) > max_body:
                            raise ProtocolError(
                                f"E2B {operation}: answer is larger than {max_body} bytes"
                            )
                if slot.fired and token is not None:
                    # Our own shutdown can look like a clean end of a close-delimited body.
                    raise Cancelled(token.reason)
                return HttpResponse(resp.status_code, _lower_headers(resp.headers), bytes(buf))
            finally:
                resp.close()

    def open_stream(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        data: bytes,
        read_timeout: float,
        token: Optional[CancelToken] = None,
        operation: str,
        connect_timeout: Optional[float] = None,
    ) -> Stream:
        """Send one request and return its answer as a :class:`Stream` once headers arrive.

        ``token`` guards only the opening: if it fires before the response headers arrive,
        the connection is shut down and :class:`Cancelled` raised. Once the stream is
        returned the token is detached; stop the stream with :meth:`Stream.abort`.
        Any status is returned (check :attr:`Stream.status`) except a 3xx, which raises.

        Args:
            method: the HTTP method (envd streams use POST).
            url: the absolute URL.
            headers: request headers.
            data: the request body.
            read_timeout: seconds to wait for each piece of the answer; a peer silent for
                longer makes the read raise :class:`TransportTimeout`.
            token: aborts the opening when it fires.
            operation: names the call in messages.
            connect_timeout: overrides the transport's connect timeout.

        Raises:
            Cancelled, E2BHttpError (redirect), TransportError, TransportTimeout, ConfigError.
        """
        self._check_open(operation)
        read_timeout = _positive(read_timeout, "read_timeout")
        with _abortable(token) as slot:
            with map_transport_errors(token, operation):
                resp = self._send(
                    method, url, headers=headers, params=None, json=None, data=data,
                    files=None, read_timeout=read_timeout, connect_timeout=connect_timeout,
                    operation=operation,
                )
            if slot.fired and token is not None:
                resp.close()
                raise Cancelled(token.reason)
        return Stream(resp, operation)
