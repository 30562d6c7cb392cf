"""A template without ``python3``: every call still works, through per-operation scripts.

The sandbox is made without ``python3`` by removing it as root (what a template lacking it
looks like to the library: ``python3`` is not found; the emulator's own envd runs from an
interpreter bound elsewhere). Where the library's faster paths exist in the same sandbox
(before the removal), their answers are compared with the scripts' answers.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from waiting import wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    CommandFailed,
    E2BSandboxProvider,
    FileContent,
    FilesFailed,
    SandboxHandle,
)

from .conftest import NO_PYTHON, own_sandbox, root, unique_name
from .test_leftovers import agents, processes, staged

pytestmark = pytest.mark.integration

def tree_of(top: Path) -> Dict[str, Tuple[str, Any, int]]:
    """Each entry below ``top``: its kind, content (or link target) and mode bits."""
    out: Dict[str, Tuple[str, Any, int]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(top))
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path), 0)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", None, stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", path.read_bytes(), stat.S_IMODE(st.st_mode))
    return out


def make_tree(top: Path) -> None:
    (top / "src" / "pkg").mkdir(parents=True)
    (top / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    (top / "src" / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(top / "src" / "run.sh", 0o755)
    (top / "data.bin").write_bytes(os.urandom(3 << 20))
    (top / "empty").mkdir()
    (top / "skip.pyc").write_bytes(b"compiled")
    (top / "spaced name é").write_text("unicode\n")
    os.symlink("src/run.sh", top / "link")


@pytest.fixture
def box(provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    with own_sandbox(provider, "nopy") as h:
        yield h


@pytest.fixture
def nopy(emu) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    """A provider whose sandboxes are made from the emulator's template without python3."""
    with E2BSandboxProvider(emu.config(template=NO_PYTHON)) as p:
        yield p


def _no_python_box(q: E2BSandboxProvider) -> SandboxHandle:
    h = q.create(unique_name("nopy"))
    for user in ("sandbox", "root"):
        r = root(q, h, "command -v python3 python || echo none") if user == "root" else (
            q.exec(h, "command -v python3 python || echo none", timeout=30.0).stdout)
        assert r.strip() == "none", (user, r)
    return h


def _fields(entries: Any) -> Any:
    """Listing entries without their mtime (which differs from sandbox to sandbox)."""
    if entries is None:
        return None
    return [(e.name, e.path, e.type, e.size, e.mode, e.symlink_target) for e in entries]


