"""The sandbox-side file agent (``sandbox_side/file_agent.py``), run here as a real program.

It is started exactly as the provider starts it in a sandbox (``python3 -I -S -X utf8 -c
<its text> MODE ARGS...``) and spoken to over pipes with the library's own protocol code
(:func:`encode_request`, :class:`FrameDecoder`). Most tests run twice:

* ``root``: as root, in a private mount namespace with a tmpfs on ``/opt`` (root's registry
  of temporary files is ``/opt/capybara/upload/parts``: this host's is never touched);
* ``user``: as a user of its own (a uid no account has, through ``setpriv``), in a
  directory it owns; its registry is ``/tmp/.capybara-parts-$USER`` with a ``$USER`` of
  this test's own. Without root, the test's own user plays this part.

Every wait is bounded; nothing sleeps for "long enough".
"""

from __future__ import annotations

import base64
import errno
import glob
import io
import json
import os
import pwd
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
import zlib
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from waiting import wait_until

from e2b_provider.core.file_agents import CARRIED_ENV, serve_program
from e2b_provider.errors import ProtocolError
from e2b_provider.files.local_extract import extract_stream
from e2b_provider.files.tar_codec import tar_stream
from e2b_provider.files.upload_plan import plan_upload
from e2b_provider.protocol.agent_frames import AGENT_VERSION, Frame, FrameDecoder, encode_request
from e2b_provider.sandbox_side import file_agent, source

AGENT = source("file_agent")
PART = ".capybara-part-"
END = ".capybara-end-" + "ab" * 16
IS_ROOT = os.geteuid() == 0
#: The agent runs on the sandbox's python3; here the system's, which any user may run.
SYSTEM_PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
#: The oldest Python the agent claims to run on, when this machine has one.
OLD_PYS = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.6*/bin/python3.6")))
MTIME = 1_600_000_000

#: Root's agents run with a tmpfs of their own on /opt (and a staging directory in it).
_ROOT_NS = ('mount -t tmpfs -o mode=0755 tmpfs /opt && mkdir -p -m 0700 /opt/capybara/upload '
            '&& exec "$@"')  # fmt: skip


def _can_unshare() -> bool:
    if not IS_ROOT or not shutil.which("unshare") or not shutil.which("setpriv"):
        return False
    r = subprocess.run(["unshare", "-m", "--", "/bin/sh", "-c", _ROOT_NS, "ns", "true"],
                       capture_output=True, timeout=10)  # fmt: skip
    return r.returncode == 0


CAN_UNSHARE = _can_unshare()
needs_root_ns = pytest.mark.skipif(not CAN_UNSHARE, reason="needs root and `unshare -m`")


def _free_uid() -> int:
    for uid in range(42000 + os.getpid() % 500, 43000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("no free uid")


OTHER_UID = _free_uid() if IS_ROOT else os.getuid()


@attrs.define
class Who:
    """Whom the agent runs as, and the directory of theirs the test works in."""

    kind: str
    uid: int
    env: Dict[str, str]
    prefix: List[str]
    work: Path
    python: str = SYSTEM_PY
    registry: Optional[Path] = None

    def argv(self, *args: str) -> List[str]:
        return [*self.prefix, self.python, "-I", "-S", "-X", "utf8", "-c", AGENT, *args]

    def run(self, *args: str, data: bytes = b"", umask: int = 0o022,
            timeout: float = 30.0) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
        return subprocess.run(self.argv(*args), input=data, capture_output=True, env=self.env,
                              timeout=timeout, umask=umask, cwd="/")  # fmt: skip

    def own(self, *paths: Path) -> None:
        """Give ``paths`` (and what is under a directory) to the user."""
        if not IS_ROOT:
            return
        for top in paths:
            os.lchown(top, self.uid, self.uid)
            if top.is_dir() and not top.is_symlink():
                for dirpath, dirnames, filenames in os.walk(top):
                    for n in dirnames + filenames:
                        os.lchown(os.path.join(dirpath, n), self.uid, self.uid)


def foreign(path: Path, mode: int) -> None:
    """Make ``path`` another user's with ``mode`` (without root: our own, mode 0 for a
    directory and for a file readable by nobody, 0444 otherwise)."""
    if IS_ROOT:
        os.lchown(path, 0, 0)
        os.chmod(path, mode)
    else:
        os.chmod(path, 0o444 if mode & 0o044 and not path.is_dir() else 0)


def _force_rmtree(path: Path) -> None:
    if not os.path.lexists(path):
        return
    if not path.is_symlink() and path.is_dir():
        for dirpath, dirnames, _ in os.walk(path):
            for n in dirnames:
                p = os.path.join(dirpath, n)
                if not os.path.islink(p):
                    os.chmod(p, 0o700)
        os.chmod(path, 0o700)
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _make_who(kind: str) -> Who:
    name = f"capytest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "USER": name, "LC_ALL": "C.UTF-8"}
    work = Path(tempfile.mkdtemp(prefix="capytest-agent-", dir="/tmp"))
    if kind == "root":
        return Who("root", 0, env, ["unshare", "-m", "--", "/bin/sh", "-c", _ROOT_NS, "ns"],
                   work)  # fmt: skip
    prefix: List[str] = []
    if IS_ROOT:
        os.chown(work, OTHER_UID, OTHER_UID)
        prefix = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
                  "--"]  # fmt: skip
    return Who("user", OTHER_UID, env, prefix, work,
               registry=Path("/tmp/.capybara-parts-" + name))  # fmt: skip


def _who_fixture(kind: str) -> Iterator[Who]:
    if kind == "root" and not CAN_UNSHARE:
        pytest.skip("needs root and `unshare -m`")
    if kind == "user" and IS_ROOT and not shutil.which("setpriv"):
        pytest.skip("needs setpriv")
    who = _make_who(kind)
    try:
        yield who
    finally:
        _force_rmtree(who.work)
        if who.registry is not None:
            _force_rmtree(who.registry)


@pytest.fixture(params=["root", "user"])
def who(request: pytest.FixtureRequest) -> Iterator[Who]:
    yield from _who_fixture(request.param)


@pytest.fixture
def user() -> Iterator[Who]:
    yield from _who_fixture("user")


@pytest.fixture
def root() -> Iterator[Who]:
    yield from _who_fixture("root")


# -- a client ---------------------------------------------------------------------------------


