"""envd client tests: the Start stream, SendSignal, /files and /health over real sockets."""

from __future__ import annotations

import email.parser
import email.policy
import socket
import threading
import time
from typing import Any, List

import pytest
from envd_wire import END_OK, SID, SIGNAL, START, b64, ev, started_then_silent
from server import ACCESS_TOKEN, Request, Responder, ScriptedServer, assert_no_secret
from waiting import wait_until

from e2b_provider.clients.envd import EnvdClient
from e2b_provider.errors import (
    AuthenticationError,
    E2BHttpError,
    InvalidArgument,
    ProtocolError,
    RemoteError,
    TransportError,
)
from e2b_provider.models import Target
from e2b_provider.protocol.connect import encode_envelope
from e2b_provider.protocol.process_events import DataEvent, EndEvent, KeepaliveEvent, StartEvent
from e2b_provider.transport.client import Transport


def stream_of(*frames: bytes, end: bool = True, chunk_split: bool = False) -> Any:
    def handler(q: Request, r: Responder) -> None:
        r.start_chunked()
        for f in frames:
            if chunk_split:  # a frame split across chunks, one byte at a time
                for i in range(len(f)):
                    r.chunk(f[i:i + 1])
            else:
                r.chunk(f)
        if end:
            r.end_chunked()
        else:
            r.drop()

    return handler


def decode_request_envelope(body: bytes) -> Any:
    import json

    assert body[0] == 0
    n = int.from_bytes(body[1:5], "big")
    assert len(body) == 5 + n
    return json.loads(body[5:])


def envd_headers_ok(req: Request) -> None:
    assert req.headers["e2b-sandbox-id"] == SID
    assert req.headers["e2b-sandbox-port"] == "49983"
    assert req.headers["x-access-token"] == ACCESS_TOKEN


# -- Start -------------------------------------------------------------------------------


def test_start_streams_events_in_order(server: ScriptedServer, envd: EnvdClient) -> None:
    server.on("POST", START, stream_of(
        ev({"start": {"pid": 42}}),
        ev({"keepalive": {}}),
        ev({"data": {"stdout": b64(b"hello\n")}}) + ev({"data": {"stderr": b64(b"oops")}}),
        ev({"end": {"exited": True, "status": "exit status 0"}}) + END_OK,
    ))
    with envd.start(user="sandbox", cmd="/bin/sh", args=["-c", "echo hello"],
                    envs={"HOME": "/workspace"}, cwd="/workspace") as ps:
        events = list(ps)
        assert ps.pid == 42
    assert events == [
        StartEvent(42),
        KeepaliveEvent(),
        DataEvent(b"hello\n", b""),
        DataEvent(b"", b"oops"),
        EndEvent(exited=True, status="exit status 0"),
    ]
    assert isinstance(events[-1], EndEvent) and events[-1].exit_code == 0
    (req,) = server.received()
    envd_headers_ok(req)
    assert req.headers["content-type"] == "application/connect+json"
    assert req.headers["connect-protocol-version"] == "1"
    assert req.headers["authorization"] == "Basic " + b64(b"sandbox:")
    assert req.headers["keepalive-ping-interval"] == "50"
    assert decode_request_envelope(req.body) == {
        "process": {"cmd": "/bin/sh", "args": ["-c", "echo hello"],
                    "envs": {"HOME": "/workspace"}, "cwd": "/workspace"},
        "stdin": False,
    }


def test_start_minimal_request_and_byte_split_frames(
    server: ScriptedServer, envd: EnvdClient
) -> None:
    server.on("POST", START, stream_of(
        ev({"start": {"pid": 7}}),
        ev({"end": {"exitCode": 3, "exited": True, "status": "exit status 3"}}),
        END_OK,
        chunk_split=True,
    ))
    ps = envd.start(user="root", cmd="false", args=[], keepalive_seconds=5)
    events = list(ps)
    assert [type(e) for e in events] == [StartEvent, EndEvent]
    assert isinstance(events[1], EndEvent) and events[1].exit_code == 3
    (req,) = server.received()
    assert req.headers["keepalive-ping-interval"] == "5"
    assert decode_request_envelope(req.body) == {
        "process": {"cmd": "false", "args": []}, "stdin": False}


