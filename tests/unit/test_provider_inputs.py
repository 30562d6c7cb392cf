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
