"""Nothing left behind: file calls ended by a cancel, their deadline, Ctrl-C or a killed
client leave no file-work process and nothing staged in the sandbox once they return (the
provider's own idle agent aside, while the provider is open), and ``kill_all`` ends every
agent and sweeps what dead clients staged.

Against the emulator, with real sandboxes and real processes; "left" is what ``ps`` and
``find`` show in the sandbox as root.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
from waiting import wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    E2BSandboxProvider,
    FileContent,
    OperationTimeout,
    SandboxHandle,
)
from e2b_provider.core.file_agents import AGENT_TAG_PREFIX
from e2b_provider.files import file_part as _files
from e2b_provider.protocol import scripts as scripts

from .conftest import own_sandbox, root, warm_file_agent

pytestmark = pytest.mark.integration

#: Every live process of the sandbox but its init, the emulator's envd and this
#: inspection: "pid ppid args" lines (agents among them). A zombie (ended, its parent envd
#: not yet done reaping it) runs nothing and is not counted.
PROCESSES = (
    "ps -e -o stat=,pid=,ppid=,args= | awk -v me=$$ '$1 !~ /^Z/ && $2 != 1 && $2 != me "
    "&& $3 != me && $0 !~ /e2b_provider[.]emulator/ { $1 = \"\"; print }'"
)
#: What file calls stage or leave: entries of the staging directory (but its registry),
#: registered temporary files and the temporary files themselves, anywhere.
STAGED = (
    "{ find " + scripts.UPLOAD_DIR + " -mindepth 1 ! -path '" + scripts.ROOT_PARTS_DIR + "' "
    "2>/dev/null; find " + scripts.ROOT_PARTS_DIR + " " + scripts.USER_PARTS_PREFIX + "* "
    "-mindepth 1 2>/dev/null; find / -xdev -name '" + scripts.PART_PREFIX + "*' "
    "2>/dev/null; } | sort"
)
LARGE = 3 << 20  # written through a FIFO and envd's /files (more than MAX_INLINE_FILE)


#: Every process's pid, state, kernel wait channel, descriptors and command line (for a
#: failure's message).
STATES = (
    "for d in /proc/[0-9]*; do echo \"${d#/proc/} $(sed -n 's/^State:[[:space:]]*//p' "
    "$d/status 2>/dev/null) $(cat $d/wchan 2>/dev/null) $(ls -l $d/fd 2>/dev/null | "
    "awk 'NR>1{printf \"%s>%s \", $9, $11}') $(tr '\\0' ' ' < $d/cmdline 2>/dev/null "
    "| cut -c1-120)\"; done"
)


def processes(p: E2BSandboxProvider, h: SandboxHandle) -> List[str]:
    return [line.strip() for line in root(p, h, PROCESSES).splitlines() if line.strip()]


def agents(lines: List[str]) -> List[str]:
    return [ln for ln in lines if ln.split()[-1].startswith(AGENT_TAG_PREFIX)]


def staged(p: E2BSandboxProvider, h: SandboxHandle) -> List[str]:
    return root(p, h, STAGED).split()


def nothing_but_agents(p: E2BSandboxProvider, h: SandboxHandle, most: int = 1) -> None:
    """Assert that only file agents run (at most ``most``) and nothing is staged."""
    lines = processes(p, h)
    others = [ln for ln in lines if ln not in agents(lines)]
    assert others == [] and len(agents(lines)) <= most, lines
    assert staged(p, h) == []


@pytest.fixture
def fresh(provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    with own_sandbox(provider, "left") as h:
        yield h


def test_cancelled_file_calls_leave_only_the_agent_and_each_write_is_whole_or_not_done(
    provider: E2BSandboxProvider, fresh: SandboxHandle, tmp_path: Any
) -> None:
    p, h = provider, fresh
    warm_file_agent(p, h)
    [agent] = agents(processes(p, h))
    rng = random.Random(22)
    small_old, small_new = os.urandom(200_000), os.urandom(200_000)
    big_old, big_new = os.urandom(LARGE), os.urandom(LARGE)
    p.write_file(h, "/workspace/small", small_old)
    p.write_file(h, "/workspace/big", big_old)
    tree = tmp_path / "tree"
    for i in range(40):
        (tree / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 4}" / f"f{i}").write_bytes(os.urandom(60_000))
    # the download's source exists from the start: an upload cancelled before it wrote
    # anything must not turn the next round's download into "does not exist"
    p.upload(h, tree, "/workspace/up")
    calls = {
        "write small": lambda c: p.write_file(h, "/workspace/small", small_new, cancel=c),
        "write large": lambda c: p.write_file(h, "/workspace/big", big_new, cancel=c),
        "read": lambda c: p.read_file(h, "/workspace/big", max_bytes=LARGE, cancel=c),
        "stat": lambda c: p.stat(h, "/workspace/small", cancel=c),
        "batch": lambda c: p.write_files(h, {f"/workspace/b/{i}": small_new for i in range(8)},
                                         cancel=c),
        "list": lambda c: p.list_dir(h, "/", depth=3, cancel=c),
        "upload": lambda c: p.upload(h, tree, "/workspace/up", cancel=c),
        "download": lambda c: p.download(h, "/workspace/up", tmp_path / "down", cancel=c),
    }
    outcomes: Dict[str, List[str]] = {name: [] for name in calls}
    for round_ in range(6):
        for name, call in calls.items():
            token = CancelToken()
            threading.Timer(rng.uniform(0.0, 0.05), token.cancel, args=("test",)).start()
            try:
                call(token)
                outcomes[name].append("done")
            except Cancelled:
                outcomes[name].append("cancelled")
            token.cancel("over")
            nothing_but_agents(p, h)
            # a write is either done (the new bytes) or not (the old ones), never a part
            for path, old, new in (("/workspace/small", small_old, small_new),
                                   ("/workspace/big", big_old, big_new)):
                got = p.read_file(h, path, max_bytes=LARGE)
                assert got in (FileContent(old), FileContent(new)), (name, round_)
                if name == "write small" and path == "/workspace/small":
                    want = new if outcomes[name][-1] == "done" else old
                    assert got == FileContent(want), (name, outcomes[name])
                if name == "write large" and path == "/workspace/big":
                    want = new if outcomes[name][-1] == "done" else old
                    assert got == FileContent(want), (name, outcomes[name])
            p.write_file(h, "/workspace/small", small_old)
            p.write_file(h, "/workspace/big", big_old)
    # the agent served all along: the same process, still the only one
    assert agents(processes(p, h)) == [agent]
    assert any(o == "cancelled" for os_ in outcomes.values() for o in os_), outcomes


def test_a_file_call_past_its_deadline_leaves_nothing(
    provider: E2BSandboxProvider, fresh: SandboxHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    p, h = provider, fresh
    warm_file_agent(p, h)
    p.write_file(h, "/workspace/big", os.urandom(LARGE))
    monkeypatch.setattr(_files, "FILE_OP_TIMEOUT_SECONDS", 0.02)
    seen = set()
    for _ in range(10):
        for call in (lambda: p.write_file(h, "/workspace/big", os.urandom(LARGE)),
                     lambda: p.write_files(h, {"/workspace/s": os.urandom(900_000)}),
                     lambda: p.read_file(h, "/workspace/big", max_bytes=LARGE)):
            try:
                call()
                seen.add("done")
            except OperationTimeout:
                seen.add("timed out")
            nothing_but_agents(p, h)
    assert "timed out" in seen


#: A client of its own (as a user's script is): makes a provider, warms its file agent,
#: says "ready", then runs the file call argv[3] in a loop until Ctrl-C or a kill.
CLIENT = textwrap.dedent(
    """
    import json, logging, os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.basicConfig(stream=sys.stderr, format="%(relativeCreated)d %(threadName)s %(message)s")
    logging.getLogger("e2b_provider").setLevel(logging.DEBUG)
    from e2b_provider import DeploymentConfig, E2BSandboxProvider
    from e2b_provider.core import file_agents as _agent
    cfg, sid, what, idle = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    _agent.AGENT_IDLE_SECONDS = float(idle)
    data = os.urandom(8 << 20)
    with E2BSandboxProvider(DeploymentConfig(**cfg)) as p:
        p.write_file(sid, "/workspace/c/warm", b"x")
        import time
        while not p._files._agents.sessions():
            time.sleep(0.05)
        print("ready", flush=True)
        try:
            i = 0
            while True:
                i += 1
                if what == "write":
                    p.write_file(sid, "/workspace/c/big", data)
                elif what == "small":
                    p.write_file(sid, "/workspace/c/small", data[: 900_000])
                elif what == "upload":
                    p.upload(sid, sys.argv[5], "/workspace/c/tree-%d" % i)
                elif what == "download":
                    p.download(sid, "/workspace/c", sys.argv[5] + "-down-%d" % i)
                else:
                    p.read_file(sid, "/workspace/c/big", max_bytes=8 << 20)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        began = time.monotonic()
    print("closed in %.2f s" % (time.monotonic() - began), flush=True)
    """
)


def _client(emu, h: SandboxHandle, what: str, idle: float = 60.0,
            tree: Optional[str] = None) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    cfg = {"api_key": emu.api_key, "template": "base", "api_url": emu.api_url,
           "sandbox_url": emu.sandbox_url, "domain": "e2b.localhost"}
    child = subprocess.Popen(
        [sys.executable, "-c", CLIENT, json.dumps(cfg), h.id, what, str(idle),
         *([tree] if tree else [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if line != "ready":
        _, err = child.communicate(timeout=30)
        raise AssertionError(f"the client did not start: {line} {err}")
    return child


def _kill(child: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGKILL ``child`` (nothing cleaned up on its side) and close its pipes."""
    child.kill()
    child.communicate(timeout=30)


