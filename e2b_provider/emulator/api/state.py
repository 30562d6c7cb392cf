"""Sandbox records and the pure helpers of the emulator's control plane.

This module owns what the host server remembers about each sandbox (:class:`SandboxRecord`),
how sandbox ids and tokens are generated, how times are rendered, how the ``metadata`` list
filter is decoded and how request bodies are validated into :class:`CreateRequest` values
(the ``network`` object through :mod:`.network`). It does no I/O: it imports no
aiohttp, requests, urllib3 or socket, and never touches a sandbox's processes or files.
"""

from __future__ import annotations

import asyncio
import calendar
import datetime
import re
import secrets
import time
from typing import Any, Dict, Mapping, Optional, Sequence, Set, Tuple
from urllib.parse import unquote, unquote_plus

import attrs

from ...protocol.e2b_facts import ENVD_PORT, MAX_TIMEOUT_SECONDS
from .errors import BadRequest
from .names import ID_ALPHABET
from .network import NetworkConfig, egress_mode, parse_network_config

__all__ = [
    "CLIENT_ID",
    "DEFAULT_DOMAIN",
    "DEFAULT_TEMPLATE",
    "ENVD_PORT",
    "ENVD_VERSION",
    "KNOWN_TEMPLATES",
    "NO_PYTHON_TEMPLATE",
    "TEMPLATE_SERVICES",
    "TEMPLATE_WITHOUT",
    "MAX_TIMEOUT_SECONDS",
    "BadRequest",
    "CreateRequest",
    "SandboxRecord",
    "TemplateResources",
    "VolumeMount",
    "check_idempotency_key",
    "epoch_us",
    "new_access_token",
    "new_sandbox_id",
    "parse_bool",
    "parse_create_body",
    "parse_metadata_filter",
    "parse_sandbox_path_id",
    "parse_timeout",
    "parse_volume_mounts",
    "rfc3339",
    "sandbox_not_found",
]

#: The envd version every emulated sandbox reports (the one ``e2b-protocol.md`` describes).
ENVD_VERSION = "0.6.13"
#: E2B's constant legacy client id.
CLIENT_ID = "6532622b"
#: The domain reported in create/connect answers: browsers and curl resolve every
#: ``*.localhost`` name to loopback, so ``http://<port>-<id>.e2b.localhost:<emulator port>/``
#: opens a sandbox's port from the host (Python's resolver usually does not: send the Host
#: header to 127.0.0.1, or the ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers).
DEFAULT_DOMAIN = "e2b.localhost"
#: The template every sandbox runs (E2B's ``base``), named in the CLI's ready line.
DEFAULT_TEMPLATE = "base"
#: An emulator template for testing code that must work where a template lacks
#: ``python3``: E2B's ``base`` without ``python3`` (and ``python``) on ``PATH``. Root mode only.
NO_PYTHON_TEMPLATE = "base-without-python3"
#: What each such template lacks: program names hidden from every ``PATH`` directory (the
#: name itself and ``name.*``/``name-*``, so ``python3.11`` and ``python3-config`` go too).
TEMPLATE_WITHOUT = {NO_PYTHON_TEMPLATE: ("python3", "python")}
#: An emulator template like E2B's Code Interpreter (``code-interpreter-v1``): E2B's ``base``
#: plus the code-interpreter server on port 49999 (see :mod:`..interpreter.template`).
CODE_INTERPRETER_TEMPLATE = "code-interpreter-v1"
#: The services (by name) each such template runs beside the agent.
TEMPLATE_SERVICES = {CODE_INTERPRETER_TEMPLATE: ("code-interpreter",)}
#: Templates that always exist.
KNOWN_TEMPLATES = frozenset({DEFAULT_TEMPLATE})
#: The base template's envd defaults (its build's ``Context.User`` and ``Context.WorkDir``),
#: which E2B's orchestrator sends in every ``/init`` (``defaultUser``, ``defaultWorkdir``):
#: a command without ``cwd`` and an empty path start in ``/home/user``, whoever runs them.
#: Snapshot templates inherit them from ``base``.
TEMPLATE_USER = "user"
TEMPLATE_WORKDIR = "/home/user"

_PATH_ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)?$")
_IDEMPOTENCY_KEY_RE = re.compile(r"^[a-z0-9-]{1,255}$")


