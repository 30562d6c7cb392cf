"""Commands in a sandbox: exec with its kill job, and the leftover-command cleanup.

This module owns :class:`Commands`, the provider's part that runs shell commands through the
reference's exec wrapper (own session, in-sandbox ``timeout -s KILL``, pid file under a
control path), the kill job the exec engine (:mod:`._exec`) runs on a timeout, cancel or
Ctrl-C (the kill script in a second process, then SIGKILL of the pid), and ``kill_all`` /
``kill_tagged``. Arguments arrive validated (the provider facade checks them).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Dict, Iterable, List, Optional

from . import _scripts as scripts
from ._context import ProviderContext, script_failed
from ._exec import OnText, RunOutcome, run_process
from ._lifecycle import Lifecycle, fire
from ._process import decode_output
from .cancel import CancelToken, Deadline
from .errors import E2BProviderError
from .models import ExecResult, Target

__all__ = ["TIMEOUT_MARGIN_SECONDS", "Commands"]

log = logging.getLogger("e2b_provider")

#: A long command pushes the sandbox lease to its timeout plus this margin.
TIMEOUT_MARGIN_SECONDS = 120
#: The kill script's own timeout (the whole kill job is bounded by ``Bounds.kill``).
KILL_SCRIPT_TIMEOUT = 15.0


class Commands:
    """Run commands and stop leftover ones (arguments already validated)."""

    def __init__(self, ctx: ProviderContext, lifecycle: Lifecycle) -> None:
        self._ctx = ctx
        self._lifecycle = lifecycle

    def exec(
        self,
        sid: str,
        command: str,
        *,
        timeout: float,
        max_output_bytes: int,
        cwd: Optional[str],
        env: Dict[str, str],
        tag: Optional[str],
        cancel: Optional[CancelToken],
        on_stdout: Optional[OnText] = None,
        on_stderr: Optional[OnText] = None,
    ) -> ExecResult:
        ctx = self._ctx
        bounds = ctx.bounds
        ctl = scripts.control_path(tag)

        def run(target: Target) -> RunOutcome:
            began = time.monotonic()

            def killer(pid: Optional[int], bound: float) -> bool:
                return self._kill(target, ctl, pid, bound)

            return run_process(
                ctx.envd(target),
                user=scripts.SANDBOX_USER,
                cmd="setsid",
                args=scripts.exec_args(ctl, command, timeout),
                env=env,
                cwd=cwd if cwd is not None else "/workspace",
                max_output_bytes=max_output_bytes,
                timeout=timeout,
                token=cancel,
                watchdog=ctx.watchdog,
                killer=killer,
                kill_seconds=bounds.kill,
                grace_seconds=bounds.grace,
                interrupt_kill_seconds=bounds.interrupt_kill,
                keepalive_seconds=bounds.keepalive,
                on_wedged=lambda: self._lifecycle.reboot_once(sid, target, began),
                on_stdout=on_stdout,
                on_stderr=on_stderr,
            )

        out = ctx.on_target(sid, cancel, run, need=math.ceil(timeout) + TIMEOUT_MARGIN_SECONDS)
        return ExecResult(
            exit_code=out.exit_code,
            stdout=decode_output(out.stdout, out.truncated),
            stderr=decode_output(out.stderr, out.truncated),
            truncated=out.truncated,
            timed_out=out.timed_out,
            cancelled=out.cancelled,
            wedged=out.wedged,
        )

    def _kill(self, target: Target, ctl: str, pid: Optional[int], bound: float) -> bool:
        """The kill job: the kill script in a second process, then SIGKILL the pid via envd."""
        ctx = self._ctx
        deadline = Deadline.after(bound)
        guard = CancelToken()
        timer = ctx.watchdog.call_later(bound, lambda: fire(guard, "kill bound"))
        try:
            envd = ctx.envd(target)
            try:
                r = run_process(
                    envd,
                    user=scripts.SANDBOX_USER,
                    cmd="/bin/sh",
                    args=scripts.kill_args(ctl),
                    cwd="/",
                    max_output_bytes=4096,
                    timeout=min(KILL_SCRIPT_TIMEOUT, bound * 0.75),
                    token=guard,
                    watchdog=ctx.watchdog,
                    keepalive_seconds=ctx.bounds.keepalive,
                )
                ok = r.exit_code == 0
            except E2BProviderError as exc:
                log.warning(
                    "e2b_provider: kill script failed for sandbox %s: %s", target.sandbox_id, exc
                )
                ok = False
            if pid is not None and not guard.cancelled:
                try:
                    envd.send_signal(pid, token=guard, timeout=max(0.5, deadline.remaining()))
                except E2BProviderError as exc:
                    log.info("e2b_provider: SIGKILL of pid %s failed: %s", pid, exc)
            return ok and not guard.cancelled
        finally:
            timer.cancel()

    def _sweep(self, sid: str, args: List[str], what: str, cancel: Optional[CancelToken]) -> None:
        r = self._ctx.script_on(sid, args, cancel)
        if r.exit_code != 0:
            raise script_failed(what, r)

    def kill_all(self, sid: str, cancel: Optional[CancelToken]) -> None:
        self._sweep(sid, scripts.kill_all_args(), "cannot stop leftover commands", cancel)

    def kill_tagged(self, sid: str, tags: Iterable[str], cancel: Optional[CancelToken]) -> None:
        self._sweep(
            sid, scripts.kill_tagged_args(tags), "cannot stop crashed holders' commands", cancel
        )
