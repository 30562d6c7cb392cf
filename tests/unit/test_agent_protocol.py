"""The file agent's wire format on this side (``_agent_protocol``): requests and frames.

Frames are built both by hand and by the agent's own writer (``file_agent.Frames``), and
requests are read back by the agent's own parser (``file_agent.parse_requests``), so the
two ends are checked against each other, not against a copy of the format.
"""

from __future__ import annotations

import io
import json
from typing import Any, Dict, List, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2b_provider.errors import ProtocolError
from e2b_provider.protocol.agent_frames import (
    MAX_FRAME_DATA,
    MAX_FRAME_JSON,
    Frame,
    FrameDecoder,
    encode_request,
)
from e2b_provider.sandbox_side import file_agent


def frame_bytes(rid: int, last: bool, answer: Any, data: bytes = b"") -> bytes:
    body = json.dumps(answer).encode("ascii")
    return b"F %d %s %d %d\n" % (rid, b"e" if last else b"m", len(body), len(data)) + body + data


def agent_frames(frames: List[Tuple[int, bool, Dict[str, Any], bytes]]) -> bytes:
    """What the agent's own frame writer puts on its standard output."""
    out = io.BytesIO()
    writer = file_agent.Frames(out)
    for rid, last, answer, data in frames:
        writer.send(rid, last, answer, data)
    return out.getvalue()


_scalar = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12)
_json = _scalar | st.lists(_scalar, max_size=3)
_frames = st.lists(
    st.tuples(
        st.integers(0, 10**18 - 1),
        st.booleans(),
        st.dictionaries(st.text(max_size=8), _json, max_size=4),
        st.binary(max_size=300),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=100, deadline=None)
@given(frames=_frames, cuts=st.lists(st.integers(0, 5000), max_size=12))
def test_frames_split_at_any_boundary_decode_whole_and_in_order(
    frames: List[Tuple[int, bool, Dict[str, Any], bytes]], cuts: List[int]
) -> None:
    wire = agent_frames(frames)
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    dec = FrameDecoder()
    got: List[Frame] = []
    for a, b in zip(points, points[1:]):
        got += dec.feed(wire[a:b])
    assert got == [Frame(rid, last, answer, data) for rid, last, answer, data in frames]
    assert dec.buffered == 0


def test_byte_by_byte_and_many_frames_in_one_feed() -> None:
    wire = (frame_bytes(0, True, {"ready": True}) + frame_bytes(7, False, {"entries": []})
            + frame_bytes(7, True, {"count": 0}, b"xyz"))  # fmt: skip
    dec = FrameDecoder()
    assert dec.feed(b"") == []
    all_at_once = FrameDecoder().feed(wire)
    one_by_one: List[Frame] = []
    for i in range(len(wire)):
        one_by_one += dec.feed(wire[i : i + 1])
    assert one_by_one == all_at_once == [
        Frame(0, True, {"ready": True}),
        Frame(7, False, {"entries": []}),
        Frame(7, True, {"count": 0}, b"xyz"),
    ]


def test_buffered_counts_what_is_not_yet_a_frame() -> None:
    whole = frame_bytes(3, True, {"a": 1}, b"0123456789")
    dec = FrameDecoder()
    assert dec.feed(whole[:5]) == [] and dec.buffered == 5
    # the header is taken once complete; the rest waits for its data
    head_len = whole.index(b"\n") + 1
    assert dec.feed(whole[5 : head_len + 3]) == [] and dec.buffered == 3
    assert dec.feed(whole[head_len + 3 : -1]) == []
    assert dec.feed(whole[-1:]) == [Frame(3, True, {"a": 1}, b"0123456789")]
    assert dec.buffered == 0


def test_a_frame_of_json_only_and_empty_json_object() -> None:
    assert FrameDecoder().feed(b"F 1 e 2 0\n{}") == [Frame(1, True, {})]
    assert FrameDecoder().feed(b"F 1 m 2 3\n{}abc") == [Frame(1, False, {}, b"abc")]


@pytest.mark.parametrize(
    "wire",
    [
        b"X 1 e 2 0\n{}",  # not a frame header
        b"F 1 x 2 0\n{}",  # neither m nor e
        b"F -1 e 2 0\n{}",  # a negative id
        b"F 1 e 2\n{}",  # a length missing
        b"F 1  e 2 0\n{}",  # two spaces
        b"F 1 e 2 0 \n{}",  # trailing space
        b"f 1 e 2 0\n{}",
        b"F 1 e 0x2 0\n{}",
        b"F \xd9\xa1 e 2 0\n{}",  # a non-ASCII digit
        b"F 1234567890123456789 e 2 0\n{}",  # more than 18 digits of id
        b"F 1 e 1234567890123 0\n",  # more than 12 digits of length
        b"\n",
        b"F" + b" " * 200,  # no newline within a header's length
        b"hello, I am a shell prompt $ ",  # ... shorter, then more junk
    ],
)
def test_garbage_is_a_protocol_error(wire: bytes) -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError):
        dec.feed(wire)
        dec.feed(b"x" * 200)  # for junk too short to judge yet


