"""Control-plane client tests: what goes on the wire, and how answers are read."""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from typing import Any, Dict, Iterator, List

import pytest
from control_wire import CONNECT, SID
from server import ACCESS_TOKEN, API_KEY, Request, Responder, ScriptedServer, assert_no_secret
from waiting import wait_until

from e2b_provider.cancel import CancelToken
from e2b_provider.clients.control import (
    GUEST_UNRESPONSIVE,
    ControlPlane,
    _retry_after,
)
from e2b_provider.clients.control_answers import ListedSandbox, SandboxInfo
from e2b_provider.errors import (
    Cancelled,
    ConfigError,
    Conflict,
    E2BHttpError,
    InvalidArgument,
    MissingAccessToken,
    NotFound,
    ProtocolError,
    SandboxGoneError,
)
from e2b_provider.models import Target
from e2b_provider.transport.client import Transport
from e2b_provider.transport.response import HttpResponse


def sandbox(sid: str = SID, **extra: Any) -> Dict[str, Any]:
    body = {
        "sandboxID": sid,
        "templateID": "tmpl",
        "clientID": "6532622b",
        "envdVersion": "0.6.13",
        "envdAccessToken": ACCESS_TOKEN,
    }
    body.update(extra)
    return body


def answer(status: int, obj: Any = None, headers: Dict[str, str] | None = None) -> Any:
    def handler(q: Request, r: Responder) -> None:
        if obj is None:
            r.empty(status, headers)
        else:
            r.json(status, obj, headers)

    return handler


def err(status: int, message: str, error_code: str | None = None,
        headers: Dict[str, str] | None = None, code: Any = None) -> Any:
    body: Dict[str, Any] = {"code": status if code is None else code, "message": message}
    if error_code:
        body["error_code"] = error_code
    return answer(status, body, headers)


@pytest.fixture
def cp(server: ScriptedServer, transport: Transport) -> Iterator[ControlPlane]:
    yield ControlPlane(transport, api_url=server.url + "/", api_key=API_KEY, domain="e2b.test",
                       request_timeout=5)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> List[float]:
    """The waits (seconds) the client makes between tries; each is still made for real."""
    import e2b_provider.clients.control as control

    seen: List[float] = []
    real = control._wait

    def spy(token: Any, seconds: float) -> None:
        seen.append(seconds)
        real(token, seconds)

    monkeypatch.setattr(control, "_wait", spy)
    return seen


def test_config_is_validated(transport: Transport) -> None:
    with pytest.raises(ConfigError):
        ControlPlane(transport, api_url="ftp://x", api_key=API_KEY, domain="e2b.app")
    with pytest.raises(ConfigError):
        ControlPlane(transport, api_url="https://api.e2b.app", api_key="", domain="e2b.app")
    with pytest.raises(ConfigError):
        ControlPlane(transport, api_url="https://api.e2b.app", api_key=API_KEY, domain="E2B")
    with pytest.raises(ConfigError):
        ControlPlane(transport, api_url="https://api.e2b.app", api_key=API_KEY,
                     domain="e2b.app", sandbox_url="localhost:3000")
    cp = ControlPlane(transport, api_url="https://api.e2b.app", api_key=API_KEY,
                      domain="e2b.app")
    assert API_KEY not in repr(cp)


# -- create ------------------------------------------------------------------------------


