"""How an exec's stream is opened: failures after a stop, and the Start request of a warm
sandbox.

The reference's ``run()`` catches every error of ``envdStart`` (opening included), awaits the
kill, reboots a wedged sandbox, and then returns ``exitCode: null`` when the run timed out or
was aborted; only otherwise does it throw. The envd client in those tests is a stand-in
whose ``start`` fails the way a real one does (TransportError/TransportTimeout/E2BHttpError);
the code under test, the exec engine and the watchdog, is real. The later tests send real
Start requests to a scripted local server.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional

import pytest

from e2b_provider._watchdog import Watchdog
from e2b_provider.cancel import CancelToken, Deadline
from e2b_provider.core.run_engine import run_process
from e2b_provider.errors import Cancelled, E2BHttpError, TransportError, TransportTimeout
from e2b_provider.transport.client import Transport


@pytest.fixture
def wd() -> Iterator[Watchdog]:
    w = Watchdog(workers=2)
    yield w
    w.close()


class FailingStart:
    """An envd whose ``start`` fails with ``error`` once ``ready`` is set (bounded wait)."""

    def __init__(
        self, error: Exception, ready: Optional[threading.Event] = None, before: Any = None
    ) -> None:
        self.error = error
        self.ready = ready
        self.before = before

    def start(self, **kwargs: Any) -> Any:
        if self.before is not None:
            self.before()
        if self.ready is not None:
            assert self.ready.wait(10.0)
        raise self.error


def _run(envd: Any, wd: Watchdog, **kw: Any) -> Any:
    args = dict(
        user="sandbox",
        cmd="true",
        args=[],
        max_output_bytes=64,
        watchdog=wd,
        grace_seconds=0.2,
        kill_seconds=5.0,
    )
    args.update(kw)
    return run_process(envd, **args)


def test_cancel_while_opening_then_open_fails_is_a_cancelled_result(wd: Watchdog) -> None:
    token = CancelToken()
    killed = threading.Event()
    kills: List[Optional[int]] = []

    def killer(pid: Optional[int], bound: float) -> bool:
        kills.append(pid)
        killed.set()
        return True

    envd = FailingStart(
        TransportError("E2B process start: connection failed"),
        killed,
        before=lambda: token.cancel("user stop"),
    )
    wedged: List[bool] = []
    out = _run(
        envd, wd, timeout=30.0, cancel=token, killer=killer, on_wedged=lambda: wedged.append(True)
    )
    assert out.cancelled and not out.timed_out
    assert out.exit_code is None
    assert kills == [None]  # the kill still ran (the command may have started)
    assert not out.wedged and wedged == []


def test_timeout_while_opening_then_open_fails_is_a_timed_out_result(wd: Watchdog) -> None:
    killed = threading.Event()

    def killer(pid: Optional[int], bound: float) -> bool:
        killed.set()
        return False  # the kill failed too: the sandbox is wedged and rebooted

    envd = FailingStart(TransportTimeout("E2B process start timed out"), killed)
    wedged: List[bool] = []
    out = _run(
        envd, wd, timeout=0.05, cancel=None, killer=killer, on_wedged=lambda: wedged.append(True)
    )
    assert out.timed_out and out.exit_code is None
    assert out.wedged and wedged == [True]


def test_open_failure_without_a_stop_is_raised(wd: Watchdog) -> None:
    envd = FailingStart(E2BHttpError(502, "The sandbox was not found", 502))
    with pytest.raises(E2BHttpError) as ei:
        _run(envd, wd, timeout=30.0, cancel=CancelToken(), killer=lambda p, b: True)
    assert ei.value.status == 502


# -- the Start request of a warm sandbox -------------------------------------------------
#
# A stream's request to a URL that ``requests`` has sent one to before (without a proxy) is
# sent on the same pool with urllib3 directly (``Transport._send_known``). These tests show
# that it is the same request, and fails the same way, as one sent through ``requests``.


def _scripted_server_module() -> Any:
    # tests/http's helpers are imported by plain name there (see its conftest)
    path = Path(__file__).resolve().parents[1] / "http" / "server.py"
    spec = importlib.util.spec_from_file_location("_e2b_scripted_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_server = _scripted_server_module()
HEADERS = {"Content-Type": "application/connect+json", "X-Access-Token": "tok",
           "ACCEPT": "application/json"}  # fmt: skip


@pytest.fixture
def server() -> Iterator[Any]:
    srv = _server.ScriptedServer()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def transport() -> Iterator[Transport]:
    t = Transport(pool_connections=4, pool_maxsize=8, connect_timeout=2.0)
    try:
        yield t
    finally:
        t.close()


def _events(q: Any, r: Any) -> None:
    r.start_chunked()
    r.chunk(b"one")
    r.chunk(b"two")
    r.end_chunked()


def _stream(
    t: Transport, url: str, data: bytes = b"body", read_timeout: float = 5, **kw: Any
) -> bytes:
    with t.open_stream("POST", url, headers=HEADERS, data=data, read_timeout=read_timeout,
                       operation="POST /process.Process/Start", **kw) as st:  # fmt: skip
        return st.read_all(1000)


def test_a_known_start_is_the_same_request_on_the_same_connection(
    server: Any, transport: Transport
) -> None:
    lines: List[List[Any]] = []

    def record(q: Any, r: Any) -> None:
        lines.append(list(r._h.headers.items()))  # every header line, in order
        _events(q, r)

    server.on("POST", "/process.Process/Start", record)
    url = server.url + "/process.Process/Start"
    for _ in range(3):
        assert _stream(transport, url) == b"onetwo"
    first, *later = server.received()
    assert transport._known_for(url, "POST", b"x") is not None  # later ones skipped requests
    for r in later:
        assert (r.method, r.target, r.body) == (first.method, first.target, first.body)
    assert lines[1] == lines[0] and lines[2] == lines[0]
    # the caller's header replaced the default of the same name, whatever its case
    assert [v for k, v in lines[0] if k.lower() == "accept"] == ["application/json"]
    assert server.accepted == 1  # one kept connection for all three


def test_a_known_start_fails_as_through_requests(server: Any, transport: Transport) -> None:
    server.on("POST", "/process.Process/Start", _events)
    url = server.url + "/process.Process/Start"
    assert _stream(transport, url) == b"onetwo"
    server.stop()
    messages = []
    for t in (transport, Transport(connect_timeout=2.0)):  # known URL, then a fresh transport
        with t, pytest.raises(TransportError) as ei:
            _stream(t, url)
        assert not isinstance(ei.value, TransportTimeout)
        messages.append(str(ei.value))
    assert messages[0] == messages[1]
    assert "connection refused (nothing listens there) (ConnectionError/" in messages[0]


def test_a_known_start_refuses_a_redirect(server: Any, transport: Transport) -> None:
    url = server.url + "/process.Process/Start"
    server.on("POST", "/process.Process/Start", _events,
              lambda q, r: r.send(307, b"", {"Location": "/elsewhere"}))  # fmt: skip
    assert _stream(transport, url) == b"onetwo"
    with pytest.raises(E2BHttpError) as ei:
        _stream(transport, url)
    assert ei.value.status == 307
    assert [r.path for r in server.received()] == ["/process.Process/Start"] * 2


def test_a_known_start_can_be_cancelled_while_opening(
    server: Any, transport: Transport
) -> None:
    url = server.url + "/process.Process/Start"
    server.on("POST", "/process.Process/Start", _events, lambda q, r: r.hold(timeout=30))
    assert _stream(transport, url) == b"onetwo"
    tok = CancelToken()
    timer = threading.Timer(0.2, tok.cancel, args=("stop",))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Cancelled):
            _stream(transport, url, read_timeout=30, cancel=tok)
    finally:
        timer.join()
    assert time.monotonic() - t0 < 5.0  # not cancelled: the 30 s hold or read timeout


def test_a_known_start_ends_at_its_opening_deadline(server: Any, transport: Transport) -> None:
    url = server.url + "/process.Process/Start"
    server.on("POST", "/process.Process/Start", _events, lambda q, r: r.hold(timeout=30))
    assert _stream(transport, url) == b"onetwo"
    t0 = time.monotonic()
    with pytest.raises(TransportTimeout):
        _stream(transport, url, read_timeout=30, deadline=Deadline.after(0.3))
    assert time.monotonic() - t0 < 5.0  # the deadline ignored: the 30 s read timeout


def test_a_retired_pool_is_not_used_again(server: Any) -> None:
    # a transport keeping one host's pool: a second host retires the first one's
    other = _server.ScriptedServer()
    try:
        for s in (server, other):
            s.on("POST", "/process.Process/Start", _events)
        with Transport(pool_connections=1) as t:
            url = server.url + "/process.Process/Start"
            assert _stream(t, url) == b"onetwo"
            assert _stream(t, other.url + "/process.Process/Start") == b"onetwo"
            assert t._known_for(url, "POST", b"x") is None
            assert _stream(t, url) == b"onetwo"  # through requests again, on a new pool
            assert t._known_for(url, "POST", b"x") is not None
    finally:
        other.stop()


def test_a_start_through_a_proxy_always_goes_through_requests(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the scripted server plays the proxy: it gets the absolute URL each time
    server.on("POST", "/process.Process/Start", _events)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with Transport(connect_timeout=2.0) as t:
        for _ in range(2):
            assert _stream(t, "http://e2b.test/process.Process/Start") == b"onetwo"
        assert t._known_for("http://e2b.test/process.Process/Start", "POST", b"x") is None
    assert [r.target for r in server.received()] == ["http://e2b.test/process.Process/Start"] * 2
