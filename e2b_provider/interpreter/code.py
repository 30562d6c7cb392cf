"""The provider's part for the code interpreter: ``run_code`` and the code contexts.

A run is one round trip: ``POST /execute`` to the sandbox's code-interpreter server (port
49999 of a ``code-interpreter-v1`` sandbox, through E2B's edge), its lines read on the
calling thread as they come (:mod:`.collect`: the output cap, the callbacks). What stops a
run early — its timeout (a watchdog timer from the moment the stream is open), the cancel
token, Ctrl-C or a callback that raised — resets the stream's connection (an RST, so that
no proxy takes it for a half-close; see :meth:`Stream.reset_if_stopped`), which makes the
server interrupt the kernel (its state is kept). The run then makes sure the context is free again
before it returns or raises (:meth:`CodeInterpreter.settle`): an empty execution in the same
context must end within :data:`SETTLE_SECONDS`; if it does not, the kernel is restarted
(``POST /contexts/{id}/restart``) and the outcome says ``restarted=True``. So the next run in
that context answers at once, and no call waits on a stuck kernel (E2B's own client leaves
it running). No extra thread: the timer is the shared watchdog's.
"""

from __future__ import annotations

import re
import threading
from typing import Callable, List, Mapping, Optional, Tuple, TypeVar, Union

from .._watchdog import Watchdog
from ..cancel import CancelToken, Deadline
from ..clients.code_interpreter import CodeInterpreterClient
from ..core.context import ProviderContext
from ..core.messages import mark_worded
from ..errors import E2BHttpError, E2BProviderError, InvalidArgument, ProtocolError, TransportError
from ..models import Target
from ..protocol.code_output import (
    CODE_INTERPRETER_PORT,
    OutputDecoder,
    context_body,
    execute_body,
)
from ..transport.stream import Stream
from .collect import ExecutionCollector, ResultCallback, TextCallback
from .results import CodeContext, Execution

__all__ = [
    "OPEN_SECONDS",
    "SETTLE_SECONDS",
    "CodeInterpreter",
    "check_context",
    "check_language",
    "no_server",
]

#: The longest the opening of ``/execute`` may take (until the server's answer headers).
OPEN_SECONDS = 30.0
#: How long each read may wait: the server sends a keepalive line every 5 s of quiet.
READ_SECONDS = 20.0
#: How long an interrupted context has to answer an empty execution before its kernel is
#: restarted.
SETTLE_SECONDS = 2.0
#: The bound of a context call (create, list, remove) and of a restart (a kernel's start).
CONTEXT_CALL_SECONDS = 60.0
#: The extra lease a run asks for beyond its timeout (the settling, a restart).
LEASE_MARGIN_SECONDS = 120.0

_LANGUAGE = re.compile(r"[A-Za-z][A-Za-z0-9_+-]{0,31}")
_CONTEXT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

ContextRef = Union[CodeContext, str]
_T = TypeVar("_T")


def no_server(exc: E2BHttpError) -> bool:
    """Whether ``exc`` is E2B's answer for a sandbox port nobody listens on: the sandbox has
    no code interpreter."""
    return exc.status == 502 and "port is not open" in exc.message


def check_language(language: object) -> str:
    """A kernel language name (``python``, ``bash``, ...), lower-cased.

    Raises:
        InvalidArgument: not a short name of letters, digits, ``_``, ``+`` or ``-``.
    """
    if not isinstance(language, str) or _LANGUAGE.fullmatch(language) is None:
        raise InvalidArgument(
            f"invalid language {language!r}: a kernel's name such as 'python' or 'bash'"
        )
    return language.lower()


def check_context(context: object) -> str:
    """The id of a :class:`CodeContext` or of a context id.

    Raises:
        InvalidArgument: neither, or an id that could not be one (it goes into a URL path).
    """
    cid = context.id if isinstance(context, CodeContext) else context
    if not isinstance(cid, str) or _CONTEXT_ID.fullmatch(cid) is None:
        raise InvalidArgument(
            f"invalid context {context!r}: a CodeContext or its id (letters, digits, '_', "
            "'.', '-')"
        )
    return cid


