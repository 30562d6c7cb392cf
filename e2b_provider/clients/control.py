"""The E2B control-plane client: create, connect (attach), pause, delete, list, get, timeout.

This module owns the JSON REST calls to the control plane (``X-API-KEY`` auth; the values
they return, :class:`SandboxInfo` and :class:`ListedSandbox`, are read by
:mod:`e2b_provider.clients.control_answers`), the retry policy for answers the
server marks as retryable, the reference's 409 handling on connect (with the November API's
permanent ``error_code`` values), and :meth:`ControlPlane.target_for`, which turns an answer
into an envd :class:`~e2b_provider.models.Target` and refuses a sandbox without an envd
access token. All I/O goes through :class:`~e2b_provider.transport.client.Transport`.

Retries (E2B SDK policy): an answer with ``Should-Retry: true``, or without that header and
with status 429, 502, 503 or 504, is retried up to 3 times after 0.2, 0.5 and 1 s (or the
answer's ``Retry-After``, capped at 5 s). ``Should-Retry: false`` is never retried. Waits go
through ``token.wait`` so a cancel ends them at once. Retried calls: list, get, delete,
connect, set_timeout (all idempotent), pause (unless ``retry=False``), and create only when an
``Idempotency-Key`` is sent.

Bounds: one request may take at most ``request_timeout`` seconds in total (default 60:
connect, send, wait for and read the answer, whatever the peer does), and one call — every
request it makes, its retries, its waits, 409 handling and list pages included — at most
``call_timeout`` seconds (default :data:`CALL_TIMEOUT_SECONDS`, 120), or less when the caller
passes an earlier ``deadline``. A retry is made only while at least :data:`RETRY_MIN_SECONDS`
seconds are left after its wait; otherwise the answer at hand is the call's answer. Past its
bound a call raises :class:`~e2b_provider.errors.TransportTimeout`.

No message built here contains the API key or an access token.
"""

from __future__ import annotations

import email.utils
import logging
import math
import re
import time
import urllib.parse
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..cancel import CancelToken, Deadline
from ..errors import (
    Cancelled,
    ConfigError,
    Conflict,
    E2BHttpError,
    E2BProviderError,
    InvalidArgument,
    MissingAccessToken,
    ProtocolError,
    SandboxGoneError,
    TransportTimeout,
    register_secret,
)
from ..models import Target
from ..protocol import validate as _validate
from ..protocol.e2b_facts import ENVD_PORT
from ..transport.client import Transport
from ..transport.error_mapping import error_from_response, parse_error_body
from ..transport.response import HttpResponse
from .control_answers import (
    ListedSandbox,
    SandboxInfo,
    listed_sandbox,
    sandbox_description,
    sandbox_info,
    show,
    valid_host,
)

__all__ = [
    "CALL_TIMEOUT_SECONDS",
    "CONNECT_CONFLICT_RETRIES",
    "CONNECT_CONFLICT_WAIT_SECONDS",
    "GUEST_UNRESPONSIVE",
    "LIST_MAX_PAGES",
    "PERMANENT_CONFLICT_CODES",
    "REQUEST_TIMEOUT_SECONDS",
    "RETRY_BACKOFF_SECONDS",
    "RETRY_MIN_SECONDS",
    "RETRY_AFTER_CAP_SECONDS",
    "ControlPlane",
]

log = logging.getLogger("e2b_provider")

