"""HTTP/1.1 framing for the port relay: heads, bodies, upgrades, however the bytes are cut."""

from __future__ import annotations

import random
from typing import List, Optional, Sequence, Tuple

import pytest

from e2b_provider.protocol.http1 import (
    BODY,
    END,
    HEAD,
    RAW,
    REFUSED,
    SWITCHED,
    Event,
    Framer,
    FramingError,
    Head,
)


def run(framer: Framer, pieces: Sequence[bytes]) -> List[Event]:
    events: List[Event] = []
    for piece in pieces:
        events.extend(framer.feed(piece))
    return events


def cuts(data: bytes, seed: int) -> List[bytes]:
    """``data`` cut at random places (some pieces empty, some one byte)."""
    rng = random.Random(seed)
    out, pos = [], 0
    while pos < len(data):
        n = rng.choice([0, 1, 2, 3, 7, 64, 1000])
        out.append(data[pos : pos + n])
        pos += n
    return out


def summary(events: List[Event]) -> List[Tuple[int, Optional[bytes]]]:
    """Heads as start lines, adjacent body (or raw) pieces joined."""
    out: List[Tuple[int, Optional[bytes]]] = []
    for kind, payload in events:
        if kind in (BODY, RAW) and out and out[-1][0] == kind:
            prev = out[-1][1] or b""
            assert isinstance(payload, bytes)
            out[-1] = (kind, prev + payload)
        elif kind == HEAD:
            assert isinstance(payload, Head)
            out.append((HEAD, payload.start_line))
        elif kind in (BODY, RAW):
            assert isinstance(payload, bytes)
            out.append((kind, payload))
        else:
            out.append((kind, None))
    return out


REQUESTS = (
    b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
    b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    b"\r\n"  # a stray empty line between messages is ignored
    b"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nX-Trailer: t\r\n\r\n"
    b"GET /d HTTP/1.0\n\n"
)
EXPECTED_REQUESTS = [
    (HEAD, b"GET /a HTTP/1.1"),
    (END, None),
    (HEAD, b"POST /b HTTP/1.1"),
    (BODY, b"hello"),
    (END, None),
    (HEAD, b"PUT /c HTTP/1.1"),
    (BODY, b"3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nX-Trailer: t\r\n\r\n"),
    (END, None),
    (HEAD, b"GET /d HTTP/1.0"),
    (END, None),
]


@pytest.mark.parametrize("seed", range(40))
def test_requests_are_framed_the_same_however_the_bytes_are_cut(seed: int) -> None:
    pieces = [REQUESTS] if seed == 0 else cuts(REQUESTS, seed)
    assert summary(run(Framer(is_request=True), pieces)) == EXPECTED_REQUESTS


def test_a_head_is_parsed_and_can_be_rewritten() -> None:
    (kind, head), _ = Framer(is_request=True).feed(
        b"GET /x?q=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nX-A:  1 \r\nhost: dup\r\n\r\n"
    )
    assert kind == HEAD and isinstance(head, Head)
    assert head.method == b"GET" and head.status == 0
    assert head.get(b"HOST") == b"dup" and head.get(b"x-a") == b"1"
    assert head.rewritten((b"host",), ((b"Host", b"8000-id.e2b.app"),)) == (
        b"GET /x?q=1 HTTP/1.1\r\nX-A: 1\r\nHost: 8000-id.e2b.app\r\n\r\n"
    )


RESPONSES = (
    b"HTTP/1.1 100 Continue\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"
    b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"  # answers a HEAD: no body
    b"HTTP/1.1 204 No Content\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n"
    b"HTTP/1.1 200 OK\r\n\r\nuntil the end"
)


@pytest.mark.parametrize("seed", range(40))
def test_responses_follow_the_methods_asked(seed: int) -> None:
    framer = Framer(is_request=False)
    for method in (b"POST", b"HEAD", b"GET", b"GET", b"GET", b"GET"):
        framer.expect(method)
    pieces = [RESPONSES] if seed == 0 else cuts(RESPONSES, seed)
    events = run(framer, pieces) + framer.eof()
    assert summary(events) == [
        (HEAD, b"HTTP/1.1 100 Continue"),
        (HEAD, b"HTTP/1.1 200 OK"),
        (BODY, b"abc"),
        (END, None),
        (HEAD, b"HTTP/1.1 200 OK"),
        (END, None),
        (HEAD, b"HTTP/1.1 204 No Content"),
        (END, None),
        (HEAD, b"HTTP/1.1 200 OK"),
        (BODY, b"2\r\nhi\r\n0\r\n\r\n"),
        (END, None),
        (HEAD, b"HTTP/1.1 304 Not Modified"),
        (END, None),
        (HEAD, b"HTTP/1.1 200 OK"),
        (BODY, b"until the end"),
        (END, None),
    ]


