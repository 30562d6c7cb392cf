"""A terminal's envd calls over real sockets: Start with ``pty`` and Connect as a RawStream
(timed reads that lose nothing, abort, silence, cuts, error answers, the opening's deadline,
a forwarding proxy), SendInput with ``input.pty``, Update and List."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, List

import pytest
from envd_wire import CONNECT, END_OK, START, b64, ev, started_then_silent
from server import ACCESS_TOKEN, Request, Responder, ScriptedServer, assert_no_secret

from e2b_provider.cancel import CancelToken, Deadline
from e2b_provider.clients.envd import EnvdClient
from e2b_provider.errors import (
    Cancelled,
    E2BHttpError,
    InvalidArgument,
    NotFound,
    ProtocolError,
    TransportError,
    TransportTimeout,
)
from e2b_provider.protocol.connect import EndStream, EnvelopeDecoder, Message
from e2b_provider.transport.client import Transport
from e2b_provider.transport.raw_stream import RawStream


def events_of(raw: RawStream, want: int, timeout: float = 5.0) -> List[Dict[str, Any]]:
    """The next ``want`` messages' events (or fewer at the end-of-stream)."""
    dec = EnvelopeDecoder()
    out: List[Dict[str, Any]] = []
    deadline = Deadline.after(timeout)
    while len(out) < want:
        data = raw.read(deadline.remaining())
        assert data is not None, "nothing within the timeout"
        if not data:
            break
        dec.feed(data)
        for item in dec:
            if isinstance(item, Message):
                out.append(item.data["event"])
            elif isinstance(item, EndStream):
                return out
    return out


