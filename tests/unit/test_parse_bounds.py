"""Reading a process stream costs memory in proportion to what arrives, whatever it is.

General JSON takes ~30 times its size as Python objects: one legal 16 MiB envelope of
``[{},{},...]`` peaked at ~450 MiB while parsed. Only messages of at most 64 KiB are parsed as
JSON now; a larger one must be a plain output message, read in place
(:func:`~e2b_provider.protocol.process_events.parse_output_message`), or it is refused unparsed. The
peaks are measured with tracemalloc while a :class:`~e2b_provider.clients.envd.ProcessStream` reads
the bytes in 64 KiB pieces, as it reads a socket.
"""

from __future__ import annotations

import base64
import json
import struct
import sys
import tracemalloc
from typing import Any, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2b_provider.clients.envd_streams import ProcessStream
from e2b_provider.errors import ProtocolError
from e2b_provider.protocol.connect import (
    MAX_JSON_BYTES,
    MAX_MESSAGE_BYTES,
    EnvelopeDecoder,
    Parsed,
    encode_envelope,
)
from e2b_provider.protocol.process_events import (
    DataEvent,
    event_from_wire,
    parse_output_message,
    parse_plain_stdout,
)

MIB = 1 << 20
END = encode_envelope({}, end_stream=True)


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


class Bytes:
    """A stand-in for the HTTP stream: the body, read in 64 KiB pieces."""

    aborted = False

    def __init__(self, body: bytes) -> None:
        self._body = memoryview(body)
        self._at = 0

    def read1(self, n: int) -> bytes:
        piece = bytes(self._body[self._at:self._at + min(n, 64 * 1024)])
        self._at += len(piece)
        return piece

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


def read_with_peak(body: bytes) -> Tuple[int, Optional[BaseException], List[Any]]:
    """Read ``body`` as a process stream: (peak bytes allocated meanwhile, error, events)."""
    stream = ProcessStream(Bytes(body))  # type: ignore[arg-type]
    events: List[Any] = []
    error: Optional[BaseException] = None
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        try:
            for ev in stream:
                events.append(ev)
        except ProtocolError as exc:
            error = exc
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, error, events


def largest(prefix: bytes, unit: bytes, suffix: bytes) -> bytes:
    """``prefix + unit * k + suffix`` as close to the largest legal message as it gets."""
    k = (MAX_MESSAGE_BYTES - len(prefix) - len(suffix)) // len(unit)
    return prefix + unit * k + suffix


def test_a_large_envelope_of_many_objects_is_refused_unparsed() -> None:
    junk = largest(b"[", b"{},", b"{}]")
    peak, error, _ = read_with_peak(envelope(junk) + END)
    assert isinstance(error, ProtocolError)
    assert f"larger than the {MAX_JSON_BYTES} bytes accepted" in str(error)
    # the message itself, buffered (it grows as it arrives); ~450 MiB when parsed
    assert peak < 1.5 * MAX_MESSAGE_BYTES, f"{peak / MIB:.0f} MiB"


def test_many_objects_inside_an_output_message_are_refused_unparsed() -> None:
    junk = largest(b'{"event":{"data":{"stdout":"AA==","x":[', b"{},", b"{}]}}}")
    peak, error, _ = read_with_peak(envelope(junk) + END)
    assert isinstance(error, ProtocolError)
    assert peak < 1.5 * MAX_MESSAGE_BYTES, f"{peak / MIB:.0f} MiB"