@pytest.mark.parametrize("what", ["write", "small", "read", "upload", "download"])
def test_ctrl_c_during_a_file_call_leaves_nothing_once_it_returns(
    emu, provider: E2BSandboxProvider, fresh: SandboxHandle, what: str, tmp_path: Any
) -> None:  # type: ignore[no-untyped-def]
    p, h = provider, fresh
    p.write_file(h, "/workspace/c/big", os.urandom(8 << 20))
    tree = tmp_path / "tree"
    for i in range(30):
        (tree / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 3}" / f"f{i}").write_bytes(os.urandom(200_000))
    rng = random.Random(what)
    for _ in range(3):
        child = _client(emu, h, what, tree=str(tree))
        try:
            time.sleep(rng.uniform(0.05, 0.6))
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                _kill(child)
        assert "interrupted" in out, err
        # the child closed its provider when it left: its agent was told to leave
        try:
            wait_until(lambda: agents(processes(p, h)) == [], 15, "the child's agent to leave")
        except AssertionError as exc:  # say what the agent was doing, and the child's log
            raise AssertionError(f"{exc}\nchild: {out}\n{err[-6000:]}\nsandbox:\n"
                                 f"{root(p, h, STATES)}") from None
        nothing_but_agents(p, h, most=0)


#: A client whose first call starts its agent: says "ready", waits for a line on its
#: standard input, then writes a small batch (which starts the agent carrying it) and
#: reports a Ctrl-C.
STARTING_CLIENT = textwrap.dedent(
    """
    import json, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from e2b_provider import DeploymentConfig, E2BSandboxProvider
    cfg, sid = json.loads(sys.argv[1]), sys.argv[2]
    with E2BSandboxProvider(DeploymentConfig(**cfg)) as p:
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            p.write_files(sid, {"/workspace/s/a": b"a", "/workspace/s/b": b"b"})
            print("written", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """
)


