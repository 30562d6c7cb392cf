"""The host server's connections: a half-close after whole requests to sandbox ports.

A client may send a whole request and then shut down its write side (``shutdown(SHUT_WR)``:
``nc -N``, ``socat``, many scripts). The server in the sandbox answers it; aiohttp's server
takes that end of input for the end of the connection: it closes it and cancels the request
being handled, so such a client got no answer through the edge. Here a connection
(:class:`HalfCloseHandler`) stays open for writing while answers are owed for requests that
arrived whole and that the ``keeps`` predicate accepts (the server passes requests to sandbox
ports): each is answered as usual, then the connection closes. A client that closed its
socket altogether is then noticed when its answer is written, as by any proxy that keeps a
half-closed connection.

Otherwise the end of input closes the connection and cancels the request, as before: when
nothing is owed, when the last request was cut short (its body incomplete), when the
connection was upgraded (a WebSocket), and for requests ``keeps`` refuses (envd's, whose
streams end when their client closes the connection, as E2B's edge ends them).

:class:`HalfCloseRunner` is an :class:`aiohttp.web.AppRunner` whose connections are such
handlers.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any, Awaitable, Callable, Deque, Mapping, Optional, Tuple

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

__all__ = ["HalfCloseHandler", "HalfCloseRunner", "HalfCloseServer", "Keeps"]

#: Whether a request (by its headers) is still answered after its client's half-close.
Keeps = Callable[[Mapping[str, str]], bool]


class HalfCloseHandler(RequestHandler):
    """One client connection that answers the whole requests sent before a half-close.

    Args:
        manager: the server.
        keeps: which requests are answered after a half-close.
        kwargs: passed to :class:`aiohttp.web_protocol.RequestHandler`.
    """

    __slots__ = ("_input_ended", "_keeps", "_last_payload", "_owed")

    def __init__(self, manager: web.Server, keeps: Keeps, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._keeps = keeps
        #: For each request parsed and not answered yet, in order: whether ``keeps`` took it.
        self._owed: Deque[bool] = collections.deque()
        self._input_ended = False  # the client shut down its write side
        self._last_payload: Optional[StreamReader] = None  # the body of the newest request

    def data_received(self, data: bytes) -> None:
        queued = len(self._messages)
        super().data_received(data)
        # each request parsed is queued at the end of _messages before it is handled
        parsed: Any
        for parsed in itertools.islice(self._messages, queued, None):
            message, payload = parsed
            headers = getattr(message, "headers", None)  # none: a parse error, answered 400
            self._owed.append(headers is None or self._keeps(headers))
            self._last_payload = payload

    def _body_complete(self) -> bool:
        """True when the newest request's body has all arrived (none is a whole body)."""
        payload = self._last_payload
        if payload is None or payload.is_eof():
            return True
        if self._parser is None:
            return False
        try:
            # a body that arrived whole but waits in the parser (flow control) ends; one cut
            # short is an error
            self._parser.feed_eof()
        except Exception:
            return False
        return True

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio's: Optional[bool]
        """The client's input ended: keep the connection for the answers owed, if any.

        Returns:
            True to keep the connection open for writing (answers are owed to requests
            ``keeps`` took), False to close it.
        """
        if (
            not self._owed
            or not all(self._owed)
            or self._upgraded
            or self._force_close
            or not self._body_complete()
        ):
            return False
        self._input_ended = True
        return True

    async def _handle_request(
        self,
        request: web.BaseRequest,
        start_time: Optional[float],
        request_handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
    ) -> Tuple[web.StreamResponse, bool]:
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            if self._owed:
                self._owed.popleft()
            if self._input_ended and not self._owed:
                self._close = True  # the last answer owed is out: the connection ends


class HalfCloseServer(web.Server):
    """An aiohttp low-level server whose connections are :class:`HalfCloseHandler`.

    Args:
        handler: the request handler.
        keeps: which requests are answered after a half-close.
        kwargs: passed to :class:`aiohttp.web.Server`.
    """

    def __init__(self, handler: Any, *, keeps: Keeps, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.keeps = keeps

    def __call__(self) -> RequestHandler:
        return HalfCloseHandler(self, self.keeps, loop=self._loop, **self._kwargs)


class HalfCloseRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose server is a :class:`HalfCloseServer`.

    Args:
        app: the application.
        keeps: which requests are answered after a half-close.
        kwargs: passed to :class:`aiohttp.web.AppRunner`.
    """

    def __init__(self, app: web.Application, *, keeps: Keeps, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._keeps = keeps

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return HalfCloseServer(
            plain.request_handler,
            keeps=self._keeps,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )
