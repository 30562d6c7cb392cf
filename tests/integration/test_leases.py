"""The lease cache against the emulator: a warm sandbox needs no control-plane call, and a
stale lease (a sandbox paused or deleted by another client) still ends every call correctly."""

from __future__ import annotations

import threading
import time
from typing import Iterator, List

import pytest
import requests

from e2b_provider import E2BSandboxProvider, ExecResult, SandboxGoneError, SandboxHandle

from .conftest import own_sandbox, unique_name, warm_file_agent

pytestmark = pytest.mark.integration


def _connects(emu, sid: str) -> int:  # type: ignore[no-untyped-def]
    return len([r for r in emu.requests(sandbox_id=sid, path="/connect") if r["kind"] == "control"])


@pytest.fixture
def fresh(provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    with own_sandbox(provider, "lease") as h:
        yield h


def test_warm_sandbox_calls_make_no_control_plane_request(emu, provider, fresh) -> None:  # type: ignore[no-untyped-def]
    emu.clear_requests()
    for i in range(5):
        assert provider.exec(fresh, f"echo {i}", timeout=30.0).stdout == f"{i}\n"
        provider.write_file(fresh, f"/workspace/w{i}.txt", b"x" * i)
        content = provider.read_file(fresh, f"/workspace/w{i}.txt")
        assert content is not None and content.data == b"x" * i
        st = provider.stat(fresh, f"/workspace/w{i}.txt")
        assert st is not None and st.size == i
    provider.kill_all(fresh)
    control = [r for r in emu.requests() if r["kind"] == "control"]
    assert control == [], control
    assert emu.requests(sandbox_id=fresh.id)  # the calls did reach envd


def test_concurrent_first_calls_share_one_connect(emu, provider, fresh, run_in_threads) -> None:  # type: ignore[no-untyped-def]
    results: List[ExecResult] = []
    emu.clear_requests()
    with E2BSandboxProvider(emu.config(template="base")) as cold:

        def work(i: int) -> None:
            results.append(cold.exec(fresh, f"echo {i}", timeout=30.0))

        run_in_threads(work, 20, 60.0)
    assert sorted(r.stdout for r in results) == sorted(f"{i}\n" for i in range(20))
    assert _connects(emu, fresh.id) == 1


def test_sandbox_paused_by_another_client_is_resumed_by_the_next_call(emu, provider, fresh) -> None:  # type: ignore[no-untyped-def]
    provider.write_file(fresh, "/workspace/keep.txt", b"kept")
    # the first file call starts the file agent in the background: let that be done, or it
    # may find the sandbox paused and resume it before the call under test
    warm_file_agent(provider, fresh)
    with E2BSandboxProvider(emu.config(template="base")) as other:
        other.suspend(fresh)
    assert emu.get_sandbox(fresh.id)["state"] == "paused"
    emu.clear_requests()
    r = provider.exec(fresh, "cat /workspace/keep.txt", timeout=30.0)
    assert r.exit_code == 0 and r.stdout == "kept"
    assert _connects(emu, fresh.id) == 1
    assert emu.get_sandbox(fresh.id)["state"] == "running"


@pytest.mark.parametrize("call", ["exec", "read_file", "write_file", "stat", "kill_all"])
def test_sandbox_deleted_by_another_client_is_reported_gone(emu, provider, call: str) -> None:  # type: ignore[no-untyped-def]
    h = provider.create(unique_name("gone"))
    assert provider.exec(h, "true", timeout=30.0).exit_code == 0  # lease is warm
    r = requests.delete(
        f"{emu.api_url}/sandboxes/{h.id}", headers={"X-API-KEY": emu.api_key}, timeout=30
    )
    assert r.status_code == 204
    args = {
        "exec": (h, "true"),
        "read_file": (h, "/workspace/x"),
        "write_file": (h, "/workspace/x", b"x"),
        "stat": (h, "/workspace/x"),
        "kill_all": (h,),
    }[call]
    with pytest.raises(SandboxGoneError):
        getattr(provider, call)(*args)
    assert provider.resume(h) == "gone"


def test_suspend_and_destroy_drop_the_lease(emu, provider, fresh) -> None:  # type: ignore[no-untyped-def]
    provider.suspend(fresh)
    emu.clear_requests()
    assert provider.exec(fresh, "echo back", timeout=30.0).stdout == "back\n"
    assert _connects(emu, fresh.id) == 1  # resumed by the call
    assert provider._ctx.leases.lease(fresh.id) is not None
    provider.suspend(fresh)
    assert provider._ctx.leases.lease(fresh.id) is None  # dropped, not just outdated
    h = provider.create(unique_name("gone"))
    assert provider._ctx.leases.lease(h.id) is not None  # the create's answer
    provider.destroy(h)
    assert provider._ctx.leases.lease(h.id) is None
    with pytest.raises(SandboxGoneError):
        provider.exec(h, "true", timeout=30.0)


def test_resume_always_connects(emu, provider, fresh) -> None:  # type: ignore[no-untyped-def]
    emu.clear_requests()
    assert provider.resume(fresh) == "resumed"
    assert provider.resume(fresh) == "resumed"
    assert _connects(emu, fresh.id) == 2


def test_a_call_that_outlives_the_lease_extends_it_first(emu, provider, fresh) -> None:  # type: ignore[no-untyped-def]
    emu.clear_requests()
    timeout = float(provider.config.timeout_seconds)  # needs timeout + 120 s: more than is left
    assert provider.exec(fresh, "true", timeout=timeout).exit_code == 0
    connects = [r for r in emu.requests(sandbox_id=fresh.id, path="/connect")]
    assert len(connects) == 1
    emu.clear_requests()
    assert provider.exec(fresh, "true", timeout=60.0).exit_code == 0
    assert _connects(emu, fresh.id) == 0


def test_lease_cache_is_shared_across_threads(emu, provider, fresh, run_in_threads) -> None:  # type: ignore[no-untyped-def]
    emu.clear_requests()
    lock = threading.Lock()
    codes: List[int] = []

    def work(i: int) -> None:
        code = provider.exec(fresh, "true", timeout=30.0).exit_code
        with lock:
            codes.append(code if code is not None else -1)

    run_in_threads(work, 10, 60.0)
    assert codes == [0] * 10
    assert _connects(emu, fresh.id) == 0


def test_continued_use_keeps_a_sandbox_alive_past_its_timeout(emu) -> None:  # type: ignore[no-untyped-def]
    """The configured lifetime is 60 s; calls every few seconds for longer than that renew
    the lease ahead of its end (in the background), so the sandbox is never reaped."""
    with E2BSandboxProvider(emu.config(template="base", timeout_seconds=60)) as p:
        h = p.create(unique_name("renew"))
        try:
            began = time.monotonic()
            while time.monotonic() - began < 75:
                assert p.exec(h, "true", timeout=30.0).exit_code == 0
                time.sleep(3)  # a pause between uses, not a synchronisation
            renewals = len(emu.requests(sandbox_id=h.id, path="/connect"))
            assert renewals >= 1
            assert p.exec(h, "echo alive", timeout=30.0).stdout == "alive\n"
        finally:
            p.destroy(h)