def _agent_pids(emu, sid: str) -> List[int]:  # type: ignore[no-untyped-def]
    """Host pids of the sandbox's file agents (read from the host: no request to envd)."""
    found = []
    for pid in emu.sandbox_pids(sid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if AGENT_TAG_PREFIX.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_ctrl_c_while_the_agent_starts_leaves_no_agent_behind(
    emu, provider: E2BSandboxProvider, fresh: SandboxHandle
) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C while the first call waits for its agent to say it is ready (envd's stream of
    it stalls, so the client never learns its pid): the agent, which envd started, is
    retired by its name before the client's close() returns, not left to its idle timeout
    (60 s)."""
    p, h = provider, fresh
    assert _agent_pids(emu, h.id) == []
    cfg = {"api_key": emu.api_key, "template": "base", "api_url": emu.api_url,
           "sandbox_url": emu.sandbox_url, "domain": "e2b.localhost"}
    child = subprocess.Popen(
        [sys.executable, "-c", STARTING_CLIENT, json.dumps(cfg), h.id],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        emu.stream_stall(sandbox_id=h.id)  # the next Start stream: the child's agent
        child.stdin.write("go\n")
        child.stdin.flush()
        wait_until(lambda: _agent_pids(emu, h.id), 15, "the child's agent to start")
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            _kill(child)
        emu.clear_faults()
    assert "interrupted" in out, err
    # close() waited for the retirement (within its 5 s bound): the agent is gone by now,
    # or within a moment of it
    wait_until(lambda: _agent_pids(emu, h.id) == [], 3, "the started agent to be retired")
    nothing_but_agents(p, h, most=0)


def test_a_killed_clients_agent_leaves_on_its_own_and_kill_all_ends_the_rest(
    emu, provider: E2BSandboxProvider, fresh: SandboxHandle, tmp_path: Any
) -> None:  # type: ignore[no-untyped-def]
    p, h = provider, fresh
    p.write_file(h, "/workspace/c/big", os.urandom(8 << 20))
    # a client killed while idle: its agent exits once idle (AGENT_IDLE_SECONDS, 2 here)
    child = _client(emu, h, "read", idle=2.0)
    _kill(child)
    wait_until(lambda: agents(processes(p, h)) == [], 20, "the dead client's agent to exit")
    # clients killed in the middle of writes and uploads (SIGKILL: nothing cleaned up)
    tree = tmp_path / "tree"
    for i in range(30):
        (tree / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 3}" / f"f{i}").write_bytes(os.urandom(200_000))
    for what in ("write", "upload", "small", "write"):
        child = _client(emu, h, what, tree=str(tree))
        time.sleep(random.uniform(0.05, 0.4))
        _kill(child)
    p.kill_all(h)
    nothing_but_agents(p, h, most=0)
    assert p.read_file(h, "/workspace/c/warm") == FileContent(b"x")


def test_nothing_accumulates_over_a_thousand_cancels(
    provider: E2BSandboxProvider, fresh: SandboxHandle
) -> None:
    """1,000 calls cancelled at random points while they run (most through the file agent,
    every eighth a write through a FIFO and envd's /files): the staging directory, the
    registries of temporary files and the processes are the same before and after."""
    p, h = provider, fresh
    warm_file_agent(p, h)
    large = os.urandom((1 << 20) + 4096)  # just over MAX_INLINE_FILE: through a FIFO
    small = large[:200_000]
    p.write_file(h, "/workspace/w", large)
    before = (staged(p, h), processes(p, h))
    rng = random.Random(1000)
    cancelled = attempts = 0
    kinds: List[Callable[[Optional[CancelToken]], object]] = [
        lambda c: p.write_file(h, "/workspace/w", large, cancel=c),
        lambda c: p.write_file(h, "/workspace/s", small, cancel=c),
        lambda c: p.read_file(h, "/workspace/w", max_bytes=len(large), cancel=c),
        lambda c: p.write_files(h, {f"/workspace/m/{i}": small for i in range(4)}, cancel=c),
    ]
    # each cancel falls at a random point within the first 60 % of what that call takes
    # here uncancelled (the median of three; a cancel late in a call seldom stops it): on a
    # fast machine a fixed window of 10 ms let too many calls finish first
    took = []
    for call in kinds:
        times = []
        for _ in range(3):
            began = time.monotonic()
            call(None)
            times.append(time.monotonic() - began)
        took.append(sorted(times)[1])
    calls = [(kinds[k], 0.6 * took[k]) for k in (0, 1, 1, 1, 2, 2, 3, 3)]
    # 1,000 calls whose cancel fired while they ran: most end Cancelled, a write whose new
    # content was in place by then ends done (some calls finish before their cancel)
    while cancelled < 1000:
        attempts += 1
        assert attempts < 3000, (cancelled, took)
        token = CancelToken()
        call, spread = calls[attempts % len(calls)]
        threading.Timer(rng.uniform(0.0, spread), token.cancel, args=("test",)).start()
        try:
            call(token)
            stopped = token.cancelled
        except Cancelled:
            stopped = True
        cancelled += stopped
        token.cancel("over")
    after = (staged(p, h), processes(p, h))
    assert before == after and before[0] == [] and len(agents(before[1])) == 1


CLOSING_CLIENT = textwrap.dedent(
    """
    import json, sys, time
    from e2b_provider import DeploymentConfig, E2BSandboxProvider
    cfg, running, starting = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    p = E2BSandboxProvider(DeploymentConfig(**cfg))
    p.stat(running, "/workspace")
    while not p._files._agents.sessions():
        time.sleep(0.02)
    print("ready", flush=True)
    sys.stdin.readline()
    p._files._agents.ready(starting)  # an agent start in the background, which stalls
    time.sleep(0.5)
    began = time.monotonic()
    p.close()
    print("closed in %.2f s" % (time.monotonic() - began), flush=True)
    """
)


def test_a_start_that_does_not_end_never_keeps_close_from_retiring_the_running_agents(
    emu, provider: E2BSandboxProvider, fresh: SandboxHandle
) -> None:  # type: ignore[no-untyped-def]
    """close() while one sandbox's agent runs and another's start stalls (envd's stream of
    it says nothing): the running agent is told to leave at once, not after the wait for
    the start has used up close()'s 5 s bound (the client exits right after close(), and an
    agent never told to leave stays until its idle timeout, 60 s)."""
    p = provider
    with own_sandbox(p, "left") as other:
        cfg = {"api_key": emu.api_key, "template": "base", "api_url": emu.api_url,
               "sandbox_url": emu.sandbox_url, "domain": "e2b.localhost"}
        child = subprocess.Popen(
            [sys.executable, "-c", CLOSING_CLIENT, json.dumps(cfg), fresh.id, other.id],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "ready", child.stderr
            assert len(_agent_pids(emu, fresh.id)) == 1
            emu.stream_stall(sandbox_id=other.id)  # the next Start stream there: its agent
            child.stdin.write("go\n")
            child.stdin.flush()
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                _kill(child)
            emu.clear_faults()
        assert child.returncode == 0 and "closed in" in out, err
        wait_until(lambda: _agent_pids(emu, fresh.id) == [], 3,
                   f"the running agent to leave ({out.strip()})")