class Agent:
    """One ``serve`` process and a client for it."""

    def __init__(self, who: Who, idle: float = 60.0, umask: int = 0o022,
                 prefix: Sequence[str] = (), carried: str = "",
                 program: str = AGENT) -> None:  # fmt: skip
        self.who = who
        env = dict(who.env, **({CARRIED_ENV: carried} if carried else {}))
        argv = [a if a != AGENT else program for a in who.argv("serve", repr(idle), "capytest")]
        self.proc = subprocess.Popen(
            [*prefix, *argv],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, umask=umask, cwd="/",
        )  # fmt: skip
        self._decoder = FrameDecoder()
        self._got: Dict[int, List[Frame]] = {}
        self._next = 2 if carried else 1
        if carried:  # the ready frame may be all it writes (a malformed carried request)
            self.ready: Dict[str, Any] = {}
            return
        [ready] = self.frames(0, timeout=30)
        self.ready = ready.answer

    def send(self, op: str, payload: bytes = b"", **fields: Any) -> int:
        rid = self._next
        self._next += 1
        self.send_raw(encode_request(rid, op, fields, payload))
        return rid

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def pump(self, timeout: float) -> bool:
        """Read what the agent wrote (at most ``timeout`` seconds); False at its end."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
        if not ready:
            return True
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return False
        for f in self._decoder.feed(chunk):
            self._got.setdefault(f.id, []).append(f)
        return True

    def frames(self, rid: int, timeout: float = 10.0) -> List[Frame]:
        """Every frame of the answer to ``rid`` (bounded)."""
        deadline = time.monotonic() + timeout
        while not (self._got.get(rid) and self._got[rid][-1].last):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no whole answer to request {rid} in {timeout} s")
            if not self.pump(left):
                raise AssertionError(f"the agent ended before answering {rid}: "
                                     f"{self.stderr_after_exit()!r}")  # fmt: skip
        return self._got.pop(rid)

    def call(self, op: str, payload: bytes = b"", timeout: float = 10.0,
             **fields: Any) -> Tuple[Dict[str, Any], bytes]:  # fmt: skip
        [f] = self.frames(self.send(op, payload, **fields), timeout)
        assert f.last
        return f.answer, f.data

    def registry(self) -> Path:
        """The registry as the agent sees it (root's: inside its namespace)."""
        if self.who.registry is not None:
            return self.who.registry
        return Path(f"/proc/{self.proc.pid}/root/opt/capybara/upload/parts")

    def registered(self) -> List[str]:
        reg = self.registry()
        return sorted(os.listdir(reg)) if reg.is_dir() else []

    def close(self, timeout: float = 10.0) -> int:
        """Close its standard input; its exit status (bounded)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        return self.proc.wait(timeout=timeout)

    def stderr_after_exit(self) -> bytes:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return b"(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


@pytest.fixture
def start() -> Iterator[Any]:
    """``start(who, **kw) -> Agent``; every agent is killed after the test."""
    agents: List[Agent] = []

    def make(who: Who, **kw: Any) -> Agent:
        a = Agent(who, **kw)
        agents.append(a)
        return a

    yield make
    for a in agents:
        a.kill()


def leftovers(*roots: Path) -> List[str]:
    """Temporary files of the agent anywhere under ``roots``."""
    out = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            out += [os.path.join(dirpath, n) for n in dirnames + filenames if n.startswith(PART)]
    return out


def put(who: Who, path: Path, data: bytes, mode: int = 0o644) -> Path:
    """A file of the user's (with the directories made for it)."""
    made = [p for p in path.parents if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)
    for p in [path, *made]:
        who.own(p)
    return path


# -- ready, ping, stat ------------------------------------------------------------------------


def test_ready_frame_ping_and_unknown_operations(who: Who, start: Any) -> None:
    a = start(who)
    assert a.ready == {"ready": True, "version": AGENT_VERSION, "pid": a.proc.pid,
                       "uid": who.uid}  # fmt: skip
    assert a.call("ping") == ({"pong": True}, b"")
    answer, _ = a.call("frobnicate")
    assert answer["error"] == "EINVAL" and "frobnicate" in answer["message"]
    # a request without what its operation needs: an error answer, the server goes on
    answer, _ = a.call("stat")
    assert answer["error"] == "EIO" and "KeyError" in answer["message"]
    assert a.call("ping") == ({"pong": True}, b"")
    assert a.close() == 0


def test_stat_of_files_directories_and_what_is_not_there(who: Who, start: Any) -> None:
    w = who.work
    f = put(who, w / "f", b"12345", 0o640)
    os.utime(f, (MTIME, MTIME + 0.5))
    (w / "dangling").symlink_to(w / "nowhere")
    (w / "tofile").symlink_to("f")
    os.mkfifo(w / "fifo")
    a = start(who)
    assert a.call("stat", path=str(f))[0] == {"kind": "file", "size": 5, "mode": 0o640,
                                              "mtime": MTIME + 0.5}  # fmt: skip
    d = a.call("stat", path=str(w))[0]
    assert (d["kind"], d["mode"]) == ("dir", 0o700)
    assert a.call("stat", path=str(w / "tofile"))[0]["kind"] == "file"  # followed
    fifo = a.call("stat", path=str(w / "fifo"))[0]
    assert (fifo["kind"], fifo["type"]) == ("other", "a FIFO")
    assert a.call("stat", path="/dev/null")[0]["type"] == "a character device"
    for missing in (w / "nowhere", w / "dangling", f / "below-a-file", w / "a" / "b" / "c"):
        assert a.call("stat", path=str(missing))[0] == {"missing": True}, missing


def test_a_path_behind_a_directory_the_user_may_not_enter(user: Who, start: Any) -> None:
    w = user.work
    closed = w / "closed"
    put(user, closed / "x", b"secret")
    (closed / "sub").mkdir()
    foreign(closed, 0o700)
    a = start(user)
    for op, extra in (("stat", {}), ("read", {"max": 10}), ("list", {})):
        for path in (closed / "x", closed / "sub" / "deeper", closed / "none"):
            assert a.call(op, path=str(path), **extra)[0] == {"noentry": str(closed)}, (op, path)
    # the directory itself can be examined, not listed
    assert a.call("stat", path=str(closed))[0]["kind"] == "dir"
    assert a.call("list", path=str(closed))[0]["error"] == "EACCES"
    answer, _ = a.call("write", b"x", path=str(closed / "x"))
    assert answer["results"][0]["error"] == "EACCES"


# -- read ------------------------------------------------------------------------------------


def test_read_caps_announces_large_files_and_names_what_is_not_a_file(
    who: Who, start: Any
) -> None:
    w = who.work
    data = bytes(range(256)) * 8
    f = put(who, w / "f", data)
    os.mkfifo(w / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(w / "sock"))
    a = start(who)
    try:
        assert a.call("read", path=str(f), max=10) == ({"kind": "file", "size": 2048},
                                                       data[:10])  # fmt: skip
        assert a.call("read", path=str(f), max=5000) == ({"kind": "file", "size": 2048}, data)
        assert a.call("read", path=str(f), max=0) == ({"kind": "file", "size": 2048}, b"")
        # larger than `large`, and more asked for: only announced
        assert a.call("read", path=str(f), max=5000, large=100) == (
            {"kind": "file", "size": 2048, "large": True}, b"")  # fmt: skip
        # not more asked for than `large`, or not larger than it: read
        assert a.call("read", path=str(f), max=100, large=100)[1] == data[:100]
        assert a.call("read", path=str(f), max=5000, large=2048)[1] == data
        assert a.call("read", path=str(w), max=10) == ({"kind": "dir"}, b"")
        # neither blocks: answered at once
        for path, kind in ((w / "fifo", "a FIFO"), (w / "sock", "a socket"),
                           (Path("/dev/null"), "a character device"),
                           (Path("/dev/zero"), "a character device")):  # fmt: skip
            began = time.monotonic()
            assert a.call("read", path=str(path), max=100, timeout=5) == (
                {"kind": "other", "type": kind}, b""), path  # fmt: skip
            assert time.monotonic() - began < 5
        assert a.call("read", path=str(w / "none"), max=10) == ({"missing": True}, b"")
        # read_many: one frame per path (numbered), then the count
        frames = a.frames(a.send("read_many", paths=[str(f), str(w / "none"), str(w / "fifo"),
                                                     str(w)], max=4))  # fmt: skip
        assert [(fr.last, fr.answer, fr.data) for fr in frames] == [
            (False, {"kind": "file", "size": 2048, "i": 0}, data[:4]),
            (False, {"missing": True, "i": 1}, b""),
            (False, {"kind": "other", "type": "a FIFO", "i": 2}, b""),
            (False, {"kind": "dir", "i": 3}, b""),
            (True, {"count": 4}, b""),
        ]
    finally:
        sock.close()


def test_read_of_a_file_the_user_may_not_read(user: Who, start: Any) -> None:
    f = put(user, user.work / "f", b"secret")
    foreign(f, 0o600)
    a = start(user)
    answer, data = a.call("read", path=str(f), max=100)
    assert (answer["error"], answer["path"], data) == ("EACCES", str(f), b"")


# -- write -----------------------------------------------------------------------------------


def test_write_is_atomic_makes_parents_and_keeps_modes(who: Who, start: Any) -> None:
    w = who.work
    a = start(who, umask=0o027)
    new = w / "a" / "b" / "new.bin"
    payload = os.urandom(300_000)
    assert a.call("write", payload, path=str(new))[0] == {"results": [{"ok": True}]}
    assert new.read_bytes() == payload
    assert stat.S_IMODE(new.stat().st_mode) == 0o640  # 0666 & ~umask
    assert new.stat().st_uid == who.uid
    assert a.registry().is_dir()  # made by the write, to record its temporary file
    # an overwrite keeps the old mode, whatever the umask
    old = put(who, w / "old", b"old content", 0o600)
    assert a.call("write", b"new", path=str(old))[0] == {"results": [{"ok": True}]}
    assert (old.read_bytes(), stat.S_IMODE(old.stat().st_mode)) == (b"new", 0o600)
    put(who, w / "exe", b"#!", 0o755)
    a.call("write", b"#!/bin/sh", path=str(w / "exe"))
    assert stat.S_IMODE((w / "exe").stat().st_mode) == 0o755
    assert a.call("write", b"", path=str(old))[0] == {"results": [{"ok": True}]}
    assert old.read_bytes() == b""
    assert leftovers(w) == [] and a.registered() == []


def test_write_through_a_symbolic_link_replaces_its_target(who: Who, start: Any) -> None:
    w = who.work
    far = put(who, w / "d" / "far", b"far", 0o604)
    (w / "link").symlink_to(far)
    (w / "rel").symlink_to("d/far")
    (w / "dangling").symlink_to("d/new")
    who.own(w / "d", w / "link", w / "rel", w / "dangling")
    a = start(who)
    for link, data in ((w / "link", b"via absolute"), (w / "rel", b"via relative")):
        assert a.call("write", data, path=str(link))[0] == {"results": [{"ok": True}]}
        assert link.is_symlink()
        assert (far.read_bytes(), stat.S_IMODE(far.stat().st_mode)) == (data, 0o604)
    assert os.readlink(w / "rel") == "d/far"
    # a dangling link: the file it names is made
    assert a.call("write", b"n", path=str(w / "dangling"))[0] == {"results": [{"ok": True}]}
    assert (w / "dangling").is_symlink() and (w / "d" / "new").read_bytes() == b"n"
    assert leftovers(w) == [] and a.registered() == []


def test_write_refuses_a_directory_and_a_fifo_at_once(who: Who, start: Any) -> None:
    w = who.work
    (w / "dir").mkdir()
    os.mkfifo(w / "fifo")
    (w / "to-fifo").symlink_to("fifo")
    who.own(w / "dir", w / "fifo", w / "to-fifo")
    a = start(who)
    for path, error in ((w / "dir", "EISDIR"), (f"{w}/newdir/", "EISDIR"),
                        (w / "fifo", "EINVAL"), (w / "to-fifo", "EINVAL")):  # fmt: skip
        began = time.monotonic()
        answer, _ = a.call("write", b"data", path=str(path), timeout=5)
        assert time.monotonic() - began < 5
        [result] = answer["results"]
        assert (result["error"], result["path"]) == (error, str(path)), result
        if error == "EINVAL":
            assert "a FIFO" in result["message"]
    assert stat.S_ISFIFO(os.lstat(w / "fifo").st_mode) and (w / "dir").is_dir()
    # nothing was written into the FIFO
    fd = os.open(w / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert os.read(fd, 100) == b""
    finally:
        os.close(fd)
    assert not (w / "newdir").exists()
    assert leftovers(w) == [] and a.registered() == []


def test_write_refuses_a_file_the_user_may_not_write(user: Who, start: Any) -> None:
    w = user.work
    ro = put(user, w / "ro", b"root's", 0o644)
    foreign(ro, 0o644)
    a = start(user)
    [result] = a.call("write", b"pwned", path=str(ro))[0]["results"]
    assert (result["error"], result["path"]) == ("EACCES", str(ro))
    assert ro.read_bytes() == b"root's"
    assert leftovers(w) == [] and a.registered() == []


def test_a_failed_write_leaves_the_old_file_and_nothing_else(user: Who, start: Any) -> None:
    # past the file size limit: EFBIG half-way through (Python ignores SIGXFSZ)
    if not shutil.which("prlimit"):
        pytest.skip("needs prlimit")
    w = user.work
    f = put(user, w / "f", b"old")
    a = start(user, prefix=["prlimit", "--fsize=65536", "--"])
    [result] = a.call("write", b"x" * 200_000, path=str(f))[0]["results"]
    assert result["error"] == "EFBIG"
    assert f.read_bytes() == b"old"
    assert leftovers(w) == [] and a.registered() == []


def test_concurrent_writes_of_one_path_leave_exactly_one_payload(who: Who, start: Any) -> None:
    w = who.work
    target = put(who, w / "f", b"old")
    payloads = [bytes([65 + i]) * (100_000 + 7919 * i) for i in range(16)]
    seen = set()
    stop = threading.Event()

    def watch() -> None:  # every reader sees a whole payload, never a mix
        while not stop.is_set():
            seen.add(target.read_bytes())

    reader = threading.Thread(target=watch)
    reader.start()
    a = start(who)
    try:
        rids = [a.send("write", p, path=str(target)) for p in payloads]  # all in flight
        for rid in rids:
            [fr] = a.frames(rid, timeout=30)
            assert fr.answer == {"results": [{"ok": True}]}
    finally:
        stop.set()
        reader.join(timeout=30)
    assert target.read_bytes() in payloads
    assert seen <= {b"old", *payloads}
    assert leftovers(w) == [] and a.registered() == []


def test_write_many_reports_only_the_path_that_failed(who: Who, start: Any) -> None:
    w = who.work
    (w / "dir").mkdir()
    who.own(w / "dir")
    a = start(who)
    files = [(w / "x" / "one", b"first"), (w / "dir", b"refused"), (w / "two", b"second!")]
    answer, _ = a.call("write_many", b"".join(d for _, d in files),
                       files=[{"path": str(p), "len": len(d)} for p, d in files])  # fmt: skip
    ok, bad, ok2 = answer["results"]
    assert ok == ok2 == {"ok": True}
    assert (bad["error"], bad["path"]) == ("EISDIR", str(w / "dir"))
    assert (w / "x" / "one").read_bytes() == b"first"
    assert (w / "two").read_bytes() == b"second!"  # the payload after the failed one
    assert leftovers(w) == [] and a.registered() == []


# -- withdrawn requests -----------------------------------------------------------------------


def test_a_request_withdrawn_before_it_arrives_is_answered_once_and_never_run(
    who: Who, start: Any
) -> None:
    w = who.work
    a = start(who)
    rid = a._next  # the id the next request will carry
    a._next += 1  # reserved
    a.send("cancel", of=rid)
    [f] = a.frames(rid)
    assert f.last and f.answer == {"cancelled": True}
    # the request itself comes later (its SendInput was slower): it is dropped unanswered
    a.send_raw(encode_request(rid, "write", {"path": str(w / "never")}, b"data"))
    assert a.call("ping") == ({"pong": True}, b"")
    assert not (w / "never").exists() and a._got.get(rid) is None
    # a cancel of what is over: a stray answer, nothing else happens
    answer, _ = a.call("write", b"now", path=str(w / "now"))
    assert answer == {"results": [{"ok": True}]}
    a.send("cancel", of=a._next - 1)
    assert a.call("ping") == ({"pong": True}, b"")
    assert (w / "now").read_bytes() == b"now"
    assert leftovers(w) == [] and a.registered() == []


def test_a_running_batch_withdrawn_stops_between_files_each_whole(who: Who, start: Any) -> None:
    w = who.work
    a = start(who)
    n = 4000
    data = [os.urandom(64) for _ in range(n)]
    files = [{"path": str(w / "b" / str(i)), "len": 64} for i in range(n)]
    rid = a.send("write_many", b"".join(data), files=files)
    a.send("cancel", of=rid)
    [f] = a.frames(rid, timeout=60)
    if "results" in f.answer:  # every file was written before the withdrawal came
        done = n
        assert f.answer["results"] == [{"ok": True}] * n
    else:  # stopped while it ran ("done" files before), or still queued (none)
        assert f.answer["cancelled"] is True
        done = f.answer.get("done", 0)
        assert 0 <= done < n
    for i in range(n):  # those before the stop are written whole, none after
        target = w / "b" / str(i)
        assert (target.read_bytes() == data[i]) if i < done else not target.exists(), i
    assert leftovers(w) == [] and a.registered() == []
    assert a.call("ping") == ({"pong": True}, b"")


def test_a_malformed_withdrawal_ends_the_agent_like_any_bad_line(who: Who, start: Any) -> None:
    a = start(who)
    a.send("cancel", of="x")
    assert a.close() == 2


# -- the registry of temporary files and the sweep ------------------------------------------


def test_a_killed_writer_leaves_a_registered_part_that_sweep_removes(
    user: Who, start: Any
) -> None:
    w = user.work
    target = put(user, w / "big", b"old")
    payload = b"z" * (48 << 20)
    for _ in range(5):  # the write may, rarely, be over before it is seen: try again
        a = start(user)
        sender = threading.Thread(target=a.send, args=("write", payload), kwargs={
            "path": str(target)})  # fmt: skip
        sender.start()

        def part() -> List[str]:
            return [n for n in os.listdir(w) if n.startswith(PART)] or (
                ["done"] if target.stat().st_size != 3 else [])  # fmt: skip

        seen = wait_until(part, timeout=30, what="the temporary file", interval=0.0001)
        if seen != ["done"]:
            os.kill(a.proc.pid, signal.SIGKILL)  # killed while it writes
        sender.join(timeout=30)
        a.kill()
        if seen != ["done"] and (w / seen[0]).exists():
            break
        # the write was over first: start again from nothing
        target.write_bytes(b"old")
        assert user.registry is not None
        for n in os.listdir(user.registry) if user.registry.is_dir() else []:
            os.unlink(user.registry / n)
    else:
        pytest.fail("the write was never caught under way")
    [name] = seen
    assert name.startswith(f"{PART}{a.proc.pid}-")
    assert target.read_bytes() == b"old"
    assert user.registry is not None
    # while it wrote, the temporary file was registered: the record is still there
    entry = user.registry / name[len(PART):]
    assert os.listdir(user.registry) == [entry.name]
    assert os.readlink(entry) == str(w / name)
    r = user.run("sweep")
    assert (r.returncode, r.stdout) == (0, b"1\n"), r.stderr
    assert os.listdir(user.registry) == [] and leftovers(w) == []
    assert target.read_bytes() == b"old"


def _dead_pid() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1  # never a process


@pytest.mark.parametrize("how", ["op", "mode"])
def test_sweep_removes_only_exact_parts_of_dead_writers(
    user: Who, start: Any, how: str
) -> None:
    w = user.work
    assert user.registry is not None
    reg = user.registry
    reg.mkdir(mode=0o700)
    dead, live = _dead_pid(), os.getpid()
    (w / "sub").mkdir()
    precious = put(user, w / "precious", b"keep me")
    precious2 = put(user, w / "precious2", b"keep me too")

    def part(pid: int, tag: str, where: Path = w) -> Path:
        return where / f"{PART}{pid}-{tag}"

    plant = {
        f"{dead}-aaaa": precious,  # not a temporary file's name
        f"{dead}-bbbb": part(dead, "bbbbX"),  # almost the name
        f"{dead}-cccc": part(dead, "cccc", w / "sub"),  # a link to precious2, at that name
        f"{dead}-dddd": part(dead, "dddd"),  # the real thing
        f"{live}-eeee": part(live, "eeee"),  # its writer is alive
        f"{dead}-ffff": part(dead, "ffff"),  # already gone
    }
    for name, target in plant.items():
        (reg / name).symlink_to(target)
    part(dead, "bbbbX").write_bytes(b"near miss")
    part(dead, "cccc", w / "sub").symlink_to(precious2)
    part(dead, "dddd").write_bytes(b"half written")
    part(live, "eeee").write_bytes(b"being written")
    (reg / f"{dead}-gggg").write_bytes(b"not a link")
    user.own(w, reg)
    if how == "op":
        assert start(user).call("sweep")[0] == {"removed": 2}
    else:
        r = user.run("sweep")
        assert (r.returncode, r.stdout) == (0, b"2\n"), r.stderr
    assert sorted(os.listdir(reg)) == [f"{live}-eeee"]
    assert precious.read_bytes() == b"keep me" and precious2.read_bytes() == b"keep me too"
    assert part(dead, "bbbbX").read_bytes() == b"near miss"
    assert part(live, "eeee").read_bytes() == b"being written"
    assert not os.path.lexists(part(dead, "cccc", w / "sub"))  # the link, not its target
    assert not os.path.lexists(part(dead, "dddd"))


@pytest.mark.parametrize("planted", ["symlink", "foreign"])
def test_a_registry_that_is_not_the_users_own_is_never_used(
    user: Who, start: Any, planted: str
) -> None:
    w = user.work
    assert user.registry is not None
    decoy = w / "decoy"
    decoy.mkdir()
    stale = put(user, w / f"{PART}{_dead_pid()}-abcd", b"would be swept")
    (decoy / f"{_dead_pid()}-abcd").symlink_to(stale)
    user.own(decoy)
    if planted == "symlink":
        user.registry.symlink_to(decoy)
    else:
        if not IS_ROOT:
            pytest.skip("needs another user to own the registry")
        shutil.copytree(decoy, user.registry, symlinks=True)
        os.chmod(user.registry, 0o777)  # even open to the user: not theirs
    before = sorted(os.listdir(user.registry))
    a = start(user)
    assert a.call("sweep")[0] == {"removed": 0}
    assert a.call("write", b"w", path=str(w / "f"))[0] == {"results": [{"ok": True}]}
    assert (w / "f").read_bytes() == b"w"
    assert stale.read_bytes() == b"would be swept"
    assert sorted(os.listdir(user.registry)) == before
    r = user.run("sweep")
    assert (r.returncode, r.stdout) == (0, b"0\n")


# -- list ------------------------------------------------------------------------------------


def _names(frames: List[Frame]) -> List[Tuple[str, str, str]]:
    return [(e["path"], e["name"], e["type"]) for f in frames[:-1] for e in f.answer["entries"]]


def test_list_by_depth_sorted_without_following_links(who: Who, start: Any) -> None:
    t = who.work / "t"
    put(who, t / "b.txt", b"bee", 0o640)
    put(who, t / "a" / "x", b"x")
    put(who, t / "a" / "inner" / "deep", b"d")
    put(who, t / "Z", b"upper case sorts first")
    (t / "c").symlink_to("a")  # to a directory: listed, not descended
    (t / "d").symlink_to("missing")
    os.mkfifo(t / "fifo")
    os.utime(t / "b.txt", (MTIME, MTIME))
    who.own(t)
    a = start(who)
    top = [(f"{t}/{n}", n, k) for n, k in (("Z", "file"), ("a", "dir"), ("b.txt", "file"),
                                            ("c", "symlink"), ("d", "symlink"),
                                            ("fifo", "other"))]  # fmt: skip
    one = a.frames(a.send("list", path=str(t), depth=1))
    assert [f.last for f in one] == [False, True]
    assert one[-1].answer == {"count": 6, "skipped": []}
    assert _names(one) == top
    by_name = {e["name"]: e for e in one[0].answer["entries"]}
    assert by_name["b.txt"] == {"name": "b.txt", "path": f"{t}/b.txt", "type": "file", "size": 3,
                                "mode": 0o640, "mtime": MTIME}  # fmt: skip
    assert (by_name["c"]["target"], by_name["d"]["target"]) == ("a", "missing")
    assert "target" not in by_name["a"]
    # depth 0 is depth 1
    assert _names(a.frames(a.send("list", path=str(t), depth=0))) == top
    two = a.frames(a.send("list", path=str(t), depth=2))
    assert two[-1].answer == {"count": 8, "skipped": []}
    assert _names(two) == [*top, (f"{t}/a/inner", "inner", "dir"), (f"{t}/a/x", "x", "file")]
    three = a.frames(a.send("list", path=str(t), depth=3))
    assert _names(three)[-1] == (f"{t}/a/inner/deep", "deep", "file")
    assert three[-1].answer["count"] == 9
    # what is not a directory
    assert a.call("list", path=str(t / "missing"))[0] == {"missing": True}
    assert a.call("list", path=str(t / "d"))[0] == {"missing": True}
    assert a.call("list", path=str(t / "b.txt"))[0] == {"notdir": True, "type": "file"}
    assert a.call("list", path=str(t / "fifo"))[0] == {"notdir": True, "type": "other"}
    # a link to a directory, named itself, is listed (the path is the caller's)
    assert [n for _, n, _ in _names(a.frames(a.send("list", path=str(t / "c"))))] == [
        "inner", "x"]  # fmt: skip


def test_a_long_listing_comes_in_chunks(who: Who, start: Any) -> None:
    t = who.work / "many"
    t.mkdir()
    for i in range(2500):
        (t / f"f{i:05d}").touch()
    who.own(t)
    a = start(who)
    frames = a.frames(a.send("list", path=str(t)))
    assert [(f.last, len(f.answer.get("entries", []))) for f in frames] == [
        (False, 2000), (False, 500), (True, 0)]  # fmt: skip
    assert frames[-1].answer == {"count": 2500, "skipped": []}
    assert [n for _, n, _ in _names(frames)] == [f"f{i:05d}" for i in range(2500)]


def test_list_reports_a_subdirectory_it_cannot_read(user: Who, start: Any) -> None:
    t = user.work / "t"
    put(user, t / "open" / "f", b"f")
    put(user, t / "shut" / "secret", b"s")
    foreign(t / "shut", 0o700)
    a = start(user)
    frames = a.frames(a.send("list", path=str(t), depth=2))
    assert _names(frames) == [(f"{t}/open", "open", "dir"), (f"{t}/shut", "shut", "dir"),
                              (f"{t}/open/f", "f", "file")]  # fmt: skip
    final = frames[-1].answer
    assert final["count"] == 3
    assert [(s["error"], s["path"]) for s in final["skipped"]] == [("EACCES", f"{t}/shut")]


# -- the server's life -----------------------------------------------------------------------


def test_the_server_ends_when_idle(who: Who, start: Any) -> None:
    a = start(who, idle=1.0)
    began = time.monotonic()
    assert a.call("ping") == ({"pong": True}, b"")  # the idle time runs from here
    assert a.proc.wait(timeout=15) == 0
    assert 0.9 <= time.monotonic() - began < 15


def test_the_server_ends_at_end_of_input_after_answering(who: Who, start: Any) -> None:
    a = start(who)
    rid = a.send("write", b"last words", path=str(who.work / "f"))
    assert a.proc.stdin is not None
    a.proc.stdin.close()  # at once: what is in flight is still done and answered
    assert a.frames(rid)[0].answer == {"results": [{"ok": True}]}
    assert a.proc.wait(timeout=10) == 0
    assert (who.work / "f").read_bytes() == b"last words"


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b"[1, 2]\n",
        b"null\n",
        b'"a string"\n',
        b'{"op": "ping"}\n',  # no id
        b'{"id": "x", "op": "ping"}\n',
        b'{"id": 1, "op": "ping", "len": "many"}\n',
        b'{"id": 1, "op": "ping", "len": -1}\n',
        b'{"id": 1, "op": "write", "len": 67108865}\n',  # larger than any request
        b'{"id": 1, "op": "\xff"}\n',  # not UTF-8
        b"x" * ((1 << 20) + 1),  # no end of line in sight
    ],
    ids=lambda b: b[:20].decode("ascii", "replace"),
)
def test_a_malformed_request_ends_the_server_with_status_2(
    who: Who, start: Any, line: bytes
) -> None:
    a = start(who)
    assert a.call("ping") == ({"pong": True}, b"")
    try:
        a.send_raw(line)
    except BrokenPipeError:
        pass
    assert a.proc.wait(timeout=15) == 2
    assert b"file agent:" in a.stderr_after_exit()


