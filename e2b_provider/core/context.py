"""What the provider's parts share: configuration, clients, the watchdog, bounds, leases.

This module owns :class:`ProviderContext`, the plumbing behind
:class:`~e2b_provider.E2BSandboxProvider` and its parts (lifecycle, commands, files): the
deployment config, the HTTP transport, the control-plane client, the watchdog, the lease
cache, the escalation bounds, and the two helpers every sandbox call goes through —
:meth:`ProviderContext.on_target` (a live envd target, retried once when the request provably
never reached envd) and :meth:`ProviderContext.run_script` (one of the reference's scripts,
bounded like a file operation). It owns the fork check: a provider made before ``os.fork``
gets fresh connections and the child's watchdog. It also owns what the parts share about
sandboxes between calls, bounded: :class:`KeyedLocks` (one lock per sandbox or name, dropped
when unused) and the marks of sandboxes this provider paused (so a command cut by a pause is
reported as such, :meth:`ProviderContext.paused_during`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

import attrs

from .._watchdog import Watchdog
from ..cancel import WAIT_SLICE_SECONDS, CancelReason, CancelToken
from ..clients.control import ControlPlane
from ..clients.envd import EnvdClient
from ..config import DeploymentConfig
from ..errors import (
    Cancelled,
    CommandFailed,
    E2BHttpError,
    E2BProviderError,
    InvalidArgument,
    OperationTimeout,
    ProviderClosed,
    SandboxGoneError,
    SandboxPaused,
    TransportTimeout,
)
from ..models import Target
from ..protocol import scripts as scripts
from ..protocol import validate as v
from ..protocol.e2b_facts import MAX_TIMEOUT_SECONDS
from ..transport.client import Transport
from .leases import LeaseCache
from .marks import remember
from .messages import command_failed, script_reason
from .run_engine import RunOutcome, run_process

__all__ = [
    "FILE_OP_TIMEOUT_SECONDS",
    "STDERR_ROOM",
    "Bounds",
    "KeyedLocks",
    "ProviderContext",
    "checked_bounds",
    "never_reached_envd",
    "script_failed",
    "silence_is_timeout",
]

log = logging.getLogger("e2b_provider")

#: File operations and the reference's scripts are bounded by this (reference: 120 s).
FILE_OP_TIMEOUT_SECONDS = 120.0
#: Room kept for a script's standard error.
STDERR_ROOM = 64 * 1024
#: Sandboxes whose pause by this provider is remembered (least recently paused dropped).
MAX_PAUSE_MARKS = 4096
#: Seconds the look-up of a sandbox's state after a cut connection may take.
PAUSE_LOOKUP_BOUND_SECONDS = 10.0
#: Sandboxes a per-sandbox memo keeps at most (what a sandbox lacks, its agent sessions...;
#: the least recently used dropped first).
MAX_REMEMBERED_SANDBOXES = 1024

_T = TypeVar("_T")


@attrs.frozen
class Bounds:
    """How long each rung of the escalation may take, in seconds."""

    kill: float
    grace: float
    interrupt_kill: float
    reboot: float
    keepalive: int


def checked_bounds(
    kill_bound: float,
    kill_grace: float,
    interrupt_kill_bound: float,
    reboot_bound: float,
    keepalive_seconds: int,
) -> Bounds:
    """The provider's bounds from its arguments, each checked (before any I/O)."""
    for name, value in (
        ("kill_bound", kill_bound),
        ("kill_grace", kill_grace),
        ("interrupt_kill_bound", interrupt_kill_bound),
        ("reboot_bound", reboot_bound),
    ):
        v.check_timeout(value, name=name)
    if not isinstance(keepalive_seconds, int) or not 1 <= keepalive_seconds <= 3600:
        raise InvalidArgument("keepalive_seconds must be an int from 1 to 3600")
    return Bounds(
        kill=float(kill_bound),
        grace=float(kill_grace),
        interrupt_kill=float(interrupt_kill_bound),
        reboot=float(reboot_bound),
        keepalive=keepalive_seconds,
    )


def script_failed(what: str, r: RunOutcome, hint: str = "") -> CommandFailed:
    """The error for a sandbox script that failed: why, in plain words, from its standard
    error (without the script's internal names), then ``hint``; ``what`` (the script's
    purpose) is said only when the script gave no reason. ``.stderr`` keeps the cleaned
    standard error, ``.exit_code`` its status."""
    stderr = r.stderr.decode("utf-8", "replace")
    reason = script_reason(stderr, r.exit_code)
    if not stderr.strip():
        reason = f"{what}: {reason}"
    return command_failed(f"{reason}; {hint}" if hint else reason, r.exit_code, stderr)


