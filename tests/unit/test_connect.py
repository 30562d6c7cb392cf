"""Unit tests of the sans-IO Connect envelope codec (e2b_provider.protocol.connect)."""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2b_provider.errors import ProtocolError
from e2b_provider.protocol.connect import (
    FLAG_COMPRESSED,
    FLAG_END_STREAM,
    MAX_MESSAGE_BYTES,
    EndStream,
    EnvelopeDecoder,
    Item,
    Message,
    encode_envelope,
)

FAST = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=8), children, max_size=4),
    ),
    max_leaves=6,
)
json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=5)


def header(flags: int, length: int) -> bytes:
    return struct.pack(">BI", flags, length)


def decode_all(chunks: List[bytes], **kw: Any) -> List[Item]:
    dec = EnvelopeDecoder(**kw)
    items: List[Item] = []
    for c in chunks:
        dec.feed(c)
        items.extend(dec)
    dec.close()
    return items


def split_at(data: bytes, cuts: List[int]) -> List[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in points:
        out.append(data[prev:p])
        prev = p
    out.append(data[prev:])
    return out


@FAST
@given(
    messages=st.lists(json_objects, max_size=5),
    end=st.one_of(st.none(), st.tuples(st.text(min_size=1, max_size=10), st.text(max_size=30))),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_random_messages_split_anywhere_round_trip(
    messages: List[Dict[str, Any]], end: Any, cuts: List[int]
) -> None:
    trailer: Dict[str, Any] = {} if end is None else {"error": {"code": end[0], "message": end[1]}}
    wire = b"".join(encode_envelope(m) for m in messages) + encode_envelope(
        trailer, end_stream=True
    )
    items = decode_all(split_at(wire, cuts))
    assert items[:-1] == [Message(m) for m in messages]
    last = items[-1]
    assert isinstance(last, EndStream)
    if end is None:
        assert last.ok and last.error_code is None
    else:
        assert (last.error_code, last.error_message) == end


@FAST
@given(messages=st.lists(json_objects, min_size=1, max_size=4))
def test_byte_at_a_time(messages: List[Dict[str, Any]]) -> None:
    wire = b"".join(encode_envelope(m) for m in messages) + encode_envelope({}, end_stream=True)
    dec = EnvelopeDecoder()
    got: List[Item] = []
    for i in range(len(wire)):
        dec.feed(wire[i : i + 1])
        got.extend(dec)
        # Nothing is emitted before its last byte arrives.
        assert dec.finished == (i == len(wire) - 1)
    dec.close()
    assert got == [Message(m) for m in messages] + [EndStream()]


def test_several_envelopes_in_one_chunk_and_unicode() -> None:
    msgs: List[Dict[str, Any]] = [{"a": "é€😀"}, {"event": {"keepalive": {}}}, {}]
    wire = b"".join(encode_envelope(m) for m in msgs) + encode_envelope({}, end_stream=True)
    assert decode_all([wire]) == [Message(m) for m in msgs] + [EndStream()]


def test_encode_envelope_layout() -> None:
    env = encode_envelope({"x": 1})
    assert env[:1] == b"\x00"
    assert struct.unpack(">I", env[1:5])[0] == len(env) - 5
    assert json.loads(env[5:]) == {"x": 1}
    assert encode_envelope({}, end_stream=True)[:1] == bytes([FLAG_END_STREAM])


def _garbage_only_protocol_errors(data: bytes, cuts: List[int]) -> None:
    dec = EnvelopeDecoder(max_message_bytes=4096)
    try:
        for chunk in split_at(data, cuts):
            dec.feed(chunk)
            list(dec)
        dec.close()
    except ProtocolError:
        pass


@FAST
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=5))
def test_random_garbage_raises_only_protocol_error(data: bytes, cuts: List[int]) -> None:
    _garbage_only_protocol_errors(data, cuts)


@FAST
@given(
    flags=st.sampled_from([0, FLAG_END_STREAM]),
    body=st.binary(max_size=200),
    cuts=st.lists(st.integers(0, 300), max_size=4),
)
def test_well_framed_garbage_body_raises_only_protocol_error(
    flags: int, body: bytes, cuts: List[int]
) -> None:
    _garbage_only_protocol_errors(header(flags, len(body)) + body, cuts)


def test_deeply_nested_json_raises_protocol_error() -> None:
    body = b"[" * 100_000
    dec = EnvelopeDecoder()
    with pytest.raises(ProtocolError):
        dec.feed(header(0, len(body)) + body)


