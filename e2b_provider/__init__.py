"""e2b-provider: run agent workloads in E2B sandboxes from blocking Python code.

Public names are re-exported here; nothing else lives in this module. They are imported on
first use (PEP 562), so ``import e2b_provider.cli.entry`` (the command line) starts without loading
the whole library first, and a Ctrl-C during start-up stays a one-line message.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

from ._version import __version__

if TYPE_CHECKING:
    from .cancel import CancelReason, CancelToken, Deadline
    from .commands.command import Command, CommandInfo, CommandOutput
    from .commands.terminals import Terminal
    from .config import DeploymentConfig
    from .errors import (
        AuthenticationError,
        Cancelled,
        CommandEnded,
        CommandFailed,
        CommandNotFound,
        ConfigError,
        Conflict,
        E2BHttpError,
        E2BProviderError,
        FilesFailed,
        InvalidArgument,
        MissingAccessToken,
        NotADirectory,
        NotFound,
        OperationTimeout,
        PathNotFound,
        PermissionDenied,
        ProtocolError,
        ProviderClosed,
        RemoteError,
        SandboxGoneError,
        SandboxPaused,
        TransportError,
        TransportTimeout,
        UnsafePath,
    )
    from .files.watch import Watch
    from .models import (
        DirEntry,
        ExecResult,
        FileContent,
        FileEvent,
        FileStat,
        SandboxHandle,
        SandboxLimits,
        SandboxSummary,
        TransferSummary,
    )
    from .provider import E2BSandboxProvider

#: Public name -> the module that defines it.
_HOMES: Dict[str, str] = {
    "AuthenticationError": ".errors",
    "CancelReason": ".cancel",
    "CancelToken": ".cancel",
    "Cancelled": ".errors",
    "Command": ".commands.command",
    "CommandEnded": ".errors",
    "CommandFailed": ".errors",
    "CommandInfo": ".commands.command",
    "CommandNotFound": ".errors",
    "CommandOutput": ".commands.command",
    "ConfigError": ".errors",
    "Conflict": ".errors",
    "Deadline": ".cancel",
    "DeploymentConfig": ".config",
    "DirEntry": ".models",
    "E2BHttpError": ".errors",
    "E2BProviderError": ".errors",
    "E2BSandboxProvider": ".provider",
    "ExecResult": ".models",
    "FileContent": ".models",
    "FileEvent": ".models",
    "FileStat": ".models",
    "FilesFailed": ".errors",
    "InvalidArgument": ".errors",
    "MissingAccessToken": ".errors",
    "NotADirectory": ".errors",
    "NotFound": ".errors",
    "OperationTimeout": ".errors",
    "PathNotFound": ".errors",
    "PermissionDenied": ".errors",
    "ProtocolError": ".errors",
    "ProviderClosed": ".errors",
    "RemoteError": ".errors",
    "SandboxGoneError": ".errors",
    "SandboxHandle": ".models",
    "SandboxLimits": ".models",
    "SandboxPaused": ".errors",
    "SandboxSummary": ".models",
    "Terminal": ".commands.terminals",
    "TransferSummary": ".models",
    "TransportError": ".errors",
    "TransportTimeout": ".errors",
    "UnsafePath": ".errors",
    "Watch": ".files.watch",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_HOMES))


__all__ = [
    "AuthenticationError",
    "CancelReason",
    "CancelToken",
    "Cancelled",
    "Command",
    "CommandEnded",
    "CommandFailed",
    "CommandInfo",
    "CommandNotFound",
    "CommandOutput",
    "ConfigError",
    "Conflict",
    "Deadline",
    "DeploymentConfig",
    "E2BHttpError",
    "E2BProviderError",
    "E2BSandboxProvider",
    "ExecResult",
    "DirEntry",
    "FilesFailed",
    "Terminal",
    "TransferSummary",
    "FileContent",
    "FileEvent",
    "FileStat",
    "InvalidArgument",
    "MissingAccessToken",
    "NotADirectory",
    "NotFound",
    "OperationTimeout",
    "PathNotFound",
    "PermissionDenied",
    "ProtocolError",
    "ProviderClosed",
    "RemoteError",
    "SandboxGoneError",
    "SandboxHandle",
    "SandboxPaused",
    "SandboxLimits",
    "SandboxSummary",
    "TransportError",
    "TransportTimeout",
    "UnsafePath",
    "Watch",
    "__version__",
]