@contextlib.contextmanager
def silence_is_timeout() -> Iterator[None]:
    """A stream that went silent past its read timeout ends a bounded operation (a script,
    a file operation) as :class:`OperationTimeout`, as documented for them."""
    try:
        yield
    except TransportTimeout as exc:
        raise OperationTimeout("the sandbox stopped answering") from exc


class KeyedLocks:
    """One lock per key (a sandbox id, a name), created on first use and dropped when no
    thread holds or waits for it, so the table never outgrows the keys in use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: Dict[str, Tuple[threading.Lock, int]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._locks)

    def _enter(self, key: str) -> threading.Lock:
        with self._lock:
            lock, users = self._locks.get(key, (None, 0))
            if lock is None:
                lock = threading.Lock()
            self._locks[key] = (lock, users + 1)
            return lock

    def _leave(self, key: str) -> None:
        with self._lock:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    @contextlib.contextmanager
    def hold(
        self,
        key: str,
        *,
        cancel: Optional[CancelToken] = None,
        timeout: Optional[float] = None,
    ) -> Iterator[bool]:
        """Hold ``key``'s lock for the block; yields False (without the lock) if it was not
        free within ``timeout`` seconds (None: as long as it takes).

        Raises:
            Cancelled: ``cancel`` fired while waiting.
        """
        lock = self._enter(key)
        got = False
        try:
            ends = None if timeout is None else time.monotonic() + timeout
            while not got:
                if cancel is not None:
                    cancel.raise_if_cancelled()
                left = WAIT_SLICE_SECONDS
                if ends is not None:
                    left = max(0.0, min(left, ends - time.monotonic()))
                got = lock.acquire(timeout=left)
                if not got and ends is not None and time.monotonic() >= ends:
                    break
            yield got
        finally:
            if got:
                lock.release()
            self._leave(key)


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
        # sandbox id -> when this provider last asked to pause it (monotonic)
        self._paused: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.transport: Transport
        self.control: ControlPlane
        self.watchdog: Watchdog
        self.leases: LeaseCache
        self._start_clients()

    def _start_clients(self) -> None:
        """(Re)create the HTTP pools and lease cache and pick the watchdog, for this process."""
        cfg = self.config
        wd = self._own_watchdog
        self.watchdog = wd if wd is not None and not wd.closed else Watchdog.default()
        self.transport = Transport(
            pool_connections=self._pool_sizes[0],
            pool_maxsize=self._pool_sizes[1],
            watchdog=self.watchdog,  # enforces every request's deadline
        )
        self.control = ControlPlane(
            self.transport,
            api_url=cfg.effective_api_url,
            api_key=cfg.api_key,
            domain=cfg.domain,
            sandbox_url=cfg.sandbox_url,
        )
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
            raise ProviderClosed(
                "this E2BSandboxProvider is closed (close() was called); make a new provider "
                "to go on (closing one leaves the sandboxes as they are)"
            )
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

    def closed_error(self) -> Optional[ProviderClosed]:
        """After :meth:`close`, the error for a call whose connection broke meanwhile (closing
        ended it); None while the provider is open."""
        if not self._closed:
            return None
        return ProviderClosed(
            "this E2BSandboxProvider was closed while the call ran, which ended it; its "
            "outcome is unknown. Make a new provider to go on"
        )

    # -- pauses --------------------------------------------------------------------------

    def note_pause(self, sid: str) -> None:
        """Remember that this provider is pausing ``sid`` now (bounded: the oldest marks are
        dropped first)."""
        with self._lock:
            remember(self._paused, sid, time.monotonic(), MAX_PAUSE_MARKS)

    def paused_during(self, sid: str, began: float, cancel: Optional[CancelToken]) -> bool:
        """Whether ``sid`` was paused after ``began`` (monotonic): by this provider (its own
        mark), or as the control plane says now (another client, or E2B itself). A failed
        look-up counts as "not known to be paused"."""
        return self.fate_during(sid, began, cancel) == "paused"

    def fate_during(
        self, sid: str, began: float, cancel: Optional[CancelToken]
    ) -> Optional[str]:
        """What became of ``sid`` while a call that began at ``began`` (monotonic) ran and
        its connection broke: ``"paused"`` (by this provider, as its own mark says, or as
        the control plane says now), ``"gone"`` (the control plane no longer knows it: it
        was deleted, by another client say), or None (running, or the look-up failed).
        At most one control-plane GET, bounded by :data:`PAUSE_LOOKUP_BOUND_SECONDS`."""
        with self._lock:
            mark = self._paused.get(sid)
        if mark is not None and mark >= began:
            return "paused"
        # One look-up, bounded (an error path must not add minutes) and cancellable.
        guard = CancelToken()

        def stop(reason: CancelReason) -> None:
            guard.cancel(reason)

        timer = self.watchdog.call_later(
            PAUSE_LOOKUP_BOUND_SECONDS, lambda: stop(CancelReason("deadline", "look-up bound"))
        )
        unlink = cancel.on_cancel(stop) if cancel is not None else None
        try:
            state = self.control.get(sid, cancel=guard).get("state")
        except SandboxGoneError:
            return "gone"
        except (E2BProviderError, Cancelled) as exc:
            log.debug("e2b_provider: could not look up the state of sandbox %s: %s", sid, exc)
            return None
        finally:
            timer.cancel()
            if unlink is not None:
                unlink()
        return "paused" if state in ("paused", "pausing") else None

    def paused_error(self, sid: str, what: str) -> SandboxPaused:
        """The error for a call on ``sid`` that a pause cut short; ``what`` says what the
        call was doing and what its outcome may be."""
        return SandboxPaused(
            f"sandbox {sid} was paused while {what}; resume() it (any call does), and use "
            "kill_all() to stop commands that may go on running",
            sandbox_id=sid,
        )

    # -- sandbox targets ------------------------------------------------------------------

    def lease_seconds(self, min_seconds: int = 0) -> int:
        """The TTL asked for on connect: the configured lifetime, or more if a call needs it."""
        return min(MAX_TIMEOUT_SECONDS, max(self.config.timeout_seconds, min_seconds))

    def _connect(self, sid: str, lease: int, cancel: Optional[CancelToken]) -> Target:
        info = self.control.attach(sid, timeout_seconds=lease, cancel=cancel)
        return self.control.target_for(info)

    def attach(self, sid: str, cancel: Optional[CancelToken], min_seconds: int = 0) -> Target:
        """Connect to the sandbox now (resuming it if paused), extend and remember its lease."""
        if cancel is not None:
            cancel.raise_if_cancelled()
        lease = self.lease_seconds(min_seconds)
        return self.leases.connect(sid, lease_seconds=lease, cancel=cancel)

    def envd(self, target: Target) -> EnvdClient:
        """The envd client for ``target``."""
        return EnvdClient(self.transport, target)

    def processes(self, sid: str, cancel: Optional[CancelToken]) -> List[Dict[str, Any]]:
        """envd's list of the processes it runs in sandbox ``sid`` (``process.Process/List``:
        each one's pid, tag and the config it was started with)."""
        return self.on_target(sid, cancel, lambda t: self.envd(t).list_processes(cancel=cancel))

    def on_target(
        self,
        sid: str,
        cancel: Optional[CancelToken],
        fn: Callable[[Target], _T],
        need: float = FILE_OP_TIMEOUT_SECONDS,
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
        """Run ``/bin/sh args`` as ``user``, bounded by :data:`FILE_OP_TIMEOUT_SECONDS`.

        Raises:
            Cancelled: ``cancel`` fired.
            OperationTimeout: the script ran longer than the bound, or the sandbox stopped
                answering.
        """
        with silence_is_timeout():
            r = run_process(
                self.envd(target),
                user=user,
                cmd="/bin/sh",
                args=args,
                cwd="/",
                max_output_bytes=max_output_bytes,
                timeout=FILE_OP_TIMEOUT_SECONDS,
                cancel=cancel,
                watchdog=self.watchdog,
                keepalive_seconds=self.bounds.keepalive,
            )
        if r.cancelled:
            raise Cancelled(cancel.reason if cancel is not None else None)
        if r.timed_out:
            raise OperationTimeout(f"it did not finish within {FILE_OP_TIMEOUT_SECONDS:.0f} s")
        return r

    def script_on(
        self,
        sid: str,
        args: List[str],
        cancel: Optional[CancelToken],
        *,
        max_output_bytes: int = STDERR_ROOM,
        user: str = scripts.SANDBOX_USER,
    ) -> RunOutcome:
        """Run one of the reference's scripts as ``sandbox`` (or ``user``; attach, retry once
        if paused)."""
        return self.on_target(
            sid,
            cancel,
            lambda t: self.run_script(t, user, args, max_output_bytes, cancel),
        )
