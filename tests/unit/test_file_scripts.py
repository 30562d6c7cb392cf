"""The library's own file scripts, run locally with /bin/sh (no sandbox needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import List

import pytest

from e2b_provider import InvalidArgument
from e2b_provider import _scripts as S


def sh(args: List[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["/bin/sh", *args], capture_output=True, timeout=30, check=False)


def test_inline_write_creates_parents_and_writes_every_byte(tmp_path: Path) -> None:
    data = bytes(range(256)) * 256  # 64 KiB: the largest inline write
    assert len(data) == S.INLINE_WRITE_MAX
    target = tmp_path / "a" / "b" / "f.bin"
    r = sh(S.inline_write_args(str(target), data, skills=False))
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() == data
    assert sh(S.inline_write_args(str(target), b"", skills=False)).returncode == 0
    assert target.read_bytes() == b""


def test_inline_skills_write_is_mode_0644(tmp_path: Path) -> None:
    target = tmp_path / "skills" / "x" / "SKILL.md"
    old = os.umask(0o077)
    try:
        assert sh(S.inline_write_args(str(target), b"# s\n", skills=True)).returncode == 0
    finally:
        os.umask(old)
    assert target.read_bytes() == b"# s\n"
    assert target.stat().st_mode & 0o777 == 0o644


def test_inline_write_refuses_too_much_before_io() -> None:
    with pytest.raises(InvalidArgument):
        S.inline_write_args("/x", b"x" * (S.INLINE_WRITE_MAX + 1), skills=False)


def test_inline_write_fails_on_a_directory(tmp_path: Path) -> None:
    assert sh(S.inline_write_args(str(tmp_path), b"x", skills=False)).returncode != 0


def test_read_probe(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 1000)
    # small enough (or the threshold off): printed, capped
    r = sh(S.read_probe_args(str(f), 10, 10))
    assert (r.returncode, r.stdout) == (0, b"x" * 10)
    r = sh(S.read_probe_args(str(f), 2000, 2000))
    assert (r.returncode, r.stdout) == (0, b"x" * 1000)
    # larger than the threshold, and asked for more: the fast path
    r = sh(S.read_probe_args(str(f), 2000, 999))
    assert (r.returncode, r.stdout) == (S.LARGE_READ_EXIT, b"")
    assert sh(S.read_probe_args(str(tmp_path / "none"), 10, 5)).returncode == 3
    assert sh(S.read_probe_args(str(tmp_path), 10, 5)).returncode == 4


def test_fileop_names_are_checked() -> None:
    op = "0123456789abcdef" * 2
    assert S.fileop_name(op) == S.FILEOP_MARKER + op
    for bad in ("", "x" * 32, op + "0", "../" + op[3:]):
        with pytest.raises(InvalidArgument):
            S.fileop_name(bad)
    assert S.fileop_cleanup_args("")[3] == ""
    with pytest.raises(InvalidArgument):
        S.fileop_cleanup_args("not-an-id")


def test_cleanup_script_never_names_a_file_operation() -> None:
    # the clean-up looks file operations up by name: its own command line must not match
    for arg in S.fileop_cleanup_args("", "/opt/capybara/upload/x"):
        assert S.FILEOP_MARKER not in arg