class _Stop:
    """Why a run was stopped early (``"timeout"`` or ``"cancel"``), set once from any
    thread; stopping closes the run's stream so its reader wakes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason: Optional[str] = None
        self._stream: Optional[Stream] = None

    def watch(self, stream: Stream) -> None:
        with self._lock:
            self._stream = stream
            stopped = self.reason is not None
        if stopped:
            stream.abort()

    def fire(self, reason: str) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            stream = self._stream
        if stream is not None:
            stream.abort()


class CodeInterpreter:
    """The code-interpreter calls of the provider.

    Args:
        ctx: the provider's shared context (config, transport, watchdog, leases).
    """

    def __init__(self, ctx: ProviderContext) -> None:
        self._ctx = ctx

    def _client(self, target: Target) -> CodeInterpreterClient:
        return CodeInterpreterClient(self._ctx.transport, target, self._ctx.config.sandbox_url)

    def _on_target(self, sid: str, cancel: Optional[CancelToken],
                   fn: Callable[[Target], _T], need: float) -> _T:
        """``fn(target)``; E2B's 502 for a port nobody listens on says what it means here."""
        try:
            return self._ctx.on_target(sid, cancel, fn, need=need)
        except E2BHttpError as exc:
            if no_server(exc):
                exc.args = (
                    f"sandbox {sid} has no code interpreter: nothing listens on its port "
                    f"{CODE_INTERPRETER_PORT} (E2B answered HTTP 502: {exc.message}); create "
                    "the sandbox from the template 'code-interpreter-v1' "
                    "(DeploymentConfig(..., template='code-interpreter-v1'))",
                )
                mark_worded(exc)
            raise

    def _on_client(
        self,
        sid: str,
        cancel: Optional[CancelToken],
        fn: Callable[[CodeInterpreterClient], _T],
        need: float = CONTEXT_CALL_SECONDS,
    ) -> _T:
        return self._on_target(sid, cancel, lambda t: fn(self._client(t)), need)

    # -- runs -------------------------------------------------------------------------------

    def run_code(
        self,
        sid: str,
        code: str,
        *,
        language: Optional[str],
        context_id: Optional[str],
        timeout: float,
        env: Optional[Mapping[str, str]],
        max_output_bytes: int,
        cancel: Optional[CancelToken],
        on_stdout: Optional[TextCallback],
        on_stderr: Optional[TextCallback],
        on_result: Optional[ResultCallback],
    ) -> Execution:
        """Run ``code`` (arguments checked by the caller); see the module doc."""
        body = execute_body(code, context_id=context_id,
                            language=None if context_id is not None else language, env=env)
        collector = ExecutionCollector(max_output_bytes, on_stdout, on_stderr, on_result)

        def opened(client: CodeInterpreterClient) -> Tuple[CodeInterpreterClient, Stream]:
            return client, client.execute(
                body, read_timeout=READ_SECONDS, cancel=cancel,
                open_deadline=Deadline.after(OPEN_SECONDS),
            )

        client, stream = self._on_target(
            sid, cancel, lambda t: opened(self._client(t)), timeout + LEASE_MARGIN_SECONDS
        )
        stop = _Stop()
        timer = self._ctx.watchdog.call_later(timeout, lambda: stop.fire("timeout"))
        unhook: Optional[Callable[[], None]] = None
        if cancel is not None:
            unhook = cancel.on_cancel(lambda _reason: stop.fire("cancel"))
        stream.reset_if_stopped()
        stop.watch(stream)
        try:
            ended = _read(stream, collector, stop)
        except BaseException:  # Ctrl-C, a callback's exception, a broken stream
            stream.abort()
            if stop.reason is None:
                self.settle(client, context_id, language, quiet=True)
            raise
        finally:
            timer.cancel()
            if unhook is not None:
                unhook()
            stream.close()
        if stop.reason is not None:
            restarted = self.settle(client, context_id, language)
            return collector.execution(timed_out=stop.reason == "timeout",
                                       cancelled=stop.reason == "cancel", restarted=restarted)
        if not ended:
            raise ProtocolError("code interpreter: the execution's stream ended before its "
                                "end_of_execution line")
        return collector.execution()

    def settle(
        self,
        client: CodeInterpreterClient,
        context_id: Optional[str],
        language: Optional[str],
        *,
        quiet: bool = False,
    ) -> bool:
        """After a run was stopped: wait (at most :data:`SETTLE_SECONDS`) until its context
        runs an empty execution; if it does not, restart the context's kernel. Returns True
        when it was restarted. ``quiet``: failures are swallowed (an exception is already on
        its way up)."""
        probe = execute_body("", context_id=context_id,
                             language=None if context_id is not None else language)
        try:
            if _answers(client, probe, self._ctx.watchdog):
                return False
            cid = context_id or _default_context(client, language or "python")
            client.restart(cid, timeout=CONTEXT_CALL_SECONDS, cancel=None)
            return True
        except E2BProviderError:
            if quiet:
                return False
            raise

    # -- contexts ---------------------------------------------------------------------------

    def create_context(
        self, sid: str, language: str, cwd: Optional[str], cancel: Optional[CancelToken]
    ) -> CodeContext:
        """``POST /contexts``: a new context (its own kernel)."""
        body = context_body(language, cwd)
        cid, lang, where = self._on_client(
            sid, cancel,
            lambda c: c.create_context(body, timeout=CONTEXT_CALL_SECONDS, cancel=cancel),
        )
        return CodeContext(id=cid, language=lang, cwd=where)

    def contexts(self, sid: str, cancel: Optional[CancelToken]) -> List[CodeContext]:
        """``GET /contexts``: every context, oldest first."""
        found = self._on_client(
            sid, cancel, lambda c: c.contexts(timeout=CONTEXT_CALL_SECONDS, cancel=cancel)
        )
        return [CodeContext(id=i, language=lang, cwd=cwd) for i, lang, cwd in found]

    def restart_context(self, sid: str, cid: str, cancel: Optional[CancelToken]) -> None:
        """``POST /contexts/{id}/restart``."""
        self._on_client(
            sid, cancel, lambda c: c.restart(cid, timeout=CONTEXT_CALL_SECONDS, cancel=cancel)
        )

    def remove_context(self, sid: str, cid: str, cancel: Optional[CancelToken]) -> None:
        """``DELETE /contexts/{id}``."""
        self._on_client(
            sid, cancel, lambda c: c.remove(cid, timeout=CONTEXT_CALL_SECONDS, cancel=cancel)
        )


