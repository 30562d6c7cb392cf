"""The first file call on a fresh sandbox, counted at the emulator: what it asks of envd.

A batch finds no file agent running and starts one carrying its request: one ``Start``,
no ``SendInput``. A single write finds none either and runs its one script alone: the agent
is started (in the background, for the calls that follow) only once that script is done,
so no ``python3`` reads its program beside the script the caller waits for.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List

import pytest
from waiting import wait_until

from e2b_provider import E2BSandboxProvider, FileContent, SandboxHandle

from .conftest import own_sandbox


@pytest.fixture
def fresh(provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    with own_sandbox(provider, "first") as h:
        yield h


def envd_requests_since(emu: Any, sid: str, mark: int) -> List[str]:
    """The last path segments of the envd requests ``sid`` received after log entry
    ``mark``, in order."""
    return [e["path"].rsplit("/", 1)[-1] for e in emu.requests(sandbox_id=sid)
            if e["seq"] > mark and e["kind"] == "envd"]


def log_mark(emu: Any, sid: str) -> int:
    return max([e["seq"] for e in emu.requests(sandbox_id=sid)] or [0])


def test_the_first_batch_starts_the_agent_carrying_it_in_one_request(
    provider: E2BSandboxProvider, fresh: SandboxHandle, emu: Any
) -> None:
    p = provider
    files: Dict[str, bytes] = {f"/workspace/b/d{i % 5}/f{i}": b"%d\n" % i for i in range(50)}
    mark = log_mark(emu, fresh.id)
    p.write_files(fresh, files)
    assert envd_requests_since(emu, fresh.id, mark) == ["Start"]
    # the agent it started serves what follows: one SendInput each, no other start
    mark = log_mark(emu, fresh.id)
    got = p.read_files(fresh, list(files))
    assert got == {k: FileContent(v) for k, v in files.items()}
    assert envd_requests_since(emu, fresh.id, mark) == ["SendInput"]
    assert len(p._files._agents.sessions()) == 1


def test_a_first_batch_too_large_to_carry_is_sent_once_the_agent_is_ready(
    provider: E2BSandboxProvider, fresh: SandboxHandle, emu: Any
) -> None:
    p = provider
    files = {f"/workspace/big/f{i}": bytes([i]) * 40000 for i in range(3)}
    mark = log_mark(emu, fresh.id)
    p.write_files(fresh, files)
    assert envd_requests_since(emu, fresh.id, mark) == ["Start", "SendInput"]
    assert p.read_files(fresh, list(files)) == {k: FileContent(v) for k, v in files.items()}


def test_the_first_write_runs_its_script_before_the_agent_starts(
    provider: E2BSandboxProvider, fresh: SandboxHandle, emu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = provider
    agents, ops = p._files._agents, p._files.ops
    script, start = ops.script, agents._start
    scripts_done: List[int] = []
    starts: List[int] = []  # how many scripts had ended at each agent start

    def observed_script(*args: Any, **kw: Any) -> Any:
        out = script(*args, **kw)
        scripts_done.append(out.exit_code)
        return out

    def observed_start(*args: Any, **kw: Any) -> Any:
        starts.append(len(scripts_done))
        return start(*args, **kw)

    monkeypatch.setattr(ops, "script", observed_script)
    monkeypatch.setattr(agents, "_start", observed_start)
    mark = log_mark(emu, fresh.id)
    p.write_file(fresh, "/workspace/one.txt", b"written\n")
    assert (scripts_done, starts) == ([0], [1])  # the agent's start came after the script
    wait_until(lambda: agents.sessions() != [], 30, "the file agent")
    assert envd_requests_since(emu, fresh.id, mark) == ["Start", "Start"]
    assert p.read_file(fresh, "/workspace/one.txt") == FileContent(b"written\n")
