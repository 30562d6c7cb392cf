"""The provider over real sockets against a scripted E2B: control plane and envd on one server.

These tests drive the public :class:`~e2b_provider.E2BSandboxProvider` API and assert on what
reached the wire, for behaviour that depends on exactly what E2B answers: which 502s on a
process start may be retried, how a cut stderr is decoded, and what Ctrl-C does while a kill
is under way.
"""

from __future__ import annotations

import base64
import contextlib
import json
import select
import signal
import threading
from typing import Any, Callable, Dict, Iterator, List

import pytest
from control_wire import CONNECT, SANDBOX, SID
from envd_wire import SIGNAL, START
from server import API_KEY, Request, Responder, ScriptedServer
from waiting import thread_blocked_in, wait_until

from e2b_provider import DeploymentConfig, E2BHttpError, E2BSandboxProvider, OperationTimeout
from e2b_provider._watchdog import Watchdog
from e2b_provider.protocol.connect import encode_envelope

PID = 42

#: A sandbox paused between our connect and our request: E2B's edge answers this itself.
EDGE_NOT_FOUND = {"sandboxId": SID, "message": "The sandbox was not found", "code": 502}


def connected(q: Request, r: Responder) -> None:
    r.json(200, SANDBOX)


def event(**ev: Any) -> bytes:
    return encode_envelope({"event": ev})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


Handler = Callable[[Request, Responder], None]


def process_stream(*data: Dict[str, str], exit_code: int = 0) -> Handler:
    """A whole Start answer: start (pid 42), the given data events, end, end of stream."""

    def handler(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(event(start={"pid": PID}))
        for d in data:
            r.chunk(event(data=d))
        end: Dict[str, Any] = {"exited": True, "status": f"exit status {exit_code}"}
        if exit_code:
            end["exitCode"] = exit_code
        r.chunk(event(end=end))
        r.chunk(encode_envelope({}, end_stream=True))
        r.end_chunked()

    return handler


def json_answer(status: int, obj: Any) -> Handler:
    return lambda q, r: r.json(status, obj)


def started_process(q: Request) -> Dict[str, Any]:
    """The ``process`` of a Start request (its Connect envelope decoded)."""
    assert q.body[0] == 0 and int.from_bytes(q.body[1:5], "big") == len(q.body) - 5
    process: Dict[str, Any] = json.loads(q.body[5:])["process"]
    return process


@pytest.fixture
def make_provider(server: ScriptedServer) -> Iterator[Callable[..., E2BSandboxProvider]]:
    made: List[E2BSandboxProvider] = []

    def make(**kwargs: Any) -> E2BSandboxProvider:
        config = DeploymentConfig(
            API_KEY, "base", api_url=server.url, sandbox_url=server.url, domain="e2b.test"
        )
        p = E2BSandboxProvider(config, **kwargs)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


# -- which 502 on a process start is retried ------------------------------------------------


@pytest.mark.parametrize(
    "status, body",
    [
        (502, {"code": 502, "message": "Bad gateway"}),
        (502, {"sandboxId": SID, "message": "The sandbox is running but port is not open",
               "code": 502}),
        (502, "<html><body><h1>502 Bad Gateway</h1></body></html>"),
        (503, EDGE_NOT_FOUND | {"code": 503}),
    ],
)  # fmt: skip
def test_only_the_edge_not_found_502_is_retried(
    server: ScriptedServer, make_provider: Callable[..., E2BSandboxProvider], status: int, body: Any
) -> None:
    # Any other error on a start may come after envd ran the command: a retry could run a
    # non-idempotent command twice, so it is raised as it is.
    server.on("POST", CONNECT, connected)
    if isinstance(body, str):
        html = body.encode()
        server.on("POST", START, lambda q, r: r.send(status, html, content_type="text/html"))
    else:
        server.on("POST", START, json_answer(status, body))
    p = make_provider()
    with pytest.raises(E2BHttpError) as ei:
        p.exec(SID, "echo once >> /workspace/log", timeout=30.0)
    assert ei.value.status == status
    assert len(server.received("POST", START)) == 1
    assert len(server.received("POST", CONNECT)) == 1


def test_edge_not_found_502_reconnects_and_retries_once(
    server: ScriptedServer, make_provider: Callable[..., E2BSandboxProvider]
) -> None:
    server.on("POST", CONNECT, connected)
    server.on(
        "POST",
        START,
        json_answer(502, EDGE_NOT_FOUND),
        process_stream({"stdout": b64(b"ran\n")}),
    )
    p = make_provider()
    r = p.exec(SID, "echo ran", timeout=30.0)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "ran\n", "")
    assert (r.truncated, r.timed_out, r.cancelled, r.wedged) == (False, False, False, False)
    # connect (resumes the paused sandbox), start → 502, connect again, start again
    assert [q.path for q in server.received()] == [CONNECT, START, CONNECT, START]

    server.requests.clear()
    server.on("POST", START, json_answer(502, EDGE_NOT_FOUND))
    with pytest.raises(E2BHttpError) as ei:
        p.exec(SID, "echo ran", timeout=30.0)
    assert ei.value.status == 502
    assert len(server.received("POST", START)) == 2  # retried once, not more