@attrs.frozen
class TemplateResources:
    """What the emulator's template (``base``) gives every sandbox.

    E2B sizes sandboxes by template: a create request carries no CPU, memory or disk, and a
    sandbox reports its template's ``cpuCount``, ``memoryMB`` and ``diskSizeMB``. The runtime
    enforces them where the host allows (see the runtime's per-sandbox ``limits`` log line).

    Attributes:
        cpu_count: CPUs (a CFS quota).
        memory_mb: memory limit in MiB.
        disk_mb: the sandbox's disk in MiB (a full disk is ENOSPC inside, 507 on uploads).
        max_processes: processes and threads a sandbox may have at once (an emulator knob:
            a fork bomb stops there).
    """

    cpu_count: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    memory_mb: int = attrs.field(default=512, validator=attrs.validators.ge(16))
    disk_mb: int = attrs.field(default=1024, validator=attrs.validators.ge(16))
    max_processes: int = attrs.field(default=1024, validator=attrs.validators.ge(16))


def sandbox_not_found(sandbox_id: str) -> BadRequest:
    """The 404 E2B answers for a sandbox that does not exist (or is not the caller's)."""
    return BadRequest(
        f"Sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it", status=404
    )


def new_sandbox_id() -> str:
    """Return a fresh sandbox id: ``i`` followed by 20 characters of ``[a-z0-9]``."""
    return "i" + "".join(secrets.choice(ID_ALPHABET) for _ in range(20))


def new_access_token() -> str:
    """Return a fresh envd access token (64 hex characters, like E2B's)."""
    return secrets.token_hex(32)


def rfc3339(ts: float) -> str:
    """Render a POSIX timestamp as an RFC 3339 UTC date-time with microseconds."""
    dt = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def epoch_us(ts: float) -> int:
    """A POSIX timestamp in whole microseconds, rounded exactly as :func:`rfc3339` renders it."""
    dt = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
    return calendar.timegm(dt.utctimetuple()) * 1_000_000 + dt.microsecond


def parse_sandbox_path_id(raw: str) -> str:
    """Validate the ``{sandboxID}`` of a control-plane path and return the bare id.

    Accepts ``<id>`` and the legacy ``<id>-<clientID>``.

    Raises:
        BadRequest: more than one ``-`` or a character outside ``[a-z0-9]`` (400
            ``Invalid sandbox ID``, as E2B answers).
    """
    if not _PATH_ID_RE.match(raw):
        raise BadRequest("Invalid sandbox ID")
    return raw.split("-", 1)[0]


def parse_metadata_filter(raw: Optional[str]) -> Dict[str, str]:
    """Decode the ``metadata`` query value of a list request into the pairs to match.

    ``raw`` is the value after the HTTP layer has decoded the query string once. The SDK and
    the reference build it as ``urlencode({quote(k): quote(v)})``, so it is unescaped once as
    a whole, split on ``&`` and ``=`` and each key and value is unescaped once more (as the
    E2B server does).

    Raises:
        BadRequest: a pair without exactly one ``=`` (``Error parsing metadata``).
    """
    if not raw:
        return {}
    out: Dict[str, str] = {}
    for pair in unquote_plus(raw).split("&"):
        if not pair:
            continue
        parts = pair.split("=")
        if len(parts) != 2:
            raise BadRequest("Error parsing metadata")
        out[unquote(parts[0])] = unquote(parts[1])
    return out


def parse_bool(body: Mapping[str, Any], name: str) -> Optional[bool]:
    """Read an optional boolean field of a request body (``None`` when absent or null).

    Raises:
        BadRequest: the field is not a boolean.
    """
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise BadRequest(f"validation error: field {name!r} must be a boolean")
    return value


def _str_map(body: Mapping[str, Any], name: str) -> Dict[str, str]:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRequest(f"validation error: field {name!r} must be a map of strings")
    return dict(value)


def parse_timeout(body: Mapping[str, Any], name: str, default: Optional[int]) -> int:
    """Read an integer ``timeout``-like field (seconds) from a request body.

    Raises:
        BadRequest: missing without a default, not an integer, not positive, or above
            :data:`MAX_TIMEOUT_SECONDS`.
    """
    value = body.get(name)
    if value is None:
        if default is None:
            raise BadRequest(f"validation error: field {name!r} is required")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"validation error: field {name!r} must be an integer")
    if value <= 0:
        raise BadRequest("Timeout must be greater than 0")
    if value > MAX_TIMEOUT_SECONDS:
        raise BadRequest(f"Timeout cannot be greater than {MAX_TIMEOUT_SECONDS // 3600} hours")
    return int(value)


