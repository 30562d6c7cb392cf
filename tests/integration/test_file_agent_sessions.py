"""The file agent's sessions against the emulator: one agent per sandbox and provider, found
again after it is killed, exits or the stream is cut, shared by many threads without
threads of its own, and gone with the sandbox.

Each test uses real sandboxes, a real agent process in them and real files.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Iterator, List

import pytest
from waiting import run_in_threads, wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    E2BSandboxProvider,
    FileContent,
    SandboxHandle,
)
from e2b_provider.core.agent_session import WITHDRAW_SECONDS
from e2b_provider.core.file_agents import AGENT_TAG_PREFIX
from e2b_provider.sandbox_side import pack

from .conftest import own_sandbox, root, warm_file_agent


def agents_running(p: E2BSandboxProvider, h: SandboxHandle) -> List[str]:
    """The pids of the file agents running in the sandbox (by their name in ``ps``)."""
    out = root(p, h, f"pgrep -f -- '{AGENT_TAG_PREFIX}[0-9a-f]{{32}}$' || true")
    return out.split()


@pytest.fixture
def fresh(provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    with own_sandbox(provider, "agent") as h:
        yield h


def test_first_call_starts_one_agent_and_later_calls_use_it(
    provider: E2BSandboxProvider, fresh: SandboxHandle
) -> None:
    p = provider
    assert agents_running(p, fresh) == []
    warm_file_agent(p, fresh)
    [pid] = agents_running(p, fresh)
    for i in range(20):
        p.write_file(fresh, f"/workspace/a{i}", b"x")
        assert p.read_file(fresh, f"/workspace/a{i}") == FileContent(b"x")
    assert agents_running(p, fresh) == [pid]
    # it runs as the sandbox user, not root
    assert root(p, fresh, f"ps -o user= -p {pid}").strip() == "sandbox"


def test_many_threads_share_the_agent_without_threads_of_their_own(
    provider: E2BSandboxProvider, fresh: SandboxHandle
) -> None:
    p = provider
    warm_file_agent(p, fresh)
    before = threading.active_count()
    errors: List[BaseException] = []
    peak = [0]

    def work(k: int) -> None:
        try:
            for i in range(15):
                data = os.urandom(100 + k)
                p.write_file(fresh, f"/workspace/t{k}/{i}", data)
                got = p.read_file(fresh, f"/workspace/t{k}/{i}")
                assert got == FileContent(data)
                peak[0] = max(peak[0], threading.active_count())
        except BaseException as exc:  # recorded for the assertion
            errors.append(exc)

    run_in_threads(work, 16, 120)
    assert errors == []
    # 16 workers of the test, plus at most the watchdog and its pool: no reader threads
    assert peak[0] <= before + 16 + 2
    assert len(agents_running(p, fresh)) == 1


def test_a_killed_agent_is_replaced_without_an_error(
    provider: E2BSandboxProvider, fresh: SandboxHandle
) -> None:
    p = provider
    warm_file_agent(p, fresh)
    [pid] = agents_running(p, fresh)
    root(p, fresh, f"kill -9 {pid}")
    # the next calls find the session over, start another agent and succeed
    p.write_file(fresh, "/workspace/after-kill", b"ok")
    assert p.read_file(fresh, "/workspace/after-kill") == FileContent(b"ok")
    wait_until(lambda: len(agents_running(p, fresh)) == 1, 30, "one agent again")
    assert agents_running(p, fresh) != [pid]


def test_a_cancel_that_a_stopped_agent_cannot_answer_retires_it_and_nobody_else_fails(
    provider: E2BSandboxProvider, fresh: SandboxHandle
) -> None:
    """The agent is stopped (SIGSTOP): a cancelled call's withdrawal gets no answer, so
    within WITHDRAW_SECONDS the agent is retired (killed) before the call returns, and the
    other call waiting on it is sent again to a new agent."""
    p = provider
    warm_file_agent(p, fresh)
    p.write_file(fresh, "/workspace/other", b"other")
    [pid] = agents_running(p, fresh)
    root(p, fresh, f"kill -STOP {pid}")  # the agent answers nothing while stopped
    token = CancelToken()
    got: List[object] = []

    def follower() -> None:
        try:
            got.append(p.read_file(fresh, "/workspace/other"))
        except BaseException as exc:  # recorded for the assertion
            got.append(exc)

    t = threading.Thread(target=follower)
    try:
        t.start()
        threading.Timer(0.5, token.cancel, args=("test",)).start()
        t0 = time.monotonic()
        with pytest.raises(Cancelled):
            p.stat(fresh, "/workspace", cancel=token)
        assert time.monotonic() - t0 < WITHDRAW_SECONDS + 5
        # the stopped agent is gone once the call returned
        assert pid not in agents_running(p, fresh)
    finally:
        root(p, fresh, f"kill -CONT {pid} 2>/dev/null || true")
    t.join(60)
    # the other call got its answer (sent again to a new agent)
    assert got == [FileContent(b"other")]
    p.write_file(fresh, "/workspace/after-cancel", b"fine")
    assert p.read_file(fresh, "/workspace/after-cancel") == FileContent(b"fine")
    wait_until(lambda: len(agents_running(p, fresh)) == 1, 30, "one agent")


def test_a_cancel_while_reading_the_stream_retires_the_agent(
    provider: E2BSandboxProvider, fresh: SandboxHandle
) -> None:
    p = provider
    warm_file_agent(p, fresh)
    [pid] = agents_running(p, fresh)
    root(p, fresh, f"kill -STOP {pid}")
    token = CancelToken()
    threading.Timer(0.3, token.cancel, args=("test",)).start()
    try:
        with pytest.raises(Cancelled):
            p.stat(fresh, "/workspace", cancel=token)  # alone: it reads the stream itself
        assert pid not in agents_running(p, fresh)  # retired before the call returned
    finally:
        root(p, fresh, f"kill -CONT {pid} 2>/dev/null || true")
    assert p.stat(fresh, "/workspace") is not None


def test_kill_all_ends_every_agent_and_files_go_on(
    emu, provider: E2BSandboxProvider, fresh: SandboxHandle
) -> None:  # type: ignore[no-untyped-def]
    p = provider
    warm_file_agent(p, fresh)
    with E2BSandboxProvider(emu.config(template="base")) as other:  # another client's
        warm_file_agent(other, fresh)
        assert len(agents_running(p, fresh)) == 2
        p.kill_all(fresh)
        assert agents_running(p, fresh) == []
        # both clients' next calls start a new agent and succeed
        p.write_file(fresh, "/workspace/after-killall", b"z")
        assert other.read_file(fresh, "/workspace/after-killall") == FileContent(b"z")


def test_pause_and_resume_keep_files_working(
    provider: E2BSandboxProvider, fresh: SandboxHandle
) -> None:
    p = provider
    warm_file_agent(p, fresh)
    p.write_file(fresh, "/workspace/before-pause", b"1")
    p.suspend(fresh)
    assert p._files._agents.sessions() == []
    # any call resumes the sandbox; the old agent's stream is gone, a new session serves
    assert p.read_file(fresh, "/workspace/before-pause") == FileContent(b"1")
    p.write_file(fresh, "/workspace/after-resume", b"2")
    assert p.read_file(fresh, "/workspace/after-resume") == FileContent(b"2")


def test_an_idle_agent_exits_and_the_next_call_starts_another(
    provider: E2BSandboxProvider, fresh: SandboxHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b_provider.core import file_agents as _agent

    monkeypatch.setattr(_agent, "AGENT_IDLE_SECONDS", 1)
    p = provider
    warm_file_agent(p, fresh)
    wait_until(lambda: agents_running(p, fresh) == [], 30, "the idle agent to exit")
    t0 = time.monotonic()
    p.write_file(fresh, "/workspace/after-idle", b"again")
    assert p.read_file(fresh, "/workspace/after-idle") == FileContent(b"again")
    assert time.monotonic() - t0 < 30


def test_closing_the_provider_ends_its_sessions(emu, fresh: SandboxHandle) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emu.config(template="base")) as p:
        warm_file_agent(p, fresh)
        assert len(p._files._agents.sessions()) == 1
    assert p._files._agents.sessions() == []


def test_a_sandbox_that_cannot_run_the_agent_gets_the_scripts(
    emu, fresh: SandboxHandle, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """A template without python3: the agent's start exits 127 (as ``nice`` does for a
    program it cannot find). Single files then take the per-call scripts, batches a loop
    of them, listings a script."""
    from e2b_provider.core import file_agents as _agent

    monkeypatch.setattr(_agent, "serve_program", lambda: pack("import sys; sys.exit(127)"))
    caplog.set_level(logging.INFO, logger="e2b_provider")
    with E2BSandboxProvider(emu.config(template="base")) as p:
        p.write_file(fresh, "/workspace/no-agent", b"1")
        wait_until(lambda: p._files._agents.unavailable(fresh.id) is not None, 30,
                   "the agent found unavailable")
        assert "no python3" in str(p._files._agents.unavailable(fresh.id))
        assert p.read_file(fresh, "/workspace/no-agent") == FileContent(b"1")
        assert p.stat(fresh, "/workspace/no-agent") is not None
        p.write_files(fresh, {"/workspace/b1": b"b", "/workspace/b2": "c"})
        assert p.read_files(fresh, ["/workspace/b1", "/workspace/b2"]) == {
            "/workspace/b1": FileContent(b"b"), "/workspace/b2": FileContent(b"c")}
        listed = p.list_dir(fresh, "/workspace")  # by a script (GNU find)
        assert listed is not None and "no-agent" in [e.name for e in listed]
        assert p._files._agents.sessions() == []
    assert "cannot run the file agent" in caplog.text
