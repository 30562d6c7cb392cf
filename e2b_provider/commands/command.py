"""The handle of a background command, and what ``commands`` lists.

This module owns :class:`Command`, the handle ``start`` and ``attach`` return (a handle, not
a thread: every call on it goes to
:class:`~e2b_provider.commands.background.Background`), :class:`CommandInfo` (a command or
terminal that runs, as ``commands`` lists it) and :class:`CommandOutput` (what a command
printed, as far as the sandbox keeps it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Union

import attrs

from ..cancel import CancelToken
from ..core.messages import describe
from ..errors import CommandFailed, InvalidArgument
from ..models import Displayed, ExecResult
from ..protocol import validate as v
from ..protocol.command_records import (
    KeptOutput,
    command_id,
    decode_tail,
    tag_of_control_path,
)
from ..protocol.scripts import SANDBOX_USER
from .arguments import check_callbacks, check_wait_timeout

if TYPE_CHECKING:
    from .background import Background

__all__ = ["MAX_KEPT", "Command", "CommandInfo", "CommandOutput", "OnText"]

#: A live-output callback (decoded text, on the waiting thread).
OnText = Callable[[str], None]
#: The most output of one stream a follower holds (``start`` accepts no larger cap).
MAX_KEPT = 1 << 30


@attrs.frozen
class CommandInfo(Displayed):
    """A background command or a terminal that still runs (see ``commands``).

    Attributes:
        id: the command's id (for ``attach``, from any process).
        pid: its process id in the sandbox (its supervisor's, which envd knows; a
            terminal's own).
        tag: the tag it was started with, or None (always None for a terminal).
        command: the shell command line ("" for a terminal running the login shell).
        started_at: when it started, in seconds since the epoch (the sandbox's clock).
        kind: ``"command"`` (started with ``start``) or ``"terminal"`` (opened with
            ``terminal``).
    """

    id: str
    pid: int
    tag: Optional[str]
    command: str
    started_at: float
    kind: str = "command"


@attrs.frozen
class CommandOutput(Displayed):
    """What a background command printed, as far as the sandbox keeps it.

    Attributes:
        stdout: the last ``max_output_bytes`` of standard output, decoded as UTF-8.
        stderr: likewise for standard error.
        truncated: True when earlier output was dropped (either stream).
    """

    _TEXT_FIELDS = ("stdout", "stderr")

    stdout: str
    stderr: str
    truncated: bool



class Command:
    """A command started with ``start`` (or found with ``attach``) that may still run.

    A handle, not a thread: nothing runs in this process while nobody calls it. The
    sandbox keeps the command's output (the last ``max_output_bytes`` of stdout and,
    separately, of stderr) and its exit status until the sandbox is destroyed, so any
    process can :meth:`wait` for it, read its :meth:`output`, or stop it.

    Attributes:
        id: a string naming the command in any process (``<sandbox id>:<32 hex>``; a
            root command's is ``<sandbox id>:root-<32 hex>``).
        sandbox_id: the sandbox it runs in.
        pid: its process id in the sandbox (envd's: its supervisor's).
        tag: the tag it was started with, or None.
        command: the shell command line.
        started_at: when it started, in seconds since the epoch (the sandbox's clock).
        stdin: whether it was started with a standard input (``stdin=True``).
    """

    def __init__(self, owner: Background, sid: str, cid: str, meta: Dict[str, Any],
                 *, live: bool = True, user: str = SANDBOX_USER) -> None:
        self._owner = owner
        self.sandbox_id = sid
        self._cid = cid
        self._user = user  # whose record it is: root's is read and killed as root
        self.id = command_id(sid, cid, user)
        try:
            self.pid = int(meta["pid"])
            self._ctl = str(meta.get("ctl", ""))
            self.command = str(meta.get("command", ""))
            self.started_at = float(meta.get("started_at", 0.0))
            # the record is the sandbox user's: a cap past what start accepts is not believed
            self._cap = max(1024, min(int(meta.get("cap", 1 << 20)), MAX_KEPT))
        except (KeyError, TypeError, ValueError):
            raise CommandFailed(f"the record of command {self.id} is damaged") from None
        self.tag = tag_of_control_path(self._ctl)
        self.stdin = meta.get("stdin") is True
        # supervisor.sh writes no live frames: a follower reads the record instead
        self._frames = meta.get("supervisor") != "sh"
        self._stdin_closed = False
        # whether its pid and control path are envd's (start, or attach while it ran):
        # else they are only the record's word, which the sandbox user can write, so
        # nothing is sent to them (the command ended before attach found it)
        self._live = live

    def __repr__(self) -> str:
        return f"Command(id={self.id!r}, pid={self.pid}, tag={self.tag!r})"

    @property
    def running(self) -> bool:
        """Whether the command still runs (asks the sandbox: one request; none for a
        command that had ended when :meth:`~e2b_provider.E2BSandboxProvider.attach` found
        it)."""
        if not self._live:
            return False  # envd ran no supervisor of it when attach looked
        with describe(f"asking whether command {self.id} runs"):
            return self._owner.read(self.sandbox_id, self._cid, 0, 0, 0, None,
                                    user=self._user).alive

    def output(self, *, cancel: Optional[CancelToken] = None) -> CommandOutput:
        """What the command printed so far (the last ``max_output_bytes`` of each stream).

        Raises:
            CommandNotFound: the record is gone (the sandbox was replaced).
            InvalidArgument: ``cancel`` is not a CancelToken (before any I/O).
            Cancelled, SandboxGoneError, E2BProviderError.
        """
        v.check_cancel(cancel)
        with describe(f"reading the output of command {self.id}"):
            r = self._owner.read(self.sandbox_id, self._cid, -1, -1, self._cap, cancel,
                                 user=self._user)
        out, err = KeptOutput(self._cap), KeptOutput(self._cap)
        out.reset(r.out[0], r.out[2])
        err.reset(r.err[0], r.err[2])
        return CommandOutput(decode_tail(out.data, out.cut), decode_tail(err.data, err.cut),
                             out.cut or err.cut)

    def wait(
        self,
        timeout: Optional[float] = None,
        *,
        cancel: Optional[CancelToken] = None,
        on_stdout: Optional[OnText] = None,
        on_stderr: Optional[OnText] = None,
    ) -> ExecResult:
        """Wait for the command to end, following its output.

        ``on_stdout`` / ``on_stderr`` get the output the sandbox still keeps first (from the
        start, for a command that printed less than ``max_output_bytes``), then the output
        as it comes, on the calling thread, decoded incrementally.

        Stopping the wait never stops the command: when ``timeout`` passes,
        :class:`~e2b_provider.OperationTimeout` is raised; when ``cancel`` fires,
        :class:`~e2b_provider.Cancelled`; on Ctrl-C, ``KeyboardInterrupt`` is raised as
        usual. The command goes on in each case (:meth:`kill` stops it).

        Args:
            timeout: the longest to wait, in seconds (None: until it ends).
            cancel: stops the wait from any thread.
            on_stdout: called with standard output text as it arrives.
            on_stderr: the same for standard error.

        Returns:
            The :class:`~e2b_provider.ExecResult`: ``exit_code`` (None when it timed out,
            was killed with :meth:`kill`, or its end was not recorded because the sandbox
            restarted or its supervisor was killed), the last ``max_output_bytes`` of
            stdout and of stderr (``truncated`` when earlier output was dropped),
            ``timed_out`` (its own ``timeout`` fired), ``cancelled`` (:meth:`kill` stopped it).

        Raises:
            OperationTimeout: ``timeout`` passed; the command still runs.
            Cancelled: ``cancel`` fired; the command still runs.
            CommandNotFound: the record is gone.
            SandboxGoneError, E2BProviderError.
        """
        check_wait_timeout(timeout)
        check_callbacks(on_stdout, on_stderr)
        v.check_cancel(cancel)
        with describe(f"waiting for command {self.id}"):
            return self._owner.follow(self, timeout, cancel, on_stdout, on_stderr)

    def send_stdin(self, data: Union[bytes, str], *, cancel: Optional[CancelToken] = None) -> None:
        """Write ``data`` (``str`` as UTF-8) to the command's standard input.

        Raises:
            InvalidArgument: not started with ``stdin=True``, its input already closed, or
                ``data`` not bytes or str (before any I/O).
            CommandEnded: the command has ended, or its input is closed (by
                :meth:`close_stdin` elsewhere, or by the command).
            Cancelled, SandboxGoneError, E2BProviderError.
        """
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument("data must be bytes or str")
        self._check_stdin()
        v.check_cancel(cancel)
        with describe(f"sending input to command {self.id}"):
            self._owner.send_stdin(self, bytes(data), cancel)

    def close_stdin(self, *, cancel: Optional[CancelToken] = None) -> None:
        """Close the command's standard input (it reads end of file). Closing it again, or
        after the command ended, does nothing.

        Raises:
            InvalidArgument: not started with ``stdin=True`` (before any I/O).
            Cancelled, SandboxGoneError, E2BProviderError.
        """
        if not self.stdin:
            raise InvalidArgument(f"command {self.id} was started without stdin=True")
        v.check_cancel(cancel)
        if self._stdin_closed:
            return
        with describe(f"closing the input of command {self.id}"):
            self._owner.close_stdin(self, cancel)
        self._stdin_closed = True

    def kill(self, *, cancel: Optional[CancelToken] = None) -> None:
        """Stop the command and its whole process tree (as a timed-out exec is stopped).
        Its end is then recorded as ``cancelled``. Killing an ended command does nothing.

        Raises:
            InvalidArgument: ``cancel`` is not a CancelToken (before any I/O).
            CommandFailed: the kill script failed.
            Cancelled, SandboxGoneError, E2BProviderError.
        """
        v.check_cancel(cancel)
        with describe(f"killing command {self.id}"):
            self._owner.kill(self, cancel)

    def _check_stdin(self) -> None:
        if not self.stdin:
            raise InvalidArgument(f"command {self.id} was started without stdin=True")
        if self._stdin_closed:
            raise InvalidArgument(f"the standard input of command {self.id} was closed")
