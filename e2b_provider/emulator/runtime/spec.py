"""What one sandbox is: :class:`SandboxSpec`, its identity, network mode, environment and limits.

This module owns the spec's fields and their validation (ids, host names, environment
variables, volume mount points); a spec is a frozen value the server builds and
:class:`~.boot.SandboxRuntime` boots. Pure.
"""

from __future__ import annotations

import os
import re
import types
from typing import Mapping, Optional, Sequence, Set, Tuple

import attrs

from ...protocol.validate import EGRESS_MODES

__all__ = ["SandboxSpec", "Service"]

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def _env_vars(value: Mapping[str, str]) -> Mapping[str, str]:
    return types.MappingProxyType(dict(value))


def _hosts(value: Sequence[str]) -> Tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError("allow_hosts must be a sequence of host names, not a string")
    return tuple(value)


def _check_id(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _ID_RE.match(value):
        raise ValueError(f"{attribute.name} must match {_ID_RE.pattern}: {value!r}")


def _check_hostname(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _HOSTNAME_RE.match(value):
        raise ValueError(f"{attribute.name} is not a valid host name: {value!r}")


def _check_env(
    _: object, attribute: attrs.Attribute[Mapping[str, str]], value: Mapping[str, str]
) -> None:
    for key, val in value.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"bad environment variable name {key!r}")
        if not isinstance(val, str) or "\0" in val:
            raise ValueError(f"bad value for environment variable {key!r}")


def _binds(value: Sequence[Tuple[str, str]]) -> Tuple[Tuple[str, str], ...]:
    return tuple((str(src), str(dst)) for src, dst in value)


def _check_binds(
    _: object,
    attribute: attrs.Attribute[Tuple[Tuple[str, str], ...]],
    value: Tuple[Tuple[str, str], ...],
) -> None:
    seen: Set[str] = set()
    for src, dst in value:
        if not os.path.isabs(src) or "\0" in src:
            raise ValueError(f"{attribute.name}: the host directory must be absolute: {src!r}")
        if (
            not dst.startswith("/")
            or dst == "/"
            or os.path.normpath(dst) != dst
            or dst.startswith("//")
            or "\0" in dst
            or dst in seen
        ):
            raise ValueError(f"{attribute.name}: bad or repeated mount point {dst!r}")
        seen.add(dst)


def _strings(value: Sequence[str]) -> Tuple[str, ...]:
    return tuple(str(v) for v in value)


def _check_argv(
    _: object, attribute: attrs.Attribute[Tuple[str, ...]], value: Tuple[str, ...]
) -> None:
    if not value or not os.path.isabs(value[0]) or any("\0" in a for a in value):
        raise ValueError(f"{attribute.name}: argv[0] must be an absolute path, no NUL anywhere")


def _check_ready_port(
    _: object, attribute: attrs.Attribute[Optional[int]], value: Optional[int]
) -> None:
    if value is not None and not 1 <= value <= 65535:
        raise ValueError(f"{attribute.name} must be a TCP port, not {value!r}")


@attrs.frozen
class Service:
    """A program a template runs beside the agent (E2B's systemd services): PID 1 starts it
    at every boot, as the sandbox's root, and starts it again whenever it exits.

    Attributes:
        name: what logs call it.
        argv: its command line (``argv[0]`` absolute, as seen inside the sandbox).
        env: variables added to the sandbox's environment for it.
        cwd: its working directory inside the sandbox.
        ready_port: a TCP port inside the sandbox; the boot is done only once something
            listens there (E2B builds such templates with a ready check on it).
        binds: host directories it needs, bound read-only at the same paths.
    """

    name: str
    argv: Tuple[str, ...] = attrs.field(converter=_strings, validator=_check_argv)
    env: Mapping[str, str] = attrs.field(
        factory=dict, converter=_env_vars, validator=_check_env, hash=False
    )
    cwd: str = "/"
    ready_port: Optional[int] = attrs.field(default=None, validator=_check_ready_port)
    binds: Tuple[str, ...] = attrs.field(default=(), converter=_strings)


@attrs.frozen
class SandboxSpec:
    """What one sandbox is: identity, network mode, environment and resource limits.

    Attributes:
        sandbox_id: letters, digits, ``_`` and ``-`` (1 to 64 characters); names cgroups and logs.
        hostname: the sandbox's host name (an RFC 1123 label).
        egress: ``"none"``, ``"allowlist"`` or ``"open"``. Recorded only: every sandbox gets a
            network namespace with loopback alone, so there is no outside network in the
            emulator whatever the mode (fail closed).
        allow_hosts: the allowlist, recorded for the server.
        env_vars: the sandbox's environment variables (given to the agent, see
            :class:`SandboxRuntime`); kept out of ``repr``, they may hold secrets.
        cpu_count: CPUs (a CFS quota where a cpu controller is available).
        memory_mb: memory limit in MiB where a memory controller is available.
        disk_mb: size in MiB of the sandbox's disk (root mode with loop devices), fixed at its
            first boot; a full disk is ENOSPC inside.
        max_processes: the most processes and threads the sandbox may have at once (a pids
            controller limit): a fork bomb stops there.
        volume_binds: ``(host directory, mount point)`` pairs: each host directory (a volume's
            files) is bound read-write at its absolute mount point inside the sandbox at every
            boot; missing directories on the way are made, a symlink on the way fails the boot.
        without: program names the sandbox's template lacks: hidden (whited out in its
            overlay) from every ``PATH`` directory, as ``name``, ``name.*`` and ``name-*``.
            Root mode only (a whiteout is a device node the rootless mode cannot make).
        services: programs its template runs beside the agent (see :class:`Service`).
    """

    sandbox_id: str = attrs.field(validator=_check_id)
    hostname: str = attrs.field(validator=_check_hostname)
    egress: str = attrs.field(default="none", validator=attrs.validators.in_(EGRESS_MODES))
    allow_hosts: Tuple[str, ...] = attrs.field(default=(), converter=_hosts)
    env_vars: Mapping[str, str] = attrs.field(
        factory=dict, converter=_env_vars, validator=_check_env, hash=False, repr=False
    )
    cpu_count: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    memory_mb: int = attrs.field(default=512, validator=attrs.validators.ge(16))
    disk_mb: int = attrs.field(default=1024, validator=attrs.validators.ge(16))
    max_processes: int = attrs.field(default=1024, validator=attrs.validators.ge(16))
    volume_binds: Tuple[Tuple[str, str], ...] = attrs.field(
        default=(), converter=_binds, validator=_check_binds
    )
    without: Tuple[str, ...] = attrs.field(default=(), converter=tuple)
    services: Tuple[Service, ...] = attrs.field(default=(), converter=tuple)