@attrs.frozen
class VolumeMount:
    """One ``volumeMounts`` item: the volume ``name`` mounted at ``path`` inside the sandbox;
    ``volume_id`` once the control plane found the volume (empty before)."""

    name: str
    path: str
    volume_id: str = ""

    def to_json(self) -> Dict[str, str]:
        """The ``SandboxVolumeMount`` of answers."""
        return {"name": self.name, "path": self.path}


def parse_volume_mounts(body: Mapping[str, Any]) -> Tuple[VolumeMount, ...]:
    """The ``volumeMounts`` of a create body (types only; names and paths are checked against
    the team's volumes by the control plane).

    Raises:
        BadRequest: not a list of ``{name, path}`` strings.
    """
    raw = body.get("volumeMounts")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadRequest("validation error: field 'volumeMounts' must be an array")
    mounts = []
    for item in raw:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("name"), str)
            or not isinstance(item.get("path"), str)
        ):
            raise BadRequest(
                "validation error: field 'volumeMounts' items must be {name, path} strings"
            )
        mounts.append(VolumeMount(name=item["name"], path=item["path"]))
    return tuple(mounts)


@attrs.frozen
class CreateRequest:
    """A validated create body (v1 ``POST /sandboxes`` or v2 ``POST /v2/sandboxes``).

    ``template`` is the body's ``templateID`` until the control plane resolves it; then it is
    the template id, ``alias`` the template's alias and ``files_from`` the state directory
    whose files the new sandbox starts from (a snapshot build; None for ``base``).
    """

    template: str
    timeout: int
    auto_pause: bool
    auto_pause_memory: bool
    metadata: Mapping[str, str]
    env_vars: Mapping[str, str] = attrs.field(repr=False)
    egress: str
    allow_hosts: Tuple[str, ...]
    allow_internet_access: Optional[bool]
    network: Optional[NetworkConfig]
    alias: Optional[str] = None
    files_from: Optional[str] = None
    volume_mounts: Tuple[VolumeMount, ...] = ()
    #: Programs the template lacks (see :data:`TEMPLATE_WITHOUT`).
    without: Tuple[str, ...] = ()
    #: Services the template runs (see :data:`TEMPLATE_SERVICES`).
    services: Tuple[str, ...] = ()


def parse_create_body(body: Any, *, default_timeout: int) -> CreateRequest:
    """Validate a create body the way E2B does (unknown fields are ignored).

    Egress (recorded only): ``network.allowOut`` → ``allowlist`` of those hosts; else
    ``allow_internet_access: false`` or a ``denyOut`` of ``0.0.0.0/0`` → ``none``; else
    ``open``.

    Raises:
        BadRequest: a missing ``templateID``, wrongly typed fields, a bad timeout,
            ``autoPauseMemory: false`` without ``autoPause``, or network rules E2B refuses.
    """
    if not isinstance(body, dict):
        raise BadRequest("validation error: request body must be a JSON object")
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise BadRequest("validation error: field 'templateID' is required")
    timeout = parse_timeout(body, "timeout", default_timeout)
    auto_pause = bool(parse_bool(body, "autoPause"))
    auto_pause_memory = parse_bool(body, "autoPauseMemory")
    if auto_pause_memory is False and not auto_pause:
        raise BadRequest("autoPauseMemory can only be false together with autoPause")
    allow_internet = parse_bool(body, "allow_internet_access")
    network = parse_network_config(body.get("network"))
    egress, allow_hosts = egress_mode(network, allow_internet)
    return CreateRequest(
        template=template,
        timeout=timeout,
        auto_pause=auto_pause,
        auto_pause_memory=auto_pause_memory is not False,
        metadata=_str_map(body, "metadata"),
        env_vars=_str_map(body, "envVars"),
        egress=egress,
        allow_hosts=allow_hosts,
        allow_internet_access=allow_internet,
        network=network,
        volume_mounts=parse_volume_mounts(body),
    )


def check_idempotency_key(key: Optional[str]) -> Optional[str]:
    """Validate an ``Idempotency-Key`` header (1 to 255 characters of ``[a-z0-9-]``).

    Raises:
        BadRequest: a malformed key.
    """
    if key is None:
        return None
    if not _IDEMPOTENCY_KEY_RE.match(key):
        raise BadRequest("Invalid Idempotency-Key: use 1-255 characters of [a-z0-9-]")
    return key


