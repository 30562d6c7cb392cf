"""Many files at once against the emulator: ``write_files``, ``read_files``, ``list_dir``.

Batches travel in few requests (counted at the transport), each file is written whole, and
every failure is named; listings show what the ``sandbox`` user sees.
"""

from __future__ import annotations

import datetime
import os
from typing import Iterator, List

import pytest

from e2b_provider import (
    CommandFailed,
    DirEntry,
    E2BSandboxProvider,
    FileContent,
    FilesFailed,
    InvalidArgument,
    SandboxHandle,
)

from .conftest import count_requests, root, warm_file_agent


@pytest.fixture(scope="module")
def box(shared_provider: E2BSandboxProvider, sandbox: SandboxHandle) -> Iterator[SandboxHandle]:
    p = shared_provider
    warm_file_agent(p, sandbox)  # the first call starts the file agent in the background
    yield sandbox


@pytest.fixture
def requests_sent(
    shared_provider: E2BSandboxProvider, monkeypatch: pytest.MonkeyPatch
) -> List[str]:
    return count_requests(shared_provider, monkeypatch)


def test_200_small_files_go_up_and_down_in_one_request_each(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, requests_sent: List[str]
) -> None:
    p = shared_provider
    files = {f"/workspace/b200/d{i % 7}/f{i}.txt": os.urandom(1024) for i in range(200)}
    p.write_files(box, files)
    assert requests_sent == ["POST SendInput"]
    del requests_sent[:]
    got = p.read_files(box, list(files))
    assert requests_sent == ["POST SendInput"]
    assert got == {path: FileContent(data) for path, data in files.items()}
    owners = root(p, box, "stat -c '%U %a' /workspace/b200/d3/f3.txt /workspace/b200/d3")
    assert owners.split("\n")[:2] == ["sandbox 644", "sandbox 755"]


def test_str_contents_are_utf8_and_a_larger_batch_is_split(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, requests_sent: List[str]
) -> None:
    p = shared_provider
    big = {f"/workspace/split/{i}": os.urandom(200 << 10) for i in range(12)}  # 2.4 MiB
    files: dict = {"/workspace/split/text": "héllo ✓", **big}
    p.write_files(box, files)
    assert 3 <= requests_sent.count("POST SendInput") <= 4
    assert p.read_file(box, "/workspace/split/text") == FileContent("héllo ✓".encode())
    got = p.read_files(box, list(big), max_bytes=300 << 10)
    assert got == {k: FileContent(v) for k, v in big.items()}


def test_every_failed_path_is_named_and_the_others_are_written(
    shared_provider: E2BSandboxProvider, box: SandboxHandle
) -> None:
    p = shared_provider
    root(p, box, "mkdir -p /workspace/ro && chmod 0555 /workspace/ro")
    files = {
        "/workspace/ok-1": b"1",
        "/etc/passwd": b"x",
        "/workspace/ro/f": b"y",
        "/workspace/ok-2": b"2",
        "/workspace": b"a directory",
    }
    with pytest.raises(FilesFailed) as info:
        p.write_files(box, files)
    assert set(info.value.failed) == {"/etc/passwd", "/workspace/ro/f", "/workspace"}
    for path in info.value.failed:
        assert path in str(info.value)
    assert "permission denied" in str(info.value.failed["/etc/passwd"])
    assert p.read_file(box, "/workspace/ok-1") == FileContent(b"1")
    assert p.read_file(box, "/workspace/ok-2") == FileContent(b"2")
    assert "root:" in root(p, box, "head -c 5 /etc/passwd")


