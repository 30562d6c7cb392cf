"""The library's own file scripts, run locally with /bin/sh (no sandbox needed).

The scripts that run as root in a sandbox (the streamed write, the clean-up) touch fixed
places (``/opt/capybara/upload``) or kill file operations by name, so they run here inside
private namespaces (``unshare``: a tmpfs on ``/opt``, their own process ids, and a
``sandbox`` user of their own): nothing of this host is touched.
"""

from __future__ import annotations

import errno
import os
import re
import select
import shlex
import shutil
import socket
import stat
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Dict, Iterator, List, Tuple

import pytest

from e2b_provider import InvalidArgument
from e2b_provider.core import messages as messages
from e2b_provider.protocol import scripts as S


def sh(args: List[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["/bin/sh", *args], capture_output=True, timeout=30, check=False)


@pytest.fixture(autouse=True)
def own_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """User writes run here register their temporary files in a registry of this test's
    own (``$USER``); it must be empty again once the test is over."""
    name = f"capytest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("USER", name)
    registry = Path(S.USER_PARTS_PREFIX + name)
    yield registry
    if registry.is_dir() and not registry.is_symlink():
        left = sorted(os.listdir(registry))
        shutil.rmtree(registry)
        assert left == [], f"registry entries left behind: {left}"


def marked(args: List[str], op: str = "") -> List[str]:
    """``args`` with ``$0`` set to a file operation's marked name, as ``Files._run`` does."""
    return [args[0], args[1], S.fileop_name(op or uuid.uuid4().hex), *args[3:]]


def parts_in(directory: Path) -> List[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(S.PART_PREFIX))


def test_inline_write_creates_parents_and_writes_every_byte(tmp_path: Path) -> None:
    data = bytes(range(256)) * 256  # 64 KiB: the largest inline write
    assert len(data) == S.INLINE_WRITE_MAX
    target = tmp_path / "a" / "b" / "f.bin"
    r = sh(S.inline_write_args(str(target), data, skills=False))
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() == data
    assert sh(S.inline_write_args(str(target), b"", skills=False)).returncode == 0
    assert target.read_bytes() == b""


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


def _as_other_user(args: List[str]) -> subprocess.CompletedProcess[bytes]:
    """Run a script as a user the test's files are closed to (``nobody`` when root)."""
    cmd = ["/bin/sh", *args]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "nobody", "--", *cmd]
    return subprocess.run(cmd, capture_output=True, timeout=30, check=False)


@pytest.mark.parametrize("probe", ["read", "stat"])
def test_a_path_behind_a_closed_directory_is_not_missing(tmp_path: Path, probe: str) -> None:
    closed = tmp_path / "closed"
    closed.mkdir()
    (closed / "x").write_bytes(b"secret")
    closed.chmod(0o700 if os.geteuid() == 0 else 0o000)

    def run(path: str) -> subprocess.CompletedProcess[bytes]:
        args = S.read_probe_args(path, 10, 10) if probe == "read" else S.stat_probe_args(path)
        return _as_other_user(args)

    try:
        r = run(str(closed / "x"))
        assert r.returncode == S.NO_ENTRY_EXIT, r
        blocked = r.stderr.decode().strip()
        assert str(closed / "x").startswith(blocked + "/")  # the directory that is closed
        assert r.stdout == b""
        # truly missing paths stay "missing" (3), also behind a file
        assert run(f"/tmp/df-missing-{os.getpid()}-{id(r)}/y").returncode == 3
        assert run("/etc/hostname/x").returncode == 3
    finally:
        closed.chmod(0o700)


def test_inline_write_as_the_user_keeps_the_umask(tmp_path: Path) -> None:
    # a new file's mode is left to the user's umask (as the reference's USER_WRITE_SCRIPT);
    # only a /skills write is made 0644 for everyone (test_skills_write_*)
    user = tmp_path / "u" / "f"
    old = os.umask(0o077)
    try:
        assert sh(marked(S.inline_write_args(str(user), b"u", skills=False))).returncode == 0
    finally:
        os.umask(old)
    assert (user.read_bytes(), user.stat().st_mode & 0o777) == (b"u", 0o600)
    assert parts_in(user.parent) == []


def test_read_probe_checks_want_before_io(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    # want 0: nothing printed, but whether the file exists is still told
    assert S.read_probe_args(str(f), 0, 0)[-2:] == ["0", "0"]
    r = sh(S.read_probe_args(str(f), 0, 0))
    assert (r.returncode, r.stdout) == (0, b"")
    assert sh(S.read_probe_args(str(tmp_path / "none"), 0, 0)).returncode == 3
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidArgument) as ei:
            S.read_probe_args(str(f), bad, 10)  # type: ignore[arg-type]
        assert str(ei.value) == "want must be a non-negative integer"


def test_refusals_say_what_is_wrong() -> None:
    with pytest.raises(InvalidArgument) as ei:
        S.fileop_name("x" * 32)
    assert str(ei.value) == "a file operation id is 32 hex digits"
    with pytest.raises(InvalidArgument) as ei:
        S.kill_batch_args(["/tmp/x"])
    assert str(ei.value) == "not an exec control path"
    # exactly the most one batch takes is fine
    ctls = [S.control_path() for _ in range(S.KILL_BATCH_MAX)]
    assert S.kill_batch_args(ctls)[3:] == ctls