def test_create_sends_body_and_headers(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("POST", "/v2/sandboxes", answer(201, sandbox(domain="eu.e2b.test")))
    body = {"templateID": "tmpl", "metadata": {"capybara-sandbox-name": "n"}, "timeout": 300,
            "autoPause": True}
    info = cp.create(body, idempotency_key="0f1e2d3c-aaaa-bbbb-cccc-0123456789ab")
    assert info == SandboxInfo(
        sandbox_id=SID, domain="eu.e2b.test", envd_version="0.6.13", client_id="6532622b",
        template_id="tmpl", envd_access_token=ACCESS_TOKEN, raw_status=201, resumed=False,
    )
    assert ACCESS_TOKEN not in repr(info)
    (req,) = server.received()
    assert req.path == "/v2/sandboxes"
    assert req.json() == body
    assert req.headers["x-api-key"] == API_KEY
    assert req.headers["content-type"] == "application/json"
    assert req.headers["idempotency-key"] == "0f1e2d3c-aaaa-bbbb-cccc-0123456789ab"


def test_create_domain_falls_back_to_config(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("POST", "/v2/sandboxes", answer(201, sandbox(domain=None)))
    info = cp.create({"templateID": "t"})
    assert info.domain == "e2b.test"
    assert "idempotency-key" not in server.received()[0].headers


@pytest.mark.parametrize(
    "bad",
    [sandbox(sid="bad id!"), sandbox(domain="EVIL..host/x"), {"templateID": "t"}, ["x"]],
)
def test_create_rejects_bad_answers(server: ScriptedServer, cp: ControlPlane, bad: Any) -> None:
    server.on("POST", "/v2/sandboxes", answer(201, bad))
    with pytest.raises(ProtocolError) as ei:
        cp.create({"templateID": "t"})
    assert_no_secret(ei.value)


def test_create_on_pre_v2_control_plane_is_config_error(
    server: ScriptedServer, cp: ControlPlane
) -> None:
    server.on("POST", "/v2/sandboxes", err(400, "validation error: method not allowed"))
    with pytest.raises(ConfigError, match="predates the /v2 API"):
        cp.create({"templateID": "t"})
    # A body the validator rejects is an ordinary 400, not an old control plane.
    bad_body = err(400, "validation error: field 'timeout' must be an integer")
    server.on("POST", "/v2/sandboxes", bad_body)
    with pytest.raises(E2BHttpError) as ei:
        cp.create({"templateID": "t", "timeout": "x"})
    assert ei.value.status == 400 and not isinstance(ei.value, ConfigError)


def test_create_is_retried_only_with_an_idempotency_key(
    server: ScriptedServer, cp: ControlPlane
) -> None:
    busy = err(503, "no capacity", "sandbox_capacity_unavailable", {"Retry-After": "0"})
    server.on("POST", "/v2/sandboxes", busy)
    with pytest.raises(E2BHttpError) as ei:
        cp.create({"templateID": "t"})
    assert ei.value.status == 503 and ei.value.error_code == "sandbox_capacity_unavailable"
    assert len(server.received()) == 1
    server.on("POST", "/v2/sandboxes", busy, answer(201, sandbox()))
    assert cp.create({"templateID": "t"}, idempotency_key="k-1").sandbox_id == SID
    reqs = server.received()[1:]
    assert len(reqs) == 2
    assert {r.headers["idempotency-key"] for r in reqs} == {"k-1"}
    with pytest.raises(InvalidArgument):
        cp.create({}, idempotency_key="Not Valid")


def test_error_text_never_holds_the_key(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("POST", "/v2/sandboxes", err(401, f"Invalid API key {API_KEY}"))
    with pytest.raises(E2BHttpError) as ei:
        cp.create({"templateID": "t"})
    assert ei.value.status == 401
    assert_no_secret(ei.value)
    assert API_KEY not in ei.value.message


# -- connect / attach --------------------------------------------------------------------



def test_connect_body_and_status(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("POST", CONNECT, answer(200, sandbox()), answer(201, sandbox()))
    running = cp.connect(SID, timeout_seconds=3600)
    resumed = cp.connect(SID, timeout_seconds=600, memory=False)
    assert (running.resumed, running.raw_status) == (False, 200)
    assert (resumed.resumed, resumed.raw_status) == (True, 201)
    first, second = server.received()
    assert first.json() == {"timeout": 3600}
    assert second.json() == {"timeout": 600, "memory": False}
    assert first.headers["x-api-key"] == API_KEY


def test_connect_validates_before_io(server: ScriptedServer, cp: ControlPlane) -> None:
    with pytest.raises(InvalidArgument):
        cp.connect("../etc", timeout_seconds=10)
    with pytest.raises(InvalidArgument):
        cp.connect(SID, timeout_seconds=0)
    assert server.received() == []


def test_connect_404_gone_vs_missing_route(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("POST", CONNECT, err(404, f'Sandbox "{SID}" doesn\'t exist'))
    with pytest.raises(SandboxGoneError) as gone:
        cp.connect(SID, timeout_seconds=60)
    assert gone.value.status == 404 and SID in str(gone.value)
    server.on("POST", CONNECT, err(404, "validation error: no matching operation was found"))
    with pytest.raises(ConfigError):
        cp.connect(SID, timeout_seconds=60)
    # A 404 whose body code is not 404 (e.g. an edge page) is NotFound, not "gone".
    server.on("POST", CONNECT, answer(404, {"message": "nope"}))
    with pytest.raises(NotFound) as nf:
        cp.connect(SID, timeout_seconds=60)
    assert not isinstance(nf.value, SandboxGoneError)


def test_connect_sandbox_id_fallback_and_answer_checks(
    server: ScriptedServer, cp: ControlPlane
) -> None:
    no_id = sandbox()
    del no_id["sandboxID"]
    server.on("POST", CONNECT, answer(200, no_id))
    assert cp.connect(SID, timeout_seconds=60).sandbox_id == SID
    server.on("POST", CONNECT, answer(200, sandbox(domain="bad_domain")))
    with pytest.raises(ProtocolError, match="invalid sandbox domain"):
        cp.connect(SID, timeout_seconds=60)


def test_attach_retries_409_then_succeeds(
    server: ScriptedServer, cp: ControlPlane, waits: List[float]
) -> None:
    busy = err(409, "resume in flight")
    server.on("POST", CONNECT, busy, busy, answer(201, sandbox()))
    t0 = time.monotonic()
    info = cp.attach(SID, timeout_seconds=300)
    elapsed = time.monotonic() - t0
    assert info.resumed
    assert len(server.received()) == 3
    assert waits == [0.5, 0.5]  # the reference's wait between tries
    assert 0.9 <= elapsed < 5.0  # waited for real (the upper bound is wide for load)


def test_attach_gives_up_after_five_retries(
    server: ScriptedServer, cp: ControlPlane, waits: List[float]
) -> None:
    server.on("POST", CONNECT, err(409, f'Sandbox "{SID}" is being killed'))
    t0 = time.monotonic()
    with pytest.raises(Conflict):
        cp.attach(SID, timeout_seconds=300)
    elapsed = time.monotonic() - t0
    assert len(server.received()) == 6
    assert waits == [0.5] * 5
    assert 2.4 <= elapsed < 6.0


def test_attach_permanent_409_is_raised_at_once(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("POST", CONNECT, err(409, "mismatch", "idempotency_request_mismatch"))
    with pytest.raises(Conflict) as ei:
        cp.attach(SID, timeout_seconds=300)
    assert ei.value.error_code == "idempotency_request_mismatch"
    assert len(server.received()) == 1


def test_attach_unresponsive_agent_reconnects_once_without_memory(
    server: ScriptedServer, cp: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    server.on("POST", CONNECT, err(409, "guest agent unresponsive", GUEST_UNRESPONSIVE),
              answer(201, sandbox()))
    with caplog.at_level(logging.WARNING, logger="e2b_provider"):
        info = cp.attach(SID, timeout_seconds=300)
    assert info.resumed
    first, second = server.received()
    assert first.json() == {"timeout": 300}
    assert second.json() == {"timeout": 300, "memory": False}
    assert any("memory: false" in r.getMessage() and SID in r.getMessage()
               for r in caplog.records)
    assert all(API_KEY not in r.getMessage() for r in caplog.records)


def test_attach_unresponsive_agent_twice_is_raised(
    server: ScriptedServer, cp: ControlPlane
) -> None:
    server.on("POST", CONNECT, err(409, "guest agent unresponsive", GUEST_UNRESPONSIVE))
    with pytest.raises(Conflict) as ei:
        cp.attach(SID, timeout_seconds=300)
    assert ei.value.error_code == GUEST_UNRESPONSIVE
    assert len(server.received()) == 2


def test_attach_cancel_during_409_wait(
    server: ScriptedServer, cp: ControlPlane, waits: List[float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import e2b_provider.clients.control as control

    # a 30 s wait between tries: one not ended by the cancel takes far past the bound
    monkeypatch.setattr(control, "CONNECT_CONFLICT_WAIT_SECONDS", 30.0)
    server.on("POST", CONNECT, err(409, "busy"))
    tok = CancelToken()

    def cancel_in_the_wait() -> None:
        wait_until(lambda: waits, 10.0, "attach to wait after the 409")
        tok.cancel("stop")

    canceller = threading.Thread(target=cancel_in_the_wait)
    canceller.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Cancelled):
            cp.attach(SID, timeout_seconds=300, cancel=tok)
    finally:
        canceller.join(30)
    assert time.monotonic() - t0 < 5.0
    assert waits == [30.0]
    assert len(server.received()) == 1


def test_attach_gone(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("POST", CONNECT, err(404, "not found"))
    with pytest.raises(SandboxGoneError):
        cp.attach(SID, timeout_seconds=300)


# -- retries -----------------------------------------------------------------------------


def test_503_is_retried_with_retry_after(
    server: ScriptedServer, cp: ControlPlane, waits: List[float]
) -> None:
    server.on("POST", CONNECT, err(503, "busy", headers={"Retry-After": "1"}),
              answer(200, sandbox()))
    t0 = time.monotonic()
    cp.connect(SID, timeout_seconds=60)
    assert waits == [1.0]  # the answer's Retry-After, not the 0.2 s backoff
    assert 0.9 <= time.monotonic() - t0 < 5.0
    assert len(server.received()) == 2


def test_retry_markers_and_bound(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("GET", f"/sandboxes/{SID}", err(503, "busy", headers={"Should-Retry": "false"}))
    with pytest.raises(E2BHttpError):
        cp.get(SID)
    assert len(server.received()) == 1
    server.on("GET", f"/sandboxes/{SID}", err(500, "flaky", headers={"Should-Retry": "true",
                                                                      "Retry-After": "0"}),
              answer(200, sandbox(state="running")))
    assert cp.get(SID)["state"] == "running"
    assert len(server.received()) == 3
    server.on("GET", f"/sandboxes/{SID}", err(429, "slow down", headers={"Retry-After": "0"}))
    with pytest.raises(E2BHttpError) as ei:
        cp.get(SID)
    assert ei.value.status == 429
    assert len(server.received()) == 3 + 4  # one try and three retries


def test_retry_after_parsing() -> None:
    def ra(v: str) -> Any:
        return _retry_after(HttpResponse(503, {"retry-after": v}))

    assert ra("2") == 2.0
    assert ra("100") == 5.0
    assert ra("-3") == 0.0
    assert ra("soon") is None
    assert ra("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert _retry_after(HttpResponse(503, {})) is None


# -- pause / delete / get / timeout ------------------------------------------------------

PAUSE = f"/sandboxes/{SID}/pause"


def test_pause_bodies_and_errors(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("POST", PAUSE, answer(204))
    assert cp.pause(SID) == 204
    assert cp.pause(SID, memory=False) == 204
    assert [r.json() for r in server.received()] == [{}, {"memory": False}]
    server.on("POST", PAUSE, err(409, "already paused"))
    with pytest.raises(Conflict):
        cp.pause(SID)
    server.on("POST", PAUSE, err(404, "no such sandbox"))
    with pytest.raises(SandboxGoneError):
        cp.pause(SID)


def test_pause_without_retry_reports_503_at_once(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("POST", PAUSE, err(503, "node busy", headers={"Retry-After": "2"}))
    with pytest.raises(E2BHttpError) as ei:
        cp.pause(SID, retry=False)
    assert ei.value.status == 503
    assert getattr(ei.value, "retry_after", None) == 2.0
    assert len(server.received()) == 1


def test_delete(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("DELETE", f"/sandboxes/{SID}", answer(204), err(404, "gone"),
              err(404, "validation error: no matching operation was found"))
    assert cp.delete(SID) is True
    assert cp.delete(SID) is False
    with pytest.raises(ConfigError):
        cp.delete(SID)
    assert all(r.headers["x-api-key"] == API_KEY for r in server.received())


def test_get_and_set_timeout(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("GET", f"/sandboxes/{SID}", answer(200, sandbox(state="paused")),
              err(404, "gone"))
    server.on("POST", f"/sandboxes/{SID}/timeout", answer(204))
    assert cp.get(SID)["state"] == "paused"
    with pytest.raises(SandboxGoneError):
        cp.get(SID)
    cp.set_timeout(SID, 120)
    assert server.received("POST")[0].json() == {"timeout": 120}


# -- list --------------------------------------------------------------------------------


def test_list_pages_and_encodes_metadata_like_the_reference(
    server: ScriptedServer, cp: ControlPlane
) -> None:
    name = "a b/c+d"
    mine = {"capybara-sandbox-name": name}
    pages: List[Any] = [
        answer(200, [{"sandboxID": "i1", "state": "running", "metadata": mine},
                     {"sandboxID": "i2", "state": "running", "metadata": {"other": "x"}}],
               {"X-Next-Token": "tok2"}),
        answer(200, [{"sandboxID": "i3", "state": "paused", "metadata": mine,
                      "envdUnresponsiveAtPause": True}], {"x-next-token": "tok3"}),
        answer(200, [], {"x-next-token": ""}),
    ]
    server.on("GET", "/v2/sandboxes", *pages)
    got = cp.list(metadata=mine)
    assert got == [
        ListedSandbox("i1", "running", mine, False),
        ListedSandbox("i3", "paused", mine, True),
    ]
    reqs = server.received()
    assert len(reqs) == 3
    for r in reqs:
        assert r.q("state") == "running,paused"
        assert r.q("limit") == "100"
        # The server decodes the parameter once more, splits it, and decodes each part:
        # it gets the original pair back.
        raw_meta = r.q("metadata")
        assert raw_meta is not None
        meta = urllib.parse.unquote(raw_meta)
        pairs = dict(p.split("=", 1) for p in meta.split("&"))
        assert {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs.items()} == mine
    # Double-encoded on the wire, exactly as encodeURIComponent + URLSearchParams does it.
    assert "metadata=capybara-sandbox-name%3Da%252520b%25252Fc%25252Bd" in reqs[0].raw_query
    assert [r.q("nextToken") for r in reqs] == [None, "tok2", "tok3"]


def test_list_page_bound(server: ScriptedServer, cp: ControlPlane,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    import e2b_provider.clients.control as control

    monkeypatch.setattr(control, "LIST_MAX_PAGES", 5)
    server.on("GET", "/v2/sandboxes", answer(200, [], {"x-next-token": "again"}))
    with pytest.raises(ProtocolError, match="more than 5 pages"):
        cp.list(metadata={"k": "v"})
    assert len(server.received()) == 5


def test_list_rejects_bad_answers(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("GET", "/v2/sandboxes", answer(200, {"not": "a list"}),
              answer(200, [{"sandboxID": "bad id", "metadata": {"k": "v"}}]))
    with pytest.raises(ProtocolError):
        cp.list(metadata={"k": "v"})
    with pytest.raises(ProtocolError, match="invalid sandbox id"):
        cp.list(metadata={"k": "v"})
    with pytest.raises(InvalidArgument):
        cp.list(metadata={}, limit=1000)


# -- target_for --------------------------------------------------------------------------


def test_target_for(transport: Transport, cp: ControlPlane) -> None:
    info = SandboxInfo(sandbox_id=SID, domain="eu.e2b.test", envd_access_token=ACCESS_TOKEN,
                       raw_status=201, resumed=True)
    t = cp.target_for(info)
    assert t == Target(url=f"https://49983-{SID}.eu.e2b.test", sandbox_id=SID,
                       access_token=ACCESS_TOKEN, domain="eu.e2b.test", resumed=True)
    assert ACCESS_TOKEN not in repr(t)
    routed = ControlPlane(transport, api_url="http://127.0.0.1:1", api_key=API_KEY,
                          domain="e2b.test", sandbox_url="http://127.0.0.1:2/")
    assert routed.target_for(info).url == "http://127.0.0.1:2"


def test_target_for_refuses_tokenless_and_bad_values(cp: ControlPlane) -> None:
    for tok in (None, ""):
        with pytest.raises(MissingAccessToken) as ei:
            cp.target_for(SandboxInfo(sandbox_id=SID, domain="e2b.test", envd_access_token=tok,
                                      raw_status=201))
        assert str(ei.value).startswith(
            f"E2B answered for sandbox {SID} without an envd access token"
        )
        assert ei.value.status == 201 and ei.value.sandbox_id == SID
        assert isinstance(ei.value, ProtocolError)
    with pytest.raises(ProtocolError):
        cp.target_for(SandboxInfo(sandbox_id="no/slash", domain="e2b.test",
                                  envd_access_token=ACCESS_TOKEN))
    with pytest.raises(ProtocolError):
        cp.target_for(SandboxInfo(sandbox_id=SID, domain="evil.test/x",
                                  envd_access_token=ACCESS_TOKEN))


def test_tokenless_answer_is_refused(server: ScriptedServer, cp: ControlPlane) -> None:
    server.on("POST", CONNECT, answer(200, sandbox(envdAccessToken=None)))
    info = cp.connect(SID, timeout_seconds=60)
    assert info.envd_access_token is None
    with pytest.raises(MissingAccessToken) as ei:
        cp.target_for(info)
    assert ei.value.status == 200
