"""The code interpreter's wire format: lines of ``POST /execute`` into events, bodies out."""

from __future__ import annotations

import json
import random
from typing import Any, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2b_provider.errors import InvalidArgument, ProtocolError
from e2b_provider.protocol.code_output import (
    SPILL_BYTES,
    CodeCount,
    CodeEnd,
    CodeError,
    CodeResult,
    CodeStream,
    OutputDecoder,
    context_body,
    execute_body,
    parse_context,
)

# What E2B's server streams for ``print("hi"); 1+1`` (fields it leaves None are absent).
_RUN = (
    b'{"type": "number_of_executions", "execution_count": 3}\n'
    b'{"type": "stdout", "text": "hi\\n", "timestamp": "2026-12-07T10:00:00.1+00:00"}\n'
    b'{"type": "keepalive"}\n'
    b'{"type": "result", "text": "2", "is_main_result": true, "extra": {}}\n'
    b'{"type": "end_of_execution"}\n'
)


def _decode_in_pieces(body: bytes, size: int) -> list:
    decoder = OutputDecoder()
    events = []
    for i in range(0, len(body), size):
        events += decoder.feed(body[i : i + size])
    return events + decoder.finish()


@pytest.mark.parametrize("size", [1, 2, 7, 64, 10_000])
def test_a_run_decodes_the_same_in_any_pieces(size: int) -> None:
    events = _decode_in_pieces(_RUN, size)
    assert events == [
        CodeCount(3),
        CodeStream("stdout", "hi\n", "2026-12-07T10:00:00.1+00:00"),
        CodeResult(fields={"text": "2"}, extra={}, is_main=True),
        CodeEnd(),
    ]


def test_results_keep_known_fields_and_the_rest_as_extra() -> None:
    line = {
        "type": "result",
        "png": "iVBORw0KGgo=",
        "html": "<b>x</b>",
        "chart": {"type": "line"},
        "extra": {"application/x-custom": "1"},
        "is_main_result": False,
        "unknown_field": "ignored",
    }
    (event,) = OutputDecoder().feed(json.dumps(line).encode() + b"\n")
    assert isinstance(event, CodeResult)
    assert event.fields == {"png": "iVBORw0KGgo=", "html": "<b>x</b>", "chart": {"type": "line"}}
    assert event.extra == {"application/x-custom": "1"}
    assert event.is_main is False


def test_errors_and_the_bare_unexpected_end() -> None:
    body = (
        b'{"type": "error", "name": "ZeroDivisionError", "value": "division by zero",'
        b' "traceback": "Traceback..."}\n'
        b'{"type": "unexpected_end_of_execution"}\n'
    )
    events = OutputDecoder().feed(body)
    assert events[0] == CodeError("ZeroDivisionError", "division by zero", "Traceback...")
    assert isinstance(events[1], CodeError) and events[1].name == "UnexpectedEndOfExecution"


def test_a_last_line_without_newline_is_read_at_finish() -> None:
    decoder = OutputDecoder()
    assert decoder.feed(b'{"type": "stderr", "text": "w"}') == []
    assert decoder.finish() == [CodeStream("stderr", "w", None)]


def test_the_end_line_ends_decoding() -> None:
    decoder = OutputDecoder()
    assert decoder.feed(b'{"type": "end_of_execution"}\n') == [CodeEnd()]
    assert decoder.ended
    assert decoder.feed(b"\n") == []
    with pytest.raises(ProtocolError, match="after the end"):
        decoder.feed(b'{"type": "stdout", "text": "late"}\n')


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1, 2]",
        b'{"type": "stdout", "text": 5}',
        b'{"type": "number_of_executions", "execution_count": "3"}',
        b'{"type": "number_of_executions", "execution_count": -1}',
        b'{"type": "number_of_executions", "execution_count": true}',
    ],
)
def test_malformed_lines_are_refused(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        OutputDecoder().feed(line + b"\n")


def test_unknown_types_are_skipped() -> None:
    assert OutputDecoder().feed(b'{"type": "something_new", "x": 1}\n') == []


def test_a_line_longer_than_the_cap_is_refused_not_buffered() -> None:
    decoder = OutputDecoder(max_line_bytes=1000)
    decoder.feed(b"x" * 1000)
    with pytest.raises(ProtocolError, match="longer than 1000"):
        decoder.feed(b"x")


def test_execute_body() -> None:
    body = json.loads(execute_body("1+1", language="python", env={"A": "b c"}))
    assert body == {
        "code": "1+1",
        "context_id": None,
        "language": "python",
        "env_vars": {"A": "b c"},
    }
    body = json.loads(execute_body("é", context_id="ctx-1"))
    assert body["code"] == "é" and body["context_id"] == "ctx-1" and body["env_vars"] is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"context_id": "c", "language": "python"},
        {"env": {"A B": "x"}},
        {"env": {"A": 1}},
        {"env": {"A": "it's"}},
        {"env": {"A": "two\nlines"}},
        {"env": ["A"]},
    ],
)
def test_execute_body_refuses_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(InvalidArgument):
        execute_body("1", **kwargs)


