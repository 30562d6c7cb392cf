"""The client of a sandbox's code-interpreter server (port 49999 of a ``code-interpreter-v1``
sandbox): ``POST /execute`` as a stream, ``GET``/``POST /contexts``,
``POST /contexts/{id}/restart`` and ``DELETE /contexts/{id}``.

It reaches the server the way E2B's edge routes any sandbox port: ``https://49999-{id}.{domain}``,
or, with a configured sandbox URL (the emulator, a self-hosted edge), that URL with the
``E2b-Sandbox-Id`` and ``E2b-Sandbox-Port`` headers. Every request carries the sandbox's envd
access token (``X-Access-Token``, as E2B's own client sends it) and, for a sandbox whose
traffic is private, its traffic token. Bodies and lines are
:mod:`e2b_provider.protocol.code_output`'s; all I/O goes through
:class:`~e2b_provider.transport.client.Transport`. No message built here contains a token.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from ..cancel import CancelToken, Deadline
from ..errors import ProtocolError
from ..models import Target
from ..protocol.code_output import CODE_INTERPRETER_PORT, parse_context
from ..protocol.e2b_facts import TRAFFIC_TOKEN_HEADER
from ..transport.client import Transport
from ..transport.error_mapping import error_from_response
from ..transport.response import HttpResponse
from ..transport.stream import Stream

__all__ = ["CodeInterpreterClient", "EXECUTE_OPERATION"]

#: How the ``/execute`` stream is named in messages.
EXECUTE_OPERATION = "POST /execute"
#: The largest error body read from a failed ``/execute``.
_ERROR_BODY_BYTES = 64 * 1024
#: The largest ``/contexts`` answer read (a list of small objects).
_CONTEXTS_BODY_BYTES = 4 << 20


class CodeInterpreterClient:
    """A client for one sandbox's code-interpreter server.

    Args:
        transport: the HTTP transport (shared).
        target: the sandbox (its id, domain, access token and traffic token).
        sandbox_url: the configured sandbox URL (header-routed), or None for E2B's edge.
    """

    def __init__(self, transport: Transport, target: Target, sandbox_url: Optional[str]) -> None:
        self._transport = transport
        self._target = target
        if sandbox_url:
            self._base = sandbox_url.rstrip("/")
        else:
            self._base = f"https://{CODE_INTERPRETER_PORT}-{target.sandbox_id}.{target.domain}"

    def __repr__(self) -> str:
        return f"CodeInterpreterClient(sandbox_id={self._target.sandbox_id!r}, url={self._base!r})"

    def _headers(self, body: bool) -> Dict[str, str]:
        h = {
            "E2b-Sandbox-Id": self._target.sandbox_id,
            "E2b-Sandbox-Port": str(CODE_INTERPRETER_PORT),
            "X-Access-Token": self._target.access_token,
        }
        if body:
            h["Content-Type"] = "application/json"
        if self._target.traffic_token:
            h[TRAFFIC_TOKEN_HEADER] = self._target.traffic_token
        return h

    def execute(
        self,
        body: bytes,
        *,
        read_timeout: float,
        cancel: Optional[CancelToken],
        open_deadline: Deadline,
    ) -> Stream:
        """Open ``POST /execute`` and return its stream once the server answered 200.

        Args:
            body: the request (:func:`~e2b_provider.protocol.code_output.execute_body`).
            read_timeout: seconds each read may wait (the server sends a keepalive line
                every 5 s while the code is quiet).
            cancel: aborts the opening when it fires.
            open_deadline: when the opening must be over.

        Raises:
            E2BHttpError: another status (400 bad request, 404 unknown context, 502 nothing
                listens on the port, 500 a kernel that failed).
            Cancelled, TransportError, TransportTimeout.
        """
        stream = self._transport.open_stream(
            "POST", f"{self._base}/execute", headers=self._headers(True), data=body,
            read_timeout=read_timeout, cancel=cancel, operation=EXECUTE_OPERATION,
            deadline=open_deadline,
        )
        if stream.status == 200:
            return stream
        try:
            text = stream.read_all(_ERROR_BODY_BYTES, truncate=True)
        except Exception:  # the error's body is a courtesy: the status says enough
            text = b""
        finally:
            stream.close()
        answer = HttpResponse(status=stream.status, headers=dict(stream.headers), body=text)
        raise error_from_response(answer, EXECUTE_OPERATION)

    def _call(
        self,
        operation: str,
        path: str,
        body: Optional[bytes],
        timeout: float,
        cancel: Optional[CancelToken],
    ) -> Any:
        method = operation.split(" ", 1)[0]
        resp = self._transport.request(
            method, f"{self._base}{path}", headers=self._headers(body is not None), data=body,
            read_timeout=timeout, cancel=cancel, operation=operation,
            max_body=_CONTEXTS_BODY_BYTES, deadline=Deadline.after(timeout),
        )
        if not 200 <= resp.status < 300:
            raise error_from_response(resp, operation)
        if not resp.body.strip():
            return None
        try:
            return json.loads(resp.body)
        except ValueError:
            raise ProtocolError(f"code interpreter: {operation} answered with text that is "
                                "not JSON") from None

    def contexts(
        self, *, timeout: float, cancel: Optional[CancelToken]
    ) -> List[Tuple[str, str, str]]:
        """``GET /contexts``: every context as ``(id, language, cwd)``, oldest first."""
        answer = self._call("GET /contexts", "/contexts", None, timeout, cancel)
        if not isinstance(answer, list):
            raise ProtocolError("code interpreter: GET /contexts did not answer a list")
        return [parse_context(item) for item in answer]

    def create_context(
        self, body: bytes, *, timeout: float, cancel: Optional[CancelToken]
    ) -> Tuple[str, str, str]:
        """``POST /contexts``: the new context as ``(id, language, cwd)``."""
        return parse_context(self._call("POST /contexts", "/contexts", body, timeout, cancel))

    def restart(self, context_id: str, *, timeout: float, cancel: Optional[CancelToken]) -> None:
        """``POST /contexts/{id}/restart``: a new kernel (the context's state is lost)."""
        path = f"/contexts/{context_id}/restart"
        self._call("POST /contexts/{id}/restart", path, b"", timeout, cancel)

    def remove(self, context_id: str, *, timeout: float, cancel: Optional[CancelToken]) -> None:
        """``DELETE /contexts/{id}``: stop the context's kernel for good."""
        self._call("DELETE /contexts/{id}", f"/contexts/{context_id}", None, timeout, cancel)