@pytest.mark.parametrize("seed", range(40))
def test_a_content_framer_gives_bodies_without_their_chunk_framing(seed: int) -> None:
    framer = Framer(is_request=False, content=True)
    for method in (b"POST", b"GET", b"GET"):
        framer.expect(method)
    data = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nX-Trailer: t\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz"
        b"HTTP/1.1 200 OK\r\n\r\nuntil the end"
    )
    pieces = [data] if seed == 0 else cuts(data, seed)
    events = run(framer, pieces) + framer.eof()
    assert summary(events) == [
        (HEAD, b"HTTP/1.1 200 OK"),
        (BODY, b"abc0123456789abcdef"),
        (END, None),
        (HEAD, b"HTTP/1.1 200 OK"),
        (BODY, b"xyz"),
        (END, None),
        (HEAD, b"HTTP/1.1 200 OK"),
        (BODY, b"until the end"),
        (END, None),
    ]
    # every piece of content is handed over as soon as it came, never held back
    framer = Framer(is_request=False, content=True)
    framer.expect(b"POST")
    assert [e[0] for e in framer.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")] \
        == [HEAD]
    assert framer.feed(b"8\r\nabc") == [(BODY, b"abc")]
    assert framer.feed(b"defgh") == [(BODY, b"defgh")]
    assert framer.feed(b"\r\n") == []


@pytest.mark.parametrize("seed", range(20))
def test_an_upgrade_holds_the_requests_until_the_answer(seed: int) -> None:
    upgrade = (
        b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\n"
        b"Upgrade: websocket\r\n\r\n"
    )
    after = b"\x81\x85frame-bytes"
    requests = Framer(is_request=True)
    events = run(requests, cuts(upgrade + after, seed) if seed else [upgrade + after])
    assert summary(events) == [(HEAD, b"GET /ws HTTP/1.1"), (END, None)]
    assert requests.held
    responses = Framer(is_request=False)
    responses.expect(b"GET", upgrade=True)
    answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x02hi"
    got = run(responses, cuts(answer, seed) if seed else [answer])
    assert summary(got) == [
        (HEAD, b"HTTP/1.1 101 Switching Protocols"),
        (END, None),
        (SWITCHED, None),
        (RAW, b"\x81\x02hi"),
    ]
    assert summary(requests.resume(True) + requests.feed(b"more")) == [(RAW, after + b"more")]
    assert requests.raw and responses.raw


def test_a_refused_upgrade_goes_back_to_framing_requests() -> None:
    requests = Framer(is_request=True)
    head = b"GET /ws HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"
    events = requests.feed(head + b"GET /next HTTP/1.1\r\n\r\n")
    assert summary(events) == [(HEAD, b"GET /ws HTTP/1.1"), (END, None)]
    responses = Framer(is_request=False)
    responses.expect(b"GET", upgrade=True)
    got = responses.feed(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    assert [k for k, _ in got] == [HEAD, REFUSED, END]
    assert summary(requests.resume(False)) == [(HEAD, b"GET /next HTTP/1.1"), (END, None)]
    assert not requests.raw


@pytest.mark.parametrize(
    "data, status",
    [
        (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n folded: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nbad name: x\r\n\r\n", 400),
        (b"NOT HTTP\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 70000, 431),
    ],
)
def test_malformed_requests_are_refused_with_a_status(data: bytes, status: int) -> None:
    with pytest.raises(FramingError) as info:
        Framer(is_request=True).feed(data)
    assert info.value.status == status


def test_a_connection_ending_inside_a_framed_body_is_an_error() -> None:
    framer = Framer(is_request=False)
    framer.expect(b"GET")
    framer.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(FramingError):
        framer.eof()
    idle = Framer(is_request=True)
    assert idle.eof() == [] and idle.between_messages


def test_a_large_body_passes_in_pieces_without_being_held() -> None:
    framer = Framer(is_request=True)
    body = bytes(range(256)) * 4096  # 1 MiB
    events = framer.feed(b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body))
    got = bytearray()
    for i in range(0, len(body), 65536):
        for kind, payload in framer.feed(body[i : i + 65536]):
            if kind == BODY:
                assert isinstance(payload, bytes)
                got += payload
            events.append((kind, payload))
    assert bytes(got) == body and events[-1] == (END, None)


def test_an_error_keeps_the_messages_before_the_bad_one_and_nothing_of_it() -> None:
    framer = Framer(is_request=True)
    with pytest.raises(FramingError) as info:
        framer.feed(b"GET /good HTTP/1.1\r\n\r\nGET /bad HTTP/1.1\r\nContent-Length: x\r\n\r\n")
    assert summary(info.value.events) == [(HEAD, b"GET /good HTTP/1.1"), (END, None)]
    answers = Framer(is_request=False)
    assert answers.answered_all
    answers.expect(b"GET")
    assert not answers.answered_all
    answers.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\no")
    assert not answers.answered_all
    answers.feed(b"k")
    assert answers.answered_all
