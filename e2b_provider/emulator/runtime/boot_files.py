"""The files a sandbox boots from: the agent's command line, the host paths bound into every
sandbox, and the state directory's skeleton with ``sandbox.json``, ``boot_id`` and
``boot.json`` (the configuration PID 1, :mod:`.pid1.init`, reads).

This module owns what a boot is configured with; :mod:`.boot` writes these files before each
boot (see its docstring for the state directory's layout) and starts PID 1 on ``boot.json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import attrs

from .errors import SandboxRuntimeError
from .namespaces import HOST_PATH, OVERLAY_DIRS, ROOTLESS_IDS, root_id_range, usr_merge_links
from .spec import SandboxSpec

__all__ = [
    "AGENT_SOCKET",
    "PORTS_SOCKET",
    "BootFiles",
    "default_agent_argv",
    "package_dir",
    "python_bind_paths",
    "write_boot_files",
]

AGENT_SOCKET = "/run/e2b/envd.sock"
#: Where PID 1 makes the agent's second socket: the host asks there for a connection to one of
#: the sandbox's TCP ports and gets it back as a descriptor (see :mod:`..agent.ports`).
PORTS_SOCKET = "/run/e2b/ports.sock"


def package_dir() -> str:
    """The directory of the ``e2b_provider`` package (``e2b_provider/emulator/runtime/..``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.dirname(os.path.dirname(here))


def default_agent_argv() -> List[str]:
    """Return the command line of the real envd agent, as run inside a sandbox."""
    return [
        sys.executable, "-E", "-s", "-m", "e2b_provider.emulator.agent",
        "--socket", AGENT_SOCKET, "--default-user", "user",
    ]  # fmt: skip


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def python_bind_paths(extra: Sequence[str] = ()) -> List[str]:
    """Return the host directories bound read-only into every sandbox, at the same paths.

    They are what ``sys.executable -m e2b_provider.emulator.agent`` needs: the interpreter's
    prefixes, the ``e2b_provider`` package and the directory holding ``aiohttp``; then
    ``extra`` (what the template's services need). Paths under the overlaid ``/usr``,
    ``/etc``, ``/var`` and ``/opt`` are visible anyway and left out.
    """
    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        package_dir(),
    ]
    spec = importlib.util.find_spec("aiohttp")
    if spec is not None and spec.origin:
        candidates.append(os.path.dirname(os.path.dirname(spec.origin)))
    candidates.extend(extra)
    paths = sorted({os.path.realpath(p) for p in candidates if p})
    kept: List[str] = []
    for path in paths:
        if path == "/" or any(_under(path, "/" + d) for d in OVERLAY_DIRS):
            continue
        if any(_under(path, k) for k in kept):
            continue
        kept.append(path)
    return kept


@attrs.frozen
class BootFiles:
    """What :func:`write_boot_files` wrote for one boot.

    Attributes:
        config_path: the ``boot.json`` PID 1 is started on.
        boot_id: the sandbox's ``/proc/sys/kernel/random/boot_id`` for this boot.
    """

    config_path: str
    boot_id: str


def _check_binds(state_dir: str, binds: Sequence[str], rootless: bool) -> None:
    sd = os.path.realpath(state_dir)
    for bind in binds:
        if _under(sd, bind):
            raise SandboxRuntimeError(
                f"state_dir {state_dir} is inside {bind}, which every sandbox sees read-only"
            )
        mode = os.stat(bind).st_mode
        if not rootless and mode & 0o005 != 0o005:
            raise SandboxRuntimeError(
                f"{bind} (needed by the agent inside every sandbox) must be readable and "
                f"searchable by everyone (mode {stat.S_IMODE(mode):o}): the sandbox's root "
                "is not host root"
            )


