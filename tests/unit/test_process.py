"""Unit tests of envd process events, exit codes and the output budget
(e2b_provider.protocol.process_events)."""

from __future__ import annotations

import base64
from typing import Any, Dict, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2b_provider.errors import InvalidArgument, ProtocolError
from e2b_provider.protocol.process_events import (
    SIGNALS,
    DataEvent,
    EndEvent,
    KeepaliveEvent,
    OutputBudget,
    StartEvent,
    decode_output,
    event_from_wire,
    exit_code_of,
    is_output_message,
)

FAST = settings(max_examples=80, deadline=None, database=None)

# Go's syscall signal names on Linux/amd64, by number.
GO_SIGNAL_NAMES = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
    16: "stack fault",
    17: "child exited",
    18: "continued",
    19: "stopped (signal)",
    20: "stopped",
    21: "stopped (tty input)",
    22: "stopped (tty output)",
    23: "urgent I/O condition",
    24: "CPU time limit exceeded",
    25: "file size limit exceeded",
    26: "virtual timer expired",
    27: "profiling timer expired",
    28: "window changed",
    29: "I/O possible",
    30: "power failure",
    31: "bad system call",
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def end(**body: Any) -> EndEvent:
    ev = event_from_wire({"event": {"end": body}})
    assert isinstance(ev, EndEvent)
    return ev


# --- exit codes ---------------------------------------------------------------------------


def test_signal_table_is_exactly_linux_1_to_31() -> None:
    assert dict(SIGNALS) == {name: n for n, name in GO_SIGNAL_NAMES.items()}


@pytest.mark.parametrize(("n", "name"), sorted(GO_SIGNAL_NAMES.items()))
def test_every_signal_name(n: int, name: str) -> None:
    # envd sends exitCode -1 and no "exited" for a signal death.
    assert end(exitCode=-1, status=f"signal: {name}").exit_code == 128 + n
    assert exit_code_of(EndEvent(False, f"signal: {name} (core dumped)", -1)) == 128 + n


def test_exit_status_n() -> None:
    for n in (1, 2, 3, 126, 127, 255):
        assert end(exitCode=n, exited=True, status=f"exit status {n}").exit_code == n
        # "exit status " decides even without exited.
        assert exit_code_of(EndEvent(False, f"exit status {n}", n)) == n


def test_omitted_exit_code_means_zero() -> None:
    ev = event_from_wire({"event": {"end": {"exited": True, "status": "exit status 0"}}})
    assert ev == EndEvent(exited=True, status="exit status 0", raw_exit_code=None, error=None)
    assert isinstance(ev, EndEvent) and ev.exit_code == 0
    assert exit_code_of(EndEvent(True, "")) == 0
    assert exit_code_of(EndEvent(False, "exit status 0")) == 0


@pytest.mark.parametrize(
    "status",
    [
        "",
        "signal: unknown",
        "signal: signal 34",
        "signal: killed (core dumped) extra",
        "signal:killed",
        "Signal: killed",
        "signal: Killed",
        "killed",
        "signal: ",
        "signal: killed\n",
    ],
)
def test_unknown_status_gives_none(status: str) -> None:
    assert exit_code_of(EndEvent(False, status, -1)) is None


def test_end_error_field_is_kept() -> None:
    ev = end(exitCode=3, exited=True, status="exit status 3", error="exit status 3")
    assert ev.error == "exit status 3" and ev.raw_exit_code == 3 and ev.exit_code == 3


def test_end_accepts_snake_case_exit_code() -> None:
    assert end(exit_code=4, exited=True, status="exit status 4").exit_code == 4


# --- recognising output messages unparsed ----------------------------------------------------


def _in_buffer(payload: bytes) -> Any:
    """``payload`` inside a larger buffer, as the decoder holds it: (buf, start, end)."""
    buf = bytearray(b"\x00junk" + payload + b"more\x00")
    return buf, 5, 5 + len(payload)


