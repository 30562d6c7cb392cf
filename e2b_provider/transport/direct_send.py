"""A stream's request sent with urllib3 directly, on the pool ``requests`` chose for its URL.

:class:`~e2b_provider.transport.client.Transport` sends a stream's request to a URL it sent
one to before (a POST of bytes, no proxy) without ``requests``' preparation, adapter and
response: most of the client's work per exec on a warm sandbox. This module owns that send,
:func:`send_direct`, the light :class:`Answer` it returns, and :func:`requests_error`, which
turns urllib3's exceptions into the ones ``requests`` would raise, so such a request fails
with the same exceptions, chained the same way, and so with the same messages.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple, Type, Union

import requests
import requests.utils
import urllib3
import urllib3.exceptions

from .pool import HTTPPool

__all__ = ["KNOWN_MAX", "Answer", "KnownRequests", "Response", "requests_error", "send_direct"]

#: Entries of each cache of :class:`KnownRequests` (emptied when full).
KNOWN_MAX = 4096


#: What ``HTTPAdapter.send`` raises for the reason of a urllib3 ``MaxRetryError`` (the first
#: class that matches; any other reason: ``ConnectionError``).
_RETRY_REASONS: Tuple[Tuple[Type[BaseException], Type[BaseException]], ...] = (
    (urllib3.exceptions.ResponseError, requests.exceptions.RetryError),
    (urllib3.exceptions.ProxyError, requests.exceptions.ProxyError),
    (urllib3.exceptions.SSLError, requests.exceptions.SSLError),
)
#: What ``HTTPAdapter.send`` raises for the other urllib3 errors it maps (the first class
#: that matches; any other error is raised unchanged).
_ERRORS: Tuple[Tuple[Type[BaseException], Type[BaseException]], ...] = (
    (urllib3.exceptions.ClosedPoolError, requests.exceptions.ConnectionError),
    (urllib3.exceptions.ProxyError, requests.exceptions.ProxyError),
    (urllib3.exceptions.SSLError, requests.exceptions.SSLError),
    (urllib3.exceptions.ReadTimeoutError, requests.exceptions.ReadTimeout),
    (urllib3.exceptions.InvalidHeader, requests.exceptions.InvalidHeader),
)


def requests_error(exc: BaseException) -> BaseException:
    """The ``requests`` exception ``HTTPAdapter.send`` raises for the urllib3 (or socket)
    error ``exc`` of ``urlopen`` (``exc`` itself when it raises that unchanged), so that a
    request sent by :func:`send_direct` fails with the same
    exceptions, chained the same way, and so with the same messages."""
    if isinstance(exc, (urllib3.exceptions.ProtocolError, OSError)):
        return requests.exceptions.ConnectionError(exc)
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        reason = exc.reason
        if isinstance(reason, urllib3.exceptions.ConnectTimeoutError) and not isinstance(
            reason, urllib3.exceptions.NewConnectionError
        ):
            return requests.exceptions.ConnectTimeout(exc)
        for cause, raised in _RETRY_REASONS:
            if isinstance(reason, cause):
                return raised(exc)
        return requests.exceptions.ConnectionError(exc)
    for cause, raised in _ERRORS:
        if isinstance(exc, cause):
            return raised(exc)
    return exc


class Answer:
    """The answer of a request sent by :func:`send_direct`: what the transport
    uses of a ``requests.Response`` (``status_code``, ``headers``, ``raw``, ``url``,
    ``close()``), without the cost of making one (its cookie jar above all)."""

    __slots__ = ("headers", "raw", "status_code", "url")

    def __init__(self, raw: Any, url: str) -> None:
        self.raw = raw
        self.status_code: int = raw.status
        found = raw.headers
        # one entry per name, repeated headers joined by ", " (as requests makes them), the
        # names in lower case (how the library looks them up)
        self.headers: Dict[str, str] = {name.lower(): found[name] for name in found}
        self.url = url

    def close(self) -> None:
        """As ``requests.Response.close()`` for an answer whose content was not read whole:
        before the end of the body this closes the connection."""
        self.raw.close()
        release = getattr(self.raw, "release_conn", None)
        if release is not None:
            release()


#: The answer a request gets: a ``requests.Response``, or an :class:`Answer`.
Response = Union[requests.Response, Answer]


def send_direct(
    pool: HTTPPool,
    method: str,
    path: str,
    *,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    timeout: urllib3.Timeout,
    retries: Any,
) -> Answer:
    """Send one request on ``pool`` with urllib3 and return its answer once its head arrived:
    as ``requests``' adapter sends it (no redirects followed, the body neither preloaded nor
    decoded, not chunked), its failures raised as the adapter raises them
    (:func:`requests_error`).

    Args:
        pool: the pool ``requests`` chose for ``url``.
        method: the HTTP method.
        path: the request path ``requests`` prepared for ``url``.
        url: the request's URL (kept on the answer).
        body: the request body.
        headers: every header to send, ``Content-Length`` included.
        timeout: the connect and read timeouts.
        retries: the adapter's retries (none).
    """
    try:
        raw = pool.urlopen(
            method,
            path,
            body=body,
            headers=headers,
            redirect=False,
            assert_same_host=False,
            preload_content=False,
            decode_content=False,
            retries=retries,
            timeout=timeout,
            chunked=False,
        )
    except Exception as exc:
        mapped = requests_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc
    return Answer(raw, url)


class KnownRequests:
    """What ``requests`` showed of the stream requests it sent without a proxy: for each
    URL, the pool it chose and the path it sent; and the headers it found valid. Each cache
    holds at most :data:`KNOWN_MAX` entries (emptied when full)."""

    def __init__(self) -> None:
        self._paths: Dict[str, Tuple[HTTPPool, str]] = {}
        self._valid: Dict[Tuple[str, str], bool] = {}

    def remember(self, url: str, resp: requests.Response, proxies: Mapping[str, str]) -> None:
        """After ``requests`` sent a stream's request to ``url`` without a proxy, remember
        the pool it chose and the path it sent, for :func:`send_direct`."""
        pool = getattr(resp.raw, "_pool", None)
        prep = resp.request
        if proxies or not isinstance(pool, HTTPPool) or prep is None:
            return
        path = prep.path_url
        if url not in self._paths:
            if len(self._paths) >= KNOWN_MAX:
                self._paths = {}
            self._paths[url] = (pool, path)
            for item in (prep.headers or {}).items():
                self._note_valid(item)

    def get(self, url: str) -> Optional[Tuple[HTTPPool, str]]:
        """The pool and path remembered for ``url``, if any."""
        return self._paths.get(url)

    def forget(self, url: str) -> None:
        """Forget what was remembered for ``url``."""
        self._paths.pop(url, None)

    def forget_all(self) -> None:
        """Forget every URL (the headers found valid stay valid)."""
        self._paths = {}

    def check_header(self, header: Tuple[str, str]) -> None:
        """Check ``header`` as ``requests`` checks it, unless it was found valid before.

        Raises:
            requests.exceptions.InvalidHeader: it is not valid.
        """
        if header not in self._valid:
            requests.utils.check_header_validity(header)
            self._note_valid(header)

    def _note_valid(self, header: Tuple[str, str]) -> None:
        if len(self._valid) >= KNOWN_MAX:
            self._valid = {}
        self._valid[header] = True
