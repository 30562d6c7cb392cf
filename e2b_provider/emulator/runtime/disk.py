"""Sandbox disks of the emulator runtime: one size-limited ext4 image per sandbox (root mode).

This module owns the host side of each sandbox's disk: whether this host can give sandboxes
one (:func:`disk_support`: root, ``mkfs.ext4``, loop devices, ext4), creating the sparse image
once, at the sandbox's first boot (:func:`create_image`), and waiting until the image of a
halted sandbox is no longer attached to a loop device (:func:`wait_released`). The
sandbox's PID 1 (:mod:`.pid1.init`) attaches and mounts the image in the sandbox's own mount
namespace, on a loop device that detaches itself when that namespace dies with the sandbox's
last process, so the host's mount table never holds it and nothing is left behind however the
sandbox ends.
The image holds the sandbox's root directory and its overlay upper layers; when it is full,
writes fail with ENOSPC inside (and envd's ``POST /files`` answers 507).
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import subprocess
import time
from typing import Dict, Optional

from .errors import SandboxRuntimeError
from .linux import HOST_PATH, run_tool

__all__ = ["create_image", "disk_support", "image_attached", "wait_released"]

_support: Dict[str, Optional[str]] = {}


def disk_support() -> Optional[str]:
    """Return why sandboxes cannot get a disk image here, or None when they can.

    Needs root, ``mkfs.ext4`` (Debian package e2fsprogs), ``/dev/loop-control`` and ext4 in
    the kernel. The answer is cached for the process.
    """
    if "answer" in _support:
        return _support["answer"]
    reason: Optional[str] = None
    if os.geteuid() != 0:
        reason = "not root (loop devices need root)"
    elif shutil.which("mkfs.ext4", path=HOST_PATH) is None:
        reason = "mkfs.ext4 is missing (Debian package e2fsprogs)"
    elif not os.path.exists("/dev/loop-control"):
        reason = "no /dev/loop-control (loop devices unavailable)"
    else:
        try:
            with open("/proc/filesystems", encoding="ascii") as f:
                if "ext4" not in f.read().split():
                    reason = "the kernel has no ext4"
        except OSError as exc:
            reason = f"cannot read /proc/filesystems: {exc}"
    _support["answer"] = reason
    return reason


def create_image(path: str, size_mb: int) -> None:
    """Create a sparse ext4 image of ``size_mb`` MiB at ``path`` (blocking, bounded to 60 s).

    No journal (a sandbox's disk need not survive a host crash), no reserved blocks, inode
    tables initialised lazily: a few hundred KiB are written whatever the size.

    Raises:
        SandboxRuntimeError: mkfs failed (no image is left behind).
    """
    mkfs = shutil.which("mkfs.ext4", path=HOST_PATH)
    if mkfs is None:
        raise SandboxRuntimeError("mkfs.ext4 is missing (Debian package e2fsprogs)")
    tmp = path + ".new"
    try:
        with open(tmp, "wb") as f:
            f.truncate(size_mb * 1024 * 1024)
        os.chmod(tmp, 0o600)
        code, err = run_tool(
            [mkfs, "-q", "-F", "-m", "0", "-O", "^has_journal", "-L", "e2b-sandbox",
             "-E", "root_owner=0:0,lazy_itable_init=1,nodiscard", tmp],
            timeout=60,
        )  # fmt: skip
        if code != 0:
            raise SandboxRuntimeError(f"mkfs.ext4 of {path} failed: {err or code}")
        os.replace(tmp, path)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxRuntimeError(f"cannot create the disk image {path}: {exc}") from exc
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def image_attached(path: str) -> bool:
    """True while some loop device is backed by the image at ``path``."""
    wanted = os.path.realpath(path)
    for backing in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            with open(backing, encoding="utf-8", errors="surrogateescape") as f:
                name = f.read().rstrip("\n")
        except OSError:
            continue
        if name == wanted:
            return True
    return False


async def wait_released(path: str, limit: float = 10.0) -> None:
    """Wait (bounded) until no loop device holds the image: never mount an image twice.

    After a halt the kernel detaches the old loop device on its own, shortly after the
    sandbox's mount namespace is gone.

    Raises:
        SandboxRuntimeError: the image is still attached after ``limit`` seconds.
    """
    deadline = time.monotonic() + limit
    delay = 0.002
    while image_attached(path):
        if time.monotonic() >= deadline:
            raise SandboxRuntimeError(
                f"the disk image {path} is still attached to a loop device "
                f"{limit:.0f} s after its sandbox stopped"
            )
        await asyncio.sleep(delay)
        delay = min(0.05, delay * 2)
