"""Every string argument of every public method is checked before any I/O, and a closed
provider says so with its own error."""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Iterator, Tuple

import pytest

import e2b_provider
from e2b_provider import (
    DeploymentConfig,
    E2BProviderError,
    E2BSandboxProvider,
    InvalidArgument,
    ProviderClosed,
    SandboxHandle,
)

BAD = os.fsdecode(b"\xff")  # a lone surrogate: not encodable as UTF-8
SID = "isandbox0123456789"
Call = Callable[[E2BSandboxProvider], Any]

CALLS: Tuple[Tuple[str, Call], ...] = (
    ("exec command", lambda p: p.exec(SID, f"echo {BAD}")),
    ("exec cwd", lambda p: p.exec(SID, "true", cwd=f"/tmp/{BAD}")),
    ("exec env key", lambda p: p.exec(SID, "true", env={f"K{BAD}": "v"})),
    ("exec env value", lambda p: p.exec(SID, "true", env={"K": BAD})),
    ("exec tag", lambda p: p.exec(SID, "true", tag=f"t{BAD}")),
    ("exec sandbox id", lambda p: p.exec(f"i{BAD}", "true")),
    ("exec handle id", lambda p: p.exec(SandboxHandle(f"i{BAD}"), "true")),
    ("read_file path", lambda p: p.read_file(SID, f"/tmp/{BAD}")),
    ("write_file path", lambda p: p.write_file(SID, f"/tmp/{BAD}", b"x")),
    ("stat path", lambda p: p.stat(SID, f"/tmp/{BAD}")),
    ("watch path", lambda p: p.watch(SID, f"/tmp/{BAD}").__enter__()),
    ("wait_for_file path", lambda p: p.wait_for_file(SID, f"/tmp/{BAD}")),
    ("create name", lambda p: p.create(f"job{BAD}")),
    ("destroy_by_name name", lambda p: p.destroy_by_name(f"job{BAD}")),
    ("list_sandboxes name", lambda p: p.list_sandboxes(f"job{BAD}")),
    ("kill_tagged tag", lambda p: p.kill_tagged(SID, [f"t{BAD}"])),
    ("resume id", lambda p: p.resume(f"i{BAD}")),
    ("suspend id", lambda p: p.suspend(f"i{BAD}")),
    ("destroy id", lambda p: p.destroy(f"i{BAD}")),
    ("kill_all id", lambda p: p.kill_all(f"i{BAD}")),
)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A port that accepts connections and records them (none must come)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        s.setblocking(False)
        yield s


@pytest.fixture
def provider(listener: socket.socket) -> Iterator[E2BSandboxProvider]:
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    config = DeploymentConfig("e2b_inputs_test_key_0123", "base", api_url=url, sandbox_url=url)
    with E2BSandboxProvider(config) as p:
        yield p


def _no_connection(listener: socket.socket) -> bool:
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


@pytest.mark.parametrize("call", [c for _, c in CALLS], ids=[n for n, _ in CALLS])
def test_lone_surrogates_are_refused_before_any_io(
    provider: E2BSandboxProvider, listener: socket.socket, call: Call
) -> None:
    with pytest.raises(InvalidArgument):
        call(provider)
    assert _no_connection(listener)


def test_a_command_names_its_bad_character_without_quoting_the_command(
    provider: E2BSandboxProvider,
) -> None:
    with pytest.raises(InvalidArgument) as ei:
        provider.exec(SID, f"echo secret-ish-text {BAD}")
    text = str(ei.value)
    assert "command" in text and "UTF-8" in text and "index 21" in text
    assert "secret-ish-text" not in text


def test_a_template_with_a_lone_surrogate_is_a_config_error() -> None:
    with pytest.raises(e2b_provider.ConfigError, match="surrogate"):
        DeploymentConfig("e2b_inputs_test_key_0123", f"base{BAD}")


@pytest.mark.parametrize("call", [c for _, c in CALLS], ids=[n for n, _ in CALLS])
def test_every_call_after_close_raises_provider_closed(
    provider: E2BSandboxProvider, listener: socket.socket, call: Call
) -> None:
    provider.close()
    with pytest.raises(ProviderClosed) as ei:
        call(provider)
    assert isinstance(ei.value, E2BProviderError)
    assert "closed" in str(ei.value) and "new provider" in str(ei.value)
    assert _no_connection(listener)


def test_provider_closed_is_exported() -> None:
    assert "ProviderClosed" in e2b_provider.__all__
    assert e2b_provider.ProviderClosed is ProviderClosed


CANCELS: Tuple[Tuple[str, Callable[[E2BSandboxProvider, Any], Any]], ...] = (
    ("create", lambda p, c: p.create("job", cancel=c)),
    ("info", lambda p, c: p.info(SID, cancel=c)),
    ("resume", lambda p, c: p.resume(SID, cancel=c)),
    ("suspend", lambda p, c: p.suspend(SID, cancel=c)),
    ("destroy", lambda p, c: p.destroy(SID, cancel=c)),
    ("destroy_by_name", lambda p, c: p.destroy_by_name("job", cancel=c)),
    ("list_sandboxes", lambda p, c: p.list_sandboxes(cancel=c)),
    ("kill_all", lambda p, c: p.kill_all(SID, cancel=c)),
    ("kill_tagged", lambda p, c: p.kill_tagged(SID, ["t"], cancel=c)),
    ("exec", lambda p, c: p.exec(SID, "true", cancel=c)),
    ("start", lambda p, c: p.start(SID, "true", cancel=c)),
    ("attach", lambda p, c: p.attach(SID, f"{SID}:{'0' * 32}", cancel=c)),
    ("commands", lambda p, c: p.commands(SID, cancel=c)),
    ("read_file", lambda p, c: p.read_file(SID, "/x", cancel=c)),
    ("write_file", lambda p, c: p.write_file(SID, "/x", b"x", cancel=c)),
    ("stat", lambda p, c: p.stat(SID, "/x", cancel=c)),
    ("write_files", lambda p, c: p.write_files(SID, {"/x": b"x"}, cancel=c)),
    ("read_files", lambda p, c: p.read_files(SID, ["/x"], cancel=c)),
    ("list_dir", lambda p, c: p.list_dir(SID, "/x", cancel=c)),
    ("upload", lambda p, c: p.upload(SID, __file__, "/x", cancel=c)),
    ("download", lambda p, c: p.download(SID, "/x", "/tmp/never-written", cancel=c)),
    ("url", lambda p, c: p.url(SID, 8000, cancel=c)),
    ("watch", lambda p, c: p.watch(SID, "/x", cancel=c).__enter__()),
    ("wait_for_file", lambda p, c: p.wait_for_file(SID, "/x", cancel=c)),
    ("traffic_headers", lambda p, c: p.traffic_headers(SID, cancel=c)),
)


@pytest.mark.parametrize("call", [c for _, c in CANCELS], ids=[n for n, _ in CANCELS])
@pytest.mark.parametrize("bad", [5, "now", object()], ids=["int", "str", "object"])
def test_a_cancel_that_is_not_a_token_is_refused_before_any_io(
    provider: E2BSandboxProvider, listener: socket.socket,
    call: Callable[[E2BSandboxProvider, Any], Any], bad: object,
) -> None:
    with pytest.raises(InvalidArgument, match="cancel must be a CancelToken or None"):
        call(provider, bad)
    assert _no_connection(listener)
