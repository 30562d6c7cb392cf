"""The command line's pieces behind ``logs --tail`` (the last lines, and the replay dropped
when following) and ``cp -`` (a tar stream from standard input extracted safely), without a
sandbox."""

from __future__ import annotations

import io
import os
import tarfile
from typing import List, Optional

import pytest
from local_trees import tar_entry, tar_of

from e2b_provider.cli import archives
from e2b_provider.cli.arguments import parser
from e2b_provider.cli.tail import AfterShown, last_lines, overlap
from e2b_provider.errors import E2BProviderError

# -- logs --tail ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, n, want", [
    ("a\nb\nc\n", 2, "b\nc\n"),
    ("a\nb\nc", 2, "b\nc"),
    ("a\nb\nc\n", 3, "a\nb\nc\n"),
    ("a\nb\nc\n", 10, "a\nb\nc\n"),
    ("a\nb\nc\n", 0, ""),
    ("a\nb\nc\n", None, "a\nb\nc\n"),
    ("", 5, ""),
    ("\n\n\n", 2, "\n\n"),
    ("one line", 1, "one line"),
])
def test_last_lines_counts_as_tail_does(text: str, n: Optional[int], want: str) -> None:
    assert last_lines(text, n) == want


def test_the_tail_option_reads_numbers_and_all() -> None:
    p = parser(emulator_options=False)
    for word, want in (("3", 3), ("0", 0), ("all", None), ("-1", None)):
        assert p.parse_args(["logs", "--tail", word, "sb", "id"]).tail == want
    assert p.parse_args(["logs", "sb", "id"]).tail is None
    for bad in ("x", "-2", "1.5"):
        with pytest.raises(SystemExit):
            p.parse_args(["logs", "--tail", bad, "sb", "id"])


def test_port_forward_reads_pairs_as_kubectl() -> None:
    p = parser(emulator_options=False)
    args = p.parse_args(["port-forward", "sb", "8000", ":8001", "0:8002", "9000:8003"])
    assert args.ports == [(8000, 8000), (0, 8001), (0, 8002), (9000, 8003)]
    for bad in ("0", "70000", "x:80", "80:0", "a"):
        with pytest.raises(SystemExit):
            p.parse_args(["port-forward", "sb", bad])


@pytest.mark.parametrize("shown, replay, want", [
    ("a\nb\n", "a\nb\nc\n", 4),  # nothing dropped meanwhile: all of it is the replay
    ("a\nb\n", "a\nb\n", 4),
    ("", "x\n", 0),
    ("abcdef", "defgh", 3),  # the oldest output dropped meanwhile: only the end overlaps
    ("abcdef", "fgh", 1),
    ("abcdef", "xyz", 0),
    ("x" * 200 + "tail", "x" * 100 + "tail" + "new", 104),  # longer than the anchor
    ("aaaa", "aaab", 3),
])
def test_overlap_is_the_longest_end_the_replay_starts_with(shown: str, replay: str,
                                                             want: int) -> None:
    assert overlap(shown, replay) == want


def test_after_shown_passes_only_what_follows_the_replay() -> None:
    got: List[str] = []
    f = AfterShown("l1\nl2\n", got.append)
    for piece in ("l1", "\nl", "2\nl3\n"):  # the replay, in pieces, then new output
        f(piece)
    f("l4\n")
    f.finish()
    assert "".join(got) == "l3\nl4\n"
    # the stream ended before the replay was whole: what is held is judged then
    got.clear()
    f = AfterShown("l1\nl2\n", got.append)
    f("l2\n")
    f("x")
    f.finish()
    assert "".join(got) == "x"
    # nothing was shown: everything passes at once
    got.clear()
    f = AfterShown("", got.append)
    f("new\n")
    assert got == ["new\n"]


# -- cp - ----------------------------------------------------------------------------------------


@pytest.fixture(params=["tarfile data filter", "library rules alone"])
def filters(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both with :mod:`tarfile`'s data filter and without it (a Python before 3.9.17):
    the library's own rules refuse the same members."""
    if request.param == "library rules alone":
        monkeypatch.setattr(archives, "_DATA_FILTER", None)
    elif archives._DATA_FILTER is None:
        pytest.skip("this Python's tarfile has no data filter")
    return str(request.param)


def test_a_tar_stream_is_extracted_with_files_dirs_links_and_modes(tmp_path, filters: str
                                                                    ) -> None:  # type: ignore[no-untyped-def]
    big = os.urandom(300_000)
    data = {"./a.txt": b"hello\n", "./d/run": b"#!/bin/sh\n", "./d/big": big}
    for mode in ("w", "w:gz", "w:bz2", "w:xz"):
        stream = tar_of(tar_entry("./", tarfile.DIRTYPE), tar_entry("./a.txt"),
                       tar_entry("./d", tarfile.DIRTYPE), tar_entry("./d/run", mode=0o4777),
                       tar_entry("./d/big"), tar_entry("./d/l", tarfile.SYMTYPE, link="../a.txt"),
                      data=data, mode=mode)
        tree = tmp_path / mode.replace(":", "-")
        archives.extract_tar(io.BytesIO(stream), str(tree), "standard input")
        assert (tree / "a.txt").read_bytes() == b"hello\n"
        assert (tree / "d" / "big").read_bytes() == big
        assert os.readlink(tree / "d" / "l") == "../a.txt"
        assert (tree / "d" / "run").stat().st_mode & 0o7777 == 0o755  # set-id, o+w cleared


@pytest.mark.parametrize("bad", [
    [tar_entry("evil", tarfile.SYMTYPE, link="/etc")],
    [tar_entry("../up.txt")],
    [tar_entry("d/../../up.txt")],
    [tar_entry("out", tarfile.SYMTYPE, link="../.."), tar_entry("out/x.txt")],
    [tar_entry("a", tarfile.SYMTYPE, link="b/.."), tar_entry("b", tarfile.SYMTYPE, link=".."),
     tar_entry("a/x.txt")],
    [tar_entry("hard", tarfile.LNKTYPE, link="first.txt")],
    [tar_entry("dev", tarfile.CHRTYPE)],
    [tar_entry("fifo", tarfile.FIFOTYPE)],
], ids=["absolute link", "dotdot", "inner dotdot", "through a link", "through two links",
        "hard link", "device", "fifo"])
def test_an_unsafe_tar_stream_is_refused(tmp_path, filters: str,  # type: ignore[no-untyped-def]
                                         bad: List[tarfile.TarInfo]) -> None:
    stream = tar_of(tar_entry("first.txt"), *bad, data={"first.txt": b"1"})
    with pytest.raises(E2BProviderError, match="refused, nothing was copied"):
        archives.extract_tar(io.BytesIO(stream), str(tmp_path / "tree"), "standard input")
    # nothing was written outside the tree
    assert sorted(os.listdir(tmp_path)) in ([], ["tree"])
    assert not (tmp_path / "up.txt").exists()


def test_what_is_not_a_whole_tar_stream_is_an_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    whole = tar_of(tar_entry("big"), data={"big": os.urandom(100_000)})
    for junk in (b"", b"not a tar\n", whole[:50_000], whole[:700]):
        with pytest.raises(E2BProviderError, match="not a whole tar stream"):
            archives.extract_tar(io.BytesIO(junk), str(tmp_path / "tree"), "standard input")
        assert not (tmp_path / "tree").exists()