def test_script_messages_carry_the_script_name_users_never_read(tmp_path: Path) -> None:
    # what a script's own shell prints starts with the script's name ($0): the provider
    # strips exactly that prefix from what users read (_messages.script_reason)
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    no_tools = dict(os.environ, PATH=str(tmp_path / "no-such-dir"))
    op = uuid.uuid4().hex
    cases = [
        (S.inline_write_args(str(tmp_path), b"x", skills=False), "capybara-write",
         f"it is a directory (cannot create {tmp_path})"),
        (S.read_probe_args(str(f), 10, 10), "capybara-read", "not found"),
        (S.stat_probe_args(str(f)), "capybara-stat", "not found"),
        (S.fileop_cleanup_args(op), "capybara-cleanup", "pgrep: not found"),
    ]  # fmt: skip
    for args, name, reason in cases:
        env = os.environ if name == "capybara-write" else no_tools
        r = subprocess.run(["/bin/sh", *args], capture_output=True, timeout=30, env=env)
        stderr = r.stderr.decode()
        assert stderr.startswith(f"{name}: "), (name, stderr)
        assert messages.script_reason(stderr, r.returncode) == reason, (name, stderr)
        assert "capybara" not in reason


def test_marked_kill_scripts_are_the_reference_ones_plus_the_sweep() -> None:
    # the reference's script unchanged, with the ``z`` function before it and the sweep
    # just before its final ``exit 0``
    sweep = 'z -xF -e "CAPYBARA_EXEC=/tmp/x"'
    for ref in (S.KILL_ALL_SCRIPT, S.KILL_TAGGED_SCRIPT):
        got = S._then_marked(ref, sweep)
        assert got.startswith(S.KILL_TREE + S.MARKED_KILL)
        assert got.endswith("; " + sweep + "; exit 0")
        assert got.replace(S.MARKED_KILL, "", 1).replace(sweep + "; ", "", 1) == ref
        assert subprocess.run(["/bin/sh", "-n", "-c", got], timeout=10).returncode == 0


# -- the root-only scripts, in private namespaces -------------------------------------------

