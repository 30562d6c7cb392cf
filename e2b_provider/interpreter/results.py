"""What a code interpreter hands out: :class:`Result`, :class:`ExecutionError`,
:class:`Execution` and :class:`CodeContext`, built from the decoded wire events.

Values only (frozen): no I/O. A result's images are bytes (the wire's base64 decoded once,
here); every value displays itself in IPython and Jupyter (``_repr_mimebundle_``), so a
notebook cell that ends in a ``run_code`` call shows its figures and tables.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import attrs

from ..errors import ProtocolError
from ..protocol.code_output import CodeError, CodeResult

__all__ = [
    "CodeContext",
    "Execution",
    "ExecutionError",
    "Result",
    "error_from_event",
    "result_from_event",
    "strip_ansi",
]

#: The MIME type of each of a result's fields (as Jupyter names them).
_MIME: Tuple[Tuple[str, str], ...] = (
    ("text", "text/plain"),
    ("html", "text/html"),
    ("markdown", "text/markdown"),
    ("svg", "image/svg+xml"),
    ("png", "image/png"),
    ("jpeg", "image/jpeg"),
    ("pdf", "application/pdf"),
    ("latex", "text/latex"),
    ("json", "application/json"),
    ("javascript", "application/javascript"),
    ("data", "e2b/data"),
    ("chart", "e2b/chart"),
)
_BINARY = ("png", "jpeg", "pdf")
#: E2B's data types under the names a notebook can save them by: a notebook keeps an object
#: (not text) only for a JSON MIME type (``application/...+json``).
_SHOWN_AS = {
    "e2b/data": "application/vnd.e2b.data+json",
    "e2b/chart": "application/vnd.e2b.chart+json",
}
_JSON_MIME = re.compile(r"application/(.+\+)?json")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
#: How much of a text a ``repr`` shows.
_REPR_TEXT = 60


def _filtered(
    bundle: Dict[str, Any], include: Optional[Iterable[str]], exclude: Optional[Iterable[str]]
) -> Dict[str, Any]:
    """``bundle`` with only the MIME types IPython asked for (``include``), less ``exclude``."""
    wanted = set(include) if include is not None else None
    dropped = set(exclude) if exclude is not None else set()
    return {
        mime: value
        for mime, value in bundle.items()
        if (wanted is None or mime in wanted) and mime not in dropped
    }


def _short(text: str) -> str:
    return text if len(text) <= _REPR_TEXT else text[: _REPR_TEXT - 1] + "…"


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (Jupyter's tracebacks carry them)."""
    return _ANSI.sub("", text)


@attrs.frozen(repr=False)
class Result:
    """One rich output of a cell: its value (``is_main_result``) or a display call's.

    Every field is None when the kernel did not give that format.

    Attributes:
        text: ``text/plain``.
        html: ``text/html`` (a DataFrame's table, say).
        markdown: ``text/markdown``.
        svg: ``image/svg+xml``.
        png: ``image/png`` as bytes (a matplotlib figure).
        jpeg: ``image/jpeg`` as bytes.
        pdf: ``application/pdf`` as bytes.
        latex: ``text/latex``.
        json: ``application/json`` (an object or a list).
        javascript: ``application/javascript``.
        data: ``e2b/data``: a DataFrame's data, as E2B's kernel extracts it.
        chart: ``e2b/chart``: a plot's data (type, title, axes, elements), as E2B's chart
            extraction gives it.
        is_main_result: True for the value of the cell's last expression.
        extra: other MIME types, by name.
    """

    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[bytes] = None
    jpeg: Optional[bytes] = None
    pdf: Optional[bytes] = None
    latex: Optional[str] = None
    json: Any = None
    javascript: Optional[str] = None
    data: Optional[Mapping[str, Any]] = None
    chart: Optional[Mapping[str, Any]] = None
    is_main_result: bool = False
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    def formats(self) -> Tuple[str, ...]:
        """The names of the fields this result has, then its ``extra`` MIME types."""
        have = tuple(name for name, _ in _MIME if getattr(self, name) is not None)
        return have + tuple(self.extra)

    def _repr_mimebundle_(
        self, include: Optional[Iterable[str]] = None, exclude: Optional[Iterable[str]] = None
    ) -> Dict[str, Any]:
        """The result by MIME type, as IPython displays it (images base64 again; E2B's data
        and chart as ``application/vnd.e2b.data+json`` and ``...chart+json``, which a
        notebook can save; an extra type whose value a notebook cannot save is left out)."""
        bundle: Dict[str, Any] = {}
        for name, mime in _MIME:
            value = getattr(self, name)
            if value is None:
                continue
            if name in _BINARY:
                value = base64.b64encode(value).decode("ascii")
            bundle[_SHOWN_AS.get(mime, mime)] = value
        for mime, value in self.extra.items():
            if isinstance(value, str) or _JSON_MIME.fullmatch(mime):
                bundle.setdefault(mime, value)
        if "text/plain" not in bundle:
            bundle["text/plain"] = repr(self)
        return _filtered(bundle, include, exclude)

    def __repr__(self) -> str:
        kind = "main " if self.is_main_result else ""
        if self.text is not None:
            return f"Result({kind}text={_short(self.text)!r}, formats={self.formats()!r})"
        return f"Result({kind}formats={self.formats()!r})"


@attrs.frozen
class ExecutionError:
    """The exception a cell raised.

    Attributes:
        name: its class (``"ZeroDivisionError"``).
        value: its message.
        traceback: the kernel's traceback (with the kernel's colour codes).
    """

    name: str
    value: str
    traceback: str

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


