"""Uploads against a hostile neighbour on this machine, and at scale.

A local process that replaces a file or directory of the tree with a symbolic link (or
anything else) after ``upload`` listed it must never get another file's bytes into the
sandbox — here a root-only (0600) file, which the client, as root, could read: what was
replaced is left out and named in ``FilesFailed``, the rest arrives. Whatever the number of
files, the client's memory stays flat.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from e2b_provider import (
    E2BSandboxProvider,
    FilesFailed,
    SandboxHandle,
    TransferSummary,
)

from .conftest import root, unique_name
from .test_file_paths import LEFTOVERS
from .test_no_python import NO_PYTHON

pytestmark = pytest.mark.integration

SECRET = b"root-only secret of this machine: " + os.urandom(8).hex().encode() + b"\n"
REPLACED = "not sent: it was replaced or removed on this machine after the upload listed it"
PUBLIC = b"p" * len(SECRET)  # as large as the secret: only what it is tells them apart


def private_things(tmp_path: Path) -> Tuple[Path, Path]:
    """A root-only file (0600) holding :data:`SECRET`, and a root-only directory (0700)
    holding ``f``, the same, outside any tree uploaded."""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    private = tmp_path / "private"
    private.mkdir()
    (private / "f").write_bytes(SECRET)
    (private / "f").chmod(0o600)
    private.chmod(0o700)
    return secret, private


def secret_files(p: E2BSandboxProvider, h: SandboxHandle, dest: str) -> str:
    """The files under ``dest`` in the sandbox holding the secret (links not followed)."""
    text = shlex.quote(SECRET.decode().strip())
    return root(p, h, f"grep -r -l -F {text} {shlex.quote(dest)} 2>/dev/null; true")


def entries(p: E2BSandboxProvider, h: SandboxHandle, dest: str) -> Dict[str, str]:
    """Each file under ``dest`` (relative) and its sha256."""
    out = root(p, h, f"cd {dest} && find . -type f -exec sha256sum {{}} + | sort")
    return {line.split()[1][2:]: line.split()[0] for line in out.splitlines()}


@pytest.fixture(scope="module")
def nopy(emulator) -> Iterator[Tuple[E2BSandboxProvider, SandboxHandle]]:  # type: ignore[no-untyped-def]
    """A sandbox of the emulator's template without python3 (uploads by GNU ``tar``)."""
    with E2BSandboxProvider(emulator.config(template=NO_PYTHON)) as q:
        h = q.create(unique_name("nopy"))
        try:
            yield q, h
        finally:
            q.destroy(h)


@pytest.mark.parametrize("where", ["new", "existing", "new, no python3",
                                   "existing, no python3", "/skills, no python3"])
def test_entries_replaced_by_links_during_an_upload_are_never_read(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle,
    nopy: Tuple[E2BSandboxProvider, SandboxHandle], tmp_path: Path, where: str,
) -> None:
    # the upload has begun (a_big is on its way) when b_file and c_dir become links to
    # root-only things: they are left out and named, a_big and d_file arrive
    p, h = nopy if "no python3" in where else (shared_provider, sandbox)
    secret, private = private_things(tmp_path)
    src = tmp_path / "src"
    (src / "c_dir").mkdir(parents=True)
    (src / "c_dir" / "f").write_bytes(PUBLIC)
    big = os.urandom(3 << 20)
    (src / "a_big").write_bytes(big)
    (src / "b_file").write_bytes(PUBLIC)
    (src / "d_file").write_bytes(b"d")
    dest = ("/skills/" if "skills" in where else "/workspace/") + unique_name("swapped")
    if where.startswith("existing"):
        p.write_file(h, f"{dest}/marker", b"there before")
    if "skills" in where:
        root(p, h, "mkdir -p /skills && chmod 0755 /skills")
    swapped: List[int] = []

    def swap(done: int, total: Optional[int]) -> None:
        if done > 0 and not swapped:
            swapped.append(done)
            for name, to in (("b_file", secret), ("c_dir", private)):
                os.rename(src / name, tmp_path / f"old-{name}")
                (src / name).symlink_to(to)

    failed: Optional[FilesFailed] = None
    try:
        p.upload(h, src, dest, progress=swap)
    except FilesFailed as exc:
        failed = exc
    assert swapped and swapped[0] <= len(big)  # before b_file was read
    assert secret_files(p, h, dest) == ""
    assert failed is not None
    assert {k: str(v) for k, v in failed.failed.items()} == {
        f"{dest}/b_file": REPLACED, f"{dest}/c_dir": REPLACED}
    assert failed.summary == TransferSummary(files=2, dirs=0, symlinks=0, bytes=len(big) + 1)
    want = {"a_big": hashlib.sha256(big).hexdigest(), "d_file": hashlib.sha256(b"d").hexdigest()}
    if where.startswith("existing"):
        want["marker"] = hashlib.sha256(b"there before").hexdigest()
    assert entries(p, h, dest) == want
    assert root(p, h, f"find {dest} -mindepth 1 ! -type f") == ""  # no c_dir, no link
    assert root(p, h, LEFTOVERS) == ""
    root(p, h, f"rm -rf {dest}")


