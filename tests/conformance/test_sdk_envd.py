"""Conformance of the emulator's envd side with the OFFICIAL ``e2b`` SDK, sync and async.

Every behaviour is driven twice, through ``e2b.Sandbox`` and ``e2b.AsyncSandbox`` (each async
test connects to the module's sandbox inside its own event loop): gzip and octet-stream
uploads, downloads (gzip, bytes, streams), many files in one write, metadata, ``EntryInfo``
of files, directories and symlinks, the filesystem calls (``exists``, ``make_dir``,
``rename``, ``remove``, ``list``), ``watch_dir`` (the sync client polls, the async one
streams; a burst larger than the kernel's queue is kept until polled, two watches of one
directory are independent, the async watch's timeout ends it), and the command surface
beyond ``run``: ``list``, ``send_stdin``, ``stream_input``, ``close_stdin``, ``connect``,
``kill`` and the PTY.
"""

from __future__ import annotations

import asyncio
import io
import time
import uuid
from typing import Any, Awaitable, Callable, Iterator, List, TypeVar

import pytest
import requests
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxException,
    TimeoutException,
)
from host_proc import inotify_watches_on
from waiting import wait_until

from e2b_provider.emulator import Emulator

from .conftest import sdk_sandbox

pytestmark = [pytest.mark.conformance, pytest.mark.integration]

T = TypeVar("T")
BIG = bytes(range(256)) * 4096 + b"end"  # 1 MiB and a bit


@pytest.fixture(scope="module")
def envd_sandbox(sdk: Emulator) -> Iterator[Sandbox]:
    """One sandbox for the module, with the SDK pointed at the emulator."""
    with sdk_sandbox(timeout=600) as sb:
        yield sb


def run_async(sandbox: Sandbox, body: Callable[[AsyncSandbox], Awaitable[T]]) -> T:
    """Run ``body`` with an ``AsyncSandbox`` connected to ``sandbox`` in a fresh loop."""

    async def main() -> T:
        return await body(await AsyncSandbox.connect(sandbox.sandbox_id))

    return asyncio.run(asyncio.wait_for(main(), 120))


