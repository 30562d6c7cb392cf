"""Lifecycle by name against the emulator: create, resume, suspend, destroy, egress rules."""

from __future__ import annotations

import logging

import pytest
import requests

from e2b_provider import (
    E2BSandboxProvider,
    InvalidArgument,
    SandboxGoneError,
    SandboxLimits,
)

from .conftest import unique_name

pytestmark = pytest.mark.integration


def _listed(emu, name: str) -> list:  # type: ignore[no-untyped-def]
    return [
        s
        for s in emu.list_sandboxes()
        if (s.get("metadata") or {}).get("capybara-sandbox-name") == name
    ]


def test_two_creates_with_one_name_leave_one_sandbox(emu, provider: E2BSandboxProvider) -> None:  # type: ignore[no-untyped-def]
    name = unique_name("dup")
    first = provider.create(name)
    provider.suspend(first)  # paused sandboxes are found and destroyed too
    second = provider.create(name)
    try:
        assert first.id != second.id
        listed = _listed(emu, name)
        assert [s["sandboxID"] for s in listed] == [second.id]
        assert provider.resume(first) == "gone"
        assert provider.resume(second) == "resumed"
    finally:
        assert provider.destroy_by_name(name) == 1
    assert _listed(emu, name) == []


def test_suspend_then_exec_resumes_and_keeps_files(provider: E2BSandboxProvider) -> None:
    h = provider.create(unique_name("susp"))
    try:
        provider.write_file(h, "/workspace/keep.txt", b"kept")
        provider.suspend(h)
        provider.suspend(h)  # already paused: fine
        r = provider.exec(h, "cat /workspace/keep.txt", timeout=30.0)
        assert r.exit_code == 0 and r.stdout == "kept"
        assert provider.resume(h) == "resumed"
    finally:
        provider.destroy(h)
    provider.destroy(h)  # already gone: fine
    provider.suspend(h)  # gone: fine
    assert provider.resume(h.id) == "gone"
    with pytest.raises(SandboxGoneError):
        provider.exec(h, "true")


def test_egress_open_is_refused_unless_allowed(emu, provider: E2BSandboxProvider) -> None:  # type: ignore[no-untyped-def]
    name = unique_name("open")
    with pytest.raises(InvalidArgument, match="allow_open_egress"):
        provider.create(name, SandboxLimits(egress="open"))
    assert _listed(emu, name) == []
    with E2BSandboxProvider(emu.config(template="base", allow_open_egress=True)) as p:
        h = p.create(name, SandboxLimits(egress="open"))
        p.destroy(h)


def test_allowlist_degrades_to_none_with_a_warning(emu, caplog) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emu.config(template="base", domain_allowlist=False)) as p:
        with caplog.at_level(logging.WARNING, logger="e2b_provider"):
            h = p.create(
                unique_name("allow"),
                SandboxLimits(egress="allowlist", allow_hosts=("example.com",)),
            )
        try:
            assert any("degraded to none" in r.getMessage() for r in caplog.records)
            # no network at all: only loopback exists
            r = p.exec(h, "ls /sys/class/net", timeout=30.0)
            assert r.stdout.split() == ["lo"]
        finally:
            p.destroy(h)


def test_invalid_limits_and_names_are_rejected_before_io(emu, provider: E2BSandboxProvider) -> None:  # type: ignore[no-untyped-def]
    before = len(emu.list_sandboxes())
    for bad in ("", "-x", "a b", "a;rm", "x" * 102, "naïve"):
        with pytest.raises(InvalidArgument):
            provider.create(bad)
    with pytest.raises(InvalidArgument):
        provider.create("ok", SandboxLimits(cpu=0))
    with pytest.raises(InvalidArgument):
        provider.create("ok", SandboxLimits(egress="allowlist", allow_hosts=("https://x.com",)))
    assert len(emu.list_sandboxes()) == before


def test_tokenless_create_is_refused_and_cleaned_up(emu, provider: E2BSandboxProvider) -> None:  # type: ignore[no-untyped-def]
    name = unique_name("notok")
    emu.no_token(count=1)
    with pytest.raises(SandboxGoneError, match="without an envd access token"):
        provider.create(name)
    assert _listed(emu, name) == []


def test_wrong_api_key_is_an_authentication_error_without_the_key(emu) -> None:  # type: ignore[no-untyped-def]
    from e2b_provider import AuthenticationError

    secret = "e2b_" + "f00dfeed" * 5
    with E2BSandboxProvider(emu.config(template="base", api_key=secret)) as p:
        with pytest.raises(AuthenticationError) as ei:
            p.create(unique_name("auth"))
    assert ei.value.status == 401
    assert secret not in str(ei.value) and secret not in repr(ei.value)


def test_emulator_control_plane_is_reachable(emu) -> None:  # type: ignore[no-untyped-def]
    r = requests.get(f"{emu.api_url}/v2/sandboxes", headers={"X-API-KEY": emu.api_key}, timeout=10)
    assert r.status_code == 200


def test_delete_conflict_is_retried_briefly_then_surfaced(
    emu, provider: E2BSandboxProvider
) -> None:  # type: ignore[no-untyped-def]
    from e2b_provider import Conflict

    h = provider.create(unique_name("del409"))
    emu.control_error("delete", 409, count=10)
    with pytest.raises(Conflict):
        provider.destroy(h)
    emu.clear_faults()
    emu.control_error("delete", 409, count=2)
    provider.destroy(h)
    assert provider.resume(h) == "gone"