def test_read_files_as_read_file_would(
    shared_provider: E2BSandboxProvider, box: SandboxHandle
) -> None:
    p = shared_provider
    root(p, box, "printf 0123456789 > /workspace/ten && mkdir -p /workspace/adir && "
                 "rm -f /workspace/fifo && mkfifo -m 0666 /workspace/fifo && "
                 "chown sandbox /workspace/ten")
    got = p.read_files(box, ["/workspace/ten", "/workspace/none", "/workspace/adir"],
                       max_bytes=4)
    assert got == {
        "/workspace/ten": FileContent(b"0123", True),
        "/workspace/none": None,
        "/workspace/adir": None,
    }
    with pytest.raises(FilesFailed) as info:
        p.read_files(box, ["/workspace/ten", "/etc/shadow", "/root/x", "/workspace/fifo"])
    assert set(info.value.failed) == {"/etc/shadow", "/root/x", "/workspace/fifo"}
    assert "may not enter /root" in str(info.value.failed["/root/x"])
    assert "FIFO" in str(info.value.failed["/workspace/fifo"])
    assert info.value.results == {"/workspace/ten": FileContent(b"0123456789")}


def test_a_large_file_among_reads_takes_the_fast_path(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, requests_sent: List[str]
) -> None:
    p = shared_provider
    data = os.urandom(3 << 20)
    p.write_file(box, "/workspace/large-among", data)
    del requests_sent[:]
    got = p.read_files(box, ["/workspace/large-among", "/workspace/ten"], max_bytes=4 << 20)
    assert got["/workspace/large-among"] == FileContent(data)
    assert "GET files" in requests_sent


def test_bad_input_is_refused_before_anything_is_written(
    shared_provider: E2BSandboxProvider, box: SandboxHandle
) -> None:
    p = shared_provider
    for files in (
        {"/workspace/bad-1": b"x", "relative": b"y"},
        {"/workspace/bad-1": b"x", "/workspace/../etc": b"y"},
        {"/workspace/bad-1": 42},
        {"/workspace/bad-1": "\udcff"},
    ):
        with pytest.raises(InvalidArgument):
            p.write_files(box, files)  # type: ignore[arg-type]
    assert p.stat(box, "/workspace/bad-1") is None
    with pytest.raises(InvalidArgument):
        p.read_files(box, "/workspace/ten")  # one string, not a list
    with pytest.raises(InvalidArgument):
        p.list_dir(box, "/workspace", depth=0)


def test_list_dir_shows_what_the_user_sees(
    shared_provider: E2BSandboxProvider, box: SandboxHandle
) -> None:
    p = shared_provider
    root(p, box, "rm -rf /workspace/ls && mkdir -p /workspace/ls/sub/deeper /workspace/ls/closed"
                 " && printf abc > /workspace/ls/f && chmod 0640 /workspace/ls/f"
                 " && ln -s /etc/shadow /workspace/ls/link && mkfifo /workspace/ls/pipe"
                 " && touch /workspace/ls/sub/deeper/x && chmod 0700 /workspace/ls/closed"
                 " && chown -R sandbox /workspace/ls && chown root /workspace/ls/closed")
    one = p.list_dir(box, "/workspace/ls")
    assert one is not None
    by_name = {e.name: e for e in one}
    assert [e.name for e in one] == sorted(by_name)
    assert set(by_name) == {"closed", "f", "link", "pipe", "sub"}
    f = by_name["f"]
    assert (f.type, f.size, f.mode, f.path) == ("file", 3, 0o640, "/workspace/ls/f")
    assert isinstance(f.mtime, datetime.datetime) and f.mtime.tzinfo is not None
    link = by_name["link"]
    assert (link.type, link.symlink_target) == ("symlink", "/etc/shadow")
    assert by_name["pipe"].type == "other"
    assert by_name["sub"].type == "dir" and by_name["sub"].symlink_target is None
    deep = p.list_dir(box, "/workspace/ls", depth=3)
    assert deep is not None
    paths = {e.path for e in deep}
    assert "/workspace/ls/sub/deeper/x" in paths
    assert not any(x.startswith("/workspace/ls/closed/") for x in paths)
    assert all(isinstance(e, DirEntry) for e in deep)
    assert p.list_dir(box, "/workspace/none") is None
    with pytest.raises(CommandFailed, match="not a directory"):
        p.list_dir(box, "/workspace/ls/f")
    with pytest.raises(CommandFailed, match="may not enter /root"):
        p.list_dir(box, "/root/x")
    with pytest.raises(CommandFailed, match="permission denied"):
        p.list_dir(box, "/workspace/ls/closed")
