"""Whole trees against the emulator: ``upload`` and ``download`` (and single files).

Round trips keep content, modes, links and the ``sandbox`` owner; a cancelled or cut upload
leaves every file whole (old or new); a hostile sandbox cannot make a download write
outside its target; nothing is left behind in the sandbox.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from waiting import wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    CommandFailed,
    E2BSandboxProvider,
    FileContent,
    FilesFailed,
    InvalidArgument,
    SandboxHandle,
    TransferSummary,
    UnsafePath,
)

from .conftest import count_requests, root
from .test_file_paths import LEFTOVERS


def make_tree(top: Path) -> Dict[str, bytes]:
    """A small tree with nested directories, empty and executable files and a link."""
    files = {
        "a/one.txt": b"one\n",
        "a/b/two.bin": os.urandom(70000),
        "a/b/c/empty": b"",
        "run.sh": b"#!/bin/sh\necho hi\n",
        "big.bin": os.urandom(3 << 20),
        "skip.pyc": b"compiled",
        "cache/x": b"cached",
    }
    for rel, data in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_bytes(data)
    (top / "run.sh").chmod(0o755)
    (top / "a" / "one.txt").chmod(0o600)
    (top / "a" / "link").symlink_to("b/two.bin")
    return files


def digest(p: E2BSandboxProvider, h: SandboxHandle, path: str) -> Dict[str, str]:
    out = root(p, h, f"cd {path} && find . -type f -exec sha256sum {{}} + | sort")
    return {line.split()[1][2:]: line.split()[0] for line in out.splitlines()}


def test_upload_then_download_round_trip(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    p = shared_provider
    src = tmp_path / "src"
    files = make_tree(src)
    seen: List[Tuple[int, Optional[int]]] = []
    summary = p.upload(sandbox, src, "/workspace/tree", exclude=["*.pyc", "cache"],
                       progress=lambda done, total: seen.append((done, total)))
    kept = {k: v for k, v in files.items() if not k.endswith(".pyc") and not k.startswith("cache")}
    assert summary == TransferSummary(files=len(kept), dirs=3, symlinks=1,
                                      bytes=sum(map(len, kept.values())))
    assert seen[-1] == (summary.bytes, summary.bytes)
    assert digest(p, sandbox, "/workspace/tree") == {
        k: hashlib.sha256(v).hexdigest() for k, v in kept.items()
    }
    modes = root(p, sandbox, "cd /workspace/tree && stat -c '%n %U %a' run.sh a/one.txt a/b")
    assert modes.split("\n")[:3] == ["run.sh sandbox 755", "a/one.txt sandbox 600",
                                     "a/b sandbox 755"]
    assert root(p, sandbox, "readlink /workspace/tree/a/link").strip() == "b/two.bin"
    assert root(p, sandbox, LEFTOVERS) == ""

    dst = tmp_path / "dst"
    down = p.download(sandbox, "/workspace/tree", dst)
    assert down == summary
    for rel, data in kept.items():
        assert (dst / rel).read_bytes() == data
    assert stat.S_IMODE((dst / "run.sh").stat().st_mode) == 0o755
    assert os.readlink(dst / "a" / "link") == "b/two.bin"
    # one file, either way
    one = tmp_path / "one.bin"
    assert p.download(sandbox, "/workspace/tree/big.bin", one).files == 1
    assert one.read_bytes() == files["big.bin"]
    assert p.upload(sandbox, one, "/workspace/copy.bin").bytes == len(files["big.bin"])
    assert p.read_file(sandbox, "/workspace/copy.bin", max_bytes=4 << 20) == FileContent(
        files["big.bin"]
    )


def test_upload_requests_do_not_grow_with_the_file_count(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = shared_provider
    src = tmp_path / "many"
    for i in range(500):
        (src / f"d{i % 10}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 10}" / f"f{i}").write_bytes(b"%d" % i)
    sent = count_requests(p, monkeypatch)
    assert p.upload(sandbox, src, "/workspace/many").files == 500
    assert sent == ["POST Start", "POST files"]
    del sent[:]
    assert p.download(sandbox, "/workspace/many", tmp_path / "back").files == 500
    assert sent == ["POST Start"]


def test_a_cancelled_upload_leaves_every_file_whole(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    p = shared_provider
    old = {f"f{i}": os.urandom(1 << 20) for i in range(8)}
    src = tmp_path / "old"
    for name, data in old.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    p.upload(sandbox, src, "/workspace/cancel")
    new = tmp_path / "new"
    for name in old:
        (new / name).parent.mkdir(parents=True, exist_ok=True)
        (new / name).write_bytes(os.urandom(1 << 20))
    token = CancelToken()

    def stop(done: int, total: Optional[int]) -> None:
        if done >= 3 << 20:
            token.cancel("test")

    with pytest.raises(Cancelled):
        p.upload(sandbox, new, "/workspace/cancel", cancel=token, progress=stop)
    after = digest(p, sandbox, "/workspace/cancel")
    for name in old:
        assert after[name] in (hashlib.sha256(old[name]).hexdigest(),
                               hashlib.sha256((new / name).read_bytes()).hexdigest())
    assert root(p, sandbox, LEFTOVERS) == ""
    assert root(p, sandbox, "find /workspace/cancel -name '.capybara-part-*'") == ""


def test_a_hostile_tree_cannot_make_a_download_write_outside(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    p = shared_provider
    root(p, sandbox, "rm -rf /workspace/hostile && mkdir -p /workspace/hostile/d && "
                     "ln -s /etc/passwd /workspace/hostile/abs && "
                     "ln -s ../../../../outside /workspace/hostile/d/up && "
                     "echo fine > /workspace/hostile/d/ok && "
                     "chown -R sandbox /workspace/hostile")
    (tmp_path / "in").mkdir()
    dst = tmp_path / "in" / "dst"
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(FilesFailed) as info:
        p.download(sandbox, "/workspace/hostile", dst)
    assert set(info.value.failed) == {"abs", "d/up"}
    assert (dst / "d" / "ok").read_bytes() == b"fine\n"
    assert not (dst / "abs").exists() and not os.path.lexists(dst / "d" / "up")
    assert sorted(os.listdir(tmp_path)) == before
    assert os.listdir(tmp_path / "in") == ["dst"]
    assert info.value.summary is not None and info.value.summary.files == 1


def test_a_planted_link_in_the_sandbox_is_replaced_not_followed(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    p = shared_provider
    root(p, sandbox, "rm -rf /workspace/plant && mkdir -p /workspace/plant /workspace/target && "
                     "ln -s /workspace/target /workspace/plant/d && "
                     "ln -s /workspace/target/victim /workspace/plant/f && "
                     "echo precious > /workspace/target/victim && "
                     "chown -R sandbox /workspace/plant /workspace/target")
    src = tmp_path / "plant"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x").write_bytes(b"x")
    (src / "f").write_bytes(b"new")
    with pytest.raises(FilesFailed) as info:
        p.upload(sandbox, src, "/workspace/plant")
    assert "d/x" in str(info.value)  # "d" is a link in the sandbox: not gone through
    assert root(p, sandbox, "cat /workspace/target/victim").strip() == "precious"
    assert root(p, sandbox, "ls -A /workspace/target") == "victim\n"
    # the link named f was replaced by the file itself
    assert root(p, sandbox, "[ -L /workspace/plant/f ] || cat /workspace/plant/f") == "new"


def test_skills_trees_are_root_owned_and_refused_when_others_may_write(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    p = shared_provider
    src = tmp_path / "skill"
    (src / "x").mkdir(parents=True)
    (src / "x" / "SKILL.md").write_bytes(b"# s\n")
    p.upload(sandbox, src, "/skills/tree")
    out = root(p, sandbox, "stat -c '%U %a' /skills/tree/x/SKILL.md /skills/tree/x")
    assert out.split("\n")[:2] == ["root 644", "root 755"]
    root(p, sandbox, "mkdir -p /skills/open && chmod 0777 /skills/open")
    with pytest.raises(UnsafePath, match="not root's alone"):
        p.upload(sandbox, src, "/skills/open/t")
    assert root(p, sandbox, "ls -A /skills/open") == ""


def test_missing_bad_and_too_large(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    p = shared_provider
    with pytest.raises(InvalidArgument):
        p.upload(sandbox, tmp_path / "none", "/workspace/x")
    with pytest.raises(InvalidArgument):
        p.upload(sandbox, tmp_path, "relative")
    with pytest.raises(InvalidArgument):
        p.upload(sandbox, tmp_path, "/workspace/x", exclude="*.pyc")
    with pytest.raises(CommandFailed, match="does not exist"):
        p.download(sandbox, "/workspace/none", tmp_path / "n")
    with pytest.raises(CommandFailed, match="may not enter /root"):
        p.download(sandbox, "/root/x", tmp_path / "n")
    p.write_file(sandbox, "/workspace/sized/a", os.urandom(10000))
    with pytest.raises(CommandFailed, match="max_bytes"):
        p.download(sandbox, "/workspace/sized", tmp_path / "s", max_bytes=5000)
    wait_until(lambda: root(p, sandbox, LEFTOVERS) == "", 30, "nothing left running")


def test_a_new_destination_appears_whole_or_not_at_all(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    p = shared_provider
    src = tmp_path / "whole"
    for i in range(6):
        (src / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 2}" / f"f{i}").write_bytes(os.urandom(1 << 20))
    root(p, sandbox, "rm -rf /workspace/new-a /workspace/new-b /workspace/new-c")
    # cancelled half-way: no destination at all, and nothing beside it
    token = CancelToken()

    def stop(done: int, total: Optional[int]) -> None:
        if done >= 2 << 20:
            token.cancel("test")

    with pytest.raises(Cancelled):
        p.upload(sandbox, src, "/workspace/new-a", cancel=token, progress=stop)
    wait_until(lambda: root(p, sandbox, LEFTOVERS) == "", 30, "nothing left running")
    assert root(p, sandbox, "ls -A /workspace | grep -c -e '^new-a$' -e '^.capybara-part-' "
                            "|| true").strip() == "0"
    # complete: all of it, at once, with the counts of what was sent
    summary = p.upload(sandbox, src, "/workspace/new-b")
    assert summary == TransferSummary(files=6, dirs=2, symlinks=0, bytes=6 << 20)
    assert digest(p, sandbox, "/workspace/new-b") == {
        f"d{i % 2}/f{i}": hashlib.sha256((src / f"d{i % 2}" / f"f{i}").read_bytes()).hexdigest()
        for i in range(6)
    }
    # someone else makes the destination meanwhile: theirs stays, ours is dropped whole
    made = threading.Event()

    def race(done: int, total: Optional[int]) -> None:
        if done >= 1 << 20 and not made.is_set():
            # only once the sandbox side chose "new destination" (its part directory exists):
            # made earlier, the destination is one that exists and is written into instead
            wait_until(lambda: root(p, sandbox, "find /workspace -maxdepth 1 "
                                                "-name '.capybara-part-*' -type d") != "",
                       30, "the upload's part directory")
            root(p, sandbox, "mkdir -p /workspace/new-c && echo theirs > /workspace/new-c/x "
                             "&& chown -R sandbox /workspace/new-c")
            made.set()

    with pytest.raises(CommandFailed):
        p.upload(sandbox, src, "/workspace/new-c", progress=race)
    assert root(p, sandbox, "ls -A /workspace/new-c; cat /workspace/new-c/x") == "x\ntheirs\n"
    assert root(p, sandbox, "find /workspace -maxdepth 1 -name '.capybara-part-*'") == ""