def test_start_yields_events_as_they_arrive(server: ScriptedServer, envd: EnvdClient) -> None:
    go_on = threading.Event()
    released: List[bool] = []

    def handler(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(ev({"start": {"pid": 9}}))
        released.append(r.hold(go_on, timeout=30))
        r.chunk(ev({"end": {"exited": True, "status": "exit status 0"}}) + END_OK)
        r.end_chunked()

    server.on("POST", START, handler)
    with envd.start(user="sandbox", cmd="sleep", args=["1"]) as ps:
        t0 = time.monotonic()
        assert next(ps) == StartEvent(9)
        assert time.monotonic() - t0 < 5.0  # waiting for more: the 30 s hold
        go_on.set()
        assert [type(e) for e in ps] == [EndEvent]
    assert released == [True]  # the end came because the test saw the start, not by timeout


def test_end_stream_error_is_remote_error_after_earlier_events(
    server: ScriptedServer, envd: EnvdClient
) -> None:
    server.on("POST", START, stream_of(
        ev({"start": {"pid": 1}})
        + encode_envelope({"error": {"code": "invalid_argument",
                                     "message": "cwd '/nope' does not exist"}},
                          end_stream=True),
    ))
    ps = envd.start(user="sandbox", cmd="true", args=[], cwd="/nope")
    assert next(ps) == StartEvent(1)
    with pytest.raises(RemoteError) as ei:
        next(ps)
    assert ei.value.code == "invalid_argument"
    assert "does not exist" in ei.value.message
    assert "process start" in str(ei.value)


@pytest.mark.parametrize(
    "frames",
    [
        [ev({"start": {"pid": 1}})],  # clean EOF, no end-of-stream
        [ev({"start": {"pid": 1}}), ev({"keepalive": {}})[:7]],  # EOF inside an envelope
    ],
)
def test_truncated_stream_is_protocol_error(
    server: ScriptedServer, envd: EnvdClient, frames: List[bytes]
) -> None:
    server.on("POST", START, stream_of(*frames))
    ps = envd.start(user="sandbox", cmd="true", args=[])
    assert next(ps) == StartEvent(1)
    with pytest.raises(ProtocolError):
        next(ps)
    assert not ps.aborted


def test_dropped_connection_is_transport_error(server: ScriptedServer, envd: EnvdClient) -> None:
    server.on("POST", START, stream_of(ev({"start": {"pid": 1}}), end=False))
    ps = envd.start(user="sandbox", cmd="true", args=[])
    with pytest.raises((TransportError, ProtocolError)):
        list(ps)
    assert not ps.aborted


def test_abort_process_stream_from_another_thread(
    server: ScriptedServer, envd: EnvdClient
) -> None:
    server.on("POST", START, started_then_silent(5))
    ps = envd.start(user="sandbox", cmd="sleep", args=["100"])
    assert next(ps) == StartEvent(5)
    timer = threading.Timer(0.2, ps.abort)
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(TransportError, match="aborted"):
            next(ps)
    finally:
        timer.join()
    assert time.monotonic() - t0 < 5.0  # not aborted: the 30 s hold
    assert ps.aborted
    ps.abort()
    ps.close()


def test_start_http_errors(server: ScriptedServer, envd: EnvdClient) -> None:
    server.on(
        "POST", START,
        lambda q, r: r.json(401, {"code": 401, "message": f"bad token {ACCESS_TOKEN}"}),
        lambda q, r: r.send(502, b"Failed to route request to sandbox", content_type="text/plain"),
        lambda q, r: r.send(200, b"<html>login</html>", content_type="text/html"),
    )
    with pytest.raises(AuthenticationError) as auth:
        envd.start(user="sandbox", cmd="true", args=[])
    assert_no_secret(auth.value)
    with pytest.raises(E2BHttpError) as edge:
        envd.start(user="sandbox", cmd="true", args=[])
    assert edge.value.status == 502 and "Failed to route" in edge.value.message
    with pytest.raises(ProtocolError, match="not a Connect stream"):
        envd.start(user="sandbox", cmd="true", args=[])


def test_start_validates_before_io(server: ScriptedServer, envd: EnvdClient) -> None:
    with pytest.raises(InvalidArgument):
        envd.start(user="sandbox", cmd="true", args=[], keepalive_seconds=0)
    with pytest.raises(InvalidArgument):
        envd.start(user="a:b", cmd="true", args=[])
    with pytest.raises(InvalidArgument):
        envd.start(user="sandbox", cmd="true", args="not a list")
    assert server.received() == []


# -- SendSignal --------------------------------------------------------------------------


def test_send_signal(server: ScriptedServer, envd: EnvdClient) -> None:
    server.on(
        "POST", SIGNAL,
        lambda q, r: r.json(200, {}),
        lambda q, r: r.json(404, {"code": "not_found", "message": "process with pid 42 not found"}),
        lambda q, r: r.json(500, {"code": "internal",
                                  "message": "error sending signal: os: process already finished"}),
        lambda q, r: r.json(500, {"code": "internal", "message": "something else"}),
        lambda q, r: r.json(404, {"code": 404, "message": "not a connect answer"}),
    )
    assert envd.send_signal(42) is True
    assert envd.send_signal(42) is False
    assert envd.send_signal(42, "SIGNAL_SIGTERM") is False
    with pytest.raises(E2BHttpError) as ei:
        envd.send_signal(42)
    assert ei.value.status == 500 and ei.value.code == "internal"
    with pytest.raises(E2BHttpError):
        envd.send_signal(42)
    reqs = server.received()
    envd_headers_ok(reqs[0])
    assert reqs[0].headers["content-type"] == "application/json"
    assert reqs[0].headers["connect-protocol-version"] == "1"
    assert reqs[0].json() == {"process": {"pid": 42}, "signal": "SIGNAL_SIGKILL"}
    assert reqs[2].json()["signal"] == "SIGNAL_SIGTERM"
    with pytest.raises(InvalidArgument):
        envd.send_signal(0)
    with pytest.raises(InvalidArgument):
        envd.send_signal(1, "SIGNAL_SIGHUP")


# -- /files ------------------------------------------------------------------------------


def test_upload_multipart_shape(server: ScriptedServer, envd: EnvdClient) -> None:
    entry = {"path": "/opt/up/x.bin", "name": "x.bin", "type": "file"}
    full = {"code": 507, "message": "not enough disk space available"}
    server.on("POST", "/files", lambda q, r: r.json(200, [entry]), lambda q, r: r.json(507, full))
    payload = bytes(range(256)) * 4
    envd.upload("/opt/up/x.bin", payload, user="root")
    (req,) = server.received()
    envd_headers_ok(req)
    assert req.q("path") == "/opt/up/x.bin" and req.q("username") == "root"
    ctype = req.headers["content-type"]
    assert ctype.startswith("multipart/form-data; boundary=")
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + req.body
    )
    parts = list(msg.iter_parts())
    assert len(parts) == 1
    assert parts[0].get_param("name", header="content-disposition") == "file"
    assert parts[0].get_filename() == "x.bin"
    assert parts[0].get_payload(decode=True) == payload
    with pytest.raises(E2BHttpError) as ei:
        envd.upload("/opt/up/y", b"y", user="root")
    assert ei.value.status == 507


