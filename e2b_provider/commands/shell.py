"""Commands in a sandbox: exec with its kill job, and the leftover-command cleanup.

This module owns :class:`Commands`, the provider's part that runs shell commands through the
exec wrapper (the reference's guarantees: own session, in-sandbox ``timeout -s KILL``, pid
file under a control path; see :data:`~e2b_provider.protocol.scripts.LEAN_EXEC_WRAPPER`; every
process of the command also inherits the exec's marker in its environment, and envd knows the
command by a tag), the kill the exec engine
(:mod:`e2b_provider.core.run_engine`) asks for on a timeout, cancel or Ctrl-C (batched per sandbox
by
:mod:`e2b_provider.commands.kills`), and ``kill_all`` / ``kill_tagged``. Arguments arrive validated
(the provider facade checks them).
"""

from __future__ import annotations

import concurrent.futures
import io
import logging
import math
import threading
import time
from typing import BinaryIO, Callable, Dict, Iterable, List, Optional, Union

from ..cancel import CancelToken
from ..clients.envd import EnvdClient
from ..core.context import ProviderContext, script_failed
from ..core.reboot import Reboots
from ..core.run_engine import OnText, RunOutcome, run_process
from ..errors import E2BProviderError, InvalidArgument, NotFound
from ..models import ExecResult, Target
from ..protocol import scripts as scripts
from ..protocol.process_events import decode_output
from .background import STDIN_PIECE
from .kills import KillBatcher
from .users import exec_wrapper

__all__ = ["TIMEOUT_MARGIN_SECONDS", "Commands", "read_stdin_source"]

log = logging.getLogger("e2b_provider")

#: A long command pushes the sandbox lease to its timeout plus this margin.
TIMEOUT_MARGIN_SECONDS = 120


class Commands:
    """Run commands and stop leftover ones (arguments already validated).

    Args:
        ctx: the provider's shared state.
        reboots: reboots a sandbox whose command could not be stopped.
    """

    def __init__(self, ctx: ProviderContext, reboots: Reboots) -> None:
        self._ctx = ctx
        self._reboots = reboots
        self._kills = KillBatcher(ctx, reboots.rebooted_since)

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
        stdin: Optional[Callable[[], bytes]] = None,
        user: str = scripts.SANDBOX_USER,
    ) -> ExecResult:
        ctx = self._ctx
        bounds = ctx.bounds
        ctl = scripts.control_path(tag)
        run_env = scripts.exec_env(env, ctl)
        args = scripts.exec_args(ctl, command, timeout, env)
        args[3] = exec_wrapper(user)

        def run(target: Target) -> RunOutcome:
            began = time.monotonic()

            def start_kill(
                bound: float, running: Callable[[], Optional[int]]
            ) -> concurrent.futures.Future[Optional[bool]]:
                return self._kills.kill(target, ctl, began, bound, running, user=user)

            envd = ctx.envd(target)

            def started(pid: int) -> None:
                self._kills.answered(sid)
                if stdin is not None:
                    feeder = threading.Thread(
                        target=_feed_stdin, args=(envd, pid, stdin, stop_feeding, timeout + 60.0),
                        name="e2b-provider-stdin", daemon=True,
                    )
                    feeder.start()

            return run_process(
                envd,
                user=user,
                cmd="setsid",
                args=args,
                env=run_env,
                cwd=cwd if cwd is not None else "/workspace",
                max_output_bytes=max_output_bytes,
                timeout=timeout,
                cancel=cancel,
                watchdog=ctx.watchdog,
                start_kill=start_kill,
                tag=ctl,
                on_start=started,
                stdin=stdin is not None,
                kill_seconds=bounds.kill,
                grace_seconds=bounds.grace,
                interrupt_kill_seconds=bounds.interrupt_kill,
                keepalive_seconds=bounds.keepalive,
                on_wedged=lambda: self._reboots.reboot_once(sid, target, began),
                on_stdout=on_stdout,
                on_stderr=on_stderr,
            )

        stop_feeding = CancelToken()
        try:
            out = ctx.on_target(sid, cancel, run,
                                need=math.ceil(timeout) + TIMEOUT_MARGIN_SECONDS)
        finally:
            stop_feeding.cancel("the command ended")
        return ExecResult(
            exit_code=out.exit_code,
            stdout=decode_output(out.stdout, out.truncated),
            stderr=decode_output(out.stderr, out.truncated),
            truncated=out.truncated,
            timed_out=out.timed_out,
            cancelled=out.cancelled,
            wedged=out.wedged,
        )

    def _sweep(self, sid: str, args: List[str], what: str, cancel: Optional[CancelToken]) -> None:
        """Run a kill sweep as the sandbox user, then as root. The first reaches every
        process of the sandbox user's commands, also those found by their marker alone
        (root may not read another user's environment here: it has no capabilities); the
        second reaches root's commands. The scripts only kill, and only wrappers found by
        their command line and processes carrying an exec's marker: nothing the sandbox
        user names makes root write."""
        for user in (scripts.SANDBOX_USER, scripts.ROOT_USER):
            r = self._ctx.script_on(sid, args, cancel, user=user)
            if r.exit_code != 0:
                raise script_failed(what, r)

    def kill_all(self, sid: str, cancel: Optional[CancelToken]) -> None:
        self._sweep(sid, scripts.kill_all_args(), "cannot stop leftover commands", cancel)

    def kill_tagged(self, sid: str, tags: Iterable[str], cancel: Optional[CancelToken]) -> None:
        self._sweep(
            sid, scripts.kill_tagged_args(tags), "cannot stop crashed holders' commands", cancel
        )


def _feed_stdin(
    envd: EnvdClient, pid: int, read: Callable[[], bytes], stop: CancelToken, bound: float
) -> None:
    """Write what ``read()`` gives (until it gives nothing) to process ``pid``'s standard
    input, then close it; on a thread of its own (the command may read its input only after
    writing much output, which the caller's thread must read meanwhile). Ends quietly when
    the command ended first."""
    try:
        while not stop.cancelled:
            piece = read()
            if not piece:
                envd.close_stdin(pid, cancel=stop)
                return
            envd.send_input(pid, piece, cancel=stop, timeout=bound)
    except NotFound:
        pass  # the command ended before it read all of it
    except E2BProviderError as exc:
        if not stop.cancelled:
            log.info("e2b_provider: feeding the standard input of pid %d stopped: %s", pid, exc)
    except Exception as exc:  # the caller's file object failed: the command sees EOF
        log.warning("e2b_provider: reading the exec's stdin failed: %s", exc)
        try:
            envd.close_stdin(pid, cancel=stop)
        except E2BProviderError:
            pass


def read_stdin_source(source: Union[bytes, str, BinaryIO]) -> Callable[[], bytes]:
    """A reader of pieces of ``source`` (bytes, str as UTF-8, or a binary file object)."""
    if isinstance(source, str):
        source = source.encode("utf-8")
    if isinstance(source, (bytes, bytearray, memoryview)):
        buf = io.BytesIO(bytes(source))
        return lambda: buf.read(STDIN_PIECE)
    read = getattr(source, "read", None)
    if not callable(read):
        raise InvalidArgument("stdin must be bytes, str or a binary file object")

    def piece() -> bytes:
        data = read(STDIN_PIECE)
        if isinstance(data, str):
            raise InvalidArgument("stdin must be opened in binary mode")
        return bytes(data or b"")

    return piece