@attrs.define(eq=False)
class SandboxRecord:
    """Everything the host server keeps about one sandbox.

    ``runtime`` is the sandbox's :class:`~e2b_provider.emulator.runtime.SandboxRuntime` (typed
    loosely so this module stays free of the runtime's imports). ``lock`` serialises lifecycle
    changes (pause, resume, kill, expiry); ``streams`` holds the envd proxy tasks currently
    serving this sandbox, so a pause or kill can cut them. ``traffic_access_token`` is set when
    the sandbox was created with ``network.allowPublicTraffic: false``.
    """

    sandbox_id: str
    template_id: str
    access_token: str = attrs.field(repr=False)
    runtime: Any
    metadata: Dict[str, str]
    env_vars: Dict[str, str] = attrs.field(repr=False)
    started_at: float
    end_at: float
    auto_pause: bool
    auto_pause_memory: bool
    egress: str
    allow_hosts: Tuple[str, ...]
    allow_internet_access: Optional[bool]
    network: Optional[NetworkConfig]
    alias: Optional[str] = None
    traffic_access_token: Optional[str] = attrs.field(default=None, repr=False)
    cpu_count: int = 2
    memory_mb: int = 512
    disk_size_mb: int = 1024
    volume_mounts: Tuple[VolumeMount, ...] = ()
    state: str = "running"  # running | paused
    pause_mode: Optional[str] = None  # full | filesystem, while paused
    paused_at: Optional[float] = None
    envd_unresponsive_at_pause: bool = False
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, repr=False)
    streams: Set[asyncio.Task[Any]] = attrs.field(factory=set, repr=False)

    def sandbox_json(self, *, domain: str, with_token: bool = True) -> Dict[str, Any]:
        """The ``Sandbox`` answer of create/connect/resume."""
        out: Dict[str, Any] = {
            "sandboxID": self.sandbox_id,
            "templateID": self.template_id,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "domain": domain,
        }
        if self.alias:
            out["alias"] = self.alias
        if with_token:
            out["envdAccessToken"] = self.access_token
        if self.traffic_access_token:
            out["trafficAccessToken"] = self.traffic_access_token
        return out

    def listed_json(self) -> Dict[str, Any]:
        """A ``ListedSandbox`` item of ``GET /v2/sandboxes``."""
        out: Dict[str, Any] = {
            "sandboxID": self.sandbox_id,
            "templateID": self.template_id,
            "clientID": CLIENT_ID,
            "startedAt": rfc3339(self.started_at),
            "endAt": rfc3339(
                self.paused_at if self.state == "paused" and self.paused_at else self.end_at
            ),
            "cpuCount": self.cpu_count,
            "memoryMB": self.memory_mb,
            "diskSizeMB": self.disk_size_mb,
            "state": self.state,
            "envdVersion": ENVD_VERSION,
            "metadata": dict(self.metadata),
        }
        if self.alias:
            out["alias"] = self.alias
        if self.volume_mounts:
            out["volumeMounts"] = [m.to_json() for m in self.volume_mounts]
        if self.state == "paused" and self.envd_unresponsive_at_pause:
            out["envdUnresponsiveAtPause"] = True
        return out

    def detail_json(self, *, domain: str) -> Dict[str, Any]:
        """The ``SandboxDetail`` answer of ``GET /sandboxes/{id}``."""
        out = self.listed_json()
        out["envdAccessToken"] = self.access_token
        out["domain"] = domain
        out["allowInternetAccess"] = self.allow_internet_access
        if self.network is not None:
            out["network"] = self.network.to_json()
        out["lifecycle"] = {
            "autoResume": False,
            "onTimeout": "pause" if self.auto_pause else "kill",
        }
        if self.state == "paused" and self.pause_mode:
            out["pauseMode"] = self.pause_mode
        return out

    def matches(self, metadata: Mapping[str, str], states: Sequence[str]) -> bool:
        """True when this sandbox is in one of ``states`` and carries every metadata pair."""
        if self.state not in states:
            return False
        return all(self.metadata.get(k) == v for k, v in metadata.items())

    def list_key(self) -> Tuple[int, str]:
        """The paging key of list results: (start time in microseconds, sandbox id)."""
        return epoch_us(self.started_at), self.sandbox_id

    def extend_to(self, end_at: float) -> None:
        """Move the end time later (never earlier)."""
        self.end_at = max(self.end_at, end_at)

    def expired(self, now: Optional[float] = None) -> bool:
        """True when this running sandbox's end time has passed."""
        return self.state == "running" and (time.time() if now is None else now) >= self.end_at

