"""e2b-provider: run agent workloads in E2B sandboxes from blocking Python code.

Public names are re-exported here; nothing else lives in this module. They are imported on
first use (PEP 562), ``__version__`` too, so ``import e2b_provider.cli.entry`` (the command
line) starts without loading the whole library first, and a Ctrl-C during start-up stays a
one-line message: this module imports nothing when it runs (no ``typing``, not even
``__future__``), so no import of its own can take that Ctrl-C outside the command line's
handling of it.
"""

#: False when the module runs; True for type checkers (which read the imports below).
TYPE_CHECKING = False

if TYPE_CHECKING:
    # ``X as X``: each name is re-exported explicitly (``__all__`` is built from ``_HOMES``).
    from typing import Any, Dict, List

    from ._version import __version__ as __version__
    from .cancel import CancelReason as CancelReason
    from .cancel import CancelToken as CancelToken
    from .cancel import Deadline as Deadline
    from .commands.command import Command as Command
    from .commands.command import CommandInfo as CommandInfo
    from .commands.command import CommandOutput as CommandOutput
    from .commands.terminal_handle import Terminal as Terminal
    from .config import DeploymentConfig as DeploymentConfig
    from .errors import AuthenticationError as AuthenticationError
    from .errors import Cancelled as Cancelled
    from .errors import CommandEnded as CommandEnded
    from .errors import CommandFailed as CommandFailed
    from .errors import CommandNotFound as CommandNotFound
    from .errors import ConfigError as ConfigError
    from .errors import Conflict as Conflict
    from .errors import E2BHttpError as E2BHttpError
    from .errors import E2BProviderError as E2BProviderError
    from .errors import FilesFailed as FilesFailed
    from .errors import InvalidArgument as InvalidArgument
    from .errors import MissingAccessToken as MissingAccessToken
    from .errors import NotADirectory as NotADirectory
    from .errors import NotFound as NotFound
    from .errors import OperationTimeout as OperationTimeout
    from .errors import PathNotFound as PathNotFound
    from .errors import PermissionDenied as PermissionDenied
    from .errors import ProtocolError as ProtocolError
    from .errors import ProviderClosed as ProviderClosed
    from .errors import RemoteError as RemoteError
    from .errors import SandboxGoneError as SandboxGoneError
    from .errors import SandboxPaused as SandboxPaused
    from .errors import TransportError as TransportError
    from .errors import TransportTimeout as TransportTimeout
    from .errors import UnsafePath as UnsafePath
    from .files.watch import Watch as Watch
    from .interpreter.results import CodeContext as CodeContext
    from .interpreter.results import Execution as Execution
    from .interpreter.results import ExecutionError as ExecutionError
    from .interpreter.results import Result as Result
    from .models import DirEntry as DirEntry
    from .models import ExecResult as ExecResult
    from .models import FileContent as FileContent
    from .models import FileEvent as FileEvent
    from .models import FileStat as FileStat
    from .models import SandboxHandle as SandboxHandle
    from .models import SandboxLimits as SandboxLimits
    from .models import SandboxSummary as SandboxSummary
    from .models import TransferSummary as TransferSummary
    from .provider import E2BSandboxProvider as E2BSandboxProvider

#: Public name -> the module that defines it.
_HOMES: "Dict[str, str]" = {
    "AuthenticationError": ".errors",
    "CancelReason": ".cancel",
    "CancelToken": ".cancel",
    "Cancelled": ".errors",
    "Command": ".commands.command",
    "CommandEnded": ".errors",
    "CommandFailed": ".errors",
    "CommandInfo": ".commands.command",
    "CommandNotFound": ".errors",
    "CodeContext": ".interpreter.results",
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
    "Execution": ".interpreter.results",
    "ExecutionError": ".interpreter.results",
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
    "Result": ".interpreter.results",
    "SandboxGoneError": ".errors",
    "SandboxHandle": ".models",
    "SandboxLimits": ".models",
    "SandboxPaused": ".errors",
    "SandboxSummary": ".models",
    "Terminal": ".commands.terminal_handle",
    "TransferSummary": ".models",
    "TransportError": ".errors",
    "TransportTimeout": ".errors",
    "UnsafePath": ".errors",
    "Watch": ".files.watch",
    "__version__": "._version",
}


def __getattr__(name: str) -> "Any":
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> "List[str]":
    return sorted(set(globals()) | set(_HOMES))


__all__ = [*_HOMES]
