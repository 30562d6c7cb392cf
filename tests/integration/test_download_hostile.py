"""Downloads from a hostile (or merely busy) sandbox, against the emulator.

Links that would lead outside the target once the whole tree is written are refused,
whatever the order they come in; a file that shrinks while it is sent leaves the local file
it would have replaced; a tree 1,500 directories deep downloads, leaving no descriptor
open; a cancelled or timed-out download into a new target leaves nothing; a killed ``cp``'s
temporary file is removed by the next transfer into its directory, and never one of a live
process.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from local_trees import removed_at_the_end

from e2b_provider import (
    Cancelled,
    CancelToken,
    E2BSandboxProvider,
    FilesFailed,
    OperationTimeout,
    SandboxHandle,
)
from e2b_provider.files import local_fs as _local_fs
from e2b_provider.files import trees as _trees

from .conftest import own_sandbox

pytestmark = pytest.mark.integration


def _escaping(dest: Path) -> List[str]:
    """Every link under ``dest`` that resolves (``os.path.realpath``) outside it."""
    top = os.path.realpath(dest)
    out = []
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            real = os.path.realpath(p)
            if os.path.islink(p) and real != top and not real.startswith(top + "/"):
                out.append(f"{os.path.relpath(p, dest)} -> {real}")
    return out


def _parts(where: Path) -> List[str]:
    return sorted(n for n in os.listdir(where) if n.startswith(".capybara-part-"))


def _sh(p: E2BSandboxProvider, h: SandboxHandle, cmd: str, timeout: float = 120.0) -> str:
    r = p.exec(h, cmd, timeout=timeout)
    assert r.exit_code == 0, r
    return r.stdout


@pytest.fixture(scope="module")
def box(shared_provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    with own_sandbox(shared_provider, "hostile") as h:
        yield h


# -- links -----------------------------------------------------------------------------------


def _plant_links(p: E2BSandboxProvider, h: SandboxHandle, dest: Path) -> str:
    """Both orders that fooled a check of each link as it was written: ``a -> z/..`` before
    ``z -> .``; ``b`` through ``d1/d2/d3/w`` before ``w -> ../../..`` (which then makes
    ``b`` the host's ``/etc``)."""
    ups = "/..".join([""] * (len(dest.parent.parts)))  # from dest's parent up to /
    src = f"/workspace/links-{random.getrandbits(32):08x}"
    _sh(p, h, f"mkdir -p {src}/d1/d2/d3 && cd {src} && ln -s z/.. a && ln -s . z && "
              f"ln -s d1/d2/d3/w/..{ups}/etc b && ln -s ../../.. d1/d2/d3/w && "
              "ln -s d1/d2 fine && echo hi > d1/d2/f")  # fmt: skip
    return src


def test_links_cannot_be_combined_to_lead_outside(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, tmp_path: Path
) -> None:
    dest = tmp_path / "down"
    src = _plant_links(shared_provider, box, dest)
    with pytest.raises(FilesFailed) as info:
        shared_provider.download(box, src, str(dest))
    assert _escaping(dest) == []
    assert sorted(info.value.failed) == ["a", "b"]
    assert os.readlink(dest / "z") == "." and os.readlink(dest / "d1/d2/d3/w") == "../../.."
    assert (dest / "fine" / "f").read_bytes() == b"hi\n"
    assert not os.path.lexists(dest / "a") and not os.path.lexists(dest / "b")


def test_links_cannot_be_combined_to_lead_outside_through_cp(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, tmp_path: Path, emu
) -> None:  # type: ignore[no-untyped-def]
    dest = tmp_path / "down"
    src = _plant_links(shared_provider, box, dest)
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(E2B_API_URL=emu.api_url, E2B_SANDBOX_URL=emu.sandbox_url,
               E2B_API_KEY=emu.api_key, E2B_TEMPLATE="base")  # fmt: skip
    cp = [sys.executable, "-m", "e2b_provider", "cp", "-r", f"{box.id}:{src}", str(dest)]
    r = subprocess.run(cp, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "2 failed: a: refused: " in r.stderr, r
    assert _escaping(dest) == []
    assert (dest / "fine" / "f").read_bytes() == b"hi\n"


# -- a file that shrinks ---------------------------------------------------------------------


def test_a_file_that_shrinks_while_sent_leaves_the_local_file(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, tmp_path: Path
) -> None:
    p = shared_provider
    src = f"/workspace/shrink-{random.getrandbits(32):08x}"
    # "a" comes first; "b" (there locally) and "c" (new) are far larger than what the
    # stream holds in flight: once "a" is written, the packer is still sending "b"
    _sh(p, box, f"mkdir -p {src} && echo first > {src}/a && truncate -s 96M {src}/b "
                f"{src}/c && echo last > {src}/d")  # fmt: skip
    dest = tmp_path / "down"
    dest.mkdir()
    (dest / "b").write_bytes(b"the old b")
    truncated: List[str] = []

    def progress(done: int, total: object) -> None:
        if not truncated:
            truncated.append(_sh(p, box, f"truncate -s 1000 {src}/b {src}/c && echo ok"))

    with pytest.raises(FilesFailed) as info:
        p.download(box, src, str(dest), progress=progress)
    assert truncated == ["ok\n"]
    assert sorted(info.value.failed) == [f"{src}/b", f"{src}/c"]
    assert "shrank" in str(info.value)
    assert (dest / "b").read_bytes() == b"the old b"
    assert not (dest / "c").exists()
    assert (dest / "a").read_bytes() == b"first\n" and (dest / "d").read_bytes() == b"last\n"
    assert _parts(dest) == []
    assert info.value.summary is not None and info.value.summary.files == 2


# -- depth ----------------------------------------------------------------------------------


def test_a_tree_1500_directories_deep_downloads(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, tmp_path: Path
) -> None:
    p = shared_provider
    src = f"/workspace/deep-{random.getrandbits(32):08x}"
    p.write_file(box, f"{src}.py", (
        b"import os, sys\n"
        b"os.makedirs(sys.argv[1])\n"
        b"os.chdir(sys.argv[1])\n"
        b"for i in range(1, 1501):\n"
        b"    os.mkdir('d')\n"
        b"    with open('d/f', 'w') as f:\n"
        b"        f.write('%d\\n' % i)\n"
        b"    os.chdir('d')\n"
        b"os.symlink('../../f', 'up')\n"
    ))
    _sh(p, box, f"python3 {src}.py {src}")
    with removed_at_the_end(tmp_path / "down"):
        _download_deep(p, box, src, tmp_path)


def _open_below(top: Path) -> List[str]:
    """The paths this process has descriptors open on at or below ``top`` (sockets of the
    provider's pool come and go: they are not counted)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        if target == str(top) or target.startswith(f"{top}/"):
            out.append(target)
    return out


def _download_deep(p: E2BSandboxProvider, box: SandboxHandle, src: str, tmp_path: Path
                   ) -> None:
    started = time.monotonic()
    summary = p.download(box, src, str(tmp_path / "down"))
    took = time.monotonic() - started
    assert _open_below(tmp_path) == []
    assert (summary.files, summary.dirs, summary.symlinks) == (1500, 1500, 1)
    assert took < 60.0, took  # a hang bound: about 3 s here
    fd = os.open(tmp_path / "down", os.O_RDONLY)
    try:
        for i in range(1, 1501):
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
            with open(os.open("f", os.O_RDONLY, dir_fd=fd), "rb") as f:
                assert f.read() == b"%d\n" % i
        assert os.readlink("up", dir_fd=fd) == "../../f"
    finally:
        os.close(fd)


# -- cancelled or timed out: a new target whole or not at all ------------------------------


def test_a_cancelled_download_into_a_new_target_leaves_nothing(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    p = shared_provider
    src = f"/workspace/many-{random.getrandbits(32):08x}"
    _sh(p, box, f"mkdir -p {src} && cd {src} && for d in $(seq 20); do mkdir $d && for f in "
                "$(seq 20); do head -c 20000 /dev/urandom > $d/$f; done; done && "
                "truncate -s 8M 10/big")  # fmt: skip
    started = time.monotonic()
    whole = p.download(box, src, str(tmp_path / "whole"))
    span = time.monotonic() - started
    rng = random.Random(7)
    outcomes: Dict[str, int] = {}
    for i in range(12):
        dest = tmp_path / f"try{i}"
        delay = rng.uniform(0.0, span * 1.2)
        if i % 2:
            token = CancelToken()
            timer = threading.Timer(delay, token.cancel)
            timer.start()
            try:
                got = p.download(box, src, str(dest), cancel=token)
            except Cancelled:
                got = None
            finally:
                timer.cancel()
        else:
            monkeypatch.setattr(_trees, "tree_bound", lambda _n, d=delay: d)
            try:
                got = p.download(box, src, str(dest))
            except OperationTimeout:
                got = None
            finally:
                monkeypatch.undo()
        outcomes["whole" if got else "nothing"] = outcomes.get("whole" if got else "nothing",
                                                                 0) + 1  # fmt: skip
        if got is None:
            assert not os.path.lexists(dest)
        else:
            assert got == whole
            assert sum(len(fs) for _, _, fs in os.walk(dest)) == whole.files
        assert _parts(tmp_path) == [], i
    assert outcomes.get("nothing"), outcomes  # some were cut (else the test tests nothing)


# -- a killed cp's temporary file ----------------------------------------------------------


def test_the_part_file_of_a_killed_cp_goes_with_the_next_transfer(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, tmp_path: Path, emu
) -> None:  # type: ignore[no-untyped-def]
    p = shared_provider
    src = f"/workspace/kill-{random.getrandbits(32):08x}"
    _sh(p, box, f"mkdir -p {src} && head -c 300M /dev/zero > {src}/big && echo s > {src}/small")
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(E2B_API_URL=emu.api_url, E2B_SANDBOX_URL=emu.sandbox_url,
               E2B_API_KEY=emu.api_key, E2B_TEMPLATE="base")  # fmt: skip
    here = tmp_path / "here"
    here.mkdir()
    # a part of a live process (this one, a sleeper) of this machine: never removed
    sleeper = subprocess.Popen(["sleep", "300"])
    live = f".capybara-part-{sleeper.pid}-{_local_fs._host_tag()}-0123456789ab"
    (here / live).write_bytes(b"busy")
    cli = [sys.executable, "-m", "e2b_provider", "cp"]
    child = subprocess.Popen([*cli, f"{box.id}:{src}/big", str(here / "big")], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        mine = f".capybara-part-{child.pid}-"
        while not any(n.startswith(mine) and (here / n).stat().st_size > 0
                      for n in _parts(here)):  # fmt: skip
            assert child.poll() is None and time.monotonic() < deadline, _parts(here)
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        left = [n for n in _parts(here) if n.startswith(mine)]
        assert len(left) == 1  # nothing could remove it
        assert not (here / "big").exists()
        r = subprocess.run([*cli, f"{box.id}:{src}/small", str(here / "small")], env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert _parts(here) == [live]
        assert (here / "small").read_bytes() == b"s\n"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        sleeper.kill()
        sleeper.wait()