@pytest.mark.parametrize(
    "payload",
    [
        b'{"event":{"data":{"stdout":"aGk="}}}',
        b'{"event":{"data":{"stderr":"aGk="}}}',
        b'{"event":{"data":{"pty":"aGk="}}}',
        b'{"event":{"data":{}}}',
        # protojson varies its spacing on purpose
        b' {\n "event" : { "data":\t{ "stdout": "aGk=" } } }\n',
    ],
)
def test_output_messages_are_recognised(payload: bytes) -> None:
    assert is_output_message(*_in_buffer(payload))


@pytest.mark.parametrize(
    "payload",
    [
        b'{"event":{"start":{"pid":1}}}',
        b'{"event":{"end":{"exited":true,"status":"exit status 0"}}}',
        b'{"event":{"keepalive":{}}}',
        b"{}",
        b'{"other":{"data":{}}}',
        b'{"event":{"datum":{}}}',
        b'{"event":{"data":"x"}}',
        b"",
    ],
)
def test_other_messages_are_not_output(payload: bytes) -> None:
    assert not is_output_message(*_in_buffer(payload))


@pytest.mark.parametrize(
    "payload",
    [
        b'{"event":{"data":{"stdout":"aGk="',
        b'{"event":{"data":{"stdout":"aGk="}}]',
        b'{"event":{"data":{}}}X',  # only JSON whitespace may follow the last brace
    ],
)
def test_a_cut_output_message_is_a_protocol_error(payload: bytes) -> None:
    cut = r"^process output event is not a complete JSON object$"
    with pytest.raises(ProtocolError, match=cut):
        is_output_message(*_in_buffer(payload))


def test_only_the_message_itself_is_looked_at() -> None:
    # The bytes after the message (the next one's) would complete the prefix: not output.
    buf = bytearray(b'{"event":{"data":' + b'{"stdout":"aGk="}}}')
    assert not is_output_message(buf, 0, len(b'{"event":{"data":'))
    # ... and before it: a message that starts inside the buffer is matched from its start.
    buf = bytearray(b'{"event":{"data":{}}}{"event":{"end":{}}}')
    assert not is_output_message(buf, len(b'{"event":{"data":{}}}'), len(buf))
    assert is_output_message(buf, 0, len(b'{"event":{"data":{}}}'))


@FAST
@given(stdout=st.binary(max_size=64), stderr=st.binary(max_size=64))
def test_every_wire_data_event_is_recognised(stdout: bytes, stderr: bytes) -> None:
    import json

    body: Dict[str, Any] = {}
    if stdout:
        body["stdout"] = base64.b64encode(stdout).decode()
    if stderr:
        body["stderr"] = base64.b64encode(stderr).decode()
    payload = json.dumps({"event": {"data": body}}).encode()
    assert is_output_message(*_in_buffer(payload))
    assert event_from_wire(json.loads(payload)) == DataEvent(stdout, stderr)


# --- event_from_wire -----------------------------------------------------------------------


def test_start_event() -> None:
    assert event_from_wire({"event": {"start": {"pid": 12}}}) == StartEvent(12)
    assert event_from_wire({"event": {"start": {}}}) == StartEvent(0)  # proto3 zero omitted


def test_data_events() -> None:
    assert event_from_wire({"event": {"data": {"stdout": b64(b"hi\n")}}}) == DataEvent(b"hi\n")
    assert event_from_wire({"event": {"data": {"stderr": b64(b"\xff\x00")}}}) == DataEvent(
        b"", b"\xff\x00"
    )
    assert event_from_wire({"event": {"data": {"pty": b64(b"tty")}}}) == DataEvent(b"tty", b"")
    assert event_from_wire({"event": {"data": {}}}) == DataEvent(b"", b"")


def test_data_base64_variants() -> None:
    raw = bytes(range(256))
    std = base64.b64encode(raw).decode()
    url = base64.urlsafe_b64encode(raw).decode()
    for text in (std, std.rstrip("="), url, url.rstrip("=")):
        assert event_from_wire({"event": {"data": {"stdout": text}}}) == DataEvent(raw)


def test_keepalive_event() -> None:
    assert event_from_wire({"event": {"keepalive": {}}}) == KeepaliveEvent()