@pytest.mark.parametrize("body", [b"[1,2]", b'"text"', b"3", b"null", b"{bad", b"\xff\xfe{}"])
def test_non_object_or_invalid_json_is_protocol_error(body: bytes) -> None:
    dec = EnvelopeDecoder()
    with pytest.raises(ProtocolError):
        dec.feed(header(0, len(body)) + body)


# -- skipping messages unparsed ------------------------------------------------------------


def _skip_flagged(buf: bytearray, start: int, end: int) -> bool:
    """A test matcher: payloads starting with ``{"skip"`` are dropped."""
    return bytes(buf[start : start + 7]) == b'{"skip"'


@FAST
@given(
    messages=st.lists(
        st.one_of(json_objects, json_objects.map(lambda o: {"skip": o})), max_size=6
    ),
    skip_from=st.integers(min_value=0, max_value=6),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_skipping_drops_only_matching_messages_however_split(
    messages: List[Dict[str, Any]], skip_from: int, cuts: List[int]
) -> None:
    # Skipping is switched on once ``skip_from`` messages came out, as a reader whose budget
    # fills up would do; messages decoded before that are still delivered.
    wire = b"".join(encode_envelope(m) for m in messages) + encode_envelope({}, end_stream=True)
    dec = EnvelopeDecoder()
    if skip_from == 0:
        dec.skip_when(_skip_flagged)
    got: List[Item] = []
    for chunk in split_at(wire, cuts):
        dec.feed(chunk)
        for item in dec:
            got.append(item)
            if len(got) == skip_from:
                dec.skip_when(_skip_flagged)
    dec.close()
    assert got[-1] == EndStream()
    kept = [i.data for i in got[:-1] if isinstance(i, Message)]
    assert len(kept) + dec.skipped == len(messages)
    # ``kept`` is ``messages`` in order, minus skipped ones: each flagged, none of the first
    # ``skip_from``.
    it = iter(enumerate(messages))
    for m in kept:
        for i, candidate in it:
            if candidate == m:
                break
            assert i >= skip_from and list(candidate) == ["skip"]
    for i, candidate in it:
        assert i >= skip_from and list(candidate) == ["skip"]
    if skip_from == 0:
        assert kept == [m for m in messages if list(m) != ["skip"]]


def test_skipped_messages_are_never_parsed() -> None:
    not_json = header(0, 9) + b'{"skip" ,'  # would fail to parse
    wire = not_json + encode_envelope({"keep": 1}) + encode_envelope({}, end_stream=True)
    dec = EnvelopeDecoder()
    dec.skip_when(_skip_flagged)
    dec.feed(wire)
    assert list(dec) == [Message({"keep": 1}), EndStream()]
    assert dec.skipped == 1
    dec.skip_when(None)  # off again: the same bytes now fail
    with pytest.raises(ProtocolError):
        EnvelopeDecoder().feed(not_json)


def test_skipping_still_checks_the_framing() -> None:
    dec = EnvelopeDecoder(max_message_bytes=100)
    dec.skip_when(lambda buf, start, end: True)
    dec.feed(encode_envelope({"skip": 1}))
    with pytest.raises(ProtocolError, match="exceeds"):
        dec.feed(header(0, 101))
    dec = EnvelopeDecoder()
    dec.skip_when(lambda buf, start, end: True)
    with pytest.raises(ProtocolError, match="compressed"):
        dec.feed(header(FLAG_COMPRESSED, 2) + b"{}")


def test_the_end_of_stream_is_never_skipped() -> None:
    dec = EnvelopeDecoder()
    dec.skip_when(lambda buf, start, end: True)
    dec.feed(encode_envelope({"a": 1}) + encode_envelope({"error": {"code": "x"}},
                                                         end_stream=True))
    assert list(dec) == [EndStream(error_code="x")]
    assert dec.finished and dec.skipped == 1
    with pytest.raises(ProtocolError, match="after the end-of-stream"):
        dec.feed(b"\x00")


def test_a_matcher_error_fails_the_stream() -> None:
    def refuse(buf: bytearray, start: int, end: int) -> bool:
        raise ProtocolError("bad output message")

    dec = EnvelopeDecoder()
    dec.skip_when(refuse)
    with pytest.raises(ProtocolError, match="bad output"):
        dec.feed(encode_envelope({"a": 1}))
    with pytest.raises(ProtocolError, match="already failed"):
        dec.feed(encode_envelope({"a": 1}))


def test_compressed_flag_refused() -> None:
    body = b"{}"
    for flags in (FLAG_COMPRESSED, FLAG_COMPRESSED | FLAG_END_STREAM):
        with pytest.raises(ProtocolError, match="compress"):
            EnvelopeDecoder().feed(header(flags, len(body)) + body)


@pytest.mark.parametrize("flags", [0x04, 0x08, 0x10, 0x80, 0xFF, 0x06])
def test_unknown_flags_refused(flags: int) -> None:
    with pytest.raises(ProtocolError, match="flags"):
        EnvelopeDecoder().feed(header(flags, 2) + b"{}")


def test_oversize_header_refused_before_the_body_arrives() -> None:
    dec = EnvelopeDecoder()
    # Only the 5-byte header, claiming 1 GiB: refused at once, nothing buffered for a body.
    with pytest.raises(ProtocolError, match="exceeds"):
        dec.feed(header(0, 1 << 30))
    small = EnvelopeDecoder(max_message_bytes=10)
    with pytest.raises(ProtocolError):
        small.feed(header(0, 11))
    # Exactly at the bound is fine.
    ok = EnvelopeDecoder(max_message_bytes=10)
    ok.feed(header(0, 10) + b'{"a":"12"}')
    assert list(ok) == [Message({"a": "12"})]
    assert MAX_MESSAGE_BYTES >= 1 << 20


def test_oversize_header_split_across_feeds() -> None:
    dec = EnvelopeDecoder(max_message_bytes=100)
    raw = header(0, 101)
    dec.feed(raw[:3])
    with pytest.raises(ProtocolError):
        dec.feed(raw[3:])


def test_end_stream_without_error() -> None:
    dec = EnvelopeDecoder()
    dec.feed(encode_envelope({"metadata": {"k": ["v"]}}, end_stream=True))
    (end,) = list(dec)
    assert isinstance(end, EndStream) and end.ok
    assert end.metadata == {"k": ["v"]}
    assert dec.finished
    dec.close()


def test_end_stream_with_error() -> None:
    dec = EnvelopeDecoder()
    dec.feed(
        encode_envelope(
            {"error": {"code": "deadline_exceeded", "message": "too slow"}}, end_stream=True
        )
    )
    (end,) = list(dec)
    assert isinstance(end, EndStream)
    assert not end.ok
    assert (end.error_code, end.error_message) == ("deadline_exceeded", "too slow")


def test_end_stream_error_without_code_or_message() -> None:
    dec = EnvelopeDecoder()
    dec.feed(encode_envelope({"error": {}}, end_stream=True))
    (end,) = list(dec)
    assert isinstance(end, EndStream)
    assert end.error_code == "unknown" and end.error_message == ""


def test_end_stream_error_not_an_object() -> None:
    with pytest.raises(ProtocolError):
        EnvelopeDecoder().feed(encode_envelope({"error": "boom"}, end_stream=True))


def test_data_after_end_stream_in_same_chunk() -> None:
    dec = EnvelopeDecoder()
    with pytest.raises(ProtocolError, match="after the end-of-stream"):
        dec.feed(encode_envelope({}, end_stream=True) + encode_envelope({"x": 1}))


def test_data_after_end_stream_in_later_chunk() -> None:
    dec = EnvelopeDecoder()
    dec.feed(encode_envelope({}, end_stream=True))
    assert list(dec) == [EndStream()]
    with pytest.raises(ProtocolError, match="after the end-of-stream"):
        dec.feed(b"\x00")
    dec.feed(b"")  # an empty read is not data


def test_close_inside_an_envelope_raises() -> None:
    wire = encode_envelope({"x": 1})
    for cut in range(1, len(wire)):
        dec = EnvelopeDecoder()
        dec.feed(wire[:cut])
        assert list(dec) == []
        assert dec.buffered == cut
        with pytest.raises(ProtocolError, match="inside an envelope"):
            dec.close()


def test_close_without_end_stream_raises() -> None:
    dec = EnvelopeDecoder()
    dec.feed(encode_envelope({"x": 1}))
    assert list(dec) == [Message({"x": 1})]
    with pytest.raises(ProtocolError, match="without an end-of-stream"):
        dec.close()
    with pytest.raises(ProtocolError):
        EnvelopeDecoder().close()


def test_bad_max_message_bytes() -> None:
    with pytest.raises(ValueError):
        EnvelopeDecoder(max_message_bytes=0)


def test_messages_are_not_repeated_after_an_error() -> None:
    dec = EnvelopeDecoder()
    good = encode_envelope({"a": 1})
    with pytest.raises(ProtocolError):
        dec.feed(good + header(0, 3) + b"{x}")
    assert [m for m in dec] == [Message({"a": 1})]
    with pytest.raises(ProtocolError):
        dec.feed(good)
    assert list(dec) == []


def test_encode_envelope_is_compact_utf8_json() -> None:
    # what goes on the wire, byte for byte: no spaces, non-ASCII as UTF-8 (not \u escapes)
    body = '{"a":"é","b":[1,2]}'.encode()
    assert encode_envelope({"a": "é", "b": [1, 2]}) == b"\x00" + struct.pack(">I", len(body)) + body


def test_end_stream_with_error_keeps_its_metadata() -> None:
    dec = EnvelopeDecoder()
    dec.feed(
        encode_envelope(
            {"error": {"code": "internal", "message": "m"}, "metadata": {"k": ["v"]}},
            end_stream=True,
        )
    )
    assert list(dec) == [EndStream("internal", "m", {"k": ["v"]})]


def test_nothing_stays_buffered_after_the_end_of_stream() -> None:
    dec = EnvelopeDecoder()
    dec.feed(encode_envelope({"x": 1}) + encode_envelope({}, end_stream=True))
    assert list(dec) == [Message({"x": 1}), EndStream()]
    assert dec.finished and dec.buffered == 0


def test_smallest_message_bound_is_one_byte() -> None:
    dec = EnvelopeDecoder(max_message_bytes=1)
    with pytest.raises(ProtocolError) as too_big:
        dec.feed(encode_envelope({}))
    assert str(too_big.value) == "envelope of 2 bytes exceeds the 1-byte bound"
    for bad in ({"max_message_bytes": 0}, {"max_json_bytes": 0}):
        with pytest.raises(ValueError) as ei:
            EnvelopeDecoder(**bad)
        assert str(ei.value) == "max_message_bytes and max_json_bytes must be positive"


def test_json_bound_is_inclusive_and_may_be_one_byte() -> None:
    payload = encode_envelope({"x": "y" * 10})[5:]
    dec = EnvelopeDecoder(max_json_bytes=len(payload))  # exactly the bound: parsed
    dec.feed(encode_envelope({"x": "y" * 10}))
    assert list(dec) == [Message({"x": "y" * 10})]
    with pytest.raises(ProtocolError) as ei:
        EnvelopeDecoder(max_json_bytes=len(payload) - 1).feed(encode_envelope({"x": "y" * 10}))
    assert str(ei.value) == (
        f"a message of {len(payload)} bytes is larger than the {len(payload) - 1} bytes "
        "accepted for anything but command output"
    )
    dec = EnvelopeDecoder(max_json_bytes=1)
    with pytest.raises(ProtocolError, match="is a int, not an object"):
        dec.feed(struct.pack(">BI", 0, 1) + b"1")  # one byte of JSON: read as JSON


@pytest.mark.parametrize(
    "wire, message",
    [
        (header(0, 2) + b"[]", "envelope JSON is a list, not an object"),
        (header(0x02, 6) + b'{"error":1}'[:6], "envelope is not valid UTF-8 JSON: JSONDecodeError"),
        (encode_envelope({"error": "boom"}, end_stream=True),
         "end-of-stream error is not an object"),
        (header(0x01, 2) + b"{}", "compressed envelope refused (we never ask for compression)"),
        (encode_envelope({}, end_stream=True) + b"\x00",
         "data after the end-of-stream message"),
    ],
)  # fmt: skip
def test_protocol_error_messages(wire: bytes, message: str) -> None:
    dec = EnvelopeDecoder()
    with pytest.raises(ProtocolError) as ei:
        dec.feed(wire)
    assert str(ei.value) == message
    with pytest.raises(ProtocolError) as ei:
        dec.feed(b"more")
    assert str(ei.value) == "the stream already failed"


def test_messages_at_eof() -> None:
    dec = EnvelopeDecoder()
    dec.feed(encode_envelope({}, end_stream=True))
    with pytest.raises(ProtocolError) as ei:
        dec.feed(b"\x00")
    assert str(ei.value) == "data after the end-of-stream message"
    with pytest.raises(ProtocolError) as ei:
        EnvelopeDecoder().close()
    assert str(ei.value) == "stream ended without an end-of-stream message"