@attrs.frozen(repr=False)
class Execution:
    """The outcome of one ``run_code`` call. An exception in the code is a result (``error``),
    not a raise, as a non-zero exit is for ``exec``.

    Attributes:
        results: the cell's rich outputs in the order they came (display calls, then the
            cell's value).
        stdout: what the code printed to standard output.
        stderr: what it printed to standard error.
        error: the exception it raised, or None.
        execution_count: the cell's number in its context (None if the kernel never took it).
        timed_out: True when the timeout fired and the kernel was interrupted (its state is
            kept); what came before is here.
        cancelled: True when the cancel token fired (likewise).
        restarted: True when the kernel did not stop when interrupted and was restarted: the
            context's state (its variables) is lost.
        truncated: True when stdout and stderr together passed the call's
            ``max_output_bytes`` and the rest was dropped (as ``exec`` does).
    """

    results: Tuple[Result, ...] = ()
    stdout: str = ""
    stderr: str = ""
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    timed_out: bool = False
    cancelled: bool = False
    restarted: bool = False
    truncated: bool = False

    @property
    def text(self) -> Optional[str]:
        """The text of the cell's value (its main result), or None."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None

    @property
    def ok(self) -> bool:
        """True when the code ran to its end without an exception."""
        return self.error is None and not (self.timed_out or self.cancelled)

    def __repr__(self) -> str:
        parts = [f"execution_count={self.execution_count!r}"]
        if self.text is not None:
            parts.append(f"text={_short(self.text)!r}")
        if self.results:
            parts.append(f"results={len(self.results)}")
        for name in ("stdout", "stderr"):
            value = getattr(self, name)
            if value:
                parts.append(f"{name}={_short(value)!r}")
        if self.error is not None:
            parts.append(f"error={str(self.error)!r}")
        for flag in ("timed_out", "cancelled", "restarted", "truncated"):
            if getattr(self, flag):
                parts.append(f"{flag}=True")
        return f"Execution({', '.join(parts)})"

    def _repr_mimebundle_(
        self, include: Optional[Iterable[str]] = None, exclude: Optional[Iterable[str]] = None
    ) -> Dict[str, Any]:
        """A cell whose only output is one result: that result's own bundle (a notebook
        shows Markdown, LaTeX or a figure as it is). Otherwise the whole cell as HTML
        (streams, every result's richest form, the error), with plain text beside it."""
        alone = not (self.stdout or self.stderr or self.error is not None or self.timed_out
                     or self.cancelled or self.restarted)
        if alone and len(self.results) == 1:
            return self.results[0]._repr_mimebundle_(include, exclude)
        blocks: List[str] = []
        plain: List[str] = []
        for name in ("stdout", "stderr"):
            value = getattr(self, name)
            if value:
                blocks.append(f"<pre>{html.escape(value)}</pre>")
                plain.append(value.rstrip("\n"))
        for result in self.results:
            blocks.append(_result_html(result))
            if result.text is not None:
                plain.append(result.text)
        if self.error is not None:
            trace = strip_ansi(self.error.traceback) or str(self.error)
            blocks.append(f'<pre style="color:#b00">{html.escape(trace)}</pre>')
            plain.append(trace)
        for flag in ("timed_out", "cancelled", "restarted"):
            if getattr(self, flag):
                blocks.append(f"<p><em>{flag.replace('_', ' ')}</em></p>")
                plain.append(f"[{flag.replace('_', ' ')}]")
        bundle = {"text/plain": "\n".join(plain) or repr(self), "text/html": "\n".join(blocks)}
        return _filtered(bundle, include, exclude)


def _result_html(result: Result) -> str:
    """A result's richest form that HTML can hold."""
    if result.png is not None:
        return f'<img src="data:image/png;base64,{base64.b64encode(result.png).decode()}"/>'
    if result.jpeg is not None:
        return f'<img src="data:image/jpeg;base64,{base64.b64encode(result.jpeg).decode()}"/>'
    if result.svg is not None:
        return result.svg
    if result.html is not None:
        return result.html
    return f"<pre>{html.escape(result.text or repr(result))}</pre>"


@attrs.frozen
class CodeContext:
    """A kernel of its own in the sandbox: variables set in one call stay for the next.

    Attributes:
        id: the context's id (give it, or this value, as ``context=``).
        language: ``"python"`` or ``"bash"`` (others where the template has their kernel).
        cwd: its working directory.
    """

    id: str
    language: str
    cwd: str


def _decode_binary(name: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError(f"code interpreter: a result's {name} is not base64 text")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ProtocolError(f"code interpreter: a result's {name} is not base64") from exc


def _check(name: str, value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise ProtocolError(f"code interpreter: a result's {name} is not a {kind.__name__}")
    return value


def result_from_event(event: CodeResult) -> Result:
    """The public value of a decoded ``result`` line.

    Raises:
        ProtocolError: a field has the wrong type (an image not base64, say).
    """
    values: Dict[str, Any] = {}
    for name, value in event.fields.items():
        if name in _BINARY:
            values[name] = _decode_binary(name, value)
        elif name == "json":
            values[name] = value
        elif name in ("data", "chart"):
            values[name] = _check(name, value, dict)
        else:
            values[name] = _check(name, value, str)
    return Result(**values, is_main_result=event.is_main, extra=dict(event.extra))


def error_from_event(event: CodeError) -> ExecutionError:
    """The public value of a decoded ``error`` line."""
    return ExecutionError(event.name, event.value, event.traceback)
