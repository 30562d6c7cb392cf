"""Finding what the words of a command name: the provider the environment configures, a
sandbox by name or id, a background command (or terminal) by id."""

from __future__ import annotations

import os
import re
from typing import Callable, Union

from ..commands.command import Command
from ..commands.terminal_handle import Terminal
from ..config import DeploymentConfig
from ..errors import E2BProviderError, InvalidArgument
from ..models import SandboxHandle
from ..protocol import validate as v
from ..provider import E2BSandboxProvider
from . import emulator_record
from .exits import UsageError

_CID = re.compile(r"(?:root-)?[0-9a-f]{32}")


def connect() -> E2BSandboxProvider:
    """A provider configured by the environment (as :meth:`DeploymentConfig.from_env`), or,
    when ``E2B_API_KEY`` is unset, by the running ``e2b-provider emulator``'s record."""
    if os.environ.get("E2B_API_KEY"):
        return E2BSandboxProvider(DeploymentConfig.from_env())
    return E2BSandboxProvider(DeploymentConfig.from_env(emulator_record.emulator_settings()))


def _valid(check: Callable[[str], object], ref: str) -> bool:
    try:
        check(ref)
    except InvalidArgument:
        return False
    return True


def resolve(p: E2BSandboxProvider, ref: str) -> SandboxHandle:
    """A sandbox by name (created by this library) or by id.

    Raises:
        UsageError: ``ref`` can be neither a name nor an id.
        E2BProviderError: no such sandbox, or several of that name (exit status 1).
    """
    is_name, is_id = _valid(v.check_name, ref), _valid(v.check_sandbox_id, ref)
    if not is_name and not is_id:
        raise UsageError(f"{ref!r} is neither a sandbox name nor a sandbox id")
    named = p.list_sandboxes(ref) if is_name else []
    if len(named) == 1:
        return named[0].handle
    if len(named) > 1:
        ids = ", ".join(s.id for s in named)
        raise E2BProviderError(f"{len(named)} sandboxes are named {ref!r} ({ids}); give an id")
    if not is_id:
        raise E2BProviderError(f"no sandbox is named {ref!r}")
    if not any(s.id == ref for s in p.list_sandboxes()):
        raise E2BProviderError(f"no sandbox is named {ref!r} or has that id")
    return SandboxHandle(ref)


def found(p: E2BSandboxProvider, h: SandboxHandle, ref: str) -> Union[Command, Terminal]:
    """The background command (or terminal) ``ref`` of the sandbox: its id, or (a command)
    what follows its ``:`` (32 hex digits, after ``root-`` for root's)."""
    return p.attach(h, f"{h.id}:{ref}" if _CID.fullmatch(ref) else ref)


def attach(p: E2BSandboxProvider, h: SandboxHandle, ref: str) -> Command:
    """The background command ``ref`` of the sandbox (see :func:`found`)."""
    command = found(p, h, ref)
    if not isinstance(command, Command):
        command.detach()
        raise UsageError(f"{ref[:120]} is a terminal, not a background command: its output "
                         "is not kept (kill stops it)")
    return command
