"""How each provider call begins, and how its errors are said in the caller's terms.

This module owns :class:`Calls`, the facade's call machinery that every resource shares: the
start of a call (the provider open, the sandbox reference checked, the call's own arguments
checked, not yet cancelled), the rewording of every error a call raises (what was being done,
to which sandbox, what to do: :mod:`e2b_provider.core.messages`), the look-up that tells a
sandbox name given for an id, and what a command's cut stream means (the sandbox paused or
deleted meanwhile). It speaks no HTTP itself: the sandbox look-ups go through the shared
:class:`~e2b_provider.core.context.ProviderContext` and the callbacks the provider gives.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Callable, Iterator, List, Optional

from ..cancel import CancelToken, Deadline
from ..errors import (
    Cancelled,
    E2BProviderError,
    InvalidArgument,
    SandboxGoneError,
    TransportError,
)
from ..models import SandboxHandle, SandboxRef
from ..protocol import validate as v
from .context import ProviderContext
from .interrupts import caller_handling, shorten_in_generator
from .messages import (
    cwd_refused,
    is_ambiguous,
    looks_like_sandbox_id,
    name_not_id,
    reword,
    unknown_sandbox_id,
)

__all__ = ["NAME_LOOKUP_BOUND_SECONDS", "Calls", "sandbox_id"]

log = logging.getLogger("e2b_provider")

#: When E2B knows no sandbox by the id a call was given: the look-up of sandboxes of that
#: name (was it a name?) is bounded by this.
NAME_LOOKUP_BOUND_SECONDS = 10.0

#: The sandboxes of one name, listed within a deadline (their ids).
NamedSandboxes = Callable[[str, Deadline], List[str]]


def sandbox_id(ref: SandboxRef) -> str:
    """The sandbox id of a handle or id argument, checked; a sandbox name given instead is
    said to be one."""
    sid = ref.id if isinstance(ref, SandboxHandle) else ref
    if not isinstance(sid, str):
        raise InvalidArgument(
            f"expected a SandboxHandle or a sandbox id string, got {type(ref).__name__}"
        )
    try:
        v.check_sandbox_id(sid)
    except InvalidArgument as exc:
        try:
            v.check_name(sid)
        except InvalidArgument:
            raise exc from None
        raise InvalidArgument(
            f"{exc}; {sid!r} looks like a sandbox name: calls take the handle create() "
            f"returned, or the sandbox id, not the name (list_sandboxes(name={sid!r}) gives "
            "the handles of a name)"
        ) from None
    return sid


class Calls:
    """The start and the error wording of the provider's calls.

    Args:
        ctx: the provider's shared state.
        forget: drops what the file parts know of a sandbox (called when it is gone).
        named: the ids of the sandboxes of a name (a bounded listing).
    """

    def __init__(
        self, ctx: ProviderContext, forget: Callable[[str], None], named: NamedSandboxes
    ) -> None:
        self._ctx = ctx
        self._forget = forget
        self._named = named

    def check_open(self) -> None:
        """Raise ProviderClosed after :meth:`~e2b_provider.E2BSandboxProvider.close`."""
        self._ctx.check_open()

    def open_sandbox(self, sandbox: SandboxRef) -> str:
        """The provider open and the id of ``sandbox`` checked; returns the id."""
        self.check_open()
        return sandbox_id(sandbox)

    def begin(
        self, sandbox: SandboxRef, cancel: Optional[CancelToken], *checks: Callable[[], object]
    ) -> str:
        """The start of a call on one sandbox: open, its id checked, then each of ``checks``
        (the call's own arguments, in order), not yet cancelled. Returns the sandbox id."""
        sid = self.open_sandbox(sandbox)
        for check in checks:
            check()
        v.check_cancel(cancel)
        return sid

    def gone(self, sid: str) -> None:
        """Forget what is known of a sandbox that was deleted."""
        self._forget(sid)
        self._ctx.leases.forget(sid)

    @contextlib.contextmanager
    def doing(self, doing: str, lost: str = "", sid: Optional[str] = None) -> Iterator[None]:
        """Say every error of the block in the caller's terms (see
        :mod:`e2b_provider.core.messages`; ``lost`` is said when the answer was lost); a
        connection error caused by ``close()`` running meanwhile is ProviderClosed, and one
        caused by the deletion of sandbox ``sid`` meanwhile (one look-up of its state) is
        SandboxGoneError. A Ctrl-C's traceback is cut below the call (see
        :mod:`e2b_provider.core.interrupts`)."""
        began = time.monotonic()
        outer = caller_handling()
        try:
            yield
        except KeyboardInterrupt as exc:  # the caller's frames and this call, not the internals
            shorten_in_generator(exc, sys._getframe(), outer)
            raise
        except E2BProviderError as exc:
            closed = self._ctx.closed_error() if isinstance(exc, TransportError) else None
            if closed is not None:
                raise closed from exc
            if (sid is not None and is_ambiguous(exc) and not self._ctx.closed
                    and self._ctx.fate_during(sid, began, None) == "gone"):
                self.gone(sid)
                raise SandboxGoneError(
                    f"{doing} failed: sandbox {sid} was deleted meanwhile (by destroy() or "
                    "another client, or by E2B); create a new sandbox"
                ) from exc
            given = unknown_sandbox_id(exc)
            if given is not None:
                self._name_given(exc, doing, given)
            reword(exc, doing, lost)
            raise

    def _name_given(self, exc: E2BProviderError, doing: str, given: str) -> None:
        """E2B knows no sandbox ``given``: if that is the name of sandboxes (one bounded
        listing), or does not look like an E2B id, say that calls take the handle or id."""
        named: List[str] = []
        if not self._ctx.closed:
            try:
                v.check_name(given)
                named = self._named(given, Deadline.after(NAME_LOOKUP_BOUND_SECONDS))
            except (E2BProviderError, Cancelled) as err:
                log.debug("e2b_provider: could not look up sandboxes named %r: %s", given, err)
        if named or not looks_like_sandbox_id(given):
            name_not_id(exc, doing, given, named)

    @contextlib.contextmanager
    def starting(
        self,
        doing: str,
        sid: Optional[str] = None,
        began: float = 0.0,
        cancel: Optional[CancelToken] = None,
    ) -> Iterator[None]:
        """A command's run: envd refusing its working directory (it checks it before it
        starts anything) is an InvalidArgument; with ``sid`` (the command began at
        ``began``), a stream that a pause or a delete of the sandbox cut says so."""
        try:
            yield
        except E2BProviderError as exc:
            refused = cwd_refused(exc)
            if refused is not None:
                raise InvalidArgument(f"{doing} failed: {refused}") from exc
            if sid is not None:
                self._command_cut(exc, sid, began, cancel)
            raise

    def _command_cut(
        self, exc: E2BProviderError, sid: str, began: float, cancel: Optional[CancelToken]
    ) -> None:
        """A command's stream broke: if a pause or a delete cut it, raise that (one look-up
        of the sandbox's state), not "connection dropped"; otherwise return."""
        if not is_ambiguous(exc) or self._ctx.closed:
            return
        fate = self._ctx.fate_during(sid, began, cancel)
        if fate == "paused":
            raise self._ctx.paused_error(
                sid, "the command ran: its output stream was cut and its exit status "
                "is unknown (it may have finished, or goes on when the sandbox is "
                "resumed)"
            ) from exc
        if fate == "gone":
            self.gone(sid)
            raise SandboxGoneError(
                "the sandbox was deleted while the command ran (by destroy() or "
                "another client, or by E2B): the command ended with it; create a new "
                "sandbox"
            ) from exc
