"""One execution's outcome as its lines arrive: the output cap, the callbacks, the result.

:class:`ExecutionCollector` takes the decoded events of ``POST /execute``
(:mod:`e2b_provider.protocol.code_output`) one at a time: stdout and stderr share one byte
budget as ``exec``'s output does (kept in arrival order, the piece that crosses the cap cut
at a character boundary, later pieces dropped and ``truncated`` set), rich results and the
error are kept whole, and each piece kept is handed to the caller's callbacks as it comes.
:meth:`ExecutionCollector.execution` builds the frozen
:class:`~e2b_provider.interpreter.results.Execution`. No I/O and no threads: the run's reader
thread feeds it.
"""

from __future__ import annotations

from typing import Callable, List, Optional, TypeVar

from ..core.interrupts import calls_user_code
from ..protocol.code_output import CodeCount, CodeEnd, CodeError, CodeEvent, CodeResult, CodeStream
from ..protocol.process_events import LiveText, OutputBudget
from .results import Execution, ExecutionError, Result, error_from_event, result_from_event

__all__ = ["ExecutionCollector"]

_A = TypeVar("_A")
TextCallback = Callable[[str], None]
ResultCallback = Callable[[Result], None]


class ExecutionCollector:
    """What one execution produced so far (see the module doc).

    Args:
        max_output_bytes: the budget stdout and stderr share, in UTF-8 bytes.
        on_stdout: called with each piece of standard output kept.
        on_stderr: the same for standard error.
        on_result: called with each rich result.
    """

    def __init__(
        self,
        max_output_bytes: int,
        on_stdout: Optional[TextCallback] = None,
        on_stderr: Optional[TextCallback] = None,
        on_result: Optional[ResultCallback] = None,
    ) -> None:
        self._budget = OutputBudget(max_output_bytes)
        self._out = LiveText()
        self._err = LiveText()
        self._stdout: List[str] = []
        self._stderr: List[str] = []
        self._results: List[Result] = []
        self._error: Optional[ExecutionError] = None
        self._count: Optional[int] = None
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._on_result = on_result
        self.ended = False

    def add(self, event: CodeEvent) -> None:
        """Take one event; calls the matching callback (whatever it raises goes up)."""
        if isinstance(event, CodeStream):
            self._text(event)
        elif isinstance(event, CodeResult):
            result = result_from_event(event)
            self._results.append(result)
            if self._on_result is not None:
                _call(self._on_result, result)
        elif isinstance(event, CodeError):
            if self._error is None:  # the first is the code's; later ones are the server's
                self._error = error_from_event(event)
        elif isinstance(event, CodeCount):
            self._count = event.count
        elif isinstance(event, CodeEnd):
            self.ended = True

    def _text(self, event: CodeStream) -> None:
        data = event.text.encode("utf-8", errors="surrogatepass")
        if event.name == "stderr":
            piece = self._err.feed(self._budget.add_stderr(data))
            kept, callback = self._stderr, self._on_stderr
        else:
            piece = self._out.feed(self._budget.add_stdout(data))
            kept, callback = self._stdout, self._on_stdout
        if piece:
            kept.append(piece)
            if callback is not None:
                _call(callback, piece)

    @property
    def truncated(self) -> bool:
        """True once output was dropped past the cap."""
        return self._budget.truncated

    def execution(
        self, *, timed_out: bool = False, cancelled: bool = False, restarted: bool = False
    ) -> Execution:
        """The outcome so far, as a frozen value (the text pieces held back by the decoders,
        a partial character at the cap, decoded as ``exec`` decodes them)."""
        truncated = self._budget.truncated
        stdout = "".join(self._stdout) + self._out.finish(truncated)
        stderr = "".join(self._stderr) + self._err.finish(truncated)
        self._stdout, self._stderr = [stdout], [stderr]
        return Execution(
            results=tuple(self._results),
            stdout=stdout,
            stderr=stderr,
            error=self._error,
            execution_count=self._count,
            timed_out=timed_out,
            cancelled=cancelled,
            restarted=restarted,
            truncated=truncated,
        )


@calls_user_code
def _call(callback: Callable[[_A], None], value: _A) -> None:
    """Call the caller's ``callback`` (a Ctrl-C's traceback keeps the frames below here)."""
    callback(value)