#: How often attach retries a 409 on connect, and the wait between tries (the reference's).
CONNECT_CONFLICT_RETRIES = 5
#: A 409 on DELETE is retried this many times (0.5 s apart) before it is raised.
DELETE_CONFLICT_RETRIES = 3
CONNECT_CONFLICT_WAIT_SECONDS = 0.5
#: The 409 ``error_code`` of a snapshot taken while envd did not answer: only
#: ``memory: false`` can resume it.
GUEST_UNRESPONSIVE = "sandbox_snapshot_guest_agent_unresponsive"
#: 409 ``error_code`` values that waiting never clears: attach raises them at once. Other
#: 409s ("being killed", ``sandbox_start_in_flight``, no code) are transient and retried.
PERMANENT_CONFLICT_CODES = frozenset(
    {
        GUEST_UNRESPONSIVE,  # after the one memory:false reconnect
        "idempotency_request_mismatch",
        "snapshot_filesystem_only_unsupported_node",
    }
)
RETRY_STATUSES = frozenset({429, 502, 503, 504})
RETRY_BACKOFF_SECONDS = (0.2, 0.5, 1.0)
RETRY_AFTER_CAP_SECONDS = 5.0
#: The longest one control-plane request may take, in total (and its longest silence).
REQUEST_TIMEOUT_SECONDS = 60.0
#: The longest one control-plane call may take: its requests, retries and waits together.
CALL_TIMEOUT_SECONDS = 120.0
#: A retry (or a wait for a 409 to clear) is made only if this much time is left after it.
RETRY_MIN_SECONDS = 1.0
#: ``GET /v2/sandboxes`` page size (the server's maximum) and the page bound.
LIST_LIMIT = 100
LIST_MAX_PAGES = 1000
_LIST_MAX_BODY = 8 << 20
_IDEMPOTENCY_KEY_RE = re.compile(r"[a-z0-9-]{1,255}", re.ASCII)
_VALIDATION_PREFIX = "validation error:"
#: E2B's 400 message for a sandbox id of a shape it never issues (lowercased).
_INVALID_ID = "invalid sandbox id"
#: What an OpenAPI validator says when the route itself is missing (as opposed to a bad body,
#: which is also a "validation error: ...").
_ROUTE_MISSING = ("method not allowed", "no matching operation")


def _route_missing(message: str) -> bool:
    return message.startswith(_VALIDATION_PREFIX) and any(
        m in message.lower() for m in _ROUTE_MISSING
    )


def _predates_v2(route: str, message: str) -> ConfigError:
    """The error for a control plane that answered ``message`` because it lacks ``route``
    (a /v2 route)."""
    return ConfigError(
        f"the E2B control plane does not offer {route} (it answered {message[:120]!r}): it "
        "predates the /v2 API; upgrade it or set api_url to a newer deployment"
    )


def _check_http_url(url: object, what: str) -> str:
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{what} must be a non-empty http(s) URL")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what} must be an http(s) URL with a host")
    if parts.query or parts.fragment:
        raise ConfigError(f"{what} must not have a query or fragment")
    return url.rstrip("/")


def _retry_after(resp: HttpResponse) -> Optional[float]:
    """The answer's ``Retry-After`` in seconds (delta or HTTP date), capped; None if absent."""
    value = resp.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_SECONDS)


def _should_retry(resp: HttpResponse) -> bool:
    marker = resp.headers.get("should-retry")
    if marker is not None:
        return marker.strip().lower() == "true"
    return resp.status in RETRY_STATUSES