async def await_for(pred: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def tmpdir() -> str:
    return f"/home/user/t-{uuid.uuid4().hex[:10]}"


def watched(emulator: Emulator, sb: Sandbox, path: str) -> int:
    inode = int(sb.commands.run(f"stat -c %i {path}").stdout)
    return inotify_watches_on(emulator, sb.sandbox_id, inode)


# -- uploads and downloads ----------------------------------------------------------------


def test_files_gzip_streams_and_many_files_sync(envd_sandbox: Sandbox) -> None:
    sb, d = envd_sandbox, tmpdir()
    info = sb.files.write(f"{d}/gz.bin", BIG, gzip=True)
    assert (info.path, info.name, info.type) == (f"{d}/gz.bin", "gz.bin", FileType.FILE)
    assert bytes(sb.files.read(f"{d}/gz.bin", format="bytes", gzip=True)) == BIG
    assert bytes(sb.files.read(f"{d}/gz.bin", format="bytes")) == BIG
    reader = sb.files.read(f"{d}/gz.bin", format="stream")
    assert b"".join(reader) == BIG
    # a streamed (file-like) upload goes octet-stream, here also gzip-compressed
    sb.files.write(f"{d}/streamed.bin", io.BytesIO(BIG), gzip=True)
    assert sb.commands.run(f"wc -c < {d}/streamed.bin").stdout.strip() == str(len(BIG))
    files = [{"path": f"{d}/many/{i:02d}.txt", "data": f"file {i}"} for i in range(40)]
    written = sb.files.write_files(files)
    assert [w.path for w in written] == [f["path"] for f in files]
    written = sb.files.write_files(files[:3], use_octet_stream=True)
    assert len(written) == 3
    assert sb.files.read(f"{d}/many/39.txt") == "file 39"
    assert sorted(e.name for e in sb.files.list(f"{d}/many")) == [f"{i:02d}.txt" for i in range(40)]
    info = sb.files.write("rel-" + d.rsplit("-", 1)[1], "x")  # relative: the user's home
    assert info.path == "/home/user/rel-" + d.rsplit("-", 1)[1]
    sb.files.remove(info.path)
    info = sb.files.write(f"{d}/m.txt", "meta", metadata={"owner": "team"})
    assert info.metadata == {"owner": "team"}
    assert sb.files.get_info(f"{d}/m.txt").metadata == {"owner": "team"}
    with pytest.raises(NotFoundException):
        sb.files.read(f"{d}/missing.txt")


def test_files_gzip_streams_and_many_files_async(envd_sandbox: Sandbox) -> None:
    d = tmpdir()

    async def body(sb: AsyncSandbox) -> None:
        info = await sb.files.write(f"{d}/gz.bin", BIG, gzip=True)
        assert (info.path, info.type) == (f"{d}/gz.bin", FileType.FILE)
        assert bytes(await sb.files.read(f"{d}/gz.bin", format="bytes", gzip=True)) == BIG
        chunks = [c async for c in await sb.files.read(f"{d}/gz.bin", format="stream")]
        assert b"".join(chunks) == BIG

        async def gen() -> Any:
            for i in range(0, len(BIG), 100_000):
                yield BIG[i : i + 100_000]

        await sb.files.write(f"{d}/streamed.bin", gen(), gzip=True)
        assert bytes(await sb.files.read(f"{d}/streamed.bin", format="bytes")) == BIG
        files = [{"path": f"{d}/many/{i:02d}", "data": str(i).encode()} for i in range(30)]
        written = await sb.files.write_files(files)
        assert [w.path for w in written] == [f["path"] for f in files]
        assert await sb.files.read(f"{d}/many/29") == "29"
        info = await sb.files.write(f"{d}/m.txt", "meta", metadata={"k": "v"})
        assert info.metadata == {"k": "v"}
        assert (await sb.files.get_info(f"{d}/m.txt")).metadata == {"k": "v"}
        with pytest.raises(NotFoundException):
            await sb.files.read(f"{d}/missing.txt")

    run_async(envd_sandbox, body)


# -- entries and filesystem calls ---------------------------------------------------------


def _links_script(d: str) -> str:
    return (
        f"mkdir -p {d}/dir && printf hello > {d}/f.txt && chmod 640 {d}/f.txt && "
        f"ln -s f.txt {d}/to-file && ln -s {d}/dir {d}/to-dir && ln -s nowhere {d}/dangling"
    )


def test_entries_and_filesystem_calls_sync(envd_sandbox: Sandbox) -> None:
    sb, d = envd_sandbox, tmpdir()
    sb.commands.run(_links_script(d))
    f = sb.files.get_info(f"{d}/f.txt")
    assert (f.type, f.size, f.mode, f.permissions, f.owner, f.group) == (
        FileType.FILE,
        5,
        0o640,
        "-rw-r-----",
        "user",
        "user",
    )
    assert f.symlink_target is None and f.modified_time.tzinfo is not None
    link = sb.files.get_info(f"{d}/to-file")
    assert (link.type, link.symlink_target, link.mode) == (FileType.FILE, f"{d}/f.txt", 0o640)
    assert link.permissions == "Lrwxrwxrwx"
    assert sb.files.get_info(f"{d}/to-dir").symlink_target == f"{d}/dir"
    dangling = sb.files.get_info(f"{d}/dangling")
    assert (dangling.type, dangling.symlink_target) == (None, f"{d}/dangling")
    # list skips entries whose type is unknown (the dangling link)
    assert sorted(e.name for e in sb.files.list(d)) == ["dir", "f.txt", "to-dir", "to-file"]
    assert [e.path for e in sb.files.list(f"{d}/to-dir")] == []
    assert sb.files.make_dir(f"{d}/new/sub") is True
    assert sb.files.make_dir(f"{d}/new/sub") is False
    moved = sb.files.rename(f"{d}/f.txt", f"{d}/moved/g.txt")
    assert (moved.path, moved.name, moved.type, moved.size) == (
        f"{d}/moved/g.txt",
        "g.txt",
        FileType.FILE,
        5,
    )
    assert sb.files.exists(f"{d}/moved/g.txt") and not sb.files.exists(f"{d}/f.txt")
    with pytest.raises(NotFoundException):
        sb.files.get_info(f"{d}/f.txt")
    with pytest.raises(NotFoundException):
        sb.files.rename(f"{d}/f.txt", f"{d}/x")
    with pytest.raises(InvalidArgumentException):
        sb.files.list(f"{d}/moved/g.txt")
    sb.files.remove(d)
    assert not sb.files.exists(d)
    sb.files.remove(d)  # missing: not an error


def test_entries_and_filesystem_calls_async(envd_sandbox: Sandbox) -> None:
    d = tmpdir()

    async def body(sb: AsyncSandbox) -> None:
        await sb.commands.run(_links_script(d))
        link = await sb.files.get_info(f"{d}/to-file")
        assert (link.type, link.symlink_target, link.size) == (FileType.FILE, f"{d}/f.txt", 5)
        to_dir = await sb.files.get_info(f"{d}/to-dir")
        assert (to_dir.type, to_dir.symlink_target) == (FileType.DIR, f"{d}/dir")
        names = sorted(e.name for e in await sb.files.list(d, depth=2))
        assert names == ["dir", "f.txt", "to-dir", "to-file"]
        assert await sb.files.make_dir(f"{d}/n") is True
        assert await sb.files.make_dir(f"{d}/n") is False
        moved = await sb.files.rename(f"{d}/f.txt", f"{d}/n/f.txt")
        assert moved.path == f"{d}/n/f.txt" and moved.permissions == "-rw-r-----"
        assert await sb.files.exists(f"{d}/n/f.txt")
        await sb.files.remove(d)
        assert not await sb.files.exists(d)
        with pytest.raises(NotFoundException):
            await sb.files.list(d)

    run_async(envd_sandbox, body)


def test_symlink_entries_carry_the_target_type(envd_sandbox: Sandbox) -> None:
    """envd 0.6.13's EntryInfo of a link (shared filesystem.GetEntryInfo): the final target's
    type and mode, ``symlinkTarget`` fully resolved, no ``is_symlink``; a dangling link or a
    loop has no type and itself as target. The SDK's ``test_file_symlink`` shape: FILE."""
    sb, d = envd_sandbox, tmpdir()
    sb.commands.run(
        _links_script(d) + f" && ln -s to-file {d}/chain && ln -s to-dir {d}/dir-chain"
        f" && ln -s loop {d}/loop"
    )
    for name, kind, target in (
        ("to-file", FileType.FILE, "f.txt"),
        ("chain", FileType.FILE, "f.txt"),
        ("to-dir", FileType.DIR, "dir"),
        ("dir-chain", FileType.DIR, "dir"),
        ("dangling", None, "dangling"),
        ("loop", None, "loop"),
    ):
        info = sb.files.get_info(f"{d}/{name}")
        assert (info.type, info.symlink_target, info.name) == (kind, f"{d}/{target}", name)
        assert info.permissions == "Lrwxrwxrwx", name
    assert sb.files.get_info(f"{d}/chain").mode == 0o640
    assert sb.files.get_info(f"{d}/dangling").mode == 0
    listed = {e.name: (e.type, e.symlink_target) for e in sb.files.list(d)}
    assert listed == {  # the typeless links are skipped by the SDK
        "dir": (FileType.DIR, None),
        "f.txt": (FileType.FILE, None),
        "to-file": (FileType.FILE, f"{d}/f.txt"),
        "chain": (FileType.FILE, f"{d}/f.txt"),
        "to-dir": (FileType.DIR, f"{d}/dir"),
        "dir-chain": (FileType.DIR, f"{d}/dir"),
    }
    sb.files.remove(d)


# -- watch_dir -------------------------------------------------------------------------------


def _names(events: List[FilesystemEvent]) -> List[Any]:
    return [(e.name, e.type) for e in events]


def test_watch_dir_sync(emulator: Emulator, envd_sandbox: Sandbox) -> None:
    sb, d = envd_sandbox, tmpdir()
    sb.files.make_dir(d)
    handle = sb.files.watch_dir(d, recursive=True, include_entry=True)
    got: List[FilesystemEvent] = []

    def seen(*want: Any) -> bool:
        got.extend(handle.get_new_events())
        return all(w in _names(got) for w in want)

    try:
        sb.files.write(f"{d}/a.txt", "1")
        sb.commands.run(f"chmod 600 {d}/a.txt")
        sb.files.rename(f"{d}/a.txt", f"{d}/c.txt")
        want = [
            ("a.txt", FilesystemEventType.CREATE),
            ("a.txt", FilesystemEventType.WRITE),
            ("a.txt", FilesystemEventType.CHMOD),
            ("a.txt", FilesystemEventType.RENAME),
            ("c.txt", FilesystemEventType.CREATE),
        ]
        wait_until(lambda: seen(*want), 15, "watch events")
        create = next(e for e in got if e.name == "a.txt")
        assert create.entry is not None and create.entry.path == f"{d}/a.txt"
        # a new directory is watched once its creation is reported
        sb.files.make_dir(f"{d}/sub")
        wait_until(lambda: seen(("sub", FilesystemEventType.CREATE)), 15, "the new directory")
        sb.files.write(f"{d}/sub/b", "2")
        sb.files.remove(f"{d}/sub/b")
        want = [
            ("sub/b", FilesystemEventType.CREATE),
            ("sub/b", FilesystemEventType.WRITE),
            ("sub/b", FilesystemEventType.REMOVE),
        ]
        wait_until(lambda: seen(*want), 15, "events in the new directory")
        assert all(e.entry is None for e in got if e.type == FilesystemEventType.REMOVE)
        assert watched(emulator, sb, f"{d}/sub") == 1
    finally:
        handle.stop()
    assert watched(emulator, sb, d) == 0 and watched(emulator, sb, f"{d}/sub") == 0
    with pytest.raises(SandboxException):
        handle.get_new_events()
    with pytest.raises(NotFoundException):
        sb.files.watch_dir(f"{d}/missing")
    with pytest.raises(InvalidArgumentException):
        sb.files.watch_dir(f"{d}/c.txt")


def test_watch_dir_async(emulator: Emulator, envd_sandbox: Sandbox) -> None:
    d = tmpdir()

    async def body(sb: AsyncSandbox) -> None:
        await sb.files.make_dir(d)
        got: List[FilesystemEvent] = []
        exits: List[Any] = []
        handle = await sb.files.watch_dir(
            d, got.append, on_exit=exits.append, recursive=True, timeout=0
        )

        def seen(*want: Any) -> Callable[[], bool]:
            return lambda: all(w in _names(got) for w in want)

        try:
            # parents created by the write are watched; the file is reported either way
            await sb.files.write(f"{d}/x/y/z.txt", "deep")
            created = ("x", FilesystemEventType.CREATE), ("x/y/z.txt", FilesystemEventType.CREATE)
            await await_for(seen(*created), "streamed events")
            await sb.files.remove(f"{d}/x/y/z.txt")
            await await_for(seen(("x/y/z.txt", FilesystemEventType.REMOVE)), "the removal")
            assert all(e.entry is None for e in got)
            assert await awatched(emulator, sb, d) == 1
        finally:
            await handle.stop()
        assert exits == [None]
        # the stream's end removes the watch inside the sandbox
        deadline = time.monotonic() + 10
        while await awatched(emulator, sb, d):
            assert time.monotonic() < deadline, "the watch outlived its stream"
            await asyncio.sleep(0.05)
        with pytest.raises(NotFoundException):
            await sb.files.watch_dir(f"{d}/missing", got.append)

    run_async(envd_sandbox, body)


#: ``BURST N`` writes N times, alternating two files (the kernel merges an event only into
#: an identical one queued just before it).
BURST = (
    "python3 -c 'import os,sys\n"
    "fds = [os.open(n, os.O_CREAT | os.O_WRONLY) for n in (\"a\", \"b\")]\n"
    "for i in range(int(sys.argv[1])): os.write(fds[i % 2], b\"x\")' "
)


def test_watch_dir_sync_keeps_more_than_the_kernel_queue_until_polled(
    envd_sandbox: Sandbox,
) -> None:
    # envd reads the kernel's queue as it fills and keeps the events until asked: a poll
    # after more events than the kernel's queue holds (16,384) still returns every one.
    # They come as 20 commands of 1,000 writes, one after the other: envd learns that a
    # command ended in a turn of its loop that also reads the watcher's queue (readable
    # while it holds events), so however slowly envd is scheduled, the kernel's queue never
    # holds more than one command's events (20,000 at once could overflow it).
    sb, d = envd_sandbox, tmpdir()
    sb.files.make_dir(d)
    handle = sb.files.watch_dir(d)
    made = 20_000
    try:
        for _ in range(made // 1000):
            sb.commands.run(f"cd {d} && {BURST} 1000")
        got: List[FilesystemEvent] = []

        def all_in() -> bool:
            got.extend(handle.get_new_events())
            return len(got) >= made + 2

        wait_until(all_in, 30, "every event of the burst")
        assert len(got) == made + 2  # two creates, then every write
        assert _names(got)[:2] == [("a", FilesystemEventType.CREATE),
                                   ("b", FilesystemEventType.CREATE)]
    finally:
        handle.stop()
    sb.files.remove(d)


def sees(handle: Any, want: Any) -> None:
    """Poll ``handle`` until one of its events is ``want`` (name, type)."""
    got: List[FilesystemEvent] = []

    def seen() -> bool:
        got.extend(handle.get_new_events())
        return want in _names(got)

    wait_until(seen, 15, f"{want}")


def test_two_watches_of_one_directory_are_independent(
    emulator: Emulator, envd_sandbox: Sandbox
) -> None:
    # each watcher has its own inotify instance (as envd's): both see every event, and
    # stopping one leaves the other watching
    sb, d = envd_sandbox, tmpdir()
    sb.files.make_dir(d)
    one, two = sb.files.watch_dir(d), sb.files.watch_dir(d)
    try:
        assert watched(emulator, sb, d) == 2
        sb.files.write(f"{d}/x", "1")
        sees(one, ("x", FilesystemEventType.CREATE))
        sees(two, ("x", FilesystemEventType.CREATE))
        one.stop()
        assert watched(emulator, sb, d) == 1
        sb.files.write(f"{d}/y", "2")
        sees(two, ("y", FilesystemEventType.CREATE))
    finally:
        two.stop()
    sb.files.remove(d)


def test_watch_dir_async_timeout_ends_the_watch(
    emulator: Emulator, envd_sandbox: Sandbox
) -> None:
    d = tmpdir()

    async def body(sb: AsyncSandbox) -> None:
        await sb.files.make_dir(d)
        exits: List[Any] = []
        t0 = time.monotonic()
        handle = await sb.files.watch_dir(d, lambda e: None, on_exit=exits.append, timeout=1)
        try:
            await await_for(lambda: bool(exits), "the end of the watch", 20)
        finally:
            await handle.stop()
        assert time.monotonic() - t0 < 10
        assert len(exits) == 1 and isinstance(exits[0], TimeoutException), exits
        deadline = time.monotonic() + 10
        while await awatched(emulator, sb, d):
            assert time.monotonic() < deadline, "the watch outlived its timeout"
            await asyncio.sleep(0.05)

    run_async(envd_sandbox, body)


async def awatched(emulator: Emulator, sb: AsyncSandbox, path: str) -> int:
    inode = int((await sb.commands.run(f"stat -c %i {path}")).stdout)
    return inotify_watches_on(emulator, sb.sandbox_id, inode)


# -- signed URLs -----------------------------------------------------------------------------


def _fetch(emulator: Emulator, sid: str, url: str, method: str = "GET", **kw: Any) -> Any:
    """Send a signed file URL the way a browser would reach E2B: routed by its Host."""
    query = url.split("?", 1)[1]
    host = f"49983-{sid}.{emulator.domain}"
    return requests.request(
        method, f"{emulator.sandbox_url}/files?{query}", headers={"Host": host}, timeout=30, **kw
    )


def test_signed_file_urls_sync(emulator: Emulator, envd_sandbox: Sandbox) -> None:
    sb, d, sid = envd_sandbox, tmpdir(), envd_sandbox.sandbox_id
    up = _fetch(emulator, sid, sb.upload_url(f"{d}/up.txt"), "POST", files={"file": ("x", b"hi")})
    assert up.status_code == 200 and up.json()[0]["path"] == f"{d}/up.txt"
    r = _fetch(emulator, sid, sb.download_url(f"{d}/up.txt", use_signature_expiration=60))
    assert (r.status_code, r.content) == (200, b"hi")
    r = _fetch(emulator, sid, sb.download_url(f"{d}/up.txt", user="root"))
    assert r.status_code == 200
    # a signature is bound to its path, user and operation, and expires
    other = sb.download_url(f"{d}/up.txt").replace("up.txt", "other.txt")
    r = _fetch(emulator, sid, other)
    assert (r.status_code, r.json()["message"]) == (401, "invalid signature")
    r = _fetch(emulator, sid, sb.download_url(f"{d}/up.txt", use_signature_expiration=-5))
    assert (r.status_code, r.json()["message"]) == (401, "signature is already expired")
    r = _fetch(emulator, sid, sb.download_url(f"{d}/up.txt"), "POST", data=b"x")
    assert r.status_code == 401
    r = _fetch(emulator, sid, f"x?path={d}/up.txt")
    assert (r.status_code, r.json()["message"]) == (401, "missing signature query parameter")


def test_signed_file_urls_async(emulator: Emulator, envd_sandbox: Sandbox) -> None:
    d, sid = tmpdir(), envd_sandbox.sandbox_id

    async def body(sb: AsyncSandbox) -> List[str]:
        await sb.files.write(f"{d}/a.txt", "async")
        return [sb.download_url(f"{d}/a.txt"), sb.upload_url(f"{d}/b.txt", user="root")]

    down, up = run_async(envd_sandbox, body)
    assert _fetch(emulator, sid, down).content == b"async"
    r = _fetch(emulator, sid, up, "POST", files={"file": ("b", b"B")})
    assert r.status_code == 200
    assert envd_sandbox.commands.run(f"stat -c %U {d}/b.txt").stdout == "root\n"


# -- commands and PTY ------------------------------------------------------------------------


def test_commands_input_list_connect_kill_sync(envd_sandbox: Sandbox) -> None:
    sb = envd_sandbox
    handle = sb.commands.run("cat", background=True, stdin=True)
    assert handle.pid in [p.pid for p in sb.commands.list()]
    sb.commands.send_stdin(handle.pid, "one\n")
    sb.commands.stream_input(handle.pid, ["two ", b"three\n"])
    sb.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "one\ntwo three\n"
    with pytest.raises(NotFoundException):
        sb.commands.send_stdin(handle.pid, "late")
    sleeper = sb.commands.run("echo up; sleep 300", background=True)
    sleeper.disconnect()
    again = sb.commands.connect(sleeper.pid)
    assert sb.commands.kill(sleeper.pid) is True
    with pytest.raises(CommandExitException) as info:
        again.wait()
    assert info.value.exit_code == -1
    assert sb.commands.kill(sleeper.pid) is False


def test_cwd_rights_and_the_template_workdir(envd_sandbox: Sandbox) -> None:
    """The base template's ``/init`` ``defaultWorkdir`` (/home/user) is the cwd of a command
    without one and the directory of an empty path, whoever runs it; relative paths are
    under the user's home (permissions.ExpandAndResolve); a cwd is entered with the
    command's user's rights (handler.go Credential + Dir: Go switches ids before chdir)."""
    sb = envd_sandbox
    assert sb.commands.run("pwd").stdout == "/home/user\n"
    assert sb.commands.run("pwd", user="root").stdout == "/home/user\n"
    assert sb.commands.run("pwd", user="root", cwd="/root").stdout == "/root\n"
    with pytest.raises(InvalidArgumentException) as denied:
        sb.commands.run("pwd", cwd="/root")
    assert (
        "error starting process '/bin/bash -l -c pwd': fork/exec /bin/sh: permission denied"
        in str(denied.value)
    )
    name = f"rel-{uuid.uuid4().hex[:8]}.txt"
    sb.files.write(name, "as root", user="root")
    sb.files.write(name, "as user")
    assert sb.files.read(f"/root/{name}", user="root") == "as root"
    assert sb.files.read(f"/home/user/{name}") == "as user"
    listed = [e.path for e in sb.files.list("", user="root")]
    assert f"/home/user/{name}" in listed and all(p.startswith("/home/user/") for p in listed)
    sb.files.remove(f"/root/{name}", user="root")
    sb.files.remove(f"/home/user/{name}")


def test_commands_input_list_connect_kill_async(envd_sandbox: Sandbox) -> None:
    async def body(sb: AsyncSandbox) -> None:
        handle = await sb.commands.run("cat", background=True, stdin=True)
        assert handle.pid in [p.pid for p in await sb.commands.list()]
        await sb.commands.send_stdin(handle.pid, "one\n")
        async with sb.commands.stream_input(handle.pid) as feed:
            await feed.send("two ")
            await feed.send(b"three\n")
        await sb.commands.close_stdin(handle.pid)
        assert (await handle.wait()).stdout == "one\ntwo three\n"
        sleeper = await sb.commands.run("sleep 300", background=True)
        await sleeper.disconnect()
        again = await sb.commands.connect(sleeper.pid)
        assert await sb.commands.kill(sleeper.pid) is True
        with pytest.raises(CommandExitException):
            await again.wait()
        with pytest.raises(NotFoundException):
            async with sb.commands.stream_input(sleeper.pid) as feed:
                await feed.send("nobody is listening")

    run_async(envd_sandbox, body)


def test_pty_sync(envd_sandbox: Sandbox) -> None:
    sb = envd_sandbox
    handle = sb.pty.create(PtySize(rows=24, cols=80))
    sb.pty.resize(handle.pid, PtySize(rows=30, cols=100))
    sb.pty.send_stdin(handle.pid, b"echo $((6*7)); stty size; exit\n")
    out: List[bytes] = []
    handle.wait(on_pty=out.append)
    text = b"".join(out).decode()
    assert "42" in text and "30 100" in text


def test_pty_async(envd_sandbox: Sandbox) -> None:
    async def body(sb: AsyncSandbox) -> None:
        out: List[bytes] = []
        handle = await sb.pty.create(PtySize(rows=24, cols=80), on_data=out.append)
        await sb.pty.resize(handle.pid, PtySize(rows=40, cols=90))
        await sb.pty.send_stdin(handle.pid, b"stty size; sleep 300\n")
        await await_for(lambda: b"40 90" in b"".join(out), "the resized PTY")
        assert await sb.pty.kill(handle.pid) is True
        with pytest.raises(CommandExitException):
            await handle.wait()

    run_async(envd_sandbox, body)
