"""The buffered answer of a request, :class:`HttpResponse`, and how its headers are kept.

A value: the status, the headers with their names in lower case, and the body, which is
never shown in a repr (an answer can carry a secret).
"""

from __future__ import annotations

import json as json_mod
from typing import Any, Dict, Mapping

import attrs

from ..errors import ProtocolError

__all__ = ["HttpResponse", "lower_headers"]


@attrs.frozen
class HttpResponse:
    """A complete, buffered HTTP answer.

    Attributes:
        status: the HTTP status code.
        headers: the response headers, keys in lower case (repeated headers joined by ", ").
        body: the body (at most the ``max_body`` the request allowed); not in the repr,
            since an answer can carry a secret (a new sandbox's envd access token).
    """

    status: int
    headers: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    body: bytes = attrs.field(default=b"", repr=False)

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


def lower_headers(headers: Mapping[str, str]) -> Dict[str, str]:
    """``headers`` with their names in lower case (how the library looks them up)."""
    return {str(k).lower(): str(v) for k, v in headers.items()}