def test_an_agents_day_without_python3(
    provider: E2BSandboxProvider, box: SandboxHandle, nopy: E2BSandboxProvider,
    tmp_path: Path,
) -> None:
    p = provider
    local = tmp_path / "local"
    make_tree(local)
    # what the agent answers, in a sandbox with python3
    p.upload(box, local, "/workspace/ref", exclude=["*.pyc"])
    listed_by_agent = p.list_dir(box, "/workspace/ref", depth=3)
    p.download(box, "/workspace/ref", tmp_path / "down-agent", exclude=["data.bin"])
    q = nopy
    h = _no_python_box(q)
    try:
        # single files
        q.write_file(h, "/workspace/a.txt", b"hello")
        big = os.urandom(5 << 20)
        q.write_file(h, "/workspace/big.bin", big)
        assert q.read_file(h, "/workspace/a.txt") == FileContent(b"hello")
        assert q.read_file(h, "/workspace/big.bin", max_bytes=len(big)) == FileContent(big)
        stat_a = q.stat(h, "/workspace/a.txt")
        assert stat_a is not None and stat_a.size == 5 and not stat_a.is_dir
        assert q.stat(h, "/workspace/nothing") is None
        assert q._files._agents.sessions() == []  # no agent could start
        # batches
        q.write_files(h, {f"/workspace/batch/{i}": f"n{i}" for i in range(20)})
        got = q.read_files(h, [f"/workspace/batch/{i}" for i in range(20)])
        assert got == {f"/workspace/batch/{i}": FileContent(f"n{i}".encode()) for i in range(20)}
        # trees: a new destination (one whole tree), then one that exists (merged)
        q.upload(h, local, "/workspace/ref", exclude=["*.pyc"])
        # listings: the agent's answer, in the agent's order
        assert _fields(q.list_dir(h, "/workspace/ref", depth=3)) == _fields(listed_by_agent)
        assert q.list_dir(h, "/workspace/nothing") is None
        with pytest.raises(CommandFailed, match="not a directory"):
            q.list_dir(h, "/workspace/a.txt")
        with pytest.raises(CommandFailed, match="permission denied"):
            q.list_dir(h, "/root")
        # the shell's download is the agent's
        q.download(h, "/workspace/ref", tmp_path / "down-sh", exclude=["data.bin"])
        assert tree_of(tmp_path / "down-sh") == tree_of(tmp_path / "down-agent")
        (local / "src" / "pkg" / "mod.py").write_text("print('changed')\n")
        (local / "added.txt").write_text("added\n")
        q.upload(h, local, "/workspace/ref", exclude=["*.pyc"])
        q.download(h, "/workspace/ref", tmp_path / "down", exclude=["data.bin"])
        expected = {k: v for k, v in tree_of(local).items()
                    if k not in ("skip.pyc", "data.bin")}
        assert tree_of(tmp_path / "down") == expected
        # one file down, by its own name
        q.download(h, "/workspace/a.txt", tmp_path / "one.txt")
        assert (tmp_path / "one.txt").read_bytes() == b"hello"
        with pytest.raises(CommandFailed, match="does not exist"):
            q.download(h, "/workspace/nothing", tmp_path / "never")
        # under /skills (root's rules): each file written by root, 0644; a link and an
        # empty directory are reported, not written
        root(q, h, "mkdir -p /skills && chmod 0755 /skills")
        with pytest.raises(FilesFailed) as ei:
            q.upload(h, local, "/skills/tool", exclude=["*.pyc", "data.bin"])
        assert sorted(ei.value.failed) == ["/skills/tool/empty", "/skills/tool/link"]
        owner = root(q, h, "stat -c '%U %a' /skills/tool/src/pkg/mod.py").split()
        assert owner == ["root", "644"]
        # a cancelled large write leaves the old file and nothing staged
        token = CancelToken()
        threading.Timer(0.02, token.cancel).start()
        try:
            q.write_file(h, "/workspace/big.bin", os.urandom(5 << 20), cancel=token)
        except Cancelled:
            assert q.read_file(h, "/workspace/big.bin", max_bytes=len(big)) == FileContent(big)
        assert staged(q, h) == [] and agents(processes(q, h)) == []
        # commands: exec, and one in the background fed, followed, attached, listed, killed
        assert q.exec(h, "echo $((6 * 7))", timeout=30.0).stdout == "42\n"
        fed = q.start(h, "cat; echo done", stdin=True, tag="day")
        fed.send_stdin("from the day\n")
        fed.close_stdin()
        seen: List[str] = []
        r = fed.wait(timeout=60, on_stdout=seen.append)
        assert r.exit_code == 0 and r.stdout == "from the day\ndone\n" == "".join(seen)
        server = q.start(h, "echo up; sleep 300", tag="day")
        assert [c.id for c in q.commands(h)] == [server.id]
        again = q.attach(h, server.id)
        assert again.running and "up\n" in again.output().stdout
        again.kill()
        assert server.wait(timeout=30).cancelled
        q.kill_all(h)
        # the supervisors record how their commands ended, then leave
        wait_until(lambda: processes(q, h) == [], 15, "nothing left running")
    finally:
        q.destroy(h)


#: Names that sort differently by bytes and by locale, links, a closed directory below,
#: a FIFO.
_ODD_TREE = (
    "mkdir -p /workspace/l/B /workspace/l/a/z /workspace/l/a/Y /workspace/l/closed "
    "&& touch /workspace/l/a/z/1 /workspace/l/a/Y/2 /workspace/l/_x /workspace/l/é "
    "&& ln -s a /workspace/l/ln && ln -s /nowhere /workspace/l/dangling "
    "&& touch /workspace/l/closed/hidden && chmod 0 /workspace/l/closed "
    "&& mkfifo /workspace/l/fifo"
)


def test_listing_order_and_fields_match_the_agents(
    provider: E2BSandboxProvider, box: SandboxHandle, nopy: E2BSandboxProvider
) -> None:
    provider.exec(box, _ODD_TREE, timeout=30.0)
    by_agent = [provider.list_dir(box, "/workspace/l", depth=d) for d in (1, 2, 3)]
    h = _no_python_box(nopy)
    try:
        nopy.exec(h, _ODD_TREE, timeout=30.0)
        for d in (1, 2, 3):
            got = nopy.list_dir(h, "/workspace/l", depth=d)
            assert _fields(got) == _fields(by_agent[d - 1]), d
    finally:
        nopy.destroy(h)