@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"event": None},
        {"event": {}},
        {"event": {"someFutureKind": {"x": 1}}},
        {"other": 1},
    ],
)
def test_unknown_or_missing_events_are_none(obj: Dict[str, Any]) -> None:
    assert event_from_wire(obj) is None


@pytest.mark.parametrize(
    "obj",
    [
        [],
        "event",
        None,
        {"event": []},
        {"event": "start"},
        {"event": {"start": []}},
        {"event": {"start": {"pid": "12"}}},
        {"event": {"start": {"pid": 1.5}}},
        {"event": {"start": {"pid": True}}},
        {"event": {"start": {"pid": -1}}},
        {"event": {"data": "aGk="}},
        {"event": {"data": {"stdout": "not base64!"}}},
        {"event": {"data": {"stdout": "aGk=aGk="}}},
        {"event": {"data": {"stdout": "a"}}},
        {"event": {"data": {"stderr": 12}}},
        {"event": {"data": {"pty": ["x"]}}},
        {"event": {"end": {"exitCode": "3"}}},
        {"event": {"end": {"exitCode": True}}},
        {"event": {"end": {"exitCode": 1.0}}},
        {"event": {"end": {"exited": 1}}},
        {"event": {"end": {"status": 3}}},
        {"event": {"end": {"error": {}}}},
        {"event": {"end": "x"}},
        {"event": {"keepalive": 1}},
        {"event": {"start": {"pid": 1}, "end": {}}},
    ],
)
def test_malformed_events_raise_protocol_error(obj: Any) -> None:
    with pytest.raises(ProtocolError):
        event_from_wire(obj)


@FAST
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "event",
                        "start",
                        "data",
                        "end",
                        "keepalive",
                        "pid",
                        "stdout",
                        "stderr",
                        "pty",
                        "exitCode",
                        "exited",
                        "status",
                        "error",
                        "x",
                    ]
                ),
                c,
                max_size=4,
            )
        ),
        max_leaves=10,
    )
)
def test_random_shapes_raise_only_protocol_error(obj: Any) -> None:
    try:
        event_from_wire(obj)
    except ProtocolError:
        pass


# --- OutputBudget ---------------------------------------------------------------------------


def test_budget_shared_between_streams_in_arrival_order() -> None:
    b = OutputBudget(10)
    b.add_stdout(b"abcd")
    b.add_stderr(b"EFG")
    b.add_stdout(b"hijk")  # only "hij" fits
    assert b.stdout_bytes == b"abcdhij"
    assert b.stderr_bytes == b"EFG"
    assert b.used == 10
    assert b.truncated


def test_budget_not_truncated_when_exactly_full() -> None:
    b = OutputBudget(6)
    b.add_stdout(b"abc")
    b.add_stderr(b"def")
    assert not b.truncated and b.used == 6
    b.add_stdout(b"")  # empty data drops nothing
    assert not b.truncated
    b.add_stderr(b"x")
    assert b.truncated
    assert (b.stdout_bytes, b.stderr_bytes) == (b"abc", b"def")


def test_budget_keeps_draining_after_the_cap() -> None:
    b = OutputBudget(3)
    for _ in range(1000):
        b.add_stdout(b"0123456789")
        b.add_stderr(b"e" * 100)
    assert b.stdout_bytes == b"012" and b.stderr_bytes == b""
    assert b.used == 3 and b.truncated


def test_budget_zero() -> None:
    b = OutputBudget(0)
    assert not b.truncated
    b.add_stderr(b"x")
    assert b.truncated and b.used == 0 and b.stderr_text() == ""


def test_budget_add_data_event() -> None:
    b = OutputBudget(100)
    b.add(DataEvent(b"out", b"err"))
    assert (b.stdout_bytes, b.stderr_bytes) == (b"out", b"err")
    assert b.stdout_text() == "out" and b.stderr_text() == "err"


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None])
def test_budget_rejects_bad_cap(bad: Any) -> None:
    with pytest.raises(InvalidArgument):
        OutputBudget(bad)


