"""PID 1 of an emulator sandbox: builds the sandbox's filesystem, then reaps and runs the agent.

PID 1 owns everything that happens inside a sandbox's fresh namespaces before the envd
agent serves: the sandbox's disk (an ext4 image on a loop device, when the boot config names
one), the root filesystem (a persistent per-sandbox root directory, overlayfs over the host's
``/usr``, ``/etc``, ``/var`` and ``/opt``, generated account files, the base template's
``sudo`` and ``python``, read-only binds of what the host Python needs, ``/proc`` with the
sandbox's own boot id, ``/sys``, a minimal ``/dev``, ``/run`` with ``/run/e2b``),
``pivot_root``, the hostname and loopback, the agent's listening sockets (``envd.sock`` for
envd traffic, ``ports.sock`` through which the host asks for connections to the sandbox's
ports), the sandbox's user namespace, the capability bounding set; and then the PID-1 job:
reap every orphan and keep the agent running until SIGTERM arrives from outside the sandbox.

Root mode (``"userns"`` in the boot config): PID 1 stays host root, the only process of the
sandbox that does; it builds everything above, then creates one user namespace mapping ids
0-65535 to an unprivileged host range, and starts the agent (and so every process of the
sandbox) in it as that namespace's root. Files PID 1 creates for the sandbox belong to the
mapped ids. Host files keep their owners, unmapped inside: the sandbox's root reads only what
the host lets everyone read, and cannot modify host files of the overlaid directories (it can
add new entries at their top level, and everything in its own directories).

Rootless mode (``"rootless": true`` in the boot config; PID 1 is then root of a user namespace
mapping the host user to root and its subuid/subgid range to ids 1-65535): the overlays use
``userxattr``, and bind remounts repeat the flags the kernel locked on inherited host mounts.
Host-owned files of the overlaid ``/usr``, ``/etc``, ``/var``, ``/opt`` stay read-only even for
the sandbox's root (their owner is not mapped); new top-level entries there and the sandbox's
own directories (``/workspace``, ``/home``, ``/root``, ``/tmp``, ``/opt/capybara``) are writable.

:mod:`.boot` starts it as ``unshare --pid --fork --mount … -- <python> -E -s -S -B
<path of this file> <config.json>``: run by path and with ``-S``, it must use the standard
library only (no ``attrs``, nothing from ``e2b_provider``). It does no networking besides
bringing ``lo`` up and listening on the agent's unix sockets; no requests/urllib3.

This file is the entry (:func:`main`: read the boot config, set up, serve). Its siblings, which
it imports by top-level name (``sys.path[0]`` is this folder when it runs by path; ``-E`` and
``-S`` keep everything but the standard library off ``sys.path``), hold the work, each with the
standard library only: :mod:`pid1_rootfs` (the root filesystem and the rest of the setup),
:mod:`pid1_syscalls` (mount, loop devices, the user namespace, sockets), :mod:`pid1_accounts`
(the generated ``/etc`` files, pure), :mod:`pid1_loop` (the agent and the reaping) and
:mod:`pid1_log` (the JSON log lines). The host imports the pure ones from the package
:mod:`e2b_provider.emulator.runtime.pid1`.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

# PID 1 runs by path: its siblings are top-level modules of sys.path[0] (this folder);
# type checkers and the host see them in the package (PID 1 never imports the package).
if TYPE_CHECKING:
    from .pid1_log import log
    from .pid1_loop import serve
    from .pid1_rootfs import setup
else:
    from pid1_log import log
    from pid1_loop import serve
    from pid1_rootfs import setup

__all__ = ["main"]


def _load(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise ValueError("boot configuration must be a JSON object")
    return cfg


def main(args: Optional[Sequence[str]] = None) -> int:
    """Entry point: ``init.py <boot config json>``; must run as PID 1 of fresh namespaces."""
    args = list(sys.argv[1:] if args is None else args)
    if len(args) != 1:
        log("usage: init.py <boot-config.json>", "error")
        return 2
    t0 = time.monotonic()
    try:
        if os.getpid() != 1:
            raise OSError("init must run as PID 1 of a new pid namespace")
        cfg = _load(args[0])
        boot = setup(cfg)
    except BaseException:  # the log is the only channel out
        log("setup failed:\n" + traceback.format_exc(), "error")
        return 1
    log(f"sandbox {cfg['sandbox_id']} set up in {1000 * (time.monotonic() - t0):.0f} ms")
    return serve(
        cfg["agent_argv"], cfg["agent_env"], cfg["agent_cwd"], boot, cfg.get("services") or ()
    )


if __name__ == "__main__":
    sys.exit(main())
