"""The HTTP client, :class:`Transport`: buffered requests and streams, each within a deadline.

This module owns :class:`Transport` (requests it prepares itself and sends through one sized
``requests`` ``HTTPAdapter``: no retries, no redirects, no cookies, no ``~/.netrc``, the
environment's proxy settings read once), the buffered :meth:`Transport.request` that returns
a frozen :class:`~e2b_provider.transport.response.HttpResponse` and never raises for an HTTP
error status, the streaming :meth:`Transport.open_stream` whose
:class:`~e2b_provider.transport.stream.Stream` can be aborted from any thread, and
:meth:`Transport.open_raw_stream`, whose :class:`~e2b_provider.transport.raw_stream.RawStream`
has a connection of its own. Every failure goes through
:func:`~e2b_provider.transport.error_mapping.map_transport_errors`; a cancel shuts the request's
socket down through its abort slot (see :mod:`e2b_provider.transport.pool`).

Deadlines: every request has a total bound (its :class:`~e2b_provider.cancel.Deadline`), not
only per-read timeouts, so a peer that trickles its headers or body a byte at a time, accepts
and never answers, reads an upload slowly or stalls a TLS handshake cannot hold a caller
longer than that. The shared :class:`~e2b_provider._watchdog.Watchdog` shuts the request's
socket down when the deadline passes — through the same abort slot a cancel uses, so it
never touches a pooled connection another request owns — and the connect, send and per-read
timeouts are clamped to the time left. The request then raises
:class:`~e2b_provider.errors.TransportTimeout`. Only name resolution (the system resolver) is
outside the bound. For a stream the deadline bounds its opening (until the response
headers), or, when asked, the whole body.

Messages name the operation and the URL as scheme, host, port and path only: never a query
string, user info or header, where secrets could be.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type, Union

import requests
import requests.utils
import urllib3

from .._version import __version__
from .._watchdog import TimerHandle, Watchdog
from ..cancel import CancelToken, Deadline
from ..errors import (
    Cancelled,
    ConfigError,
    E2BProviderError,
    ProtocolError,
    TransportError,
    TransportTimeout,
)
from .direct_send import Answer, KnownRequests, Response, send_direct
from .error_mapping import map_transport_errors, redirect_error, safe_url
from .pool import MIN_WAIT_SECONDS, AbortSlot, Adapter, HTTPPool, answer_sock, publishing
from .raw_stream import RawStream, read_head, send_on_own_connection
from .response import HttpResponse, lower_headers
from .stream import READ_CHUNK, Stream

__all__ = ["DEFAULT_CONNECT_TIMEOUT_SECONDS", "DEFAULT_MAX_BODY", "Transport"]

#: Seconds to establish a connection (TCP and TLS) unless told otherwise.
DEFAULT_CONNECT_TIMEOUT_SECONDS = 10.0
#: Largest buffered body :meth:`Transport.request` accepts unless told otherwise.
DEFAULT_MAX_BODY = 1 << 20

Params = Union[Mapping[str, str], None]


def _overrun(operation: str, url: str, limit: Deadline, began: float) -> str:
    """The message of a request (begun at ``began``) that ``limit`` cut short."""
    total = limit.at - began
    return (f"E2B {operation} timed out: {safe_url(url)} gave no complete answer "
            f"within {total:.3g} s")


def _stopped_error(
    cancel: Optional[CancelToken], overrun: Callable[[], str]
) -> E2BProviderError:
    """Why an opening whose abort slot fired stops: :class:`Cancelled` when ``cancel`` fired,
    else its deadline passed (:class:`TransportTimeout`, ``overrun()`` its message)."""
    if cancel is not None and cancel.cancelled:
        return Cancelled(cancel.reason)
    return TransportTimeout(overrun())


def _overrun_error(
    slot: AbortSlot,
    exc: BaseException,
    overrun: Callable[[], str],
    kinds: Union[Type[BaseException], Tuple[Type[BaseException], ...]],
) -> Optional[TransportTimeout]:
    """The :class:`TransportTimeout` to raise instead of ``exc``, an error of ``kinds`` that
    an opening raised once its deadline shut it down (None: raise ``exc`` as it is)."""
    if slot.expired and isinstance(exc, kinds) and not isinstance(exc, TransportTimeout):
        return TransportTimeout(overrun())
    return None


def _positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number of seconds")
    return float(value)


def _prepared(method: str, url: str, query: Optional[str]) -> requests.PreparedRequest:
    """A request with its method and URL (``query`` added) prepared as ``requests``
    prepares them.

    Raises:
        requests.exceptions.InvalidSchema: the URL is not http or https.
    """
    prep = requests.PreparedRequest()
    prep.prepare_method(method)
    prep.prepare_url(url, query)
    if not (prep.url or "").lower().startswith(("http://", "https://")):
        raise requests.exceptions.InvalidSchema("no connection adapter for the URL scheme")
    return prep


def _refuse_redirect(resp: Response, operation: str) -> None:
    """Close a 3xx answer and raise: redirects are never followed (its ``Location`` header
    is not looked at)."""
    if 300 <= resp.status_code < 400:
        resp.close()
        raise redirect_error(resp.status_code, operation)


def _origin(url: str) -> str:
    """``scheme://host:port`` of a prepared URL (which always has a path)."""
    start = url.find("://")
    end = url.find("/", start + 3) if start >= 0 else -1
    return url[:end] if end >= 0 else url


