"""Every file path (inline write, streamed write, head -c read, held-descriptor read) keeps the
sandbox user's permissions and the reference's semantics, and leaves nothing behind."""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, Iterator, List, Optional

import pytest
from waiting import wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    CommandFailed,
    E2BSandboxProvider,
    FileContent,
    SandboxHandle,
)
from e2b_provider import _scripts as scripts
from e2b_provider._exec import run_process

pytestmark = pytest.mark.integration

SMALL = 1000
LARGE = scripts.INLINE_WRITE_MAX + 1  # streamed write
BIG = scripts.LARGE_READ_MIN + 4096  # read through the held descriptor when asked for all
#: Prints the pids of running file operations (their top processes).
MARKED = "pgrep -f -- '" + scripts.FILEOP_MARKER + "[0-9a-f]' || true"
#: Prints what file operations left behind: every process but init, the agent and this
#: shell's own, and any FIFO or file in the staging directory.
LEFTOVERS = (
    "ps -e -o pid=,ppid=,args= | awk -v me=$$ "
    "'$1 != 1 && $1 != me && $2 != me && $0 !~ /e2b_provider[.]emulator/'; "
    "find " + scripts.UPLOAD_DIR + " -mindepth 1 ! -type d"
)


def root(p: E2BSandboxProvider, h: SandboxHandle, cmd: str) -> str:
    """Run ``cmd`` as root in the sandbox (test set-up and inspection only)."""
    ctx = p._ctx
    r = run_process(
        ctx.envd(ctx.attach(h.id, None)), user="root", cmd="/bin/sh", args=["-c", cmd],
        cwd="/", max_output_bytes=1 << 20, timeout=60.0, token=None, watchdog=ctx.watchdog,
    )
    assert r.exit_code == 0, r
    return r.stdout.decode()


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
    # a root-owned file the user may write keeps its owner and mode, as with `cat > file`
    p.write_file(box, "/tmp/shared", data)
    assert root(p, box, "stat -c '%U %a %s' /tmp/shared").strip() == f"root 666 {size}"


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
    sent: List[str] = []
    send = p._ctx.transport._send

    def counting(method: str, url: str, **kw: Any) -> Any:
        sent.append(f"{method} {url.rsplit('/', 1)[-1].split('?')[0]}")
        return send(method, url, **kw)

    monkeypatch.setattr(p._ctx.transport, "_send", counting)
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
    data = os.urandom(LARGE)
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
    assert p.read_file(box, "/workspace/staged-3", max_bytes=LARGE) == FileContent(data)
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


def _cancel_when_started(
    p: E2BSandboxProvider, h: SandboxHandle, token: CancelToken
) -> threading.Thread:
    """Cancel ``token`` once a file operation's process runs in the sandbox."""

    def watch() -> None:
        wait_until(lambda: root(p, h, MARKED) != "", 30, "a file op")
        token.cancel("test")

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize(
    "op",
    ["read", "read-large-cap", "write-small", "write-large"],
)
def test_cancelled_fifo_operations_leave_nothing(
    shared_provider: E2BSandboxProvider, box: SandboxHandle, op: str
) -> None:
    p = shared_provider
    fifo = f"/workspace/fifo-{op}"
    root(p, box, f"rm -f {fifo}; mkfifo -m 0666 {fifo}")
    token = CancelToken()
    watcher = _cancel_when_started(p, box, token)
    with pytest.raises(Cancelled):
        if op.startswith("read"):
            p.read_file(box, fifo, max_bytes=100 if op == "read" else BIG, cancel=token)
        else:
            p.write_file(box, fifo, b"y" * (SMALL if op == "write-small" else 4 << 20),
                         cancel=token)
    watcher.join(30)
    assert root(p, box, LEFTOVERS) == ""
    # no leftover reader: a later writer to the FIFO finds nobody and is refused at once
    assert root(p, box, f"exec 3<>{fifo}; echo hi >&3; exec 3>&-; echo ok").strip() == "ok"


def test_kill_all_reaps_a_stuck_write(
    shared_provider: E2BSandboxProvider, box: SandboxHandle
) -> None:
    p = shared_provider
    fifo = "/workspace/fifo-killall"
    root(p, box, f"rm -f {fifo}; mkfifo -m 0666 {fifo}")
    errors: List[Optional[BaseException]] = []

    def write() -> None:
        try:
            p.write_file(box, fifo, b"z" * (1 << 20))
            errors.append(None)
        except BaseException as exc:  # recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    wait_until(lambda: root(p, box, LEFTOVERS) != "", 30, "the stuck write")
    p.kill_all(box)
    t.join(60)
    assert not t.is_alive()
    assert isinstance(errors[0], CommandFailed), errors
    assert root(p, box, LEFTOVERS) == ""