@FAST
@given(
    cap=st.integers(0, 64),
    chunks=st.lists(st.tuples(st.booleans(), st.binary(max_size=20)), max_size=12),
)
def test_budget_matches_a_simple_model(cap: int, chunks: List[Any]) -> None:
    b = OutputBudget(cap)
    kept: List[Any] = []
    total = 0
    for is_out, data in chunks:
        (b.add_stdout if is_out else b.add_stderr)(data)
        total += len(data)
        kept.append((is_out, data))
    # Model: the concatenation in arrival order, cut at cap, split back by stream.
    out, err, room = b"", b"", cap
    for is_out, data in kept:
        piece = data[: max(room, 0)]
        room -= len(piece)
        if is_out:
            out += piece
        else:
            err += piece
    assert (b.stdout_bytes, b.stderr_bytes) == (out, err)
    assert b.used == min(cap, total)
    assert b.truncated == (total > cap)


# --- UTF-8 safe decoding --------------------------------------------------------------------


@pytest.mark.parametrize("char", ["é", "€", "😀"])
@pytest.mark.parametrize("k", [0, 1, 5])
def test_truncation_at_every_byte_of_a_multibyte_character(char: str, k: int) -> None:
    text = "a" * k + char + "z"
    data = text.encode("utf-8")
    width = len(char.encode("utf-8"))
    for cap in range(len(data)):
        b = OutputBudget(cap)
        b.add_stdout(data)
        assert b.truncated
        got = b.stdout_text()
        assert text.startswith(got), (cap, got)
        assert "\ufffd" not in got
        if k < cap < k + width:  # cut inside the character: only it is lost
            assert got == "a" * k
        else:
            assert got.encode("utf-8") == data[:cap]


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_truncated_stderr_decoded_the_same_way(char: str) -> None:
    b = OutputBudget(3)
    b.add_stderr(b"x" + char.encode("utf-8"))
    got = b.stderr_text()
    assert "\ufffd" not in got
    assert got == ("x" + char if len(char.encode()) == 2 else "x")


def test_untruncated_invalid_bytes_become_replacement_characters() -> None:
    assert decode_output(b"ok\xff\xfe", False) == "ok\ufffd\ufffd"
    # Not truncated: a cut sequence at the end is shown, not dropped.
    assert decode_output("€".encode()[:2], False) == "\ufffd"
    b = OutputBudget(100)
    b.add_stdout(b"a\xc3")
    assert not b.truncated and b.stdout_text() == "a\ufffd"


def test_truncated_decode_keeps_invalid_bytes_in_the_middle() -> None:
    assert decode_output(b"\xffab", True) == "\ufffdab"
    # A lone continuation byte more than 4 bytes from a lead byte is not touched.
    assert decode_output(b"a" + b"\x80" * 5, True) == "a" + "\ufffd" * 5


def test_decode_complete_sequences_are_kept_when_truncated() -> None:
    for text in ("é", "€", "😀", "abc"):
        assert decode_output(text.encode(), True) == text


def test_decode_empty() -> None:
    assert decode_output(b"", True) == ""
    assert decode_output(b"", False) == ""


def test_budget_cap_is_read_only() -> None:
    b = OutputBudget(5)
    with pytest.raises(AttributeError):
        b.max_bytes = 10
    assert b.max_bytes == 5


# -- live output ------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(
    chunks=st.lists(
        st.one_of(
            st.binary(max_size=12),
            st.text(max_size=6).map(lambda t: t.encode("utf-8")),
            st.sampled_from([b"\xe2\x82", b"\xac", b"\xf0\x9f", b"\x98\x80", b"\xff", b"\x80"]),
        ),
        max_size=12,
    ),
    cap=st.integers(min_value=0, max_value=60),
)
def test_live_text_pieces_add_up_to_the_result(chunks: List[bytes], cap: int) -> None:
    from e2b_provider.protocol.process_events import LiveText

    budget = OutputBudget(cap)
    live = LiveText()
    pieces = []
    for chunk in chunks:
        kept = budget.add_stdout(chunk)
        pieces.append(live.feed(kept))
    pieces.append(live.finish(budget.truncated))
    assert "".join(pieces) == decode_output(budget.stdout_bytes, budget.truncated)


