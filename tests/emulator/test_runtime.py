"""Tests of the emulator runtime: real namespaced sandboxes (root only) and the pure helpers.

Each sandbox runs a stand-in agent (a stdlib HTTP server on the agent socket PID 1 passes as fd
3, that answers ``GET /health`` and runs ``POST /run {"cmd": …}`` with ``/bin/sh`` inside the
sandbox, as the sandbox's root), so these tests do not depend on the real agent;
``test_real_agent_boots`` uses the real one.
Every sandbox is destroyed by the ``make`` fixture, and no test leaves processes behind.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, cast

import pytest

import e2b_provider
from e2b_provider.emulator import runtime
from e2b_provider.emulator.runtime import (
    IsolationUnavailable,
    SandboxRuntime,
    SandboxRuntimeError,
    SandboxSpec,
    Service,
    cgroups,
    check_isolation,
    linux,
    namespaces,
)
from e2b_provider.emulator.runtime.pid1 import pid1_accounts as init
from e2b_provider.protocol.connect import EnvelopeDecoder, Message, encode_envelope

try:
    check_isolation()
    _UNAVAILABLE: Optional[str] = None
    if os.geteuid() != 0:
        # Cgroups, limits and capability checks here assume root; rootless sandboxes are
        # tested by test_rootless.py.
        _UNAVAILABLE = "not root (rootless mode is covered by test_rootless.py)"
except IsolationUnavailable as _exc:
    _UNAVAILABLE = str(_exc)
if _UNAVAILABLE is not None:
    print(f"test_runtime: skipping sandbox tests: {_UNAVAILABLE}", file=sys.stderr)

pytestmark = pytest.mark.skipif(
    _UNAVAILABLE is not None, reason=f"no sandbox isolation here: {_UNAVAILABLE}"
)

STANDIN = textwrap.dedent(
    """
    import json, os, socket, socketserver, subprocess, sys
    from http.server import BaseHTTPRequestHandler

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, code, body=b""):
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send(204 if self.path == "/health" else 404)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            p = subprocess.run(["/bin/sh", "-c", req["cmd"]], capture_output=True, timeout=30)
            out = {"rc": p.returncode, "out": p.stdout.decode(), "err": p.stderr.decode()}
            self._send(200, json.dumps(out).encode())

    class S(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass

    assert os.environ.get("LISTEN_FDS") in ("1", "2"), "no listening socket from PID 1"
    server = S(sys.argv[1], H, bind_and_activate=False)
    server.socket.close()
    server.socket = socket.socket(fileno=3)
    server.serve_forever()
    """
)
STANDIN_ARGV = [sys.executable, "-E", "-s", "-S", "-c", STANDIN, runtime.AGENT_SOCKET]


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(30)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def request(rt: SandboxRuntime, method: str, path: str, body: Optional[bytes] = None) -> Any:
    conn = _UnixHTTP(rt.envd_socket)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def sh(rt: SandboxRuntime, cmd: str) -> Dict[str, Any]:
    """Run ``cmd`` with /bin/sh as root inside the sandbox (through the stand-in agent)."""
    status, body = request(rt, "POST", "/run", json.dumps({"cmd": cmd}).encode())
    assert status == 200
    result: Dict[str, Any] = json.loads(body)
    return result


def out(rt: SandboxRuntime, cmd: str) -> str:
    r = sh(rt, cmd)
    assert r["rc"] == 0, r
    return str(r["out"]).strip()


def inside(rt: SandboxRuntime, path: str) -> str:
    """The host path of ``path`` in the running sandbox (its files are on its own disk)."""
    assert rt.init_pid is not None
    return f"/proc/{rt.init_pid}/root{path}"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(pred: Callable[[], bool], limit: float = 10.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


@pytest.fixture
def base_dir() -> Iterator[str]:
    # Short paths: the agent socket path must fit in sun_path (108 bytes).
    path = tempfile.mkdtemp(prefix="e2b-rt-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make(base_dir: str) -> Iterator[Callable[..., SandboxRuntime]]:
    made: List[SandboxRuntime] = []

    def factory(
        sandbox_id: Optional[str] = None, agent_argv: Optional[List[str]] = None, **kw: Any
    ) -> SandboxRuntime:
        sid = sandbox_id or "t" + uuid.uuid4().hex[:12]
        spec = SandboxSpec(sandbox_id=sid, hostname=kw.pop("hostname", sid), **kw)
        rt = SandboxRuntime(
            spec, os.path.join(base_dir, sid), agent_argv=agent_argv or STANDIN_ARGV
        )
        made.append(rt)
        return rt

    yield factory
    for rt in made:
        asyncio.run(rt.destroy())
        assert rt.host_pids() == []


# --- pure helpers -----------------------------------------------------------------------


def test_spec_validates_its_fields() -> None:
    spec = SandboxSpec("abc", "abc", env_vars={"A": "1"}, allow_hosts=["x.test"])
    assert spec.allow_hosts == ("x.test",) and dict(spec.env_vars) == {"A": "1"}
    assert "env_vars" not in repr(SandboxSpec("abc", "abc", env_vars={"TOKEN": "s3cret"}))
    with pytest.raises(TypeError):
        cast(Dict[str, str], spec.env_vars)["B"] = "2"
    for bad in ("", "../x", "a/b", "a b", "x" * 65):
        with pytest.raises(ValueError):
            SandboxSpec(bad, "h")
    with pytest.raises(ValueError):
        SandboxSpec("a", "bad_host")
    with pytest.raises(ValueError):
        SandboxSpec("a", "h", egress="everything")
    with pytest.raises(ValueError):
        SandboxSpec("a", "h", env_vars={"A=B": "1"})
    with pytest.raises(TypeError):
        SandboxSpec("a", "h", allow_hosts="x.test")


def test_runtime_refuses_dangerous_state_dirs() -> None:
    spec = SandboxSpec("a", "a")
    for bad in ("/", "/tmp", "/tmp/a,b/c", "/tmp/" + "x" * 120):
        with pytest.raises(ValueError):
            SandboxRuntime(spec, bad)
    with pytest.raises(ValueError):
        SandboxRuntime(spec, "/tmp/ok/x", agent_argv=["python3", "-c", "pass"])


def test_generated_accounts_hide_host_users() -> None:
    host_passwd = (
        "root:x:0:0:root:/root:/bin/bash\n"
        "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
        "alice:x:1000:1000:Alice:/home/alice:/bin/bash\n"
        "user:x:999:999::/home/user:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    passwd = init.render_passwd(host_passwd)
    names = [line.split(":")[0] for line in passwd.splitlines()]
    assert names == ["root", "daemon", "nobody", "sandbox", "user"]
    assert "sandbox:x:1000:1000:sandbox:/home/sandbox:/bin/bash" in passwd.splitlines()
    assert "user:x:1001:1001:user:/home/user:/bin/bash" in passwd.splitlines()
    group = init.render_group("root:x:0:\nsudo:x:27:alice,daemon\nalice:x:1000:\n", passwd)
    assert group.splitlines() == [
        "root:x:0:",
        "sudo:x:27:daemon",
        "sandbox:x:1000:",
        "user:x:1001:",
    ]
    shadow = init.render_shadow(passwd)
    assert all(line.split(":")[1] == "*" for line in shadow.splitlines())
    assert "alice" not in passwd + group + shadow + init.render_gshadow(group)
    assert "127.0.1.1\tbox1" in init.render_hosts("box1")


def test_python_bind_paths_are_minimal_and_cover_the_interpreter() -> None:
    paths = runtime.python_bind_paths()
    for p in paths:
        assert os.path.isabs(p) and p != "/"
        assert not any(p == "/" + d or p.startswith(f"/{d}/") for d in runtime.OVERLAY_DIRS)
        assert not any(p != q and p.startswith(q + "/") for q in paths)
    exe = os.path.realpath(sys.executable)
    pkg = os.path.realpath(os.path.dirname(e2b_provider.__file__))
    for needed in (exe, pkg):
        covered = any(needed == p or needed.startswith(p + "/") for p in paths)
        assert covered or any(needed.startswith(f"/{d}/") for d in runtime.OVERLAY_DIRS)


def test_mountinfo_parser_decodes_escapes() -> None:
    text = (
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
        "50 27 0:40 /x /tmp/a\\040b rw shared:1 - tmpfs tmpfs rw\n"
    )
    mounts = linux.parse_mountinfo(text)
    assert [m.mount_point for m in mounts] == [
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup/freezer",
        "/tmp/a b",
    ]
    assert mounts[1].super_options == ("rw", "freezer") and mounts[2].root == "/x"


def test_check_isolation_explains_missing_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # Not root and no subuid/subgid range: refused, naming root and the rootless requirements.
    empty = tmp_path / "empty"
    empty.write_text("")
    monkeypatch.setattr(namespaces, "_isolation_ok", False)
    monkeypatch.setattr(namespaces, "SUBUID_FILE", str(empty))
    monkeypatch.setattr(namespaces, "SUBGID_FILE", str(empty))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(IsolationUnavailable, match="needs root, or unprivileged user") as info:
        check_isolation()
    assert isinstance(info.value, RuntimeError)
    assert "running as uid 1000, missing: " in str(info.value)
    assert f"subuid range for {namespaces._user_name(1000)} in {empty}" in str(info.value)


# --- real sandboxes ---------------------------------------------------------------------


def test_boot_answers_health_fast(make: Callable[..., SandboxRuntime]) -> None:
    rt = make()
    assert not rt.running and rt.host_pids() == []
    asyncio.run(rt.boot(timeout=20))
    assert rt.running and not rt.frozen
    assert request(rt, "GET", "/health")[0] == 204
    assert rt.last_boot_seconds is not None
    print(f"boot took {rt.last_boot_seconds * 1000:.0f} ms")
    assert rt.last_boot_seconds < 5.0
    pids = rt.host_pids()
    assert rt.init_pid in pids and len(pids) >= 3  # unshare, PID 1, agent
    with pytest.raises(SandboxRuntimeError, match="already running"):
        asyncio.run(rt.boot())


def test_users_hostname_and_capabilities(make: Callable[..., SandboxRuntime]) -> None:
    rt = make(hostname="box-one")
    asyncio.run(rt.boot(timeout=20))
    assert out(rt, "hostname") == "box-one"
    assert out(rt, "cat /etc/hostname") == "box-one"
    assert out(rt, "runuser -u sandbox -- id") == (
        "uid=1000(sandbox) gid=1000(sandbox) groups=1000(sandbox)"
    )
    assert out(rt, "runuser -u user -- sh -c 'id -u; echo $HOME'") == "1001\n/home/user"
    assert out(rt, "id -un") == "root"
    dirs = "/workspace /home/sandbox /tmp /opt/capybara/upload /skills"
    assert out(rt, f"stat -c '%U %a' {dirs}") == (
        "sandbox 755\nsandbox 755\nroot 1777\nroot 700\nroot 755"
    )
    assert out(rt, "getent passwd 1000 | cut -d: -f1") == "sandbox"
    # The plugin's scripts need these tools; all come from the host's /usr via the overlay.
    tools = "sh bash setsid timeout pgrep pkill runuser head stat cat mkdir chmod rm sleep"
    assert out(rt, f"for t in {tools}; do command -v $t >/dev/null || echo missing $t; done") == ""
    # The bounding set is Docker-like: no mount, no mknod, but chown works.
    assert sh(rt, "mount -t tmpfs x /mnt")["rc"] != 0
    assert sh(rt, "mknod /tmp/vda b 254 0")["rc"] != 0
    chown = "touch /workspace/f && chown user:user /workspace/f && stat -c %U /workspace/f"
    assert out(rt, chown) == "user"
    # The sandbox's root is not host root: the host's files in the system dirs stay the host's
    # (unmapped owner, read-only); new entries at their top land in the sandbox's own layer.
    marker = f"e2b-rt-{uuid.uuid4().hex}"
    out(rt, f"touch /usr/{marker}")
    assert not os.path.exists(f"/usr/{marker}")
    assert os.path.exists(inside(rt, f"/usr/{marker}"))
    assert "Permission denied" in sh(rt, f"touch /usr/local/{marker}")["err"]
    assert "Permission denied" in sh(rt, "touch /usr/bin/env")["err"]
    assert out(rt, "stat -c %U /usr/bin /usr/bin/env") == "nobody\nnobody"
    assert sh(rt, f"runuser -u sandbox -- touch /usr/{marker}-2")["rc"] != 0


def test_isolation_between_sandboxes_and_from_the_host(
    make: Callable[..., SandboxRuntime], base_dir: str
) -> None:
    a, b = make(), make()

    async def boot_both() -> None:
        await asyncio.gather(a.boot(timeout=20), b.boot(timeout=20))

    asyncio.run(boot_both())
    out(a, "echo secret > /workspace/only-a; (setsid sleep 4242 >/dev/null 2>&1 &)")
    assert sh(b, "test -e /workspace/only-a")["rc"] != 0
    assert sh(b, "pgrep -f '^sleep 4242$'")["rc"] != 0
    assert out(a, "pgrep -f '^sleep 4242$' | wc -l") == "1"
    # Only this sandbox's processes, numbered from 1.
    assert out(b, "ps -eo pid= | sort -n | head -1") == "1"
    # The host's private places are invisible: /root, /tmp, the state dirs, /work, /home.
    host_marker = os.path.join("/root", f".e2b-rt-{uuid.uuid4().hex}")
    tmp_marker = os.path.join("/tmp", f"e2b-rt-{uuid.uuid4().hex}")
    for path in (host_marker, tmp_marker):
        with open(path, "w") as f:
            f.write("host")
    try:
        for path in (host_marker, tmp_marker, base_dir, a.state_dir, os.path.abspath(__file__)):
            assert sh(b, f"test -e '{path}'")["rc"] != 0, path
    finally:
        os.unlink(host_marker)
        os.unlink(tmp_marker)
    assert out(b, "ls /home") == "sandbox\nuser"
    # Network: loopback only, up, and no route anywhere.
    assert out(a, "ls /sys/class/net") == "lo"
    assert "UP" in out(a, "ip -br link show lo")
    assert out(a, "ip route; ip -6 route") == ""
    assert sh(a, "ip route get 198.51.100.7")["rc"] != 0
    assert a.host_pids() and not set(a.host_pids()) & set(b.host_pids())


def test_freeze_stops_a_ticker_and_thaw_resumes_it(make: Callable[..., SandboxRuntime]) -> None:
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    out(rt, "(setsid sh -c 'while :; do echo x >> /workspace/tick; sleep 0.01; done' "
            ">/dev/null 2>&1 &)")
    tick = inside(rt, "/workspace/tick")

    def size() -> int:
        try:
            return os.path.getsize(tick)
        except FileNotFoundError:
            return 0

    assert wait_for(lambda: size() > 10)
    asyncio.run(rt.freeze())
    assert rt.frozen and rt.running
    frozen_at = size()
    time.sleep(0.3)  # a window in which a frozen ticker must not write
    assert size() == frozen_at
    asyncio.run(rt.thaw())
    assert not rt.frozen
    assert wait_for(lambda: size() > frozen_at + 10)
    assert request(rt, "GET", "/health")[0] == 204


def test_halt_kills_escapees_and_boot_keeps_files(make: Callable[..., SandboxRuntime]) -> None:
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    out(rt, "echo kept > /workspace/keep; echo home > /home/user/.x; echo t > /tmp/t; "
            "echo etc >> /etc/kept; (setsid sleep 4243 >/dev/null 2>&1 &)")
    before = rt.host_pids()
    assert len(before) >= 4
    asyncio.run(rt.halt())
    assert not rt.running and rt.host_pids() == []
    assert not any(alive(p) for p in before)
    asyncio.run(rt.halt())  # idempotent
    asyncio.run(rt.boot(timeout=20))
    kept = out(rt, "cat /workspace/keep /home/user/.x /tmp/t; tail -1 /etc/kept")
    assert kept == "kept\nhome\nt\netc"
    assert sh(rt, "pgrep -f '^sleep 4243$'")["rc"] != 0
    assert not set(before) & set(rt.host_pids()) - {os.getpid()}


@pytest.mark.parametrize("mode", ["v1", "none"])
def test_freezer_fallbacks(
    make: Callable[..., SandboxRuntime], monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # Pretend the host lacks cgroup2 (v1 freezer) or every cgroup hierarchy (SIGSTOP).
    monkeypatch.setattr(linux, "cgroup2_mount", lambda: None)
    if mode == "none":
        monkeypatch.setattr(linux, "cgroup1_mount", lambda controller: None)
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    assert rt._cgroups.mode == mode
    out(rt, "(setsid sh -c 'while :; do echo x >> /workspace/tick; sleep 0.01; done' "
            ">/dev/null 2>&1 &)")
    tick = inside(rt, "/workspace/tick")
    assert wait_for(lambda: os.path.exists(tick) and os.path.getsize(tick) > 10)
    asyncio.run(rt.freeze())
    frozen_at = os.path.getsize(tick)
    time.sleep(0.3)  # a window in which a frozen ticker must not write
    assert os.path.getsize(tick) == frozen_at
    asyncio.run(rt.thaw())
    assert wait_for(lambda: os.path.getsize(tick) > frozen_at + 10)
    asyncio.run(rt.freeze())
    pids = rt.host_pids()
    asyncio.run(rt.halt())  # from frozen
    assert rt.host_pids() == [] and not any(alive(p) for p in pids)
    asyncio.run(rt.destroy())
    assert not os.path.exists(rt.state_dir)


def _controllers() -> List[str]:
    """The limit controllers this host has (cgroup2 or v1)."""
    v2 = linux.cgroup2_mount()
    available = []
    if v2 is not None:
        with open(os.path.join(v2, "cgroup.controllers")) as f:
            available = f.read().split()
    return [c for c in ("memory", "cpu", "pids") if c in available or linux.cgroup1_mount(c)]


def test_limits_and_cgroup_namespace(make: Callable[..., SandboxRuntime]) -> None:
    rt = make(memory_mb=300, cpu_count=1)
    asyncio.run(rt.boot(timeout=20))
    # Inside, the sandbox's own cgroup is the root: host cgroup paths do not show.
    assert all(line.endswith(":/") for line in out(rt, "cat /proc/self/cgroup").splitlines())
    expected = {
        "memory.max": str(300 * 1024 * 1024),
        "memory.limit_in_bytes": str(300 * 1024 * 1024),
        "cpu.max": "100000 100000",
        "cpu.cfs_quota_us": "100000",
        "pids.max": "1024",  # the default
    }
    seen = 0
    for d in [rt._cgroups.control, *rt._cgroups.extra]:
        for name, value in expected.items():
            path = os.path.join(d or "", name)
            if d and os.path.exists(path):
                with open(path) as f:
                    assert f.read().strip() == value, path
                seen += 1
    controllers = _controllers()
    assert seen >= len(controllers)
    # What is enforced is reported, and logged once per boot in one line.
    enforced = rt.enforced_limits
    assert set(controllers) <= set(enforced)
    line = rt.limits_line()
    assert line.startswith(f"sandbox {rt.spec.sandbox_id} limits: cpu 1 (")
    assert "memory 300 MiB (" in line and "processes 1024 (" in line
    if "disk" in enforced:
        assert "disk 1024 MiB (ext4 image on a loop device)" in line


def test_sandbox_root_is_not_host_root(make: Callable[..., SandboxRuntime]) -> None:
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    tag = uuid.uuid4().hex
    secret = f"/etc/e2b-rt-secret-{tag}"
    private_dir = f"/etc/e2b-rt-private-{tag}"
    public = f"/etc/e2b-rt-public-{tag}"
    try:
        for path, mode in ((secret, 0o600), (public, 0o644)):
            with open(path, "w") as f:
                f.write(f"host {tag}\n")
            os.chmod(path, mode)
        os.mkdir(private_dir, 0o700)
        with open(os.path.join(private_dir, "inner"), "w") as f:
            f.write("inner\n")
        os.chmod(os.path.join(private_dir, "inner"), 0o644)
        # Root inside (uid 0 of the sandbox's user namespace) reads what everyone may read...
        assert out(rt, f"id -u; cat {public}") == f"0\nhost {tag}"
        # ...and nothing else of the host's, whatever its capabilities inside.
        for cmd in (f"cat {secret}", f"cat {private_dir}/inner", f"ls {private_dir}",
                    f"cp {secret} /tmp/x", f"chmod 644 {secret}", f"chown root {secret}"):
            r = sh(rt, cmd)
            assert r["rc"] != 0 and "host" not in r["out"], (cmd, r)
        if os.path.exists("/etc/shadow-"):
            assert "Permission denied" in sh(rt, "cat /etc/shadow-")["err"]
        # On the host, every process of the sandbox but PID 1 runs as an unprivileged uid.
        uid = runtime.root_id_range()[0]
        assert uid > 65535
        for pid in rt.host_pids():
            with open(f"/proc/{pid}/status") as f:
                uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
            if pid in (rt.init_pid, rt._proc.pid if rt._proc else None):
                assert uids == ["0"] * 4
            else:
                assert uids == [str(uid)] * 4, (pid, uids)
        # Nor can it reach PID 1 (host root): no signal, no /proc access to it.
        assert sh(rt, "kill -0 1")["rc"] != 0
        assert sh(rt, "cat /proc/1/environ")["rc"] != 0
    finally:
        for path in (secret, public, os.path.join(private_dir, "inner")):
            if os.path.exists(path):
                os.unlink(path)
        if os.path.isdir(private_dir):
            os.rmdir(private_dir)
    # What the sandboxes need still works as root inside.
    out(rt, "runuser -u sandbox -- sh -c 'setsid sleep 0 && timeout 1 true && pgrep -x sh'")
    assert out(rt, "touch /workspace/f && chown sandbox:sandbox /workspace/f && "
                   "stat -c %U /workspace/f; echo s > /skills/s && cat /skills/s") == "sandbox\ns"


def _host_ids(pid: int) -> Optional[List[List[int]]]:
    """The host's real/effective/saved/fs uids and gids of ``pid`` (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            rows = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    return [[int(i) for i in rows["Uid"].split()], [int(i) for i in rows["Gid"].split()]]


def test_root_mode_ids_when_roots_subuid_and_subgid_ranges_differ(
    make: Callable[..., SandboxRuntime], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # Root's ranges in /etc/subuid and /etc/subgid disagree (start and length, as on hosts
    # that set them up separately): uids come from the one, gids from the other. The runtime
    # is pointed at temporary copies; the host's files are not touched.
    uid_start, gid_start = 0x70000000, 0x60000000 + 4096
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text(f"someone:100000:65536\nroot:{uid_start}:65536\n")
    subgid.write_text(f"0:{gid_start}:100000\nroot:200000:65536\n")  # by uid, first counts
    monkeypatch.setattr(namespaces, "SUBUID_FILE", str(subuid))
    monkeypatch.setattr(namespaces, "SUBGID_FILE", str(subgid))
    assert runtime.root_id_range() == (uid_start, gid_start)
    assert runtime.sandbox_id_extents() == (
        ((0, uid_start, 65536),), ((0, gid_start, 65536),)
    )
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    assert out(rt, "cat /proc/self/uid_map /proc/self/gid_map").split() == [
        "0", str(uid_start), "65536", "0", str(gid_start), "65536"
    ]
    assert out(rt, "runuser -u sandbox -- id").startswith("uid=1000(sandbox) gid=1000(sandbox)")
    assert out(rt, "runuser -u user -- id").startswith("uid=1001(user) gid=1001(user)")
    out(rt, "runuser -u sandbox -- sh -c 'echo w > /workspace/f'; "
            "runuser -u user -- sh -c 'echo v > /tmp/g; (setsid sleep 302 >/dev/null 2>&1 &)'")
    assert out(rt, "stat -c '%n %u:%g %U:%G' /workspace/f /tmp/g").splitlines() == [
        "/workspace/f 1000:1000 sandbox:sandbox", "/tmp/g 1001:1001 user:user"
    ]
    # seen from the host, each id comes from its own range
    st = os.stat(inside(rt, "/workspace/f"))
    assert (st.st_uid, st.st_gid) == (uid_start + 1000, gid_start + 1000)
    st = os.stat(inside(rt, "/tmp/g"))
    assert (st.st_uid, st.st_gid) == (uid_start + 1001, gid_start + 1001)

    def sleeps() -> List[int]:
        found = []
        for pid in rt.host_pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read() == b"sleep\0" + b"302\0":
                        found.append(pid)
            except OSError:
                pass
        return found

    assert wait_for(lambda: bool(sleeps())), "the sandbox's sleep is not among its processes"
    (pid,) = sleeps()
    assert _host_ids(pid) == [[uid_start + 1001] * 4, [gid_start + 1001] * 4]
    # every process of the sandbox but PID 1 (host root) runs as ids of the two ranges
    for pid in rt.host_pids():
        ids = _host_ids(pid)
        if ids is None or pid in (rt.init_pid, rt._proc.pid if rt._proc else None):
            continue
        assert set(ids[0]) <= {uid_start, uid_start + 1000, uid_start + 1001}, (pid, ids)
        assert set(ids[1]) <= {gid_start, gid_start + 1000, gid_start + 1001}, (pid, ids)


def test_agent_output_cannot_be_written_from_inside(
    make: Callable[..., SandboxRuntime],
) -> None:
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    mark = f"e2b-rt-log-{uuid.uuid4().hex}"
    # $PPID is the agent (the stand-in); 1 is PID 1. Their stdout/stderr are a pipe of host
    # root's that the host drains into init.log.
    for target in ("$PPID", "1"):
        for fd in (1, 2):
            r = sh(rt, f"echo {mark} > /proc/{target}/fd/{fd}")
            assert r["rc"] != 0, (target, fd, r)
    out(rt, "echo still-ok")
    assert mark not in rt.log_tail(1 << 20)
    assert not any(p.startswith("init.log") for p in os.listdir(inside(rt, "/run/e2b")))
    assert sh(rt, "touch /run/e2b/x")["rc"] != 0  # nor the agent's socket directory


def test_fork_bomb_is_contained(make: Callable[..., SandboxRuntime]) -> None:
    limit = 100
    rt = make(max_processes=limit, cpu_count=1)
    asyncio.run(rt.boot(timeout=20))
    pids_dir = next(
        d for d in [rt._cgroups.control, *rt._cgroups.extra]
        if d and os.path.exists(os.path.join(d, "pids.max"))
    )

    def events() -> int:
        with open(os.path.join(pids_dir, "pids.events")) as f:
            return int(f.read().split()[1])

    def current() -> int:
        with open(os.path.join(pids_dir, "pids.current")) as f:
            return int(f.read())

    before = events()
    # A real fork bomb, as a sandbox user; its top shell becomes a sleep (no fork needed) that
    # timeout SIGKILLs after 3 s with its whole process group, the bomb included.
    bomb = "runuser -u user -- timeout -s KILL 3 bash -c 'b(){ b|b& }; b; exec sleep 60'"
    done: List[Dict[str, Any]] = []
    runner = threading.Thread(target=lambda: done.append(sh(rt, bomb + " >/dev/null 2>&1")))
    runner.start()
    seen = [0]

    def bombed() -> bool:
        seen[0] = max(seen[0], current(), len(rt.host_pids()) - 1)  # minus unshare
        return events() > before  # forks were refused at the limit

    try:
        assert wait_for(bombed, 20)
        while runner.is_alive():
            bombed()
            runner.join(0.05)
    finally:
        runner.join(60)
    assert done and done[0]["rc"] != 0
    assert 0 < seen[0] <= limit
    assert wait_for(lambda: current() < 10)
    assert out(rt, "pgrep -c -u user || true") == "0"
    assert out(rt, "echo alive") == "alive"


def test_disk_is_bounded_and_kept(make: Callable[..., SandboxRuntime]) -> None:
    if runtime.disk.disk_support() is not None:
        pytest.skip(reason=f"no sandbox disks on this host: {runtime.disk.disk_support()}")
    rt = make(disk_mb=16)
    asyncio.run(rt.boot(timeout=20))
    assert rt.enforced_limits["disk"] == "ext4 image on a loop device"
    r = sh(rt, "dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1")
    assert r["rc"] != 0 and "No space left on device" in r["out"], r
    for more in ("/tmp/more", "/etc/more"):  # the whole sandbox shares its disk, upper included
        r = sh(rt, f"head -c 1M /dev/zero > {more}")
        assert "No space left on device" in r["err"], (more, r)
    size = int(out(rt, "stat -c %s /workspace/big"))
    assert 8 << 20 < size < 16 << 20
    image = os.path.join(rt.state_dir, "disk.img")
    st = os.stat(image)
    assert st.st_size == 16 << 20 and st.st_blocks * 512 <= 17 << 20
    assert not os.path.exists(os.path.join(rt.state_dir, "root"))  # nothing on the host's disk
    # The disk survives a halt and a cold boot, full as it was; freeing space works.
    asyncio.run(rt.halt())
    assert wait_for(lambda: not runtime.disk.image_attached(image))
    asyncio.run(rt.boot(timeout=20))
    assert int(out(rt, "stat -c %s /workspace/big")) == size
    out(rt, "rm /workspace/big && head -c 1M /dev/zero > /tmp/more")


def test_a_frozen_sandboxs_disk_copies_whole(
    make: Callable[..., SandboxRuntime], base_dir: str
) -> None:
    if runtime.disk.disk_support() is not None:
        pytest.skip(reason=f"no sandbox disks on this host: {runtime.disk.disk_support()}")
    debugfs = shutil.which("debugfs", path="/usr/sbin:/sbin:/usr/bin:/bin")
    assert debugfs is not None  # e2fsprogs, as mkfs.ext4
    rt = make(disk_mb=32)
    asyncio.run(rt.boot(timeout=20))
    tag = uuid.uuid4().hex
    out(rt, f"echo {tag} > /workspace/x; echo {tag} > /usr/new-{tag}")
    asyncio.run(rt.freeze())
    rt.flush_files()
    [image] = rt.storage_paths()
    copy = os.path.join(base_dir, "copy.img")
    shutil.copyfile(image, copy)
    asyncio.run(rt.thaw())
    for path in ("/root/workspace/x", f"/upper/usr/new-{tag}"):  # the image's own layout
        done = subprocess.run([debugfs, "-R", f"cat {path}", copy], capture_output=True,
                              text=True, timeout=30)
        assert done.stdout.strip() == tag, (path, done.stderr)


def test_copied_disk_boots_as_another_sandbox_and_usage_reads_it(
    make: Callable[..., SandboxRuntime], base_dir: str
) -> None:
    if runtime.disk.disk_support() is not None:
        pytest.skip(reason=f"no sandbox disks on this host: {runtime.disk.disk_support()}")
    src = make(disk_mb=64, hostname="source-box")
    asyncio.run(src.boot(timeout=20))
    before = src.resource_usage()
    assert before.sources["disk"] == "statvfs" and before.disk_used is not None
    out(src, "head -c 4M /dev/urandom > /workspace/data; echo mine > /usr/added; sync")
    after = src.resource_usage()
    assert after.disk_used is not None and after.disk_used >= before.disk_used + (4 << 20)
    digest = out(src, "md5sum < /workspace/data")
    asyncio.run(src.halt())
    assert src.resource_usage().sources["disk"] == "image"
    dst_dir = os.path.join(base_dir, "copy" + uuid.uuid4().hex[:8])
    runtime.copy_sandbox_files(src.state_dir, dst_dir)
    assert sorted(os.listdir(dst_dir)) == ["disk.img"]
    st = os.stat(os.path.join(dst_dir, "disk.img"))
    assert st.st_size == 64 << 20 and st.st_blocks * 512 < 32 << 20  # still sparse
    dst = SandboxRuntime(SandboxSpec("c" + uuid.uuid4().hex[:12], "copy-box"), dst_dir,
                         agent_argv=STANDIN_ARGV)
    try:
        asyncio.run(dst.boot(timeout=20))
        assert out(dst, "md5sum < /workspace/data; cat /usr/added") == digest + "\nmine"
        # its own names: the generated files follow the new hostname
        assert out(dst, "cat /etc/hostname; grep -c copy-box /etc/hosts") == "copy-box\n1"
        out(dst, "rm /workspace/data")
    finally:
        asyncio.run(dst.destroy())
    asyncio.run(src.boot(timeout=20))
    assert out(src, "md5sum < /workspace/data; cat /etc/hostname") == digest + "\nsource-box"


def test_boot_id_changes_at_each_boot_only(make: Callable[..., SandboxRuntime]) -> None:
    with open("/proc/sys/kernel/random/boot_id") as f:
        host_boot_id = f.read().strip()
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    first = out(rt, "cat /proc/sys/kernel/random/boot_id")
    assert first == rt.boot_id and first != host_boot_id
    assert sh(rt, "echo x > /proc/sys/kernel/random/boot_id")["rc"] != 0
    # uptime counts from the sandbox's boot (a time namespace), not the host's
    with open("/proc/uptime") as f:
        host_uptime = float(f.read().split()[0])
    if os.path.exists("/proc/self/ns/time"):
        assert float(out(rt, "cut -d' ' -f1 /proc/uptime")) < min(60.0, host_uptime)
    asyncio.run(rt.freeze())  # a pause with memory keeps the boot
    asyncio.run(rt.thaw())
    assert out(rt, "cat /proc/sys/kernel/random/boot_id") == first
    asyncio.run(rt.halt())  # a cold boot is a boot
    asyncio.run(rt.boot(timeout=20))
    second = out(rt, "cat /proc/sys/kernel/random/boot_id")
    assert second == rt.boot_id and second not in (first, host_boot_id)


def test_base_template_has_sudo_and_python(make: Callable[..., SandboxRuntime]) -> None:
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    assert out(rt, "runuser -u user -- python -c 'import sys; print(sys.version_info[0])'") == "3"
    if not os.path.exists("/usr/bin/sudo"):
        pytest.skip(reason="sudo is not installed on this host (./dev installs it)")
    assert out(rt, "runuser -u user -- sudo -n id -un") == "root"
    assert out(rt, "runuser -u user -- sudo -n sh -c 'echo x > /root/by-sudo; stat -c %U "
                   "/root/by-sudo'") == "root"
    r = sh(rt, "runuser -u sandbox -- sudo -n true")  # only `user` may, as on E2B's base
    assert r["rc"] != 0
    assert out(rt, "ls -A /etc/sudoers.d | wc -l") == "0"  # the host's rules do not apply
    # sudo stays the sandbox's root: host files stay out of reach
    assert sh(rt, "runuser -u user -- sudo -n cat /etc/sudoers.d/README")["rc"] != 0


def test_halt_of_a_frozen_sandbox(make: Callable[..., SandboxRuntime]) -> None:
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    asyncio.run(rt.freeze())
    pids = rt.host_pids()
    asyncio.run(rt.halt())
    assert rt.host_pids() == [] and not any(alive(p) for p in pids)
    assert not rt.frozen
    asyncio.run(rt.boot(timeout=20))
    assert out(rt, "echo ok") == "ok"


def test_destroy_leaves_no_process_mount_file_or_cgroup(
    make: Callable[..., SandboxRuntime],
) -> None:
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    out(rt, "(setsid sleep 4244 >/dev/null 2>&1 &); echo x > /workspace/x")
    pids = rt.host_pids()
    cgroup_dirs = [d for d in [rt._cgroups.control, *rt._cgroups.extra] if d]
    assert cgroup_dirs and all(os.path.isdir(d) for d in cgroup_dirs)
    asyncio.run(rt.destroy())
    assert rt.host_pids() == [] and not any(alive(p) for p in pids)
    assert not os.path.exists(rt.state_dir)
    assert linux.mounts_under(rt.state_dir) == []
    with open("/proc/self/mountinfo") as f:
        assert rt.state_dir not in f.read()
    assert not any(os.path.exists(d) for d in cgroup_dirs)
    asyncio.run(rt.destroy())  # idempotent


def test_agent_is_restarted_and_pid1_ignores_signals_from_inside(
    make: Callable[..., SandboxRuntime],
) -> None:
    rt = make()
    asyncio.run(rt.boot(timeout=20))
    # PID 1 is the only host-root process of the sandbox: its root cannot even signal it.
    assert "Operation not permitted" in sh(rt, "kill -TERM 1")["err"]
    # $PPID is the stand-in agent; kill it once it has answered.
    out(rt, "(sleep 0.2; kill -9 $PPID) >/dev/null 2>&1 &")
    assert wait_for(lambda: "agent killed by signal 9" in rt.log_tail())
    assert wait_for(lambda: _healthy(rt))
    assert rt.running
    assert "restarting" in rt.log_tail()
    # The restarted agent serves on the same socket and in the same user namespace.
    assert out(rt, "id -u; cat /proc/self/uid_map").split() == [
        "0", "0", str(runtime.root_id_range()[0]), "65536"
    ]
    init_pid = rt.init_pid
    assert init_pid is not None
    os.kill(init_pid, signal.SIGTERM)  # from outside: the sandbox shuts down
    assert wait_for(lambda: not rt.running)
    assert wait_for(lambda: rt.host_pids() == [])


def _healthy(rt: SandboxRuntime) -> bool:
    try:
        return bool(request(rt, "GET", "/health")[0] == 204)
    except OSError:
        return False


def test_boot_failure_is_reported_and_cleaned_up(make: Callable[..., SandboxRuntime]) -> None:
    broken = "import sys; print('agent-broken'); sys.exit(3)"
    rt = make(agent_argv=[sys.executable, "-S", "-c", broken])
    t0 = time.monotonic()
    with pytest.raises(SandboxRuntimeError, match="agent-broken"):
        asyncio.run(rt.boot(timeout=1.0))
    assert time.monotonic() - t0 < 5
    assert not rt.running and rt.host_pids() == []


def test_many_sandboxes_at_once(make: Callable[..., SandboxRuntime]) -> None:
    rts = [make() for _ in range(6)]

    async def boot_all() -> None:
        await asyncio.gather(*(rt.boot(timeout=30) for rt in rts))

    t0 = time.monotonic()
    asyncio.run(boot_all())
    print(f"6 sandboxes booted in {(time.monotonic() - t0) * 1000:.0f} ms")
    for rt in rts:
        assert out(rt, "hostname") == rt.spec.hostname

    async def destroy_all() -> None:
        await asyncio.gather(*(rt.destroy() for rt in rts))

    asyncio.run(destroy_all())
    assert all(rt.host_pids() == [] for rt in rts)


CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from e2b_provider.emulator.runtime import SandboxRuntime, SandboxSpec
    spec = SandboxSpec(sys.argv[1], sys.argv[1])
    rt = SandboxRuntime(spec, sys.argv[2], agent_argv=json.loads(sys.argv[3]))
    asyncio.run(rt.boot(timeout=20))
    print(json.dumps({"pids": rt.host_pids(), "cgroup": rt._cgroups.control}), flush=True)
    time.sleep(120)
    """
)


def test_sandboxes_die_with_the_server_process(base_dir: str) -> None:
    sid = "t" + uuid.uuid4().hex[:12]
    state = os.path.join(base_dir, sid)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, sid, state, json.dumps(STANDIN_ARGV)],
        stdout=subprocess.PIPE,
    )
    cgroup = None
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        info = json.loads(line)
        pids, cgroup = info["pids"], info["cgroup"]
        assert len(pids) >= 3 and all(alive(p) for p in pids)
        child.kill()  # SIGKILL: no cleanup code runs in the "server"
        child.wait(timeout=10)
        assert wait_for(lambda: not any(alive(p) for p in pids)), "sandbox outlived its server"
        # its disk went with its mount namespace: no loop device holds the image any more
        image = os.path.join(state, "disk.img")
        assert wait_for(lambda: not runtime.disk.image_attached(image))
        if cgroup:
            assert wait_for(lambda: _read_procs(cgroup) == [])
            parent = os.path.dirname(cgroup)
            # (another emulator starting on this machine may sweep it first: the outcome
            # is what counts)
            runtime.remove_stale_cgroups()
            assert not os.path.exists(parent)
            assert not any(d.endswith(f"e2b-emulator-{child.pid}") for d in _all_parents())
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()
        if cgroup:
            for d in (cgroup, os.path.dirname(cgroup)):
                try:
                    os.rmdir(d)
                except OSError:
                    pass


def _all_parents() -> List[str]:
    found = []
    for hierarchy in cgroups._hierarchy_dirs():
        found += [os.path.join(hierarchy, n) for n in os.listdir(hierarchy) if "e2b-emulator" in n]
    return found


def _read_procs(cgroup: str) -> List[int]:
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def _agent_run(rt: SandboxRuntime, cmd: str, user: str) -> str:
    """Run ``cmd`` through the real agent's process.Process/Start as ``user``; its stdout."""
    conn = _UnixHTTP(rt.envd_socket)
    try:
        body = encode_envelope({"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}})
        conn.request(
            "POST",
            "/process.Process/Start",
            body=body,
            headers={
                "Content-Type": "application/connect+json",
                "Connect-Protocol-Version": "1",
                "Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode(),
            },
        )
        resp = conn.getresponse()
        assert resp.status == 200
        decoder = EnvelopeDecoder()
        decoder.feed(resp.read())
        stdout = b""
        for item in decoder:
            if isinstance(item, Message):
                data = item.data.get("event", {}).get("data", {})
                stdout += base64.b64decode(data.get("stdout", ""))
        return stdout.decode()
    finally:
        conn.close()


def test_real_agent_boots(make: Callable[..., SandboxRuntime], base_dir: str) -> None:
    sid = "t" + uuid.uuid4().hex[:12]
    rt = SandboxRuntime(SandboxSpec(sid, sid), os.path.join(base_dir, sid))
    try:
        asyncio.run(rt.boot(timeout=30))
        print(f"real agent: boot took {rt.last_boot_seconds * 1000:.0f} ms")  # type: ignore[operator]
        assert request(rt, "GET", "/health")[0] in (200, 204)
        # One real command through the agent, as `sandbox`, to show the pieces fit together.
        stdout = _agent_run(rt, "id -un; hostname; pwd; cat /proc/self/status | grep CapBnd",
                            "sandbox")
        assert stdout.split("\n")[:3] == ["sandbox", sid, "/home/sandbox"]
        assert "00000000a00425fb" in stdout  # the bounding set init.py leaves
        # The agent ($PPID) is not dumpable: the sandbox's root, its own user, can neither
        # read its /proc files nor reach its descriptors (its output pipe); its own, it can.
        stdout = _agent_run(
            rt,
            "cat /proc/self/environ >/dev/null && echo own-ok; "
            "cat /proc/$PPID/environ >/dev/null 2>&1 || echo agent-private; "
            "echo x 2>/dev/null > /proc/$PPID/fd/2 || echo pipe-private",
            "root",
        )
        assert stdout.split() == ["own-ok", "agent-private", "pipe-private"]
    finally:
        asyncio.run(rt.destroy())
    assert rt.host_pids() == []


# --- a template's services ------------------------------------------------------------------


def _listens(rt: SandboxRuntime, port: int) -> bool:
    try:
        asyncio.run(rt.connect_port(port, 2.0)).close()
        return True
    except runtime.PortClosed:
        return False


def _web(port: int) -> Service:
    """A service: Python's HTTP server on ``port`` of the sandbox's loopback."""
    return Service(
        name="web",
        argv=[sys.executable, "-E", "-s", "-m", "http.server", str(port), "--bind",
              "127.0.0.1", "--directory", "/"],
        ready_port=port,
    )


def test_a_service_is_waited_for_and_started_again_when_killed(base_dir: str) -> None:
    sid = "t" + uuid.uuid4().hex[:12]
    rt = SandboxRuntime(SandboxSpec(sid, sid, services=[_web(8123)]), os.path.join(base_dir, sid))
    try:
        asyncio.run(rt.boot(timeout=30))
        # the boot returned once the service listened: no wait for it here
        assert _listens(rt, 8123)
        assert "web started" in rt.log_tail()
        _agent_run(rt, "pkill -KILL -f 'http[.]server'", "root")
        assert wait_for(lambda: "web killed by signal 9" in rt.log_tail())
        assert wait_for(lambda: _listens(rt, 8123), limit=20)
    finally:
        asyncio.run(rt.destroy())
    assert rt.host_pids() == []


def test_a_service_that_never_listens_fails_the_boot_by_name(base_dir: str) -> None:
    sid = "t" + uuid.uuid4().hex[:12]
    quiet = Service(name="quiet", argv=[sys.executable, "-c", "import time; time.sleep(600)"],
                    ready_port=8124)
    rt = SandboxRuntime(SandboxSpec(sid, sid, services=[quiet]), os.path.join(base_dir, sid))
    try:
        with pytest.raises(SandboxRuntimeError, match="template's services to listen"):
            asyncio.run(rt.boot(timeout=2))
        assert rt.host_pids() == []  # the failed boot left nothing running
    finally:
        asyncio.run(rt.destroy())


# --- boots measured by progress ------------------------------------------------------------

#: Busy for 2.5 s of wall time (CPU time used: progress), then the stand-in agent.
_SLOW_STANDIN = (
    "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 2.5: pass\n" + STANDIN
)
#: An agent that never listens and uses no CPU: a boot that makes no progress.
_STUCK_STANDIN = "import time\ntime.sleep(600)\n"


def test_a_boot_that_progresses_waits_past_its_stall_bound(
    make: Callable[..., SandboxRuntime],
) -> None:
    rt = make(agent_argv=[sys.executable, "-E", "-s", "-S", "-c", _SLOW_STANDIN,
                          runtime.AGENT_SOCKET])
    asyncio.run(rt.boot(timeout=2.0))  # 2 s in all would fail it; 2 s without progress too
    assert rt.running and request(rt, "GET", "/health")[0] == 204


def test_a_stuck_boot_fails_naming_its_step_in_whole_words(
    make: Callable[..., SandboxRuntime],
) -> None:
    rt = make(agent_argv=[sys.executable, "-E", "-s", "-S", "-c",
                          "print('agent: ' + 'booting ' * 400, flush=True)\n" + _STUCK_STANDIN,
                          runtime.AGENT_SOCKET])
    with pytest.raises(SandboxRuntimeError) as info:
        asyncio.run(rt.boot(timeout=2.0))
    text = str(info.value)
    first, _, rest = text.partition("\n")
    assert first == (
        f"sandbox {rt.spec.sandbox_id} did not boot: it made no progress for 2 s while waiting "
        "for the agent to answer GET /health: no step reached and no CPU time used by its "
        "processes; its log ends:"
    )
    # the log's last line, too long to come whole, comes from a word's start, marked
    assert rest.startswith("…booting ") and set(rest[1:].split()) == {"booting"}, rest[:80]
    assert not rt.running and rt.host_pids() == []
