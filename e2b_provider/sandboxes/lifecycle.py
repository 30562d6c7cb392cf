"""Sandbox lifecycle by name: create, resume, suspend, destroy, and the reboot of a wedged one.

This module owns :class:`Lifecycle`, the provider's part that talks to the control plane
about whole sandboxes: create-by-name (older sandboxes of the name destroyed first), resume,
suspend, destroy and destroy-by-name (the reboot of a wedged sandbox is
:mod:`e2b_provider.core.reboot`'s: a destroyed sandbox's reboot mark is dropped there). Arguments
arrive validated (the provider facade checks them before any I/O).

Bounds: every control-plane call is bounded by its ``call_timeout`` (see
:mod:`~e2b_provider.clients.control`); create-by-name and destroy-by-name, which make several calls
(the listing, a delete per sandbox of the name, the create), share one bound of
:data:`BY_NAME_BOUND_SECONDS` seconds — the wait for another create of the same name included.

Create-by-name is serialized per name within one provider (concurrent ``create("job")``
calls run one after the other, and each destroys the one before: one sandbox of the name
is left). Across processes or providers nothing serializes them: two creates of one name
that overlap may both leave a sandbox (the later ``create`` or ``destroy_by_name`` of the
name removes the extra one). Per-name bookkeeping is bounded: create locks exist only while
used.
"""

from __future__ import annotations

import datetime
import logging
import re
import uuid
from typing import Any, Dict, List, Literal, Optional, Tuple

from ..cancel import CancelToken, Deadline
from ..clients.control_answers import sizes
from ..core.context import KeyedLocks, ProviderContext
from ..core.reboot import Reboots
from ..errors import (
    Cancelled,
    Conflict,
    E2BProviderError,
    MissingAccessToken,
    NotFound,
    OperationTimeout,
    SandboxGoneError,
)
from ..models import SandboxHandle, SandboxLimits, SandboxSummary
from ..protocol import scripts as scripts

__all__ = ["Lifecycle", "ResumeOutcome", "parse_time"]

log = logging.getLogger("e2b_provider")

ResumeOutcome = Literal["resumed", "gone"]

#: create() and destroy_by_name(): all their calls (and the wait for another create of the
#: same name) share this bound, in seconds.
BY_NAME_BOUND_SECONDS = 300.0
#: Deleting a sandbox created without an access token (cleaning up after a failed create).
CLEANUP_BOUND_SECONDS = 30.0
#: Reading the new sandbox's sizes after a create (within the create's own bound).
SIZES_BOUND_SECONDS = 30.0

#: A sandbox's ``(cpu_count, memory_mb, disk_mb)``, each None when unknown.
Sizes = Tuple[Optional[int], Optional[int], Optional[int]]


_TIME_RE = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:\d{2})?"
)


def parse_time(text: str) -> Optional[datetime.datetime]:
    """An RFC 3339 time (any number of fraction digits, ``Z`` or an offset) as aware UTC.

    None for an empty or unreadable text: a listing never fails on a time it cannot read.
    """
    m = _TIME_RE.fullmatch(text.strip())
    if m is None:
        return None
    day, clock, fraction, zone = m.groups()
    micros = (fraction or "").ljust(6, "0")[:6]
    offset = "+00:00" if zone in (None, "Z", "z") else zone
    try:
        stamp = datetime.datetime.fromisoformat(f"{day}T{clock}.{micros}{offset}")
    except ValueError:
        return None
    return stamp.astimezone(datetime.timezone.utc)


