"""The code interpreter's wire format, sans I/O: what ``POST /execute`` streams back.

E2B's code-interpreter server (port 49999 in a ``code-interpreter-v1`` sandbox) answers an
execution with one JSON object a line: ``stdout`` and ``stderr`` pieces, ``result`` (a rich
display: text, HTML, images, charts...), ``error`` (the exception of the code),
``number_of_executions`` (the cell's execution count), ``keepalive`` (sent while the code is
quiet, so a lost client is noticed) and ``end_of_execution`` last. This module owns that
format: :class:`OutputDecoder` turns body bytes, fed in any pieces, into typed events, and
refuses what would only grow a buffer (a line longer than its cap, a line that is not a JSON
object). It also writes the request bodies (:func:`execute_body`, :func:`context_body`) and
reads a context's description (:func:`parse_context`). Pure: no I/O, no threads.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import attrs

from ..errors import InvalidArgument, ProtocolError
from .json_text import JsonTextPieces

__all__ = [
    "CODE_INTERPRETER_PORT",
    "MAX_LINE_BYTES",
    "CodeCount",
    "CodeEnd",
    "CodeError",
    "CodeEvent",
    "CodeResult",
    "CodeStream",
    "OutputDecoder",
    "check_env_vars",
    "context_body",
    "execute_body",
    "parse_context",
]

#: The port E2B's code-interpreter server listens on in the sandbox.
CODE_INTERPRETER_PORT = 49999
#: The longest line the decoder keeps (a result carries its images base64-encoded: a large
#: figure is a few MiB; a line longer than this is refused, not buffered).
MAX_LINE_BYTES = 64 << 20
#: A ``stdout`` or ``stderr`` line longer than this is decoded piece by piece as it arrives
#: (a cell that prints 100 MB at once may come as one line): never kept whole.
SPILL_BYTES = 256 << 10
#: The longest rest of a spilled line after its text (``, "timestamp": "..."}``).
_SPILL_REST_BYTES = 4096
#: How a stream line starts, as E2B's server and the emulator's write it (type, then text).
_STREAM_START = re.compile(rb'\s*\{\s*"type"\s*:\s*"(stdout|stderr)"\s*,\s*"text"\s*:\s*"')

#: The display fields a ``result`` line may carry, as the server names them.
RESULT_FIELDS = (
    "text",
    "html",
    "markdown",
    "svg",
    "png",
    "jpeg",
    "pdf",
    "latex",
    "json",
    "javascript",
    "data",
    "chart",
)


@attrs.frozen
class CodeStream:
    """A piece of standard output or error (``name`` is ``"stdout"`` or ``"stderr"``)."""

    name: str
    text: str
    timestamp: Optional[str] = None


@attrs.frozen
class CodeResult:
    """A rich display: ``fields`` by the server's names (see ``RESULT_FIELDS``), ``extra``
    for MIME types outside them, ``is_main`` for the cell's own value (not a display call)."""

    fields: Mapping[str, Any]
    extra: Mapping[str, Any]
    is_main: bool


@attrs.frozen
class CodeError:
    """The exception the code raised (or the server's own, e.g. ``ContextRestarting``)."""

    name: str
    value: str
    traceback: str


@attrs.frozen
class CodeCount:
    """The cell's execution count."""

    count: int


@attrs.frozen
class CodeEnd:
    """The last line of an execution."""


CodeEvent = Union[CodeStream, CodeResult, CodeError, CodeCount, CodeEnd]


def _text(obj: Mapping[str, Any], key: str, kind: str) -> str:
    value = obj.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ProtocolError(f"code interpreter: a {kind} line's {key!r} is not a string")
    return value


