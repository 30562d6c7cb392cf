"""Errors say what failed in the caller's terms (operation, sandbox, path) and what to do;
no internal script or request name reaches the caller (against the emulator)."""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

import pytest
from waiting import wait_until

from e2b_provider import (
    CommandFailed,
    E2BHttpError,
    E2BProviderError,
    E2BSandboxProvider,
    ProtocolError,
    SandboxGoneError,
    TransportError,
)

from .conftest import unique_name

pytestmark = pytest.mark.integration

#: Words of the library's insides that a caller must never have to read.
INTERNAL = ("capybara", "head:", "runuser", "/bin/sh", "process start", "process signal",
            "{id}", "POST /", "GET /", "DELETE /")


def internal_words(text: str) -> List[str]:
    return [w for w in INTERNAL if w in text]


@pytest.fixture
def fresh(provider: E2BSandboxProvider):  # type: ignore[no-untyped-def]
    h = provider.create(unique_name("msg"))
    yield h
    provider.destroy(h)


def test_file_errors_name_the_path_the_sandbox_and_the_reason(provider, fresh) -> None:  # type: ignore[no-untyped-def]
    sid = fresh.id
    cases: List[Tuple[Callable[[], Any], str]] = [
        (lambda: provider.write_file(fresh, "/root/x", b"x"),
         f"writing /root/x in sandbox {sid} failed: permission denied (cannot create /root/x)"),
        (lambda: provider.write_file(fresh, "/root/x", b"x" * 200_000),  # the streamed path
         f"writing /root/x in sandbox {sid} failed: permission denied (cannot create /root/x)"),
        (lambda: provider.write_file(fresh, "/workspace", b"x"),
         f"writing /workspace in sandbox {sid} failed: it is a directory"),
        (lambda: provider.read_file(fresh, "/etc/shadow"),
         f"reading /etc/shadow in sandbox {sid} failed: permission denied (cannot open "
         "'/etc/shadow' for reading)"),
        (lambda: provider.read_file(fresh, "/root/x"),
         f"reading /root/x in sandbox {sid} failed: permission denied: user 'sandbox' may not "
         "enter /root"),
        (lambda: provider.stat(fresh, "/root/x"),
         f"examining /root/x in sandbox {sid} failed: permission denied: user 'sandbox' may not "
         "enter /root"),
    ]
    for call, start in cases:
        with pytest.raises(CommandFailed) as ei:
            call()
        text = str(ei.value)
        assert text.startswith(start), text
        assert internal_words(text) == [], text
        assert internal_words(ei.value.stderr) == [], ei.value.stderr
    # what to do: the user the files are written as, and where it may write
    with pytest.raises(CommandFailed, match="under /workspace"):
        provider.write_file(fresh, "/root/x", b"x")


def test_failed_requests_name_the_callers_operation(emu, provider, fresh) -> None:  # type: ignore[no-untyped-def]
    sid = fresh.id
    provider.stat(fresh, "/workspace")  # the file agent starts in the background, now
    wait_until(lambda: provider._files._agents.sessions() != [], 30, "the file agent")
    emu.edge_not_found(sandbox_id=sid, count=2)
    with pytest.raises(E2BHttpError) as http:
        provider.read_file(fresh, "/workspace/x")
    emu.stream_cut(after_bytes=0, sandbox_id=sid)
    with pytest.raises(TransportError) as cut:
        provider.exec(fresh, "true", timeout=30.0)
    emu.bad_envelope("malformed", sandbox_id=sid)
    with pytest.raises(ProtocolError) as bad:
        provider.kill_all(fresh)
    emu.control_error("connect", 500)
    with pytest.raises(E2BHttpError) as five:
        provider.resume(fresh)
    checks = [
        (http, f"reading /workspace/x in sandbox {sid} failed: E2B answered HTTP 502", "again"),
        (cut, f"running a command in sandbox {sid} failed:", "may or may not have run"),
        (bad, f"stopping leftover commands in sandbox {sid} failed: E2B's answer could not be "
         "read", "try again"),
        (five, f"resuming sandbox {sid} failed: E2B answered HTTP 500", "try again later"),
    ]
    for info, start, advice in checks:
        text = str(info.value)
        assert text.startswith(start) and advice in text, text
        assert internal_words(text) == [], text
    assert http.value.status == 502 and five.value.status == 500  # attributes are kept


def test_a_gone_sandbox_says_so_in_every_call(provider) -> None:  # type: ignore[no-untyped-def]
    h = provider.create(unique_name("gone"))
    provider.destroy(h)
    calls: List[Tuple[str, Callable[[], Any]]] = [
        ("running a command in", lambda: provider.exec(h, "true", timeout=30.0)),
        ("reading /x in", lambda: provider.read_file(h, "/x")),
        ("writing /x in", lambda: provider.write_file(h, "/x", b"x")),
        ("examining /x in", lambda: provider.stat(h, "/x")),
        ("stopping leftover commands in", lambda: provider.kill_all(h)),
    ]
    for doing, call in calls:
        with pytest.raises(SandboxGoneError) as ei:
            call()
        assert str(ei.value) == (
            f"{doing} sandbox {h.id} failed: the sandbox no longer exists; create a new sandbox"
        )
    assert provider.resume(h) == "gone"


def test_a_wrong_api_key_says_what_to_check(emu) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emu.config(template="base", api_key="e2b_wrong_key_0123456789")) as p:
        with pytest.raises(E2BProviderError) as ei:
            p.list_sandboxes()
    text = str(ei.value)
    assert text.startswith("listing sandboxes failed: E2B answered HTTP 401") and "API key" in text
    assert "e2b_wrong_key_0123456789" not in text
