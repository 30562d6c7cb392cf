"""Outcomes under faults: a result received is a result, an ambiguous write is done again, and
every other fault ends in a typed error that says what happened (against the emulator)."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterator, List

import pytest
from waiting import run_in_threads, wait_until

from e2b_provider import (
    CommandFailed,
    E2BSandboxProvider,
    MissingAccessToken,
    OperationTimeout,
    ProtocolError,
    SandboxPaused,
    TransportError,
    TransportTimeout,
)

from .conftest import no_file_agent, own_sandbox, unique_name

pytestmark = pytest.mark.integration

LARGE = bytes(range(256)) * 1024  # 256 KiB: the streamed write path (over the inline limit)


@pytest.fixture
def fresh(provider: E2BSandboxProvider):  # type: ignore[no-untyped-def]
    with own_sandbox(provider, "outcome") as h:
        yield h


# -- a result received is a result -----------------------------------------------------------


def test_exec_cut_after_its_end_event_returns_the_result(emu, provider, fresh) -> None:  # type: ignore[no-untyped-def]
    emu.stream_cut_at_end(sandbox_id=fresh.id)
    r = provider.exec(fresh, "echo once >> /tmp/runs; echo hi; exit 3", timeout=30.0)
    assert (r.exit_code, r.stdout) == (3, "hi\n")
    assert emu.faults() == []  # the cut happened
    # it ran once: a caller told "failed" would have run it again
    assert provider.exec(fresh, "cat /tmp/runs", timeout=30.0).stdout == "once\n"


def test_exec_whose_deadline_passes_after_its_end_event_returns_the_result(emu, fresh) -> None:  # type: ignore[no-untyped-def]
    """The end event arrives, then the stream stalls: the 1 s deadline passes long before the
    stream ends (its 12 s read timeout, keepalive 1 s). The exit status is the result: not a
    timeout, nothing killed, no reboot."""
    with E2BSandboxProvider(emu.config(template="base"), keepalive_seconds=1) as p:
        emu.stream_stall_at_end(sandbox_id=fresh.id)
        r = p.exec(fresh, "echo once >> /tmp/runs; echo hi; exit 3", timeout=1.0)
        assert (r.exit_code, r.stdout, r.timed_out, r.wedged) == (3, "hi\n", False, False)
        assert emu.faults() == []  # the stall happened
        assert p.exec(fresh, "cat /tmp/runs", timeout=30.0).stdout == "once\n"
    # nothing was killed (no signal) and nothing rebooted (no pause)
    assert emu.requests(sandbox_id=fresh.id, path="SendSignal") == []
    assert emu.requests(sandbox_id=fresh.id, path="/pause") == []


@pytest.fixture
def provider(emu) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    """The per-call file scripts: the faults these tests arm cut or stall the next process
    stream, which the file agent's calls do not have (its own faults are tested in
    test_file_agent_sessions and below)."""
    with E2BSandboxProvider(emu.config(template="base")) as p:
        yield no_file_agent(p)


def test_file_reads_cut_after_their_end_event_return_the_content(emu, provider, fresh) -> None:  # type: ignore[no-untyped-def]
    provider.write_file(fresh, "/workspace/r.txt", b"content")
    emu.stream_cut_at_end(sandbox_id=fresh.id)
    assert provider.read_file(fresh, "/workspace/r.txt").data == b"content"  # type: ignore[union-attr]
    emu.stream_cut_at_end(sandbox_id=fresh.id)
    assert provider.stat(fresh, "/workspace/r.txt").size == 7  # type: ignore[union-attr]
    assert emu.faults() == []


# -- an ambiguous write is done again ---------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "stream_cut", "after_bytes": 0},
        {"kind": "stream_cut", "after_bytes": 7},
        {"kind": "bad_envelope", "mode": "malformed"},
        {"kind": "stream_cut_at_end"},
    ],
    ids=lambda f: "-".join(str(v) for v in f.values()),
)
@pytest.mark.parametrize("size", ["inline", "streamed"])
def test_a_write_whose_answer_was_lost_is_written(  # type: ignore[no-untyped-def]
    emu, provider, fresh, fault: Dict[str, Any], size: str
) -> None:
    data = b"small and written\n" if size == "inline" else LARGE
    path = f"/workspace/w-{size}.bin"
    params = {k: v for k, v in fault.items() if k != "kind"}
    getattr(emu, fault["kind"])(sandbox_id=fresh.id, **params)
    provider.write_file(fresh, path, data)
    assert emu.faults() == []  # the fault was hit
    got = provider.read_file(fresh, path, max_bytes=len(data) + 1)
    assert got is not None and got.data == data and not got.truncated
    owner = provider.exec(fresh, f"stat -c %U {path}", timeout=30.0).stdout.strip()
    assert owner == "sandbox"
    # nothing of the first attempt is left running or staged
    r = provider.exec(
        fresh, "pgrep -fc '[c]apybara-fileop-' || true; ls -A /opt/capybara/upload 2>/dev/null "
        "| wc -l", timeout=30.0,
    )
    assert r.stdout.split() == ["0", "0"]


def test_a_write_whose_answer_is_lost_every_time_fails_typed_and_bounded(  # type: ignore[no-untyped-def]
    emu, provider, fresh
) -> None:
    emu.stream_cut(after_bytes=0, sandbox_id=fresh.id, count=-1)
    t0 = time.monotonic()
    with pytest.raises((TransportError, ProtocolError)) as ei:
        provider.write_file(fresh, "/workspace/never.txt", b"x")
    assert time.monotonic() - t0 < 120
    text = str(ei.value)
    assert f"writing /workspace/never.txt in sandbox {fresh.id} failed" in text
    assert "may or may not have been written" in text
    assert not isinstance(ei.value, SandboxPaused)


# -- typed outcomes ------------------------------------------------------------------------


def test_a_stalled_file_operation_or_script_is_an_operation_timeout(emu, fresh) -> None:  # type: ignore[no-untyped-def]
    # keepalive 1 s: a stream silent for 12 s counts as dead (110 s by default); the file
    # agent is kept out (the per-call scripts are what a stream stall stops here; a stalled
    # agent is the next test's)
    with E2BSandboxProvider(emu.config(template="base"), keepalive_seconds=1) as p:
        no_file_agent(p)
        p.write_file(fresh, "/workspace/s.txt", b"s")
        emu.stream_stall(sandbox_id=fresh.id)
        with pytest.raises(OperationTimeout) as ei:
            p.read_file(fresh, "/workspace/s.txt")
        assert not isinstance(ei.value, TransportTimeout)
        assert f"reading /workspace/s.txt in sandbox {fresh.id} failed" in str(ei.value)
        emu.stream_stall(sandbox_id=fresh.id)
        with pytest.raises(OperationTimeout):
            p.stat(fresh, "/workspace/s.txt")
        emu.stream_stall(sandbox_id=fresh.id)  # the leftover-command sweep is bounded alike
        with pytest.raises(OperationTimeout) as ei:
            p.kill_all(fresh)
        assert f"stopping leftover commands in sandbox {fresh.id} failed" in str(ei.value)
        # a write is done again instead: the same bytes give the same file
        emu.stream_stall(sandbox_id=fresh.id)
        p.write_file(fresh, "/workspace/s.txt", b"again")
        assert p.read_file(fresh, "/workspace/s.txt").data == b"again"  # type: ignore[union-attr]


def test_a_file_agent_that_stops_answering_is_replaced(  # type: ignore[no-untyped-def]
    emu, fresh, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b_provider.core import agent_session as _agent

    # an agent silent for 2 s counts as hung (30 s by default)
    monkeypatch.setattr(_agent, "AGENT_SILENCE_SECONDS", 2.0)
    with E2BSandboxProvider(emu.config(template="base")) as p:
        p.write_file(fresh, "/workspace/s.txt", b"s")
        wait_until(lambda: p._files._agents.sessions() != [], 30, "the file agent")
        [session] = p._files._agents.sessions()
        # the agent runs as the sandbox user, whom an exec may signal
        assert p.exec(fresh, f"kill -STOP {session.pid}", timeout=30.0).exit_code == 0
        t0 = time.monotonic()
        try:
            assert p.read_file(fresh, "/workspace/s.txt").data == b"s"  # type: ignore[union-attr]
        finally:
            p.exec(fresh, f"kill -CONT {session.pid}", timeout=30.0)
        assert time.monotonic() - t0 < 30
        assert p._files._agents.sessions()[0] is not session
        # the hung one was killed (by its envd tag), not left stopped
        wait_until(lambda: p.exec(fresh, f"kill -0 {session.pid} 2>/dev/null || echo gone",
                                  timeout=30.0).stdout == "gone\n", 30, "the hung agent gone")


def test_a_connect_without_a_token_fails_closed_for_a_running_sandbox(  # type: ignore[no-untyped-def]
    emu, provider, fresh
) -> None:
    emu.no_token(count=1)
    with pytest.raises(MissingAccessToken) as ei:
        provider.resume(fresh)
    assert ei.value.sandbox_id == fresh.id
    text = str(ei.value)
    assert f"resuming sandbox {fresh.id} failed" in text and "without an envd access token" in text
    assert emu.get_sandbox(fresh.id)["state"] == "running"  # it was never "gone"
    assert provider.resume(fresh) == "resumed"
    # an exec on a cold provider fails closed the same way, and uses no stale token
    emu.no_token(count=1)
    with E2BSandboxProvider(emu.config(template="base")) as cold:
        with pytest.raises(MissingAccessToken):
            cold.exec(fresh, "true", timeout=30.0)
        assert cold.exec(fresh, "echo ok", timeout=30.0).stdout == "ok\n"


@pytest.mark.parametrize("path", ["/root/x", "/root/.profile", "/root/a/b"])
def test_a_path_behind_a_closed_directory_is_permission_denied(  # type: ignore[no-untyped-def]
    provider, fresh, path: str
) -> None:
    for call in (provider.read_file, provider.stat):
        with pytest.raises(CommandFailed) as ei:
            call(fresh, path)
        text = str(ei.value)
        assert "permission denied" in text and "/root" in text, text
        assert "capybara" not in text
    # truly missing paths are still None
    assert provider.read_file(fresh, "/workspace/nothing/here") is None
    assert provider.stat(fresh, "/workspace/nothing/here") is None
    assert provider.stat(fresh, "/etc/hostname/x") is None
    assert provider.stat(fresh, "/root").is_dir  # type: ignore[union-attr]


def test_concurrent_creates_of_one_name_leave_one_sandbox(provider) -> None:  # type: ignore[no-untyped-def]
    name = unique_name("job")
    done: List[str] = []
    errors: List[BaseException] = []
    lock = threading.Lock()

    def create(_: int) -> None:
        try:
            h = provider.create(name)
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            done.append(h.id)

    run_in_threads(create, 6, 180)
    try:
        assert errors == [] and len(done) == 6
        live = provider.list_sandboxes(name)
        assert [s.id for s in live] == [done[-1]]  # the last create's sandbox, and only it
        assert provider._lifecycle.bookkeeping() == 0  # no per-name lock is kept
    finally:
        provider.destroy_by_name(name)


@pytest.mark.parametrize("who", ["this provider", "another client"])
def test_a_pause_while_a_command_runs_is_said_as_such(emu, provider, fresh, who: str) -> None:  # type: ignore[no-untyped-def]
    started = threading.Event()
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = provider.exec(
                fresh, "echo started; sleep 60", timeout=120.0,
                on_stdout=lambda _text: started.set(),
            )
        except BaseException as exc:
            outcome["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(30)
    if who == "this provider":
        provider.suspend(fresh)
    else:
        with E2BSandboxProvider(emu.config(template="base")) as other:
            other.suspend(fresh)
    t.join(60)
    assert not t.is_alive()
    err = outcome.get("error")
    assert isinstance(err, SandboxPaused), outcome
    assert isinstance(err, TransportError) and err.sandbox_id == fresh.id
    text = str(err)
    assert f"sandbox {fresh.id} was paused while the command ran" in text
    assert "kill_all" in text and "network" not in text
    assert provider.resume(fresh) == "resumed"
    provider.kill_all(fresh)
