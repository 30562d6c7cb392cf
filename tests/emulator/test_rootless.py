"""Tests of the emulator runtime's rootless mode (unprivileged user namespaces).

Run as root, these tests create a throwaway system user, give it (or not) a subuid/subgid range,
and run a small Python script as that user (``setpriv``) that uses :class:`SandboxRuntime` with
the real agent: boot, ``runuser -u sandbox -- id``, a connection to a server inside through the
agent's ports socket, and a file write through the agent, SIGSTOP
freeze/thaw, halt, reboot keeping files, destroy, sandboxes dying with their server, and the
host ids of files and processes when the subuid and subgid ranges differ. The user and every
file are removed afterwards.

The ranges are never written to the host's /etc/subuid and /etc/subgid: the script runs in a
private mount namespace whose /etc is an overlay holding copies of those two files with the
user's lines (``newuidmap``/``newgidmap`` and the runtime read them there). If the interpreter
is not reachable for that user (e.g. under /root, mode 700), only the interpreter's directories
are visible below the blocking directory in that namespace; nothing changes on the host. The
pure helpers are tested without root.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from e2b_provider.emulator import runtime
from e2b_provider.emulator.runtime import (
    IsolationUnavailable,
    check_isolation,
    namespaces,
    subid_range,
)
from e2b_provider.emulator.runtime.pid1 import pid1_syscalls as init

_HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _which(name: str) -> Optional[str]:
    return shutil.which(name, path=_HOST_PATH)


def _root_skip_reason() -> Optional[str]:
    if not sys.platform.startswith("linux"):
        return "rootless sandboxes need Linux"
    if os.geteuid() != 0:
        return "these tests create a throwaway user and need root"
    for tool in ("useradd", "userdel", "setpriv", "unshare", "mount"):
        if _which(tool) is None:
            return f"{tool} is missing"
    if _which("newuidmap") is None or _which("newgidmap") is None:
        return "newuidmap/newgidmap missing: install the Debian package uidmap (./dev does it)"
    return None


_SKIP = _root_skip_reason()
if _SKIP is not None:
    print(f"test_rootless: skipping the rootless sandbox tests: {_SKIP}", file=sys.stderr)
needs_root = pytest.mark.skipif(_SKIP is not None, reason=f"rootless sandbox tests: {_SKIP}")


# --- pure helpers (no root needed) --------------------------------------------------------


def test_subid_range_takes_the_first_entry_by_name_or_uid() -> None:
    text = "# comment\nother:100000:65536\nbad line\nbob:x:1\nbob:200000:100\nbob:300000:65536\n"
    assert subid_range(text, "bob", 1234) == (200000, 100)
    assert subid_range("1234:500000:65536\n", "bob", 1234) == (500000, 65536)
    assert subid_range(text, "alice", 1) is None
    assert subid_range("", "bob", 1) is None


def test_locked_flags_keep_what_the_host_mount_has() -> None:
    flags = init.locked_flags(os.ST_NOSUID | os.ST_NOEXEC | os.ST_RELATIME)
    assert flags == init.MS_NOSUID | init.MS_NOEXEC | init.MS_RELATIME
    assert init.locked_flags(os.ST_RDONLY) == init.MS_RDONLY | init.MS_STRICTATIME
    assert init.locked_flags(os.ST_NOATIME | os.ST_NODEV) == init.MS_NOATIME | init.MS_NODEV


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_refusal_names_every_missing_piece(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    # A non-root caller whose subuid range is missing and whose subgid range is too small.
    subuid = tmp_path / "subuid"
    subgid = tmp_path / "subgid"
    subuid.write_text("someoneelse:100000:65536\n")
    subgid.write_text("4242:100000:1000\n")
    monkeypatch.setattr(namespaces, "_isolation_ok", False)
    monkeypatch.setattr(namespaces, "SUBUID_FILE", str(subuid))
    monkeypatch.setattr(namespaces, "SUBGID_FILE", str(subgid))
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    monkeypatch.setattr(namespaces, "_user_name", lambda uid: "dev")
    monkeypatch.setattr(namespaces, "HOST_PATH", "/nonexistent")  # no unshare, no newuidmap
    with pytest.raises(IsolationUnavailable) as info:
        check_isolation()
    msg = str(info.value)
    print(msg)
    assert msg.startswith("the E2B emulator needs root, or unprivileged user namespaces with ")
    assert "running as uid 4242, missing: " in msg
    missing = msg.split("missing: ", 1)[1]
    assert "the unshare command" in missing
    assert "newuidmap and newgidmap (Debian package uidmap)" in missing
    assert f"a subuid range for dev in {subuid} (add 'dev:<start>:65536')" in missing
    assert f"the first one for dev in {subgid} has 1000 ids, need 65536" in missing
    assert not namespaces._isolation_ok


# --- as a throwaway unprivileged user ---------------------------------------------------------


def _run(argv: List[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False,
        env={"PATH": _HOST_PATH, "LANG": "C.UTF-8"},
    )  # fmt: skip


@contextlib.contextmanager
def _throwaway_user() -> Iterator[Tuple[str, int, int]]:
    name = "e2brl" + uuid.uuid4().hex[:10]
    done = _run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
    assert done.returncode == 0, done.stderr
    try:
        import pwd

        entry = pwd.getpwnam(name)
        yield name, entry.pw_uid, entry.pw_gid
    finally:
        done = _run(["userdel", name])
        assert done.returncode == 0, f"userdel {name}: {done.stderr}"


def _read_lines(path: str) -> List[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.readlines()
    except FileNotFoundError:
        return []


def _free_subid_start() -> int:
    """The first multiple of 65536 after every subuid and subgid range in use (>= 100000)."""
    end = 100000
    for path in ("/etc/subuid", "/etc/subgid"):
        for line in _read_lines(path):
            fields = line.strip().split(":")
            if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                end = max(end, int(fields[1]) + int(fields[2]))
    return -(-end // 65536) * 65536


def _with_line(path: str, line: str) -> List[str]:
    """The lines of ``path`` with ``line`` appended."""
    lines = _read_lines(path)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return [*lines, line]


def _blocked_dirs(uid: int, gid: int, paths: List[str]) -> Dict[str, List[str]]:
    """Map each ancestor directory ``uid`` cannot search to the needed paths below it."""
    blocked: Dict[str, List[str]] = {}
    for path in paths:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            anc = "/" + "/".join(parts[:i])
            st = os.stat(anc)
            if st.st_uid == uid:
                ok = bool(st.st_mode & stat.S_IXUSR)
            elif st.st_gid == gid:
                ok = bool(st.st_mode & stat.S_IXGRP)
            else:
                ok = bool(st.st_mode & stat.S_IXOTH)
            if not ok:
                blocked.setdefault(anc, []).append(path)
                break
    return blocked


def _as_user(
    uid: int, gid: int, argv: List[str], scratch: str,
    subids: Optional[Tuple[List[str], List[str]]] = None,
) -> List[str]:
    """Return a command line running ``argv`` as ``uid``, the interpreter made reachable.

    With ``subids`` (the lines of /etc/subuid and of /etc/subgid), ``argv`` runs in a private
    mount namespace in which those two files have these lines: ``newuidmap``/``newgidmap``
    and the runtime read them, the host's files stay untouched. /etc is then an overlay whose
    upper layer holds the two files (bind mounts over the files would be locked submounts of
    /etc, which the sandbox's own overlay of /etc in its user namespace must not hide).
    """
    drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--"]
    needed = sorted(set(runtime.python_bind_paths()) | {os.path.realpath(sys.prefix)})
    blocked = _blocked_dirs(uid, gid, needed)
    if not blocked and subids is None:
        return drop + argv
    if blocked:
        print(
            "test_rootless: the interpreter is not reachable for an unprivileged user "
            + ", ".join(f"({d} is mode {oct(stat.S_IMODE(os.stat(d).st_mode))})" for d in blocked)
            + "; running the script in a private mount namespace where only "
            + ", ".join(p for ps in blocked.values() for p in ps)
            + " are visible below "
            + ", ".join(blocked),
            file=sys.stderr,
        )
    script = ["set -e"]
    if subids is not None:
        upper, work = os.path.join(scratch, "etc-upper"), os.path.join(scratch, "etc-work")
        os.mkdir(upper, 0o755)
        os.mkdir(work, 0o700)
        for name, lines in zip(("subuid", "subgid"), subids):
            with open(os.path.join(upper, name), "w", encoding="utf-8") as f:
                f.writelines(lines)
            os.chmod(os.path.join(upper, name), 0o644)
        script.append(
            f"mount -t overlay overlay -o 'lowerdir=/etc,upperdir={upper},workdir={work}' /etc"
        )
    n = 0
    for anc, paths in blocked.items():
        keep = []
        for path in paths:
            spot = os.path.join(scratch, f"keep{n}")
            n += 1
            script.append(f"mkdir -p '{spot}' && mount --bind '{path}' '{spot}'")
            keep.append((spot, path))
        script.append(f"mount -t tmpfs -o mode=755,size=1m tmpfs '{anc}'")
        for spot, path in keep:
            script.append(f"mkdir -p '{path}' && mount --move '{spot}' '{path}'")
    script.append('exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
            "\n".join(script), "as-user", *drop, *argv]  # fmt: skip


SCRIPT = textwrap.dedent(
    r"""
    import asyncio, base64, http.client, json, os, socket, sys, time
    from e2b_provider.protocol.connect import EnvelopeDecoder, Message, encode_envelope
    from e2b_provider.emulator.api.volume_files import IdMap, VolumeRoot
    from e2b_provider.emulator.runtime import linux, sandbox_id_extents
    from e2b_provider.emulator.runtime import (
        IsolationUnavailable, PortClosed, SandboxRuntime, SandboxSpec, check_isolation,
        copy_sandbox_files, remove_tree)

    def emit(**kw):
        print(json.dumps(kw), flush=True)

    mode, base = sys.argv[1], sys.argv[2]
    try:
        check_isolation()
    except IsolationUnavailable as exc:
        emit(refused=str(exc))
        sys.exit(0)
    if mode == "check":
        emit(refused=None)
        sys.exit(0)

    class UnixHTTP(http.client.HTTPConnection):
        def __init__(self, path, timeout=20):
            super().__init__("localhost", timeout=timeout)
            self._path = path

        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect(self._path)

    def call(rt, method, path, body=None, headers=None, timeout=20):
        conn = UnixHTTP(rt.envd_socket, timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def run(rt, cmd, user="root"):
        body = encode_envelope({"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}})
        status, data = call(rt, "POST", "/process.Process/Start", body, {
            "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1",
            "Authorization": "Basic " + base64.b64encode(user.encode() + b":").decode()})
        assert status == 200, (status, data)
        dec = EnvelopeDecoder()
        dec.feed(data)
        out, code = b"", None
        for item in dec:
            if isinstance(item, Message):
                event = item.data.get("event", {})
                out += base64.b64decode(event.get("data", {}).get("stdout", ""))
                out += base64.b64decode(event.get("data", {}).get("stderr", ""))
                if "end" in event:
                    code = event["end"].get("exitCode", 0)
        return code, out.decode()

    def states(rt):
        return {p: linux.process_state(p) for p in rt.host_pids()}

    async def scenario():
        vol = os.path.join(base, "vol")
        os.mkdir(vol)
        os.chmod(vol, 0o777)
        spec = SandboxSpec("rl1", "rootless-box", volume_binds=[(vol, "/mnt/vol")])
        rt = SandboxRuntime(spec, os.path.join(base, "rl1"))
        await rt.boot(timeout=30)
        emit(step="boot", seconds=rt.last_boot_seconds, rootless=rt.rootless,
             freeze=rt.freeze_method, pids=rt.host_pids(), health=call(rt, "GET", "/health")[0])
        emit(step="id", result=run(rt, "runuser -u sandbox -- id; id -un; hostname"))
        emit(step="sandbox-id", result=run(rt, "id", user="sandbox"))
        # a server inside, reached through the agent's ports socket (as the edge does)
        run(rt, "(setsid python3 -m http.server 8765 --bind ::1 --directory /tmp "
                ">/dev/null 2>&1 &)", user="user")
        deadline = time.monotonic() + 10
        conn = None
        while conn is None:
            try:
                conn = await rt.connect_port(8765, 5)
            except PortClosed as exc:
                assert time.monotonic() < deadline, f"no server on port 8765: {exc}"
                await asyncio.sleep(0.05)  # the poll interval of this bounded wait
        conn.setblocking(True)
        conn.settimeout(10)
        conn.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
        head = conn.recv(200).split(b"\r\n")[0].decode()
        family = conn.family.name
        conn.close()
        try:
            await rt.connect_port(8766, 5)
            closed = None
        except PortClosed as exc:
            closed = str(exc)
        emit(step="ports", head=head, family=family, closed=closed)
        wrote = run(rt, "echo v > /mnt/vol/f && id -u", user="user")
        ids = IdMap(*sandbox_id_extents(), can_chown=False)
        emit(step="volume", result=wrote, entry=VolumeRoot(vol, ids).stat("/f"),
             host_uid=os.stat(os.path.join(vol, "f")).st_uid)
        emit(step="layout", result=run(rt, "stat -c '%n %U %a' /workspace /home/user "
             "/opt/capybara/upload /skills; tail -n +3 /proc/net/dev | cut -d: -f1; "
             "wc -l < /proc/net/route; cat /proc/1/cmdline | tr '\\0' ' '"))
        status, body = call(rt, "POST", "/files?path=/workspace/hello.txt&username=sandbox",
                            b"hello rootless", {"Content-Type": "application/octet-stream"})
        host_file = os.path.join(rt.state_dir, "root", "workspace", "hello.txt")
        st = os.stat(host_file)
        emit(step="upload", status=status, uid=st.st_uid, gid=st.st_gid,
             inside=run(rt, "stat -c '%U:%G' /workspace/hello.txt; cat /workspace/hello.txt"))
        copy_dir = os.path.join(base, "rl1copy")
        copy_sandbox_files(rt.state_dir, copy_dir)
        copied = os.path.join(copy_dir, "root", "workspace", "hello.txt")
        cst = os.stat(copied)
        usage = rt.resource_usage()
        emit(step="copy", uid=cst.st_uid, gid=cst.st_gid, mode=cst.st_mode & 0o7777,
             same_mode=cst.st_mode == st.st_mode, sources=usage.sources,
             cpu=usage.cpu_usec, mem=usage.mem_used, disk=usage.disk_used)
        remove_tree(copy_dir)
        emit(step="denied", result=run(rt, "touch /usr/local/e2b-x 2>&1; echo rc=$?"))
        emit(step="base", boot_id=rt.boot_id, result=run(
            rt, "python -c 'print(3)'; cat /proc/sys/kernel/random/boot_id; "
                "test -x /usr/bin/sudo || exit 0; sudo -n id -u", user="user"))
        run(rt, "(setsid sh -c 'while :; do echo x >> /workspace/tick; sleep 0.01; done'"
                " >/dev/null 2>&1 &)")
        tick = os.path.join(rt.state_dir, "root", "workspace", "tick")
        deadline = time.monotonic() + 10
        while not (os.path.exists(tick) and os.path.getsize(tick) > 10):
            assert time.monotonic() < deadline, "ticker did not start"
            await asyncio.sleep(0.02)
        await rt.freeze()
        frozen = rt.frozen
        size = os.path.getsize(tick)
        frozen_states = states(rt)
        await asyncio.sleep(0.3)  # a window in which a frozen ticker must not write
        still = os.path.getsize(tick) == size
        await rt.thaw()
        deadline = time.monotonic() + 10
        while os.path.getsize(tick) <= size and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        emit(step="freeze", frozen=frozen, states=frozen_states, still=still,
             resumed=os.path.getsize(tick) > size, after=states(rt))
        pids = rt.host_pids()
        await rt.halt()
        survivors = [p for p in pids if linux.process_state(p) not in (None, "Z", "X")]
        emit(step="halt", pids=rt.host_pids(), survivors=survivors)
        await rt.boot(timeout=30)
        emit(step="reboot", result=run(rt, "cat /workspace/hello.txt; echo; ls /workspace"))
        await rt.destroy()
        emit(step="destroy", exists=os.path.exists(rt.state_dir), pids=rt.host_pids())
        # A second sandbox, left running: the test SIGKILLs this process.
        rt2 = SandboxRuntime(SandboxSpec("rl2", "rl2"), os.path.join(base, "rl2"))
        await rt2.boot(timeout=30)
        emit(step="orphan", pids=rt2.host_pids())
        await asyncio.sleep(120)

    def host_ids(pid):
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                rows = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # gone meanwhile
            return None
        return [int(i) for i in rows["Uid"].split()], [int(i) for i in rows["Gid"].split()]

    async def ids():
        # The host ids of a sandbox's users, files and processes (the test gives the user
        # subuid and subgid ranges that differ).
        vol = os.path.join(base, "vol")
        os.mkdir(vol)
        os.chmod(vol, 0o777)
        spec = SandboxSpec("rl3", "ids-box", volume_binds=[(vol, "/mnt/vol")])
        rt = SandboxRuntime(spec, os.path.join(base, "rl3"))
        await rt.boot(timeout=30)
        try:
            emit(step="maps", extents=sandbox_id_extents(), health=call(rt, "GET", "/health")[0],
                 result=run(rt, "cat /proc/self/uid_map; echo --; cat /proc/self/gid_map"))
            emit(step="id", sandbox=run(rt, "id", user="sandbox"), user=run(rt, "id", user="user"))
            emit(step="write", sandbox=run(rt, "echo w > /workspace/f", user="sandbox"),
                 user=run(rt, "echo v > /mnt/vol/f; (setsid sleep 301 >/dev/null 2>&1 &)",
                          user="user"))
            mine = os.stat(os.path.join(rt.state_dir, "root", "workspace", "f"))
            theirs = os.stat(os.path.join(vol, "f"))
            entry = VolumeRoot(vol, IdMap(*sandbox_id_extents(), can_chown=False)).stat("/f")
            emit(step="files", workspace=[mine.st_uid, mine.st_gid],
                 volume=[theirs.st_uid, theirs.st_gid], entry=[entry["uid"], entry["gid"]],
                 inside=run(rt, "stat -c '%n %u:%g %U:%G' /workspace/f /mnt/vol/f"))
            deadline = time.monotonic() + 10
            sleeps = []
            while not sleeps and time.monotonic() < deadline:
                for pid in rt.host_pids():
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            if f.read() == b"sleep\0" + b"301\0":
                                sleeps.append(pid)
                    except OSError:
                        pass
                if not sleeps:
                    await asyncio.sleep(0.02)  # the poll interval of this bounded wait
            every = [host_ids(p) for p in rt.host_pids()]
            emit(step="process", sleeps=[host_ids(p) for p in sleeps],
                 every=[i for i in every if i is not None])
        finally:
            await rt.destroy()
        emit(step="destroy", exists=os.path.exists(rt.state_dir), pids=rt.host_pids())

    asyncio.run(scenario() if mode == "run" else ids())
    """
)


@pytest.fixture
def scratch() -> Iterator[str]:
    # Short and searchable for the user: the agent socket path must fit in sun_path.
    path = tempfile.mkdtemp(prefix="e2b-rl-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _user_base(scratch: str, uid: int, gid: int) -> str:
    base = os.path.join(scratch, "s")
    os.mkdir(base, 0o700)
    os.chown(base, uid, gid)
    return base


def _userns_allowed(uid: int, gid: int, scratch: str) -> Optional[str]:
    argv = _as_user(uid, gid, ["unshare", "--user", "--map-root-user", "/bin/true"], scratch)
    done = _run(argv)
    return None if done.returncode == 0 else done.stderr.strip() or str(done.returncode)


@needs_root
def test_refusal_as_a_user_without_subids(scratch: str) -> None:
    with _throwaway_user() as (name, uid, gid):
        base = _user_base(scratch, uid, gid)
        argv = [sys.executable, "-c", SCRIPT, "check", base]
        done = _run(_as_user(uid, gid, argv, scratch))
        assert done.returncode == 0, done.stderr
        msg = json.loads(done.stdout.splitlines()[-1])["refused"]
        print(msg)
        assert msg is not None and "needs root, or unprivileged user namespaces" in msg
        missing = msg.split("missing: ", 1)[1]
        assert f"a subuid range for {name} in /etc/subuid" in missing
        assert f"a subgid range for {name} in /etc/subgid" in missing
        assert "newuidmap" not in missing  # installed: not reported as missing


@needs_root
def test_rootless_sandbox_lifecycle(scratch: str) -> None:
    with _throwaway_user() as (name, uid, gid):
        reason = _userns_allowed(uid, gid, scratch)
        if reason is not None:
            pytest.skip(reason=f"the kernel refuses unprivileged user namespaces here: {reason}")
        start = _free_subid_start()
        subids = (
            _with_line("/etc/subuid", f"{name}:{start}:65536\n"),
            _with_line("/etc/subgid", f"{name}:{start}:65536\n"),
        )
        base = _user_base(scratch, uid, gid)
        argv = [sys.executable, "-c", SCRIPT, "run", base]
        child = subprocess.Popen(
            _as_user(uid, gid, argv, scratch, subids),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
            env={"PATH": _HOST_PATH, "LANG": "C.UTF-8"},
        )  # fmt: skip
        steps: Dict[str, Dict[str, Any]] = {}
        try:
            assert child.stdout is not None
            while "orphan" not in steps:
                line = child.stdout.readline()
                if not line:
                    break
                item = json.loads(line)
                print(item)
                if "refused" in item:
                    pytest.fail(f"rootless refused: {item['refused']}")
                steps[item["step"]] = item
            if "orphan" not in steps:
                child.kill()
                _, err = child.communicate(timeout=10)
                pytest.fail(f"scenario stopped after {list(steps)}:\n{err}")
            _check_steps(steps, start)
            pids = steps["orphan"]["pids"]
            assert len(pids) >= 3 and all(_alive(p) for p in pids)
            # The "server" dies by SIGKILL; the sandbox must die with it (PDEATHSIG). unshare
            # and setpriv exec, so the child is the Python process itself.
            child.kill()
            child.wait(timeout=10)
            assert _wait_for(lambda: not any(_alive(p) for p in pids)), "sandbox outlived server"
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=10)
            for stream in (child.stdout, child.stderr):
                if stream is not None:
                    stream.close()
        # Nothing left of the user once the host's init reaped the zombies (unshare, PID 1).
        assert _wait_for(lambda: _run(["pgrep", "-u", str(uid)]).stdout == "")


@needs_root
def test_rootless_ids_when_the_subuid_and_subgid_ranges_differ(scratch: str) -> None:
    """Hosts where /etc/subuid and /etc/subgid disagree: the user's subgid range starts
    elsewhere and is longer than its subuid range. Sandbox users' uids come from the one,
    their gids from the other, for ``id``, files and processes. The two files are private
    copies (in the script's own mount namespace): the host's stay untouched."""
    with _throwaway_user() as (name, uid, gid):
        reason = _userns_allowed(uid, gid, scratch)
        if reason is not None:
            pytest.skip(reason=f"the kernel refuses unprivileged user namespaces here: {reason}")
        uid_start = _free_subid_start()
        gid_start = uid_start + 5 * 65536 + 4096  # another start, not 65536-aligned
        gid_count = 100000  # and another length
        subids = (
            _with_line("/etc/subuid", f"{name}:{uid_start}:65536\n"),
            _with_line("/etc/subgid", f"{name}:{gid_start}:{gid_count}\n"),
        )
        base = _user_base(scratch, uid, gid)
        argv = [sys.executable, "-c", SCRIPT, "ids", base]
        done = _run(_as_user(uid, gid, argv, scratch, subids), timeout=120)
        assert done.returncode == 0, done.stderr
        steps: Dict[str, Dict[str, Any]] = {}
        for line in done.stdout.splitlines():
            item = json.loads(line)
            print(item)
            if "refused" in item:
                pytest.fail(f"rootless refused: {item['refused']}")
            steps[item["step"]] = item
        assert "destroy" in steps, f"scenario stopped after {list(steps)}:\n{done.stderr}"
    # the id maps: 0 is the user (its group), 1-65535 its own subuid / subgid range
    maps = steps["maps"]
    assert maps["health"] in (200, 204)
    assert maps["extents"] == [[[0, uid, 1], [1, uid_start, 65535]],
                               [[0, gid, 1], [1, gid_start, 65535]]], maps
    code, text = maps["result"]
    uid_map, gid_map = (
        [[int(n) for n in row.split()] for row in part.strip().splitlines()]
        for part in text.split("--")
    )
    assert code == 0 and [0, uid, 1] in uid_map and [0, gid, 1] in gid_map, text
    assert [1, uid_start] in [row[:2] for row in uid_map], text
    assert [1, gid_start] in [row[:2] for row in gid_map], text
    # inside, the users are who they should be
    code, text = steps["id"]["sandbox"]
    assert code == 0 and text.startswith("uid=1000(sandbox) gid=1000(sandbox)"), text
    code, text = steps["id"]["user"]
    assert code == 0 and text.startswith("uid=1001(user) gid=1001(user)"), text
    assert steps["write"]["sandbox"][0] == 0 and steps["write"]["user"][0] == 0, steps["write"]
    # files: sandbox:sandbox and user:user inside; on the host each id from its own range
    files = steps["files"]
    assert files["inside"] == [
        0, "/workspace/f 1000:1000 sandbox:sandbox\n/mnt/vol/f 1001:1001 user:user\n"
    ], files
    assert files["workspace"] == [uid_start + 999, gid_start + 999], files
    assert files["volume"] == [uid_start + 1000, gid_start + 1000], files
    assert files["entry"] == [1001, 1001], files  # the volume API maps them back
    # processes: user's sleep runs as the user's ids of each range on the host
    process = steps["process"]
    ids_of_user = [[uid_start + 1000] * 4, [gid_start + 1000] * 4]
    assert process["sleeps"] == [ids_of_user], process
    for uids, gids in process["every"]:
        assert set(uids) <= {uid, uid_start, uid_start + 999, uid_start + 1000}, process
        assert set(gids) <= {gid, gid_start, gid_start + 999, gid_start + 1000}, process
    assert steps["destroy"] == {"step": "destroy", "exists": False, "pids": []}


def _check_steps(steps: Dict[str, Dict[str, Any]], start: int) -> None:
    boot = steps["boot"]
    assert boot["rootless"] is True and boot["freeze"] == "sigstop"
    assert boot["health"] in (200, 204) and boot["seconds"] < 10
    code, text = steps["id"]["result"]
    lines = text.splitlines()
    assert code == 0 and lines[0].startswith("uid=1000(sandbox) gid=1000(sandbox)"), text
    assert lines[1:] == ["root", "rootless-box"], text
    code, text = steps["sandbox-id"]["result"]
    assert code == 0 and text.startswith("uid=1000(sandbox)"), text
    # the ports socket works rootless: a connection to a server bound to ::1, a closed port
    ports = steps["ports"]
    assert ports["head"].startswith("HTTP/1.0 200") and ports["family"] == "AF_INET6", ports
    assert ports["closed"] == "refused", ports
    # a volume bound into a rootless sandbox: the content API sees the writer's uid
    code, text = steps["volume"]["result"]
    assert code == 0, text
    assert steps["volume"]["entry"]["uid"] == int(text) and steps["volume"]["entry"]["size"] == 2
    assert steps["volume"]["host_uid"] == start + int(text) - 1
    code, text = steps["layout"]["result"]
    lines = [line.strip() for line in text.splitlines()]
    assert code == 0, text
    assert lines[:4] == [
        "/workspace sandbox 755",
        "/home/user user 755",
        "/opt/capybara/upload root 700",
        "/skills root 755",
    ], text
    assert lines[4:6] == ["lo", "1"], text  # loopback only, empty routing table
    assert "init.py" in lines[6], text
    upload = steps["upload"]
    assert upload["status"] == 200
    # Inside: sandbox:sandbox; on the host: the user's subordinate ids 999 above the start.
    assert (upload["uid"], upload["gid"]) == (start + 999, start + 999)
    assert upload["inside"] == [0, "sandbox:sandbox\nhello rootless"]
    # a copy of the sandbox's files (forks, snapshots) keeps the sandbox users' ids
    copy = steps["copy"]
    assert (copy["uid"], copy["gid"]) == (start + 999, start + 999) and copy["same_mode"], copy
    # rootless sandboxes have no cgroups: usage from /proc of their processes
    assert copy["sources"] == {"cpu": "proc", "memory": "proc", "disk": "files"}, copy
    assert copy["cpu"] >= 0 and copy["mem"] > 0 and copy["disk"] > 0, copy
    assert "Permission denied" in steps["denied"]["result"][1]
    code, text = steps["base"]["result"]  # the base template: python, sudo for user, boot id
    expected = ["3", steps["base"]["boot_id"]] + (["0"] if os.path.exists("/usr/bin/sudo") else [])
    assert code == 0 and text.split() == expected, text
    freeze = steps["freeze"]
    assert freeze["frozen"] is True and freeze["still"] is True and freeze["resumed"] is True
    assert freeze["states"] and set(freeze["states"].values()) <= {"T", "t"}, freeze
    assert not set(freeze["after"].values()) & {"T", "t"}, freeze
    assert steps["halt"]["pids"] == [] and steps["halt"]["survivors"] == []
    code, text = steps["reboot"]["result"]
    assert code == 0 and text.splitlines() == ["hello rootless", "hello.txt", "tick"], text
    assert steps["destroy"] == {"step": "destroy", "exists": False, "pids": []}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def _wait_for(pred: Any, limit: float = 10.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())