def test_upload_stream_sized_or_chunked(server: ScriptedServer, envd: EnvdClient) -> None:
    server.on("POST", "/files", lambda q, r: r.json(200, []))
    pieces = [b"a" * 1000, b"", b"b" * 70000, b"c"]
    envd.upload_stream("/opt/s", iter(pieces), user="root", length=71001)
    envd.upload_stream("/opt/c", iter(pieces), user="root")
    sized, chunked = server.received()
    for req in (sized, chunked):
        envd_headers_ok(req)
        assert req.headers["content-type"] == "application/octet-stream"
        assert req.body == b"".join(pieces)
    assert sized.headers.get("content-length") == "71001"
    assert "transfer-encoding" not in sized.headers
    assert chunked.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in chunked.headers


@pytest.mark.parametrize("length", [5, 7])
def test_upload_stream_refuses_a_body_that_is_not_its_length(
    server: ScriptedServer, envd: EnvdClient, length: int
) -> None:
    # a body that does not match what was announced is never sent as if it did: the
    # request ends with the connection dropped, and the next request is unaffected
    server.on("POST", "/files", lambda q, r: r.json(200, []))
    with pytest.raises(ProtocolError, match="announced length"):
        envd.upload_stream("/opt/x", iter([b"abc", b"abc"]), user="root", length=length)
    envd.upload_stream("/opt/y", iter([b"ok"]), user="root", length=2)
    # the server logs the cut request once it has read to the drop, maybe after the second
    wait_until(lambda: len(server.received()) == 2, 10.0, "both requests in the server's log")
    cut, ok = sorted(server.received(), key=lambda r: str(r.q("path")))
    assert cut.q("path") == "/opt/x" and cut.headers["content-length"] == str(length)
    assert len(cut.body) < length and b"abc".startswith(cut.body[:3])  # it never got it all
    assert ok.q("path") == "/opt/y" and ok.body == b"ok"
    assert server.accepted == 2  # the cut connection was not used again


def test_download(server: ScriptedServer, envd: EnvdClient) -> None:
    server.on("GET", "/files",
              lambda q, r: r.send(200, b"file-bytes"),
              lambda q, r: r.json(404, {"code": 404, "message": "path '/x' does not exist"}),
              lambda q, r: r.json(400, {"code": 400, "message": "path '/d' is a directory"}),
              lambda q, r: r.send(200, b"z" * 100))
    assert envd.download("/x", user="sandbox", max_bytes=100) == b"file-bytes"
    assert envd.download("/x", user="sandbox", max_bytes=100) is None
    with pytest.raises(E2BHttpError) as ei:
        envd.download("/d", user="sandbox", max_bytes=100)
    assert ei.value.status == 400
    with pytest.raises(ProtocolError, match="larger than 99"):
        envd.download("/big", user="sandbox", max_bytes=99)
    req = server.received()[0]
    envd_headers_ok(req)
    assert req.q("path") == "/x" and req.q("username") == "sandbox"


# -- /health -----------------------------------------------------------------------------


def test_health(
    server: ScriptedServer, envd: EnvdClient, transport: Transport,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server.on("GET", "/health", lambda q, r: r.empty(204), lambda q, r: r.json(502, {}),
              lambda q, r: r.hold(timeout=30))
    assert envd.health() is True
    assert envd.health() is False
    # a 60 s default: health(timeout=0.3) ignoring its argument waits out the 30 s hold
    monkeypatch.setattr(EnvdClient.health, "__kwdefaults__", {"timeout": 60.0})
    t0 = time.monotonic()
    assert envd.health(timeout=0.3) is False
    assert time.monotonic() - t0 < 5.0
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    dead = EnvdClient(transport, Target(url=f"http://127.0.0.1:{port}", sandbox_id=SID,
                                        access_token=ACCESS_TOKEN))
    assert dead.health(timeout=0.5) is False
    assert ACCESS_TOKEN not in repr(dead)
