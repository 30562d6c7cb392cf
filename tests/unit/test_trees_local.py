"""The local ends of tree transfers (``_trees``): the upload's tar stream, and the
download's extraction of a tar stream from an untrusted sandbox.

Real files under ``tmp_path``; hostile archives are built here with :mod:`tarfile`. Every
extraction test compares the whole of ``tmp_path`` outside the destination before and
after: nothing may appear, change or vanish there.
"""

from __future__ import annotations

import io
import logging
import os
import stat
import tarfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from local_trees import removed_at_the_end

from e2b_provider.cancel import CancelToken
from e2b_provider.errors import Cancelled, CommandFailed, InvalidArgument
from e2b_provider.files.local_extract import extract_stream
from e2b_provider.files.tar_codec import tar_length, tar_stream
from e2b_provider.files.trees import tree_bound
from e2b_provider.files.upload_plan import Unsent, plan_upload
from e2b_provider.models import TransferSummary

END = ".capybara-end-0123456789abcdef"
MTIME = 1_600_000_000


def _tree(root: Path) -> Dict[str, Tuple[Any, ...]]:
    """Everything under ``root`` (not following links): type, mode, content or target."""
    out: Dict[str, Tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", stat.S_IMODE(st.st_mode), Path(p).read_bytes(),
                            int(st.st_mtime))  # fmt: skip
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("other", stat.S_IFMT(st.st_mode))
    return out


def _make_tree(src: Path) -> None:
    src.mkdir()
    (src / "a.txt").write_bytes(b"alpha\n")
    (src / "empty").write_bytes(b"")
    (src / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o755)
    (src / "secret").write_bytes(b"s" * 700)
    (src / "secret").chmod(0o600)
    (src / "sub" / "deep").mkdir(parents=True)
    (src / "sub" / "deep" / "big.bin").write_bytes(bytes(range(256)) * 5000)  # > one chunk
    (src / "sub" / "b.txt").write_bytes(b"beta")
    (src / "link").symlink_to("a.txt")
    (src / "dirlink").symlink_to("sub")
    (src / "outlink").symlink_to("/etc/passwd")
    for p in sorted(src.rglob("*"), reverse=True):
        if not p.is_symlink():
            os.utime(p, (MTIME, MTIME))


def _stream(plan: Any, **kw: Any) -> List[bytes]:
    return list(tar_stream(plan, END, **kw))


