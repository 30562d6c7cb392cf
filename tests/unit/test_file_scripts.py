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
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import IO, Dict, List

import pytest

from e2b_provider import InvalidArgument
from e2b_provider import _messages as messages
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


def test_inline_write_as_the_user_keeps_the_umask_and_skills_are_0644(tmp_path: Path) -> None:
    # the user's write leaves modes to the user's umask (as the reference's USER_WRITE_SCRIPT);
    # only a /skills write is made 0644 for everyone
    user, skills = tmp_path / "u" / "f", tmp_path / "s" / "f"
    old = os.umask(0o077)
    try:
        assert sh(S.inline_write_args(str(user), b"u", skills=False)).returncode == 0
        assert sh(S.inline_write_args(str(skills), b"s", skills=True)).returncode == 0
    finally:
        os.umask(old)
    assert (user.read_bytes(), user.stat().st_mode & 0o777) == (b"u", 0o600)
    assert (skills.read_bytes(), skills.stat().st_mode & 0o777) == (b"s", 0o644)


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

#: Gives the namespace a tmpfs on /opt and a ``sandbox`` user, then runs ``$SETUP``, the
#: script under test (``/bin/sh "$@"``) and ``$REPORT``. ``until_ CONDITION`` waits (at most
#: ~10 s) for a shell condition: what a script leaves to run on (a background job, a kill
#: signal on its way) settles a moment after it exits.
_NS_DRIVER = r"""
until_() { i=0; while ! eval "$1" && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; }
set -e
mount -t tmpfs tmpfs /opt
mount --bind "$PW" /etc/passwd
mount --bind "$GR" /etc/group
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
    env = dict(os.environ, PW=str(pw), GR=str(gr), SETUP=":", REPORT=":")
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


_STREAM_REPORT = (
    'stat -c "upload %a %U" /opt/capybara/upload; echo left $(ls -A /opt/capybara/upload); '
    'stat -c "target %a %U %s" "$T"; cmp -s "$T" "$EXPECT" && echo same; '
    # the FIFO's name is removed by a background job once the FIFO is open
    'until_ \'[ ! -p "$F" ]\'; if [ -p "$F" ]; then echo "fifo left"; else echo "fifo gone"; fi'
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
        args = S.stream_write_args(target, str(fifo), True, op)
        setup = "chmod 0755 /opt/capybara/upload"
        want = ["upload 700 root", "left keepdir new", f"target 644 root {len(data)}", "same",
                "fifo gone"]  # fmt: skip
    else:
        # a later one: the staging directory is left alone; written as the sandbox user
        target = "/opt/work/x/f.bin"
        args = S.stream_write_args(target, str(fifo), False, op, prepare=False)
        setup = "chmod 0700 /opt/capybara/upload"
        want = ["upload 700 root", "left keepdir new old", f"target 644 sandbox {len(data)}",
                "same", "fifo gone"]  # fmt: skip
    env = _ns_env(tmp_path, SETUP=f"umask 022; {setup}", REPORT=_STREAM_REPORT, T=target,
                  EXPECT=str(expect), F=str(fifo))  # fmt: skip
    with _ns_popen(args, env) as p:
        try:
            assert p.stdout is not None
            assert _first_line(p.stdout) == b"ready\n", p.stderr
            fd = _open_writer(fifo)
            try:
                os.write(fd, data)  # far more than a pipe holds: the script reads as it comes
            finally:
                os.close(fd)
            out, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert out.decode().split("\n")[:-1] == ["rc=0", *want], err


def test_stream_write_names_the_operation(tmp_path: Path) -> None:
    # its $0 is the marked name the clean-up finds the operation by
    op = uuid.uuid4().hex
    args = S.stream_write_args("/opt/work/f", str(tmp_path / "fifo"), False, op)
    assert args[:2] == ["-c", S.STREAM_WRITE_SCRIPT] and args[2] == S.fileop_name(op)


#: Two marked file operations, each a shell with two children, then the clean-up.
_CLEANUP_SETUP = r"""
start() { bash -c 'exec -a "$0" sh -c "sleep 300 & sleep 300 & wait"' "capybara-file""op-$1" & }
start "$A"; start "$B"
i=0; while [ "$(pgrep -c -x sleep)" -lt 4 ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done
mkfifo -m 0600 "$F"
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
        ("a", {"fifo": True}, ["a=0 b=1 sleeps=2", "gone", "left keepdir new old"]),
        # ... blocked: a root-only directory takes the FIFO's place
        ("a", {"fifo": True, "block": True},
         ["a=0 b=1 sleeps=2", "dir 700", "left keepdir new old"]),
        # all of them, and every file (not directory) staged
        ("", {}, ["a=0 b=0 sleeps=0", "fifo", "left keepdir"]),
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