@pytest.mark.parametrize("rid", ['"5"', "-3", "7.9"])
def test_a_request_id_that_is_not_a_natural_number_ends_the_server(
    user: Who, start: Any, rid: str
) -> None:
    # it could not be answered under its own id: a string id is never answered at all
    # (formatting it with %d fails, and so does the error answer), -3 makes a header no
    # client accepts, 7.9 is answered as request 7
    a = start(user)
    # one write: the server may end before a second one, and that write would break the pipe
    bad = b'{"id": %s, "op": "ping", "len": 0}\n' % rid.encode()
    a.send_raw(bad + encode_request(99, "ping", {}))
    deadline = time.monotonic() + 10
    try:
        while 99 not in a._got and time.monotonic() < deadline:
            if not a.pump(deadline - time.monotonic()):
                break
    except ProtocolError as exc:
        pytest.fail(f"the agent answered id {rid} with a frame no client reads: {exc}")
    assert 99 not in a._got, f"id {rid} was taken; answers: {a._got}"
    assert a.proc.wait(timeout=10) == 2


# -- pack and extract ------------------------------------------------------------------------


def snapshot(root: Path, dir_times: bool = True) -> Dict[str, Tuple[Any, ...]]:
    """Everything under ``root``, not following links: type, mode, content, mtime."""
    out: Dict[str, Tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", mode, Path(p).read_bytes(), int(st.st_mtime))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode, int(st.st_mtime) if dir_times else None)
            else:
                out[rel] = ("other",)
    return out


def make_tree(who: Who, src: Path) -> None:
    put(who, src / "a.txt", b"alpha\n")
    put(who, src / "empty", b"")
    put(who, src / "run.sh", b"#!/bin/sh\necho hi\n", 0o755)
    put(who, src / "secret", b"s" * 700, 0o600)
    put(who, src / "sub" / "deep" / "big.bin", os.urandom(300_000))  # > PACK_GATHER: sendfile
    put(who, src / "sub" / "b.txt", b"beta")
    put(who, src / "ro" / "f", b"in a read-only directory")
    put(who, src / "x.pyc", b"excluded")
    put(who, src / "cache" / "inside", b"excluded")
    (src / "sub" / "emptydir").mkdir()
    (src / "link").symlink_to("a.txt")
    (src / "dirlink").symlink_to("sub")
    (src / "abslink").symlink_to("/etc/passwd")
    who.own(src)
    paths = sorted(src.rglob("*"), key=lambda p: -len(p.parts))  # deepest first
    for p in paths:
        if not p.is_symlink():
            os.utime(p, (MTIME, MTIME))
    os.chmod(src / "ro", 0o555)
    os.chmod(src / "sub" / "emptydir", 0o750)
    os.utime(src / "ro", (MTIME, MTIME))


def expected(src: Path) -> Dict[str, Tuple[Any, ...]]:
    tree = snapshot(src)
    return {k: v for k, v in tree.items()
            if not (k == "x.pyc" or k == "cache" or k.startswith("cache/"))}  # fmt: skip


def with_marker(tar: bytes, end: str = END) -> bytes:
    """A whole tar stream (as pack writes it) with the end marker as its last member."""
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as tf:
        tf.getmembers()
        cut = tf.offset
    return tar[:cut] + tarfile.TarInfo(end).tobuf(tarfile.PAX_FORMAT) + b"\0" * 1024


def pack(who: Who, src: Path, *exclude: str) -> Tuple[Dict[str, Any], bytes]:
    r = who.run("pack", str(src), "capytest", *exclude)
    head, _, tar = r.stdout.partition(b"\n")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stderr.splitlines()[-1]) == {"errors": []}
    return json.loads(head), tar