def _members(data: bytes) -> List[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return tf.getmembers()


def _read_member(data: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        f = tf.extractfile(name)
        assert f is not None
        return f.read()


# -- the upload's stream -------------------------------------------------------------------------


def test_tar_stream_holds_exactly_the_planned_tree_then_the_end_marker(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _make_tree(src)
    plan = plan_upload(str(src), "ignored", [])
    assert plan.is_dir and plan.total == 6 + 0 + 18 + 700 + 256 * 5000 + 4
    seen: List[Tuple[int, Optional[int]]] = []
    pieces = _stream(plan, progress=lambda done, total: seen.append((done, total)))
    assert max(len(p) for p in pieces) <= (1 << 20) + 1024
    data = b"".join(pieces)
    assert len(data) % 512 == 0 and data.endswith(b"\0" * 1024)
    assert len(data) == tar_length(plan, END)
    members = _members(data)
    names = [m.name for m in members]
    assert names[-1] == END and members[-1].isfile() and members[-1].size == 0
    expect = _tree(src)
    assert sorted(names[:-1]) == sorted(expect)
    assert len(set(names)) == len(names)
    for m in members[:-1]:
        # a directory comes before what it holds
        parent = os.path.dirname(m.name)
        assert parent == "" or names.index(parent) < names.index(m.name)
        kind = expect[m.name]
        if kind[0] == "file":
            assert m.isfile() and (m.mode, m.mtime) == (kind[1], MTIME)
            assert _read_member(data, m.name) == kind[2]
        elif kind[0] == "dir":
            assert m.isdir() and (m.mode, m.mtime) == (kind[1], MTIME)
        else:
            assert m.issym() and m.linkname == kind[1]
    # progress: from 0 to the total, never backwards
    assert seen[0] == (0, plan.total) and seen[-1] == (plan.total, plan.total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_tar_stream_of_one_file_or_one_link(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"one file")
    os.chmod(f, 0o640)
    plan = plan_upload(str(f), "named.txt", [])
    assert (plan.is_dir, plan.total) == (False, 8)
    data = b"".join(_stream(plan))
    assert [(m.name, m.isfile(), m.mode) for m in _members(data)] == [
        ("named.txt", True, 0o640), (END, True, 0o644)]  # fmt: skip
    assert _read_member(data, "named.txt") == b"one file"
    link = tmp_path / "l"
    link.symlink_to(tmp_path / "nowhere")
    data = b"".join(_stream(plan_upload(str(link), "l2", [])))
    [m, end] = _members(data)
    assert (m.name, m.issym(), m.linkname, end.name) == ("l2", True, str(tmp_path / "nowhere"),
                                                         END)  # fmt: skip


@pytest.mark.parametrize("size", [3000, 3 * (1 << 20) + 5])  # pieces gathered, or sent as read
@pytest.mark.parametrize("change", ["shrinks", "vanishes-content", "grows"])
def test_a_file_that_changed_size_after_planning_is_left_out_and_the_stream_stays_valid(
    tmp_path: Path, change: str, size: int
) -> None:
    # neither padded nor cut: its header has not gone out yet, so it is not sent at all
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"A" * size)
    (src / "z").write_bytes(b"after")
    plan = plan_upload(str(src), "x", [])
    (src / "a").write_bytes({"shrinks": b"B" * (size // 3), "vanishes-content": b"",
                             "grows": b"C" * (size + 2000)}[change])  # fmt: skip
    unsent = Unsent()
    pieces = _stream(plan, unsent=unsent)
    assert max(len(p) for p in pieces) <= (1 << 20) + 1024
    data = b"".join(pieces)
    assert len(data) == tar_length(plan, END)  # as announced before the change
    assert [(m.name, m.size) for m in _members(data)] == [("z", 5), (END, 0)]
    assert _read_member(data, "z") == b"after"
    assert unsent.entries == [("a", "not sent: it changed size on this machine after the "
                                    "upload listed it")]  # fmt: skip
    assert (unsent.files, unsent.bytes, unsent.dirs, unsent.symlinks) == (1, size, 0, 0)


@pytest.mark.parametrize("change", ["shrinks", "grows"])
def test_a_file_that_changes_size_while_it_is_read_keeps_the_stream_valid(
    tmp_path: Path, change: str
) -> None:
    # its header went out: padded with zeros to its planned size (and said), or cut at it
    size = 3 * (1 << 20) + 5
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"A" * size)
    (src / "z").write_bytes(b"after")
    plan = plan_upload(str(src), "x", [])

    def change_it(done: int, total: Optional[int]) -> None:
        if 0 < done < size and (src / "a").stat().st_size == size:  # the first piece is out
            if change == "shrinks":
                os.truncate(src / "a", size // 3)
            else:
                with open(src / "a", "ab") as f:
                    f.write(b"C" * 2000)

    unsent = Unsent()
    data = b"".join(_stream(plan, unsent=unsent, progress=change_it))
    assert len(data) == tar_length(plan, END)
    assert [(m.name, m.size) for m in _members(data)] == [("a", size), ("z", 5), (END, 0)]
    if change == "shrinks":
        assert _read_member(data, "a") == b"A" * (size // 3) + bytes(size - size // 3)
        assert unsent.entries == [("a", "it shrank while it was uploaded: its end was sent "
                                        "as zeros")]  # fmt: skip
    else:
        assert _read_member(data, "a") == b"A" * size
        assert unsent.entries == []
    assert (unsent.files, unsent.bytes) == (0, 0)  # sent, if not as it was


SECRET = b"root-only secret of this machine\n"
REPLACED = "not sent: it was replaced or removed on this machine after the upload listed it"


def _private(tmp_path: Path) -> Tuple[Path, Path]:
    """A root-only file (0600) and a root-only directory holding ``f`` and ``m/f`` (each
    :data:`SECRET`), outside any tree uploaded."""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    private = tmp_path / "private"
    (private / "m").mkdir(parents=True)
    for f in (private / "f", private / "m" / "f"):
        f.write_bytes(SECRET)
        f.chmod(0o600)
    private.chmod(0o700)
    return secret, private


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("swap", ["symlink", "hard link", "fifo", "removed"])
def test_a_file_replaced_after_planning_is_never_read(tmp_path: Path, swap: str) -> None:
    secret, _ = _private(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"p" * len(SECRET))  # as large: only what it is tells them apart
    (src / "z").write_bytes(b"after")
    plan = plan_upload(str(src), "x", [])
    os.unlink(src / "a")
    if swap == "symlink":
        (src / "a").symlink_to(secret)
    elif swap == "hard link":
        os.link(secret, src / "a")
    elif swap == "fifo":
        os.mkfifo(src / "a")  # not waited on
    unsent = Unsent()
    fds = _fds()
    data = b"".join(_stream(plan, unsent=unsent))
    assert _fds() == fds
    assert SECRET not in data
    assert len(data) == tar_length(plan, END)
    assert [m.name for m in _members(data)] == ["z", END]
    assert unsent.entries == [("a", REPLACED)]
    assert (unsent.files, unsent.bytes) == (1, len(SECRET))


def test_a_directory_replaced_after_planning_is_never_read(tmp_path: Path) -> None:
    _, private = _private(tmp_path)
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"p" * len(SECRET))
    (src / "z").write_bytes(b"after")
    plan = plan_upload(str(src), "x", [])
    os.rename(src / "d", tmp_path / "moved")
    (src / "d").symlink_to(private)  # holds an f of the same size
    unsent = Unsent()
    data = b"".join(_stream(plan, unsent=unsent))
    assert SECRET not in data
    assert len(data) == tar_length(plan, END)
    assert [m.name for m in _members(data)] == ["z", END]
    assert unsent.entries == [("d", REPLACED)]  # what was in it is not named
    assert (unsent.files, unsent.dirs, unsent.bytes) == (1, 1, len(SECRET))


def test_entries_replaced_while_the_stream_is_under_way_are_never_read(tmp_path: Path) -> None:
    # the stream reaches a_dir (its header goes out), then b_big; while b_big is read,
    # a_dir, c_file and d_dir become links to root-only things: c_file and d_dir are left
    # out when reached, and so is what a_dir holds (it comes after b_big)
    secret, private = _private(tmp_path)
    src = tmp_path / "src"
    for d in ("a_dir", "d_dir"):
        (src / d).mkdir(parents=True)
        (src / d / "f").write_bytes(b"p" * len(SECRET))
    (src / "b_big").write_bytes(b"B" * (3 << 20))
    (src / "c_file").write_bytes(b"p" * len(SECRET))
    plan = plan_upload(str(src), "x", [])
    assert [i.rel for i in plan.items] == ["a_dir", "b_big", "c_file", "d_dir", "a_dir/f",
                                           "d_dir/f"]  # fmt: skip

    def swap(done: int, total: Optional[int]) -> None:
        if 0 < done < (3 << 20) and not (src / "c_file").is_symlink():
            for name, to in (("a_dir", private), ("c_file", secret), ("d_dir", private)):
                os.rename(src / name, tmp_path / f"old-{name}")
                (src / name).symlink_to(to)

    unsent = Unsent()
    fds = _fds()
    data = b"".join(_stream(plan, unsent=unsent, progress=swap))
    assert _fds() == fds
    assert SECRET not in data
    assert len(data) == tar_length(plan, END)
    assert [m.name for m in _members(data)] == ["a_dir", "b_big", END]
    assert _read_member(data, "b_big") == b"B" * (3 << 20)
    assert unsent.entries == [("c_file", REPLACED), ("d_dir", REPLACED), ("a_dir", REPLACED)]
    assert (unsent.files, unsent.dirs, unsent.bytes) == (3, 1, 3 * len(SECRET))


def test_a_top_replaced_after_planning_is_never_read(tmp_path: Path) -> None:
    secret, private = _private(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"p" * len(SECRET))
    (src / "m").mkdir()
    (src / "m" / "f").write_bytes(b"p" * len(SECRET))
    one = tmp_path / "one"
    one.write_bytes(b"p" * len(SECRET))
    tree, single = plan_upload(str(src), "x", []), plan_upload(str(one), "named.txt", [])
    os.rename(src, tmp_path / "old-src")
    src.symlink_to(private)
    os.unlink(one)
    one.symlink_to(secret)
    for plan, named in ((tree, ""), (single, "named.txt")):
        unsent = Unsent()
        data = b"".join(_stream(plan, unsent=unsent))
        assert SECRET not in data
        assert len(data) == tar_length(plan, END)
        assert [m.name for m in _members(data)] == [END]
        assert unsent.entries == [(named, REPLACED)]


@pytest.mark.parametrize("swap", [False, True])
def test_a_deep_tree_is_walked_with_few_descriptors_each_checked_again(
    tmp_path: Path, swap: bool
) -> None:
    # a chain of 60 directories (more than are kept open), then a sibling of its top: the
    # directories closed on the way are opened again, and checked again (swap: replaced by
    # a link meanwhile, so what it still holds is not read)
    _, private = _private(tmp_path)
    src = tmp_path / "src"
    chain = src / "a" / "/".join(f"l{i:02d}" for i in range(60))
    chain.mkdir(parents=True)
    (chain / "big").write_bytes(b"B" * (3 << 20))
    (src / "a" / "m").mkdir()
    (src / "a" / "m" / "f").write_bytes(b"p" * len(SECRET))
    plan = plan_upload(str(src), "x", [])
    names = [i.rel for i in plan.items]
    assert names[:3] == ["a", "a/l00", "a/m"] and names[-2:] == [f"{chain.relative_to(src)}/big",
                                                                "a/m/f"]  # fmt: skip

    def replace_a(done: int, total: Optional[int]) -> None:
        if swap and 0 < done < (3 << 20) and not (src / "a").is_symlink():
            os.rename(src / "a", tmp_path / "old-a")
            (src / "a").symlink_to(private)

    unsent = Unsent()
    fds = _fds()
    pieces = []
    for piece in tar_stream(plan, END, unsent=unsent, progress=replace_a):
        pieces.append(piece)
        assert _fds() <= fds + 40
    data = b"".join(pieces)
    assert _fds() == fds
    assert SECRET not in data
    assert len(data) == tar_length(plan, END)
    got = [m.name for m in _members(data)]
    if swap:
        assert got == [n for n in names if n != "a/m/f"] + [END]
        assert unsent.entries == [("a", REPLACED)]
    else:
        assert got == [*names, END] and unsent.entries == []
        assert _read_member(data, "a/m/f") == b"p" * len(SECRET)


def test_a_directory_replaced_while_it_is_planned_is_left_out(tmp_path: Path) -> None:
    # listing the top, the walk sees b_dir (a directory), then skips c_fifo (and logs it),
    # then lists b_dir: the log line is when b_dir becomes a link to a root-only directory
    _, private = _private(tmp_path)
    src = tmp_path / "src"
    (src / "b_dir").mkdir(parents=True)
    (src / "b_dir" / "f").write_bytes(b"p" * len(SECRET))
    (src / "a").write_bytes(b"a")
    os.mkfifo(src / "c_fifo")

    class Swap(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "c_fifo" in record.getMessage() and not (src / "b_dir").is_symlink():
                os.rename(src / "b_dir", tmp_path / "old-b_dir")
                (src / "b_dir").symlink_to(private)

    logger = logging.getLogger("e2b_provider")
    handler, level = Swap(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        plan = plan_upload(str(src), "x", [])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert (src / "b_dir").is_symlink()
    assert [i.rel for i in plan.items] == ["a", "b_dir"]  # nothing listed in it
    unsent = Unsent()
    data = b"".join(_stream(plan, unsent=unsent))
    assert SECRET not in data
    assert len(data) == tar_length(plan, END)
    assert [m.name for m in _members(data)] == ["a", END]
    assert unsent.entries == [("b_dir", REPLACED)]


def test_the_headers_of_many_empty_files_go_out_in_pieces(tmp_path: Path) -> None:
    for i in range(5000):  # 2.5 MiB of headers
        (tmp_path / f"f{i:05d}").write_bytes(b"")
    pieces = _stream(plan_upload(str(tmp_path), "x", []))
    assert len(pieces) >= 3 and max(len(p) for p in pieces) <= (1 << 20) + 1024


def test_plan_upload_excludes_by_name_and_by_relative_path(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _make_tree(src)
    (src / "sub" / "x.pyc").write_bytes(b"c")
    (src / "y.pyc").write_bytes(b"c")
    (src / "cache").mkdir()
    (src / "cache" / "inside").write_bytes(b"i")
    os.mkfifo(src / "fifo")  # neither a file, a directory nor a link: skipped
    plan = plan_upload(str(src), "x", ["*.pyc", "cache", "sub/deep"])
    names = [i.rel for i in plan.items]
    assert names == ["a.txt", "dirlink", "empty", "link", "outlink", "run.sh", "secret", "sub",
                     "sub/b.txt"]  # fmt: skip
    assert plan.total == 6 + 18 + 700 + 4
    data = b"".join(_stream(plan))
    assert [m.name for m in _members(data)] == [*names, END]


def test_plan_upload_refuses_what_it_cannot_send(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot upload"):
        plan_upload(str(tmp_path / "missing"), "x", [])
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InvalidArgument, match="not a file or directory"):
        plan_upload(str(tmp_path / "fifo"), "x", [])


def test_tar_stream_stops_when_cancelled(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    token = CancelToken()
    token.cancel("stop")
    with pytest.raises(Cancelled):
        _stream(plan_upload(str(tmp_path), "x", []), cancel=token)


def test_tree_bound_grows_with_the_size() -> None:
    assert tree_bound(0) == tree_bound(-5) == 120.0
    assert tree_bound(1 << 20) == 121.0


# -- the download's extraction -----------------------------------------------------------------


def _archive(*members: Tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for ti, data in members:
            if ti.isreg():
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                tf.addfile(ti)
    return buf.getvalue()


def _m(name: str, data: bytes = b"", *, kind: bytes = tarfile.REGTYPE, link: str = "",
       mode: int = 0o644) -> Tuple[tarfile.TarInfo, bytes]:  # fmt: skip
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = link
    ti.mode = mode
    ti.mtime = MTIME
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        ti.devmajor, ti.devminor = 1, 3
    return ti, data


class Box:
    """``tmp_path`` with a destination and, beside it, things an archive must not reach."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.dest = tmp_path / "dest"
        self.outside = tmp_path / "outside"
        self.outside.mkdir()
        (self.outside / "file").write_bytes(b"precious")
        self.before: Dict[str, Tuple[Any, ...]] = {}

    def mark(self) -> None:
        self.before = self.around()

    def around(self) -> Dict[str, Tuple[Any, ...]]:
        return {k: v for k, v in _tree(self.root).items()
                if k != "dest" and not k.startswith("dest/")}  # fmt: skip

    def extract(
        self, data: bytes, *, single: bool = False, max_bytes: int = 1 << 30,
        local: Optional[Path] = None,
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:  # fmt: skip
        if not self.before:
            self.mark()
        stream = io.BytesIO(data)
        refused: List[Dict[str, Any]] = []
        summary = extract_stream(stream.read, str(local or self.dest), single=single,
                                 max_bytes=max_bytes, refused=refused)  # fmt: skip
        return summary, refused

    def untouched(self) -> None:
        assert self.around() == self.before
        assert (self.outside / "file").read_bytes() == b"precious"


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def _refused_paths(refused: List[Dict[str, Any]]) -> List[str]:
    assert all(r["message"].startswith("refused: ") for r in refused), refused
    return [r["path"] for r in refused]


def test_a_plain_archive_is_written_whole(box: Box) -> None:
    data = _archive(_m("d", kind=tarfile.DIRTYPE, mode=0o755), _m("d/f", b"ff", mode=0o640),
                    _m("d/l", kind=tarfile.SYMTYPE, link="f"), _m("top", b"t"))  # fmt: skip
    summary, refused = box.extract(data)
    assert refused == []
    assert summary == TransferSummary(files=2, dirs=1, symlinks=1, bytes=3)
    assert _tree(box.dest) == {
        "d": ("dir", 0o755), "d/f": ("file", 0o640, b"ff", MTIME), "d/l": ("link", "f"),
        "top": ("file", 0o644, b"t", MTIME),
    }  # fmt: skip
    box.untouched()


def test_names_leaving_the_destination_are_refused(box: Box) -> None:
    data = _archive(
        _m("../outside/file", b"pwned"), _m("../escaped", b"x"),
        _m("ok/../../outside/new", b"x"), _m(str(box.outside / "abs"), b"abs"),
        _m("fine", b"fine"),
    )  # fmt: skip
    summary, refused = box.extract(data)
    assert set(_refused_paths(refused)) >= {"../outside/file", "../escaped",
                                            "ok/../../outside/new"}  # fmt: skip
    # an absolute name is either refused or made relative (the data filter strips its
    # leading "/"): never written where it points
    abs_rel = str(box.outside / "abs").lstrip("/")
    assert (box.dest / abs_rel).read_bytes() == b"abs" or str(box.outside / "abs") in [
        r["path"] for r in refused]  # fmt: skip
    assert (box.dest / "fine").read_bytes() == b"fine"
    assert summary.files >= 1
    box.untouched()


def test_links_leading_outside_and_special_files_are_refused(box: Box) -> None:
    data = _archive(
        _m("etc", kind=tarfile.SYMTYPE, link="/etc"),
        _m("etc/passwd", b"root::0:0::/:/bin/sh\n"),  # the link was refused: stays inside
        _m("up", kind=tarfile.SYMTYPE, link="../../outside"),
        _m("up/file", b"pwned"),
        _m("up2", kind=tarfile.SYMTYPE, link=".."),
        _m("up2/outside/file", b"pwned"),
        _m("hard", kind=tarfile.LNKTYPE, link="/etc/passwd"),
        _m("hard2", kind=tarfile.LNKTYPE, link="../outside/file"),
        _m("null", kind=tarfile.CHRTYPE),
        _m("disk", kind=tarfile.BLKTYPE),
        _m("pipe", kind=tarfile.FIFOTYPE),
        _m("inside", kind=tarfile.SYMTYPE, link="sub/x"),  # inside: fine
        _m("sub/x", b"x"),
    )  # fmt: skip
    with open("/etc/passwd", "rb") as f:
        passwd = f.read()
    _, refused = box.extract(data)
    assert {"etc", "up", "up2", "hard", "hard2", "null", "disk", "pipe"} <= set(
        _refused_paths(refused))  # fmt: skip
    with open("/etc/passwd", "rb") as f:
        assert f.read() == passwd
    tree = _tree(box.dest)
    for name, kind in tree.items():
        if kind[0] == "link":
            assert name == "inside", tree
        assert kind[0] != "other", tree
    assert os.readlink(box.dest / "inside") == "sub/x"
    assert (box.dest / "inside").read_bytes() == b"x"
    box.untouched()


def test_a_link_planted_in_the_destination_is_not_followed(box: Box) -> None:
    box.dest.mkdir()
    (box.dest / "evil").symlink_to(box.outside)
    box.mark()
    summary, refused = box.extract(_archive(_m("evil/x", b"pwned"), _m("evil/file", b"pwned"),
                                            _m("ok", b"ok")))  # fmt: skip
    assert _refused_paths(refused) == ["evil/x", "evil/file"]
    assert summary.files == 1 and (box.dest / "ok").read_bytes() == b"ok"
    assert sorted(os.listdir(box.outside)) == ["file"]
    box.untouched()


def test_setuid_and_world_writable_bits_are_cleared(box: Box) -> None:
    data = _archive(_m("suid", b"#!/bin/sh\n", mode=0o6777), _m("sticky", b"s", mode=0o1666))
    _, refused = box.extract(data)
    assert refused == []
    for name in ("suid", "sticky"):
        mode = os.lstat(box.dest / name).st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022), (name, oct(mode))
    assert stat.S_IMODE(os.lstat(box.dest / "suid").st_mode) == 0o755
    box.untouched()


@pytest.mark.parametrize("name", ["file.txt", "../../evil", "/etc/passwd", "a/b/c"])
def test_single_writes_exactly_the_target_file(box: Box, name: str) -> None:
    box.dest.mkdir()
    target = box.dest / "got.txt"
    (box.dest / "other").write_bytes(b"keep")
    box.mark()
    summary, refused = box.extract(_archive(_m(name, b"content", mode=0o640)), single=True,
                                   local=target)  # fmt: skip
    assert refused == []
    assert summary == TransferSummary(files=1, dirs=0, symlinks=0, bytes=7)
    assert sorted(os.listdir(box.dest)) == ["got.txt", "other"]  # no temporary file left
    assert (target.read_bytes(), stat.S_IMODE(target.stat().st_mode)) == (b"content", 0o640)
    assert int(target.stat().st_mtime) == MTIME
    box.untouched()


def test_single_replaces_an_existing_file_and_refuses_anything_but_a_file(box: Box) -> None:
    box.dest.mkdir()
    target = box.dest / "t"
    target.write_bytes(b"old")
    box.mark()
    for bad in (_m("d", kind=tarfile.DIRTYPE), _m("n", kind=tarfile.CHRTYPE),
                _m("p", kind=tarfile.FIFOTYPE)):  # fmt: skip
        with pytest.raises(CommandFailed, match="other than one file"):
            box.extract(_archive(bad), single=True, local=target)
    assert target.read_bytes() == b"old"
    _, refused = box.extract(_archive(_m("t", kind=tarfile.SYMTYPE, link="/etc/shadow")),
                             single=True, local=target)  # fmt: skip
    assert _refused_paths(refused) == ["t"] and target.read_bytes() == b"old"
    box.extract(_archive(_m("x", b"new")), single=True, local=target)
    assert target.read_bytes() == b"new" and sorted(os.listdir(box.dest)) == ["t"]
    box.untouched()


def test_more_than_max_bytes_stops_before_writing_past_it(box: Box) -> None:
    data = _archive(_m("a", b"a" * 100), _m("b", b"b" * 100), _m("c", b"c" * 100))
    with pytest.raises(CommandFailed, match="larger than max_bytes"):
        box.extract(data, max_bytes=150)
    assert not box.dest.exists()  # a new directory: all or nothing
    box.dest.mkdir()
    with pytest.raises(CommandFailed, match="larger than max_bytes"):
        box.extract(data, max_bytes=150)
    assert sorted(os.listdir(box.dest)) == ["a"]  # one that was there: entry by entry
    box.untouched()
    # exactly the limit is fine
    summary, _ = box.extract(data, max_bytes=300, local=box.root / "dest" / "again")
    assert summary.bytes == 300
    # one file: nothing is written at all, not even a temporary file
    single = box.dest / "single"
    with pytest.raises(CommandFailed, match="larger than max_bytes"):
        box.extract(_archive(_m("s", b"s" * 200)), single=True, max_bytes=199, local=single)
    assert sorted(os.listdir(box.dest)) == ["a", "again"]
    box.untouched()


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=4000), min_size=1, max_size=40))
def test_a_stream_cut_in_any_pieces_is_written_the_same(
    tmp_path_factory: pytest.TempPathFactory, cuts: List[int]
) -> None:
    # the stream comes in pieces of whatever size envd's events have: headers, pax records
    # and file data cut anywhere give the same tree as the stream read whole
    from e2b_provider.files.tar_codec import Chunks as _Chunks

    data = _archive(_m("d", kind=tarfile.DIRTYPE, mode=0o755), _m("d/f", b"f" * 3000),
                    _m("d/" + "long" * 40, b"pax-named"), _m("d/l", kind=tarfile.SYMTYPE,
                    link="f"), _m("e", b""), _m("g", bytes(range(256)) * 9))  # fmt: skip
    pieces: List[bytes] = []
    pos = 0
    while pos < len(data):
        n = cuts[len(pieces) % len(cuts)]
        pieces.append(data[pos : pos + n])
        pos += n
    feed = iter([b"", *pieces])  # an empty piece now and then is no end
    reader = _Chunks(lambda: next(feed, None))
    dest = tmp_path_factory.mktemp("cut") / "dest"
    refused: List[Dict[str, Any]] = []
    summary = extract_stream(reader.read, str(dest), single=False, max_bytes=1 << 20,
                             refused=refused)  # fmt: skip
    assert (summary, refused) == (TransferSummary(files=4, dirs=1, symlinks=1,
                                                  bytes=3000 + 9 + 256 * 9), [])
    assert _tree(dest) == {
        "d": ("dir", 0o755), "d/f": ("file", 0o644, b"f" * 3000, MTIME),
        "d/" + "long" * 40: ("file", 0o644, b"pax-named", MTIME), "d/l": ("link", "f"),
        "e": ("file", 0o644, b"", MTIME), "g": ("file", 0o644, bytes(range(256)) * 9, MTIME),
    }  # fmt: skip


def test_the_first_line_of_a_stream_in_pieces() -> None:
    from e2b_provider.files.tar_codec import Chunks as _Chunks

    feed = iter([b'{"total"', b"", b': 1}\nab', b"cd"])
    reader = _Chunks(lambda: next(feed, None))
    assert reader.read_line(100) == b'{"total": 1}'
    assert (reader.read(1), reader.read(10), reader.read(10), reader.read(10)) == (
        b"a", b"b", b"cd", b"")  # fmt: skip
    feed = iter([b"x" * 60, b"y" * 60, b"\n"])
    assert _Chunks(lambda: next(feed, None)).read_line(100) == b""  # too long
    assert _Chunks(lambda: None).read_line(100) == b""


def test_a_stream_that_is_not_tar_is_a_tar_error(box: Box) -> None:
    with pytest.raises(tarfile.TarError):
        box.extract(b"this is not a tar stream" * 40)
    box.untouched()


def test_links_that_realpath_cannot_follow_do_not_lead_outside(box: Box) -> None:
    # The data filter judges a link by os.path.realpath, which stops resolving links once
    # the path it builds is longer than PATH_MAX and goes on by name: sixteen short links,
    # each to a long directory name, make "a/b/.../p/LLL" a link the filter takes for a
    # directory (CVE-2025-4517; Pythons before 3.9.23, 3.10.18, 3.11.13, 3.12.11, 3.13.4
    # have it). "escape" then names the destination's parent, and a file below it is
    # written there.
    dest = str(box.dest)
    steps = "abcdefghijklmnop"
    comp = "d" * min(247, (4095 - len(dest)) // len(steps) - 1)
    members = []
    path = ""
    for step in steps:
        members.append(_m(os.path.join(path, comp), kind=tarfile.DIRTYPE, mode=0o755))
        members.append(_m(os.path.join(path, step), kind=tarfile.SYMTYPE, link=comp))
        path = os.path.join(path, comp)
    far = os.path.join(*steps, "l" * 254)
    members.append(_m(far, kind=tarfile.SYMTYPE, link="../" * len(steps)))  # the destination
    members.append(_m("escape", kind=tarfile.SYMTYPE, link=far + "/../outside"))
    members.append(_m("escape/file", b"pwned"))
    box.mark()
    try:
        box.extract(_archive(*members))
    except (CommandFailed, tarfile.TarError):
        pass  # refusing the whole stream is fine too
    assert (box.outside / "file").read_bytes() == b"precious"
    box.untouched()


@settings(max_examples=400, deadline=None)
@given(
    name=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2713,
                                        blacklist_characters="/\x7f"), min_size=1, max_size=60),
    depth=st.integers(min_value=0, max_value=3),
    mode=st.integers(min_value=0, max_value=0o777),
    mtime=st.floats(min_value=-(2**10), max_value=2**40, allow_nan=False),
    size=st.one_of(st.integers(min_value=0, max_value=10**12), st.just(8**11)),
    kind=st.sampled_from(["file", "dir", "link"]),
    link=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2713),
                 min_size=1, max_size=120),
)
def test_headers_are_what_tarfile_writes(
    name: str, depth: int, mode: int, mtime: float, size: int, kind: str, link: str
) -> None:
    # the fast header of a plain member and tarfile's own, byte for byte (and the PAX
    # headers of the rest, which go through tarfile)
    from e2b_provider.files.tar_codec import _header, _length
    from e2b_provider.files.upload_plan import Item as _Item

    rel = "/".join([name] * (depth + 1))
    item = _Item(rel, mode, mtime, size if kind == "file" else 0,
                 link if kind == "link" else "", kind == "dir")
    ti = tarfile.TarInfo(rel)
    ti.mode = mode
    ti.mtime = int(mtime)
    if kind == "link":
        ti.type, ti.linkname = tarfile.SYMTYPE, link
    elif kind == "dir":
        ti.type = tarfile.DIRTYPE
    else:
        ti.size = size
    want = ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    assert _header(item, -1 if kind == "dir" else item.size) == want
    # and the announced length of a stream holding it counts that header
    data = item.size + (-item.size % 512)
    assert _length(item, -1 if kind == "dir" else item.size) == len(want) + data


# -- links judged against the finished tree, any depth, whole or nothing, part files -----------


def _escaping_links(dest: Path) -> List[str]:
    """The links under ``dest`` that ``os.path.realpath`` resolves outside it."""
    top = os.path.realpath(dest)
    out = []
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                real = os.path.realpath(p)
                if real != top and not real.startswith(top + "/"):
                    out.append(f"{os.path.relpath(p, dest)} -> {real}")
    return out


def test_a_later_link_cannot_change_where_an_earlier_one_leads(box: Box) -> None:
    # "a" alone leads to the destination (z is nothing yet), "z" alone too: together "a"
    # would name the destination's parent
    _, refused = box.extract(_archive(_m("a", kind=tarfile.SYMTYPE, link="z/.."),
                                      _m("z", kind=tarfile.SYMTYPE, link=".")))  # fmt: skip
    assert _escaping_links(box.dest) == []
    assert _refused_paths(refused) == ["a"]
    assert os.readlink(box.dest / "z") == "."
    box.untouched()


def test_a_link_through_a_link_written_later_is_refused(box: Box) -> None:
    # "w" leads to the destination; "b" through it would climb out of it to the host's /etc
    up = "../" * (len(box.dest.parts) + 2)
    data = _archive(
        _m("d1/d2/d3", kind=tarfile.DIRTYPE, mode=0o755),
        _m("b", kind=tarfile.SYMTYPE, link="d1/d2/d3/w/../../../" + up + "etc"),
        _m("d1/d2/d3/w", kind=tarfile.SYMTYPE, link="../../.."),
        _m("b/passwd", b"pwned"),
    )  # fmt: skip
    _, refused = box.extract(data)
    assert _escaping_links(box.dest) == []
    assert "b" in _refused_paths(refused)
    assert os.readlink(box.dest / "d1/d2/d3/w") == "../../.."
    box.untouched()


def test_links_that_stay_inside_are_written_whatever_their_order(box: Box) -> None:
    data = _archive(
        _m("bin/tool", kind=tarfile.SYMTYPE, link="../pkg/bin/tool"),  # before its target
        _m("chain", kind=tarfile.SYMTYPE, link="bin/tool"),  # a link to a link
        _m("pkg/bin/tool", b"#!/bin/sh\n", mode=0o755),
        _m("lib", kind=tarfile.SYMTYPE, link="pkg"),
        _m("via", kind=tarfile.SYMTYPE, link="lib/bin/tool"),  # down through a link
        _m("dangling", kind=tarfile.SYMTYPE, link="not/there"),
        _m("self", kind=tarfile.SYMTYPE, link="."),
    )  # fmt: skip
    summary, refused = box.extract(data)
    assert refused == []
    assert summary.symlinks == 6
    for name in ("bin/tool", "chain", "via"):
        assert (box.dest / name).read_bytes() == b"#!/bin/sh\n"
    assert _escaping_links(box.dest) == []
    box.untouched()


def test_loops_and_long_chains_of_links_are_refused(box: Box) -> None:
    chain = [_m(f"c{i}", kind=tarfile.SYMTYPE, link=f"c{i + 1}") for i in range(60)]
    data = _archive(_m("x", kind=tarfile.SYMTYPE, link="y"),
                    _m("y", kind=tarfile.SYMTYPE, link="x/.."), *chain)  # fmt: skip
    _, refused = box.extract(data)
    assert {"x", "y", "c0"} <= set(_refused_paths(refused))
    assert os.path.islink(box.dest / "c59")  # the end of the chain is a plain dangling link
    assert _escaping_links(box.dest) == []
    box.untouched()


def test_a_download_link_through_a_link_already_there_is_judged_by_it(box: Box) -> None:
    box.dest.mkdir()
    (box.dest / "mine").symlink_to(box.outside)  # the user's own: left alone
    (box.dest / "here").mkdir()
    box.mark()
    data = _archive(_m("via", kind=tarfile.SYMTYPE, link="mine/file"),
                    _m("up", kind=tarfile.SYMTYPE, link="here/../.."))  # fmt: skip
    _, refused = box.extract(data)
    assert sorted(_refused_paths(refused)) == ["up", "via"]
    assert os.readlink(box.dest / "mine") == str(box.outside)
    box.untouched()


@pytest.mark.parametrize("seed", range(8))
def test_random_trees_of_links_never_lead_outside(
    tmp_path_factory: pytest.TempPathFactory, seed: int
) -> None:
    import random

    rng = random.Random(seed)
    for _ in range(40):
        root = tmp_path_factory.mktemp("links")
        dest = root / "a" / "b" / "c" / "dest"  # parents to climb into
        names = ["x", "y", "z", "d/x", "d/y", "d/e/x", "d/e/z", "f/g"]
        members = []
        for name in rng.sample(names, rng.randint(1, len(names))):
            kind = rng.random()
            if kind < 0.7:
                steps = [rng.choice(["..", "..", ".", "x", "y", "z", "d", "e"])
                         for _ in range(rng.randint(1, 6))]  # fmt: skip
                members.append(_m(name, kind=tarfile.SYMTYPE, link="/".join(steps)))
            elif kind < 0.85:
                members.append(_m(name, kind=tarfile.DIRTYPE, mode=0o755))
            else:
                members.append(_m(name, b"data"))
        rng.shuffle(members)
        refused: List[Dict[str, Any]] = []
        extract_stream(io.BytesIO(_archive(*members)).read, str(dest), single=False,
                       max_bytes=1 << 20, refused=refused)  # fmt: skip
        assert _escaping_links(dest) == [], [(m.name, m.linkname) for m, _ in members]
        assert sorted(os.listdir(root)) == ["a"] and sorted(os.listdir(dest.parent)) == [
            "dest"]  # fmt: skip


def _open_fds() -> List[str]:
    return sorted(os.listdir("/proc/self/fd"))


def test_a_tree_1500_directories_deep_is_written_without_recursion(tmp_path: Path) -> None:
    depth = 1500
    members = []
    path = ""
    for i in range(depth):
        path = f"{path}/d" if path else "d"
        members.append(_m(path, kind=tarfile.DIRTYPE, mode=0o750))
        members.append(_m(f"{path}/f", str(i).encode()))
    members.append(_m(f"{path}/up", kind=tarfile.SYMTYPE, link="../../f"))
    members.append(_m("down", kind=tarfile.SYMTYPE, link=f"{path}/f"))
    data = _archive(*members)
    before = _open_fds()
    refused: List[Dict[str, Any]] = []
    dest = tmp_path / "deep"
    summary = extract_stream(io.BytesIO(data).read, str(dest), single=False,
                             max_bytes=1 << 30, refused=refused)  # fmt: skip
    with removed_at_the_end(dest):
        _check_deep_tree(dest, depth, before, refused, summary)


def _check_deep_tree(dest: Path, depth: int, before: List[str],
                     refused: List[Dict[str, Any]], summary: TransferSummary) -> None:
    assert _open_fds() == before
    assert refused == []
    assert summary == TransferSummary(files=depth, dirs=depth, symlinks=2,
                                      bytes=sum(len(str(i)) for i in range(depth)))  # fmt: skip
    fd = os.open(dest, os.O_RDONLY)
    try:  # down by descriptors: the path is longer than some tools take
        for i in range(depth):
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
            with open(os.open("f", os.O_RDONLY, dir_fd=fd), "rb") as f:
                assert f.read() == str(i).encode()
        assert os.readlink("up", dir_fd=fd) == "../../f"
    finally:
        os.close(fd)


def test_a_name_longer_than_path_max_is_refused(box: Box) -> None:
    long = "/".join(["n" * 200] * 21)  # 4220 bytes
    _, refused = box.extract(_archive(_m(long, b"x"), _m("ok", b"ok")))
    assert _refused_paths(refused) == [long] and "longer than 4095" in refused[0]["message"]
    assert (box.dest / "ok").read_bytes() == b"ok"


def test_a_member_the_sandbox_marks_as_not_read_whole_is_dropped(box: Box) -> None:
    from e2b_provider.sandbox_side import file_agent

    box.dest.mkdir()
    (box.dest / "kept").write_bytes(b"old")
    box.mark()
    whole = _archive(_m("kept", bytes(5000)), _m("new", bytes(100)), _m("fine", b"fine"))
    members = _members(whole)
    # the stream as pack sends it when "kept" and "new" shrank: each followed by the mark
    ends = [m.offset_data + m.size + (-m.size % 512) for m in members]
    data = (whole[: ends[0]] + file_agent.FAILED_HEADER + whole[ends[0] : ends[1]]
            + file_agent.FAILED_HEADER + whole[ends[1] :])  # fmt: skip
    summary, refused = box.extract(data)
    assert refused == []  # the sandbox reports them (its errors)
    assert summary == TransferSummary(files=1, dirs=0, symlinks=0, bytes=4)
    assert sorted(os.listdir(box.dest)) == ["fine", "kept"]
    assert (box.dest / "kept").read_bytes() == b"old"
    # the last member of the stream, and one file alone, too
    single = box.dest / "kept"
    data = whole[: ends[0]] + file_agent.FAILED_HEADER + bytes(1024)
    summary, _ = box.extract(data, single=True, local=single)
    assert summary.files == 0 and single.read_bytes() == b"old"
    assert sorted(os.listdir(box.dest)) == ["fine", "kept"]
    box.untouched()


@pytest.mark.parametrize("cut", [0.01, 0.3, 0.6, 0.99])
def test_a_new_directory_cut_half_way_is_not_there_at_all(box: Box, cut: float) -> None:
    data = _archive(*(_m(f"d{i}/f{j}", bytes(300)) for i in range(5) for j in range(5)))
    last = _members(data)[-1]
    end = last.offset_data + 512  # the members' end: zeros follow
    with pytest.raises(tarfile.ReadError):
        box.extract(data[: int(end * cut)])
    assert sorted(os.listdir(box.root)) == ["outside"]  # no dest, no staging directory
    box.extract(data)
    assert len(_tree(box.dest)) == 30 and sorted(os.listdir(box.root)) == ["dest", "outside"]


def test_parts_of_gone_processes_are_swept_and_no_others(box: Box) -> None:
    from e2b_provider.files import local_fs as _trees

    tag = _trees._host_tag()
    child = __import__("subprocess").Popen(["true"])
    child.wait()
    dead, live = child.pid, os.getpid()
    box.dest.mkdir()
    (box.dest / "sub").mkdir()
    gone_file = f".capybara-part-{dead}-{tag}-0123456789ab"
    gone_dir = f".capybara-part-{dead}-{tag}-ba9876543210"
    kept = [
        f".capybara-part-{live}-{tag}-0123456789ab",  # its process runs
        f".capybara-part-{dead}-{'0' * 8 if tag != '0' * 8 else '1' * 8}-0123456789ab",
        f".capybara-part-{dead}-0123456789ab",  # an older version's: whose is not known
        f".capybara-part-{dead}-{tag}-0123456789ab.x",  # not a part's name
    ]
    for where in (box.root, box.dest, box.dest / "sub"):
        (where / gone_file).write_bytes(b"x")
        (where / gone_dir / "a" / "b").mkdir(parents=True)
        (where / gone_dir / "a" / "b" / "f").write_bytes(b"x")
        (where / gone_dir / "a" / "out").symlink_to(box.outside)
        for name in kept:
            (where / name).write_bytes(b"x")
    box.extract(_archive(_m("sub/new", b"n")), local=box.dest)
    for where in (box.root, box.dest, box.dest / "sub"):
        assert sorted(p for p in os.listdir(where) if p.startswith(".capybara")) == sorted(
            kept), where  # fmt: skip
    assert (box.outside / "file").read_bytes() == b"precious"


def test_files_gnu_tar_says_shrank_are_dropped_once_its_stream_ends(box: Box) -> None:
    # the shell's pack (GNU tar, no python3 in the sandbox) says which file shrank only on
    # its standard error, once it is done: every file waits under its temporary name
    import shutil
    import subprocess

    from e2b_provider.files.trees import shrank_members

    tar = shutil.which("tar")
    if tar is None or b"GNU tar" not in subprocess.run([tar, "--version"],
                                                        capture_output=True).stdout:  # fmt: skip
        pytest.skip(reason="needs GNU tar")
    src = box.root / "src"
    src.mkdir()
    (src / "a").write_bytes(b"first")
    (src / "big").write_bytes(os.urandom(8 << 20))  # far more than a pipe holds
    box.dest.mkdir()
    (box.dest / "big").write_bytes(b"the old big")
    box.mark()
    with subprocess.Popen([tar, "-c", "-f", "-", "-b", "2048", "--format=pax", "-C",
                           str(src), "a", "big"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as child:  # fmt: skip
        assert child.stdout is not None and child.stderr is not None
        first = child.stdout.read(1 << 16)  # "a" and the start of "big": being read now
        os.truncate(src / "big", 1000)
        stream = io.BytesIO(first + child.stdout.read())
        said = child.stderr.read()
    assert child.returncode in (0, 1)
    assert b"big: File shrank by" in said
    refused: List[Dict[str, Any]] = []
    summary = extract_stream(stream.read, str(box.dest), single=False, max_bytes=1 << 30,
                             refused=refused,
                             settle=lambda: shrank_members(said.splitlines()))  # fmt: skip
    assert refused == [] and summary.files == 1
    assert (box.dest / "big").read_bytes() == b"the old big"
    assert (box.dest / "a").read_bytes() == b"first"
    assert sorted(os.listdir(box.dest)) == ["a", "big"]
    # cut before its end: no file is put in place
    stream = io.BytesIO(first)
    with pytest.raises(tarfile.ReadError):
        extract_stream(stream.read, str(box.dest / "cut"), single=False, max_bytes=1 << 30,
                       refused=refused, settle=lambda: [])  # fmt: skip
    box.dest.joinpath("cut").mkdir()
    with pytest.raises(tarfile.ReadError):
        extract_stream(io.BytesIO(first).read, str(box.dest / "cut"), single=False,
                       max_bytes=1 << 30, refused=refused, settle=lambda: [])  # fmt: skip
    assert os.listdir(box.dest / "cut") == []


# -- as strict as tarfile's data filter ------------------------------------------------------

_NAMES = ["a", "a/b", "/a", "//a/b", "./a", "a/./b", "a//b", "a/../b", "../a", "a/b/../../c",
          "a/b/../..", "..", "a\\b", "a b", "ä"]
_LINKS = ["b", "./b", "a/b", "../b", "a/../b", "a/../../b", "..", ".", "/etc/passwd", "//x",
          "b/../../..", "x/y/../../../z"]
_KINDS = [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
          tarfile.BLKTYPE, tarfile.FIFOTYPE]


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(_NAMES), kind=st.sampled_from(_KINDS),
       link=st.sampled_from(_LINKS), mode=st.integers(0, 0o7777))  # fmt: skip
def test_a_download_refuses_what_tarfiles_data_filter_refuses_and_keeps_its_modes(
    tmp_path_factory: pytest.TempPathFactory, name: str, kind: bytes, link: str, mode: int
) -> None:
    """The download's own checks (it does not call the filter: the filter's look at the disk
    follows links and costs in proportion to the depth for every member) are at least as
    strict as :func:`tarfile.data_filter` judging the same member, and give what it lets
    through the filter's mode."""
    ti, _ = _m(name, b"x", kind=kind, link=link, mode=mode)
    nowhere = "/nonexistent-e2b-provider-test-destination"  # the filter's look finds nothing
    try:
        want: Optional[tarfile.TarInfo] = tarfile.data_filter(ti, nowhere)
    except tarfile.FilterError:
        want = None
    box = Box(tmp_path_factory.mktemp("filter"))
    box.dest.mkdir()
    _, refused = box.extract(_archive((ti, b"x")))
    box.untouched()
    if want is None:
        assert refused, (name, kind, link)
        return
    if refused:  # stricter than the filter only where this download judges more: hard
        # links (never written), ".." in a name, a symbolic link (judged in the finished tree)
        assert kind in (tarfile.LNKTYPE, tarfile.SYMTYPE) or ".." in name.split("/"), (
            name, kind, link, refused)
        return
    written = box.dest / want.name
    st_ = os.lstat(written)
    if kind == tarfile.REGTYPE:
        assert want.mode is not None
        assert stat.S_IMODE(st_.st_mode) == want.mode, (oct(st_.st_mode), oct(want.mode))
    elif kind == tarfile.SYMTYPE:
        assert os.readlink(written) == link