def _seconds(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgument(f"{what} must be a positive int of seconds, not {show(value)}")
    return value


class ControlPlane:
    """A client for the E2B control-plane REST API.

    Thread-safe: it holds only configuration and shares the transport.

    Args:
        transport: the HTTP transport.
        api_url: the API base URL, e.g. ``https://api.e2b.app``.
        api_key: the E2B API key (sent as ``X-API-KEY``; never logged or put in messages).
        domain: the configured sandbox domain (used when an answer names none).
        sandbox_url: when set, every envd request goes to this one base URL and is routed
            by the ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers (local emulator,
            self-hosted proxies); otherwise envd is at ``https://49983-<id>.<domain>``.
        request_timeout: the longest one control-plane request may take in total, in
            seconds (connect, send, wait for and read the answer; default 60).
        call_timeout: the longest one call may take, in seconds: all its requests,
            retries, waits and pages (default 120). A method's ``deadline`` may shorten it.

    Raises:
        ConfigError: a bad URL, key, domain or timeout.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        api_url: str,
        api_key: str,
        domain: str,
        sandbox_url: Optional[str] = None,
        request_timeout: float = REQUEST_TIMEOUT_SECONDS,
        call_timeout: float = CALL_TIMEOUT_SECONDS,
    ) -> None:
        if not isinstance(api_key, str) or not api_key.strip():
            raise ConfigError("api_key must be a non-empty string")
        register_secret(api_key, owner=self)
        self._transport = transport
        self._api_url = _check_http_url(api_url, "api_url")
        self._api_key = api_key
        try:
            self._domain = _validate.check_hostname(domain)
        except InvalidArgument as exc:
            raise ConfigError(str(exc)) from None
        self._sandbox_url = (
            _check_http_url(sandbox_url, "sandbox_url") if sandbox_url is not None else None
        )
        for name, value in (("request_timeout", request_timeout),
                            ("call_timeout", call_timeout)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 < value < math.inf
            ):
                raise ConfigError(f"{name} must be a positive number of seconds")
        self._timeout = float(request_timeout)
        self._call_timeout = float(call_timeout)

    def __repr__(self) -> str:
        return f"ControlPlane(api_url={self._api_url!r}, domain={self._domain!r})"

    @property
    def domain(self) -> str:
        """The configured sandbox domain."""
        return self._domain

    @property
    def call_timeout(self) -> float:
        """The longest one call may take, in seconds (retries and waits included)."""
        return self._call_timeout

    def bound(self, deadline: Optional[Deadline] = None) -> Deadline:
        """The deadline of a call starting now: its own bound, or ``deadline`` if earlier."""
        own = Deadline.after(self._call_timeout)
        if deadline is None:
            return own
        if not isinstance(deadline, Deadline):
            raise InvalidArgument("deadline must be a Deadline")
        return own.earliest(deadline)

    # -- plumbing ------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        cancel: Optional[CancelToken],
        json: Any = None,
        params: Optional[Mapping[str, str]] = None,
        headers: Optional[Mapping[str, str]] = None,
        retry: bool,
        deadline: Deadline,
        max_body: int = 1 << 20,
        operation: Optional[str] = None,
    ) -> HttpResponse:
        """One control-plane request, retried per the module's policy when ``retry``, all
        of it within ``deadline`` (each request also within ``request_timeout``)."""
        op = operation or f"{method} {path}"
        hdrs = {"X-API-KEY": self._api_key, "Accept": "application/json"}
        if headers:
            hdrs.update(headers)
        attempt = 0
        while True:
            _check_left(deadline, op)
            resp = self._transport.request(
                method,
                self._api_url + path,
                headers=hdrs,
                params=params,
                json=json,
                read_timeout=self._timeout,
                cancel=cancel,
                operation=op,
                max_body=max_body,
                deadline=deadline.earliest(Deadline.after(self._timeout)),
            )
            if not retry or attempt >= len(RETRY_BACKOFF_SECONDS) or not _should_retry(resp):
                return resp
            delay = _retry_after(resp)
            if delay is None:
                delay = RETRY_BACKOFF_SECONDS[attempt]
            if deadline.remaining() < delay + RETRY_MIN_SECONDS:
                return resp  # no time for another try: this answer is the call's answer
            attempt += 1
            log.debug("e2b_provider: %s answered %d; retry %d in %.2f s", op, resp.status,
                      attempt, delay)
            _wait(cancel, delay)

    def _unusable(self, resp: HttpResponse, operation: str, sandbox_id: Optional[str] = None
                  ) -> E2BProviderError:
        """The exception for an answer a call cannot use: a success status it does not
        expect is a ProtocolError, an error answer is :meth:`_error`'s."""
        if resp.ok:
            return ProtocolError(
                f"E2B {operation} answered with unexpected status {resp.status}"
            )
        return self._error(resp, operation, sandbox_id)

    def _error(self, resp: HttpResponse, operation: str, sandbox_id: Optional[str] = None
               ) -> E2BHttpError:
        """The exception for an error answer: "gone" for a real 404, else by status (a 400
        "Invalid sandbox ID" keeps the id in ``sandbox_id``)."""
        message, code, error_code = parse_error_body(resp.body)
        if (
            sandbox_id is not None
            and resp.status == 404
            and code == 404
            and not message.startswith(_VALIDATION_PREFIX)
        ):
            err: E2BHttpError = SandboxGoneError(
                f"E2B sandbox {sandbox_id} no longer exists",
                status=404,
                code=404,
                error_code=error_code,
                operation=operation,
            )
        else:
            err = error_from_response(resp, operation)
            if (
                sandbox_id is not None
                and resp.status == 400
                and message.strip().lower() == _INVALID_ID
            ):
                # E2B refuses the id's shape (a name passed as an id, say): keep which id.
                err.sandbox_id = sandbox_id  # type: ignore[attr-defined]
        err.retry_after = _retry_after(resp)  # type: ignore[attr-defined]
        return err

    def _path(self, template: str, sandbox_id: str) -> str:
        return template.format(id=urllib.parse.quote(sandbox_id, safe=""))

    # -- calls ---------------------------------------------------------------------------

    def create(
        self,
        body: Mapping[str, Any],
        *,
        cancel: Optional[CancelToken] = None,
        idempotency_key: Optional[str] = None,
        deadline: Optional[Deadline] = None,
    ) -> SandboxInfo:
        """Create a sandbox: ``POST /v2/sandboxes``.

        Args:
            body: the JSON body (``templateID``, ``metadata``, ``timeout``, ...).
            cancel: cancels the call.
            idempotency_key: sent as ``Idempotency-Key`` (1-255 of ``[a-z0-9-]``, e.g. a
                lowercase UUID); only then is a retryable answer retried, since the server
                then returns the same sandbox instead of creating a second one.
            deadline: ends the call earlier than its own bound (``call_timeout``).

        Returns:
            The new sandbox (``raw_status`` 201, or 200).

        Raises:
            ConfigError: the control plane predates ``POST /v2/sandboxes`` (it answers
                ``validation error: method not allowed``; a 400 about the body is an
                ordinary E2BHttpError).
            E2BHttpError: any other error answer (after retries).
            ProtocolError: an unusable answer (no or invalid sandbox id or domain).
            TransportTimeout: the call's bound passed.
            Cancelled, TransportError.
        """
        limit = self.bound(deadline)
        headers: Dict[str, str] = {}
        if idempotency_key is not None:
            if (
                not isinstance(idempotency_key, str)
                or _IDEMPOTENCY_KEY_RE.fullmatch(idempotency_key) is None
            ):
                raise InvalidArgument("idempotency_key must be 1-255 characters of [a-z0-9-]")
            headers["Idempotency-Key"] = idempotency_key
        op = "POST /v2/sandboxes"
        resp = self._call("POST", "/v2/sandboxes", cancel=cancel, json=dict(body),
                          headers=headers, retry=idempotency_key is not None, deadline=limit)
        if resp.status in (200, 201):
            return sandbox_info(resp, op, None, False, self._domain)
        if resp.status in (400, 404, 405):
            message = parse_error_body(resp.body)[0]
            if _route_missing(message):
                raise _predates_v2("POST /v2/sandboxes", message)
        raise self._unusable(resp, op)

    def connect(
        self,
        sandbox_id: str,
        *,
        timeout_seconds: int,
        memory: Optional[bool] = None,
        cancel: Optional[CancelToken] = None,
        deadline: Optional[Deadline] = None,
    ) -> SandboxInfo:
        """Connect to (and if paused, resume) a sandbox: ONE ``POST /v2/sandboxes/{id}/connect``.

        Only a running sandbox's TTL is extended, never shortened. No 409 handling here
        (see :meth:`attach`); retryable answers (429/5xx) are retried.

        Args:
            sandbox_id: the sandbox id.
            timeout_seconds: the TTL to ask for, in seconds.
            memory: ``False`` cold-boots a paused sandbox from its disk (sends
                ``"memory": false``); None or True restores memory (the field is omitted).
            cancel: cancels the call.
            deadline: ends the call earlier than its own bound (``call_timeout``).

        Returns:
            The sandbox; ``resumed`` is True for a 201 (it was paused).

        Raises:
            InvalidArgument: a bad id or timeout (before any I/O).
            SandboxGoneError: 404 with body code 404: the sandbox no longer exists.
            ConfigError: a route-level 404 (``validation error: ...``): the control plane
                has no ``/v2/.../connect``; this is never read as "gone".
            Conflict, E2BHttpError: other error answers.
            TransportTimeout: the call's bound passed.
            ProtocolError, Cancelled, TransportError.
        """
        _validate.check_sandbox_id(sandbox_id)
        limit = self.bound(deadline)
        body: Dict[str, Any] = {"timeout": _seconds(timeout_seconds, "timeout_seconds")}
        if memory is False:
            body["memory"] = False
        path = self._path("/v2/sandboxes/{id}/connect", sandbox_id)
        op = "POST /v2/sandboxes/{id}/connect"
        resp = self._call("POST", path, cancel=cancel, json=body, retry=True, operation=op,
                          deadline=limit)
        if resp.status in (200, 201):
            return sandbox_info(resp, op, sandbox_id, resp.status == 201, self._domain)
        if resp.status == 404:
            message = parse_error_body(resp.body)[0]
            if message.startswith(_VALIDATION_PREFIX):
                raise _predates_v2("POST /v2/sandboxes/{id}/connect", message)
        raise self._unusable(resp, op, sandbox_id)

    def attach(
        self,
        sandbox_id: str,
        *,
        timeout_seconds: int,
        cancel: Optional[CancelToken] = None,
        deadline: Optional[Deadline] = None,
    ) -> SandboxInfo:
        """:meth:`connect` with the reference's conflict handling.

        A 409 is retried up to 5 times, 0.5 s apart (the wait ends at once on cancel),
        except for 409s that waiting never clears: on
        ``sandbox_snapshot_guest_agent_unresponsive`` it reconnects ONCE with
        ``memory: false`` (cold boot; the sandbox's in-memory state and processes are
        dropped, and a warning is logged); the codes in :data:`PERMANENT_CONFLICT_CODES`
        are raised at once. Every connect and wait shares one bound (``call_timeout``, or
        ``deadline`` if earlier): a 409 is waited out only while time is left for it.

        Raises:
            Conflict: a permanent 409, or a 409 that did not clear after the retries.
            Cancelled: ``cancel`` fired (also during a wait).
            TransportTimeout: the call's bound passed.
            SandboxGoneError, ConfigError, E2BHttpError, ProtocolError, TransportError: as
                :meth:`connect`.
        """
        _validate.check_sandbox_id(sandbox_id)
        if cancel is not None:
            cancel.raise_if_cancelled()
        limit = self.bound(deadline)
        memory: Optional[bool] = None
        conflicts = 0
        while True:
            try:
                return self.connect(
                    sandbox_id, timeout_seconds=timeout_seconds, memory=memory, cancel=cancel,
                    deadline=limit,
                )
            except Conflict as exc:
                if exc.error_code == GUEST_UNRESPONSIVE and memory is None:
                    log.warning(
                        "e2b_provider: sandbox %s was paused while its guest agent did not "
                        "answer; resuming it with memory: false (cold boot): its in-memory "
                        "state and running processes were dropped",
                        sandbox_id,
                    )
                    memory = False
                    continue
                if exc.error_code in PERMANENT_CONFLICT_CODES:
                    raise
                if (
                    conflicts >= CONNECT_CONFLICT_RETRIES
                    or limit.remaining() < CONNECT_CONFLICT_WAIT_SECONDS + RETRY_MIN_SECONDS
                ):
                    raise
                conflicts += 1
                _wait(cancel, CONNECT_CONFLICT_WAIT_SECONDS)

    def pause(
        self,
        sandbox_id: str,
        *,
        memory: Optional[bool] = None,
        cancel: Optional[CancelToken] = None,
        retry: bool = True,
        deadline: Optional[Deadline] = None,
    ) -> int:
        """Pause a sandbox: ``POST /sandboxes/{id}/pause``.

        Args:
            sandbox_id: the sandbox id.
            memory: None sends ``{}`` (full snapshot); True/False sends ``{"memory": ...}``
                (False = filesystem-only snapshot; resuming it cold-boots).
            cancel: cancels the call.
            retry: retry 429/502/503/504 answers (the reboot sequence passes False: it
                handles 503 itself).
            deadline: ends the call earlier than its own bound (``call_timeout``).

        Returns:
            The success status (204).

        Raises:
            SandboxGoneError: 404 (code 404): no such sandbox.
            Conflict: 409 (already paused, or a state that cannot be paused).
            E2BHttpError: other errors, e.g. 503 (not paused now; the sandbox keeps running);
                ``retry_after`` holds the answer's ``Retry-After`` seconds, if any.
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        _validate.check_sandbox_id(sandbox_id)
        limit = self.bound(deadline)
        body: Dict[str, Any] = {} if memory is None else {"memory": bool(memory)}
        op = "POST /sandboxes/{id}/pause"
        resp = self._call("POST", self._path("/sandboxes/{id}/pause", sandbox_id),
                          cancel=cancel, json=body, retry=retry, operation=op, deadline=limit)
        if resp.ok:
            return resp.status
        raise self._error(resp, op, sandbox_id)

    def delete(
        self,
        sandbox_id: str,
        *,
        cancel: Optional[CancelToken] = None,
        deadline: Optional[Deadline] = None,
    ) -> bool:
        """Kill a sandbox and its snapshot: ``DELETE /sandboxes/{id}``.

        A 409 is retried 3 times, 0.5 s apart, within the call's bound (``call_timeout``,
        or ``deadline`` if earlier).

        Returns:
            True when deleted, False when it did not exist (404).

        Raises:
            ConfigError: a route-level 404 (``validation error: ...``).
            Conflict, E2BHttpError: other error answers (after retries).
            InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        _validate.check_sandbox_id(sandbox_id)
        limit = self.bound(deadline)
        op = "DELETE /sandboxes/{id}"
        for attempt in range(DELETE_CONFLICT_RETRIES + 1):
            resp = self._call("DELETE", self._path("/sandboxes/{id}", sandbox_id), cancel=cancel,
                              retry=True, operation=op, deadline=limit)
            if (
                resp.status != 409
                or attempt == DELETE_CONFLICT_RETRIES
                or limit.remaining() < CONNECT_CONFLICT_WAIT_SECONDS + RETRY_MIN_SECONDS
            ):
                break
            # A 409 is documented on DELETE without a meaning (a state change in flight):
            # retried briefly, then surfaced.
            _wait(cancel, CONNECT_CONFLICT_WAIT_SECONDS)
        if resp.ok:
            return True
        if resp.status == 404:
            message = parse_error_body(resp.body)[0]
            if message.startswith(_VALIDATION_PREFIX):
                raise ConfigError(
                    f"the E2B control plane does not offer {op} (it answered {message[:120]!r})"
                )
            return False
        raise self._error(resp, op, sandbox_id)

    def list(
        self,
        *,
        metadata: Optional[Mapping[str, str]] = None,
        state: Sequence[str] = ("running", "paused"),
        limit: int = LIST_LIMIT,
        cancel: Optional[CancelToken] = None,
        deadline: Optional[Deadline] = None,
    ) -> List[ListedSandbox]:
        """List sandboxes whose metadata matches: ``GET /v2/sandboxes``, all pages.

        The ``metadata`` filter is encoded like the reference and the SDK (each key and
        value percent-encoded, joined as a query string, then encoded once more as the
        parameter value). Pages are followed through ``x-next-token`` (at most 1000).
        Items whose metadata does not contain every requested pair are dropped client-side
        too, so a server that ignored the filter can never make the caller act on
        unrelated sandboxes.

        Args:
            metadata: the pairs every returned sandbox must have (None: no filter).
            state: the states to list.
            limit: the page size (1-100).
            cancel: cancels the call.
            deadline: ends the call earlier than its own bound (``call_timeout``, shared by
                every page).

        Returns:
            The matching sandboxes, in the server's order.

        Raises:
            ProtocolError: a malformed answer, or more than 1000 pages.
            E2BHttpError: an error answer (after retries).
            TransportTimeout: the call's bound passed (all pages together).
            InvalidArgument, Cancelled, TransportError.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
            raise InvalidArgument("limit must be an int from 1 to 100")
        if isinstance(state, str):
            state = (state,)
        for s in state:
            if s not in ("running", "paused"):
                raise InvalidArgument(f"invalid sandbox state {show(s)}")
        wanted: Dict[str, str] = {}
        for k, v in (metadata or {}).items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgument("metadata keys and values must be strings")
            wanted[k] = v
        q = urllib.parse.quote
        params: Dict[str, str] = {
            "state": ",".join(state),
            "limit": str(limit),
        }
        if wanted:
            params["metadata"] = urllib.parse.urlencode(
                {q(k, safe=""): q(v, safe="") for k, v in wanted.items()}
            )
        bound = self.bound(deadline)
        op = "GET /v2/sandboxes"
        out: List[ListedSandbox] = []
        next_token: Optional[str] = None
        for _page in range(LIST_MAX_PAGES):
            page_params = dict(params)
            if next_token:
                page_params["nextToken"] = next_token
            resp = self._call("GET", "/v2/sandboxes", cancel=cancel, params=page_params,
                              retry=True, max_body=_LIST_MAX_BODY, operation=op,
                              deadline=bound)
            if not resp.ok:
                raise self._error(resp, op)
            items = resp.json(op)
            if items is None:
                items = []
            if not isinstance(items, list):
                raise ProtocolError(f"E2B {op} answered with something other than a list")
            for item in items:
                listed = listed_sandbox(item, op, wanted)
                if listed is not None:
                    out.append(listed)
            next_token = resp.headers.get("x-next-token") or None
            if not next_token:
                return out
        raise ProtocolError(f"E2B {op} returned more than {LIST_MAX_PAGES} pages")

    def get(
        self,
        sandbox_id: str,
        *,
        cancel: Optional[CancelToken] = None,
        deadline: Optional[Deadline] = None,
    ) -> Dict[str, Any]:
        """Describe a sandbox: ``GET /sandboxes/{id}`` (within ``call_timeout``, or
        ``deadline`` if earlier).

        Returns:
            The answer's JSON object (``state``, ``pauseMode``, ``envdUnresponsiveAtPause``,
            ...). It may contain ``envdAccessToken``: do not log it.

        Raises:
            SandboxGoneError: 404 (code 404).
            E2BHttpError, ProtocolError, InvalidArgument, Cancelled, TransportError,
            TransportTimeout.
        """
        _validate.check_sandbox_id(sandbox_id)
        op = "GET /sandboxes/{id}"
        resp = self._call("GET", self._path("/sandboxes/{id}", sandbox_id), cancel=cancel,
                          retry=True, operation=op, deadline=self.bound(deadline))
        if not resp.ok:
            raise self._error(resp, op, sandbox_id)
        return sandbox_description(resp, op)

    def set_timeout(
        self,
        sandbox_id: str,
        seconds: int,
        *,
        cancel: Optional[CancelToken] = None,
        deadline: Optional[Deadline] = None,
    ) -> None:
        """Set a running sandbox's TTL (may shorten it): ``POST /sandboxes/{id}/timeout``
        (within ``call_timeout``, or ``deadline`` if earlier).

        Raises:
            SandboxGoneError: 404 (code 404; also for a paused sandbox).
            E2BHttpError, InvalidArgument, Cancelled, TransportError, TransportTimeout.
        """
        _validate.check_sandbox_id(sandbox_id)
        body = {"timeout": _seconds(seconds, "seconds")}
        op = "POST /sandboxes/{id}/timeout"
        resp = self._call("POST", self._path("/sandboxes/{id}/timeout", sandbox_id),
                          cancel=cancel, json=body, retry=True, operation=op,
                          deadline=self.bound(deadline))
        if not resp.ok:
            raise self._error(resp, op, sandbox_id)

    def target_for(self, info: SandboxInfo) -> Target:
        """Where and how to reach the sandbox's envd.

        Returns:
            ``Target(url, sandbox_id, access_token, domain, resumed)``; the URL is the
            configured ``sandbox_url`` (header-routed) or ``https://49983-<id>.<domain>``.

        Raises:
            ProtocolError: an invalid sandbox id or domain.
            MissingAccessToken: the answer carried no envd access token: the sandbox is not
                used unauthenticated; ``status`` is the answer's status.
        """
        sid = info.sandbox_id
        if not isinstance(sid, str) or _validate.SANDBOX_ID_RE.fullmatch(sid) is None:
            raise ProtocolError(f"invalid E2B sandbox id: {show(sid)}")
        domain = info.domain or self._domain
        if valid_host(domain) is None:
            raise ProtocolError(f"E2B returned an invalid sandbox domain: {show(domain)}")
        tok = info.envd_access_token
        if not isinstance(tok, str) or tok == "":
            raise MissingAccessToken(
                f"E2B answered for sandbox {sid} without an envd access token, so it is not "
                "used (never unauthenticated); if this persists, check that the deployment "
                "issues access tokens (secure sandboxes), or create a new sandbox",
                sandbox_id=sid,
                status=info.raw_status,
            )
        url = self._sandbox_url or f"https://{ENVD_PORT}-{sid}.{domain}"
        return Target(url=url, sandbox_id=sid, access_token=tok, domain=domain,
                      resumed=info.resumed, traffic_token=info.traffic_access_token)


def _check_left(deadline: Deadline, operation: str) -> None:
    """Raise TransportTimeout when the call's bound has passed (nothing more is sent)."""
    if deadline.expired():
        raise TransportTimeout(
            f"E2B {operation} timed out: its time ran out (retries and waits included)"
        )


def _wait(cancel: Optional[CancelToken], seconds: float) -> None:
    """Sleep ``seconds`` (sliced inside ``CancelToken.wait``); raise Cancelled if it fires."""
    waiter = cancel if cancel is not None else CancelToken()
    if waiter.wait(seconds):
        raise Cancelled(waiter.reason)