def write_boot_files(
    spec: SandboxSpec,
    state_dir: str,
    *,
    disk: bool,
    rootless: bool,
    agent_argv: Sequence[str],
    agent_cwd: str,
    stale_sockets: Sequence[str],
) -> BootFiles:
    """Create the state dir's skeleton, ``sandbox.json``, ``boot_id`` and ``boot.json``.

    Args:
        spec: the sandbox.
        state_dir: its state directory (absolute).
        disk: whether its files live in a disk image (mounted by PID 1 at ``disk/``).
        rootless: whether it boots in a user namespace of this (unprivileged) user.
        agent_argv: the agent's command line inside the sandbox.
        agent_cwd: the agent's working directory inside the sandbox.
        stale_sockets: the agent's sockets of an earlier boot, removed here.

    Raises:
        SandboxRuntimeError: ``state_dir`` lies inside a bound host path, or a bound path is
            not readable by the sandbox's root (root mode).
    """
    sd = state_dir
    binds = python_bind_paths([b for service in spec.services for b in service.binds])
    _check_binds(sd, binds, rootless)
    os.makedirs(sd, mode=0o700, exist_ok=True)
    os.chmod(sd, 0o700)
    if disk:
        data = os.path.join(sd, "disk")
        os.makedirs(data, mode=0o700, exist_ok=True)
    else:
        data = sd
        for sub in ("root", "upper", "work"):
            os.makedirs(os.path.join(sd, sub), mode=0o755, exist_ok=True)
        os.chmod(os.path.join(sd, "root"), 0o755)
    ids = None if rootless else root_id_range()
    e2b = os.path.join(sd, "e2b")
    os.makedirs(e2b, mode=0o700, exist_ok=True)
    # Root mode: the agent (the sandbox's root, not host root) may pass through, not write.
    os.chmod(e2b, 0o700 if ids is None else 0o711)
    for stale in stale_sockets:
        try:
            os.unlink(stale)
        except FileNotFoundError:
            pass
    info = {
        "sandbox_id": spec.sandbox_id,
        "hostname": spec.hostname,
        "egress": spec.egress,
        "allow_hosts": list(spec.allow_hosts),
        "env_vars": dict(spec.env_vars),
    }
    _write_private(os.path.join(e2b, "sandbox.json"), info, owner=ids)
    boot_id = str(uuid.uuid4())
    boot_id_file = os.path.join(sd, "boot_id")
    _write_file(boot_id_file, boot_id + "\n", 0o444)
    links, real_dirs = usr_merge_links()
    env = {
        "PATH": HOST_PATH,
        "LANG": "C.UTF-8",
        "HOME": "/root",
        "USER": "root",
        "LOGNAME": "root",
        "E2B_SANDBOX": "true",
        "E2B_SANDBOX_ID": spec.sandbox_id,
    }
    env.update(spec.env_vars)
    cfg: Dict[str, Any] = {
        "sandbox_id": spec.sandbox_id,
        "hostname": spec.hostname,
        "root": os.path.join(data, "root"),
        "upper": os.path.join(data, "upper"),
        "work": os.path.join(data, "work"),
        "e2b_dir": e2b,
        "overlays": list(OVERLAY_DIRS) + real_dirs,
        "symlinks": links,
        "ro_binds": binds,
        "volume_binds": [list(b) for b in spec.volume_binds],
        "without": list(spec.without),
        "agent_argv": list(agent_argv),
        "agent_env": env,
        "agent_cwd": agent_cwd,
        "services": [
            {"name": sv.name, "argv": list(sv.argv), "env": dict(env, **sv.env), "cwd": sv.cwd}
            for sv in spec.services
        ],
        "agent_socket": AGENT_SOCKET,
        "ports_socket": PORTS_SOCKET,
        "boot_id_file": boot_id_file,
        # what /etc/hostname and /etc/hosts were generated for (in the image, if any)
        "hostname_file": os.path.join(data, "hostname"),
        "rootless": rootless,
        "userns": None if ids is None else {"uid": ids[0], "gid": ids[1], "count": ROOTLESS_IDS},
        "disk": {"image": os.path.join(sd, "disk.img"), "mount": data} if disk else None,
    }
    path = os.path.join(sd, "boot.json")
    _write_private(path, cfg)
    return BootFiles(config_path=path, boot_id=boot_id)


def _write_file(path: str, text: str, mode: int, owner: Optional[Tuple[int, int]] = None) -> None:
    fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    if owner is not None:
        os.chown(path + ".new", *owner)
    os.chmod(path + ".new", mode)
    os.replace(path + ".new", path)


def _write_private(path: str, obj: object, owner: Optional[Tuple[int, int]] = None) -> None:
    """Write JSON readable by its owner only (host root, or ``owner``)."""
    _write_file(path, json.dumps(obj), 0o600, owner)
