"""read_file / write_file / stat against the emulator."""

from __future__ import annotations

import pytest

from e2b_provider import E2BSandboxProvider, FileContent, FileStat, InvalidArgument, SandboxHandle

pytestmark = pytest.mark.integration


def test_write_read_stat_roundtrip(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    data = bytes(range(256)) * 40
    shared_provider.write_file(sandbox, "/workspace/deep/er/bin.dat", data)
    assert shared_provider.read_file(sandbox, "/workspace/deep/er/bin.dat") == FileContent(
        data, False
    )
    assert shared_provider.read_file(
        sandbox, "/workspace/deep/er/bin.dat", max_bytes=100
    ) == FileContent(data[:100], True)
    assert shared_provider.read_file(
        sandbox, "/workspace/deep/er/bin.dat", max_bytes=len(data)
    ) == FileContent(data, False)
    assert shared_provider.stat(sandbox, "/workspace/deep/er/bin.dat") == FileStat(len(data), False)
    st = shared_provider.stat(sandbox, "/workspace/deep")
    assert st is not None and st.is_dir
    shared_provider.write_file(sandbox, "/workspace/empty", b"")
    assert shared_provider.read_file(sandbox, "/workspace/empty") == FileContent(b"", False)


def test_missing_paths_and_directories(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    assert shared_provider.read_file(sandbox, "/workspace/nope.txt") is None
    assert shared_provider.read_file(sandbox, "/workspace") is None  # a directory
    assert shared_provider.stat(sandbox, "/workspace/nope.txt") is None
    assert shared_provider.stat(sandbox, "/nope/deeper") is None


def test_write_ownership_and_skills_mode(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    shared_provider.write_file(sandbox, "/workspace/owned/a.txt", b"a")
    r = shared_provider.exec(
        sandbox, "stat -c '%U:%G %a' /workspace/owned/a.txt /workspace/owned", timeout=30.0
    )
    assert r.stdout.split("\n")[:2] == ["sandbox:sandbox 644", "sandbox:sandbox 755"], r
    shared_provider.write_file(sandbox, "/skills/tool/SKILL.md", b"# skill\n")
    r = shared_provider.exec(sandbox, "stat -c '%U %a' /skills/tool/SKILL.md", timeout=30.0)
    assert r.stdout.strip() == "root 644"
    # the sandbox user cannot write where it has no rights, and the error says so
    from e2b_provider import CommandFailed

    with pytest.raises(CommandFailed):
        shared_provider.write_file(sandbox, "/etc/owned-by-root/x", b"x")
    # the staging directory is left empty
    r = shared_provider.exec(sandbox, "ls -A /opt/capybara/upload | wc -l", timeout=30.0)
    assert r.stdout.strip() == "0"


def test_bad_paths_rejected_before_io(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    for bad in ("relative", "/a/../b", "/a//b", "/a\x00b", "/a\nb", "/tmp/"):
        with pytest.raises(InvalidArgument):
            shared_provider.read_file(sandbox, bad)
        with pytest.raises(InvalidArgument):
            shared_provider.write_file(sandbox, bad, b"x")
        with pytest.raises(InvalidArgument):
            shared_provider.stat(sandbox, bad)
    with pytest.raises(InvalidArgument):
        shared_provider.write_file(sandbox, "/workspace/x", "text, not bytes")  # type: ignore[arg-type]