def decode_line(line: bytes) -> Optional[CodeEvent]:
    """One line of ``POST /execute``'s body as an event (``None`` for keepalives and types
    this library does not know, which newer servers may send).

    Raises:
        ProtocolError: the line is not a JSON object, or a known type is malformed.
    """
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ProtocolError("code interpreter: an output line is not JSON") from exc
    if not isinstance(obj, dict):
        raise ProtocolError("code interpreter: an output line is not a JSON object")
    kind = obj.get("type")
    if kind in ("stdout", "stderr"):
        stamp = obj.get("timestamp")
        return CodeStream(kind, _text(obj, "text", kind), stamp if isinstance(stamp, str) else None)
    if kind == "result":
        fields = {k: obj[k] for k in RESULT_FIELDS if obj.get(k) is not None}
        extra = obj.get("extra")
        return CodeResult(
            fields=fields,
            extra=dict(extra) if isinstance(extra, dict) else {},
            is_main=obj.get("is_main_result") is True,
        )
    if kind == "error":
        return CodeError(
            _text(obj, "name", kind), _text(obj, "value", kind), _text(obj, "traceback", kind)
        )
    if kind == "number_of_executions":
        count = obj.get("execution_count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ProtocolError("code interpreter: a bad execution count")
        return CodeCount(count)
    if kind == "end_of_execution":
        return CodeEnd()
    if kind == "unexpected_end_of_execution":
        # Older servers send this bare; newer ones turn it into an error line first.
        return CodeError(
            "UnexpectedEndOfExecution",
            "the execution ended before it finished",
            "",
        )
    return None


class OutputDecoder:
    """Splits ``POST /execute``'s body into lines and decodes each (see module doc).

    Args:
        max_line_bytes: the longest line kept; a longer one raises ``ProtocolError``.
    """

    __slots__ = ("_buf", "_ended", "_max", "_spill", "_spill_name")

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_line_bytes
        self._ended = False
        # a long stream line being decoded as it comes: its text, then the rest of the line
        self._spill: Optional[JsonTextPieces] = None
        self._spill_name = ""

    @property
    def buffered(self) -> int:
        """Bytes held for a line not complete yet."""
        return len(self._buf)

    @property
    def ended(self) -> bool:
        """True once the ``end_of_execution`` line was decoded."""
        return self._ended

    def feed(self, data: bytes) -> List[CodeEvent]:
        """The events completed by ``data`` (nothing after the end line is read).

        Raises:
            ProtocolError: a line is malformed or longer than the cap, or bytes follow the
                end line.
        """
        events: List[CodeEvent] = []
        if not data:
            return events
        if self._ended:
            if data.strip():
                raise ProtocolError("code interpreter: output after the end of execution")
            return events
        self._buf += data
        start = 0
        while True:
            if self._spill is not None:
                del self._buf[:start]
                start = 0
                if not self._spilled(events):
                    break
                continue
            cut = self._buf.find(b"\n", start)
            if cut < 0:
                if len(self._buf) - start > SPILL_BYTES:
                    m = _STREAM_START.match(self._buf, start)
                    if m is not None:
                        self._spill = JsonTextPieces()
                        self._spill_name = m.group(1).decode("ascii")
                        start = m.end()
                        continue
                break
            line = bytes(self._buf[start:cut]).strip()
            start = cut + 1
            if not line:
                continue
            event = decode_line(line)
            if event is None:
                continue
            events.append(event)
            if isinstance(event, CodeEnd):
                self._ended = True
                rest = bytes(self._buf[start:])
                del self._buf[:]
                if rest.strip():
                    raise ProtocolError("code interpreter: output after the end of execution")
                return events
        del self._buf[:start]
        if len(self._buf) > self._max:
            raise ProtocolError(
                f"code interpreter: an output line longer than {self._max} bytes"
            )
        return events

    def _spilled(self, events: List[CodeEvent]) -> bool:
        """Decode what arrived of a long stream line (its text as pieces); True once its
        end (the newline) was consumed.

        Raises:
            ProtocolError: a bad escape, or a rest of the line that is not short.
        """
        assert self._spill is not None
        if not self._spill.closed:
            text, _closed = self._spill.feed(self._buf)
            if text:
                events.append(CodeStream(self._spill_name, text))
            if not self._spill.closed:
                return False
        cut = self._buf.find(b"\n")
        if cut < 0:
            if len(self._buf) > _SPILL_REST_BYTES:
                raise ProtocolError("code interpreter: a malformed long output line")
            return False
        del self._buf[:cut + 1]
        self._spill = None
        return True

    def finish(self) -> List[CodeEvent]:
        """The body ended: decode a last line that had no newline.

        Raises:
            ProtocolError: that line is malformed.
        """
        if self._spill is not None:
            raise ProtocolError("code interpreter: the answer ended in an output line")
        if self._ended or not self._buf.strip():
            del self._buf[:]
            return []
        line = bytes(self._buf).strip()
        del self._buf[:]
        event = decode_line(line)
        if isinstance(event, CodeEnd):
            self._ended = True
        return [] if event is None else [event]


#: Characters E2B's server cannot carry in a variable's value (it pastes the value between
#: single quotes into the kernel's code, unescaped).
_UNQUOTABLE = ("'", '"', "\\", "\n", "\r", "\0")


def check_env_vars(env: Optional[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise InvalidArgument("env must be a mapping of str to str")
    out: Dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgument("env must be a mapping of str to str")
        if not key.isidentifier() or not key.isascii():
            # The server writes each variable into the kernel's own language (Python's
            # os.environ['K'] = 'V', bash's export K='V'): only a plain name is safe there.
            raise InvalidArgument(f"env: {key!r} is not a plain variable name")
        if any(c in value for c in _UNQUOTABLE):
            raise InvalidArgument(
                f"env: the value of {key} holds a quote, backslash, newline or NUL, which "
                "the code interpreter would paste into the kernel's code unescaped"
            )
        out[key] = value
    return out


def execute_body(
    code: str,
    *,
    context_id: Optional[str] = None,
    language: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> bytes:
    """The JSON body of ``POST /execute`` (a context or a language, never both).

    Raises:
        InvalidArgument: a bad argument.
    """
    if not isinstance(code, str):
        raise InvalidArgument("code must be a string")
    if context_id is not None and language is not None:
        raise InvalidArgument("give a context or a language, not both")
    body: Dict[str, Any] = {
        "code": code,
        "context_id": context_id,
        "language": language,
        "env_vars": check_env_vars(env),
    }
    return json.dumps(body, ensure_ascii=True).encode("ascii")


def context_body(language: Optional[str], cwd: Optional[str]) -> bytes:
    """The JSON body of ``POST /contexts`` (absent fields take the server's defaults)."""
    body: Dict[str, str] = {}
    if language is not None:
        body["language"] = language
    if cwd is not None:
        body["cwd"] = cwd
    return json.dumps(body, ensure_ascii=True).encode("ascii")


def parse_context(obj: Any) -> Tuple[str, str, str]:
    """``(id, language, cwd)`` from a context's JSON description.

    Raises:
        ProtocolError: a field is missing or not a string.
    """
    if not isinstance(obj, dict):
        raise ProtocolError("code interpreter: a context is not a JSON object")
    values = []
    for key in ("id", "language", "cwd"):
        value = obj.get(key)
        if not isinstance(value, str):
            raise ProtocolError(f"code interpreter: a context's {key!r} is not a string")
        values.append(value)
    return values[0], values[1], values[2]
