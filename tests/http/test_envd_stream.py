"""The end of an envd process stream: connection kept, output past the cap skipped unparsed."""

from __future__ import annotations

from typing import Any, List

import pytest
from envd_wire import END_OK, START, b64, ev
from server import Request, Responder, ScriptedServer, client_sockets

from e2b_provider.clients.envd import EnvdClient
from e2b_provider.errors import ProtocolError, RemoteError
from e2b_provider.protocol.connect import encode_envelope
from e2b_provider.protocol.process_events import DataEvent, EndEvent, StartEvent


def data(out: bytes) -> bytes:
    return ev({"data": {"stdout": b64(out)}})


END = ev({"end": {"exited": True, "status": "exit status 0"}})


def chunks(*parts: bytes) -> Any:
    def handler(q: Request, r: Responder) -> None:
        r.start_chunked()
        for p in parts:
            r.chunk(p)
        r.end_chunked()

    return handler


def test_streams_read_to_their_end_share_one_connection(
    server: ScriptedServer, envd: EnvdClient
) -> None:
    server.on("POST", START, chunks(ev({"start": {"pid": 3}}), data(b"hi"), END + END_OK))
    for _ in range(4):
        events = list(envd.start(user="sandbox", cmd="true", args=[]))
        assert events[0] == StartEvent(3) and isinstance(events[-1], EndEvent)
    assert server.accepted == 1
    assert client_sockets(server.port) == 1


def test_a_connect_error_end_keeps_the_connection(
    server: ScriptedServer, envd: EnvdClient
) -> None:
    failed = encode_envelope({"error": {"code": "unavailable", "message": "no"}}, end_stream=True)
    server.on("POST", START, chunks(ev({"start": {"pid": 3}}), failed))
    for _ in range(2):
        with pytest.raises(RemoteError):
            list(envd.start(user="sandbox", cmd="true", args=[]))
    assert server.accepted == 1


def test_body_bytes_after_the_end_of_stream_are_a_protocol_error(
    server: ScriptedServer, envd: EnvdClient
) -> None:
    # The end-of-stream message and the extra bytes come in separate chunks: the extra bytes
    # are found while reading up to the body's end.
    server.on("POST", START, chunks(ev({"start": {"pid": 3}}), END_OK, b"\x00junk"))
    ps = envd.start(user="sandbox", cmd="true", args=[])
    assert next(ps) == StartEvent(3)
    with pytest.raises(ProtocolError):
        next(ps)
    assert client_sockets(server.port) == 0  # dropped, never reused


def test_skipped_output_is_not_delivered_and_the_end_is_found(
    server: ScriptedServer, envd: EnvdClient
) -> None:
    garbage = b'{"event":{"data":{"stdout":"%%%% not base64 %%%%"}}}'
    wire = [
        ev({"start": {"pid": 3}}),
        data(b"first"),
        data(b"second") + data(b"third"),
        # after skipping starts, output is never parsed or decoded: not even bad base64
        len(garbage).to_bytes(5, "big") + garbage,
        ev({"keepalive": {}}),
        END + END_OK,
    ]
    server.on("POST", START, chunks(*wire))
    ps = envd.start(user="sandbox", cmd="true", args=[])
    got: List[Any] = []
    for event in ps:
        got.append(event)
        if event == DataEvent(b"first"):
            ps.skip_output()
    assert got[0] == StartEvent(3) and got[1] == DataEvent(b"first")
    assert isinstance(got[-1], EndEvent) and got[-1].exit_code == 0
    assert DataEvent(b"second") not in got and DataEvent(b"third") not in got
    assert server.accepted == 1


def test_a_cut_output_message_is_still_detected_while_skipping(
    server: ScriptedServer, envd: EnvdClient
) -> None:
    cut = b'{"event":{"data":{"stdout":"aGk="'
    server.on("POST", START, chunks(
        ev({"start": {"pid": 3}}), data(b"x"), len(cut).to_bytes(5, "big") + cut, END + END_OK
    ))
    ps = envd.start(user="sandbox", cmd="true", args=[])
    assert next(ps) == StartEvent(3)
    assert next(ps) == DataEvent(b"x")
    ps.skip_output()
    with pytest.raises(ProtocolError):
        list(ps)