def _read(stream: Stream, collector: ExecutionCollector, stop: _Stop) -> bool:
    """Read the run's lines into ``collector`` until the end line (True), the body's end
    without it (False), or a stop (False). The callbacks run here."""
    decoder = OutputDecoder()
    while not decoder.ended:
        try:
            chunk = stream.read1()
        except TransportError:
            if stop.reason is not None:
                return False
            raise
        if not chunk:
            for event in decoder.finish():
                collector.add(event)
            return decoder.ended
        for event in decoder.feed(chunk):
            collector.add(event)
    return True


def _answers(client: CodeInterpreterClient, probe: bytes, watchdog: Watchdog) -> bool:
    """Whether the context runs ``probe`` to its end within :data:`SETTLE_SECONDS`."""
    deadline = Deadline.after(SETTLE_SECONDS)
    try:
        stream = client.execute(probe, read_timeout=SETTLE_SECONDS, cancel=None,
                                open_deadline=deadline)
    except (TransportError, E2BHttpError):
        return False
    stream.reset_if_stopped()
    timer = watchdog.call_later(max(0.0, deadline.remaining()), stream.abort)
    try:  # its output is dropped (a budget of 0); the timer's abort is a TransportError
        return _read(stream, ExecutionCollector(0), _Stop())
    except (TransportError, ProtocolError):
        return False
    finally:
        timer.cancel()
        stream.close()


def _default_context(client: CodeInterpreterClient, language: str) -> str:
    """The id of ``language``'s default context: the server made it first of that language
    (the Python one at its start, another on its first run), so it is listed first."""
    for cid, lang, _cwd in client.contexts(timeout=CONTEXT_CALL_SECONDS, cancel=None):
        if lang == language:
            return cid
    raise ProtocolError(f"code interpreter: no {language} context to restart")

