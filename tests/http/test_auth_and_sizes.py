"""Over real sockets against a scripted E2B: who refused the credential, and the sizes a
create reads.

An envd 401/403 is the sandbox refusing its own access token (not the API key); a control
plane 401 is the API key. ``create`` reads the new sandbox's sizes with one
``GET /sandboxes/{id}`` (E2B's create answer has none), and a failed read does not fail the
create.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, List

import pytest
from control_wire import CONNECT, SANDBOX, SID
from envd_wire import START
from server import ACCESS_TOKEN, API_KEY, Request, Responder, ScriptedServer, assert_no_secret

from e2b_provider import (
    AuthenticationError,
    DeploymentConfig,
    E2BSandboxProvider,
    SandboxLimits,
)


@pytest.fixture
def provider(server: ScriptedServer) -> Iterator[E2BSandboxProvider]:
    config = DeploymentConfig(
        API_KEY, "base", api_url=server.url, sandbox_url=server.url, domain="e2b.test"
    )
    with E2BSandboxProvider(config) as p:
        yield p


def answer(status: int, body: Any) -> Callable[[Request, Responder], None]:
    if isinstance(body, str):
        return lambda q, r: r.send(status, body.encode(), content_type="text/plain")
    return lambda q, r: r.json(status, body)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (401, {"code": "unauthenticated", "message": "invalid access token"}),
        (403, "Forbidden"),
    ],
)
def test_envd_refusing_the_access_token_does_not_blame_the_api_key(
    server: ScriptedServer, provider: E2BSandboxProvider, status: int, body: Any
) -> None:
    server.on("POST", CONNECT, answer(200, SANDBOX))
    server.on("POST", START, answer(status, body))
    with pytest.raises(AuthenticationError) as ei:
        provider.exec(SID, "true", timeout=30.0)
    err = ei.value
    text = str(err)
    assert (err.status, err.credential) == (status, "access_token")
    assert text.startswith(
        f"running a command in sandbox {SID} failed: the sandbox refused its access token "
        f"(HTTP {status}"
    ), text
    assert "the API key is not involved" in text, text
    assert "E2B_API_KEY" not in text and "check the API key" not in text, text
    assert_no_secret(err)


def test_the_control_plane_refusing_the_api_key_says_check_it(
    server: ScriptedServer, provider: E2BSandboxProvider
) -> None:
    server.on("POST", CONNECT, answer(401, {"code": 401, "message": "Invalid API key"}))
    with pytest.raises(AuthenticationError) as ei:
        provider.exec(SID, "true", timeout=30.0)
    assert ei.value.credential == "api_key"
    assert str(ei.value) == (
        f"running a command in sandbox {SID} failed: E2B answered HTTP 401: Invalid API key; "
        "check the API key (E2B_API_KEY) and that it belongs to the sandbox's team"
    )
    assert_no_secret(ei.value)


def _creates(server: ScriptedServer, *detail: Callable[[Request, Responder], None]) -> None:
    server.on("GET", "/v2/sandboxes", answer(200, []))  # no older sandbox of the name
    server.on("POST", "/v2/sandboxes", answer(201, SANDBOX))  # no sizes, as E2B's
    server.on("GET", f"/sandboxes/{SID}", *detail)


def test_create_reads_the_sizes_the_create_answer_lacks(
    server: ScriptedServer, provider: E2BSandboxProvider, caplog: pytest.LogCaptureFixture
) -> None:
    _creates(server, answer(200, {**SANDBOX, "state": "running", "cpuCount": 8,
                                  "memoryMB": 4096, "diskSizeMB": 20480}))
    with caplog.at_level(logging.WARNING, logger="e2b_provider"):
        h = provider.create("job", SandboxLimits(cpu=8, memory_mb=2048, disk_mb=20480))
    assert (h.id, h.name, h.cpu_count, h.memory_mb, h.disk_mb) == (SID, "job", 8, 4096, 20480)
    assert len(server.received("GET", f"/sandboxes/{SID}")) == 1
    warnings: List[str] = [r.getMessage() for r in caplog.records if r.name == "e2b_provider"]
    assert warnings == [
        f"e2b_provider: sandbox {SID} ('job') has 4096 MiB of memory, not the 2048 MiB "
        "requested (memory_mb=2048): E2B gives every sandbox its template's sizes (template "
        "'base'); build a template with the sizes you need"
    ]
    assert all(ACCESS_TOKEN not in w and API_KEY not in w for w in warnings)


def test_a_failed_size_read_does_not_fail_the_create(
    server: ScriptedServer, provider: E2BSandboxProvider, caplog: pytest.LogCaptureFixture
) -> None:
    _creates(server, answer(500, {"code": 500, "message": "boom"}))
    with caplog.at_level(logging.WARNING, logger="e2b_provider"):
        h = provider.create("job", SandboxLimits(cpu=4))
    assert (h.id, h.cpu_count, h.memory_mb, h.disk_mb) == (SID, None, None, None)
    warnings = [r.getMessage() for r in caplog.records if r.name == "e2b_provider"]
    assert len(warnings) == 1 and "sizes requested were not checked" in warnings[0], warnings