class Lifecycle:
    """Create, resume, suspend and destroy sandboxes (arguments already validated).

    Args:
        ctx: the provider's shared state.
        reboots: the reboots of wedged sandboxes (a destroyed sandbox's mark is dropped).
    """

    def __init__(self, ctx: ProviderContext, reboots: Reboots) -> None:
        self._ctx = ctx
        self._reboots = reboots
        # One create per name at a time.
        self._create_locks = KeyedLocks()

    def after_fork(self) -> None:
        """Forget the parent's bookkeeping (its locks may be held by dead threads)."""
        self._reboots.after_fork()
        self._create_locks = KeyedLocks()

    def bookkeeping(self) -> int:
        """How many sandboxes and names this part keeps state for now (for leak checks)."""
        return self._reboots.bookkeeping() + len(self._create_locks)

    def create(
        self, name: str, limits: SandboxLimits, cancel: Optional[CancelToken]
    ) -> SandboxHandle:
        deadline = Deadline.after(BY_NAME_BOUND_SECONDS)
        with self._create_locks.hold(name, cancel=cancel, timeout=deadline.remaining()) as got:
            if not got:
                raise OperationTimeout(
                    f"another create of the name {name!r} in this provider did not finish "
                    f"within {BY_NAME_BOUND_SECONDS:.0f} s"
                )
            return self._create(name, limits, cancel, deadline)

    def _create(
        self,
        name: str,
        limits: SandboxLimits,
        cancel: Optional[CancelToken],
        deadline: Deadline,
    ) -> SandboxHandle:
        ctx = self._ctx
        egress = limits.egress
        if egress == "allowlist" and not ctx.config.domain_allowlist:
            log.warning(
                "e2b_provider: domain allowlists are disabled for this deployment "
                "(domain_allowlist is False); egress allowlist degraded to none for sandbox %r",
                name,
            )
            egress = "none"
        self.destroy_by_name(name, cancel, deadline)
        body: Dict[str, Any] = {
            "templateID": ctx.config.template,
            "metadata": {scripts.METADATA_NAME: name},
            "timeout": ctx.config.timeout_seconds,
            # On timeout E2B pauses the sandbox instead of deleting it: files survive.
            "autoPause": True,
        }
        if egress == "allowlist" and limits.allow_hosts:
            body["network"] = {"allowOut": list(limits.allow_hosts), "denyOut": ["0.0.0.0/0"]}
        else:
            body["allow_internet_access"] = egress == "open"
        if not limits.public_traffic:
            body.setdefault("network", {})["allowPublicTraffic"] = False
        sent_at = ctx.leases.now()
        info = ctx.control.create(
            body, cancel=cancel, idempotency_key=str(uuid.uuid4()), deadline=deadline
        )
        try:
            target = ctx.control.target_for(info)
        except MissingAccessToken as exc:
            # Fail closed: never keep (or leak) a sandbox we will not talk to.
            sid = info.sandbox_id
            try:
                ctx.control.delete(sid, cancel=None, deadline=Deadline.after(CLEANUP_BOUND_SECONDS))
                fate = "it was deleted again"
            except E2BProviderError as err:
                log.warning("e2b_provider: could not delete tokenless sandbox %s: %s", sid, err)
                fate = f"deleting it failed too ({err}); destroy it by name"
            raise SandboxGoneError(
                f"E2B created sandbox {sid} without an envd access token and {fate} (a "
                "sandbox is never used unauthenticated); if this persists, check that the "
                "deployment issues access tokens (secure sandboxes)",
                status=exc.status,
                code=None,
            ) from None
        ctx.leases.remember(info.sandbox_id, target, ctx.config.timeout_seconds, sent_at)
        got = (info.cpu_count, info.memory_mb, info.disk_mb)
        if None in got:
            # E2B's create answer carries no sizes: its GET /sandboxes/{id} does.
            got = self._sizes(info.sandbox_id, limits, cancel, deadline)
        self._check_sizes(info.sandbox_id, name, limits, got)
        cpu_count, memory_mb, disk_mb = got
        return SandboxHandle(
            info.sandbox_id, name, cpu_count=cpu_count, memory_mb=memory_mb, disk_mb=disk_mb
        )

    def _sizes(
        self,
        sid: str,
        limits: SandboxLimits,
        cancel: Optional[CancelToken],
        deadline: Deadline,
    ) -> Sizes:
        """The sizes E2B reports for the new sandbox (one ``GET /sandboxes/{id}``, bounded
        by :data:`SIZES_BOUND_SECONDS`); unknown (None) when the look-up fails: the sandbox was
        created, so the create does not fail for it."""
        try:
            answer = self._ctx.control.get(
                sid, cancel=cancel, deadline=deadline.earliest(Deadline.after(SIZES_BOUND_SECONDS))
            )
        except (E2BProviderError, Cancelled) as exc:
            requested = any(x is not None for x in (limits.cpu, limits.memory_mb, limits.disk_mb))
            log.log(
                logging.WARNING if requested else logging.DEBUG,
                "e2b_provider: could not read the sizes of the new sandbox %s, so the sizes "
                "requested were not checked: %s",
                sid,
                exc,
            )
            return (None, None, None)
        return sizes(answer)

    def _check_sizes(self, sid: str, name: str, limits: SandboxLimits, got: Sizes) -> None:
        """Log one warning for each size requested that the sandbox did not get (E2B sizes
        sandboxes by template: a request is never applied)."""
        template = self._ctx.config.template
        cpu_count, memory_mb, disk_mb = got
        checks = (
            ("cpu", limits.cpu, cpu_count, "{} CPUs", "{} CPUs"),
            ("memory_mb", limits.memory_mb, memory_mb, "{} MiB of memory", "{} MiB"),
            ("disk_mb", limits.disk_mb, disk_mb, "a {} MiB disk", "{} MiB"),
        )
        for field, asked, actual, has, wanted in checks:
            if asked is None or actual is None or asked == actual:
                continue
            log.warning(
                "e2b_provider: sandbox %s (%r) has %s, not the %s requested (%s=%s): E2B "
                "gives every sandbox its template's sizes (template %r); build a template "
                "with the sizes you need",
                sid,
                name,
                has.format(actual),
                wanted.format(_amount(asked)),
                field,
                _amount(asked),
                template,
            )

    def info(self, sid: str, cancel: Optional[CancelToken]) -> SandboxSummary:
        """The sandbox as the control plane describes it now (one ``GET /sandboxes/{id}``;
        a paused sandbox is not resumed)."""
        answer = self._ctx.control.get(sid, cancel=cancel)
        meta = answer.get("metadata")
        name = meta.get(scripts.METADATA_NAME) if isinstance(meta, dict) else None
        state = answer.get("state")
        started = answer.get("startedAt")
        template_id = answer.get("templateID")
        cpu_count, memory_mb, disk_mb = sizes(answer)
        return SandboxSummary(
            id=sid,
            name=name if isinstance(name, str) else None,
            state=state if isinstance(state, str) else "",
            started_at=parse_time(started) if isinstance(started, str) else None,
            template_id=template_id if isinstance(template_id, str) else "",
            cpu_count=cpu_count,
            memory_mb=memory_mb,
            disk_mb=disk_mb,
        )

    def resume(self, sid: str, cancel: Optional[CancelToken]) -> ResumeOutcome:
        try:
            self._ctx.attach(sid, cancel)
        except SandboxGoneError:
            return "gone"
        return "resumed"

    def suspend(self, sid: str, cancel: Optional[CancelToken]) -> None:
        ctx = self._ctx
        ctx.note_pause(sid)  # a command this pause cuts is then reported as such
        ctx.leases.forget(sid)
        try:
            ctx.control.pause(sid, cancel=cancel)
        except (NotFound, Conflict):
            pass
        finally:
            ctx.leases.forget(sid)

    def destroy(
        self, sid: str, cancel: Optional[CancelToken], deadline: Optional[Deadline] = None
    ) -> None:
        ctx = self._ctx
        ctx.leases.forget(sid)
        try:
            ctx.control.delete(sid, cancel=cancel, deadline=deadline)
        finally:
            ctx.leases.forget(sid)
        self._reboots.forget(sid)

    def destroy_by_name(
        self, name: str, cancel: Optional[CancelToken], deadline: Optional[Deadline] = None
    ) -> int:
        if deadline is None:
            deadline = Deadline.after(BY_NAME_BOUND_SECONDS)
        ids = [s.id for s in self.list(name, cancel, deadline)]
        for sid in ids:
            self.destroy(sid, cancel, deadline)
        return len(ids)

    def list(
        self,
        name: Optional[str],
        cancel: Optional[CancelToken],
        deadline: Optional[Deadline] = None,
    ) -> List[SandboxSummary]:
        wanted = {} if name is None else {scripts.METADATA_NAME: name}
        listed = self._ctx.control.list(metadata=wanted, cancel=cancel, deadline=deadline)
        return [
            SandboxSummary(
                id=s.sandbox_id,
                name=s.metadata.get(scripts.METADATA_NAME),
                state=s.state,
                started_at=parse_time(s.started_at),
                template_id=s.template_id,
                cpu_count=s.cpu_count,
                memory_mb=s.memory_mb,
                disk_mb=s.disk_mb,
            )
            for s in listed
            if name is None or s.metadata.get(scripts.METADATA_NAME) == name
        ]


def _amount(value: float) -> str:
    """A requested size as written: ``4``, ``0.5``, ``1024``."""
    if isinstance(value, float) and not value.is_integer():
        return repr(value)
    return str(int(value))
