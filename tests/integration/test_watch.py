"""Watching directories (``watch``, ``wait_for_file``) against the emulator's envd.

Real sandboxes, real files changed by commands in them: the events and their order, recursive
watches, renames, removals and mode changes, a flood (bounded: reported as ``overflow``, the
watch goes on), the timeout, cancel, ``close`` and Ctrl-C (each bounded, and the watch removed
in the sandbox), ``wait_for_file`` (at once, later, deep, race-free, timed out), errors (typed,
worded in the caller's terms, refused before any I/O), and the README's example.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any, Iterator, List, Tuple

import pytest
from host_proc import inotify_watches_on
from waiting import wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    CommandFailed,
    E2BSandboxProvider,
    FileEvent,
    FileStat,
    InvalidArgument,
    NotADirectory,
    OperationTimeout,
    PathNotFound,
    PermissionDenied,
    SandboxGoneError,
    SandboxHandle,
    SandboxPaused,
)

from .conftest import root, run_readme_example

pytestmark = pytest.mark.integration


@pytest.fixture
def d(shared_provider: E2BSandboxProvider, sandbox: SandboxHandle) -> str:
    """A fresh directory of the module's sandbox, owned by ``sandbox``."""
    path = f"/workspace/w-{uuid.uuid4().hex[:8]}"
    assert shared_provider.exec(sandbox, f"mkdir -p {path}").ok
    return path


def sh(p: E2BSandboxProvider, h: SandboxHandle, command: str) -> None:
    r = p.exec(h, command, timeout=60.0)
    assert r.ok, r


def pairs(events: List[FileEvent]) -> List[Tuple[str, str]]:
    return [(e.type, e.path) for e in events]


def until(events: Iterator[FileEvent], want: Tuple[str, str]) -> List[FileEvent]:
    """The events up to and including ``want`` (the watch's own timeout bounds the wait)."""
    got: List[FileEvent] = []
    for event in events:
        got.append(event)
        if (event.type, event.path) == want:
            return got
    raise AssertionError(f"the watch ended without {want}; got {pairs(got)}")


def watches_on(emulator: Any, p: E2BSandboxProvider, h: SandboxHandle, path: str) -> int:
    """How many inotify watches the sandbox's processes hold on ``path`` (read on the host:
    the agent is not dumpable, even the sandbox's root cannot read its /proc files)."""
    inode = int(root(p, h, f"stat -c %i {path}"))
    return inotify_watches_on(emulator, h.id, inode)


# -- events ------------------------------------------------------------------------------------


