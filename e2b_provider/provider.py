"""The sandbox provider: E2B sandboxes by name, for blocking code.

This module owns :class:`E2BSandboxProvider`, the Python port of the reference plugin's
``createE2BSandbox``: lifecycle by name (create, resume, suspend, destroy, destroy_by_name),
leftover-command cleanup (kill_all, kill_tagged), ``exec`` with output budget, timeout,
cancellation, Ctrl-C safety and the kill → grace → reboot escalation, and file operations
(read_file, write_file, stat). It composes the control-plane client, the envd client, the
exec engine and the shared watchdog; it speaks no HTTP itself.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterable, List, Literal, Mapping, Optional, TypeVar, Union

from . import _scripts as scripts
from . import _validate as v
from ._exec import RunOutcome, run_process
from ._http import Transport
from ._process import decode_output
from ._reboot import (
    Answer,
    Connect,
    ConnectPlain,
    Finish,
    HealthCheck,
    Healthy,
    Pause,
    RebootPlan,
    Wait,
    Waited,
)
from ._watchdog import Watchdog
from .cancel import CancelReason, CancelToken, Deadline
from .config import DeploymentConfig
from .control import ControlPlane
from .envd import EnvdClient
from .errors import (
    Cancelled,
    CommandFailed,
    Conflict,
    E2BHttpError,
    E2BProviderError,
    InvalidArgument,
    NotFound,
    OperationTimeout,
    SandboxGoneError,
    register_secret,
)
from .models import (
    ExecResult,
    FileContent,
    FileStat,
    SandboxHandle,
    SandboxLimits,
    SandboxRef,
    Target,
)

__all__ = ["E2BSandboxProvider"]

log = logging.getLogger("e2b_provider")

MAX_TIMEOUT_SECONDS = 86400
#: A long command pushes the sandbox lease to its timeout plus this margin.
TIMEOUT_MARGIN_SECONDS = 120
#: Room kept for a script's standard error.
STDERR_ROOM = 64 * 1024
#: Default exec timeout (seconds) and output budget (bytes).
DEFAULT_EXEC_TIMEOUT = 60.0
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
DEFAULT_MAX_READ_BYTES = 1 << 20
#: File operations (read/write/stat scripts) are bounded by this (reference: 120 s).
FILE_OP_TIMEOUT = 120.0
#: The kill job: the kill script's own timeout, and the bound on the whole job.
KILL_SCRIPT_TIMEOUT = 15.0
KILL_BOUND = 20.0
#: After a successful kill, how long the stream may take to end.
KILL_GRACE = 3.0
#: Ctrl-C: how long we try to kill the remote command before re-raising.
INTERRUPT_KILL_BOUND = 10.0
#: Reboot of a wedged sandbox: the whole sequence is bounded by this.
REBOOT_BOUND = 120.0

ResumeOutcome = Literal["resumed", "gone"]
_T = TypeVar("_T")
_STAT_LINE = re.compile(r"([0-9]+) (file|directory)\n?")


def _fire(token: CancelToken, why: str) -> None:
    token.cancel(CancelReason("deadline", why))


def _sandbox_id(ref: SandboxRef) -> str:
    sid = ref.id if isinstance(ref, SandboxHandle) else ref
    if not isinstance(sid, str):
        raise InvalidArgument(
            f"expected a SandboxHandle or a sandbox id string, got {type(ref).__name__}"
        )
    v.check_sandbox_id(sid)
    return sid


class E2BSandboxProvider:
    """Run commands and move files in E2B sandboxes, from blocking code.

    Thread-safe: one provider serves any number of threads, and several commands may run on
    one sandbox at once (:attr:`concurrent_exec`). Use it as a context manager, or call
    :meth:`close`.

    Every method takes ``cancel=`` (a :class:`~e2b_provider.CancelToken`; ``token.cancel()``
    works from any thread). A cancelled ``exec`` returns ``ExecResult(cancelled=True,
    exit_code=None)``; every other cancelled call raises :class:`~e2b_provider.Cancelled`.
    Times are float seconds.

    Args:
        config: the deployment (API key, template, URLs, sandbox lifetime, egress policy).
        pool_connections: HTTP connection pools kept (one per host; default 32).
        pool_maxsize: connections kept per host (default 256: one per concurrent stream).
        watchdog: the timer thread and worker pool; default the process-wide one.
        kill_bound: seconds the kill job may take before the sandbox counts as wedged
            (default 20).
        kill_grace: seconds the stream may take to end after a successful kill (default 3).
        interrupt_kill_bound: seconds spent killing the remote command after Ctrl-C before
            the KeyboardInterrupt is re-raised (default 10).
        reboot_bound: seconds the reboot of a wedged sandbox may take (default 120).
        keepalive_seconds: envd keepalive interval (default 50); a stream silent for twice
            that plus 10 s is treated as dead.
    """

    #: Several ``exec`` calls may run on one sandbox at the same time.
    concurrent_exec = True

    def __init__(
        self,
        config: DeploymentConfig,
        *,
        pool_connections: int = 32,
        pool_maxsize: int = 256,
        watchdog: Optional[Watchdog] = None,
        kill_bound: float = KILL_BOUND,
        kill_grace: float = KILL_GRACE,
        interrupt_kill_bound: float = INTERRUPT_KILL_BOUND,
        reboot_bound: float = REBOOT_BOUND,
        keepalive_seconds: int = 50,
    ) -> None:
        if not isinstance(config, DeploymentConfig):
            raise InvalidArgument("config must be a DeploymentConfig")
        for name, value in (
            ("kill_bound", kill_bound),
            ("kill_grace", kill_grace),
            ("interrupt_kill_bound", interrupt_kill_bound),
            ("reboot_bound", reboot_bound),
        ):
            v.check_timeout(value, name=name)
        if not isinstance(keepalive_seconds, int) or not 1 <= keepalive_seconds <= 3600:
            raise InvalidArgument("keepalive_seconds must be an int from 1 to 3600")
        self._config = config
        register_secret(config.api_key)
        self._pool_sizes = (pool_connections, pool_maxsize)
        self._own_watchdog = watchdog
        self._pid = -1
        self._start_clients()
        self._kill_bound = float(kill_bound)
        self._kill_grace = float(kill_grace)
        self._interrupt_kill_bound = float(interrupt_kill_bound)
        self._reboot_bound = float(reboot_bound)
        self._keepalive = keepalive_seconds
        self._closed = False
        self._close_lock = threading.Lock()
        # One reboot per sandbox at a time; execs wedged before a reboot finished share it.
        self._reboot_locks: Dict[str, threading.Lock] = {}
        self._rebooted_at: Dict[str, float] = {}

    def _start_clients(self) -> None:
        """(Re)create the HTTP pools and pick the watchdog, for this process."""
        cfg = self._config
        self._transport = Transport(
            pool_connections=self._pool_sizes[0], pool_maxsize=self._pool_sizes[1]
        )
        self._control = ControlPlane(
            self._transport,
            api_url=cfg.effective_api_url,
            api_key=cfg.api_key,
            domain=cfg.domain,
            sandbox_url=cfg.sandbox_url,
        )
        wd = self._own_watchdog
        self._watchdog = wd if wd is not None and not wd.closed else Watchdog.default()
        self._pid = os.getpid()

    # -- housekeeping -------------------------------------------------------------------

    @property
    def config(self) -> DeploymentConfig:
        """The deployment configuration (its repr hides the API key)."""
        return self._config

    def close(self) -> None:
        """Release HTTP connections. Idempotent. Sandboxes are left as they are."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._transport.close()

    def __enter__(self) -> E2BSandboxProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        cfg = self._config
        return f"E2BSandboxProvider(template={cfg.template!r}, api_url={cfg.effective_api_url!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise E2BProviderError("the provider is closed")
        if self._pid != os.getpid():
            # Forked (multiprocessing, gunicorn, …): the parent's watchdog thread and pooled
            # sockets do not exist here. Start afresh; the parent's sockets are left alone.
            with self._close_lock:
                if self._pid != os.getpid():
                    self._reboot_locks = {}
                    self._rebooted_at = {}
                    self._start_clients()

    # -- lifecycle ----------------------------------------------------------------------

    def create(
        self,
        name: str,
        limits: Optional[SandboxLimits] = None,
        *,
        cancel: Optional[CancelToken] = None,
    ) -> SandboxHandle:
        """Create a sandbox named ``name``, destroying older sandboxes of that name first.

        Args:
            name: 1-101 characters of ``[A-Za-z0-9_.-]``, starting with a letter or digit.
            limits: resources and egress (default ``SandboxLimits()``: egress ``"none"``).
            cancel: cancels the call.

        Returns:
            The new sandbox's handle.

        Raises:
            InvalidArgument: bad name or limits, or egress ``"open"`` without
                ``allow_open_egress`` (raised before any I/O).
            SandboxGoneError: E2B returned no envd access token (the sandbox is deleted again).
            E2BHttpError, TransportError: the API failed.
            Cancelled: ``cancel`` fired.
        """
        self._check_open()
        if limits is None:
            limits = SandboxLimits()
        v.check_name(name)
        v.check_limits(limits)
        if cancel is not None:
            cancel.raise_if_cancelled()
        if limits.egress == "open" and not self._config.allow_open_egress:
            raise InvalidArgument(
                'sandbox egress "open" is refused: this deployment has allow_open_egress=False. '
                "Set DeploymentConfig(allow_open_egress=True) (allowOpenEgress in a config "
                'mapping; trusted environments only), or use egress "allowlist" or "none".'
            )
        egress = limits.egress
        if egress == "allowlist" and not self._config.domain_allowlist:
            log.warning(
                "e2b_provider: domain allowlists are disabled for this deployment "
                "(domain_allowlist is False); egress allowlist degraded to none for sandbox %r",
                name,
            )
            egress = "none"
        self.destroy_by_name(name, cancel=cancel)
        body: Dict[str, Any] = {
            "templateID": self._config.template,
            "metadata": {scripts.METADATA_NAME: name},
            "timeout": self._config.timeout_seconds,
            # On timeout E2B pauses the sandbox instead of deleting it: files survive.
            "autoPause": True,
        }
        if egress == "allowlist" and limits.allow_hosts:
            body["network"] = {"allowOut": list(limits.allow_hosts), "denyOut": ["0.0.0.0/0"]}
        else:
            body["allow_internet_access"] = egress == "open"
        info = self._control.create(body, token=cancel, idempotency_key=str(uuid.uuid4()))
        try:
            self._control.target_for(info)
        except SandboxGoneError:
            # Fail closed: never keep (or leak) a sandbox we will not talk to.
            try:
                self._control.delete(info.sandbox_id, token=None)
            except E2BProviderError as exc:
                log.warning(
                    "e2b_provider: could not delete tokenless sandbox %s: %s", info.sandbox_id, exc
                )
            raise
        return SandboxHandle(info.sandbox_id, name)

    def _attach(self, sid: str, cancel: Optional[CancelToken], min_seconds: int = 0) -> Target:
        if cancel is not None:
            cancel.raise_if_cancelled()
        lease = min(MAX_TIMEOUT_SECONDS, max(self._config.timeout_seconds, min_seconds))
        info = self._control.attach(sid, timeout_seconds=lease, token=cancel)
        target = self._control.target_for(info)
        register_secret(target.access_token)
        return target

    def _on_target(
        self,
        sid: str,
        cancel: Optional[CancelToken],
        fn: Callable[[Target], _T],
        min_seconds: int = 0,
    ) -> _T:
        """Attach, then ``fn(target)``; once more if the sandbox was paused in between.

        E2B's edge answers 502 "The sandbox was not found" for a sandbox paused (by a
        ``suspend`` elsewhere, say) after our connect: nothing reached envd, so nothing ran,
        and attaching again (which resumes it) and retrying is safe.
        """
        target = self._attach(sid, cancel, min_seconds)
        try:
            return fn(target)
        except E2BHttpError as exc:
            if not (exc.status == 502 and "not found" in exc.message.lower()):
                raise
        log.info("e2b_provider: sandbox %s was paused under us; resuming it and retrying", sid)
        return fn(self._attach(sid, cancel, min_seconds))

    def _envd(self, target: Target) -> EnvdClient:
        return EnvdClient(self._transport, target)

    def resume(self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None) -> ResumeOutcome:
        """Make sure the sandbox runs (resuming it if paused) and extend its lease.

        Returns:
            ``"resumed"``, or ``"gone"`` when the sandbox no longer exists (create a new one).

        Raises:
            E2BHttpError, TransportError: the API failed (including a 409 that did not clear).
            Cancelled: ``cancel`` fired.
        """
        self._check_open()
        sid = _sandbox_id(sandbox)
        try:
            self._attach(sid, cancel)
        except SandboxGoneError:
            return "gone"
        return "resumed"

    def suspend(self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None) -> None:
        """Pause the sandbox (memory kept). Already paused or gone is fine.

        Raises:
            E2BHttpError, TransportError: the API failed (a 503 "busy" is retried first).
            Cancelled: ``cancel`` fired.
        """
        self._check_open()
        sid = _sandbox_id(sandbox)
        if cancel is not None:
            cancel.raise_if_cancelled()
        try:
            self._control.pause(sid, token=cancel)
        except NotFound:
            pass
        except Conflict:
            pass

    def destroy(self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None) -> None:
        """Delete the sandbox and everything in it. Already gone is fine.

        Raises:
            E2BHttpError, TransportError: the API failed.
            Cancelled: ``cancel`` fired.
        """
        self._check_open()
        sid = _sandbox_id(sandbox)
        if cancel is not None:
            cancel.raise_if_cancelled()
        self._control.delete(sid, token=cancel)

    def destroy_by_name(self, name: str, *, cancel: Optional[CancelToken] = None) -> int:
        """Delete every running or paused sandbox created under ``name`` (all pages).

        Returns:
            How many sandboxes were deleted.

        Raises:
            InvalidArgument: bad name.
            E2BHttpError, TransportError: the API failed.
            Cancelled: ``cancel`` fired.
        """
        self._check_open()
        v.check_name(name)
        if cancel is not None:
            cancel.raise_if_cancelled()
        listed = self._control.list(metadata={scripts.METADATA_NAME: name}, token=cancel)
        ids = [s.sandbox_id for s in listed if s.metadata.get(scripts.METADATA_NAME) == name]
        for sid in ids:
            self._control.delete(sid, token=cancel)
        return len(ids)

    # -- leftover commands ----------------------------------------------------------------

    def kill_all(self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None) -> None:
        """Kill every command this library started in the sandbox, with its process tree.

        Raises:
            CommandFailed: the kill script failed.
            OperationTimeout: the kill script took longer than 120 s.
            SandboxGoneError: the sandbox no longer exists.
            Cancelled: ``cancel`` fired.
        """
        self._check_open()
        sid = _sandbox_id(sandbox)
        r = self._script(sid, scripts.kill_all_args(), cancel)
        if r.exit_code != 0:
            raise CommandFailed(
                "cannot stop leftover commands", exit_code=r.exit_code, stderr=self._stderr(r)
            )

    def kill_tagged(
        self, sandbox: SandboxRef, tags: Iterable[str], *, cancel: Optional[CancelToken] = None
    ) -> None:
        """Kill the commands started with any of ``tags`` (e.g. of holders that crashed).

        Raises:
            InvalidArgument: a bad tag (before any I/O).
            CommandFailed: the kill script failed.
            OperationTimeout: the kill script took longer than 120 s.
            SandboxGoneError: the sandbox no longer exists.
            Cancelled: ``cancel`` fired.
        """
        self._check_open()
        sid = _sandbox_id(sandbox)
        if isinstance(tags, str):
            raise InvalidArgument("tags must be a sequence of tags, not a string")
        tag_list = list(tags)
        for t in tag_list:
            v.check_tag(t)
        if cancel is not None:
            cancel.raise_if_cancelled()
        if not tag_list:
            return
        r = self._script(sid, scripts.kill_tagged_args(tag_list), cancel)
        if r.exit_code != 0:
            raise CommandFailed(
                "cannot stop crashed holders' commands",
                exit_code=r.exit_code,
                stderr=self._stderr(r),
            )

    # -- exec -------------------------------------------------------------------------------

    def exec(
        self,
        sandbox: SandboxRef,
        command: str,
        *,
        timeout: float = DEFAULT_EXEC_TIMEOUT,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        tag: Optional[str] = None,
        cancel: Optional[CancelToken] = None,
    ) -> ExecResult:
        """Run a shell command (``/bin/bash -c``) in the sandbox as user ``sandbox``.

        The command runs in its own session under ``timeout -s KILL``, with
        ``HOME=/workspace`` and ``LANG=C.UTF-8`` (``env`` adds or overrides variables).
        On timeout or cancel the whole process tree is killed; if that fails, or the stream
        does not end within the grace period, the sandbox is rebooted (files kept) and the
        result says ``wedged=True``.

        Args:
            sandbox: the handle or sandbox id.
            command: the shell command.
            timeout: seconds before the command is killed (default 60; at most 86400).
            max_output_bytes: budget shared by stdout and stderr (default 1 MiB). Output past
                it is read and dropped; ``truncated`` is then True.
            cwd: working directory (default ``/workspace``).
            env: extra environment variables (names ``[A-Za-z_][A-Za-z0-9_]*``).
            tag: a holder tag (``[A-Za-z0-9_-]{1,64}``) so :meth:`kill_tagged` can find it.
            cancel: stops the command from any thread; the result then has ``cancelled=True``.

        Returns:
            The :class:`~e2b_provider.ExecResult`. A non-zero exit is a result, not an error.

        Raises:
            InvalidArgument: bad arguments (before any I/O).
            Cancelled: ``cancel`` fired before the command was started.
            SandboxGoneError: the sandbox no longer exists.
            E2BHttpError, TransportError, ProtocolError, RemoteError: the run failed while
                neither timed out nor cancelled.
            KeyboardInterrupt: re-raised after the remote command was killed (bounded).
        """
        self._check_open()
        sid = _sandbox_id(sandbox)
        if not isinstance(command, str):
            raise InvalidArgument("command must be a string")
        if "\x00" in command:
            raise InvalidArgument("command contains a NUL character")
        v.check_timeout(timeout)
        v.check_max_bytes(max_output_bytes, "max_output_bytes")
        if cwd is not None:
            v.check_path(cwd)
        run_env = {"HOME": "/workspace", "LANG": "C.UTF-8"}
        if env is not None:
            run_env.update(v.check_env(env))
        ctl = scripts.control_path(tag)
        if cancel is not None:
            cancel.raise_if_cancelled()

        def run(target: Target) -> RunOutcome:
            began = time.monotonic()

            def killer(pid: Optional[int], bound: float) -> bool:
                return self._kill(target, ctl, pid, bound)

            return run_process(
                self._envd(target),
                user=scripts.SANDBOX_USER,
                cmd="setsid",
                args=scripts.exec_args(ctl, command, timeout),
                env=run_env,
                cwd=cwd if cwd is not None else "/workspace",
                max_output_bytes=max_output_bytes,
                timeout=timeout,
                token=cancel,
                watchdog=self._watchdog,
                killer=killer,
                kill_seconds=self._kill_bound,
                grace_seconds=self._kill_grace,
                interrupt_kill_seconds=self._interrupt_kill_bound,
                keepalive_seconds=self._keepalive,
                on_wedged=lambda: self._reboot_once(sid, target, began),
            )

        out = self._on_target(sid, cancel, run, math.ceil(timeout) + TIMEOUT_MARGIN_SECONDS)
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
        deadline = Deadline.after(bound)
        guard = CancelToken()
        timer = self._watchdog.call_later(bound, lambda: _fire(guard, "kill bound"))
        try:
            envd = self._envd(target)
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
                    watchdog=self._watchdog,
                    keepalive_seconds=self._keepalive,
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

    def _reboot_once(self, sid: str, target: Target, began: float) -> None:
        """Reboot ``sid`` unless a reboot that started after ``began`` already finished.

        ``began`` is when the stuck command was started: a reboot that started later killed
        it. So many commands on one stuck sandbox that time out together share one reboot
        instead of pausing and cold-booting the same sandbox over each other.
        """
        with self._close_lock:
            lock = self._reboot_locks.setdefault(sid, threading.Lock())
        if not lock.acquire(timeout=self._reboot_bound):
            log.warning("e2b_provider: another reboot of sandbox %s did not finish in time", sid)
            return
        try:
            if self._rebooted_at.get(sid, -math.inf) >= began:
                log.info("e2b_provider: sandbox %s was just rebooted for another command", sid)
                return
            started = time.monotonic()
            self._reboot(sid, target)
            self._rebooted_at[sid] = started
        finally:
            lock.release()

    def _reboot(self, sid: str, target: Target) -> None:
        """Reboot a wedged sandbox (v2 API sequence); failures are logged, never raised."""
        log.warning("e2b_provider: could not stop a command cleanly; rebooting sandbox %s", sid)
        deadline = Deadline.after(self._reboot_bound)
        guard = CancelToken()
        timer = self._watchdog.call_later(self._reboot_bound, lambda: _fire(guard, "reboot bound"))
        plan = RebootPlan(min(MAX_TIMEOUT_SECONDS, self._config.timeout_seconds))
        try:
            step = plan.first()
            while not isinstance(step, Finish):
                if deadline.expired():
                    raise OperationTimeout("sandbox reboot ran out of time")
                outcome: object
                if isinstance(step, Pause):
                    outcome = self._answer(
                        self._control.pause, sid, memory=step.memory, token=guard, retry=False
                    )
                elif isinstance(step, HealthCheck):
                    health = self._envd(target).health(timeout=min(5.0, deadline.remaining()))
                    outcome = Healthy(health)
                elif isinstance(step, Wait):
                    if guard.wait(min(step.seconds, deadline.remaining())):
                        raise OperationTimeout("sandbox reboot ran out of time")
                    outcome = Waited()
                elif isinstance(step, Connect):
                    outcome = self._answer(
                        self._control.connect,
                        sid,
                        timeout_seconds=step.timeout_seconds,
                        memory=False,
                        token=guard,
                    )
                elif isinstance(step, ConnectPlain):
                    outcome = self._answer(
                        self._control.connect,
                        sid,
                        timeout_seconds=step.timeout_seconds,
                        token=guard,
                    )
                else:  # pragma: no cover - a step kind this loop does not know
                    raise E2BProviderError(f"unknown reboot step {step!r}")
                step = plan.next(step, outcome)
            if step.rebooted:
                log.warning("e2b_provider: sandbox %s rebooted", sid)
            else:
                log.warning(
                    "e2b_provider: sandbox %s was not rebooted (%s): %s; the stuck command may "
                    "still be running",
                    sid,
                    step.outcome,
                    step.message,
                )
        except (E2BProviderError, Cancelled) as exc:
            log.warning(
                "e2b_provider: sandbox reboot failed for %s; the stuck command may still be "
                "running: %s",
                sid,
                str(exc)[:500],
            )
        finally:
            timer.cancel()

    @staticmethod
    def _answer(call: Callable[..., object], *args: Any, **kwargs: Any) -> Answer:
        """Run one control-plane call of the reboot plan and turn it into an Answer."""
        try:
            result = call(*args, **kwargs)
        except E2BHttpError as exc:
            return Answer(exc.status, exc.error_code, getattr(exc, "retry_after", None))
        status = (
            result
            if isinstance(result, int)
            else (201 if getattr(result, "resumed", False) else 200)
        )
        if not isinstance(result, int):
            status = getattr(result, "raw_status", status)
        return Answer(int(status))

    # -- files ----------------------------------------------------------------------------

    def _script(
        self,
        sid: str,
        args: List[str],
        cancel: Optional[CancelToken],
        *,
        max_output_bytes: int = STDERR_ROOM,
    ) -> RunOutcome:
        """Run one of the reference's scripts as ``sandbox`` (attach, retry once if paused)."""
        return self._on_target(
            sid,
            cancel,
            lambda t: self._file_op(t, scripts.SANDBOX_USER, args, max_output_bytes, cancel),
        )

    def _file_op(
        self,
        target: Target,
        user: str,
        args: List[str],
        max_output_bytes: int,
        cancel: Optional[CancelToken],
    ) -> RunOutcome:
        r = run_process(
            self._envd(target),
            user=user,
            cmd="/bin/sh",
            args=args,
            cwd="/",
            max_output_bytes=max_output_bytes,
            timeout=FILE_OP_TIMEOUT,
            token=cancel,
            watchdog=self._watchdog,
            keepalive_seconds=self._keepalive,
        )
        if r.cancelled:
            raise Cancelled(cancel.reason if cancel is not None else None)
        if r.timed_out:
            raise OperationTimeout("sandbox file operation timed out")
        return r

    @staticmethod
    def _stderr(r: RunOutcome) -> str:
        return r.stderr.decode("utf-8", "replace").strip()[:500]

    def read_file(
        self,
        sandbox: SandboxRef,
        path: str,
        *,
        max_bytes: int = DEFAULT_MAX_READ_BYTES,
        cancel: Optional[CancelToken] = None,
    ) -> Optional[FileContent]:
        """Read up to ``max_bytes`` from the start of a file (as user ``sandbox``).

        Args:
            sandbox: the handle or sandbox id.
            path: an absolute, normalized sandbox path.
            max_bytes: the most bytes returned (default 1 MiB, at most 1 GiB).
            cancel: cancels the call.

        Returns:
            The content (``truncated`` when the file is longer), or None when the path does
            not exist or is a directory.

        Raises:
            InvalidArgument: bad path or max_bytes (before any I/O).
            CommandFailed: the file could not be read (e.g. permission denied).
            OperationTimeout: the read took longer than 120 s.
            SandboxGoneError: the sandbox no longer exists.
            Cancelled: ``cancel`` fired.
        """
        self._check_open()
        sid = _sandbox_id(sandbox)
        v.check_path(path)
        v.check_max_bytes(max_bytes, "max_bytes")
        want = max_bytes + 1
        r = self._script(
            sid, scripts.read_args(path, want), cancel, max_output_bytes=want + STDERR_ROOM
        )
        if r.exit_code in (3, 4):
            return None
        if r.exit_code != 0:
            raise CommandFailed(
                f"cannot read {path}", exit_code=r.exit_code, stderr=self._stderr(r)
            )
        truncated = len(r.stdout) > max_bytes
        return FileContent(r.stdout[:max_bytes] if truncated else r.stdout, truncated)

    def write_file(
        self,
        sandbox: SandboxRef,
        path: str,
        data: Union[bytes, bytearray, memoryview],
        *,
        cancel: Optional[CancelToken] = None,
    ) -> None:
        """Write a file, creating parent directories, owned by user ``sandbox``.

        Paths under ``/skills`` are written by root with mode 0644 instead. The data is
        uploaded to a root-only staging directory first, then moved into place by a script.

        Raises:
            InvalidArgument: bad path or data (before any I/O).
            CommandFailed: the file could not be written.
            OperationTimeout: the file operation took longer than 120 s.
            SandboxGoneError: the sandbox no longer exists.
            Cancelled: ``cancel`` fired.
        """
        self._check_open()
        sid = _sandbox_id(sandbox)
        v.check_path(path)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument("data must be bytes")
        payload = bytes(data)
        staging = scripts.staging_path()
        args = scripts.write_args(path, staging, scripts.is_skills_path(path))

        def upload_and_move(target: Target) -> RunOutcome:
            self._envd(target).upload(staging, payload, user=scripts.ROOT_USER, token=cancel)
            return self._file_op(target, scripts.ROOT_USER, args, STDERR_ROOM, cancel)

        r = self._on_target(sid, cancel, upload_and_move)
        if r.exit_code != 0:
            raise CommandFailed(
                f"cannot write {path}", exit_code=r.exit_code, stderr=self._stderr(r)
            )

    def stat(
        self, sandbox: SandboxRef, path: str, *, cancel: Optional[CancelToken] = None
    ) -> Optional[FileStat]:
        """Size and kind of a path (as user ``sandbox``), or None when it does not exist.

        Raises:
            InvalidArgument: bad path (before any I/O).
            CommandFailed: the path could not be examined.
            OperationTimeout: the file operation took longer than 120 s.
            SandboxGoneError: the sandbox no longer exists.
            Cancelled: ``cancel`` fired.
        """
        self._check_open()
        sid = _sandbox_id(sandbox)
        v.check_path(path)
        r = self._script(sid, scripts.stat_args(path), cancel)
        if r.exit_code == 3:
            return None
        m = _STAT_LINE.fullmatch(r.stdout.decode("utf-8", "replace"))
        if r.exit_code != 0 or m is None:
            raise CommandFailed(
                f"cannot stat {path}", exit_code=r.exit_code, stderr=self._stderr(r)
            )
        return FileStat(size=int(m.group(1)), is_dir=m.group(2) == "directory")
