"""e2b-provider: run agent workloads in E2B sandboxes from blocking Python code.

Public names are re-exported here; nothing else lives in this module.
"""

from ._background import Command, CommandInfo, CommandOutput
from ._version import __version__
from .cancel import CancelReason, CancelToken, Deadline
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
    NotFound,
    OperationTimeout,
    ProtocolError,
    ProviderClosed,
    RemoteError,
    SandboxGoneError,
    SandboxPaused,
    TransportError,
    TransportTimeout,
    UnsafePath,
)
from .models import (
    DirEntry,
    ExecResult,
    FileContent,
    FileStat,
    SandboxHandle,
    SandboxLimits,
    SandboxSummary,
    TransferSummary,
)
from .provider import E2BSandboxProvider

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
    "TransferSummary",
    "FileContent",
    "FileStat",
    "InvalidArgument",
    "MissingAccessToken",
    "NotFound",
    "OperationTimeout",
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
    "__version__",
]