def test_a_header_is_judged_once_longer_than_any_frame_header() -> None:
    dec = FrameDecoder()
    assert dec.feed(b"F 1 e 2 0" + b"0" * 119) == []  # 128 bytes: could still be one
    with pytest.raises(ProtocolError, match="not a frame"):
        dec.feed(b"0")


def test_oversized_announcements_are_refused_before_their_data() -> None:
    with pytest.raises(ProtocolError, match="larger than allowed"):
        FrameDecoder().feed(b"F 1 e %d 0\n" % (MAX_FRAME_JSON + 1))
    with pytest.raises(ProtocolError, match="larger than allowed"):
        FrameDecoder().feed(b"F 1 e 2 %d\n" % (MAX_FRAME_DATA + 1))
    # exactly the bounds: accepted, waiting for the bytes
    dec = FrameDecoder()
    assert dec.feed(b"F 1 e %d %d\n" % (MAX_FRAME_JSON, MAX_FRAME_DATA)) == []
    # a decoder of its own bound
    small = FrameDecoder(max_data=10)
    assert small.feed(b"F 1 e 2 10\n{}0123456789") == [Frame(1, True, {}, b"0123456789")]
    with pytest.raises(ProtocolError, match="larger than allowed"):
        small.feed(b"F 2 e 2 11\n")


@pytest.mark.parametrize(
    "body",
    [b"{not json}", b"{\"a\": 1", b"{\"a\": \"\xc3\xa9\"}", b"\xff\xfe{}", b"{}}"],
)
def test_a_frame_that_is_not_json_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="not JSON"):
        FrameDecoder().feed(b"F 1 e %d 0\n" % len(body) + body)


@pytest.mark.parametrize("body", [b"[]", b"[1,2]", b"1", b"\"x\"", b"null", b"true"])
def test_json_that_is_not_an_object_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="not a JSON object"):
        FrameDecoder().feed(b"F 1 e %d 0\n" % len(body) + body)


def test_encode_request_layout() -> None:
    fields = {"path": "/tmp/é\n", "max": 5, "id": 99, "op": "nope", "len": 1}
    wire = encode_request(4, "write", fields, b"\x00data\n")
    line, payload = wire.split(b"\n", 1)
    assert payload == b"\x00data\n"
    line.decode("ascii")  # only ASCII: non-ASCII text is escaped
    assert b"\\u00e9" in line and b"\\n" in line
    assert json.loads(line) == {"path": "/tmp/é\n", "max": 5, "id": 4, "op": "write", "len": 6}
    assert b" " not in line  # compact
    assert fields["id"] == 99  # the caller's dict is left alone
    assert encode_request(1, "ping", {}) == b'{"id":1,"op":"ping","len":0}\n'


class _Collect:
    def __init__(self) -> None:
        self.got: List[Tuple[Dict[str, Any], bytes]] = []

    def submit(self, req: Dict[str, Any], payload: bytes) -> None:
        self.got.append((req, payload))


@settings(max_examples=100, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(st.sampled_from(["ping", "stat", "write", "list"]),
                  st.dictionaries(st.sampled_from(["path", "max", "depth"]),
                                  st.text(max_size=30) | st.integers(0, 10**9), max_size=3),
                  st.binary(max_size=200)),
        min_size=1, max_size=6,
    ),
    cut=st.integers(0, 2000),
)  # fmt: skip
def test_the_agent_parses_encoded_requests_back(
    reqs: List[Tuple[str, Dict[str, Any], bytes]], cut: int
) -> None:
    wire = b"".join(encode_request(i + 1, op, f, p) for i, (op, f, p) in enumerate(reqs))
    sink = _Collect()
    buf = bytearray()
    for piece in (wire[:cut], wire[cut:]):
        buf += piece
        file_agent.parse_requests(buf, sink)  # type: ignore[arg-type]
    assert buf == bytearray()
    assert [(r["id"], r["op"], r["len"]) for r, _ in sink.got] == [
        (i + 1, op, len(p)) for i, (op, _, p) in enumerate(reqs)
    ]
    assert [p for _, p in sink.got] == [p for _, _, p in reqs]
    for (r, _), (_, f, _) in zip(sink.got, reqs):
        assert {k: r[k] for k in f} == f
