"""Fault injection: 409 storms, 5xx, redirects, cut/stalled/broken streams, a wedged sandbox."""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterator

import pytest
from waiting import last_request, wait_until

from e2b_provider import (
    Conflict,
    E2BHttpError,
    E2BSandboxProvider,
    ProtocolError,
    TransportError,
)

from .conftest import no_file_agent, own_sandbox

pytestmark = pytest.mark.integration


@pytest.fixture
def provider(emu) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    """The per-call file scripts (see no_file_agent): the faults here stall or cut the next
    process stream, and an agent starting in the background would take them."""
    with E2BSandboxProvider(emu.config(template="base")) as p:
        yield no_file_agent(p)


@pytest.fixture
def fresh(provider: E2BSandboxProvider):  # type: ignore[no-untyped-def]
    with own_sandbox(provider, "fault") as h:
        yield h


def test_409_storm_is_retried_then_surfaces(emu, provider: E2BSandboxProvider, fresh) -> None:  # type: ignore[no-untyped-def]
    # A provider that has not seen the sandbox yet connects before its first call.
    emu.connect_conflict(count=3)
    with E2BSandboxProvider(emu.config(template="base")) as cold:
        assert cold.exec(fresh, "echo ok", timeout=30.0).stdout == "ok\n"
    emu.connect_conflict(count=50)
    t0 = time.monotonic()
    with pytest.raises(Conflict) as ei, E2BSandboxProvider(emu.config(template="base")) as cold:
        cold.exec(fresh, "echo ok", timeout=30.0)
    assert ei.value.status == 409
    assert time.monotonic() - t0 < 10  # 5 retries x 0.5 s, bounded
    emu.clear_faults()
    assert provider.resume(fresh) == "resumed"


def _connects(emu, sandbox_id: str, after: int) -> list:  # type: ignore[no-untyped-def]
    """Statuses of the connects to the sandbox the emulator logged after request ``after``."""
    return [
        e["status"]
        for e in emu.requests(path=f"/v2/sandboxes/{sandbox_id}/connect")
        if e["seq"] > after
    ]


def test_permanent_409_is_not_retried_blindly(
    emu, provider: E2BSandboxProvider, fresh, caplog
) -> None:  # type: ignore[no-untyped-def]
    mark = last_request(emu)
    emu.connect_conflict(count=1, error_code="sandbox_snapshot_guest_agent_unresponsive")
    # a provider that has not seen the sandbox connects before its first call
    with caplog.at_level(logging.WARNING, logger="e2b_provider"), E2BSandboxProvider(
        emu.config(template="base")
    ) as cold:
        assert cold.exec(fresh, "echo ok", timeout=30.0).stdout == "ok\n"
    # answered by reconnecting once with memory:false, not by five blind retries
    assert _connects(emu, fresh.id, mark) == [409, 200]
    assert any("memory: false" in r.getMessage() for r in caplog.records)

    # The real case: a snapshot taken while envd did not answer resumes only with
    # memory:false (a cold boot from its files); a plain connect answers 409 forever.
    provider.write_file(fresh, "/workspace/kept.txt", b"kept")
    emu.envd_unresponsive(fresh.id)
    provider.suspend(fresh)
    assert emu.get_sandbox(fresh.id)["state"] == "paused"
    mark = last_request(emu)
    assert provider.exec(fresh, "cat /workspace/kept.txt", timeout=30.0).stdout == "kept"
    assert _connects(emu, fresh.id, mark) == [409, 201]


def test_generic_502_on_a_process_start_is_raised_not_retried(
    emu, provider: E2BSandboxProvider, fresh
) -> None:  # type: ignore[no-untyped-def]
    # Only the edge's "The sandbox was not found" says nothing ran; after any other 502 the
    # command may have run, and running it again could do its work twice.
    mark = last_request(emu)
    emu.envd_error(502, sandbox_id=fresh.id)
    with pytest.raises(E2BHttpError) as ei:
        provider.exec(fresh, "echo ran >> /workspace/runs", timeout=30.0)
    assert ei.value.status == 502
    assert emu.faults() == []
    starts = [e for e in emu.requests(sandbox_id=fresh.id, path="Start") if e["seq"] > mark]
    assert [e["status"] for e in starts] == [502]
    assert provider.read_file(fresh, "/workspace/runs") is None


def test_control_plane_5xx_is_retried_and_redirects_are_not_followed(
    emu, provider: E2BSandboxProvider, fresh
) -> None:  # type: ignore[no-untyped-def]
    emu.control_error("connect", 503, count=1, retry_after=0.2)
    assert provider.resume(fresh) == "resumed"
    emu.control_error("connect", 500, count=1)
    with pytest.raises(E2BHttpError) as ei:
        provider.resume(fresh)
    assert ei.value.status == 500
    emu.control_redirect("connect", count=1)
    with pytest.raises(E2BHttpError) as ei:
        provider.resume(fresh)
    assert 300 <= ei.value.status < 400


def test_cut_stream_is_a_transport_or_protocol_error(
    emu, provider: E2BSandboxProvider, fresh
) -> None:  # type: ignore[no-untyped-def]
    emu.stream_cut(after_bytes=12, sandbox_id=fresh.id)
    with pytest.raises((TransportError, ProtocolError)):
        provider.exec(fresh, "echo hello; sleep 1; echo world", timeout=30.0)


