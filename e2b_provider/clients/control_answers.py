"""The control plane's answers, read: what a sandbox is, as create, connect, list and get say.

This module owns the values the control-plane client returns (:class:`SandboxInfo`,
:class:`ListedSandbox`) and the checks that turn an answer's JSON into them (a valid sandbox
id and domain, sizes, the tokens kept as secrets), for
:class:`~e2b_provider.clients.control.ControlPlane`.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple, TypedDict

import attrs

from ..errors import InvalidArgument, ProtocolError, register_secret
from ..protocol import validate as _validate
from ..transport.response import HttpResponse

__all__ = [
    "ListedSandbox",
    "SandboxInfo",
    "listed_sandbox",
    "sandbox_description",
    "sandbox_info",
    "show",
    "sizes",
    "valid_host",
]


@attrs.frozen
class SandboxInfo:
    """A sandbox as the control plane described it (create or connect answer).

    Attributes:
        sandbox_id: the sandbox id (validated).
        domain: the sandbox domain: the answer's ``domain`` if any, else the configured one
            (validated host name).
        envd_version: the template's envd version ("" if missing).
        client_id: the legacy client id ("" if missing).
        template_id: the template id ("" if missing).
        envd_access_token: the token envd requires, or None when the answer had none.
        traffic_access_token: the token E2B's edge wants on the sandbox's other ports
            (header ``e2b-traffic-access-token``) when its traffic is private, else None.
        raw_status: the HTTP status: 201 created, 200 was running, 201 resumed.
        resumed: True when a connect resumed a paused sandbox (status 201 on connect).
        cpu_count: ``cpuCount``, or None when the answer had none (E2B's create and
            connect answers carry no sizes; ``GET /sandboxes/{id}`` does, see :func:`sizes`).
        memory_mb: ``memoryMB``, or None.
        disk_mb: ``diskSizeMB``, or None.
    """

    sandbox_id: str
    domain: str
    envd_version: str = ""
    client_id: str = ""
    template_id: str = ""
    envd_access_token: Optional[str] = attrs.field(default=None, repr=False)
    traffic_access_token: Optional[str] = attrs.field(default=None, repr=False)
    raw_status: int = 200
    resumed: bool = False
    cpu_count: Optional[int] = None
    memory_mb: Optional[int] = None
    disk_mb: Optional[int] = None

    def __attrs_post_init__(self) -> None:
        register_secret(self.envd_access_token, owner=self)
        register_secret(self.traffic_access_token, owner=self)


@attrs.frozen
class ListedSandbox:
    """One item of ``GET /v2/sandboxes``.

    Attributes:
        sandbox_id: the sandbox id (validated).
        state: ``"running"`` or ``"paused"`` (as the server says).
        metadata: the sandbox's metadata.
        envd_unresponsive_at_pause: True when its snapshot was taken while envd did not
            answer (resuming it needs ``memory: false``).
        started_at: ``startedAt`` as the server wrote it (RFC 3339), or "".
        template_id: the template id, or "".
        cpu_count: ``cpuCount``, or None.
        memory_mb: ``memoryMB``, or None.
        disk_mb: ``diskSizeMB``, or None.
    """

    sandbox_id: str
    state: str
    metadata: Dict[str, str] = attrs.field(factory=dict, hash=False)
    envd_unresponsive_at_pause: bool = False
    started_at: str = ""
    template_id: str = ""
    cpu_count: Optional[int] = None
    memory_mb: Optional[int] = None
    disk_mb: Optional[int] = None


def sizes(data: Mapping[str, Any]) -> Tuple[Optional[int], Optional[int], Optional[int]]:
    """The sizes a sandbox answer reports: ``(cpuCount, memoryMB, diskSizeMB)``, each None
    when missing or not a non-negative int."""

    def size(key: str) -> Optional[int]:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return None
        return value

    return size("cpuCount"), size("memoryMB"), size("diskSizeMB")


class _SizeFields(TypedDict):
    """:func:`sizes` as the fields of :class:`SandboxInfo` and :class:`ListedSandbox`."""

    cpu_count: Optional[int]
    memory_mb: Optional[int]
    disk_mb: Optional[int]


def _size_fields(data: Mapping[str, Any]) -> _SizeFields:
    cpu_count, memory_mb, disk_mb = sizes(data)
    return {"cpu_count": cpu_count, "memory_mb": memory_mb, "disk_mb": disk_mb}


def show(value: object, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sandbox_info(resp: HttpResponse, operation: str, fallback_id: Optional[str], resumed: bool,
                 default_domain: str) -> SandboxInfo:
    """The sandbox a create or connect answer describes (``fallback_id`` when it names none,
    ``default_domain`` when it gives no domain), checked.

    Raises:
        ProtocolError: no sandbox object, or an invalid sandbox id or domain.
    """
    data = resp.json(operation)
    if not isinstance(data, dict):
        raise ProtocolError(f"E2B {operation} answered with no sandbox object")
    sid = data.get("sandboxID")
    if sid is None or sid == "":
        sid = fallback_id
    if sid is None:
        raise ProtocolError(f"E2B {operation} returned no sandboxID")
    if not isinstance(sid, str) or _validate.SANDBOX_ID_RE.fullmatch(sid) is None:
        raise ProtocolError(f"E2B returned an invalid sandbox id: {show(sid)}")
    domain = data.get("domain") or default_domain
    if not isinstance(domain, str) or valid_host(domain) is None:
        raise ProtocolError(f"E2B returned an invalid sandbox domain: {show(domain)}")
    token = data.get("envdAccessToken")
    if not isinstance(token, str) or token == "":
        token = None
    traffic = data.get("trafficAccessToken")
    if not isinstance(traffic, str) or traffic == "":
        traffic = None
    return SandboxInfo(
        sandbox_id=sid,
        domain=domain,
        envd_version=_str(data.get("envdVersion")),
        client_id=_str(data.get("clientID")),
        template_id=_str(data.get("templateID")),
        envd_access_token=token,
        traffic_access_token=traffic,
        raw_status=resp.status,
        resumed=resumed,
        **_size_fields(data),
    )


def sandbox_description(resp: HttpResponse, operation: str) -> Dict[str, Any]:
    """The JSON object a ``GET /sandboxes/{id}`` answer holds; its ``envdAccessToken`` is a
    secret as long as the object is kept.

    Raises:
        ProtocolError: the answer holds no object.
    """
    data = resp.json(operation)
    if not isinstance(data, dict):
        raise ProtocolError(f"E2B {operation} answered with no sandbox object")
    answer = _Answer(data)
    tok = answer.get("envdAccessToken")
    if isinstance(tok, str):
        register_secret(tok, owner=answer)  # a secret as long as the answer is kept
    return answer


class _Answer(Dict[str, Any]):
    """A JSON object answer that can own a secret (a plain dict cannot be weakly referenced)."""


def valid_host(host: object) -> Optional[str]:
    try:
        return _validate.check_hostname(host)
    except InvalidArgument:
        return None


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def listed_sandbox(item: object, op: str, wanted: Mapping[str, str]) -> Optional[ListedSandbox]:
    """One list item, or None when its metadata lacks a wanted pair."""
    if not isinstance(item, dict):
        raise ProtocolError(f"E2B {op} list item is not an object")
    meta = item.get("metadata")
    metadata = (
        {str(k): v for k, v in meta.items() if isinstance(v, str)}
        if isinstance(meta, dict)
        else {}
    )
    if any(metadata.get(k) != v for k, v in wanted.items()):
        return None
    sid = item.get("sandboxID")
    if not isinstance(sid, str) or _validate.SANDBOX_ID_RE.fullmatch(sid) is None:
        raise ProtocolError(f"E2B {op} returned an invalid sandbox id: {show(sid)}")
    return ListedSandbox(
        sandbox_id=sid,
        state=_str(item.get("state")),
        metadata=metadata,
        envd_unresponsive_at_pause=item.get("envdUnresponsiveAtPause") is True,
        started_at=_str(item.get("startedAt")),
        template_id=_str(item.get("templateID")),
        **_size_fields(item),
    )