def extract(who: Who, dest: Path, stream: bytes, *extra: str,
            umask: int = 0o022) -> Tuple[int, Dict[str, Any]]:  # fmt: skip
    r = who.run("extract", str(dest), END, *extra, data=stream, umask=umask)
    return r.returncode, json.loads(r.stdout.splitlines()[-1])


def _tar(*members: Tuple[str, Any], end: bool = True) -> bytes:
    """A tar stream of ``(name, bytes)`` files, ``(name, "dir")``, ``(name, ("link",
    target))``, ending with the end marker."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, what in [*members, *([(END, b"")] if end else [])]:
            ti = tarfile.TarInfo(name)
            ti.mtime = MTIME
            if what == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            elif isinstance(what, tuple):
                ti.type, ti.linkname = tarfile.SYMTYPE, what[1]
                tf.addfile(ti)
            else:
                ti.size, ti.mode = len(what), 0o644
                tf.addfile(ti, io.BytesIO(what))
    return buf.getvalue()


def test_pack_then_extract_gives_the_same_tree(who: Who) -> None:
    src, dst = who.work / "src", who.work / "dst"
    make_tree(who, src)
    head, tar = pack(who, src, "*.pyc", "cache")
    want = expected(src)
    files = {k: v for k, v in want.items() if v[0] == "file"}
    assert head == {"total": sum(len(v[2]) for v in files.values()), "files": len(files),
                    "single": False}  # fmt: skip
    rc, summary = extract(who, dst, with_marker(tar), umask=0o077)
    assert (rc, summary) == (0, {"files": len(files), "dirs": 4, "symlinks": 3,
                                 "bytes": head["total"], "errors": [], "complete": True})
    assert snapshot(dst) == want
    assert {os.lstat(p).st_uid for p in [dst, *dst.rglob("*")]} == {who.uid}
    assert leftovers(dst) == []


def test_pack_of_one_file_and_of_what_cannot_be_packed(who: Who) -> None:
    w = who.work
    put(who, w / "one.txt", b"just one", 0o640)
    r = who.run("pack", str(w / "one.txt"), "capytest")
    head, _, tar = r.stdout.partition(b"\n")
    assert (r.returncode, json.loads(head)) == (0, {"total": 8, "files": 1, "single": True})
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as tf:
        [m] = tf.getmembers()
        assert (m.name, m.mode, m.size) == ("one.txt", 0o640, 8)
    r = who.run("pack", str(w / "none"), "capytest")
    assert (r.returncode, json.loads(r.stdout)) == (4, {"absent": {"missing": True}})
    os.mkfifo(w / "fifo")
    r = who.run("pack", str(w / "fifo"), "capytest")
    assert r.returncode == 4 and json.loads(r.stdout)["absent"]["error"] == "EINVAL"


def test_pack_reports_what_it_could_not_read(user: Who) -> None:
    src = user.work / "src"
    put(user, src / "ok", b"ok")
    put(user, src / "shut" / "x", b"x")
    put(user, src / "unreadable", b"u")
    foreign(src / "shut", 0o700)
    foreign(src / "unreadable", 0o600)
    r = user.run("pack", str(src), "capytest")
    assert r.returncode == 1
    errors = json.loads(r.stderr.splitlines()[-1])["errors"]
    assert sorted((e["error"], e["path"]) for e in errors) == [
        ("EACCES", f"{src}/shut"), ("EACCES", f"{src}/unreadable")]  # fmt: skip
    tar = r.stdout.partition(b"\n")[2]
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as tf:
        assert [m.name for m in tf.getmembers()] == ["ok", "shut"]


@pytest.mark.parametrize("use_sendfile", [True, False])
@pytest.mark.parametrize("change", ["same", "shrank", "grew"])
@pytest.mark.parametrize("size", [700, 3 * file_agent.PACK_GATHER + 5])
def test_pack_sends_exactly_the_size_it_announced(
    tmp_path: Path, size: int, change: str, use_sendfile: bool
) -> None:
    # a file that changed since the walk: cut if it grew, padded with zeros (and reported)
    # if it shrank, so the stream always matches its headers; gathered or sent with sendfile
    data = os.urandom(size)
    (tmp_path / "f").write_bytes({"same": data, "shrank": data[: size // 3],
                                  "grew": data + b"more"}[change])  # fmt: skip
    errors: List[Dict[str, Any]] = []
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "f", "rb") as f:
        tar = file_agent.TarOut(out.fileno(), errors)
        tar.sendfile = use_sendfile
        tar.add_file(file_agent.tar_header("f", b"0", 0o640, size, MTIME), f.fileno(), size,
                     str(tmp_path / "f"))
        tar.add(file_agent.tar_header("d", b"5", 0o755, 0, MTIME))
        tar.finish()
    want = data[: size // 3] + bytes(size - size // 3) if change == "shrank" else data
    with tarfile.open(tmp_path / "out", mode="r:") as tf:
        f_member, d_member = tf.getmembers()
        body = tf.extractfile(f_member)
        assert body is not None
        assert (f_member.name, f_member.mode, f_member.size, body.read()) == (
            "f", 0o640, size, want)  # fmt: skip
        assert (d_member.name, d_member.isdir()) == ("d", True)
    shrank = [{"error": "EIO", "path": str(tmp_path / "f"),
               "message": "the file shrank while it was read"}]  # fmt: skip
    assert errors == (shrank if change == "shrank" else [])


def test_pack_reads_a_large_file_where_sendfile_cannot_send_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "sendfile", refuse)
    data = os.urandom(2 * file_agent.PACK_GATHER)
    (tmp_path / "f").write_bytes(data)
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "f", "rb") as f:
        tar = file_agent.TarOut(out.fileno(), [])
        for name in ("a", "b"):
            f.seek(0)
            tar.add_file(file_agent.tar_header(name, b"0", 0o644, len(data), MTIME),
                         f.fileno(), len(data), "f")  # fmt: skip
        tar.finish()
    assert tar.sendfile is False
    with tarfile.open(tmp_path / "out", mode="r:") as tf:
        bodies = [tf.extractfile(m) for m in tf.getmembers()]
        assert [b.read() if b else None for b in bodies] == [data, data]


@settings(max_examples=300, deadline=None)
@given(
    name=hs.text(alphabet=hs.characters(min_codepoint=33, max_codepoint=0x2713,
                                        blacklist_characters="/\x7f"), min_size=1, max_size=60),
    depth=hs.integers(min_value=0, max_value=3),
    mode=hs.integers(min_value=0, max_value=0o7777),
    mtime=hs.integers(min_value=-(2**10), max_value=2**40),
    size=hs.one_of(hs.integers(min_value=0, max_value=10**12), hs.just(8**11)),
    kind=hs.sampled_from([b"0", b"5", b"2"]),
    link=hs.text(alphabet=hs.characters(min_codepoint=33, max_codepoint=0x2713),
                 min_size=1, max_size=120),
)
def test_pack_headers_are_what_tarfile_writes(
    name: str, depth: int, mode: int, mtime: int, size: int, kind: bytes, link: str
) -> None:
    rel = "/".join([name] * (depth + 1))
    ti = tarfile.TarInfo(rel)
    ti.type, ti.mode, ti.mtime = kind, mode, mtime
    if kind == b"2":
        ti.linkname = link
    elif kind == b"0":
        ti.size = size
    want = ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    got = file_agent.tar_header(rel, kind, mode, size if kind == b"0" else 0, mtime,
                                link if kind == b"2" else "")  # fmt: skip
    assert got == want


def test_upload_stream_of_the_library_is_extracted_whole(who: Who) -> None:
    src, dst = who.work / "src", who.work / "dst"
    make_tree(who, src)
    stream = b"".join(tar_stream(plan_upload(str(src), "x", ["*.pyc", "cache"]), END))
    rc, summary = extract(who, dst, stream)
    assert (rc, summary["complete"], summary["errors"]) == (0, True, [])
    assert snapshot(dst) == expected(src)
    assert leftovers(dst) == []


def test_download_of_a_pack_through_the_librarys_extraction(who: Who) -> None:
    src, dst = who.work / "src", who.work / "dst"
    make_tree(who, src)
    _, tar = pack(who, src, "*.pyc", "cache")
    refused: List[Dict[str, Any]] = []
    summary = extract_stream(io.BytesIO(tar).read, str(dst), single=False, max_bytes=1 << 30,
                             refused=refused)  # fmt: skip
    # the data filter refuses a link to an absolute path, and leaves directory modes
    assert [r["path"] for r in refused] == ["abslink"]
    want = {k: v for k, v in expected(src).items() if k != "abslink" and v[0] != "dir"}
    assert {k: v for k, v in snapshot(dst).items() if v[0] != "dir"} == want
    assert summary.files == len([v for v in want.values() if v[0] == "file"])


def test_extract_refuses_names_that_leave_the_destination(who: Who) -> None:
    w = who.work
    dst = w / "dst"
    before = sorted(os.listdir(w))
    stream = _tar(("../evil", b"x"), ("/abs-evil", b"x"), ("a/../../evil2", b"x"),
                  ("./ok/../fine", b"fine"), ("ok2", b"ok"))  # fmt: skip
    rc, summary = extract(who, dst, stream)
    assert rc == 1 and summary["complete"] is True
    assert sorted(e["path"] for e in summary["errors"]) == [
        "../evil", "./ok/../fine", "/abs-evil", "a/../../evil2"]  # fmt: skip
    assert sorted(os.listdir(w)) == sorted([*before, "dst"])
    assert snapshot(dst) == {"ok2": ("file", 0o644, b"ok", MTIME)}
    assert not os.path.lexists("/abs-evil")


def test_extract_never_writes_through_a_symbolic_link(who: Who) -> None:
    w = who.work
    dst, outside = w / "dst", w / "outside"
    put(who, outside / "file", b"precious")
    dst.mkdir()
    (dst / "evil").symlink_to(outside)
    who.own(dst)
    before = snapshot(outside)
    stream = _tar(("evil/x", b"pwned"), ("evil/file", b"pwned"), ("evil/sub/y", b"pwned"),
                  ("lnk", ("link", "../outside")), ("lnk/file", b"pwned"),
                  ("ok", b"ok"))  # fmt: skip
    rc, summary = extract(who, dst, stream)
    assert rc == 1 and summary["complete"] is True
    assert sorted(e["path"] for e in summary["errors"]) == [
        "evil/file", "evil/sub/y", "evil/x", "lnk/file"]  # fmt: skip
    assert snapshot(outside) == before
    assert (dst / "ok").read_bytes() == b"ok"
    assert os.readlink(dst / "lnk") == "../outside"  # links are written, never followed
    # a member at the link's own name replaces the link, not what it names
    rc, _ = extract(who, dst, _tar(("evil", b"a file now")))
    assert rc == 0 and not (dst / "evil").is_symlink()
    assert (dst / "evil").read_bytes() == b"a file now" and snapshot(outside) == before


def test_a_planted_link_is_reported_as_a_link(user: Who) -> None:
    # open_dir turns ELOOP into "a symbolic link is in the way"; Linux answers
    # O_DIRECTORY|O_NOFOLLOW on a link with ENOTDIR, so users read "Not a directory"
    dst = user.work / "dst"
    dst.mkdir()
    (dst / "evil").symlink_to(user.work)
    user.own(dst)
    rc, summary = extract(user, dst, _tar(("evil/x", b"pwned")))
    [error] = summary["errors"]
    assert (rc, error["path"]) == (1, "evil/x")
    assert "symbolic link" in error["message"], error


def test_a_cut_stream_exits_3_and_keeps_the_old_file(who: Who) -> None:
    dst = who.work / "dst"
    put(who, dst / "keep.txt", b"old content", 0o640)
    put(who, dst / "other", b"other")
    whole = _tar(("first", b"written"), ("keep.txt", b"N" * 100_000))
    cut = whole.index(b"N" * 512) + 50_000  # in the middle of keep.txt's data
    rc, summary = extract(who, dst, whole[:cut])
    assert rc == 3 and summary["complete"] is False
    assert any("broke off" in e["message"] for e in summary["errors"]), summary
    assert (dst / "keep.txt").read_bytes() == b"old content"
    assert stat.S_IMODE((dst / "keep.txt").stat().st_mode) == 0o640
    assert (dst / "first").read_bytes() == b"written"  # whole before the cut
    assert leftovers(dst) == []
    if who.registry is not None:
        assert not who.registry.exists() or os.listdir(who.registry) == []
    # whole members, but no end marker: written, yet not complete
    rc, summary = extract(who, dst, _tar(("keep.txt", b"new"), end=False))
    assert (rc, summary["complete"], (dst / "keep.txt").read_bytes()) == (3, False, b"new")
    # after the marker nothing more is taken
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in ((END, b""), ("late", b"late")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    rc, summary = extract(who, dst, buf.getvalue())
    assert rc == 1 and summary["complete"] is True
    assert summary["errors"][0]["message"] == "member after the end marker"
    assert not (dst / "late").exists()


# -- extract as root under the /skills rules ---------------------------------------------------

#: Runs in a private mount namespace (a tmpfs on /opt, root's, 0755): each step is a shell
#: command or an ``extract DEST END root`` of a tar file; prints what each extract said and
#: left under /opt.
_ROOT_DRIVER = r"""
import json, os, stat, subprocess, sys
cfg = json.load(sys.stdin)
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/opt"], check=True)
os.makedirs("/opt/capybara/upload", mode=0o700)
os.umask(0o077)  # the modes written are 0644 and 0755 whatever the umask

