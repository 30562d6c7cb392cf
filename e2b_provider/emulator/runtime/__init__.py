"""The sandbox runtime: what runs on the host to give each sandbox its namespaces, and PID 1.

Runs in the emulator's server process (host side), except :mod:`.pid1` (entry
``pid1/init.py``), which runs inside each sandbox as its PID 1 (started by file path, standard
library only) and then starts the envd agent (:mod:`e2b_provider.emulator.agent`). Modules:
:mod:`.boot` (:class:`SandboxRuntime`: boot, freeze, thaw, halt, destroy, limits), :mod:`.spec`
(:class:`SandboxSpec`), :mod:`.boot_files` (the agent's command line, the host paths bound into
every sandbox, the files a boot starts from), :mod:`.init_launch` (PID 1's ``unshare`` command
and its output log), :mod:`.namespaces` (the isolation check, root mode's id range, rootless
mode, overlaid host directories), :mod:`.cgroups` (freeze/kill/CPU, memory and process limits),
:mod:`.disk` (each sandbox's size-limited disk image), :mod:`.ports` (asking a sandbox's agent
for a connection to one of its TCP ports), :mod:`.linux` (kernel interfaces: prctl, mountinfo,
/proc), :mod:`.files` (copying a sandbox's files for forks and snapshots), :mod:`.usage` (CPU,
memory and disk use), :mod:`.output` (a sandbox's output lines, time-stamped), :mod:`.errors`.
Nothing here imports the host API (:mod:`e2b_provider.emulator.api`) or the agent.
"""

from .boot import SandboxRuntime
from .boot_files import AGENT_SOCKET, PORTS_SOCKET, default_agent_argv, python_bind_paths
from .cgroups import remove_stale_cgroups
from .errors import IsolationUnavailable, SandboxRuntimeError
from .files import copy_sandbox_files
from .namespaces import (
    OVERLAY_DIRS,
    ROOT_MODE_ID_START,
    check_isolation,
    remove_tree,
    root_id_range,
    rootless_message,
    rootless_missing,
    sandbox_id_extents,
    subid_range,
)
from .output import SandboxOutput
from .ports import PortClosed, connect_port
from .spec import SandboxSpec, Service
from .usage import ResourceUsage

__all__ = [
    "AGENT_SOCKET",
    "OVERLAY_DIRS",
    "PORTS_SOCKET",
    "ROOT_MODE_ID_START",
    "IsolationUnavailable",
    "PortClosed",
    "ResourceUsage",
    "SandboxOutput",
    "SandboxRuntime",
    "SandboxRuntimeError",
    "SandboxSpec",
    "Service",
    "check_isolation",
    "connect_port",
    "copy_sandbox_files",
    "default_agent_argv",
    "python_bind_paths",
    "remove_stale_cgroups",
    "remove_tree",
    "root_id_range",
    "rootless_message",
    "rootless_missing",
    "sandbox_id_extents",
    "subid_range",
]
