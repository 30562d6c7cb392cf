"""What the provider's parts share: configuration, clients, the watchdog, bounds, leases.

This module owns :class:`ProviderContext`, the plumbing behind
:class:`~e2b_provider.E2BSandboxProvider` and its parts (lifecycle, commands, files): the
deployment config, the HTTP transport, the control-plane client, the watchdog, the lease
cache, the escalation bounds, and the two helpers every sandbox call goes through —
:meth:`ProviderContext.on_target` (a live envd target, retried once when the request provably
never reached envd) and :meth:`ProviderContext.run_script` (one of the reference's scripts,
bounded like a file operation). It owns the fork check: a provider made before ``os.fork``
gets fresh connections and the child's watchdog.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Callable, List, Optional, TypeVar

import attrs

from . import _scripts as scripts
from ._exec import RunOutcome, run_process
from ._http import Transport
from ._leases import LeaseCache
from ._watchdog import Watchdog
from .cancel import CancelToken
from .config import DeploymentConfig
from .control import ControlPlane
from .envd import EnvdClient
from .errors import (
    Cancelled,
    CommandFailed,
    E2BHttpError,
    E2BProviderError,
    OperationTimeout,
    register_secret,
)
from .models import Target

__all__ = [
    "FILE_OP_TIMEOUT",
    "MAX_TIMEOUT_SECONDS",
    "STDERR_ROOM",
    "Bounds",
    "ProviderContext",
    "never_reached_envd",
    "script_failed",
]

log = logging.getLogger("e2b_provider")

MAX_TIMEOUT_SECONDS = 86400
#: File operations and the reference's scripts are bounded by this (reference: 120 s).
FILE_OP_TIMEOUT = 120.0
#: Room kept for a script's standard error.
STDERR_ROOM = 64 * 1024

_T = TypeVar("_T")


@attrs.frozen
class Bounds:
    """How long each rung of the escalation may take, in seconds."""

    kill: float
    grace: float
    interrupt_kill: float
    reboot: float
    keepalive: int


def script_failed(message: str, r: RunOutcome) -> CommandFailed:
    """The error for a script that failed: ``message``, its exit code and standard error."""
    stderr = r.stderr.decode("utf-8", "replace").strip()[:500]
    return CommandFailed(message, exit_code=r.exit_code, stderr=stderr)


def never_reached_envd(exc: E2BHttpError) -> bool:
    """True for an answer that proves the request never reached envd, so nothing ran.

    E2B's edge answers 502 "The sandbox was not found" for a sandbox that is paused or gone
    (paused by someone else after our connect, say): the request went no further. Any other
    502 may come from anywhere on the way and is never taken as proof.
    """
    return exc.status == 502 and "not found" in exc.message.lower()


class ProviderContext:
    """The shared state of one provider, and the helpers every sandbox call uses.

    Args:
        config: the deployment.
        pool_connections: HTTP hosts whose pools are kept.
        pool_maxsize: connections kept per host.
        watchdog: the watchdog to use; None for the process-wide one.
        bounds: the escalation bounds.
    """

    def __init__(
        self,
        config: DeploymentConfig,
        *,
        pool_connections: int,
        pool_maxsize: int,
        watchdog: Optional[Watchdog],
        bounds: Bounds,
    ) -> None:
        self.config = config
        self.bounds = bounds
        self._pool_sizes = (pool_connections, pool_maxsize)
        self._own_watchdog = watchdog
        self._lock = threading.Lock()
        self._closed = False
        self._pid = -1
        self._fork_hooks: List[Callable[[], None]] = []
        self.transport: Transport
        self.control: ControlPlane
        self.watchdog: Watchdog
        self.leases: LeaseCache
        self._start_clients()

    def _start_clients(self) -> None:
        """(Re)create the HTTP pools and lease cache and pick the watchdog, for this process."""
        cfg = self.config
        self.transport = Transport(
            pool_connections=self._pool_sizes[0], pool_maxsize=self._pool_sizes[1]
        )
        self.control = ControlPlane(
            self.transport,
            api_url=cfg.effective_api_url,
            api_key=cfg.api_key,
            domain=cfg.domain,
            sandbox_url=cfg.sandbox_url,
        )
        wd = self._own_watchdog
        self.watchdog = wd if wd is not None and not wd.closed else Watchdog.default()
        self.leases = LeaseCache(
            self._connect,
            lifetime=min(MAX_TIMEOUT_SECONDS, cfg.timeout_seconds),
            submit=self.watchdog.submit,
        )
        self._pid = os.getpid()

    # -- open / closed / forked ---------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Release HTTP connections. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.transport.close()

    def check_open(self) -> None:
        """Raise :class:`ProviderClosed` after :meth:`close`; start afresh after a fork."""
        if self._closed:
            raise E2BProviderError("the provider is closed")
        if self._pid != os.getpid():
            # Forked (multiprocessing, gunicorn, ...): the parent's watchdog thread and pooled
            # sockets do not exist here. Start afresh; the parent's sockets are left alone.
            with self._lock:
                if self._pid != os.getpid():
                    self._start_clients()
                    for hook in self._fork_hooks:
                        hook()

    def on_fork(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` in a forked child before its first call (parts reset their state)."""
        self._fork_hooks.append(hook)

    # -- sandbox targets ------------------------------------------------------------------

    def lease_seconds(self, min_seconds: int = 0) -> int:
        """The TTL asked for on connect: the configured lifetime, or more if a call needs it."""
        return min(MAX_TIMEOUT_SECONDS, max(self.config.timeout_seconds, min_seconds))

    def _connect(self, sid: str, lease: int, cancel: Optional[CancelToken]) -> Target:
        info = self.control.attach(sid, timeout_seconds=lease, token=cancel)
        target = self.control.target_for(info)
        register_secret(target.access_token)
        return target

    def attach(self, sid: str, cancel: Optional[CancelToken], min_seconds: int = 0) -> Target:
        """Connect to the sandbox now (resuming it if paused), extend and remember its lease."""
        if cancel is not None:
            cancel.raise_if_cancelled()
        lease = self.lease_seconds(min_seconds)
        return self.leases.connect(sid, lease_seconds=lease, cancel=cancel)

    def envd(self, target: Target) -> EnvdClient:
        """The envd client for ``target``."""
        return EnvdClient(self.transport, target)

    def on_target(
        self,
        sid: str,
        cancel: Optional[CancelToken],
        fn: Callable[[Target], _T],
        need: float = FILE_OP_TIMEOUT,
    ) -> _T:
        """``fn(target)`` on a target that lasts ``need`` seconds; once more if it was stale.

        The target comes from the lease cache: a warm sandbox costs no control-plane call;
        a cold one (or one whose lease would end within ``need`` seconds) is connected
        first, which also resumes it if paused. E2B's edge answers 502 "The sandbox was not
        found" for a sandbox paused or deleted (by another client, say) after the lease was
        taken: nothing reached envd, so nothing ran, and connecting again (which resumes it,
        or says it is gone) and retrying once is safe.
        """
        lease = self.lease_seconds(math.ceil(need))
        if cancel is not None:
            cancel.raise_if_cancelled()
        target = self.leases.get(sid, need=need, lease_seconds=lease, cancel=cancel)
        try:
            return fn(target)
        except E2BHttpError as exc:
            if not never_reached_envd(exc):
                raise
        log.info("e2b_provider: sandbox %s was paused or moved under us; connecting again", sid)
        target = self.leases.get(sid, need=need, lease_seconds=lease, cancel=cancel, stale=target)
        return fn(target)

    # -- scripts --------------------------------------------------------------------------

    def run_script(
        self,
        target: Target,
        user: str,
        args: List[str],
        max_output_bytes: int,
        cancel: Optional[CancelToken],
    ) -> RunOutcome:
        """Run ``/bin/sh args`` as ``user``, bounded by :data:`FILE_OP_TIMEOUT`.

        Raises:
            Cancelled: ``cancel`` fired.
            OperationTimeout: the script ran longer than the bound.
        """
        r = run_process(
            self.envd(target),
            user=user,
            cmd="/bin/sh",
            args=args,
            cwd="/",
            max_output_bytes=max_output_bytes,
            timeout=FILE_OP_TIMEOUT,
            token=cancel,
            watchdog=self.watchdog,
            keepalive_seconds=self.bounds.keepalive,
        )
        if r.cancelled:
            raise Cancelled(cancel.reason if cancel is not None else None)
        if r.timed_out:
            raise OperationTimeout("sandbox file operation timed out")
        return r

    def script_on(
        self,
        sid: str,
        args: List[str],
        cancel: Optional[CancelToken],
        *,
        max_output_bytes: int = STDERR_ROOM,
    ) -> RunOutcome:
        """Run one of the reference's scripts as ``sandbox`` (attach, retry once if paused)."""
        return self.on_target(
            sid,
            cancel,
            lambda t: self.run_script(t, scripts.SANDBOX_USER, args, max_output_bytes, cancel),
        )