def tree():
    out = {}
    for dirpath, dirnames, filenames in os.walk("/opt"):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if p.startswith("/opt/capybara"):
                continue
            st = os.lstat(p)
            kind = "l" if stat.S_ISLNK(st.st_mode) else "d" if stat.S_ISDIR(st.st_mode) else "f"
            out[p] = "%s %o %d" % (kind, stat.S_IMODE(st.st_mode), st.st_uid)
    return out

results = []
for step in cfg["steps"]:
    if "sh" in step:
        subprocess.run(["/bin/sh", "-ec", step["sh"]], check=True)
        continue
    with open(step["tar"], "rb") as f:
        r = subprocess.run([cfg["py"], "-I", "-S", "-X", "utf8", "-c", cfg["src"], "extract",
                            step["dest"], cfg["end"], "root"], stdin=f, capture_output=True,
                           timeout=30)
    results.append({"rc": r.returncode, "out": json.loads(r.stdout.splitlines()[-1]),
                    "tree": tree()})
parts = os.listdir("/opt/capybara/upload/parts") if os.path.isdir(
    "/opt/capybara/upload/parts") else []
print(json.dumps({"results": results, "parts": parts}))
"""


@needs_root_ns
def test_extract_as_root_keeps_to_the_skills_rules(tmp_path: Path) -> None:
    tar1, tar2 = tmp_path / "one.tar", tmp_path / "two.tar"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, mode, data in (("d", tarfile.DIRTYPE, 0o700, b""),
                                       ("d/f", tarfile.REGTYPE, 0o600, b"f"),
                                       ("g", tarfile.REGTYPE, 0o4777, b"g"),
                                       ("l", tarfile.SYMTYPE, 0o777, b""),
                                       (END, tarfile.REGTYPE, 0o644, b"")):  # fmt: skip
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode, ti.size, ti.linkname = kind, mode, len(data), "d/f"
            tf.addfile(ti, io.BytesIO(data))
    tar1.write_bytes(buf.getvalue())
    tar2.write_bytes(_tar(("d/f2", b"f2"), ("h", b"h")))
    steps: List[Dict[str, str]] = [
        {"dest": "/opt/skills/s1", "tar": str(tar1)},  # 1: made, 0755 / 0644
        {"sh": "chmod 0775 /opt/skills"},
        {"dest": "/opt/skills/s2", "tar": str(tar1)},  # 2: group-writable
        {"sh": "chmod 0757 /opt/skills"},
        {"dest": "/opt/skills/s2", "tar": str(tar1)},  # 3: writable by others
        {"sh": "chmod 0755 /opt/skills; chown 1500 /opt/skills"},
        {"dest": "/opt/skills/s2", "tar": str(tar1)},  # 4: not root's
        {"sh": "chown 0 /opt/skills; chmod 0777 /opt"},
        {"dest": "/opt/skills/s2", "tar": str(tar1)},  # 5: an ancestor open to all
        {"sh": "chmod 0755 /opt; ln -s /opt/skills /opt/link"},
        {"dest": "/opt/link/s2", "tar": str(tar1)},  # 6: a link on the way
        {"sh": "chmod 0775 /opt/skills/s1/d"},
        {"dest": "/opt/skills/s1", "tar": str(tar2)},  # 7: a member below a group's dir
    ]
    cfg = {"py": SYSTEM_PY, "src": AGENT, "end": END, "steps": steps}
    r = subprocess.run(["unshare", "-m", "--", sys.executable, "-c", _ROOT_DRIVER],
                       input=json.dumps(cfg).encode(), capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    got = json.loads(r.stdout)
    results = got["results"]
    first = {"/opt/skills": "d 755 0", "/opt/skills/s1": "d 755 0",
             "/opt/skills/s1/d": "d 755 0", "/opt/skills/s1/d/f": "f 644 0",
             "/opt/skills/s1/g": "f 644 0", "/opt/skills/s1/l": "l 777 0"}  # fmt: skip
    assert (results[0]["rc"], results[0]["tree"]) == (0, first), results[0]
    assert results[0]["out"]["complete"] is True and results[0]["out"]["errors"] == []
    for i, res in enumerate(results[1:6], 2):
        assert res["rc"] == 80, (i, res)
        assert res["out"]["refused"] is True and res["out"]["files"] == 0, (i, res)
        assert not any("/s2" in p for p in res["tree"]), (i, res["tree"])
        assert {p: v for p, v in res["tree"].items() if p.startswith("/opt/skills/")} == {
            p: v for p, v in first.items() if p.startswith("/opt/skills/")}, i  # fmt: skip
    last = results[6]
    assert last["rc"] == 1 and last["out"]["complete"] is True
    assert [(e["error"], e["path"]) for e in last["out"]["errors"]] == [("EPERM", "d/f2")]
    assert last["tree"]["/opt/skills/s1/h"] == "f 644 0"
    assert "/opt/skills/s1/d/f2" not in last["tree"]
    assert got["parts"] == []


# -- the oldest Python it claims to run on -----------------------------------------------------


@needs_root_ns
@pytest.mark.skipif(not OLD_PYS, reason="no Python 3.6 on this machine")
def test_every_mode_runs_on_python_3_6(root: Who, start: Any) -> None:
    root.python = OLD_PYS[0]
    w = root.work
    a = start(root, umask=0o022)
    assert a.ready["version"] == AGENT_VERSION
    assert a.call("write", b"old-python", path=str(w / "d" / "f"))[0] == {
        "results": [{"ok": True}]}  # fmt: skip
    assert a.call("read", path=str(w / "d" / "f"), max=100)[1] == b"old-python"
    assert a.call("stat", path=str(w / "d"))[0]["kind"] == "dir"
    answer, _ = a.call("write_many", b"ab", files=[{"path": str(w / "a"), "len": 1},
                                                   {"path": str(w / "b"), "len": 1}])
    assert answer == {"results": [{"ok": True}, {"ok": True}]}
    assert len(a.frames(a.send("read_many", paths=[str(w / "a"), str(w / "b")], max=5))) == 3
    assert _names(a.frames(a.send("list", path=str(w), depth=2)))[0][1] == "a"
    assert a.call("sweep")[0] == {"removed": 0}
    assert a.registered() == []
    assert a.close() == 0
    src, dst = w / "src", w / "dst"
    make_tree(root, src)
    _, tar = pack(root, src, "*.pyc", "cache")
    rc, summary = extract(root, dst, with_marker(tar))
    assert (rc, summary["errors"]) == (0, [])
    assert snapshot(dst) == expected(src)
    assert root.run("sweep").stdout == b"0\n"


# -- starting with a request, and JSON without the json module -----------------------------


def test_a_request_carried_by_the_start_is_served_first_and_the_input_after(
    who: Who, start: Any
) -> None:
    w = who.work
    first = encode_request(1, "write_many", {"files": [{"path": str(w / "d" / "a"), "len": 2},
                                                       {"path": str(w / "b"), "len": 1}]}, b"aab")
    a = start(who, carried=base64.b64encode(first).decode("ascii"))
    [ready] = a.frames(0)
    assert ready.answer["ready"] is True
    assert [f.answer for f in a.frames(1)] == [{"results": [{"ok": True}, {"ok": True}]}]
    assert (w / "d" / "a").read_bytes() == b"aa" and (w / "b").read_bytes() == b"b"
    assert a.call("read", path=str(w / "b"), max=10)[1] == b"b"  # id 2, from its input
    assert a.close() == 0


def test_a_malformed_carried_request_ends_the_agent_with_status_2(who: Who, start: Any) -> None:
    a = start(who, carried="!!not base64!!")
    assert a.frames(0)[0].answer["ready"] is True
    assert a.proc.wait(timeout=30) == 2
    assert b"malformed" in a.stderr_after_exit()


def test_the_agent_starts_without_importing_json_or_re() -> None:
    probe = AGENT.replace('if __name__ == "__main__":', "if False:") + (
        "\nimport sys\nprint(sorted(m for m in ('json', 're', 'enum') if m in sys.modules))\n")
    out = subprocess.run([SYSTEM_PY, "-I", "-S", "-X", "utf8", "-c", probe],
                         capture_output=True, timeout=30, check=True)
    assert out.stdout == b"[]\n"


@pytest.mark.parametrize("value", [
    {"id": 1, "op": "write", "len": 3, "path": "/w/\u00e9 \udcff\n\"x\""},
    {"results": [{"ok": True}, {"error": "EACCES", "message": "no", "path": None}]},
    {"size": 12345678901234, "mtime": 1600000000.25, "list": [], "nested": {"a": [1, -2]}},
])
def test_the_agents_json_is_the_json_modules(value: Dict[str, Any]) -> None:
    compact = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    assert file_agent.dumps(value) == compact
    assert file_agent.loads(compact) == value == file_agent.loads(f" {json.dumps(value)}\n")


@pytest.mark.parametrize("text", ["", "{", "{}x", "NaN", "[1,]", "{'a': 1}", "1 2"])
def test_the_agents_json_refuses_what_is_not_json(text: str) -> None:
    with pytest.raises(ValueError):
        file_agent.loads(text)


def test_the_program_agents_run_serves_every_request_without_the_tar_part(
    who: Who, start: Any
) -> None:
    packed = serve_program()
    # packed: what a start request carries is a fraction of the source (one TCP flight)
    assert len(packed) < 12 << 10 < len(AGENT) // 5
    program = zlib.decompress(base64.b64decode(packed)).decode()
    assert len(program) < 0.7 * len(AGENT) and "def pack(" not in program
    w = who.work
    a = start(who, program=program)
    assert a.ready["version"] == AGENT_VERSION
    assert a.call("ping")[0] == {"pong": True}
    assert a.call("write", b"x", path=str(w / "d" / "f"))[0] == {"results": [{"ok": True}]}
    assert a.call("write_many", b"ab", files=[{"path": str(w / "a"), "len": 1},
                                             {"path": str(w / "b"), "len": 1}])[0] == {
        "results": [{"ok": True}, {"ok": True}]}  # fmt: skip
    assert a.call("read", path=str(w / "d" / "f"), max=10)[1] == b"x"
    assert a.call("stat", path=str(w / "d"))[0]["kind"] == "dir"
    assert len(a.frames(a.send("read_many", paths=[str(w / "a"), str(w / "b")], max=5))) == 3
    assert _names(a.frames(a.send("list", path=str(w), depth=2)))[0][1] == "a"
    assert a.call("sweep")[0] == {"removed": 0}
    assert "commands" in a.call("cmd_list")[0]
    # (a name the program lacks would be answered as an EIO error naming the NameError)
    assert a.call("cmd_read", cid="0" * 32, out=0, err=0, max=10)[0].get("error") != "EIO"
    assert a.close() == 0