def test_a_neighbour_racing_uploads_never_gets_a_root_only_file_into_the_sandbox(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    # a thread keeps replacing files and directories of the tree with links to root-only
    # things and putting them back, while the tree is uploaded again and again: whatever
    # each upload met (a link when listed, a link when read, neither), the secret never
    # arrives; what was replaced after it was listed is named as not sent
    p = shared_provider
    secret, private = private_things(tmp_path)
    src, away = tmp_path / "src", tmp_path / "away"
    away.mkdir()
    targets: List[Tuple[str, Path]] = []
    for i in range(8):
        (src / f"d{i}").mkdir(parents=True)
        (src / f"d{i}" / "f").write_bytes(PUBLIC)
        (src / f"f{i}").write_bytes(PUBLIC)
        targets += [(f"d{i}", private), (f"f{i}", secret)]
    stop = threading.Event()

    def swap_forever() -> None:
        while not stop.is_set():
            for name, to in targets:
                os.rename(src / name, away / name)
                (src / name).symlink_to(to)
            time.sleep(0.0005)
            for name, _ in targets:
                os.unlink(src / name)
                os.rename(away / name, src / name)
            time.sleep(0.0005)

    swapper = threading.Thread(target=swap_forever, daemon=True)
    swapper.start()
    outcomes: List[str] = []
    try:
        for n in range(12):
            dest = f"/workspace/race/{n}"
            try:
                p.upload(sandbox, src, dest)
                outcomes.append("whole")
            except FilesFailed as exc:
                assert exc.summary is not None
                for path, err in exc.failed.items():
                    assert path.rsplit("/", 1)[-1] in dict(targets), path
                    assert str(err) == REPLACED
                outcomes.append("some left out")
            assert secret_files(p, sandbox, dest) == ""
    finally:
        stop.set()
        swapper.join(10)
    print("outcomes:", {o: outcomes.count(o) for o in set(outcomes)})
    assert secret_files(p, sandbox, "/workspace/race") == ""
    assert root(p, sandbox, LEFTOVERS) == ""
    root(p, sandbox, "rm -rf /workspace/race")


def test_uploading_100000_empty_files_keeps_the_clients_memory_flat(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    # the plan and the stream of 100,000 empty files (100 directories of 1,000): the
    # client's allocations peak at most 32 MiB above where they were (they grew by 127
    # MiB when the stream gathered every header of a run of empty files into one piece)
    p = shared_provider
    # made in memory where there is a tmpfs (100,000 files on a busy disk can take minutes)
    top = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else tmp_path))
    try:
        src = top / "many"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        for i in range(100):
            (src / f"d{i:03d}").mkdir(parents=True)
            for j in range(1000):
                os.close(os.open(src / f"d{i:03d}" / f"file-{j:05d}", flags, 0o644))
        # in the sandbox too: its disk has too few inodes for 100,000 files
        p.upload(sandbox, src / "d000", "/dev/shm/warm-up")  # first-use allocations
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            summary = p.upload(sandbox, src, "/dev/shm/many")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            root(p, sandbox, "rm -rf /dev/shm/warm-up")
    finally:
        shutil.rmtree(top)
    try:
        assert summary == TransferSummary(files=100_000, dirs=100, symlinks=0, bytes=0)
        assert root(p, sandbox, "find /dev/shm/many -type f | wc -l").strip() == "100000"
        grown = (peak - base) / (1 << 20)
        print(f"client allocations peaked {grown:.1f} MiB above the start")
        assert grown <= 32
    finally:
        root(p, sandbox, "rm -rf /dev/shm/many")