_PROXY_CACHE_MAX = 4096


class Transport:
    """A thread-safe HTTP client for the control plane and envd.

    One ``requests`` HTTPAdapter (its urllib3 pools) is shared by all threads. Requests are
    prepared here rather than by a ``requests.Session``: no cookies are stored or sent,
    ``~/.netrc`` is ignored, redirects are never followed and nothing is retried. Sized for
    the workload: ``pool_connections`` is the number of hosts kept (every E2B sandbox is
    its own host), ``pool_maxsize`` the connections kept per host (concurrent commands on
    one sandbox). Connections are kept alive between requests (idle ones for at most
    :data:`~e2b_provider.transport.pool.IDLE_CONNECTION_SECONDS`).

    The environment is read as ``requests`` reads it, but once: the proxies
    (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, lower case first) and the CA bundle
    (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``) when the transport is made, and whether
    ``NO_PROXY`` exempts a host on its first request. Later changes to the environment do
    not affect an existing transport.

    Every request has a total deadline (see the module's header); the ``watchdog``'s timer
    thread enforces it.

    Args:
        pool_connections: hosts whose connection pools are kept.
        pool_maxsize: connections kept per host (more may be opened; they are not kept).
        connect_timeout: seconds to establish a connection (TCP and TLS).
        user_agent: the ``User-Agent`` header.
        watchdog: the timer thread that enforces deadlines; default the process-wide one.
    """

    def __init__(
        self,
        *,
        pool_connections: int = 32,
        pool_maxsize: int = 256,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
        user_agent: str = f"e2b-provider/{__version__}",
        watchdog: Optional[Watchdog] = None,
    ) -> None:
        for name, n in (("pool_connections", pool_connections), ("pool_maxsize", pool_maxsize)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"{name} must be a positive int")
        self._connect_timeout = _positive(connect_timeout, "connect_timeout")
        self._adapter = Adapter(
            pool_connections=pool_connections,
            pool_maxsize=pool_maxsize,
            max_retries=0,
            pool_block=False,
        )
        headers = dict(requests.utils.default_headers())
        headers["User-Agent"] = user_agent
        self._headers: Dict[str, str] = headers
        self._env_proxies: Dict[str, str] = dict(urllib.request.getproxies())
        self._verify: Union[bool, str] = (
            os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
        )
        self._proxies: Dict[str, Dict[str, str]] = {}
        # Streams sent before, without a proxy: the pool and request path requests chose
        # for the URL (see _send_known), and the headers requests found valid.
        self._known = KnownRequests()
        self._lock = threading.Lock()
        self._closed = False
        self._watchdog = watchdog

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Close every pooled connection (idempotent). Later requests raise TransportError.

        A stream or request still in flight keeps its connection until it ends; then the
        connection is closed (the pools are gone), not kept.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._known.forget_all()
        self._adapter.close()  # type: ignore[no-untyped-call,unused-ignore]

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise TransportError(f"E2B {operation}: the transport is closed")

    def _proxies_for(self, url: str) -> Dict[str, str]:
        """The proxies for ``url``'s host: the environment's, or none if ``NO_PROXY``
        exempts the host (decided once per host, as ``requests`` decides per request)."""
        if not self._env_proxies:
            return self._env_proxies
        key = _origin(url)
        proxies = self._proxies.get(key)
        if proxies is None:
            bypass = requests.utils.should_bypass_proxies(url, no_proxy=None)
            proxies = {} if bypass else self._env_proxies
            if len(self._proxies) >= _PROXY_CACHE_MAX:
                self._proxies.clear()
            self._proxies[key] = proxies
        return proxies

    def _limit(
        self, deadline: Optional[Deadline], read_timeout: float, operation: str
    ) -> Deadline:
        """The request's deadline: the caller's, or connect plus read timeout from now.

        Raises:
            TransportTimeout: it has passed already (nothing is sent).
        """
        if deadline is None:
            limit = Deadline.after(self._connect_timeout + read_timeout)
        elif not isinstance(deadline, Deadline):
            raise ConfigError("deadline must be a Deadline")
        else:
            limit = deadline
        if limit.expired():
            raise TransportTimeout(f"E2B {operation} timed out: no time was left to send it")
        return limit

    def _arm(self, limit: Deadline) -> Tuple[AbortSlot, Optional[TimerHandle]]:
        """A new request's abort slot, and the watchdog's timer that fires it (shuts the
        request down) when ``limit`` passes (None: ``limit`` never passes)."""
        slot = AbortSlot()
        left = limit.remaining()
        if left == math.inf:
            return slot, None
        wd = self._watchdog
        if wd is None or wd.closed:
            wd = Watchdog.default()
        return slot, wd.call_later(left, slot.expire)

    def _timeouts(
        self,
        operation: str,
        read_timeout: float,
        connect_timeout: Optional[float],
        limit: Deadline,
    ) -> Tuple[float, float]:
        """The connect and read timeouts of a request, each clamped to the time ``limit``
        leaves.

        Raises:
            TransportError: the transport is closed.
            ConfigError: ``read_timeout`` is not a positive number.
        """
        self._check_open(operation)
        read_timeout = _positive(read_timeout, "read_timeout")
        left = max(limit.remaining(), MIN_WAIT_SECONDS)
        return min(connect_timeout or self._connect_timeout, left), min(read_timeout, left)

    def _checked_headers(self, headers: Optional[Mapping[str, str]]) -> Dict[str, str]:
        """The transport's default headers updated with ``headers`` (later names win
        whatever their case, as in ``requests``), each checked as ``requests`` checks it
        (a header found valid before is not checked again).

        Raises:
            requests.exceptions.InvalidHeader: a header is not valid.
        """
        merged: Dict[str, Tuple[str, str]] = {k.lower(): (k, v) for k, v in self._headers.items()}
        if headers:
            for k, v in headers.items():
                merged[k.lower()] = (k, v)
        send: Dict[str, str] = {}
        for item in merged.values():
            self._known.check_header(item)
            send[item[0]] = item[1]
        return send

    def _send(
        self,
        method: str,
        url: str,
        *,
        cancel: Optional[CancelToken],
        operation: str,
        read_timeout: float,
        connect_timeout: Optional[float],
        limit: Deadline,
        headers: Optional[Mapping[str, str]],
        params: Params = None,
        json: Any = None,
        data: Any = None,
        files: Any = None,
        stream: bool = False,
    ) -> Response:
        """Send one request (the caller publishes its abort slot) and return the answer once
        its headers arrived; every failure goes through :func:`map_transport_errors`.

        The connect and read timeouts are clamped to the time ``limit`` leaves. A stream's
        request (``stream``) that :meth:`_known_for` allows is sent by
        :meth:`_send_known`; one sent through ``requests`` is remembered for that."""
        timeouts = self._timeouts(operation, read_timeout, connect_timeout, limit)
        if stream and not params and json is None and files is None:
            known = self._known_for(url, method, data)
            if known is not None:
                return self._send_known(
                    known, method, url, cancel=cancel, operation=operation, timeouts=timeouts,
                    headers=headers, data=data,
                )
        proxies: Dict[str, str] = {}  # filled in before anything can fail to connect
        with map_transport_errors(cancel, operation, url, proxies):
            proxies.update(self._proxies_for(url))
            # Encoded here as requests would, but without its per-call type probing.
            query = (
                urllib.parse.urlencode([(k, v) for k, v in params.items()]) if params else None
            )
            prep = _prepared(method, url, query)
            if headers:
                merged = dict(self._headers)
                merged.update(headers)  # later keys win, also against a different case
                prep.prepare_headers(merged)
            else:
                prep.prepare_headers(self._headers)
            prep.prepare_body(data, files, json)
            resp = self._adapter.send(
                prep,
                stream=True,
                timeout=timeouts,
                verify=self._verify,
                cert=None,
                proxies=proxies,
            )
            _refuse_redirect(resp, operation)
            if stream and not params and json is None and files is None:
                self._known.remember(url, resp, proxies)
            return resp

    def _known_for(self, url: str, method: str, data: Any) -> Optional[Tuple[HTTPPool, str]]:
        """The pool and path of ``url`` when a stream's request may skip ``requests``: a
        POST of bytes to a URL ``requests`` has sent a stream to before, without a proxy
        (then and now), on a pool still in use."""
        known = self._known.get(url)
        if known is None or method != "POST" or not isinstance(data, bytes) or not data:
            return None
        if known[0]._e2b_retired or self._proxies_for(url):
            self._known.forget(url)
            return None
        return known

    def _send_known(
        self,
        known: Tuple[HTTPPool, str],
        method: str,
        url: str,
        *,
        cancel: Optional[CancelToken],
        operation: str,
        timeouts: Tuple[float, float],
        headers: Optional[Mapping[str, str]],
        data: bytes,
    ) -> Answer:
        """:meth:`_send` for a request :meth:`_known_for` allows: the same request, on the
        same pool, with the same timeouts (``timeouts``: connect and read, as
        :meth:`_timeouts` clamped them), errors and messages, sent with urllib3 directly
        instead of through ``requests``' preparation, adapter and response (most of the
        client's work per exec on a warm sandbox).

        Exactly what :meth:`_send` would send: the transport's default headers updated with
        ``headers`` (later names win whatever their case, as in ``requests``), each checked
        as ``requests`` checks it, ``Content-Length``, and the path ``requests`` prepared
        for ``url``; no retries, no redirects followed."""
        connect, read = timeouts
        pool, path = known
        with map_transport_errors(cancel, operation, url):
            send = self._checked_headers(headers)
            send["Content-Length"] = str(len(data))
            resp = send_direct(
                pool, method, path, url=url, body=data, headers=send,
                timeout=urllib3.Timeout(connect=connect, read=read),
                retries=self._adapter.max_retries,
            )
            _refuse_redirect(resp, operation)
            return resp

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
        cancel: Optional[CancelToken] = None,
        operation: str,
        max_body: int = DEFAULT_MAX_BODY,
        connect_timeout: Optional[float] = None,
        deadline: Optional[Deadline] = None,
    ) -> HttpResponse:
        """Send one request and buffer its whole answer, within a total deadline.

        HTTP error statuses are returned, not raised (the caller decides); a 3xx answer
        raises, because redirects are never followed. An answer read to its end leaves its
        connection in the pool for the next request; one that is not (too large, cancelled,
        broken, past its deadline) closes it.

        Args:
            method: the HTTP method.
            url: the absolute URL.
            headers: extra request headers.
            params: query parameters.
            json: a JSON body (sets ``Content-Type: application/json``).
            data: a raw body (bytes) or form fields.
            files: multipart files, as for ``requests``.
            read_timeout: seconds to wait for each piece of the answer.
            cancel: aborts the request at once when it fires.
            operation: names the call in messages, e.g. ``"POST /v2/sandboxes"``.
            max_body: the largest body accepted.
            connect_timeout: overrides the transport's connect timeout.
            deadline: when the whole request (connect, send, wait, read) must be over,
                whatever the peer does; default ``connect_timeout + read_timeout`` from now.

        Returns:
            The answer.

        Raises:
            Cancelled: ``cancel`` fired (before or during the request).
            TransportTimeout: the deadline passed, or the peer was silent for longer than
                ``read_timeout`` (or a connect took longer than ``connect_timeout``).
            E2BHttpError: the answer was a redirect.
            ProtocolError: the body is larger than ``max_body``.
            TransportError, ConfigError: see :func:`map_transport_errors`.
        """
        began = time.monotonic()
        limit = self._limit(deadline, read_timeout, operation)
        slot, timer = self._arm(limit)
        try:
            with publishing(slot, cancel, limit):
                resp = self._send(
                    method, url, cancel=cancel, operation=operation, read_timeout=read_timeout,
                    connect_timeout=connect_timeout, limit=limit, headers=headers,
                    params=params, json=json, data=data, files=files,
                )
                try:
                    return self._read_body(
                        resp, cancel, slot, operation, max_body, read_timeout, limit, url
                    )
                finally:
                    # After the end of the body urllib3 has already put the connection back
                    # in the pool (this is then a no-op); before it, this closes it.
                    resp.close()
        except (TransportError, ProtocolError) as exc:
            if slot.expired:
                message = _overrun(operation, url, limit, began)
                if not isinstance(exc, TransportTimeout):
                    raise TransportTimeout(message) from exc
                exc.args = (message,)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            slot.finish()

    @staticmethod
    def _read_body(
        resp: Response,
        cancel: Optional[CancelToken],
        slot: AbortSlot,
        operation: str,
        max_body: int,
        read_timeout: float,
        limit: Deadline,
        url: str,
    ) -> HttpResponse:
        length = resp.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_body:
            raise ProtocolError(
                f"E2B {operation}: answer of {int(length)} bytes is larger than "
                f"{max_body} bytes"
            )
        buf = bytearray()
        with map_transport_errors(cancel, operation, url):
            while True:
                # While the connection is still ours (urllib3 gives it back to the pool, on
                # this thread, once the body ended), each read waits no longer than the
                # deadline leaves; the watchdog also shuts the socket down then, so a read
                # that gets a byte at a time ends too.
                sock = answer_sock(resp.raw)
                if sock is not None:
                    wait = min(read_timeout, limit.remaining())
                    sock.settimeout(max(wait, MIN_WAIT_SECONDS))
                chunk = resp.raw.read(READ_CHUNK, decode_content=True)
                if not chunk:
                    break
                buf += chunk
                if len(buf) > max_body:
                    raise ProtocolError(
                        f"E2B {operation}: answer is larger than {max_body} bytes"
                    )
        if slot.fired:
            # Our own shutdown can look like a clean end of a close-delimited body.
            if cancel is not None and cancel.cancelled:
                raise Cancelled(cancel.reason)
            if slot.expired:
                raise TransportError(f"E2B {operation}: the answer was cut at its deadline")
        return HttpResponse(resp.status_code, lower_headers(resp.headers), bytes(buf))

    def open_stream(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        data: bytes,
        read_timeout: float,
        cancel: Optional[CancelToken] = None,
        operation: str,
        connect_timeout: Optional[float] = None,
        deadline: Optional[Deadline] = None,
        deadline_bounds_body: bool = False,
    ) -> Stream:
        """Send one request and return its answer as a :class:`Stream` once headers arrive.

        ``cancel`` guards only the opening: if it fires before the response headers arrive,
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
            cancel: aborts the opening when it fires.
            operation: names the call in messages.
            connect_timeout: overrides the transport's connect timeout.
            deadline: when the opening (connect, send, response headers) must be over,
                whatever the peer does; default ``connect_timeout + read_timeout`` from
                now. Past it the opening raises :class:`TransportTimeout`.
            deadline_bounds_body: the deadline also bounds the body: once it passes, the
                stream is shut down and its reads raise :class:`TransportTimeout` (for a
                download read as a stream). Otherwise only the read timeout bounds reads.

        Raises:
            Cancelled, E2BHttpError (redirect), TransportError, TransportTimeout, ConfigError.
        """
        began = time.monotonic()
        limit = self._limit(deadline, read_timeout, operation)
        # Its message is made only if the deadline passes.
        overrun = functools.partial(_overrun, operation, url, limit, began)
        slot, timer = self._arm(limit)
        try:
            with publishing(slot, cancel, limit):
                resp = self._send(
                    method, url, cancel=cancel, operation=operation, read_timeout=read_timeout,
                    connect_timeout=connect_timeout, limit=limit, headers=headers, data=data,
                    stream=True,
                )
            if not deadline_bounds_body and timer is not None:
                timer.cancel()
                timer = None
            if slot.fired:
                resp.close()
                raise _stopped_error(cancel, overrun)
            sock = answer_sock(resp.raw)
            if sock is not None:
                sock.settimeout(read_timeout)  # reads wait as long as asked, not what was left
        except BaseException as exc:
            if timer is not None:
                timer.cancel()
            slot.finish()
            timeout = _overrun_error(slot, exc, overrun, TransportError)
            if timeout is not None:
                raise timeout from exc
            raise
        return Stream(resp, operation, slot, timer=timer, overrun=overrun)

    def open_raw_stream(
        self,
        method: str,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        data: bytes,
        read_timeout: float,
        cancel: Optional[CancelToken] = None,
        operation: str,
        connect_timeout: Optional[float] = None,
        deadline: Optional[Deadline] = None,
    ) -> RawStream:
        """Send one request on a connection of its own and return its answer as a
        :class:`RawStream` once its head arrived.

        The connection is made as this transport makes every other (the proxy the
        environment names for the URL, its tunnel, TLS with the transport's CA bundle) but
        never comes from or goes back to the pool. The request is sent as :meth:`open_stream`
        sends it (the transport's headers, then ``headers``), asking for no content coding.
        ``cancel`` and ``deadline`` guard the opening (connect, send, the answer's head) as
        for :meth:`open_stream`; after that, only :meth:`RawStream.abort` and the stream's
        ``read_timeout`` (the longest silence accepted) end it.

        Raises:
            Cancelled, TransportError, TransportTimeout, ProtocolError, ConfigError.
        """
        self._check_open(operation)
        read_timeout = _positive(read_timeout, "read_timeout")
        began = time.monotonic()
        limit = self._limit(deadline, read_timeout, operation)
        overrun = functools.partial(_overrun, operation, url, limit, began)
        slot, timer = self._arm(limit)
        proxies: Dict[str, str] = {}
        conn: Any = None
        try:
            with publishing(slot, cancel, limit), map_transport_errors(
                cancel, operation, url, proxies
            ):
                proxies.update(self._proxies_for(url))
                send = self._checked_headers({**(headers or {}), "Accept-Encoding": "identity"})
                prep = _prepared(method, url, None)
                get = getattr(self._adapter, "get_connection_with_tls_context", None)
                if get is not None:
                    pool = get(prep, self._verify, proxies=proxies, cert=None)
                else:  # requests before 2.32.2
                    pool = self._adapter.get_connection(prep.url, proxies)
                left = max(limit.remaining(), MIN_WAIT_SECONDS)
                conn = pool._new_conn()
                conn.timeout = min(connect_timeout or self._connect_timeout, left)
                send_on_own_connection(conn, pool, method, prep, body=data, headers=send)
                head, framer, body, ended = read_head(conn.sock, limit, operation, url)
        except BaseException as exc:
            if conn is not None:
                conn.close()
            timeout = _overrun_error(slot, exc, overrun, (TransportError, ProtocolError))
            if timeout is not None:
                raise timeout from exc
            raise
        finally:
            if timer is not None:
                timer.cancel()
            slot.finish()  # from here on no deadline or cancel can reach the connection
        if slot.fired:  # it did just before: the socket is shut down
            conn.close()
            raise _stopped_error(cancel, overrun)
        return RawStream(conn, head, framer, body, ended, operation=operation, url=url,
                         read_timeout=read_timeout)

