"""Every file path (inline write, streamed write, head -c read, held-descriptor read) keeps the
sandbox user's permissions and the reference's semantics, and leaves nothing behind."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import Any, Iterator, List, Optional

import pytest
from waiting import wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    CommandFailed,
    E2BProviderError,
    E2BSandboxProvider,
    FileContent,
    FilesFailed,
    SandboxHandle,
    UnsafePath,
)
from e2b_provider.core.file_agents import AGENT_TAG_PREFIX, MAX_INLINE_FILE
from e2b_provider.protocol import scripts as scripts

from .conftest import count_requests, root

pytestmark = pytest.mark.integration

SMALL = 1000
LARGE = scripts.INLINE_WRITE_MAX + 1  # past an inline script write (the agent carries it)
BIG = scripts.LARGE_READ_MIN + 4096  # read through the held descriptor when asked for all
#: Prints the pids of running file operations (their top processes).
MARKED = "pgrep -f -- '" + scripts.FILEOP_MARKER + "[0-9a-f]' || true"
#: Prints what file operations left behind: every process but init, the emulator's envd,
#: the provider's file agent (it stays to serve the next call) and this shell's own, and
#: any FIFO or file in the staging directory.
LEFTOVERS = (
    "ps -e -o pid=,ppid=,args= | awk -v me=$$ "
    "'$1 != 1 && $1 != me && $2 != me && $0 !~ /e2b_provider[.]emulator/ "
    "&& $NF !~ /^" + AGENT_TAG_PREFIX + "[0-9a-f]+$/'; "
    "find " + scripts.UPLOAD_DIR + " -mindepth 1 ! -type d"
)


@pytest.fixture(scope="module")
def box(shared_provider: E2BSandboxProvider, sandbox: SandboxHandle) -> Iterator[SandboxHandle]:
    root(
        shared_provider, sandbox,
        f"mkdir -p /srv && head -c {BIG} /dev/urandom > /srv/secret && chmod 0600 /srv/secret"
        " && : > /tmp/shared && chmod 0666 /tmp/shared"
        " && ln -sf /etc/shadow /workspace/shadow-link"
        " && ln -sf /srv/secret /workspace/secret-link",
    )
    yield sandbox


@pytest.mark.parametrize("size", [SMALL, LARGE, BIG])
def test_write_owner_mode_parents_and_round_trip(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, size: int
) -> None:
    p = shared_provider
    data = os.urandom(size)
    path = f"/workspace/w{size}/a/b/f.bin"
    p.write_file(box, path, data)
    out = root(p, box, f"stat -c '%U:%G %a' {path} /workspace/w{size}/a /workspace/w{size}")
    assert out.split("\n")[:3] == ["sandbox:sandbox 644"] + ["sandbox:sandbox 755"] * 2
    assert p.read_file(box, path, max_bytes=size) == FileContent(data, False)
    assert p.read_file(box, path, max_bytes=size - 1) == FileContent(data[:-1], True)
    assert p.read_file(box, path, max_bytes=size + 1) == FileContent(data, False)
    # overwriting keeps the file (a shorter write truncates it)
    p.write_file(box, path, data[: size // 2])
    assert p.read_file(box, path, max_bytes=size) == FileContent(data[: size // 2], False)
    assert root(p, box, LEFTOVERS) == ""


@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_skills_root_owned_0644_and_existing_owner_kept(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, size: int
) -> None:
    p = shared_provider
    data = os.urandom(size)
    p.write_file(box, f"/skills/t{size}/x/SKILL.md", data)
    assert root(p, box, f"stat -c '%U %a' /skills/t{size}/x/SKILL.md").strip() == "root 644"
    assert p.read_file(box, f"/skills/t{size}/x/SKILL.md", max_bytes=size) == FileContent(data)
    # A write replaces the file whole (a new file renamed over it), which in a sticky
    # directory only the file's owner may do: root's world-writable /tmp/shared is
    # refused, clearly, and left as it was (an in-place write could leave it half new).
    with pytest.raises(CommandFailed, match="sticky directory"):
        p.write_file(box, "/tmp/shared", data)
    assert root(p, box, "stat -c '%U %a %s' /tmp/shared").strip() == "root 666 0"


@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_root_only_and_symlinked_targets_refused_for_writes(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, size: int
) -> None:
    p = shared_provider
    before = root(p, box, "sha256sum /etc/shadow /srv/secret; stat -c %U:%a /etc/shadow")
    for path in ("/srv/secret", "/workspace/shadow-link", "/workspace/secret-link",
                 "/etc/passwd-new", "/root/x"):
        with pytest.raises(CommandFailed):
            p.write_file(box, path, b"x" * size)
    assert root(p, box, "sha256sum /etc/shadow /srv/secret; stat -c %U:%a /etc/shadow") == before
    assert root(p, box, "ls /etc/passwd-new /root/x 2>&1 || true").count("No such file") == 2
    assert root(p, box, LEFTOVERS) == ""


@pytest.mark.parametrize("max_bytes", [100, BIG + 1])
def test_root_only_and_symlinked_files_refused_for_reads(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, max_bytes: int
) -> None:
    p = shared_provider
    for path in ("/srv/secret", "/workspace/secret-link", "/workspace/shadow-link",
                 "/etc/shadow"):
        with pytest.raises(CommandFailed):
            p.read_file(box, path, max_bytes=max_bytes)
    assert root(p, box, LEFTOVERS) == ""


def test_large_read_caps_and_holder_leaves(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = shared_provider
    data = os.urandom(8 << 20)
    p.write_file(box, "/workspace/big.bin", data)
    sent = count_requests(p, monkeypatch)
    assert root(p, box, "sha256sum < /workspace/big.bin").split()[0] == (
        hashlib.sha256(data).hexdigest()
    )
    for cap in (scripts.LARGE_READ_MIN + 1, 5 << 20, len(data) - 1):
        assert p.read_file(box, "/workspace/big.bin", max_bytes=cap) == FileContent(
            data[:cap], True
        )
    assert p.read_file(box, "/workspace/big.bin", max_bytes=len(data)) == FileContent(data)
    assert p.read_file(box, "/workspace/big.bin", max_bytes=16 << 20) == FileContent(data)
    # each of those five reads went through the held descriptor, none the slow way
    assert sent.count("GET files") == 5 and sent.count("POST SendSignal") == 5
    assert p.stat(box, "/workspace/big.bin") is not None
    assert root(p, box, LEFTOVERS) == ""
    # the staging directory is root's alone
    assert root(p, box, f"stat -c '%U %a' {scripts.UPLOAD_DIR}").strip() == "root 700"


def test_a_tampered_staging_directory_is_never_written_through(
    shared_provider: E2BSandboxProvider, box: SandboxHandle
) -> None:
    """The staging directory is checked on every streamed write (made root-only again when
    it is not root's, refused when it is a symlink), not only on the first."""
    p = shared_provider
    d = scripts.UPLOAD_DIR
    data = os.urandom(MAX_INLINE_FILE + 1)  # large enough to be staged
    p.write_file(box, "/workspace/staged-1", data)  # prepares it (if not yet)
    root(p, box, f"chown sandbox:sandbox {d} && chmod 0777 {d}")
    p.write_file(box, "/workspace/staged-2", data)
    assert root(p, box, f"stat -c '%U %a' {d}").strip() == "root 700"
    root(p, box, f"mkdir -p /workspace/evil && chown sandbox /workspace/evil && "
                 f"mv {d} {d}.real && ln -s /workspace/evil {d}")
    try:
        with pytest.raises(CommandFailed):
            p.write_file(box, "/workspace/staged-3", data)
        assert root(p, box, "ls -A /workspace/evil") == ""
        assert root(p, box, "[ -e /workspace/staged-3 ] || echo no").strip() == "no"
    finally:
        root(p, box, f"rm -f {d} && mv {d}.real {d}")
    p.write_file(box, "/workspace/staged-3", data)
    assert p.read_file(box, "/workspace/staged-3", max_bytes=len(data)) == FileContent(data)
    assert root(p, box, f"stat -c '%U %a' {d}").strip() == "root 700"
    assert root(p, box, LEFTOVERS) == ""


def test_missing_and_directories_on_the_large_path(
    shared_provider: E2BSandboxProvider, box: SandboxHandle
) -> None:
    p = shared_provider
    assert p.read_file(box, "/workspace/none", max_bytes=BIG) is None
    assert p.read_file(box, "/workspace", max_bytes=BIG) is None
    with pytest.raises(CommandFailed):
        p.write_file(box, "/workspace", b"x" * LARGE)  # a directory


@pytest.mark.parametrize(
    "op",
    ["read", "read-large-cap", "write-small", "write-large"],
)
def test_fifo_operations_end_at_once_with_a_clear_error(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, op: str
) -> None:
    """A FIFO (or device) is never opened for a read or written through: the call ends at
    once with an error that says what the path is, and nothing is left running."""
    p = shared_provider
    fifo = f"/workspace/fifo-{op}"
    root(p, box, f"rm -f {fifo}; mkfifo -m 0666 {fifo}")
    t0 = time.monotonic()
    with pytest.raises(CommandFailed, match="FIFO"):
        if op.startswith("read"):
            p.read_file(box, fifo, max_bytes=100 if op == "read" else BIG)
        else:
            p.write_file(box, fifo, b"y" * (SMALL if op == "write-small" else 4 << 20))
    assert time.monotonic() - t0 < 30
    assert root(p, box, LEFTOVERS) == ""
    # it is still the FIFO it was, with no reader or writer of ours left on it
    assert root(p, box, f"[ -p {fifo} ] && echo fifo").strip() == "fifo"
    assert root(p, box, f"exec 3<>{fifo}; echo hi >&3; exec 3>&-; echo ok").strip() == "ok"


@pytest.mark.parametrize("op", ["read", "write-small", "write-large"])
def test_cancelled_file_operations_leave_nothing(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, op: str
) -> None:
    """Cancelled at once, half-way or late, an operation leaves no process, FIFO or part."""
    p = shared_provider
    data = os.urandom(SMALL if op == "write-small" else 4 << 20)
    p.write_file(box, "/workspace/cancel-me", data)
    for delay in (0.0, 0.005, 0.02, 0.05, 0.2):
        token = CancelToken()
        threading.Timer(delay, token.cancel, args=("test",)).start()
        try:
            if op == "read":
                p.read_file(box, "/workspace/cancel-me", max_bytes=len(data), cancel=token)
            else:
                p.write_file(box, "/workspace/cancel-me", data, cancel=token)
        except Cancelled:
            pass
        token.cancel("done")
        wait_until(lambda: root(p, box, LEFTOVERS) == "", 30, "nothing left behind")
        got = p.read_file(box, "/workspace/cancel-me", max_bytes=len(data))
        assert got == FileContent(data)
    assert root(p, box, "find /workspace -name '.capybara-part-*'") == ""


def test_kill_all_reaps_a_stuck_upload(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, tmp_path: Any
) -> None:
    """An upload held half-way (its client stops sending) is stopped by kill_all: its
    processes are killed, its FIFO and part files removed, the files it had not finished
    keep their old content."""
    p = shared_provider
    src = tmp_path / "stuck"
    src.mkdir()
    old = os.urandom(2 << 20)
    (src / "f").write_bytes(old)
    p.upload(box, src, "/workspace/stuck")
    (src / "f").write_bytes(os.urandom(2 << 20))
    (src / "g").write_bytes(os.urandom(2 << 20))
    held = threading.Event()
    release = threading.Event()
    errors: List[Optional[BaseException]] = []

    def hold(done: int, total: Optional[int]) -> None:
        if done >= 1 << 20 and not held.is_set():
            held.set()
            release.wait(60)

    def upload() -> None:
        try:
            p.upload(box, src, "/workspace/stuck", progress=hold)
            errors.append(None)
        except BaseException as exc:  # recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=upload, daemon=True)
    t.start()
    assert held.wait(60)
    wait_until(lambda: root(p, box, LEFTOVERS) != "", 30, "the stuck upload")
    p.kill_all(box)
    release.set()
    t.join(60)
    assert not t.is_alive()
    assert isinstance(errors[0], E2BProviderError), errors
    assert p.read_file(box, "/workspace/stuck/f", max_bytes=BIG) == FileContent(old)
    wait_until(lambda: root(p, box, LEFTOVERS) == "", 30, "nothing left behind")
    assert root(p, box, "find /workspace/stuck /tmp -name '.capybara-part-*'") == ""


def test_a_file_that_shrinks_while_it_is_read_is_never_a_network_error(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """envd ends a body early when the file shrank after it was opened (it promised the
    length it had then): the read gives what the file holds now, never a transport error
    with network advice. The file is cut at the worst moment: right after envd answered
    the large read's GET, before its body is read."""
    from e2b_provider.clients.envd import EnvdClient

    p = shared_provider
    data = os.urandom(48 << 20)
    download_head = EnvdClient.download_head
    cuts: List[int] = []

    def cutting(self: EnvdClient, path: str, **kw: Any) -> bytes:
        opened = kw.get("on_open")

        def cut() -> None:
            root(p, box, f"head -c {cuts[-1]} /workspace/shrinking > /tmp/s && "
                         "cat /tmp/s > /workspace/shrinking")
            if opened is not None:
                opened()

        kw["on_open"] = cut
        return download_head(self, path, **kw)

    monkeypatch.setattr(EnvdClient, "download_head", cutting)
    for keep in (0, 1000, 5 << 20):
        p.write_file(box, "/workspace/shrinking", data)
        cuts.append(keep)
        got = p.read_file(box, "/workspace/shrinking", max_bytes=len(data))
        assert got == FileContent(data[:keep])


def test_planted_links_under_a_skills_the_user_may_write_are_refused(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, tmp_path: Any
) -> None:
    """When /skills is the sandbox user's (a volume mounted there, say), the user can plant
    links in it; root's writes under /skills then refuse, naming the path and why, and
    never write where the links lead."""
    p = shared_provider
    watch = "sha256sum /etc/passwd /etc/shadow; stat -c '%U %a' /etc/passwd /etc/shadow; " \
            "ls -A /root"
    before = root(p, box, watch)
    root(p, box, "mkdir -p /skills && chown sandbox /skills")
    p.exec(box, "ln -sfn /etc/passwd /skills/a.md && ln -sfn /etc/shadow /skills/s.md && "
                "ln -sfn /root /skills/r")
    src = tmp_path / "tree"
    src.mkdir()
    (src / "authorized_keys").write_bytes(b"ssh-ed25519 AAAA attacker")
    attempts = [
        lambda: p.write_file(box, "/skills/a.md", b"x"),
        lambda: p.write_file(box, "/skills/a.md", b"x" * (MAX_INLINE_FILE + 1)),
        lambda: p.write_file(box, "/skills/s.md", b"x"),
        lambda: p.write_file(box, "/skills/r/authorized_keys", b"ssh-ed25519 AAAA attacker"),
        lambda: p.upload(box, src, "/skills/r"),
        lambda: p.upload(box, src / "authorized_keys", "/skills/r/authorized_keys"),
    ]
    try:
        for attempt in attempts:
            with pytest.raises(UnsafePath, match=r"refused: .*/skills"):
                attempt()
        with pytest.raises(FilesFailed) as batch:
            p.write_files(box, {"/skills/a.md": b"x", "/workspace/fine": b"ok"})
        assert set(batch.value.failed) == {"/skills/a.md"}
        assert isinstance(batch.value.failed["/skills/a.md"], UnsafePath)
        assert root(p, box, watch) == before
    finally:
        root(p, box, "rm -f /skills/a.md /skills/s.md /skills/r && chown root /skills")
    # once /skills is root's again, the same writes go through, as root, 0644
    p.write_file(box, "/skills/a.md", b"# skill\n")
    assert root(p, box, "stat -c '%U %a' /skills/a.md").strip() == "root 644"