def test_the_largest_output_message_costs_about_its_size() -> None:
    raw = bytes(range(256)) * ((MAX_MESSAGE_BYTES * 3 // 4 - 64) // 256)
    body = encode_envelope({"event": {"data": {"stdout": base64.b64encode(raw).decode()}}})
    assert MAX_MESSAGE_BYTES - 4096 < len(body) - 5 <= MAX_MESSAGE_BYTES
    peak, error, events = read_with_peak(body + END)
    assert error is None
    assert events == [DataEvent(raw, b"")]
    del events
    # the message buffered plus its decoded output (general JSON took ~5 times its size)
    assert peak < 3 * MAX_MESSAGE_BYTES, f"{peak / MIB:.0f} MiB"


# -- what is parsed, and how ---------------------------------------------------------------


def _variants(stdout: bytes, stderr: bytes) -> List[bytes]:
    std = base64.b64encode(stdout).decode()
    url = base64.urlsafe_b64encode(stdout).decode().rstrip("=")
    err = base64.b64encode(stderr).decode()
    return [
        json.dumps({"event": {"data": {"stdout": std}}}).encode(),
        json.dumps({"event": {"data": {"stdout": url, "stderr": err}}}, indent=2).encode(),
        json.dumps({"event": {"data": {"stderr": err, "pty": std, "stdout": url}}}).encode(),
        b' \n{ "event" :{"data":\t{"pty":"' + std.encode() + b'"}}}\r\n',
        json.dumps({"event": {"data": {}}}).encode(),
    ]


@settings(max_examples=60, deadline=None, database=None)
@given(st.binary(max_size=64), st.binary(max_size=64))
def test_an_output_message_read_in_place_equals_its_json_reading(
    stdout: bytes, stderr: bytes
) -> None:
    for payload in _variants(stdout, stderr):
        buf = bytearray(b"xx" + payload + b"yy")
        expected = event_from_wire(json.loads(payload))
        assert parse_output_message(buf, 2, 2 + len(payload)) == expected
        assert buf == b"xx" + payload + b"yy"  # the buffer is left alone (and resizable)
        buf += b"!"


@pytest.mark.parametrize(
    "payload",
    [
        b'{"event":{"data":{"stdout":"AA==","extra":"AA=="}}}',  # an unknown field
        b'{"event":{"data":{"stdout":"A\\u0041=="}}}',  # an escape
        b'{"event":{"data":{"stdout":1}}}',
        b'{"event":{"start":{"pid":1}}}',
        b'{"event":{"data":{"stdout":"AA=="}}',  # cut
        b'{"event":{"data":{"stdout":"AA=="}}}[]',
        b"[{},{}]",
    ],
)
def test_anything_but_a_plain_output_message_is_not_read_in_place(payload: bytes) -> None:
    assert parse_output_message(bytearray(payload), 0, len(payload)) is None


@pytest.mark.parametrize("text", ["A", "AAAAA", "AAAAAAAAA="])
def test_base64_of_an_impossible_length_is_a_protocol_error(text: str) -> None:
    payload = b'{"event":{"data":{"stdout":"' + text.encode() + b'"}}}'
    with pytest.raises(ProtocolError, match=r"data\.stdout is not valid base64"):
        parse_output_message(bytearray(payload), 0, len(payload))
    with pytest.raises(ProtocolError, match=r"data\.stdout is not valid base64"):
        event_from_wire(json.loads(payload))  # as the JSON reading says


def test_stderr_of_an_impossible_length_is_named() -> None:
    payload = b'{"event":{"data":{"stdout":"AA==","stderr":"AAAAA"}}}'
    with pytest.raises(ProtocolError) as ei:
        parse_output_message(bytearray(payload), 0, len(payload))
    assert str(ei.value) == "process event data.stderr is not valid base64"


@pytest.mark.parametrize("text", [b"-AAA", b"_AAA", b"AA-_", b"-A"])
def test_url_safe_base64_is_decoded_wherever_it_starts(text: bytes) -> None:
    # the in-place decoder's own contract: buf[start:end], also from the buffer's first byte
    from e2b_provider.protocol.process_events import _b64_in_place

    expected = base64.urlsafe_b64decode(text + b"=" * (-len(text) % 4))
    assert _b64_in_place(bytearray(text), 0, len(text), "data.stdout") == expected
    assert _b64_in_place(bytearray(b"x" + text), 1, 1 + len(text), "data.stdout") == expected


def test_only_the_message_s_own_fields_are_read() -> None:
    # the buffer holds more after the message (the next one): its fields are not this one's
    first = b'{"event":{"data":{"stdout":"YQ==","stderr":"Yg=="}}}'
    buf = bytearray(first + b'{"event":{"data":{"stdout":"eA==","stderr":"eQ=="}}}')
    assert parse_output_message(buf, 0, len(first)) == DataEvent(b"a", b"b")


@pytest.mark.parametrize("text", ["AA=A", "A===", "AAA=A", "AA AA"])
def test_misplaced_padding_is_not_of_the_shape(text: str) -> None:
    payload = b'{"event":{"data":{"stdout":"' + text.encode() + b'"}}}'
    assert parse_output_message(bytearray(payload), 0, len(payload)) is None


def test_the_decoder_parses_small_messages_as_json_and_large_ones_in_place() -> None:
    small = {"event": {"data": {"stdout": "AA==", "future": {"field": [1]}}}}
    big_out = b"z" * (MAX_JSON_BYTES)
    big = {"event": {"data": {"stdout": base64.b64encode(big_out).decode()}}}
    dec = EnvelopeDecoder(large=parse_output_message)
    dec.feed(encode_envelope(small) + encode_envelope(big) + END)
    items = list(dec)
    assert items[0].data == small  # type: ignore[union-attr]
    assert items[1] == Parsed(DataEvent(big_out, b""))
    assert dec.finished


def test_a_large_end_of_stream_or_other_message_is_refused() -> None:
    big_error = {"error": {"code": "internal", "message": "x" * MAX_JSON_BYTES}}
    keepalive = {"event": {"keepalive": {"x": "y" * MAX_JSON_BYTES}}}
    for body, flags in ((big_error, 2), (keepalive, 0)):
        payload = json.dumps(body).encode()
        with pytest.raises(ProtocolError, match="larger than"):
            EnvelopeDecoder(large=parse_output_message).feed(envelope(payload, flags))
        # without a large-message reader, any message over the JSON bound is refused
        with pytest.raises(ProtocolError, match="larger than"):
            EnvelopeDecoder().feed(envelope(payload, flags))


# -- plain standard output, read without JSON ------------------------------------------------

#: The plain reader needs Python 3.11 (binascii's strict base64); before, it reads nothing.
PLAIN = sys.version_info >= (3, 11)


def _plain(text: bytes) -> bytes:
    return b'{"event":{"data":{"stdout":"' + text + b'"}}}'


@settings(max_examples=200, deadline=None, database=None)
@given(st.binary(max_size=200), st.binary(max_size=8), st.integers(min_value=0, max_value=300))
def test_plain_stdout_read_in_place_equals_its_json_reading(
    stdout: bytes, noise: bytes, at: int
) -> None:
    # the plain message, and the same with bytes put in anywhere: either the JSON reading's
    # event or None (then it is read as JSON, which may refuse it)
    plain = _plain(base64.b64encode(stdout))
    for payload in (plain, plain[:at] + noise + plain[at:], plain[:at] + plain[at + 1 :]):
        buf = bytearray(b"xx" + payload + b"yy")
        got = parse_plain_stdout(buf, 2, 2 + len(payload))
        assert buf == b"xx" + payload + b"yy"  # left alone (and resizable)
        buf += b"!"
        if not PLAIN:  # before 3.11 every message is read as JSON
            assert got is None
        elif payload == plain:
            assert got == DataEvent(stdout, b"")
        if got is not None:
            assert got == event_from_wire(json.loads(payload))


@pytest.mark.parametrize(
    "payload",
    [
        _plain(b"AA==") + b" ",
        b" " + _plain(b"AA=="),
        b'{"event":{"data":{"stdout":"AA==","stderr":"AA=="}}}',
        b'{"event":{"data":{"stderr":"AA==","stdout":"AA=="}}}',
        _plain(b"A\\u0041=="),  # an escape
        _plain(b"AAA"),  # unpadded: the JSON reading decides
        _plain(b"-_-_"),  # URL-safe: likewise
        _plain(b"AA=A"),
        _plain(b"AA\nAA=="),
        b'{"event":{"data":{"stdout":"}}}',  # its two ends overlap
        b'{"event": {"data": {"stdout": "AA=="}}}',
    ],
)
def test_anything_but_plain_stdout_is_left_to_json(payload: bytes) -> None:
    assert parse_plain_stdout(bytearray(payload), 0, len(payload)) is None


def test_a_process_stream_reads_plain_stdout_without_json(monkeypatch: pytest.MonkeyPatch) -> None:
    from e2b_provider.protocol import connect as _connect

    parsed: List[bytes] = []
    real = _connect._parse_json

    def spy(payload: bytes) -> Any:
        parsed.append(payload)
        return real(payload)

    monkeypatch.setattr(_connect, "_parse_json", spy)
    body = b"".join([
        encode_envelope({"event": {"start": {"pid": 7}}}),
        encode_envelope({"event": {"data": {"stdout": base64.b64encode(b"out").decode()}}}),
        encode_envelope({"event": {"data": {"stderr": base64.b64encode(b"err").decode()}}}),
        encode_envelope({"event": {"end": {"exited": True, "status": "exit status 0"}}}),
        END,
    ])
    _, error, events = read_with_peak(body)
    assert error is None
    assert [getattr(e, "stdout", None) for e in events] == [None, b"out", b"", None]
    assert events[2] == DataEvent(b"", b"err")
    plain_read = sys.version_info >= (3, 11)
    assert len(parsed) == (4 if plain_read else 5)  # the end-of-stream message included
