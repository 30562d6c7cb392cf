"""The sandbox provider: E2B sandboxes by name, for blocking code.

This module owns :class:`E2BSandboxProvider`, the Python port of the reference plugin's
``createE2BSandbox``: lifecycle by name (create, resume, suspend, destroy, destroy_by_name),
leftover-command cleanup (kill_all, kill_tagged), ``exec`` with output budget, timeout,
cancellation, Ctrl-C safety and the kill → grace → reboot escalation, and file operations
(read_file, write_file, stat). It is a thin facade: it documents every call and checks its
arguments before any I/O (with the checks of :mod:`e2b_provider.commands.arguments` and
:mod:`e2b_provider.files.arguments`), then hands it to one of its parts, composed by resource
as docker-py composes its API client: :mod:`e2b_provider.sandboxes.lifecycle` (whole sandboxes),
:mod:`e2b_provider.commands.shell` (exec and its kill job), :mod:`e2b_provider.commands.background`
(commands that outlive the call),
:mod:`e2b_provider.commands.terminals` (interactive terminals), :mod:`e2b_provider.files.files` and
:mod:`e2b_provider.files.trees` (files),
:mod:`e2b_provider.files.watch` (watching directories), all sharing one
:mod:`e2b_provider.core.context` (clients, watchdog, bounds). It speaks no HTTP itself. Every error
a call raises is said in the caller's terms — what was being done, to which sandbox and path, and
what to do (:mod:`e2b_provider.core.calls`, :mod:`e2b_provider.core.messages`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from typing import (
    Any,
    BinaryIO,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Union,
)

from ._watchdog import Watchdog
from .cancel import CancelToken, Deadline
from .commands import arguments as ca
from .commands.background import Background
from .commands.command import Command, CommandInfo
from .commands.shell import Commands, read_stdin_source
from .commands.terminal_handle import Terminal
from .commands.terminal_wrapper import TERMINAL_ID_PREFIX, is_terminal_id
from .commands.terminals import Terminals
from .commands.users import check_user
from .config import DeploymentConfig
from .core.calls import Calls
from .core.context import ProviderContext, checked_bounds
from .core.file_agents import FileAgents
from .core.reboot import Reboots
from .errors import FilesFailed, InvalidArgument
from .files import arguments as fa
from .files.files import Files
from .files.tar_codec import Progress
from .files.trees import Trees
from .files.watch import Watch, Watches
from .interpreter.code import CodeInterpreter, check_context, check_language
from .interpreter.collect import ResultCallback
from .interpreter.results import CodeContext, Execution
from .models import (
    DirEntry,
    ExecResult,
    FileContent,
    FileStat,
    SandboxHandle,
    SandboxLimits,
    SandboxRef,
    SandboxSummary,
    TransferSummary,
)
from .ports.relay import Ports, check_port, forward_limits, listen_address
from .protocol import validate as v
from .protocol.code_output import check_env_vars
from .protocol.escalation import KILL_GRACE_SECONDS
from .sandboxes.lifecycle import Lifecycle, ResumeOutcome

__all__ = ["E2BSandboxProvider"]

#: Default exec timeout (seconds) and output budget (bytes).
DEFAULT_EXEC_TIMEOUT_SECONDS = 60.0
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
#: The largest cell ``run_code`` sends, in UTF-8 bytes.
MAX_CODE_BYTES = 16 << 20
DEFAULT_MAX_READ_BYTES = 1 << 20
#: Content a download accepts by default (at most
#: :data:`~e2b_provider.files.arguments.MAX_DOWNLOAD_BYTES`).
DEFAULT_MAX_DOWNLOAD_BYTES = 10 << 30
#: The kill job is bounded by this; past it the sandbox counts as wedged.
KILL_BOUND_SECONDS = 20.0
#: Ctrl-C: how long we try to kill the remote command before re-raising.
INTERRUPT_KILL_BOUND_SECONDS = 10.0
#: Reboot of a wedged sandbox: the whole sequence is bounded by this.
REBOOT_BOUND_SECONDS = 120.0


class E2BSandboxProvider:
    """Run commands and move files in E2B sandboxes, from blocking code.

    Thread-safe: one provider serves any number of threads, and several commands may run on
    one sandbox at once (:attr:`concurrent_exec`). Use it as a context manager, or call
    :meth:`close`.

    Every method takes ``cancel=`` (a :class:`~e2b_provider.CancelToken`; ``token.cancel()``
    works from any thread). A cancelled ``exec`` returns ``ExecResult(cancelled=True,
    exit_code=None)``; every other cancelled call raises :class:`~e2b_provider.Cancelled`.
    Times are float seconds.

    Every call is bounded without a token, whatever E2B or a peer in its place does (slow
    headers, a body a byte at a time, silence, a stalled TLS handshake): one control-plane
    request takes at most 60 s in total, one control-plane call (its retries, 409 waits and
    pages included) at most 120 s, and each method documents its worst case. Past a bound a
    call raises :class:`~e2b_provider.TransportTimeout` (or
    :class:`~e2b_provider.OperationTimeout` for file operations and scripts).

    Args:
        config: the deployment (API key, template, URLs, sandbox lifetime, egress policy).
        pool_connections: HTTP connection pools kept (one per host; default 32).
        pool_maxsize: connections kept per host (default 256: one per concurrent stream).
        watchdog: the timer thread and worker pool; default the process-wide one.
        kill_bound: seconds the kill may take, once it started in the sandbox, before the
            sandbox counts as wedged (default 20); an exec waits no longer than this (plus
            1 s) for its kill's verdict.
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
        kill_bound: float = KILL_BOUND_SECONDS,
        kill_grace: float = KILL_GRACE_SECONDS,
        interrupt_kill_bound: float = INTERRUPT_KILL_BOUND_SECONDS,
        reboot_bound: float = REBOOT_BOUND_SECONDS,
        keepalive_seconds: int = 50,
    ) -> None:
        if not isinstance(config, DeploymentConfig):
            raise InvalidArgument("config must be a DeploymentConfig")
        bounds = checked_bounds(
            kill_bound, kill_grace, interrupt_kill_bound, reboot_bound, keepalive_seconds
        )
        self._ctx = ctx = ProviderContext(
            config,
            pool_connections=pool_connections,
            pool_maxsize=pool_maxsize,
            watchdog=watchdog,
            bounds=bounds,
        )
        reboots = Reboots(ctx)
        self._lifecycle = Lifecycle(ctx, reboots)
        self._commands = Commands(ctx, reboots)
        agents = FileAgents(ctx)
        self._files = Files(ctx, agents)
        self._trees = Trees(ctx, self._files)
        self._background = Background(ctx, agents)
        self._terminals = Terminals(ctx, reboots)
        self._ports = Ports(ctx)
        self._watches = Watches(ctx, self._files)
        self._code = CodeInterpreter(ctx)
        self._calls = Calls(ctx, self._files.forget, self._named)
        ctx.on_fork(self._lifecycle.after_fork)

    # -- housekeeping -------------------------------------------------------------------

    @property
    def config(self) -> DeploymentConfig:
        """The deployment configuration (its repr hides the API key)."""
        return self._ctx.config

    def close(self) -> None:
        """Release HTTP connections. Idempotent. Sandboxes are left as they are.

        A watch still open is ended: its loop raises ProviderClosed. A command still
        running when the provider is closed keeps its stream; if its
        timeout or cancel fires after ``close()``, no kill is sent and nothing is rebooted:
        its result comes back at once with ``timed_out``/``cancelled`` set and
        ``wedged=False``, and the command is left to its in-sandbox timeout (its ``timeout``
        plus 5 s).
        """
        self._ports.close()
        self._watches.close()
        self._files.close()
        self._ctx.close()

    def __enter__(self) -> E2BSandboxProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        cfg = self._ctx.config
        return f"E2BSandboxProvider(template={cfg.template!r}, api_url={cfg.effective_api_url!r})"

    def _named(self, name: str, deadline: Deadline) -> List[str]:
        """The ids of the sandboxes of ``name`` (one bounded listing)."""
        return [s.id for s in self._lifecycle.list(name, None, deadline)]

    # -- lifecycle ----------------------------------------------------------------------

    def create(
        self,
        name: str,
        limits: Optional[SandboxLimits] = None,
        *,
        cancel: Optional[CancelToken] = None,
    ) -> SandboxHandle:
        """Create a sandbox named ``name``, destroying older sandboxes of that name first.

        E2B sizes every sandbox by its template: the CPU, memory and disk of ``limits`` are
        a request that E2B does not apply. Each size given that the new sandbox does not
        have is logged as one warning (logger ``"e2b_provider"``, the size requested and
        the size it got), and the handle carries the sizes the sandbox really has.

        Args:
            name: 1-101 characters of ``[A-Za-z0-9_.-]``, starting with a letter or digit.
            limits: egress and the sizes requested (default ``SandboxLimits()``: egress
                ``"none"``, no sizes requested).
            cancel: cancels the call.

        Creates of one name are serialized within this provider: concurrent
        ``create("job")`` calls run one after the other (each destroys the sandbox the one
        before made), so one sandbox of the name is left. Nothing serializes creates of one
        name made by different providers or processes at the same time: both may leave a
        sandbox; the next ``create`` or :meth:`destroy_by_name` of that name removes the
        extra one.

        Takes at most 300 s: the wait for another create of the name, the listing and
        destroying of older sandboxes, the create itself and the read of the new sandbox's
        sizes share that bound (plus 30 s to delete again a sandbox E2B created without an
        access token).

        Returns:
            The new sandbox's handle, with the sizes E2B reports for it (``cpu_count``,
            ``memory_mb``, ``disk_mb``; None where E2B did not say).

        Raises:
            InvalidArgument: bad name or limits, or egress ``"open"`` without
                ``allow_open_egress`` (raised before any I/O).
            SandboxGoneError: E2B returned no envd access token (the sandbox is deleted again).
            E2BHttpError, TransportError: the API failed.
            TransportTimeout: the bound passed (a ``TransportError``).
            OperationTimeout: another create of the name in this provider did not finish
                within the bound.
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        self._calls.check_open()
        if limits is None:
            limits = SandboxLimits()
        v.check_name(name)
        v.check_limits(limits)
        v.check_cancel(cancel)
        if limits.egress == "open" and not self._ctx.config.allow_open_egress:
            raise InvalidArgument(
                'sandbox egress "open" is refused: this deployment has allow_open_egress=False. '
                "Set DeploymentConfig(allow_open_egress=True) (allowOpenEgress in a config "
                'mapping; trusted environments only), or use egress "allowlist" or "none".'
            )
        with self._calls.doing(f"creating sandbox {name!r}"):
            return self._lifecycle.create(name, limits, cancel)

    def info(self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None) -> SandboxSummary:
        """What E2B reports about the sandbox now: its state, name, template, start time
        and sizes (``cpu_count``, ``memory_mb``, ``disk_mb``: its template's).

        One control-plane request: a paused sandbox stays paused. Takes at most 120 s.

        Returns:
            A :class:`~e2b_provider.SandboxSummary` (``.handle`` gives a handle with the
            sizes).

        Raises:
            SandboxGoneError: the sandbox no longer exists.
            E2BHttpError, TransportError: the API failed.
            TransportTimeout: the bound passed (a ``TransportError``).
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        sid = self._calls.begin(sandbox, cancel)
        with self._calls.doing(f"describing sandbox {sid}"):
            return self._lifecycle.info(sid, cancel)

    def resume(self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None) -> ResumeOutcome:
        """Make sure the sandbox runs (resuming it if paused) and extend its lease.

        Takes at most 120 s (every connect, retry and 409 wait included), or 240 s when it
        joins a connect of the sandbox already under way for a shorter lease.

        Returns:
            ``"resumed"``, or ``"gone"`` when the sandbox no longer exists (create a new one).

        Raises:
            MissingAccessToken: E2B answered without the sandbox's envd access token (the
                sandbox may be running, but is never used unauthenticated).
            E2BHttpError, TransportError: the API failed (including a 409 that did not clear).
            TransportTimeout: the bound passed (a ``TransportError``).
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        sid = self._calls.begin(sandbox, cancel)
        with self._calls.doing(f"resuming sandbox {sid}"):
            return self._lifecycle.resume(sid, cancel)

    def suspend(self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None) -> None:
        """Pause the sandbox (memory kept). Already paused or gone is fine.

        Calls running on the sandbox meanwhile are cut off: they raise
        :class:`~e2b_provider.SandboxPaused` (their outcome is unknown; a command is frozen
        with the sandbox and goes on when it is resumed).

        Takes at most 120 s (retries included).

        Raises:
            E2BHttpError, TransportError: the API failed (a 503 "busy" is retried first).
            TransportTimeout: the bound passed (a ``TransportError``).
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        sid = self._calls.begin(sandbox, cancel)
        with self._calls.doing(f"suspending sandbox {sid}"):
            self._files.forget(sid)
            self._lifecycle.suspend(sid, cancel)

    def destroy(self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None) -> None:
        """Delete the sandbox and everything in it. Already gone is fine.

        Takes at most 120 s (retries and 409 waits included).

        Raises:
            E2BHttpError, TransportError: the API failed.
            TransportTimeout: the bound passed (a ``TransportError``).
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        sid = self._calls.begin(sandbox, cancel)
        with self._calls.doing(f"destroying sandbox {sid}"):
            self._files.forget(sid)
            self._lifecycle.destroy(sid, cancel)

    def destroy_by_name(self, name: str, *, cancel: Optional[CancelToken] = None) -> int:
        """Delete every running or paused sandbox created under ``name`` (all pages).

        Takes at most 300 s: the listing and every delete share that bound (sandboxes not
        deleted within it are left for the next call).

        Returns:
            How many sandboxes were deleted.

        Raises:
            InvalidArgument: bad name.
            E2BHttpError, TransportError: the API failed.
            TransportTimeout: the bound passed (a ``TransportError``).
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        self._calls.check_open()
        v.check_name(name)
        v.check_cancel(cancel)
        with self._calls.doing(f"destroying the sandboxes named {name!r}"):
            return self._lifecycle.destroy_by_name(name, cancel)

    def list_sandboxes(
        self, name: Optional[str] = None, *, cancel: Optional[CancelToken] = None
    ) -> List[SandboxSummary]:
        """The running and paused sandboxes of this API key's team (all pages).

        Takes at most 120 s (every page and retry included).

        Args:
            name: only the sandboxes created under this name (by :meth:`create`).
            cancel: cancels the call.

        Returns:
            One :class:`~e2b_provider.SandboxSummary` per sandbox (``name`` is None for
            sandboxes this library did not create), in the server's order.

        Raises:
            InvalidArgument: bad name.
            E2BHttpError, TransportError: the API failed.
            TransportTimeout: the bound passed (a ``TransportError``).
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        self._calls.check_open()
        if name is not None:
            v.check_name(name)
        v.check_cancel(cancel)
        what = "listing sandboxes" if name is None else f"listing the sandboxes named {name!r}"
        with self._calls.doing(what):
            return self._lifecycle.list(name, cancel)

    # -- leftover commands ----------------------------------------------------------------

    def kill_all(self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None) -> None:
        """Kill every command this library started in the sandbox, with its process tree,
        every file operation still running there and every file agent, whoever started
        them (the next file call starts a new agent), and remove what they staged.

        Takes at most 360 s: up to 120 s to connect a cold sandbox, 120 s for the kill
        script and 120 s for the file-operation sweep.

        Raises:
            CommandFailed: the kill script failed.
            OperationTimeout: the kill script took longer than 120 s.
            SandboxGoneError: the sandbox no longer exists.
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        sid = self._calls.begin(sandbox, cancel)
        with self._calls.doing(f"stopping leftover commands in sandbox {sid}", sid=sid):
            self._commands.kill_all(sid, cancel)
        with self._calls.doing(f"stopping leftover file operations in sandbox {sid}", sid=sid):
            self._files.sweep(sid, cancel)
        self._files.forget(sid)  # its agent was killed too

    def kill_tagged(
        self, sandbox: SandboxRef, tags: Iterable[str], *, cancel: Optional[CancelToken] = None
    ) -> None:
        """Kill the commands started with any of ``tags`` (e.g. of holders that crashed).

        Takes at most 240 s: up to 120 s to connect a cold sandbox and 120 s for the kill
        script.

        Raises:
            InvalidArgument: a bad tag (before any I/O).
            CommandFailed: the kill script failed.
            OperationTimeout: the kill script took longer than 120 s.
            SandboxGoneError: the sandbox no longer exists.
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        sid = self._calls.open_sandbox(sandbox)
        tag_list = ca.check_tags(tags)
        v.check_cancel(cancel)
        if not tag_list:
            return
        with self._calls.doing(
            f"stopping the commands tagged {', '.join(tag_list)} in sandbox {sid}", sid=sid
        ):
            self._commands.kill_tagged(sid, tag_list, cancel)

    # -- exec -------------------------------------------------------------------------------

    def exec(
        self,
        sandbox: SandboxRef,
        command: str,
        *,
        timeout: float = DEFAULT_EXEC_TIMEOUT_SECONDS,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        tag: Optional[str] = None,
        cancel: Optional[CancelToken] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        stdin: Union[bytes, str, BinaryIO, None] = None,
        user: str = "sandbox",
    ) -> ExecResult:
        """Run a shell command (``/bin/bash -c``) in the sandbox as user ``sandbox`` (or
        ``root``).

        The command runs in its own session under ``timeout -s KILL``, with
        ``HOME=/workspace`` and ``LANG=C.UTF-8`` (``env`` adds or overrides variables), and
        ``CAPYBARA_EXEC`` set to the command's own id (it cannot be overridden): every
        process it starts inherits it. On timeout or cancel the whole process tree is
        killed, and so is every process carrying that id, also one that left the command's
        session (``setsid``) or was reparented; a process started with an emptied
        environment that also left the session is out of reach. The kills of commands that
        time out together in one sandbox are batched into one script. Only evidence about
        this sandbox makes it wedged: if the kill fails, or runs past ``kill_bound`` once
        it started there, or the stream does not end within the grace period after it, the
        sandbox is rebooted (files kept) and the result says ``wedged=True``. A kill that
        could not be confirmed within ``kill_bound`` (waiting behind other work, or in a
        sandbox busy with a backlog of other requests) is not evidence: the result comes
        back on time with ``wedged=False`` and the kill still runs. A timed-out or
        cancelled exec returns within ``timeout + kill_bound + 1 s + kill_grace`` (plus
        ``reboot_bound`` when wedged).

        Bounds: once the command's stream is open, the call ends within ``timeout`` +
        ``kill_bound`` + ``kill_grace`` + 1 s (defaults: ``timeout`` + 24 s); before that,
        connecting a cold sandbox takes at most 120 s and opening the stream at most 30 s
        (both twice when E2B's edge says the sandbox was paused under the call, before
        anything ran). A command that could not be stopped adds its sandbox's reboot: up to
        ``reboot_bound``, and as long again when it waits for a reboot of that sandbox
        already under way. After Ctrl-C it ends within ``interrupt_kill_bound``.

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
            on_stdout: called with standard output as it arrives (a ``str``, on the calling
                thread: ``print`` and notebook display work), decoded incrementally (a
                UTF-8 character is never split; invalid bytes are replaced as in the
                result), only for output inside ``max_output_bytes``: the pieces add up to
                ``result.stdout``. An exception it raises stops the command (the remote
                process tree is killed) and is raised from ``exec``.
            on_stderr: the same for standard error.
            stdin: what the command reads on its standard input: bytes, a str (sent as
                UTF-8) or a binary file object (read in pieces until it returns nothing);
                the input is closed after it. None (default): the command reads
                ``/dev/null``. It is written from a short-lived thread while this one reads
                the output; a file object that blocks keeps that thread (a daemon) until it
                returns. For a pipe that may stay open after the command ended (the
                process's own standard input, say) pass an unbuffered reader such as
                ``open(0, "rb", buffering=0, closefd=False)``: Python cannot exit while a
                daemon thread is blocked in a buffered reader (``sys.stdin.buffer``).
            user: who the command runs as: ``"sandbox"`` (default) or ``"root"`` (for
                ``apt-get install``, say; envd's ``Start`` as that user, as E2B's
                ``commands.run(user=...)``). Files a root command writes are root's; the
                file calls of this provider stay the sandbox user's. Its timeout, cancel
                and Ctrl-C stop its tree as for any command (its kill runs as root), and
                so do :meth:`kill_all` and :meth:`kill_tagged` (they sweep as root too).

        Returns:
            The :class:`~e2b_provider.ExecResult`. A non-zero exit is a result, not an error.

        Raises:
            InvalidArgument: bad arguments, e.g. text that is not valid Unicode such as
                ``os.fsdecode(b"\\xff")`` gives (before any I/O); or ``cwd`` does not exist
                in the sandbox (envd checks it before starting anything: the command did
                not run).
            Cancelled: ``cancel`` fired before the command was started.
            SandboxGoneError: the sandbox no longer exists, also when it was deleted (by
                :meth:`destroy`, another client or E2B) while the command ran.
            MissingAccessToken: E2B answered a connect without the sandbox's access token.
            SandboxPaused: the sandbox was paused while the command ran (by :meth:`suspend`,
                another client or E2B): its outcome is unknown; it goes on when the sandbox
                is resumed (:meth:`kill_all` stops it). A subclass of ``TransportError``.
            E2BHttpError, TransportError, ProtocolError, RemoteError: the run failed while
                neither timed out nor cancelled, before its exit status arrived (once the
                exit status arrived, it is the result).
            ProviderClosed: the provider was closed.
            KeyboardInterrupt: re-raised after the remote command was killed (bounded).
            Exception: whatever ``on_stdout`` or ``on_stderr`` raised, after the remote
                command was killed (bounded).
        """
        sid = self._calls.open_sandbox(sandbox)
        run_env = ca.exec_env(
            command, timeout, max_output_bytes, cwd, env, tag, on_stdout, on_stderr
        )
        check_user(user)
        read_stdin = read_stdin_source(stdin) if stdin is not None else None
        v.check_cancel(cancel)
        began = time.monotonic()
        doing = f"running a command in sandbox {sid}"
        lost = ("the command may or may not have run (its result was lost): check before "
                "running it again")
        # The call is made one short line below: a Ctrl-C's traceback shows the caller's
        # frames and this one (see core/interrupts.py), so a notebook shows a few lines.
        run = functools.partial(
            self._commands.exec, sid, command, timeout=timeout,
            max_output_bytes=max_output_bytes, cwd=cwd, env=run_env, tag=tag, cancel=cancel,
            on_stdout=on_stdout, on_stderr=on_stderr, stdin=read_stdin, user=user,
        )
        # no sid to doing(): starting() already looks the sandbox up once when the stream breaks
        with self._calls.doing(doing, lost), self._calls.starting(doing, sid, began, cancel):
            return run()

    # -- commands that outlive the call ---------------------------------------------------

    def start(
        self,
        sandbox: SandboxRef,
        command: str,
        *,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        tag: Optional[str] = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        stdin: bool = False,
        cancel: Optional[CancelToken] = None,
        user: str = "sandbox",
    ) -> Command:
        """Start a shell command in the background and return at once with its handle.

        It runs as ``exec`` runs a command (``/bin/bash -c`` as ``sandbox``, own session,
        ``HOME=/workspace``, ``LANG=C.UTF-8``, ``env`` on top, the exec marker, ``tag``),
        so :meth:`kill_all`, :meth:`kill_tagged`, a reboot and :meth:`destroy` stop its
        whole process tree. It keeps running after this call, after the
        :class:`~e2b_provider.Command` is dropped and after this process exits. The sandbox
        keeps the last ``max_output_bytes`` of its stdout and, separately, of its stderr
        (for a server the latest lines matter most), and its exit status once it ended,
        until the sandbox is destroyed, also through a pause and resume: any process can
        :meth:`attach` to it by its ``id``. A small supervisor process keeps the record:
        ``python3``'s, or, in a sandbox without ``python3``, a shell one (the same record,
        read by polling: see the README, "Long-running commands").

        Args:
            sandbox: the handle or sandbox id.
            command: the shell command.
            timeout: None (default) to let it run until it ends or is killed; a number of
                seconds (at most 86400) after which it is killed in the sandbox
                (``timeout -s KILL``), whoever watches.
            cwd: working directory (default ``/workspace``).
            env: extra environment variables.
            tag: a holder tag (``[A-Za-z0-9_-]{1,64}``) for :meth:`kill_tagged`.
            max_output_bytes: how much of each stream the sandbox keeps (default 1 MiB, at
                least 1 KiB).
            stdin: give it a standard input to write to (:meth:`Command.send_stdin`);
                otherwise it reads ``/dev/null``.
            cancel: stops the start (not the command once it runs).
            user: who the command runs as: ``"sandbox"`` (default) or ``"root"``. A root
                command's supervisor runs as root too and keeps its record in root's home
                (``/root/.capybara-cmd``), which the sandbox user can neither read nor
                alter; its id says it is root's (``<sandbox id>:root-<32 hex>``), and its
                record is read and its kill sent as root.

        Returns:
            The :class:`~e2b_provider.Command`, once the command runs.

        Raises:
            InvalidArgument: bad arguments (before any I/O).
            CommandFailed: the supervisor could not start (the records' directory is not
                its user's own, say).
            Cancelled, SandboxGoneError, E2BHttpError, TransportError, ProviderClosed.
        """
        sid = self._calls.open_sandbox(sandbox)
        run_env = ca.start_env(command, timeout, max_output_bytes, cwd, env, tag, stdin)
        check_user(user)
        v.check_cancel(cancel)
        doing = f"starting a background command in sandbox {sid}"
        with self._calls.doing(
            doing, "the command may or may not have started: commands() lists what runs",
            sid=sid), self._calls.starting(doing):
            return self._background.start(
                sid, command, timeout=timeout, cwd=cwd, env=run_env, tag=tag,
                max_output_bytes=max_output_bytes, stdin=stdin, cancel=cancel, user=user,
            )

    def attach(
        self, sandbox: SandboxRef, command_id: str, *, cancel: Optional[CancelToken] = None
    ) -> Union[Command, Terminal]:
        """The handle of a background command or a terminal, from its ``id`` (any process
        may have started it, also one that has exited).

        A background command's id (``start``) gives its :class:`~e2b_provider.Command`,
        running or ended, however long ago. A terminal's id (``terminal``) gives a
        :class:`~e2b_provider.Terminal` to write to, resize, read (its output from now on:
        envd keeps none), wait for or kill; closing that handle leaves the terminal
        running. A terminal is found while it runs and up to 30 s after its end.

        Raises:
            InvalidArgument: not a command or terminal id, or one of another sandbox
                (before any I/O).
            CommandNotFound: the sandbox has no such command or running terminal (also for
                a terminal id whose pid no process can have).
            Cancelled, SandboxGoneError, E2BProviderError.
        """
        sid = self._calls.begin(sandbox, cancel)
        if is_terminal_id(command_id) or (
            isinstance(command_id, str)
            and command_id.rpartition(":")[2].startswith(TERMINAL_ID_PREFIX)
        ):  # a terminal's, or one that is not right: said as a terminal id's problem
            with self._calls.doing(
                f"attaching to terminal {command_id[:120]} in sandbox {sid}", sid=sid
            ):
                return self._terminals.attach(sid, command_id, cancel)
        with self._calls.doing(
            f"finding command {str(command_id)[:120]} in sandbox {sid}", sid=sid
        ):
            return self._background.attach(sid, command_id, cancel)

    def terminal(
        self,
        sandbox: SandboxRef,
        command: Optional[str] = None,
        *,
        cols: int = 80,
        rows: int = 24,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
        user: str = "sandbox",
    ) -> Terminal:
        """Open an interactive terminal in the sandbox: a program on a pty, as
        ``docker exec -it`` gives one.

        It runs as user ``sandbox`` (or ``user``) with the environment ``exec`` gives a command
        (``HOME=/workspace``, ``LANG=C.UTF-8``, ``env`` on top, the exec marker) and
        ``TERM=xterm-256color`` unless ``env`` sets one, in a session of its own whose
        controlling terminal is the pty (``cols`` x ``rows``). ``command=None`` runs the
        user's login shell (``bash -l`` on E2B's base template); a command is run by
        ``/bin/bash -c``. :meth:`kill_all`, a reboot, :meth:`destroy`, Ctrl-C while a
        call of the terminal waits, ``cancel``, ``timeout`` and the end of its ``with``
        block kill its whole process tree.

        Bounds: it returns once envd says the program runs: at most 30 s for the stream
        and 30 s for that answer (plus 120 s to connect a cold sandbox). Every call of the
        :class:`~e2b_provider.Terminal` is bounded too (see there).

        Args:
            sandbox: the handle or sandbox id.
            command: a shell command (``"python3 -i"``), or None for the login shell.
            cols: the terminal's width in columns (1-65535; default 80).
            rows: its height in rows (1-65535; default 24).
            cwd: working directory (default ``/workspace``).
            env: extra environment variables.
            timeout: None (default) to let it run until it ends or is killed; seconds
                after which it is killed, by envd in the sandbox (``Connect-Timeout-Ms``:
                the program, whose terminal then hangs up) and by this process (the whole
                tree); :attr:`~e2b_provider.Terminal.timed_out` says so.
            cancel: kills the terminal's tree when it fires, from any thread; the
                terminal's calls then raise :class:`~e2b_provider.Cancelled`.
            user: who the program runs as: ``"sandbox"`` (default) or ``"root"`` (whose
                login shell it then is), as for :meth:`exec`.

        Returns:
            The :class:`~e2b_provider.Terminal` (a context manager).

        Raises:
            InvalidArgument: bad arguments (before any I/O), or ``cwd`` does not exist in
                the sandbox (nothing ran).
            Cancelled: ``cancel`` fired before the terminal ran (what may have started is
                killed).
            SandboxGoneError, E2BHttpError, TransportError, ProviderClosed.
            KeyboardInterrupt: after what may have started was killed (bounded).
        """
        sid = self._calls.open_sandbox(sandbox)
        run_env = ca.terminal_env(command, cols, rows, timeout, cwd, env)
        check_user(user)
        v.check_cancel(cancel)
        doing = f"opening a terminal in sandbox {sid}"
        with self._calls.doing(
            doing, "the terminal may or may not have started: kill_all() stops it", sid=sid
        ), self._calls.starting(doing):
            return self._terminals.open(
                sid, command, cols=cols, rows=rows, cwd=cwd, env=run_env,
                timeout=timeout, cancel=cancel, user=user,
            )

    def commands(
        self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None
    ) -> List[CommandInfo]:
        """The background commands (see :meth:`start`) and the terminals (see
        :meth:`terminal`) that still run in the sandbox, whoever started them (also a
        process that has exited), oldest first; ``kind`` tells them apart, and each ``id``
        attaches to it (:meth:`attach`) from any process.

        Raises:
            Cancelled, SandboxGoneError, CommandFailed, E2BProviderError.
        """
        sid = self._calls.begin(sandbox, cancel)
        listed: List[List[Dict[str, Any]]] = []

        def processes() -> List[Dict[str, Any]]:  # envd's list, asked once for both parts
            if not listed:
                listed.append(self._ctx.processes(sid, cancel))
            return listed[0]

        with self._calls.doing(f"listing background commands in sandbox {sid}", sid=sid):
            found = self._background.list(sid, cancel, processes)
        with self._calls.doing(f"listing terminals in sandbox {sid}", sid=sid):
            found += self._terminals.list(sid, cancel, processes)
        return sorted(found, key=lambda c: c.started_at)

    # -- files ----------------------------------------------------------------------------

    def read_file(
        self,
        sandbox: SandboxRef,
        path: str,
        *,
        max_bytes: int = DEFAULT_MAX_READ_BYTES,
        cancel: Optional[CancelToken] = None,
    ) -> Optional[FileContent]:
        """Read up to ``max_bytes`` from the start of a file (as user ``sandbox``).

        On a warm sandbox this is one request to the provider's file agent, which opens
        the file with the sandbox user's own credentials (envd's ``/files`` would read as
        root); more than 2 MiB of a larger file comes through envd's ``/files`` from a
        descriptor opened the same way. Only regular files are read: a FIFO or device ends
        at once with an error.

        Takes at most 120 s for the read itself (its scripts and transfers share the bound),
        plus up to 120 s to connect a cold sandbox, ``kill_bound`` to stop what a read that
        ended early started, and 10 s to look up whether a pause cut it.

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
            CommandFailed: the file could not be read: permission denied (also for a path
                behind a directory the user may not enter, such as ``/root/x``: it may
                exist), or another reason the message gives.
            OperationTimeout: the read took longer than 120 s, or the sandbox stopped
                answering.
            SandboxPaused: the sandbox was paused while the file was read.
            SandboxGoneError: the sandbox no longer exists.
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        sid = self._calls.begin(
            sandbox, cancel, lambda: v.check_path(path),
            lambda: v.check_max_bytes(max_bytes, "max_bytes"),
        )
        with self._calls.doing(f"reading {path} in sandbox {sid}", sid=sid):
            return self._files.read(sid, path, max_bytes, cancel)

    def write_file(
        self,
        sandbox: SandboxRef,
        path: str,
        data: Union[bytes, bytearray, memoryview],
        *,
        cancel: Optional[CancelToken] = None,
    ) -> None:
        """Write a file, creating parent directories, owned by user ``sandbox``.

        All or nothing: the bytes go to a temporary file in the target's own directory,
        created by the user who will own the result, and it is renamed over the target
        only when whole. A write that fails, is cancelled, times out or whose client dies
        leaves the previous file as it was (or no file); of concurrent writes of one path,
        one writer's whole content wins. A ``Cancelled`` write may have completed (whole);
        it never leaves a part. An overwrite keeps the file's mode; a symbolic link at
        ``path`` is followed (the file it names is replaced, as the user may). A directory,
        FIFO, device, a file the user may not write, or another user's file in a sticky
        directory (such as ``/tmp``, where only a file's owner may replace it) is refused.

        Paths under ``/skills`` are written by root with mode 0644 instead, and only when
        no symbolic link and no directory the sandbox user (or anyone but root) could
        change is on the way; otherwise :class:`UnsafePath`.

        On a warm sandbox a write of up to 1 MiB is one request to the provider's file
        agent (no program started); a larger one is two (a helper, then envd's ``/files``
        streaming into it).

        When the answer is lost (the connection broke or the stream could not be read), the
        write is done once more — writing the same bytes again gives the same file — so an
        error means the write did not succeed, except as said below.

        Takes at most 120 s for the write itself (its scripts, the upload and a second
        attempt share the bound), plus up to 120 s to connect a cold sandbox, ``kill_bound``
        to stop what a write that ended early started, and 10 s to look up whether a pause
        cut it.

        Raises:
            InvalidArgument: bad path or data (before any I/O).
            UnsafePath: a ``/skills`` path goes through a link or a directory others may
                change (nothing was written).
            CommandFailed: the file could not be written (the message says why).
            OperationTimeout: the file operation took longer than 120 s, or the sandbox
                stopped answering.
            SandboxPaused: the sandbox was paused during the write (the file may or may not
                have been written).
            TransportError, ProtocolError: the answer was lost twice (the file may or may
                not have been written).
            SandboxGoneError: the sandbox no longer exists.
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        sid = self._calls.begin(
            sandbox, cancel, lambda: v.check_path(path), lambda: fa.check_data(data)
        )
        with self._calls.doing(
            f"writing {path} in sandbox {sid}",
            "the file may or may not have been written (the answer was lost twice)", sid=sid):
            self._files.write(sid, path, bytes(data), cancel)

    def stat(
        self, sandbox: SandboxRef, path: str, *, cancel: Optional[CancelToken] = None
    ) -> Optional[FileStat]:
        """Size and kind of a path (as user ``sandbox``), or None when it does not exist.

        Takes at most 120 s for the look-up itself, plus up to 120 s to connect a cold
        sandbox, ``kill_bound`` to stop a look-up that ended early, and 10 s to look up
        whether a pause cut it.

        Raises:
            InvalidArgument: bad path (before any I/O).
            CommandFailed: the path could not be examined: permission denied (also for a
                path behind a directory the user may not enter, such as ``/root/x``: it may
                exist), or another reason the message gives.
            OperationTimeout: the file operation took longer than 120 s, or the sandbox
                stopped answering.
            SandboxPaused: the sandbox was paused while the path was examined.
            SandboxGoneError: the sandbox no longer exists.
            ProviderClosed: the provider was closed.
            Cancelled: ``cancel`` fired.
        """
        sid = self._calls.begin(sandbox, cancel, lambda: v.check_path(path))
        with self._calls.doing(f"examining {path} in sandbox {sid}", sid=sid):
            return self._files.stat(sid, path, cancel)

    # -- many files ---------------------------------------------------------------------

    def write_files(
        self,
        sandbox: SandboxRef,
        files: Mapping[str, Union[bytes, bytearray, memoryview, str]],
        *,
        cancel: Optional[CancelToken] = None,
    ) -> None:
        """Write many files, each atomically, as :meth:`write_file` writes one.

        Small files travel together: a batch whose contents add up to at most 1 MiB costs
        one request on a warm sandbox. ``str`` contents are written as UTF-8. Files under
        ``/skills``, and files larger than 1 MiB, are written one by one (for many large
        files, :meth:`upload` a directory instead).

        Each file goes to a temporary file in its own directory and is renamed into place
        when whole, so a file is either its old content or its new content, never a mix,
        whatever happens to the call. On failure the files that could be written are.

        Takes at most 120 s for each batch (plus what :meth:`write_file` takes for each
        file written alone).

        Raises:
            InvalidArgument: a bad path or content, or a path given twice (before any I/O:
                nothing is written).
            FilesFailed: some files could not be written; ``.failed`` says which and why
                (the others were written).
            OperationTimeout, SandboxPaused, TransportError, ProtocolError,
            SandboxGoneError, ProviderClosed, Cancelled: as for :meth:`write_file` (some
                files may have been written).
        """
        sid = self._calls.open_sandbox(sandbox)
        items = fa.checked_files(files)
        v.check_cancel(cancel)
        with self._calls.doing(
            f"writing {len(items)} files in sandbox {sid}",
            "the files may or may not have been written (the answer was lost twice)", sid=sid):
            failed = self._files.write_many(sid, items, cancel)
        if failed:
            raise FilesFailed(f"writing {len(items)} files in sandbox {sid}", failed)

    def read_files(
        self,
        sandbox: SandboxRef,
        paths: Iterable[str],
        *,
        max_bytes: int = DEFAULT_MAX_READ_BYTES,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Optional[FileContent]]:
        """Read many files (as user ``sandbox``), each as :meth:`read_file` reads one.

        On a warm sandbox, any number of small files costs one request.

        Args:
            sandbox: the handle or sandbox id.
            paths: absolute, normalized sandbox paths (a path given twice is read once).
            max_bytes: the most bytes returned per file (default 1 MiB, at most 1 GiB).
            cancel: cancels the call.

        Returns:
            Each path's content (``truncated`` when the file is longer), or None when it
            does not exist or is a directory.

        Raises:
            InvalidArgument: a bad path or max_bytes (before any I/O).
            FilesFailed: some files could not be read (permission denied, not a regular
                file...); ``.failed`` says which and why, ``.results`` holds the others.
            OperationTimeout, SandboxPaused, SandboxGoneError, ProviderClosed, Cancelled:
                as for :meth:`read_file`.
        """
        sid = self._calls.open_sandbox(sandbox)
        wanted = fa.check_paths(paths)
        v.check_max_bytes(max_bytes, "max_bytes")
        v.check_cancel(cancel)
        with self._calls.doing(f"reading {len(wanted)} files in sandbox {sid}", sid=sid):
            out, failed = self._files.read_many(sid, wanted, max_bytes, cancel)
        if failed:
            raise FilesFailed(f"reading {len(wanted)} files in sandbox {sid}", failed, out)
        return out

    def list_dir(
        self,
        sandbox: SandboxRef,
        path: str,
        *,
        depth: int = 1,
        cancel: Optional[CancelToken] = None,
    ) -> Optional[List[DirEntry]]:
        """The entries of a directory (as user ``sandbox`` sees them), ``depth`` levels down.

        Symbolic links are listed as links (``type="symlink"``, ``symlink_target``), never
        followed; directories below ``path`` that the user may not read are listed but not
        entered. At most 1,000,000 entries.

        Args:
            sandbox: the handle or sandbox id.
            path: an absolute, normalized sandbox path.
            depth: 1 lists ``path``'s own entries; 2 also those of its subdirectories, and
                so on (1-64).
            cancel: cancels the call.

        Returns:
            The entries (sorted by name within each directory, level by level), or None
            when ``path`` does not exist.

        Raises:
            InvalidArgument: a bad path or depth (before any I/O).
            CommandFailed: ``path`` is not a directory, or the user may not enter or read
                it (the message says which), or the sandbox has no ``python3``.
            OperationTimeout, SandboxPaused, SandboxGoneError, ProviderClosed, Cancelled.
        """
        sid = self._calls.begin(
            sandbox, cancel, lambda: v.check_path(path), lambda: fa.check_depth(depth)
        )
        with self._calls.doing(f"listing {path} in sandbox {sid}", sid=sid):
            return self._files.list_dir(sid, path, depth, cancel)

    # -- watching ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def watch(
        self,
        sandbox: SandboxRef,
        path: str,
        *,
        recursive: bool = False,
        timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Iterator[Watch]:
        """Watch a directory for changes, for the ``with`` block. ::

            with provider.watch(sandbox, "/workspace", recursive=True) as events:
                for event in events:       # FileEvent(type, path), as they happen
                    print(event.type, event.path)

        Yields an iterator of :class:`~e2b_provider.FileEvent` (``create``, ``write``,
        ``remove``, ``rename``, ``chmod``; paths absolute) once the watch is set up: every
        change from then on is reported, in order. It runs envd's ``WatchDir``: events come
        within milliseconds, and each ``next`` blocks until one comes (on the calling
        thread: no thread per watch). A rename is ``rename`` (the old name) then ``create``
        (the new name, when it is in the watched tree). Identical events that arrive
        together (a burst of writes to one file) come once.

        Memory stays bounded however many events come: they are read only as they are
        asked for, 64 KiB of the stream at a time. When they come faster than the loop
        takes them, the sandbox's queue (16,384 events) overflows: the iterator then yields
        ``FileEvent("overflow", path)`` (some events were lost: look at the directory
        again) and watches on.

        The iteration ends when ``timeout`` passes, after the watched directory itself was
        removed or renamed (that event is the last), or when the block is left. Ctrl-C
        raises ``KeyboardInterrupt`` from the loop; ``cancel`` raises ``Cancelled``. The
        directory is checked as user ``sandbox`` (as file calls are): it must exist, be a
        directory and be readable by ``sandbox``; below it, a recursive watch reports
        every change (envd watches as root), also in subdirectories ``sandbox`` may not
        read. A long watch keeps the sandbox alive as other calls do.

        Args:
            sandbox: the handle or sandbox id.
            path: the directory (absolute, normalized).
            recursive: watch every directory below too (directories made later included;
                what a directory holds when it appears is reported as created).
            timeout: seconds to watch once the watch is set up (at most 86400); the
                iteration then ends (no error). None (default): until the block is left.
            cancel: cancels the set-up, and the watch: iteration raises ``Cancelled``.

        Bounds: the set-up (a check as ``sandbox``, then envd's answer) takes at most 120 s
        for the check plus 30 s for the stream's opening (plus 120 s to connect a cold
        sandbox); each ``next`` then waits at most for the next event, the timeout, or
        twice the keepalive plus 10 s of silence from the sandbox (then
        ``TransportTimeout``).

        Raises:
            InvalidArgument: bad arguments (before any I/O).
            PathNotFound: ``path`` does not exist.
            NotADirectory: ``path`` is not a directory.
            PermissionDenied: user ``sandbox`` may not read ``path`` (or reach it).
            Cancelled, SandboxGoneError, SandboxPaused, TransportError, ProtocolError,
            RemoteError, ProviderClosed: from the set-up or from the iteration.
        """
        sid = self._calls.begin(
            sandbox, cancel, lambda: v.check_path(path),
            lambda: fa.check_watch(recursive, timeout),
        )
        doing = f"watching {path} in sandbox {sid}"
        with self._calls.doing(doing, sid=sid):
            watch = self._watches.open(
                sid, path, recursive=recursive,
                timeout=None if timeout is None else float(timeout), cancel=cancel, doing=doing,
            )
        try:
            yield watch
        finally:
            watch.close()

    def wait_for_file(
        self,
        sandbox: SandboxRef,
        path: str,
        *,
        timeout: float = DEFAULT_EXEC_TIMEOUT_SECONDS,
        cancel: Optional[CancelToken] = None,
    ) -> FileStat:
        """Wait until ``path`` exists in the sandbox (as user ``sandbox`` sees it).

        A path that exists returns at once. Otherwise its directory is watched (see
        :meth:`watch`) and the path looked at again once the watch is set up, so a file
        made at any moment is never missed; the call returns when an event names it and
        it is there. A directory that does not exist yet is waited for the same way, one
        level up. Anything counts: a file (whole or not: a writer that renames a finished
        file into place makes it appear whole), a directory, a symbolic link to something
        that exists.

        Args:
            sandbox: the handle or sandbox id.
            path: an absolute, normalized sandbox path.
            timeout: seconds to wait at most (default 60, at most 86400), everything
                included.
            cancel: cancels the wait.

        Returns:
            What :meth:`stat` says of the path.

        Raises:
            InvalidArgument: bad arguments (before any I/O).
            OperationTimeout: the path did not appear within ``timeout``.
            CommandFailed: the path is a loop of symbolic links (said at once, or as soon
                as the link is made).
            NotADirectory: a directory on the way is a file.
            PermissionDenied: user ``sandbox`` may not reach or read a directory on the way.
            Cancelled, SandboxGoneError, SandboxPaused, TransportError, ProviderClosed.
        """
        sid = self._calls.begin(
            sandbox, cancel, lambda: v.check_path(path), lambda: v.check_timeout(timeout)
        )
        doing = f"waiting for {path} in sandbox {sid}"
        with self._calls.doing(doing, sid=sid):
            return self._watches.wait_for_file(sid, path, float(timeout), cancel, doing)

    # -- whole trees --------------------------------------------------------------------

    def upload(
        self,
        sandbox: SandboxRef,
        local_path: Union[str, os.PathLike[str]],
        remote_path: str,
        *,
        exclude: Iterable[str] = (),
        cancel: Optional[CancelToken] = None,
        progress: Optional[Progress] = None,
    ) -> TransferSummary:
        """Copy a local file or directory tree into the sandbox, as one tar stream.

        ``remote_path`` becomes the copy of ``local_path``: the file itself, or the
        directory (made if missing; what is already there and not in the upload stays).
        Files are owned by ``sandbox`` and keep their permission bits (under ``/skills``:
        root's, mode 0644); symbolic links are sent as links, never followed (here or in
        the sandbox: a link in the way in the sandbox is replaced, never written through).
        Each file goes to a temporary name in its own directory and is renamed into place
        when whole, so a cancelled, failed or interrupted upload leaves every file either
        as it was or wholly new. Two requests whatever the number of files; the content is
        read from disk as it is sent (memory stays flat). Nothing is read through a link:
        an entry replaced (by a link or anything else), removed or resized on this machine
        after it was listed is not sent, nor is what is below a directory so replaced.

        Args:
            sandbox: the handle or sandbox id.
            local_path: a file or directory on this machine.
            remote_path: an absolute, normalized sandbox path.
            exclude: ``fnmatch`` patterns (``*.pyc``, ``.git``, ``build/*``), matched against
                each entry's path relative to ``local_path`` and against its name; an
                excluded directory is not entered.
            cancel: cancels the call.
            progress: called as ``progress(done_bytes, total_bytes)`` as content is sent
                (on the calling thread).

        Returns:
            What was written.

        Takes at most 120 s plus one second per MiB of content.

        Raises:
            InvalidArgument: a bad argument, or ``local_path`` missing (before any I/O).
            FilesFailed: some entries could not be written, or were not sent (``.failed``
                says which and why; ``.summary`` what was written).
            CommandFailed: the upload failed as a whole (the sandbox has no ``python3``, a
                directory on the way is closed to the user, a ``/skills`` directory is
                writable by others...).
            OperationTimeout, SandboxPaused, TransportError, SandboxGoneError,
            ProviderClosed, Cancelled.
        """
        sid = self._calls.open_sandbox(sandbox)
        src, patterns = fa.upload_arguments(local_path, remote_path, exclude, progress)
        v.check_cancel(cancel)
        what = f"uploading {src} to {remote_path} in sandbox {sid}"
        with self._calls.doing(what, "some files may have been written", sid=sid):
            summary, errors = self._trees.upload(
                sid, src, remote_path, exclude=patterns, cancel=cancel, progress=progress
            )
        if errors:
            raise FilesFailed(what, fa.entry_failures(errors), summary=summary)
        return summary

    def download(
        self,
        sandbox: SandboxRef,
        remote_path: str,
        local_path: Union[str, os.PathLike[str]],
        *,
        exclude: Iterable[str] = (),
        max_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES,
        cancel: Optional[CancelToken] = None,
        progress: Optional[Progress] = None,
    ) -> TransferSummary:
        """Copy a sandbox file or directory tree to this machine, as one tar stream.

        ``local_path`` becomes the copy of ``remote_path`` (a directory is made if missing,
        merged into if it exists; a new one appears whole or not at all). What the
        ``sandbox`` user cannot read is reported, not copied. The sandbox is not trusted:
        nothing is ever written outside ``local_path`` (absolute names, ``..``, symbolic
        links to absolute paths or leading outside in the finished tree, and device files
        are refused by the rules of :mod:`tarfile`'s ``data`` filter and reported), and
        the transfer stops past ``max_bytes`` of content. One request whatever the number of
        files; memory stays flat.

        Args:
            sandbox: the handle or sandbox id.
            remote_path: an absolute, normalized sandbox path.
            local_path: where the copy goes on this machine.
            exclude: ``fnmatch`` patterns, as for :meth:`upload`.
            max_bytes: the most content accepted (default 10 GiB).
            cancel: cancels the call.
            progress: called as ``progress(done_bytes, total_bytes)`` (total as the sandbox
                counted it before sending) after each file.

        Returns:
            What was written.

        Takes at most 120 s plus one second per MiB of ``max_bytes``.

        Raises:
            InvalidArgument: a bad argument (before any I/O).
            FilesFailed: some entries were not copied (``.failed``; ``.summary``).
            CommandFailed: ``remote_path`` does not exist or cannot be read, the content is
                larger than ``max_bytes``, or the sandbox has no ``python3``.
            OSError: writing on this machine failed.
            OperationTimeout, SandboxPaused, TransportError, SandboxGoneError,
            ProviderClosed, Cancelled.
        """
        sid = self._calls.open_sandbox(sandbox)
        dst, patterns = fa.download_arguments(remote_path, local_path, exclude, max_bytes,
                                              progress)
        v.check_cancel(cancel)
        what = f"downloading {remote_path} from sandbox {sid} to {dst}"
        with self._calls.doing(what, "some files may have been written", sid=sid):
            summary, errors = self._trees.download(
                sid, remote_path, dst, exclude=patterns, max_bytes=max_bytes, cancel=cancel,
                progress=progress,
            )
        if errors:
            raise FilesFailed(what, fa.entry_failures(errors), summary=summary)
        return summary

    # -- ports ------------------------------------------------------------------------------

    def url(
        self, sandbox: SandboxRef, port: int, *, cancel: Optional[CancelToken] = None
    ) -> str:
        """The URL at which E2B serves ``port`` of the sandbox to the internet.

        On E2B it is ``https://{port}-{sandbox id}.{domain}`` (the sandbox's own domain when
        E2B answered one). With a configured ``sandbox_url`` (the emulator, a self-hosted
        edge) it has that URL's scheme and port: the emulator's is
        ``http://{port}-{id}.e2b.localhost:{emulator port}``, which a browser on this
        machine opens as it is (browsers resolve every ``*.localhost`` name to loopback;
        Python's resolver usually does not: use :meth:`forward` for plain HTTP clients).
        No path and no trailing slash: append the path.

        When the sandbox was created with ``SandboxLimits(public_traffic=False)``, every
        request must also carry :meth:`traffic_headers` (E2B answers 403 without them);
        :meth:`forward` adds them by itself.

        Whether something listens on the port is not checked: E2B answers 502 "The sandbox
        is running but port is not open" until it does. A server listening on the sandbox's
        loopback (``127.0.0.1``) or on every address is reached.

        Connects to the sandbox first when this provider has no lease on it (which resumes
        a paused sandbox); bounded like a file call.

        Raises:
            InvalidArgument: ``port`` is not from 1 to 65535 (before any I/O).
            SandboxGoneError, E2BHttpError, TransportError, ProviderClosed, Cancelled.
        """
        sid = self._calls.begin(sandbox, cancel, lambda: check_port(port))
        with self._calls.doing(f"finding the URL of port {port} of sandbox {sid}", sid=sid):
            return self._ports.url(sid, port, cancel)

    def traffic_headers(
        self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None
    ) -> Dict[str, str]:
        """The headers every request to a port of the sandbox (other than envd's) must carry.

        Empty for a sandbox whose traffic is public (the default). For one created with
        ``SandboxLimits(public_traffic=False)``: ``{"e2b-traffic-access-token": token}``.
        The token is a secret: it is never logged or shown in errors by this library; keep
        it out of yours. Connects first when cold (see :meth:`url`).

        Raises:
            SandboxGoneError, E2BHttpError, TransportError, ProviderClosed, Cancelled.
        """
        sid = self._calls.begin(sandbox, cancel)
        with self._calls.doing(f"reading the traffic headers of sandbox {sid}", sid=sid):
            return self._ports.traffic_headers(sid, cancel)

    @contextlib.contextmanager
    def forward(
        self,
        sandbox: SandboxRef,
        port: int,
        *,
        local_port: int = 0,
        max_connections: int = 256,
        idle_timeout: float = 300.0,
        cancel: Optional[CancelToken] = None,
        address: str = "127.0.0.1",
    ) -> Iterator[str]:
        """Serve ``port`` of the sandbox on this machine's loopback, for the ``with`` block.

        Yields a plain local URL, ``http://127.0.0.1:{local port}``, that ``curl``,
        ``requests`` and a browser on this machine can use: every connection to it is
        relayed to the sandbox's port through E2B's edge (or the emulator), HTTP/1.1 with
        streaming and chunked bodies, Server-Sent Events and WebSockets, the traffic token
        added when the sandbox's traffic is private. Responses (E2B's 502 when nothing
        listens yet, say) pass through unchanged. ::

            with provider.forward(sandbox, 8000) as url:
                print(requests.get(url + "/").text)

        One thread serves every forward of this provider (an event loop; no thread per
        connection). Leaving the block, :meth:`close`, or Ctrl-C while in it closes the
        listener and its connections.

        Args:
            sandbox: the sandbox (handle or id).
            port: the port inside the sandbox (1-65535).
            local_port: the local port to listen on (0, the default: any free port).
            max_connections: connections open at once (more are answered 503).
            idle_timeout: seconds after which a connection with no traffic either way is
                closed.
            cancel: cancels the set-up (not the forward once it is open).
            address: the local address to listen on, an IP address or ``localhost``, as
                ``kubectl port-forward --address`` takes it. ``0.0.0.0`` (or ``::``) serves
                the port to every machine that reaches this one, with the sandbox's
                traffic token added when its traffic is private: choose it knowingly. The
                URL yielded is then the loopback's.

        Raises:
            InvalidArgument: a bad argument (before any I/O), or ``local_port`` taken.
            SandboxGoneError, E2BHttpError, TransportError, ProviderClosed, Cancelled.
        """
        sid = self._calls.open_sandbox(sandbox)
        limits = forward_limits(port, local_port, max_connections, idle_timeout)
        listen = listen_address(address)
        v.check_cancel(cancel)
        with self._calls.doing(f"forwarding port {port} of sandbox {sid}", sid=sid):
            opened = self._ports.forward(sid, port, local_port, limits, cancel, listen)
        try:
            yield opened.url
        finally:
            opened.close()

    # -- the code interpreter -------------------------------------------------------------

    def run_code(
        self,
        sandbox: SandboxRef,
        code: str,
        *,
        language: str = "python",
        context: Union[CodeContext, str, None] = None,
        timeout: float = DEFAULT_EXEC_TIMEOUT_SECONDS,
        env: Optional[Mapping[str, str]] = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        cancel: Optional[CancelToken] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        on_result: Optional[ResultCallback] = None,
    ) -> Execution:
        """Run a cell of code in the sandbox's code interpreter (a Jupyter kernel that keeps
        its state between calls), as E2B's Code Interpreter does.

        The sandbox must come from a template with E2B's code-interpreter server on port
        49999: ``create(name, template="code-interpreter-v1")``, on E2B or on the emulator.
        One round trip: ``POST /execute``, its lines read as they come. ::

            ex = provider.run_code(sandbox, "x = 41\nx + 1")
            ex.text                  # '42'
            provider.run_code(sandbox, "x").text   # '41': variables stay

        Stopping: when ``timeout`` passes (counted from the moment the server took the code)
        or ``cancel`` fires, the kernel is interrupted (its variables are kept) and the call
        returns an :class:`~e2b_provider.Execution` with ``timed_out`` or ``cancelled`` set
        and what came before. Before it returns, the context answers an empty execution
        within 2 s, or its kernel is restarted (``restarted=True``, its state lost): the next
        call in that context never waits on a stuck kernel. Ctrl-C (a notebook's interrupt
        button) does the same, then raises ``KeyboardInterrupt``.

        Bounds: opening the stream takes at most 30 s (plus connecting a cold sandbox, at
        most 120 s); then the call ends within ``timeout`` + 2 s, plus a kernel's restart
        (at most 60 s) when it had to be restarted. A server silent for 20 s (it sends a
        keepalive every 5 s) ends it with ``TransportTimeout``.

        Args:
            sandbox: the handle or sandbox id.
            code: the code (Python, or the language's).
            language: the kernel's language: ``"python"`` (default) or ``"bash"`` on the
                emulator; E2B's template also has ``"javascript"``, ``"r"``, ``"java"``.
                Runs in that language's default context. Ignored when ``context`` is given.
            context: a :class:`~e2b_provider.CodeContext` (or its id) from
                :meth:`create_code_context`: runs there instead.
            timeout: seconds the code may run (default 60; at most 86400).
            env: environment variables for this run only (names are identifiers; values
                without quotes, backslashes or line breaks, which E2B's server cannot carry).
            max_output_bytes: the budget stdout and stderr share (default 1 MiB, in UTF-8);
                output past it is read and dropped, and ``truncated`` is set. Results are
                kept whole.
            cancel: stops the run from any thread (``cancelled=True``).
            on_stdout: called on this thread with standard output as it comes (only output
                inside ``max_output_bytes``).
            on_stderr: the same for standard error.
            on_result: called with each :class:`~e2b_provider.Result` as it comes
                (``IPython.display.display`` shows them live in a notebook).

        Returns:
            The :class:`~e2b_provider.Execution`. An exception in the code is its ``error``,
            not a raise.

        Raises:
            InvalidArgument: a bad argument (before any I/O).
            E2BHttpError: the server refused (404: no such context; 502: nothing listens on
                port 49999: the sandbox is not a code-interpreter one).
            SandboxGoneError, TransportError, ProtocolError, ProviderClosed, Cancelled
            (``cancel`` fired before the code was sent).
            KeyboardInterrupt: re-raised once the kernel was interrupted (bounded).
            Exception: whatever a callback raised, once the kernel was interrupted.
        """
        sid = self._calls.open_sandbox(sandbox)
        lang = check_language(language)
        cid = check_context(context) if context is not None else None
        v.check_text(code, "code", max_bytes=MAX_CODE_BYTES)
        run_timeout = v.check_timeout(timeout)
        ca.check_callbacks(on_stdout=on_stdout, on_stderr=on_stderr)
        if on_result is not None and not callable(on_result):
            raise InvalidArgument("on_result must be a callable taking a Result, or None")
        v.check_max_bytes(max_output_bytes, "max_output_bytes")
        check_env_vars(env)
        v.check_cancel(cancel)
        run = functools.partial(
            self._code.run_code, sid, code, language=lang, context_id=cid, timeout=run_timeout,
            env=env, max_output_bytes=max_output_bytes, cancel=cancel, on_stdout=on_stdout,
            on_stderr=on_stderr, on_result=on_result,
        )
        lost = "the code may or may not have run (its result was lost)"
        with self._calls.doing(f"running code in sandbox {sid}", lost, sid=sid):
            return run()

    def create_code_context(
        self,
        sandbox: SandboxRef,
        *,
        language: str = "python",
        cwd: Optional[str] = None,
        cancel: Optional[CancelToken] = None,
    ) -> CodeContext:
        """Start a new code context: a kernel of its own (its own variables), in ``cwd``.

        Args:
            sandbox: the handle or sandbox id.
            language: the kernel's language (``"python"``, ``"bash"``, ...).
            cwd: its working directory (default ``/home/user``).
            cancel: cancels the call.

        Raises:
            InvalidArgument: a bad argument (before any I/O).
            E2BHttpError: the server could not start the kernel (500), or it is not there.
            SandboxGoneError, TransportError, ProtocolError, ProviderClosed, Cancelled.
        """
        sid = self._calls.begin(sandbox, cancel)
        lang = check_language(language)
        if cwd is not None:
            v.check_path(cwd)
        with self._calls.doing(f"creating a code context in sandbox {sid}", sid=sid):
            return self._code.create_context(sid, lang, cwd, cancel)

    def code_contexts(
        self, sandbox: SandboxRef, *, cancel: Optional[CancelToken] = None
    ) -> List[CodeContext]:
        """Every code context of the sandbox (the default ones too), oldest first.

        Raises:
            SandboxGoneError, E2BHttpError, TransportError, ProtocolError, ProviderClosed,
            Cancelled.
        """
        sid = self._calls.begin(sandbox, cancel)
        with self._calls.doing(f"listing the code contexts of sandbox {sid}", sid=sid):
            return self._code.contexts(sid, cancel)

    def restart_code_context(
        self,
        sandbox: SandboxRef,
        context: Union[CodeContext, str],
        *,
        cancel: Optional[CancelToken] = None,
    ) -> None:
        """Restart a context's kernel: its variables are lost, its id stays.

        Raises:
            InvalidArgument: ``context`` is neither a CodeContext nor an id (before any I/O).
            NotFound: no such context.
            SandboxGoneError, E2BHttpError, TransportError, ProviderClosed, Cancelled.
        """
        self._on_context(sandbox, context, cancel, "restarting", self._code.restart_context)

    def remove_code_context(
        self,
        sandbox: SandboxRef,
        context: Union[CodeContext, str],
        *,
        cancel: Optional[CancelToken] = None,
    ) -> None:
        """Stop a context's kernel for good.

        Raises:
            InvalidArgument: ``context`` is neither a CodeContext nor an id (before any I/O).
            NotFound: no such context.
            SandboxGoneError, E2BHttpError, TransportError, ProviderClosed, Cancelled.
        """
        self._on_context(sandbox, context, cancel, "removing", self._code.remove_context)

    def _on_context(
        self,
        sandbox: SandboxRef,
        context: Union[CodeContext, str],
        cancel: Optional[CancelToken],
        doing: str,
        call: Callable[[str, str, Optional[CancelToken]], None],
    ) -> None:
        """One call on one code context (its arguments checked before any I/O)."""
        sid = self._calls.begin(sandbox, cancel)
        cid = check_context(context)
        with self._calls.doing(f"{doing} code context {cid} of sandbox {sid}", sid=sid):
            call(sid, cid, cancel)