def test_context_body_and_parse_context() -> None:
    assert json.loads(context_body(None, None)) == {}
    assert json.loads(context_body("bash", "/tmp")) == {"language": "bash", "cwd": "/tmp"}
    assert parse_context({"id": "k1", "language": "python", "cwd": "/home/user"}) == (
        "k1",
        "python",
        "/home/user",
    )
    with pytest.raises(ProtocolError):
        parse_context({"id": "k1", "language": "python"})


# -- long stream lines: decoded as they come -------------------------------------------------

_TRICKY = "a\"b\\c\nd\té€😀\u2028\x01'/"


def _long_line(name: str, text: str, ascii_only: bool) -> bytes:
    line = {"type": name, "text": text, "timestamp": "2026-12-07T00:00:00Z"}
    return (json.dumps(line, ensure_ascii=ascii_only) + "\n").encode("utf-8")


@settings(max_examples=30, deadline=None)
@given(
    unit=st.text(alphabet=st.sampled_from(list(_TRICKY)), min_size=1, max_size=40),
    ascii_only=st.booleans(),
    chunk=st.integers(min_value=512, max_value=70000),
    seed=st.integers(min_value=0, max_value=10**6),
)
def test_a_long_stream_line_comes_in_pieces_equal_to_its_text(
    unit: str, ascii_only: bool, chunk: int, seed: int
) -> None:
    # three times the spill size: pieces cut anywhere, inside escapes and characters too
    text = unit * (3 * SPILL_BYTES // len(unit) + 7)
    body = (_long_line("stdout", text, ascii_only)
            + b'{"type": "result", "is_main_result": true, "text": "1"}\n'
            + b'{"type": "end_of_execution"}\n')
    rng = random.Random(seed)
    decoder = OutputDecoder()
    events: List[Any] = []
    pos = 0
    while pos < len(body):
        size = rng.randint(chunk // 2, chunk)
        events += decoder.feed(body[pos:pos + size])
        pos += size
        # never the whole line: at most the spill size, one piece and an escape held back
        assert decoder.buffered <= SPILL_BYTES + size + 16
    streams = [e for e in events if isinstance(e, CodeStream)]
    assert len(streams) > 1  # it came in pieces, not as one line kept whole
    assert {e.name for e in streams} == {"stdout"}
    assert "".join(e.text for e in streams) == text
    assert isinstance(events[-2], CodeResult) and isinstance(events[-1], CodeEnd)
    assert decoder.ended


def test_a_long_line_of_another_type_is_kept_whole_up_to_the_cap() -> None:
    big = "x" * (SPILL_BYTES * 2)
    body = (json.dumps({"type": "result", "text": big, "is_main_result": True}) + "\n").encode()
    decoder = OutputDecoder()
    events: List[Any] = []
    for i in range(0, len(body), 4096):
        events += decoder.feed(body[i:i + 4096])
    assert len(events) == 1 and events[0].fields["text"] == big


def test_an_answer_that_ends_inside_a_long_line_is_an_error() -> None:
    decoder = OutputDecoder()
    decoder.feed(_long_line("stderr", "y" * (SPILL_BYTES * 2), True)[:-100])
    with pytest.raises(ProtocolError):
        decoder.finish()