@pytest.mark.parametrize("mode", ["oversized", "malformed", "compressed"])
def test_bad_envelopes_are_protocol_errors(
    emu, provider: E2BSandboxProvider, fresh, mode: str
) -> None:  # type: ignore[no-untyped-def]
    emu.bad_envelope(mode, sandbox_id=fresh.id)
    with pytest.raises(ProtocolError):
        provider.exec(fresh, "echo hi", timeout=30.0)


def test_stalled_stream_is_bounded_by_timeout_grace_and_reboot(emu, fresh) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(
        emu.config(template="base"), kill_bound=5.0, kill_grace=1.0, reboot_bound=30.0
    ) as p:
        no_file_agent(p)  # its start in the background would take the stall
        p.write_file(fresh, "/workspace/survives.txt", b"yes")
        emu.stream_stall(sandbox_id=fresh.id, after_bytes=0)
        t0 = time.monotonic()
        r = p.exec(fresh, "echo hi; sleep 300", timeout=1.0)
        took = time.monotonic() - t0
        assert r.timed_out and r.exit_code is None
        # the kill worked but the stream never ended: grace ran out, the sandbox was rebooted
        assert r.wedged
        assert took < 1.0 + 5.0 + 1.0 + 1.0 + 30.0
        emu.clear_faults()
        assert p.read_file(fresh, "/workspace/survives.txt").data == b"yes"  # type: ignore[union-attr]


def test_wedged_sandbox_is_rebooted_within_bounds(emu, fresh) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(
        emu.config(template="base"), kill_bound=3.0, kill_grace=1.0, reboot_bound=40.0
    ) as p:
        no_file_agent(p)  # an agent starting in the background would see envd hang too
        p.write_file(fresh, "/workspace/survives.txt", b"yes")
        timeout = 2.0
        result = {}

        def run() -> None:
            result["r"] = p.exec(fresh, "sleep 300", timeout=timeout)
            result["t"] = time.monotonic()

        mark = last_request(emu)
        t0 = time.monotonic()
        th = threading.Thread(target=run)
        th.start()
        # once envd has started the command, it stops answering new requests (the kill's)
        wait_until(
            lambda: [
                e
                for e in emu.requests(sandbox_id=fresh.id, path="process.Process/Start")
                if e["seq"] > mark and e["status"] == 200
            ],
            timeout,
            "the command to start",
        )
        emu.envd_unresponsive(fresh.id)
        th.join(timeout + 3.0 + 1.0 + 1.0 + 40.0 + 5.0)
        assert not th.is_alive()
        r = result["r"]
        assert r.timed_out and r.exit_code is None and r.wedged
        assert result["t"] - t0 < timeout + 3.0 + 1.0 + 1.0 + 40.0
        # rebooted: envd answers again, files survived, the stuck sleep is gone
        after = p.exec(
            fresh, "cat /workspace/survives.txt; echo; pgrep -c '[s]leep 300' || true", timeout=30.0
        )
        assert after.stdout.split() == ["yes", "0"]
        info = emu.get_sandbox(fresh.id)
        assert info["state"] == "running"


def test_execs_wedged_together_share_one_reboot(emu, fresh, caplog) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emu.config(template="base"), kill_bound=5.0, kill_grace=0.5) as p:
        # every Start stalls (the kill scripts' too), until the fixture clears the faults
        emu.stream_stall(sandbox_id=fresh.id, count=-1)
        results = []
        with caplog.at_level(logging.INFO, logger="e2b_provider"):
            threads = [
                threading.Thread(
                    target=lambda: results.append(p.exec(fresh, "sleep 60", timeout=1.0))
                )
                for _ in range(3)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        assert len(results) == 3 and all(r.timed_out and r.wedged for r in results)
        messages = [r.getMessage() for r in caplog.records]
        assert sum("rebooted" in m and "was just" not in m for m in messages) == 1, messages
        assert sum("just rebooted for another command" in m for m in messages) == 2, messages


def test_sandbox_paused_between_connect_and_call_is_resumed_once(emu, provider, fresh) -> None:  # type: ignore[no-untyped-def]
    calls = [
        lambda: provider.exec(fresh, "echo ok", timeout=30.0).stdout == "ok\n",
        lambda: provider.write_file(fresh, "/workspace/e.txt", b"e") is None,
        lambda: provider.read_file(fresh, "/workspace/e.txt").data == b"e",
        lambda: provider.stat(fresh, "/workspace/e.txt").size == 1,
        lambda: provider.kill_all(fresh) is None,
        lambda: provider.kill_tagged(fresh, ["t"]) is None,
    ]
    for call in calls:
        emu.edge_not_found(sandbox_id=fresh.id, count=1)
        assert call()
        assert emu.faults() == []  # the fault was hit: the first try failed and was retried
    emu.edge_not_found(sandbox_id=fresh.id, count=2)  # retried once only
    with pytest.raises(E2BHttpError) as ei:
        provider.exec(fresh, "echo ok", timeout=30.0)
    assert ei.value.status == 502