def test_start_pty_request_and_timed_reads_that_lose_nothing(
    server: ScriptedServer, envd: EnvdClient
) -> None:
    go_on = threading.Event()

    def handler(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(ev({"start": {"pid": 42}}))
        r.hold(go_on, timeout=30)
        frame = ev({"data": {"pty": b64(b"$ ")}})
        r.chunk(frame[:3])  # one message cut across chunks and time
        time.sleep(0.05)
        r.chunk(frame[3:] + ev({"end": {"exitCode": 3, "exited": True,
                                        "status": "exit status 3"}}) + END_OK)
        r.end_chunked()

    server.on("POST", START, handler)
    raw = envd.start_pty(user="sandbox", cmd="/bin/sh", args=["-c", "x"], cols=100, rows=30,
                         envs={"TERM": "xterm-256color"}, cwd="/workspace", tag="t1",
                         timeout_ms=60000)
    try:
        assert events_of(raw, 1) == [{"start": {"pid": 42}}]
        t0 = time.monotonic()
        assert raw.read(0) is None  # nothing yet, and no waiting
        assert raw.read(0.2) is None  # nothing within 0.2 s: the stream goes on
        assert 0.15 < time.monotonic() - t0 < 5.0
        go_on.set()
        assert events_of(raw, 2) == [
            {"data": {"pty": b64(b"$ ")}},
            {"end": {"exitCode": 3, "exited": True, "status": "exit status 3"}},
        ]
        assert raw.read(1.0) == b""  # the end of the body
        assert raw.read(1.0) == b""
    finally:
        raw.close()
    (req,) = server.received()
    assert req.headers["authorization"] == "Basic " + b64(b"sandbox:")
    assert req.headers["keepalive-ping-interval"] == "50"
    assert req.headers["connect-timeout-ms"] == "60000"
    assert req.headers["accept-encoding"] == "identity"
    assert req.headers["x-access-token"] == ACCESS_TOKEN
    assert json.loads(req.body[5:]) == {  # as the SDK's pty.create: no stdin field
        "process": {"cmd": "/bin/sh", "args": ["-c", "x"], "envs": {"TERM": "xterm-256color"},
                    "cwd": "/workspace"},
        "pty": {"size": {"cols": 100, "rows": 30}},
        "tag": "t1",
    }


def test_a_raw_stream_is_aborted_from_another_thread(
    server: ScriptedServer, envd: EnvdClient
) -> None:
    server.on("POST", CONNECT, started_then_silent(5))
    raw = envd.connect_pty(5, user="sandbox")
    assert events_of(raw, 1) == [{"start": {"pid": 5}}]
    timer = threading.Timer(0.2, raw.abort)
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(TransportError, match="aborted"):
            raw.read(None)
    finally:
        timer.join()
        raw.close()
    assert time.monotonic() - t0 < 5.0
    assert raw.aborted
    (req,) = server.received()
    assert json.loads(req.body[5:]) == {"process": {"pid": 5}}


def test_a_silent_peer_ends_a_raw_stream(server: ScriptedServer, transport: Transport) -> None:
    def stall(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(b"x")
        r.hold(timeout=30)

    server.on("POST", START, stall)
    raw = transport.open_raw_stream("POST", server.url + START, data=b"{}", read_timeout=0.5,
                                    operation="terminal stream")
    try:
        assert raw.read(5) == b"x"
        t0 = time.monotonic()
        with pytest.raises(TransportTimeout, match=r"sent nothing for 0\.5 s"):
            raw.read(None)
        assert time.monotonic() - t0 < 5.0
    finally:
        raw.close()


def test_a_cut_stream_is_a_transport_error_and_bad_framing_a_protocol_error(
    server: ScriptedServer, transport: Transport
) -> None:
    def cut(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(b"abc")
        r.drop()

    def bad(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.raw(b"zz\r\n")  # not a chunk size

    server.on("POST", START, cut, bad)
    for error, match in ((TransportError, "ended before the end"), (ProtocolError, "HTTP/1.1")):
        opened: List[RawStream] = []
        try:
            # (the bad framing may come with the head: then the opening raises it)
            with pytest.raises(error, match=match):
                opened.append(transport.open_raw_stream(
                    "POST", server.url + START, data=b"{}", read_timeout=5,
                    operation="terminal stream"))
                while True:
                    assert opened[0].read(5) is not None
        finally:
            for raw in opened:
                raw.close()


def test_start_pty_error_answers(server: ScriptedServer, envd: EnvdClient) -> None:
    server.on(
        "POST", START,
        lambda q, r: r.json(401, {"code": 401, "message": f"bad token {ACCESS_TOKEN}"}),
        lambda q, r: r.send(200, b"<html>login</html>", content_type="text/html"),
    )
    with pytest.raises(E2BHttpError) as auth:
        envd.start_pty(user="sandbox", cmd="sh", args=[], cols=80, rows=24)
    assert auth.value.status == 401
    assert_no_secret(auth.value)
    with pytest.raises(ProtocolError, match="not a Connect stream"):
        envd.start_pty(user="sandbox", cmd="sh", args=[], cols=80, rows=24)
    for bad in ({"cols": 0}, {"rows": 65536}, {"cols": True}, {"timeout_ms": 0}):
        kwargs: Dict[str, Any] = {"cols": 80, "rows": 24, **bad}
        with pytest.raises(InvalidArgument):
            envd.start_pty(user="sandbox", cmd="sh", args=[], **kwargs)
    assert len(server.received()) == 2  # the bad arguments sent nothing


def test_the_opening_is_bounded_and_cancellable(
    server: ScriptedServer, transport: Transport
) -> None:
    server.on("POST", START, lambda q, r: r.hold(timeout=30))
    t0 = time.monotonic()
    with pytest.raises(TransportTimeout):
        transport.open_raw_stream("POST", server.url + START, data=b"{}", read_timeout=30,
                                  operation="terminal stream", deadline=Deadline.after(0.5))
    assert time.monotonic() - t0 < 5.0
    token = CancelToken()
    timer = threading.Timer(0.3, token.cancel)
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Cancelled):
            transport.open_raw_stream("POST", server.url + START, data=b"{}", read_timeout=30,
                                      operation="terminal stream", cancel=token)
    finally:
        timer.join()
    assert time.monotonic() - t0 < 5.0


def test_a_raw_stream_goes_through_a_forwarding_proxy(
    monkeypatch: pytest.MonkeyPatch, server: ScriptedServer
) -> None:
    proxy = ScriptedServer()
    try:
        def answer(q: Request, r: Responder) -> None:
            r.start_chunked()
            r.chunk(b"via proxy")
            r.end_chunked()

        proxy.on("POST", START, answer)
        for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        with Transport() as t:
            raw = t.open_raw_stream("POST", server.url + START, data=b"{}", read_timeout=5,
                                    operation="terminal stream")
            try:
                assert raw.read(5) == b"via proxy" and raw.read(5) == b""
            finally:
                raw.close()
        assert server.received() == []
        assert [r.target for r in proxy.received()] == [server.url + START]
    finally:
        proxy.stop()


def test_pty_input_resize_and_list(server: ScriptedServer, envd: EnvdClient) -> None:
    server.on("POST", "/process.Process/SendInput", lambda q, r: r.json(200, {}))
    server.on("POST", "/process.Process/Update",
              lambda q, r: r.json(200, {}),
              lambda q, r: r.json(404, {"code": "not_found",
                                        "message": "process with pid 9 not found"}))
    server.on("POST", "/process.Process/List",
              lambda q, r: r.json(200, {"processes": [{"pid": 9, "tag": "t",
                                                       "config": {"cmd": "sh"}}]}),
              lambda q, r: r.json(200, {}))
    envd.send_input(9, b"ls\r", pty=True)
    envd.resize_pty(9, 120, 40)
    with pytest.raises(NotFound):
        envd.resize_pty(9, 120, 40)
    with pytest.raises(InvalidArgument):
        envd.resize_pty(9, 0, 40)
    assert envd.list_processes() == [{"pid": 9, "tag": "t", "config": {"cmd": "sh"}}]
    assert envd.list_processes() == []
    sent = {r.path.rsplit("/", 1)[1]: r.json() for r in server.received()
            if r.path.endswith(("SendInput", "Update"))}
    assert sent == {
        "SendInput": {"process": {"pid": 9}, "input": {"pty": b64(b"ls\r")}},
        "Update": {"process": {"pid": 9}, "pty": {"size": {"cols": 120, "rows": 40}}},
    }
