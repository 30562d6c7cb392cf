"""A cancelled write tells the truth: ``Cancelled`` means the old file is there, a return
means the new one is, on every write path; and two file-path defects found with them.

Each trial writes a known old content, then writes a new one with a token cancelled at a
random moment (spread over the time such a write takes, so some cancels land after the
rename in the sandbox), and reads the file back: after ``Cancelled`` it must hold the old
bytes, after a return the new ones, and never anything else. The paths: the file agent, the
per-call script of a sandbox without ``python3``, the first write of a fresh provider (a
one-off script while its agent starts) and a ``write_files`` batch.

Against the emulator, with real sandboxes and real processes.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest
from waiting import wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    E2BSandboxProvider,
    FileContent,
    SandboxHandle,
)
from e2b_provider.core.file_agents import MAX_INLINE_FILE
from e2b_provider.protocol.scripts import COMMIT_PREFIX, INLINE_WRITE_MAX

from .conftest import NO_PYTHON, own_sandbox, root, warm_file_agent
from .test_leftovers import agents, processes, staged

pytestmark = pytest.mark.integration

#: Cancelled writes per path.
TRIALS = 40

Write = Callable[[bytes, Optional[CancelToken]], None]
Read = Callable[[], bytes]


@pytest.fixture(scope="module")
def nopy(emulator) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emulator.config(template=NO_PYTHON)) as p:
        yield p


@pytest.fixture(scope="module")
def nopy_box(nopy: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    with own_sandbox(nopy, "outcome-nopy") as h:
        yield h


def marks(p: E2BSandboxProvider, h: SandboxHandle) -> List[str]:
    """The commit marks of per-call writes left in the sandbox (a withdrawal removes its
    own once the write's process is known to have ended)."""
    return root(p, h, f"ls -a /tmp | grep -F {COMMIT_PREFIX[5:]} || true").split()


def _contents(rng: random.Random, n: int = 2, most: int = 60 << 10) -> List[bytes]:
    """``n`` distinct payloads (never empty, so old and new always differ)."""
    return [bytes([i]) + os.urandom(rng.randint(0, most)) for i in range(n)]


def _cancel_later(token: CancelToken, delay: float) -> None:
    threading.Timer(delay, token.cancel, args=("test",)).start()


def _trials(write: Write, read: Read, rng: random.Random) -> Dict[str, int]:
    """Run :data:`TRIALS` cancelled writes; assert each one's outcome; count them.

    The cancels are spread over 1.5 times the median time an uncancelled write takes here
    (a warm-up write first, which may start things, then every uncancelled write of the
    run counts), so they land before, during and after it: one slow write does not push
    every cancel past the end."""
    write(os.urandom(1000), None)
    spans: List[float] = []

    def timed(data: bytes) -> None:
        began = time.monotonic()
        write(data, None)
        spans.append(time.monotonic() - began)

    for _ in range(3):
        timed(os.urandom(1000))
    counts = {"cancelled": 0, "done": 0}
    for trial in range(TRIALS):
        old, new = _contents(rng)
        timed(old)
        assert read() == old
        token = CancelToken()
        _cancel_later(token, rng.uniform(0.0, 1.5 * statistics.median(spans)))
        try:
            write(new, token)
            outcome = "done"
        except Cancelled:
            outcome = "cancelled"
        finally:
            token.cancel("over")
        counts[outcome] += 1
        got = read()
        assert got in (old, new), f"trial {trial}: the file holds neither content"
        want = new if outcome == "done" else old
        assert got == want, (
            f"trial {trial}: the write said {outcome!r} but the file holds the "
            f"{'new' if got == new else 'old'} content ({counts})"
        )
    return counts


def _writer(p: E2BSandboxProvider, h: SandboxHandle, path: str) -> Write:
    def write(data: bytes, c: Optional[CancelToken]) -> None:
        p.write_file(h, path, data, cancel=c)

    return write


def _reader(p: E2BSandboxProvider, h: SandboxHandle, path: str) -> Read:
    def read() -> bytes:
        got = p.read_file(h, path, max_bytes=1 << 20)
        assert got is not None
        return got.data

    return read


def test_a_cancelled_write_through_the_agent_tells_its_outcome(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    warm_file_agent(p, h)
    path = "/workspace/outcome/agent"
    counts = _trials(_writer(p, h, path), _reader(p, h, path), random.Random(51))
    assert counts["cancelled"] > 0 and counts["done"] > 0, counts
    assert len(p._files._agents.sessions()) == 1


class _Stalled:
    """An agent session's event stream that has stalled: once ``stalled`` is set, what the
    agent writes still arrives and is read, but never reaches the session (as behind a
    proxy that stopped forwarding); the stream still ends when it is shut down."""

    def __init__(self, events: Iterator[object]) -> None:
        self._events = events
        self.stalled = threading.Event()

    def __iter__(self) -> _Stalled:
        return self

    def __next__(self) -> object:
        while True:
            ev = next(self._events)
            if not self.stalled.is_set():
                return ev


def test_a_cancelled_write_whose_agent_went_silent_after_the_rename_returns(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    warm_file_agent(p, h)
    path = "/workspace/outcome/silent"
    p.write_file(h, path, b"old")
    [session] = p._files._agents.sessions()
    stall = _Stalled(session._events)
    session._events = stall
    stall.stalled.set()
    token = CancelToken()
    outcome: List[str] = []

    def write() -> None:
        try:
            p.write_file(h, path, b"new", cancel=token)
            outcome.append("done")
        except Cancelled:
            outcome.append("cancelled")

    writer = threading.Thread(target=write)
    writer.start()
    # the agent has renamed the new file into place; its answer never comes
    wait_until(lambda: root(p, h, f"cat {path}") == "new", 30, "the agent's rename")
    token.cancel("test")
    writer.join(120)
    assert not writer.is_alive()
    assert root(p, h, f"cat {path}") == "new"
    assert outcome == ["done"]
    # the silent agent was retired and another one serves
    assert p._files._agents.sessions() != [session]
    assert p.read_file(h, path) == FileContent(b"new")


def test_a_cancelled_write_without_python3_tells_its_outcome(
    nopy: E2BSandboxProvider, nopy_box: SandboxHandle
) -> None:
    p, h = nopy, nopy_box
    path = "/workspace/outcome/nopy"
    counts = _trials(_writer(p, h, path), _reader(p, h, path), random.Random(52))
    assert counts["cancelled"] > 0 and counts["done"] > 0, counts
    assert p._files.lacks_python(h.id)
    assert staged(p, h) == [] and marks(p, h) == []


def test_a_cancelled_large_write_without_python3_tells_its_outcome(
    nopy: E2BSandboxProvider, nopy_box: SandboxHandle
) -> None:
    # larger than a script's request carries: a helper fed through envd's /files
    p, h = nopy, nopy_box
    path = "/workspace/outcome/nopy-large"

    def write(data: bytes, c: Optional[CancelToken]) -> None:
        p.write_file(h, path, data + os.urandom(INLINE_WRITE_MAX), cancel=c)

    def read() -> bytes:
        got = p.read_file(h, path, max_bytes=1 << 20)
        assert got is not None
        return got.data[:-INLINE_WRITE_MAX]

    counts = _trials(write, read, random.Random(56))
    assert counts["cancelled"] > 0 and counts["done"] > 0, counts
    assert staged(p, h) == [] and marks(p, h) == []


def test_the_cancelled_first_write_of_a_fresh_provider_tells_its_outcome(
    emulator, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle  # type: ignore[no-untyped-def]
) -> None:
    base, h = shared_provider, sandbox
    path = "/workspace/outcome/first"
    first: List[bool] = []

    def write(data: bytes, c: Optional[CancelToken]) -> None:
        if c is None:
            base.write_file(h, path, data)
            return
        # a new provider each time: its first write takes a script while its agent starts
        with E2BSandboxProvider(emulator.config(template="base")) as fresh:
            first.append(fresh._files._agents.sessions() == [])
            fresh.write_file(h, path, data, cancel=c)

    counts = _trials(write, _reader(base, h, path), random.Random(53))
    assert all(first) and counts["cancelled"] > 0 and counts["done"] > 0, counts
    assert marks(base, h) == []


def test_a_cancelled_large_write_tells_its_outcome(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    # larger than a request to the agent carries: a helper script fed through envd's /files
    p, h = shared_provider, sandbox
    path = "/workspace/outcome/large"
    rng = random.Random(55)

    def write(data: bytes, c: Optional[CancelToken]) -> None:
        p.write_file(h, path, data + os.urandom(MAX_INLINE_FILE), cancel=c)

    def read() -> bytes:
        got = p.read_file(h, path, max_bytes=4 << 20)
        assert got is not None
        return got.data[: -MAX_INLINE_FILE]

    counts = _trials(write, read, rng)
    assert counts["cancelled"] > 0 and counts["done"] > 0, counts
    assert staged(p, h) == []


def test_a_cancelled_batch_tells_its_outcome(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    warm_file_agent(p, h)
    paths = [f"/workspace/outcome/batch/{i}" for i in range(4)]
    rng = random.Random(54)
    pending: Dict[str, bytes] = {}

    def write(data: bytes, c: Optional[CancelToken]) -> None:
        # every file of the batch gets its own content, derived from ``data``
        files = {path: bytes([i]) + data for i, path in enumerate(paths)}
        pending.clear()
        pending.update(files)
        p.write_files(h, files, cancel=c)

    def read() -> bytes:
        got = p.read_files(h, paths)
        whole = [got[path] for path in paths]
        assert all(isinstance(g, FileContent) for g in whole)
        # the batch goes together: every file old, or every file new
        firsts = {g.data[1:] for g in whole if g is not None}
        assert len(firsts) == 1, "the batch was written in part"
        for path, g in got.items():
            assert g is not None and g.data[:1] == bytes([paths.index(path)])
        return firsts.pop()

    counts = _trials(write, read, rng)
    assert counts["cancelled"] > 0 and counts["done"] > 0, counts


def test_a_file_uploaded_into_an_existing_directory_without_python3(
    nopy: E2BSandboxProvider, nopy_box: SandboxHandle, tmp_path: Path
) -> None:
    p, h = nopy, nopy_box
    p.write_file(h, "/workspace/into/keep", b"kept")
    for i in range(5):
        src = tmp_path / f"one-{i}.txt"
        src.write_bytes(f"file {i}\n".encode())
        # into /workspace (whose parent, /, is root's), and into a directory below it
        for remote in (f"/workspace/one-{i}.txt", f"/workspace/into/one-{i}.txt"):
            summary = p.upload(h, src, remote)
            assert summary.files == 1
            assert p.read_file(h, remote) == FileContent(f"file {i}\n".encode())
    assert p.read_file(h, "/workspace/into/keep") == FileContent(b"kept")
    listed = p.list_dir(h, "/workspace/into")
    assert listed is not None
    assert sorted(e.name for e in listed) == ["keep"] + [f"one-{i}.txt" for i in range(5)]
    assert staged(p, h) == []


def test_closing_right_after_the_first_file_call_ends_the_starting_agent(
    emulator, shared_provider: E2BSandboxProvider  # type: ignore[no-untyped-def]
) -> None:
    base = shared_provider
    with own_sandbox(base, "close-start") as h:
        for _ in range(3):
            with E2BSandboxProvider(emulator.config(template="base")) as p:
                assert p.stat(h, "/workspace") is not None  # starts its agent meanwhile
            wait_until(lambda: agents(processes(base, h)) == [], 10,
                       "the starting agent of a closed provider to end")