# -- output ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [10, 11])
def test_stderr_cut_inside_a_character_drops_the_partial_character(
    server: ScriptedServer, make_provider: Callable[..., E2BSandboxProvider], cap: int
) -> None:
    # 9 ASCII bytes then a 3-byte euro sign on stderr: the budget cuts inside the sign.
    server.on("POST", CONNECT, connected)
    server.on("POST", START, process_stream({"stderr": b64("aaaaaaaaa€bbb".encode())}))
    r = make_provider().exec(SID, "cmd", max_output_bytes=cap, timeout=30.0)
    assert r.truncated
    assert (r.stdout, r.stderr) == ("", "aaaaaaaaa")


def test_invalid_utf8_in_untruncated_stderr_is_replaced_not_dropped(
    server: ScriptedServer, make_provider: Callable[..., E2BSandboxProvider]
) -> None:
    server.on("POST", CONNECT, connected)
    server.on("POST", START, process_stream({"stderr": b64(b"bad \xe2\x82")}))
    r = make_provider().exec(SID, "cmd", timeout=30.0)
    assert not r.truncated
    assert r.stderr == "bad \ufffd"


# -- Ctrl-C while the timeout's kill is under way --------------------------------------------


def test_ctrl_c_after_the_timeout_fired_waits_for_the_pending_kill(
    server: ScriptedServer, make_provider: Callable[..., E2BSandboxProvider]
) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("Ctrl-C is delivered to the main thread: run this test there")
    kill_started = threading.Event()
    release_kill = threading.Event()
    kill_answered = threading.Event()

    def command(q: Request, r: Responder) -> None:
        # the command starts and never ends on its own
        r.start_chunked()
        r.chunk(event(start={"pid": PID}))
        r.hold(timeout=60)

    def kill_script(q: Request, r: Responder) -> None:
        kill_started.set()
        release_kill.wait(60)
        process_stream()(q, r)
        kill_answered.set()

    server.on("POST", CONNECT, connected)
    server.on("POST", START, command, kill_script)
    server.on("POST", SIGNAL, json_answer(200, {}))
    main = threading.get_ident()

    def ctrl_c_while_the_kill_runs() -> None:
        try:
            if kill_started.wait(30):  # the timeout fired; the kill job is under way
                signal.pthread_kill(main, signal.SIGINT)
                # Let the kill finish once the interrupted caller waits for it (in a
                # Condition or Event wait). If it never waits, the kill finishes only after
                # this bound and the assertions below fail.
                with contextlib.suppress(AssertionError):
                    wait_until(lambda: thread_blocked_in(main, "threading.py"), 10.0)
        finally:
            release_kill.set()

    wd = Watchdog(workers=2)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    helper = threading.Thread(target=ctrl_c_while_the_kill_runs)
    try:
        p = make_provider(watchdog=wd, kill_bound=30.0, interrupt_kill_bound=30.0)
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            p.exec(SID, "sleep 600", timeout=0.3)
        # The interrupt propagated only after the pending kill had done its work: the kill
        # script ran to its end and the command's pid got its SIGKILL.
        assert kill_answered.is_set()
        starts = server.received("POST", START)
        # the command is signalled by its pid (envd's lookup by tag can miss)
        signals = [q.json() for q in server.received("POST", SIGNAL)]
        assert signals == [{"process": {"pid": PID}, "signal": "SIGNAL_SIGKILL"}]
        kill = started_process(starts[1])
        assert kill["cmd"] == "/bin/sh"
    finally:
        release_kill.set()
        helper.join(30)
        signal.signal(signal.SIGINT, previous)
        wd.close()


# -- a terminal's output that came in one piece with a keepalive ----------------------------


def test_a_terminal_reads_output_that_came_after_a_keepalive_in_one_piece(
    server: ScriptedServer, make_provider: Callable[..., E2BSandboxProvider]
) -> None:
    # A select-driven reader (the CLI's exec -it) calls read(timeout=0) once the socket is
    # readable; what came in the same piece as a keepalive must be read then, not after the
    # reader's next wake-up (the socket has nothing more to say)
    opened, sent, release = threading.Event(), threading.Event(), threading.Event()

    def terminal(q: Request, r: Responder) -> None:
        assert json.loads(q.body[5:]).get("pty") is not None
        r.start_chunked()
        r.chunk(event(start={"pid": PID}))
        r.hold(opened)  # after the terminal's opening (which reads what has come)
        r.chunk(event(keepalive={}) + event(data={"pty": b64(b"hello")}))
        sent.set()
        r.hold(release)
        r.chunk(event(end={"exited": True, "status": "exit status 0"}))
        r.chunk(encode_envelope({}, end_stream=True))
        r.end_chunked()

    server.on("POST", CONNECT, connected)
    server.on("POST", START, terminal)
    p = make_provider()
    with p.terminal(SID, "echo hello; sleep 60") as t:
        opened.set()
        assert sent.wait(10)
        ready, _, _ = select.select([t.fileno()], [], [], 10)
        assert ready
        got = b""
        with contextlib.suppress(OperationTimeout):
            while True:  # as fileno() says: read(timeout=0) until it raises
                piece = t.read(timeout=0)
                assert piece, "the terminal ended"
                got += piece
        assert got == b"hello"
        release.set()
        assert t.wait(timeout=10) == 0