def test_live_text_never_splits_a_character() -> None:
    from e2b_provider.protocol.process_events import LiveText

    live = LiveText()
    euro = "€".encode()
    assert live.feed(b"a" + euro[:1]) == "a"
    assert live.feed(euro[1:2]) == ""
    assert live.feed(euro[2:] + b"\n") == "€\n"
    assert live.finish(False) == ""


def test_live_text_finish_drops_a_cut_character_only_when_truncated() -> None:
    from e2b_provider.protocol.process_events import LiveText

    euro = "€".encode()
    cut = LiveText()
    assert cut.feed(b"x" + euro[:2]) == "x"
    assert cut.finish(True) == ""
    whole = LiveText()
    whole.feed(b"x" + euro[:2])
    assert whole.finish(False) == "\ufffd"


@pytest.mark.parametrize(
    "obj, message",
    [
        ([1], "process stream message is a list, not an object"),
        ({"event": 1}, "process event is a int, not an object"),
        ({"event": {"start": 1}}, "process event 'start' is a int, not an object"),
        ({"event": {"start": {"pid": "1"}}}, "process event start.pid is a str, not an integer"),
        ({"event": {"start": {"pid": -1}}}, "process event start.pid is negative"),
        ({"event": {"data": {"stdout": 5}}}, "process event data.stdout is a int, not base64 text"),
        ({"event": {"data": {"pty": "!!"}}}, "process event data.pty is not valid base64"),
        ({"event": {"data": {"stderr": 5}}}, "process event data.stderr is a int, not base64 text"),
        ({"event": {"end": {"exitCode": "1"}}},
         "process event end.exitCode is a str, not an integer"),
        ({"event": {"end": {"exited": 1}}}, "process event end.exited is a int, not a bool"),
        ({"event": {"end": {"status": 1}}}, "process event end.status is a int, not text"),
        ({"event": {"end": {"error": 1}}}, "process event end.error is a int, not text"),
        ({"event": {"start": {}, "end": {}}},
         "process event has several kinds at once: start, end"),
    ],
)  # fmt: skip
def test_malformed_event_messages_say_what_is_wrong(obj: Any, message: str) -> None:
    with pytest.raises(ProtocolError) as ei:
        event_from_wire(obj)
    assert str(ei.value) == message


def test_unpadded_base64_of_every_length() -> None:
    for raw in (b"a", b"ab", b"abc", b"abcd"):
        text = base64.b64encode(raw).decode().rstrip("=")
        assert event_from_wire({"event": {"data": {"stderr": text}}}) == DataEvent(b"", raw)


def test_stdout_and_pty_in_one_event_are_joined() -> None:
    ev = event_from_wire({"event": {"data": {"stdout": b64(b"out"), "pty": b64(b"tty")}}})
    assert ev == DataEvent(b"outtty")


def test_end_without_a_status_has_an_empty_one() -> None:
    ev = event_from_wire({"event": {"end": {"exited": True}}})
    assert ev == EndEvent(exited=True, status="", raw_exit_code=None, error=None)


def test_bad_budget_message() -> None:
    with pytest.raises(InvalidArgument) as ei:
        OutputBudget(-1)
    assert str(ei.value) == "invalid max_output_bytes -1: must be an int >= 0"


@pytest.mark.parametrize(
    "cut, kept",
    [
        (b"a\xe0\xa0", "a"),  # U+0800 (lead byte E0) cut after 2 of its 3 bytes
        (b"a\xe0", "a"),
        (b"a\xc0", "a"),  # a 2-byte lead: needs 2 bytes, as in the reference's decodeOutput
        (b"a\xc2", "a"),
        (b"a\xf0\x9f\x98", "a"),
    ],
)
def test_truncated_decode_drops_a_cut_sequence_by_its_lead_byte(cut: bytes, kept: str) -> None:
    assert decode_output(cut, True) == kept


def test_live_text_finish_takes_everything_pending() -> None:
    from e2b_provider.protocol.process_events import LiveText

    live = LiveText()
    assert live.feed(b"ab\xc3") == "ab"  # the partial character waits
    assert live.finish(False) == "\ufffd"
    # nothing is left behind: the next stream fed to it starts from nothing
    assert live.finish(False) == ""
    assert live.feed(b"cd") + live.finish(True) == "cd"