_ROOT_TOOLS = ("unshare", "runuser", "pgrep", "mkfifo", "ps")


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not all(shutil.which(t) for t in _ROOT_TOOLS):
        return False
    try:
        r = subprocess.run(
            ["unshare", "-p", "-f", "-m", "--mount-proc", "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


needs_namespaces = pytest.mark.skipif(
    not _can_unshare(), reason="needs root and `unshare -p -f -m --mount-proc`"
)

#: Gives the namespace a tmpfs on /opt (root's, 0755), a private /tmp (the test's own
#: directory ``$H`` still in its place) and a ``sandbox`` user, then runs ``$SETUP``, the
#: script under test (``/bin/sh "$@"``) and ``$REPORT``. ``until_ CONDITION`` waits (at most
#: ~10 s) for a shell condition: what a script leaves to run on (a background job, a kill
#: signal on its way) settles a moment after it exits.
_NS_DRIVER = r"""
until_() { i=0; while ! eval "$1" && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; }
set -e
mount -t tmpfs tmpfs /opt
chmod 0755 /opt
mount --bind "$PW" /etc/passwd
mount --bind "$GR" /etc/group
mkdir /opt/.host
mount --bind "$H" /opt/.host
mount -t tmpfs tmpfs /tmp
mkdir -p "$H"
mount --bind /opt/.host "$H"
umount /opt/.host
rmdir /opt/.host
mkdir -p /opt/work /opt/capybara/upload/keepdir
chown sandbox: /opt/work
touch -d '20 minutes ago' /opt/capybara/upload/old
touch /opt/capybara/upload/new
eval "$SETUP"
set +e
/bin/sh "$@"; echo "rc=$?"
eval "$REPORT"
"""


def _ns_env(tmp_path: Path, **more: str) -> Dict[str, str]:
    """The driver's environment: copies of passwd and group with a ``sandbox`` user."""
    pw, gr = tmp_path / "passwd", tmp_path / "group"
    pw.write_text(Path("/etc/passwd").read_text() + "sandbox:x:1500:1500::/opt/work:/bin/sh\n")
    gr.write_text(Path("/etc/group").read_text() + "sandbox:x:1500:\n")
    env = dict(os.environ, PW=str(pw), GR=str(gr), H=str(tmp_path), SETUP=":", REPORT=":",
               PART=S.PART_PREFIX, PARTS=S.USER_PARTS_PREFIX, ROOT_PARTS=S.ROOT_PARTS_DIR)
    env.update(more)
    return env


def _ns_popen(args: List[str], env: Dict[str, str]) -> subprocess.Popen[bytes]:
    argv = ["unshare", "-p", "-f", "-m", "--mount-proc", "--kill-child",
            "/bin/sh", "-c", _NS_DRIVER, "driver", *args]  # fmt: skip
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/"
    )


def _first_line(out: IO[bytes], timeout: float = 30.0) -> bytes:
    ready, _, _ = select.select([out], [], [], timeout)
    return out.readline() if ready else b""


def _open_writer(fifo: Path, timeout: float = 30.0) -> int:
    """Open ``fifo`` for writing once its reader has (bounded)."""
    end = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno not in (errno.ENXIO, errno.ENOENT) or time.monotonic() > end:
                raise
            time.sleep(0.01)
            continue
        os.set_blocking(fd, True)
        return fd


def _streamed(args: List[str], env: Dict[str, str], fifo: Path,
              data: bytes) -> Tuple[bytes, bytes]:
    """Run the stream write ``args`` in a namespace of its own; once it is ready, write
    ``data`` into its FIFO and close it. What the write printed (stdout, stderr)."""
    with _ns_popen(args, env) as p:
        try:
            assert p.stdout is not None
            assert _first_line(p.stdout) == b"ready\n", p.stderr
            fd = _open_writer(fifo)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            out, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return out, err


#: Prints ``leftovers`` and every temporary file and registry entry left in the namespace.
_LEFTOVERS = (
    'echo leftovers $(find /opt /tmp \\( -name "$PART*" -o -path "$PARTS*/*" '
    '-o -path "$ROOT_PARTS/*" \\) -print 2>/dev/null | sort)'
)
_STREAM_REPORT = (
    'stat -c "upload %a %U" /opt/capybara/upload; echo left $(ls -A /opt/capybara/upload); '
    'stat -c "target %a %U %s" "$T"; cmp -s "$T" "$EXPECT" && echo same; '
    # the FIFO's name is removed by a background job once the FIFO is open
    'until_ \'[ ! -p "$F" ]\'; if [ -p "$F" ]; then echo "fifo left"; else echo "fifo gone"; fi; '
    + _LEFTOVERS
)


@needs_namespaces
@pytest.mark.parametrize("skills", [True, False])
def test_stream_write(tmp_path: Path, skills: bool) -> None:
    data = b"line\n" * 20000 + bytes(range(256))
    expect = tmp_path / "expect"
    expect.write_bytes(data)
    fifo = tmp_path / "fifo"
    op = uuid.uuid4().hex
    if skills:
        # the first large write (prepare, the default): the staging directory becomes
        # root-only and stale leftovers are swept; written as root, mode 0644
        target = "/opt/skills/a/b/SKILL.md"
        args = S.stream_write_args(target, str(fifo), True, op, size=len(data))
        setup = "chmod 0755 /opt/capybara/upload"
        want = ["upload 700 root", "left keepdir new parts", f"target 644 root {len(data)}",
                "same", "fifo gone", "leftovers"]  # fmt: skip
    else:
        # a later one: the staging directory is left alone; written as the sandbox user
        target = "/opt/work/x/f.bin"
        args = S.stream_write_args(target, str(fifo), False, op, prepare=False, size=len(data))
        setup = "chmod 0700 /opt/capybara/upload"
        want = ["upload 700 root", "left keepdir new old", f"target 644 sandbox {len(data)}",
                "same", "fifo gone", "leftovers"]  # fmt: skip
    env = _ns_env(tmp_path, SETUP=f"umask 022; {setup}", REPORT=_STREAM_REPORT, T=target,
                  EXPECT=str(expect), F=str(fifo))  # fmt: skip
    # far more than a pipe holds: the script reads as it comes
    out, err = _streamed(args, env, fifo, data)
    # "open": the script says when the FIFO was opened for the upload
    assert out.decode().split("\n")[:-1] == ["open", "rc=0", *want], err


def test_stream_write_names_the_operation(tmp_path: Path) -> None:
    # its $0 is the marked name the clean-up finds the operation by
    op = uuid.uuid4().hex
    args = S.stream_write_args("/opt/work/f", str(tmp_path / "fifo"), False, op, size=7)
    assert args[:2] == ["-c", S.STREAM_WRITE_SCRIPT] and args[2] == S.fileop_name(op)
    assert args[-1] == "7"  # the bytes that must arrive
    for bad in (-1, 1.5, True, None):
        with pytest.raises(InvalidArgument) as ei:
            S.stream_write_args("/opt/work/f", "/x", False, op, size=bad)  # type: ignore[arg-type]
        assert str(ei.value) == "size must be a non-negative integer"


#: Two marked file operations, each a shell with two children, then the clean-up.
_CLEANUP_SETUP = r"""
start() { bash -c 'exec -a "$0" sh -c "sleep 300 & sleep 300 & wait"' "capybara-file""op-$1" & }
start "$A"; start "$B"
i=0; while [ "$(pgrep -c -x sleep)" -lt 4 ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done
mkfifo -m 0600 "$F"
mkdir -p /opt/capybara/upload/full/x
"""
_CLEANUP_REPORT = r"""
alive() { awk -v p="$1" '$1 !~ /^Z/ && index($0, p)' /opt/ps | wc -l; }
left() {
  ps -e -o stat= -o comm= -o args= > /opt/ps
  sleeps=$(awk '$1 !~ /^Z/ && $2 == "sleep"' /opt/ps | wc -l)
  echo "a=$(alive "op-$A") b=$(alive "op-$B") sleeps=$sleeps"
}
until_ '[ "$(left)" = "$WANT" ]'  # SIGKILL is on its way to each
left
if [ -p "$F" ]; then echo fifo; elif [ -d "$F" ]; then stat -c "dir %a" "$F"; \
else echo gone; fi
echo left $(ls -A /opt/capybara/upload)
"""


@needs_namespaces
@pytest.mark.parametrize(
    ("which", "kw", "want"),
    [
        # one operation and its FIFO: the FIFO goes, the other operation stays
        ("a", {"fifo": True}, ["a=0 b=1 sleeps=2", "gone", "left full keepdir new old"]),
        # ... settled (an upload may still come): held open a moment, then gone all the same
        ("a", {"fifo": True, "settle": True},
         ["a=0 b=1 sleeps=2", "gone", "left full keepdir new old"]),
        # all of them, and every file and empty directory staged (a directory left in a
        # FIFO's place by an earlier clean-up); a directory that holds something stays
        ("", {}, ["a=0 b=0 sleeps=0", "fifo", "left full"]),
    ],
)  # fmt: skip
def test_fileop_cleanup(tmp_path: Path, which: str, kw: Dict[str, bool], want: List[str]) -> None:
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    fifo = tmp_path / "fifo"
    op = a if which == "a" else ""
    if kw.get("fifo"):
        args = S.fileop_cleanup_args(op, str(fifo), **{k: v for k, v in kw.items() if k != "fifo"})
    else:
        args = S.fileop_cleanup_args(op)
    env = _ns_env(tmp_path, SETUP=_CLEANUP_SETUP, REPORT=_CLEANUP_REPORT, A=a, B=b, F=str(fifo),
                  WANT=want[0])  # fmt: skip
    with _ns_popen(args, env) as p:
        out, err = p.communicate(timeout=60)
    assert out.decode().split("\n")[:-1] == ["rc=0", *want], err


def _hold(path: Path, user: str = "root") -> subprocess.Popen[bytes]:
    op = uuid.uuid4().hex
    argv = ["/bin/sh", *S.hold_args(str(path), user, 30.0, 1000, op)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
    reason="needs root (the holder drops to another user) and /usr/bin/python3",
)
def test_hold_passes_the_open_file_to_the_holder(tmp_path: Path) -> None:
    big = tmp_path / "big"
    data = os.urandom(5000)
    big.write_bytes(data)
    with _hold(big) as p:
        try:
            assert p.stdout is not None
            m = re.fullmatch(rb"hold (\d+) (\d+) (\d+)\n", _first_line(p.stdout))
            assert m is not None, p.stderr
            pid, fd, size = map(int, m.groups())
            assert (pid, size) == (p.pid, 5000)  # `exec`: the pid envd knows holds the file
            with open(f"/proc/{pid}/fd/{fd}", "rb") as held:
                assert held.read() == data
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert cmdline[-2].decode().startswith(S.FILEOP_MARKER)  # the clean-up finds it
        finally:
            p.kill()
            p.wait(timeout=10)
    small = tmp_path / "small"
    small.write_bytes(b"s" * 1000)  # not larger than `large`: read the ordinary way
    (tmp_path / "dir").mkdir()
    closed = tmp_path / "closed"
    closed.write_bytes(b"x" * 5000)
    closed.chmod(0o600)
    for path, user, code in [(small, "root", 11), (tmp_path / "none", "root", 3),
                             (tmp_path / "dir", "root", 4), (closed, "nobody", 1)]:  # fmt: skip
        with _hold(path, user) as r:
            out, err = r.communicate(timeout=30)
        assert (r.returncode, out) == (code, b""), (path, err)


# -- atomic writes as the user ---------------------------------------------------------------


def test_user_write_keeps_the_mode_and_follows_a_symlink(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"old")
    f.chmod(0o640)
    assert sh(marked(S.inline_write_args(str(f), b"new", skills=False))).returncode == 0
    assert (f.read_bytes(), f.stat().st_mode & 0o777) == (b"new", 0o640)
    # a symbolic link at the path: the file it names is replaced, the link stays
    link, far = tmp_path / "link", tmp_path / "d" / "far"
    far.parent.mkdir()
    far.write_bytes(b"far")
    far.chmod(0o604)
    link.symlink_to(far)
    assert sh(marked(S.inline_write_args(str(link), b"via", skills=False))).returncode == 0
    assert link.is_symlink() and os.readlink(link) == str(far)
    assert (far.read_bytes(), far.stat().st_mode & 0o777) == (b"via", 0o604)
    # a dangling one into a directory that exists: its target is created
    dangling = tmp_path / "dangling"
    dangling.symlink_to(far.parent / "new")
    assert sh(marked(S.inline_write_args(str(dangling), b"n", skills=False))).returncode == 0
    assert (far.parent / "new").read_bytes() == b"n" and dangling.is_symlink()
    assert parts_in(tmp_path) == parts_in(far.parent) == []


def test_user_write_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo, sock = tmp_path / "fifo", tmp_path / "sock"
    os.mkfifo(fifo)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    (tmp_path / "to-fifo").symlink_to(fifo)
    cases = [
        (str(tmp_path), f"it is a directory (cannot create {tmp_path})"),
        (f"{tmp_path}/new-dir/", f"it is a directory (cannot create {tmp_path}/new-dir/)"),
        (str(fifo), f"cannot write {fifo}: it is a FIFO, not a regular file"),
        (f"{tmp_path}/to-fifo",
         f"cannot write {tmp_path}/to-fifo: it is a FIFO, not a regular file"),
        (str(sock), f"cannot write {sock}: it is a socket, not a regular file"),
    ]  # fmt: skip
    try:
        for path, reason in cases:
            r = sh(marked(S.inline_write_args(path, b"x", skills=False)))
            got = messages.script_reason(r.stderr.decode(), r.returncode)
            assert (r.returncode, got) == (1, reason), r
    finally:
        listener.close()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and not (tmp_path / "new-dir").exists()
    assert parts_in(tmp_path) == []


def test_writers_racing_for_one_path_leave_one_whole_file(tmp_path: Path) -> None:
    # every reader, at every moment, sees one writer's whole content (or the old one)
    f = tmp_path / "f"
    old, a, b = b"o" * 50000, b"a" * S.INLINE_WRITE_MAX, b"b" * 40000
    f.write_bytes(old)
    seen = set()
    stop = False

    def read_all() -> None:
        while not stop:
            seen.add(f.read_bytes())

    reader = threading.Thread(target=read_all)
    reader.start()
    try:
        for _ in range(25):
            procs = [
                subprocess.Popen(["/bin/sh", *marked(S.inline_write_args(str(f), data, False))],
                                 stderr=subprocess.PIPE)
                for data in (a, b)
            ]  # fmt: skip
            for p in procs:
                _, err = p.communicate(timeout=30)
                assert p.returncode == 0, err
            assert f.read_bytes() in (a, b)
    finally:
        stop = True
        reader.join(timeout=30)
    assert seen <= {old, a, b} and len(seen) >= 2
    assert parts_in(tmp_path) == []


def test_a_failed_write_leaves_the_old_file_and_nothing_else(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"old")
    args = marked(S.inline_write_args(str(f), b"new", skills=False))
    args[-1] = "not base64!"  # base64 fails half-way: the temporary file is dropped
    r = sh(args)
    assert r.returncode != 0 and f.read_bytes() == b"old"
    assert parts_in(tmp_path) == []


def test_a_temporary_name_that_exists_is_never_opened(tmp_path: Path) -> None:
    # noclobber: whatever stands at the temporary name (here a symbolic link planted with
    # the pid the writing shell has) is left alone, and the write fails instead of writing
    # through it
    op = uuid.uuid4().hex
    f, victim = tmp_path / "f", tmp_path / "victim"
    f.write_bytes(b"old")
    victim.write_bytes(b"victim")
    plant = 'ln -s "$V" "$D/.capybara-part-$$-$O"; exec /bin/sh "$@"'  # exec: same pid
    args = ["/bin/sh", "-c", plant, "x",
            *marked(S.inline_write_args(str(f), b"new", skills=False), op)]  # fmt: skip
    env = dict(os.environ, V=str(victim), D=str(tmp_path), O=op)
    r = subprocess.run(args, capture_output=True, timeout=30, env=env)
    assert r.returncode != 0 and b"File exists" in r.stderr, r
    assert (f.read_bytes(), victim.read_bytes()) == (b"old", b"victim")
    [planted] = parts_in(tmp_path)
    assert os.readlink(tmp_path / planted) == str(victim)


# -- reads of what is not a regular file -----------------------------------------------------


def test_read_probe_of_a_fifo_device_or_socket_ends_at_once(tmp_path: Path) -> None:
    fifo, sock = tmp_path / "fifo", tmp_path / "sock"
    os.mkfifo(fifo)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    try:
        for path, kind in [(fifo, "a FIFO"), (Path("/dev/null"), "a character device"),
                           (sock, "a socket")]:  # fmt: skip
            began = time.monotonic()
            r = subprocess.run(["/bin/sh", *S.read_probe_args(str(path), 100, 100)],
                               capture_output=True, timeout=10)  # fmt: skip
            assert time.monotonic() - began < 5
            assert (r.returncode, r.stdout) == (S.NOT_REGULAR_EXIT, b""), r
            reason = messages.script_reason(r.stderr.decode(), r.returncode)
            assert reason == f"cannot read {path}: it is {kind}, not a regular file"
            # stat keeps saying "file" (with its size), as the reference's STAT_SCRIPT does
            r = sh(S.stat_probe_args(str(path)))
            assert (r.returncode, r.stdout) == (0, b"0 file\n"), r
    finally:
        listener.close()


# -- in namespaces: user writes as ``sandbox``, root writes, cut and killed writes -------------


def _quiet_lines(text: str) -> List[str]:
    return text.split("\n")[:-1]


def _ns_check(tmp_path: Path, script: str, want: List[str], **env: str) -> None:
    """Run the shell text ``script`` (as root) in the namespace: it prints ``want`` (then
    the driver says ``rc=0``, and ``$REPORT`` may say more)."""
    with _ns_popen(["-c", script], _ns_env(tmp_path, **env)) as p:
        out, err = p.communicate(timeout=120)
    assert _quiet_lines(out.decode()) == want, err.decode()


#: Shell function ``w COMMAND...``: runs COMMAND and prints ``rc=<status> <what it said>``
#: (without the script's name), on one line.
_SAY = r"""
w() { o=$("$@" 2>&1 </dev/null); s=$?; echo "rc=$s ${o#capybara-*: }"; }
"""


def _cmd(*argv: str) -> str:
    """``w`` with ``argv`` quoted for the shell."""
    return "w " + " ".join(shlex.quote(a) for a in argv)


@needs_namespaces
def test_user_write_as_sandbox_refuses_what_it_may_not_write(tmp_path: Path) -> None:
    def write(path: str) -> str:
        args = marked(S.inline_write_args(path, b"pwned\n", skills=False))
        return _cmd("runuser", "-u", "sandbox", "--", "/bin/sh", *args)

    setup = (
        "echo root > /opt/work/ro; chmod 0644 /opt/work/ro; "
        "mkdir /opt/closed; echo mine > /opt/closed/f; chown sandbox: /opt/closed/f; "
        "ln -s /etc/passwd /opt/work/pw; chown -h sandbox: /opt/work/pw; "
        "echo mine > /opt/work/own; chown sandbox: /opt/work/own; chmod 0600 /opt/work/own; "
        "sha256sum /etc/passwd > /opt/pw.sum; echo shared > /tmp/shared; chmod 0666 /tmp/shared; "
        "echo mine > /tmp/mine; chown sandbox: /tmp/mine"
    )
    script = "\n".join([
        _SAY,
        write("/opt/work/ro"), write("/opt/closed/f"), write("/opt/work/pw"),
        write("/opt/work/own"), write("/opt/work/new/dir/f"), write("/tmp/shared"),
        write("/tmp/mine"),
        "cat /opt/work/ro /opt/closed/f /opt/work/own /tmp/shared /tmp/mine",
        'stat -c "%n %a %U" /opt/work/own /opt/work/new /opt/work/new/dir/f',
        "sha256sum -c --quiet /opt/pw.sum && echo passwd untouched",
        _LEFTOVERS,
    ])  # fmt: skip
    _ns_check(tmp_path, script, SETUP=setup, want=[
        "rc=1 cannot create /opt/work/ro: Permission denied",
        "rc=1 cannot replace /opt/closed/f: its directory /opt/closed is not writable: "
        "Permission denied",
        "rc=1 cannot create /opt/work/pw: Permission denied",
        "rc=0 ", "rc=0 ",
        "rc=1 cannot replace /tmp/shared: it belongs to another user in a sticky directory "
        "(/tmp), where only its owner may replace it: Permission denied",
        "rc=0 ",
        "root", "mine", "pwned", "shared", "pwned",
        "/opt/work/own 600 sandbox", "/opt/work/new 755 sandbox",
        "/opt/work/new/dir/f 644 sandbox",
        "passwd untouched",
        "leftovers",
        "rc=0",
    ])  # fmt: skip


#: Copies of /etc/shadow and /root in the namespace (the real ones are never at risk),
#: and a record of what /etc/passwd, /etc/shadow and /root hold.
_PROTECT = r"""
{ cat /etc/shadow 2>/dev/null || echo 'root:*:1::::::'; } > /opt/shadow
mount --bind /opt/shadow /etc/shadow
mount -t tmpfs -o mode=0700 tmpfs /root
echo "ssh-ed25519 AAAA root" > /root/authorized_keys
chmod 0600 /root/authorized_keys
fp() { stat -c "%n %a %U %s" /etc/passwd /etc/shadow /root /root/authorized_keys
       cat /etc/passwd /etc/shadow /root/authorized_keys | sha256sum; ls -A /root; }
fp > /opt/fp.before
"""
_UNTOUCHED = "fp > /opt/fp.after; cmp /opt/fp.before /opt/fp.after >&2 && echo untouched"


@needs_namespaces
@pytest.mark.parametrize("how", ["inline", "stream"])
def test_skills_writes_refuse_planted_links(tmp_path: Path, how: str) -> None:
    # /opt/skills stands for /skills (its parents, / and /opt, are root's and closed)
    def write(path: str) -> str:
        if how == "inline":
            args = marked(S.inline_write_args(path, b"pwned\n", skills=True))
        else:  # refused before it says "ready": no upload ever comes
            args = S.stream_write_args(path, "/opt/capybara/upload/fifo", True,
                                       uuid.uuid4().hex, size=6)  # fmt: skip
        return _cmd("/bin/sh", *args)

    planted = ("/opt/skills/a.md", "/opt/skills/b.md", "/opt/skills/r/authorized_keys")
    script = "\n".join([
        _SAY,
        # the sandbox user owns /skills and planted links in it
        "mkdir /opt/skills; ln -s /etc/passwd /opt/skills/a.md; ln -s /etc/shadow "
        "/opt/skills/b.md; ln -s /root /opt/skills/r; chown -h -R sandbox: /opt/skills",
        *[write(p) for p in planted],
        # root's, but anyone (or the group) may write it
        "chown -h -R root: /opt/skills; chmod 0777 /opt/skills",
        *[write(p) for p in planted],
        "chgrp sandbox /opt/skills; chmod 0775 /opt/skills",
        write("/opt/skills/a.md"),
        # root's and closed, but the links are still there
        "chgrp root /opt/skills; chmod 0755 /opt/skills",
        *[write(p) for p in planted],
        # a directory on the way that the user owns, even a missing one below it
        "mkdir /opt/skills/sub; chown sandbox: /opt/skills/sub",
        write("/opt/skills/sub/x.md"), write("/opt/skills/sub/new/x.md"),
        # /skills itself a link; a way out with ..; not a regular file
        "ln -s /etc /opt/skills2", write("/opt/skills2/passwd"),
        write("/opt/skills/../../etc/passwd"), write("opt/skills/x"),
        "mkdir /opt/skills/dir; mkfifo /opt/skills/fifo",
        write("/opt/skills/dir"), write("/opt/skills/fifo"), write("/opt/skills/"),
        "ls -A /opt/skills /opt/skills/sub | tr '\\n' ' '; echo",
        _LEFTOVERS,
    ])  # fmt: skip
    _ns_check(tmp_path, script, SETUP=_PROTECT, REPORT=_UNTOUCHED, want=[
        *["rc=80 /opt/skills is not owned by root"] * 3,
        *["rc=80 /opt/skills is writable by other users"] * 4,
        "rc=80 /opt/skills/a.md is a symbolic link",
        "rc=80 /opt/skills/b.md is a symbolic link",
        "rc=80 /opt/skills/r is a symbolic link",
        "rc=80 /opt/skills/sub is not owned by root",
        "rc=80 /opt/skills/sub is not owned by root",
        "rc=80 /opt/skills2 is a symbolic link",
        "rc=80 /opt/skills/../../etc/passwd has a . or .. component",
        "rc=80 opt/skills/x is not an absolute path",
        "rc=80 /opt/skills/dir is a directory",
        "rc=80 /opt/skills/fifo is not a regular file",
        "rc=80 /opt/skills/ names a directory",
        "/opt/skills: a.md b.md dir fifo r sub  /opt/skills/sub: ",
        "leftovers",
        "rc=0",
        "untouched",
    ])


@needs_namespaces
def test_skills_write_makes_parents_and_replaces_as_root_0644(tmp_path: Path) -> None:
    def write(path: str, data: bytes) -> str:
        return _cmd("/bin/sh", *marked(S.inline_write_args(path, data, skills=True)))

    script = "\n".join([
        _SAY, "umask 077",  # the modes are 0755 and 0644 whatever the umask
        write("/opt/skills/x/SKILL.md", b"# x\n"),
        # a file the user had there (root's directory, the user's file): replaced whole
        "echo old > /opt/skills/x/other.md; chown sandbox: /opt/skills/x/other.md; "
        "chmod 0600 /opt/skills/x/other.md",
        write("/opt/skills/x/other.md", b"new\n"),
        "cat /opt/skills/x/SKILL.md /opt/skills/x/other.md",
        'stat -c "%n %a %U" /opt/skills /opt/skills/x /opt/skills/x/SKILL.md '
        "/opt/skills/x/other.md",
        'stat -c "%n %a %U" /opt/capybara/upload/parts',
        _LEFTOVERS,
    ])  # fmt: skip
    _ns_check(tmp_path, script, want=[
        "rc=0 ", "rc=0 ", "# x", "new",
        "/opt/skills 755 root", "/opt/skills/x 755 root", "/opt/skills/x/SKILL.md 644 root",
        "/opt/skills/x/other.md 644 root",
        "/opt/capybara/upload/parts 700 root",
        "leftovers",
        "rc=0",
    ])  # fmt: skip


@needs_namespaces
@pytest.mark.parametrize("skills", [True, False])
def test_a_cut_stream_write_leaves_the_old_file(tmp_path: Path, skills: bool) -> None:
    # the upload stops half-way (the POST was cut or cancelled: envd closes the FIFO):
    # the temporary file is dropped, never renamed into place
    data = os.urandom(300000)
    fifo = tmp_path / "fifo"
    target = "/opt/skills/f" if skills else "/opt/work/f"
    setup = (
        "mkdir -p /opt/skills; echo old > /opt/skills/f; echo old > /opt/work/f; "
        "chown sandbox: /opt/work/f"
    )
    report = 'cat "$T"; ' + _LEFTOVERS
    args = S.stream_write_args(target, str(fifo), skills, uuid.uuid4().hex, size=len(data))
    env = _ns_env(tmp_path, SETUP=setup, REPORT=report, T=target)
    out, err = _streamed(args, env, fifo, data[: len(data) // 2])
    assert _quiet_lines(out.decode()) == ["open", "rc=1", "old", "leftovers"], err
    reason = messages.script_reason(err.decode(), 1)
    assert reason == (f"the upload was incomplete (150000 of 300000 bytes arrived); {target} "
                      "was left unchanged")  # fmt: skip


#: Starts the streamed write ``$W0 ... $W7`` in the background and waits until ``$HALF``
#: bytes of it are in its temporary file.
_HALF_WRITTEN = r"""
mkdir -p /opt/work/d; echo old > /opt/work/d/f; chown -R sandbox: /opt/work/d
/bin/sh "$W0" "$W1" "$W2" "$W3" "$W4" "$W5" "$W6" "$W7" > /opt/writer.out 2>&1 &
half() { [ "$(cat /opt/work/d/.capybara-part-* 2>/dev/null | wc -c)" -ge "$HALF" ]; }
until_ half
half
ls -A /tmp/.capybara-parts-sandbox | sed 's/^[0-9]*-/entry <pid>-/'
"""


@needs_namespaces
@pytest.mark.parametrize("how", ["cleanup", "sigkill"])
def test_a_killed_writer_leaves_the_old_file_and_the_cleanup_its_part(
    tmp_path: Path, how: str
) -> None:
    # the writer dies half-way: killed with its operation by the clean-up of that
    # operation, or SIGKILLed alone (then the sweep of all operations finds its part by its
    # writer's pid, which is no longer alive)
    data = os.urandom(200000)
    fifo = tmp_path / "fifo"
    op = uuid.uuid4().hex
    args = S.stream_write_args("/opt/work/d/f", str(fifo), False, op, size=len(data))
    if how == "cleanup":
        cleanup, kill = S.fileop_cleanup_args(op, str(fifo)), ":"
    else:
        cleanup = S.fileop_cleanup_args("")
        kill = (f'pkill -9 -u sandbox -f "{S.fileop_name(op)}"; '
                'until_ "! pgrep -u sandbox sh >/dev/null"')
    env = _ns_env(
        tmp_path, SETUP=_HALF_WRITTEN + kill, HALF=str(len(data) // 2),
        REPORT="cat /opt/work/d/f; ls -A /opt/work/d; " + _LEFTOVERS,
        **{f"W{i}": a for i, a in enumerate(args)},
    )  # fmt: skip
    with _ns_popen(cleanup, env) as p:
        fd = _open_writer(fifo)
        try:
            os.write(fd, data[: len(data) // 2])  # and no more: the writer waits for the rest
            out, err = p.communicate(timeout=60)
        finally:
            os.close(fd)
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert _quiet_lines(out.decode()) == [f"entry <pid>-{op}", "rc=0", "old", "f", "leftovers"], err


#: Registries as a hostile sandbox user may leave them (``$OP``: the operation cleaned up;
#: ``$X``: another one; pids 9000x: writers long gone; ``$L``: a writer still alive).
_HOSTILE_REGISTRIES = r"""
echo victim > /opt/victim; echo precious > /opt/precious
runuser -u sandbox -- /bin/sh -c '
R=/tmp/.capybara-parts-sandbox; W=/opt/work; P=.capybara-part-
mkdir -m 0700 $R
echo x > $W/${P}90001-$OP; ln -s $W/${P}90001-$OP $R/90001-$OP
ln -s /opt/victim $R/90002-$OP
echo x > $W/${P}999-$OP; ln -s $W/${P}999-$OP $R/90003-$OP
ln -s /opt/precious $W/${P}90004-$OP; ln -s $W/${P}90004-$OP $R/90004-$OP
echo x > $W/${P}90005-$X; ln -s $W/${P}90005-$X $R/90005-$X
ln -s work/${P}90006-$OP $R/90006-$OP
mkdir $R/90007-$OP
ln -s $W/${P}90010-$OP "$R/90010-$OP-x"
mkdir /opt/work/evil; echo x > $W/${P}90008-$OP; ln -s $W/${P}90008-$OP $W/evil/90008-$OP
ln -s /opt/work/evil /tmp/.capybara-parts-evil
'
mkdir -m 0700 /opt/capybara/upload/parts; mkdir /opt/sk
echo x > /opt/sk/.capybara-part-90009-$OP
ln -s /opt/sk/.capybara-part-90009-$OP /opt/capybara/upload/parts/90009-$OP
sleep 300 & L=$!
echo x > /opt/work/.capybara-part-$L-$X
ln -s /opt/work/.capybara-part-$L-$X /tmp/.capybara-parts-sandbox/$L-$X
"""
_HOSTILE_REPORT = r"""
cat /opt/victim /opt/precious
find /opt/work /opt/sk /tmp/.capybara-parts-sandbox /opt/capybara/upload/parts -mindepth 1 \
  | sed "s/$OP/OP/; s/$X/X/; s/$L-/LIVE-/" | sort
"""


@needs_namespaces
@pytest.mark.parametrize("which", ["op", "all"])
def test_cleanup_removes_only_registered_parts(tmp_path: Path, which: str) -> None:
    # only a file named exactly .capybara-part-<pid>-<hex> after its registry entry goes;
    # a symbolic link there is removed, never what it points to; a registry that is a
    # symbolic link is not read; for all operations, only writers no longer alive
    op, x = uuid.uuid4().hex, uuid.uuid4().hex
    args = S.fileop_cleanup_args(op if which == "op" else "")
    env = _ns_env(tmp_path, SETUP=_HOSTILE_REGISTRIES, REPORT=_HOSTILE_REPORT, OP=op, X=x)
    with _ns_popen(args, env) as p:
        out, err = p.communicate(timeout=60)
    other = (["/opt/work/.capybara-part-90005-X", "/tmp/.capybara-parts-sandbox/90005-X"]
             if which == "op" else [])  # fmt: skip
    assert _quiet_lines(out.decode()) == ["rc=0", "victim", "precious", *sorted([
        "/opt/work/.capybara-part-90008-OP",  # named by a registry that is a link: kept
        "/opt/work/.capybara-part-999-OP",  # not the name its entry gives: kept
        "/opt/work/.capybara-part-LIVE-X",  # its writer is alive
        *other,  # another operation's (the sweep of all: a writer long gone)
        "/opt/work/evil", "/opt/work/evil/90008-OP",
        "/tmp/.capybara-parts-sandbox/90007-OP",  # not a symbolic link
        "/tmp/.capybara-parts-sandbox/90010-OP-x",  # not <pid>-<hex>
        "/tmp/.capybara-parts-sandbox/LIVE-X",
    ])], err  # fmt: skip


@needs_namespaces
@pytest.mark.parametrize("skills", [True, False])
def test_a_stream_write_stopped_before_its_upload_removes_its_fifo(
    tmp_path: Path, skills: bool
) -> None:
    # no upload ever came (its client died first): timeout's SIGTERM ends the script, which
    # removes its FIFO itself; nothing is staged or left half-written
    fifo = tmp_path / "fifo"
    target = "/opt/skills/f" if skills else "/opt/work/f"
    setup = "mkdir -p /opt/skills; echo old > /opt/skills/f; echo old > /opt/work/f"
    report = 'cat "$T"; [ -e "$F" ] && echo "fifo left"; ' + _LEFTOVERS
    args = S.stream_write_args(target, str(fifo), skills, uuid.uuid4().hex, size=10)
    env = _ns_env(tmp_path, SETUP=setup, REPORT=report, T=target, F=str(fifo))
    # as the provider runs it: under "timeout -k 5 <bound>" (SIGTERM first)
    with _ns_popen(["-c", 'exec timeout -k 5 1 /bin/sh "$@"', "sh", *args], env) as p:
        out, err = p.communicate(timeout=30)
    assert _quiet_lines(out.decode()) == ["ready", "rc=124", "old", "leftovers"], err


@needs_namespaces
def test_a_settled_cleanup_lets_a_late_upload_fail_and_leaves_nothing(tmp_path: Path) -> None:
    # the clean-up of an upload cut before envd opened the FIFO holds it open a moment: a
    # writer that opens it meanwhile (envd, late) succeeds at once, then its writes fail
    # once the clean-up closed it; the name is gone and no regular file took its place
    fifo = tmp_path / "fifo"
    setup = f'mkfifo -m 0600 "{fifo}"; ' + (
        '( trap "" PIPE; sleep 0.2; exec 4>"$F"; echo opened; sleep 1; '
        'if printf x >&4 2>/dev/null; then echo wrote; else echo refused; fi ) &'
    )
    report = 'wait; [ -e "$F" ] && echo "fifo left"; echo left $(ls -A /opt/capybara/upload)'
    args = S.fileop_cleanup_args(uuid.uuid4().hex, str(fifo), settle=True)
    env = _ns_env(tmp_path, SETUP=setup, REPORT=report, F=str(fifo))
    with _ns_popen(args, env) as p:
        out, err = p.communicate(timeout=30)
    assert _quiet_lines(out.decode()) == ["opened", "rc=0", "refused",
                                          "left keepdir new old"], err
