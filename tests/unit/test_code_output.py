"""The code interpreter's wire format: lines of ``POST /execute`` into events, bodies out."""

from __future__ import annotations

import json

import pytest

from e2b_provider.errors import InvalidArgument, ProtocolError
from e2b_provider.protocol.code_output import (
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
