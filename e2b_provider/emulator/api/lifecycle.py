"""What the control plane and the envd front need from the server they serve for.

This module owns :class:`SandboxLifecycle`, the interface through which
:class:`~.control.ControlPlane` and :class:`~.proxy.EnvdProxy` reach the sandbox table, the
fault registry, the request log, the idempotency memory and the lifecycle coroutines. The
server (:class:`~.server.EmulatorServer`) implements it and hands itself to both; they import
this interface, never the server, so the host API's imports point one way:
``server`` → ``control``/``proxy`` → ``lifecycle`` → ``state``/``faults``.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Dict, Optional, Protocol, Tuple

from aiohttp import web

from .faults import FaultRegistry
from .logs import KilledLogs
from .metrics import MetricSample, MetricsHistory
from .state import CreateRequest, SandboxRecord
from .templates import TemplateStore

__all__ = ["SandboxLifecycle"]


class SandboxLifecycle(Protocol):
    """The sandbox table and lifecycle of one emulator, as its request handlers see them.

    Attributes:
        records: the sandboxes by id (running and paused).
        templates: the team's snapshot templates.
        metrics: the sandboxes' metrics samples.
        killed_logs: the logs of recently killed sandboxes.
        faults: the armed faults.
        domain: the ``domain`` reported to clients.
        idempotency: ``Idempotency-Key`` → (request fingerprint, future of the answer).
    """

    records: Dict[str, SandboxRecord]
    templates: TemplateStore
    metrics: MetricsHistory
    killed_logs: KilledLogs
    faults: FaultRegistry
    domain: str
    idempotency: collections.OrderedDict[str, Tuple[str, asyncio.Future[Any]]]

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the server runs on."""

    @property
    def snapshots_dir(self) -> str:
        """Where snapshot builds keep their copies of sandboxes' files."""

    def log_request(
        self, request: web.BaseRequest, *, kind: str, sandbox_id: Optional[str] = None
    ) -> Dict[str, Any]:
        """Append a request to the bounded log; returns its (mutable) entry."""

    def remember_idempotency(self, key: str, fingerprint: str, fut: asyncio.Future[Any]) -> None:
        """Remember an ``Idempotency-Key`` (bounded, oldest forgotten first)."""

    async def create_sandbox(self, req: CreateRequest) -> SandboxRecord:
        """Boot a new sandbox and register it (raises ``BadRequest`` 500 on failure)."""

    async def connect_sandbox(
        self, rec: SandboxRecord, *, timeout: int, memory: Optional[bool]
    ) -> bool:
        """Extend a running sandbox or resume a paused one; True when it was resumed."""

    async def pause_sandbox(
        self, rec: SandboxRecord, *, memory: bool, require_healthy_guest: bool = False
    ) -> None:
        """Pause a running sandbox (``memory`` → freeze, else halt)."""

    async def kill_sandbox(self, rec: SandboxRecord) -> bool:
        """Kill a sandbox and remove its files; False when it was already gone."""

    async def snapshot_files(self, rec: SandboxRecord, dest: str, *, fork: bool) -> None:
        """Copy a running sandbox's files to ``dest`` (freeze, copy, thaw)."""

    async def remove_files(self, path: str) -> None:
        """Remove a copy of sandbox files (errors logged, not raised)."""

    async def sample_metrics(self, rec: SandboxRecord) -> Optional[MetricSample]:
        """Sample a running sandbox's resource use now (None when paused or too soon)."""