def test_events_of_a_directory_in_order(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    with p.watch(h, d, timeout=30) as events:
        sh(p, h, f"cd {d} && echo hi > a.txt && chmod 600 a.txt && mv a.txt b.txt && "
                 "rm b.txt && mkdir sub && touch sub/inner && touch last")
        got = until(events, ("create", f"{d}/last"))
    assert pairs(got) == [
        ("create", f"{d}/a.txt"),
        ("write", f"{d}/a.txt"),
        ("chmod", f"{d}/a.txt"),
        ("rename", f"{d}/a.txt"),
        ("create", f"{d}/b.txt"),
        ("remove", f"{d}/b.txt"),
        ("create", f"{d}/sub"),  # not recursive: nothing from inside sub
        ("create", f"{d}/last"),
    ]
    assert all(isinstance(e, FileEvent) for e in got)
    assert str(got[0]) == f"create {d}/a.txt"


def test_recursive_watch_follows_new_and_moved_directories(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    sh(p, h, f"mkdir -p {d}/old/deep")
    with p.watch(h, d, recursive=True, timeout=30) as events:
        sh(p, h, f"echo 1 > {d}/old/deep/f")
        until(events, ("write", f"{d}/old/deep/f"))
        sh(p, h, f"mkdir {d}/new")
        until(events, ("create", f"{d}/new"))  # watched from now on
        sh(p, h, f"echo 2 > {d}/new/g")
        until(events, ("write", f"{d}/new/g"))
        # a tree moved in: its content is reported as created
        sh(p, h, f"mkdir -p /tmp/tree-{d[-8:]}/t/u && touch /tmp/tree-{d[-8:]}/t/u/leaf && "
                 f"mv /tmp/tree-{d[-8:]}/t {d}/t")
        got = until(events, ("create", f"{d}/t/u/leaf"))
        assert pairs(got)[-3:] == [
            ("create", f"{d}/t"), ("create", f"{d}/t/u"), ("create", f"{d}/t/u/leaf")
        ]
        # a directory moved within the tree is still watched under its new name
        sh(p, h, f"mv {d}/new {d}/old/renamed")
        until(events, ("create", f"{d}/old/renamed"))
        sh(p, h, f"rm {d}/old/renamed/g")
        until(events, ("remove", f"{d}/old/renamed/g"))


def test_the_watch_ends_after_its_directory_is_removed(
    emu: Any, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    sh(p, h, f"mkdir {d}/gone")
    with p.watch(h, f"{d}/gone", timeout=60) as events:
        assert watches_on(emu, p, h, f"{d}/gone") == 1
        t0 = time.monotonic()
        sh(p, h, f"rmdir {d}/gone")
        got = list(events)  # ends by itself: envd's watch of it is dead
    assert pairs(got) == [("remove", f"{d}/gone")]
    assert time.monotonic() - t0 < 30


# -- bounded: timeout, cancel, close, Ctrl-C ---------------------------------------------------


def test_the_timeout_ends_the_iteration_cleanly_and_the_watch_in_the_sandbox(
    emu: Any, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    with p.watch(h, d, timeout=1.0) as events:
        t0 = time.monotonic()  # the timeout runs from the set-up
        assert watches_on(emu, p, h, d) == 1
        assert list(events) == []  # nothing happened: no event, no error
        took = time.monotonic() - t0
    assert 0.9 <= took < 5.0, took
    wait_until(lambda: watches_on(emu, p, h, d) == 0, 10, "the watch to be removed")


def test_cancel_from_another_thread_raises_cancelled_at_once(
    emu: Any, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    tok = CancelToken()
    with p.watch(h, d, cancel=tok) as events:
        timer = threading.Timer(0.5, tok.cancel, args=("enough",))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(Cancelled) as info:
            next(iter(events))
        assert time.monotonic() - t0 < 5.0
    assert "watching" in str(info.value) and "enough" in str(info.value)
    wait_until(lambda: watches_on(emu, p, h, d) == 0, 10, "the watch to be removed")
    with pytest.raises(Cancelled):  # a fired token: the watch is not even set up
        with p.watch(h, d, cancel=tok):
            pass


def test_close_from_another_thread_stops_the_iteration(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    with p.watch(h, d) as events:
        threading.Timer(0.3, events.close).start()
        t0 = time.monotonic()
        assert list(events) == []
        assert time.monotonic() - t0 < 5.0


CHILD = textwrap.dedent(
    """
    import json, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from e2b_provider import DeploymentConfig, E2BSandboxProvider
    with E2BSandboxProvider(DeploymentConfig(**json.loads(sys.argv[1]))) as p:
        with p.watch(sys.argv[2], sys.argv[3]) as events:
            print("watching", flush=True)
            try:
                for event in events:
                    print(event, flush=True)
            except KeyboardInterrupt:
                t0 = time.monotonic()
                print("interrupted", flush=True)
                raise
    """
)


def test_ctrl_c_interrupts_the_loop_and_ends_the_watch(
    emu: Any, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    cfg = {"api_key": emu.api_key, "template": "base", "api_url": emu.api_url,
           "sandbox_url": emu.sandbox_url, "domain": "e2b.localhost"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(cfg), h.id, d],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "watching"
        assert watches_on(emu, p, h, d) == 1
        sh(p, h, f"touch {d}/seen")
        assert child.stdout.readline().strip() == f"create {d}/seen"
        t0 = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
        assert time.monotonic() - t0 < 5.0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert out.strip() == "interrupted" and "KeyboardInterrupt" in err, err
    # a short traceback: the loop's line and the watch's, not the stream's internals
    shown = err[err.index("Traceback (most recent call last):"):].rstrip().splitlines()
    assert len(shown) <= 12 and shown[-1] == "KeyboardInterrupt", err
    assert "envd_streams" not in err and "socket" not in err, err
    wait_until(lambda: watches_on(emu, p, h, d) == 0, 10, "the watch to be removed")


# -- a flood -----------------------------------------------------------------------------------

FLOOD = (
    "python3 -c 'import os,sys\n"
    "fds = [os.open(n, os.O_CREAT | os.O_WRONLY) for n in (\"a\", \"b\")]\n"
    "for i in range(int(sys.argv[1])): os.write(fds[i % 2], b\"x\")' "
)


def test_a_flood_is_bounded_reported_as_overflow_and_the_watch_goes_on(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    made = 400_000
    with p.watch(h, d, timeout=120) as events:
        # Nobody reads while the flood runs: the connection's buffers fill, envd stops
        # reading the kernel's queue, which overflows.
        sh(p, h, f"cd {d} && {FLOOD} {made}")
        seen = 0
        for event in events:
            if event.type == "overflow":
                break
            assert event.type in ("create", "write") and event.path in (f"{d}/a", f"{d}/b")
            seen += 1
        else:
            raise AssertionError("the watch ended without an overflow")
        assert event == FileEvent("overflow", d)
        assert 0 < seen < made  # what was queued before the overflow, not the whole flood
        # the watch goes on: a change made now is seen
        sh(p, h, f"touch {d}/after")
        for event in events:
            if event == FileEvent("create", f"{d}/after"):
                break
        else:
            raise AssertionError("the watch did not go on after the overflow")


def test_a_burst_of_writes_to_one_file_comes_as_a_few_events(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    with p.watch(h, d, timeout=60) as events:
        # 2,000 writes to one file while nobody reads: they arrive together
        sh(p, h, f"cd {d} && python3 -c 'import os\nfd = os.open(\"f\", os.O_CREAT | os.O_WRONLY)\n"
                 "for _ in range(2000): os.write(fd, b\"x\")' && touch end")
        got = until(events, ("create", f"{d}/end"))
    writes = [e for e in got if e.type == "write"]
    # merged where they waited together (in the sandbox's queue, or in one read here)
    assert writes and len(writes) < 2000
    assert {e.path for e in writes} == {f"{d}/f"}


# -- wait_for_file -------------------------------------------------------------------------------


def test_wait_for_file_returns_at_once_for_a_path_that_exists(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    sh(p, h, f"echo hello > {d}/there")
    t0 = time.monotonic()
    assert p.wait_for_file(h, f"{d}/there", timeout=30) == FileStat(size=6, is_dir=False)
    assert p.wait_for_file(h, d, timeout=30).is_dir
    assert time.monotonic() - t0 < 5.0


def test_wait_for_file_sees_a_file_made_later_and_its_missing_directories(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    c = p.start(h, f"sleep 0.5; mkdir -p {d}/x/y; echo 12 > {d}/x/y/.z.tmp; "
                   f"mv {d}/x/y/.z.tmp {d}/x/y/z.json")
    t0 = time.monotonic()
    st = p.wait_for_file(h, f"{d}/x/y/z.json", timeout=60)
    assert st == FileStat(size=3, is_dir=False)  # renamed into place: whole
    assert time.monotonic() - t0 < 30
    assert c.wait(timeout=30).ok


def test_wait_for_file_is_race_free(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    # The file appears at every moment of the call: before it, while it stats, while it
    # sets the watch up, after. It is never missed (a miss would wait the whole timeout).
    p, h = shared_provider, sandbox
    for i, delay in enumerate(("0", "0.005", "0.01", "0.02", "0.04", "0.08", "0.15")):
        c = p.start(h, f"sleep {delay}; touch {d}/f{i}")
        t0 = time.monotonic()
        assert p.wait_for_file(h, f"{d}/f{i}", timeout=30) == FileStat(size=0, is_dir=False)
        assert time.monotonic() - t0 < 10, delay
        c.wait(timeout=30)


def test_wait_for_file_times_out_on_time_and_is_cancellable(
    emu: Any, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    t0 = time.monotonic()
    with pytest.raises(OperationTimeout) as info:
        p.wait_for_file(h, f"{d}/never", timeout=1.0)
    assert 0.9 <= time.monotonic() - t0 < 6.0
    assert str(info.value) == (
        f"waiting for {d}/never in sandbox {h.id} failed: {d}/never did not appear within 1 s"
    )
    tok = CancelToken()
    threading.Timer(0.3, tok.cancel, args=("stop",)).start()
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        p.wait_for_file(h, f"{d}/never", timeout=60.0, cancel=tok)
    assert time.monotonic() - t0 < 6.0
    wait_until(lambda: watches_on(emu, p, h, d) == 0, 10, "the watches to be removed")


def test_wait_for_file_errors(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    sh(p, h, f"touch {d}/file")
    with pytest.raises(NotADirectory) as info:
        p.wait_for_file(h, f"{d}/file/x", timeout=10)
    assert str(info.value).startswith(f"waiting for {d}/file/x in sandbox {h.id} failed: ")
    with pytest.raises(PermissionDenied) as denied:
        p.wait_for_file(h, "/root/secret/x", timeout=10)
    assert "may not enter /root" in str(denied.value)


# -- errors --------------------------------------------------------------------------------------


def test_errors_are_typed_and_said_in_the_callers_terms(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    sh(p, h, f"touch {d}/file")
    cases: List[Tuple[str, type, str]] = [
        (f"{d}/missing", PathNotFound, f"{d}/missing does not exist"),
        (f"{d}/file", NotADirectory, f"{d}/file is not a directory"),
        ("/root", PermissionDenied, "user 'sandbox' may not read the directory /root"),
        ("/root/inner", PermissionDenied, "may not enter /root, so /root/inner cannot be "
                                          "watched (it may exist)"),
    ]
    for path, cls, said in cases:
        with pytest.raises(cls) as info:
            with p.watch(h, path):
                pass
        text = str(info.value)
        assert text.startswith(f"watching {path} in sandbox {h.id} failed: "), text
        assert said in text and "capybara" not in text
        assert isinstance(info.value, CommandFailed)
    with pytest.raises(FileNotFoundError):  # also the builtin errors
        with p.watch(h, f"{d}/missing"):
            pass
    with pytest.raises(PermissionError):
        with p.watch(h, "/root"):
            pass


def test_bad_arguments_are_refused_before_any_io(
    emu: Any, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    before = len(emu.requests(sandbox_id=h.id))
    for kwargs in ({"recursive": "yes"}, {"timeout": 0}, {"timeout": -1}, {"cancel": 5}):
        with pytest.raises(InvalidArgument):
            with p.watch(h, "/workspace", **kwargs):
                pass
    for path in ("workspace", "/workspace/../etc", ""):
        with pytest.raises(InvalidArgument):
            with p.watch(h, path):
                pass
        with pytest.raises(InvalidArgument):
            p.wait_for_file(h, path)
    with pytest.raises(InvalidArgument):
        p.wait_for_file(h, "/x", timeout=0)
    assert len(emu.requests(sandbox_id=h.id)) == before


def test_the_watch_is_asked_as_the_sandbox_user(
    emu: Any, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str
) -> None:
    p, h = shared_provider, sandbox
    with p.watch(h, d, timeout=0.5) as events:
        list(events)
    watched = [r for r in emu.requests(sandbox_id=h.id, path="WatchDir")]
    assert watched and watched[-1]["user"] == "sandbox"


def test_the_readme_example_runs_as_written() -> None:
    out = run_readme_example("### Watching files")
    assert out.stdout.splitlines() == [
        "create /workspace/out/report.txt",
        "write /workspace/out/report.txt",
        "FileStat(size=3, is_dir=False)",
    ]


# -- the sandbox or the provider going away under a watch ------------------------------------


def _watch_in_thread(p: E2BSandboxProvider, h: SandboxHandle, path: str) -> Tuple[
        threading.Thread, List[BaseException], threading.Event]:
    errors: List[BaseException] = []
    ready = threading.Event()

    def run() -> None:
        try:
            with p.watch(h, path) as events:
                ready.set()
                for _ in events:
                    pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            ready.set()

    t = threading.Thread(target=run)
    t.start()
    assert ready.wait(60)
    return t, errors, ready


def test_closing_the_provider_ends_a_watch_with_provider_closed(emu: Any) -> None:
    with E2BSandboxProvider(emu.config(template="base")) as p:
        h = p.create(f"w-{uuid.uuid4().hex[:8]}")
        try:
            other = E2BSandboxProvider(emu.config(template="base"))
            t, errors, _ = _watch_in_thread(other, h, "/workspace")
            other.close()
            t.join(30)
            assert not t.is_alive()
            assert [type(e).__name__ for e in errors] == ["ProviderClosed"], errors
        finally:
            p.destroy(h)


@pytest.mark.parametrize("what", ["suspend", "destroy"])
def test_a_sandbox_paused_or_deleted_under_a_watch_says_so(emu: Any, what: str) -> None:
    with E2BSandboxProvider(emu.config(template="base")) as p:
        h = p.create(f"w-{uuid.uuid4().hex[:8]}")
        try:
            t, errors, _ = _watch_in_thread(p, h, "/workspace")
            getattr(p, what)(h)
            t.join(60)
            assert not t.is_alive() and len(errors) == 1, errors
            want = SandboxPaused if what == "suspend" else SandboxGoneError
            assert isinstance(errors[0], want), errors
            assert h.id in str(errors[0])
        finally:
            p.destroy(h)


# -- the library's own files -------------------------------------------------------------------


def test_writes_through_the_library_name_only_their_targets(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, d: str, tmp_path: Any
) -> None:
    """Every write goes through a staging file beside its target, renamed onto it: the
    watch names the target (create, then write, as for a direct write), never the staging
    file; an upload's staging directory and a command's control files are hidden too."""
    p, h = shared_provider, sandbox
    sh(p, h, f"echo old > {d}/old.txt")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f.txt").write_text("f")
    with p.watch(h, d, recursive=True, timeout=60) as events:
        p.write_file(h, f"{d}/new.txt", b"hello")  # small: the file agent
        p.write_file(h, f"{d}/old.txt", b"x" * (3 << 20))  # large: streamed
        p.upload(h, str(tree), f"{d}/tree")
        sh(p, h, f"touch {d}/last")
        got: List[FileEvent] = []
        for event in events:
            got.append(event)
            if event.type == "overflow":
                # a watcher error: the upload's staging directory was renamed away before a
                # loaded host's watcher got to it. The watch started again; what happened
                # in between is lost (as documented), the sentinel too: make it again
                sh(p, h, f"touch {d}/last")
            if (event.type, event.path) == ("create", f"{d}/last"):
                break
        else:
            raise AssertionError(f"the watch ended without creating last: {pairs(got)}")
    assert [e for e in got if ".capybara" in e.path] == []
    seen = pairs(got)
    assert seen[:2] == [("create", f"{d}/new.txt"), ("write", f"{d}/new.txt")]
    at = seen.index(("create", f"{d}/old.txt"))
    assert seen[at + 1] == ("write", f"{d}/old.txt")
    restarted = ("overflow", d) in seen
    assert restarted or ("create", f"{d}/tree") in seen
    assert {path for _, path in seen} <= {f"{d}/new.txt", f"{d}/old.txt", f"{d}/last",
                                          f"{d}/tree", f"{d}/tree/sub",
                                          f"{d}/tree/sub/f.txt"} | ({d} if restarted else set())


def test_a_watch_of_tmp_does_not_show_the_commands_control_files(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    last = f"/tmp/last-{uuid.uuid4().hex[:8]}"
    with p.watch(h, "/tmp", timeout=60) as events:
        sh(p, h, "true")
        p.write_file(h, "/tmp/x.txt", b"x")
        sh(p, h, f"touch {last}")
        got = until(events, ("create", last))
    assert [e for e in got if ".capybara" in e.path] == [], pairs(got)
    assert ("create", "/tmp/x.txt") in pairs(got)
