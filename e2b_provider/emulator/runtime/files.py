"""Copying a sandbox's files: what a fork or a snapshot of a sandbox starts from.

This module owns :func:`copy_sandbox_files`, the one place that knows which parts of a sandbox's
state directory (see :mod:`.boot`) are the sandbox's files: its disk image (``disk.img``, root
mode: it holds everything below, sparse copies stay sparse), else its persistent root directory
(``root/``) and the overlay upper directories (``upper/``: its changes to ``/usr``, ``/etc``,
``/var``, ``/opt``). The copy keeps owners, modes, timestamps, extended attributes and overlay
whiteouts (``cp -a``, reflinked where the filesystem can). The per-boot parts (``e2b/``, the
overlay work directories, ``boot.json``, ``init.log``) are not copied; neither are the
``/etc/hostname`` and ``/etc/hosts`` that the source's first boot generated for its own
hostname, so the copy's first boot writes its own (in an image, PID 1 replaces them: the image
records the hostname they were generated for). A running source must be frozen and its
pending writes flushed first (:meth:`.boot.SandboxRuntime.flush_files`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import List, Optional

from .errors import SandboxRuntimeError
from .linux import run_tool
from .namespaces import HOST_PATH, remove_tree
from .pid1.pid1_accounts import render_hosts

__all__ = ["copy_sandbox_files"]

_PARTS = ("root", "upper")
_IMAGE = "disk.img"


def _source_hostname(state_dir: str) -> Optional[str]:
    try:
        with open(os.path.join(state_dir, "boot.json"), encoding="utf-8") as f:
            name = json.load(f).get("hostname")
    except (OSError, ValueError):
        return None
    return name if isinstance(name, str) else None


def _drop_generated(src_state_dir: str, dst_state_dir: str) -> None:
    hostname = _source_hostname(src_state_dir)
    if hostname is None:
        return
    etc = os.path.join(dst_state_dir, "upper", "etc")
    for name, generated in (("hostname", hostname + "\n"), ("hosts", render_hosts(hostname))):
        path = os.path.join(etc, name)
        try:
            with open(path, encoding="utf-8") as f:
                unchanged = f.read() == generated
        except (OSError, UnicodeDecodeError):
            continue
        if unchanged:
            os.unlink(path)


def copy_sandbox_files(src_state_dir: str, dst_state_dir: str, *, timeout: float = 300.0) -> None:
    """Copy a sandbox's files into a new state directory (blocking; run it off the loop).

    ``src_state_dir`` is a sandbox's state directory (running frozen, halted, or a copy made
    by this function); ``dst_state_dir`` must not exist yet. A sandbox booted on
    ``dst_state_dir`` starts with the source's files (and none of its processes). Rootless,
    the copy runs in a user namespace with the sandboxes' id mapping, so files owned by
    sandbox users are copied with their owners.

    Raises:
        SandboxRuntimeError: the destination exists, or the copy failed (the partial copy is
            removed).
    """
    if os.path.lexists(dst_state_dir):
        raise SandboxRuntimeError(f"cannot copy sandbox files: {dst_state_dir} exists")
    cp = shutil.which("cp", path=HOST_PATH)
    if cp is None:
        raise SandboxRuntimeError("cannot copy sandbox files: cp is missing")
    os.makedirs(dst_state_dir, mode=0o700)
    image = os.path.join(src_state_dir, _IMAGE)
    parts = (_IMAGE,) if os.path.isfile(image) else _PARTS
    sources = [os.path.join(src_state_dir, p) for p in parts]
    present = [s for s in sources if os.path.isdir(s) or os.path.isfile(s)]
    argv: List[str] = [cp, "-a", "--reflink=auto", "--", *present]
    argv.append(dst_state_dir)
    if os.geteuid() != 0:
        unshare = shutil.which("unshare", path=HOST_PATH)
        if unshare is None:
            raise SandboxRuntimeError("cannot copy sandbox files: unshare is missing")
        argv = [unshare, "--user", "--map-root-user", "--map-auto", "--", *argv]
    try:
        code, err = run_tool(argv, timeout=timeout)
        if code != 0:
            raise SandboxRuntimeError(f"cannot copy sandbox files: {err or code}")
        _drop_generated(src_state_dir, dst_state_dir)
    except BaseException as exc:
        try:
            remove_tree(dst_state_dir)
        except SandboxRuntimeError:
            pass
        if isinstance(exc, (OSError, subprocess.TimeoutExpired)):
            raise SandboxRuntimeError(f"cannot copy sandbox files: {exc}") from exc
        raise
