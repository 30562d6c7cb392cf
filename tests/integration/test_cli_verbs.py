"""The command line's verbs as docker and kubectl users expect them, against the emulator:
``cp`` with ``-`` (a tar stream on stdout or stdin, as ``docker cp``), ``port-forward`` (as
``kubectl port-forward``), ``logs --tail N`` (as ``docker logs --tail``), and ``create`` that
refuses a name in use unless ``--replace``."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import socket
import subprocess
import tarfile
from typing import Dict, Iterator, List, Tuple

import pytest
import requests
from command_line import CLI, cli_env, default_sigint, run, started
from local_trees import tar_entry, tar_of
from waiting import wait_until

from e2b_provider import E2BSandboxProvider, SandboxHandle

from .conftest import serve, unique_name

pytestmark = pytest.mark.integration


@pytest.fixture
def env(emu) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    return cli_env(emu)


@pytest.fixture
def sb(provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    """A sandbox with a name (the CLI is given ``sb.name``)."""
    h = provider.create(unique_name("cliverb"))
    yield h
    provider.destroy(h)


def one_error_line(r: subprocess.CompletedProcess, code: int) -> str:  # type: ignore[type-arg]
    err = r.stderr.decode() if isinstance(r.stderr, bytes) else r.stderr
    assert r.returncode == code, (r.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("e2b-provider: error: "), err
    return lines[0]


def members(data: bytes) -> Dict[str, Tuple[str, bytes]]:
    """Each member of the tar stream ``data``: its kind and content (a link: its target)."""
    out: Dict[str, Tuple[str, bytes]] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        for m in tf:
            if m.isfile():
                f = tf.extractfile(m)
                assert f is not None
                out[m.name] = ("file", f.read())
            elif m.isdir():
                out[m.name] = ("dir", b"")
            elif m.issym():
                out[m.name] = ("link", m.linkname.encode())
            else:
                out[m.name] = ("other", b"")
    return out


def listing(p: E2BSandboxProvider, h: SandboxHandle, path: str) -> List[str]:
    return sorted(p.exec(h, f"cd {path} && find . | sort").stdout.split())


# -- cp with - ----------------------------------------------------------------------------------


def test_cp_to_stdout_writes_a_tar_stream_named_from_the_base_name(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    name = str(sb.name)
    provider.exec(sb, "mkdir -p /workspace/proj/src && printf 'one\\n' > /workspace/proj/a.txt"
                  " && printf 'two' > /workspace/proj/src/b.py && chmod 755 /workspace/proj/"
                  "src/b.py && ln -s a.txt /workspace/proj/link")
    big = os.urandom(3 << 20)
    provider.write_file(sb, "/workspace/proj/big.bin", big)
    r = subprocess.run([*CLI, "cp", f"{name}:/workspace/proj", "-"], env=env, cwd=tmp_path,
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=120,
                       preexec_fn=default_sigint)
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(tmp_path / "-")  # no local file named -
    got = members(r.stdout)
    assert got == {
        "proj": ("dir", b""), "proj/a.txt": ("file", b"one\n"), "proj/big.bin": ("file", big),
        "proj/link": ("link", b"a.txt"), "proj/src": ("dir", b""),
        "proj/src/b.py": ("file", b"two"),
    }
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tf:
        assert tf.getmember("proj/src/b.py").mode & 0o777 == 0o755
    # a single file: one member, its base name; -r is not needed (docker cp has none)
    r = run(env, "cp", f"{name}:/workspace/proj/a.txt", "-", stdin=b"")
    assert (r.returncode, members(r.stdout)) == (0, {"a.txt": ("file", b"one\n")}), r.stderr
    # nothing there: one line, exit 1, nothing on stdout
    r = run(env, "cp", f"{name}:/workspace/nothing", "-", stdin=b"")
    assert "no such file or directory" in one_error_line(r, 1) and r.stdout == b""


def test_cp_to_stdout_leaves_out_what_could_escape_and_says_so(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    """The sandbox is hostile: a link to an absolute path, or one that leads outside the
    tree, never reaches the stream (a ``tar x`` of it could write through it); the rest
    does, and the command fails naming them, as tar does with what it could not read."""
    provider.exec(sb, "mkdir -p /workspace/t && echo ok > /workspace/t/ok.txt && "
                  "ln -s /etc/passwd /workspace/t/abs && ln -s ../../etc /workspace/t/up && "
                  "mkfifo /workspace/t/fifo")
    r = run(env, "cp", f"{sb.name}:/workspace/t", "-", stdin=b"")
    line = one_error_line(r, 1)
    assert "left out of the tar stream" in line and "abs" in line and "up" in line, line
    assert members(r.stdout) == {"t": ("dir", b""), "t/ok.txt": ("file", b"ok\n")}


def test_cp_from_stdin_extracts_a_tar_stream_into_the_directory(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    name = str(sb.name)
    provider.exec(sb, "mkdir -p /workspace/in && echo keep > /workspace/in/old.txt")
    payload = os.urandom(2 << 20)
    stream = tar_of(
        tar_entry("./", tarfile.DIRTYPE, mode=0o700),  # as tar c -C dir . writes it
        tar_entry("./a.txt"), tar_entry("./bin/", tarfile.DIRTYPE, mode=0o755),
        tar_entry("./bin/run", mode=0o755), tar_entry("./bin/data"),
        tar_entry("./bin/link", tarfile.SYMTYPE, link="run"),
        data={"./a.txt": b"hello\n", "./bin/run": b"#!/bin/sh\necho ran\n",
              "./bin/data": payload},
    )
    r = run(env, "cp", "-", f"{name}:/workspace/in", stdin=stream)
    assert (r.returncode, r.stdout) == (0, b""), r.stderr
    assert listing(provider, sb, "/workspace/in") == [
        ".", "./a.txt", "./bin", "./bin/data", "./bin/link", "./bin/run", "./old.txt"]
    assert provider.exec(sb, "/workspace/in/bin/link").stdout == "ran\n"
    sums = provider.exec(sb, "sha256sum < /workspace/in/bin/data").stdout.split()[0]
    assert sums == hashlib.sha256(payload).hexdigest()
    assert provider.read_file(sb, "/workspace/in/a.txt").data == b"hello\n"
    # the destination directory keeps its own mode (./ is the destination, not an entry)
    assert provider.exec(sb, "stat -c %a /workspace/in").stdout.strip() == "755"
    # compressed, as docker cp - takes it, and names with a leading / (stripped)
    gz = tar_of(tar_entry("/abs.txt"), data={"/abs.txt": b"gz\n"}, mode="w:gz")
    r = run(env, "cp", "-", f"{name}:/workspace/in", stdin=gz)
    assert r.returncode == 0, r.stderr
    assert provider.read_file(sb, "/workspace/in/abs.txt").data == b"gz\n"


@pytest.mark.parametrize("bad", [
    [tar_entry("evil", tarfile.SYMTYPE, link="/etc")],
    [tar_entry("../up.txt")],
    [tar_entry("d/../../up.txt")],
    [tar_entry("out", tarfile.SYMTYPE, link="../.."), tar_entry("out/x.txt")],
    [tar_entry("hard", tarfile.LNKTYPE, link="/etc/passwd")],
    [tar_entry("hard", tarfile.LNKTYPE, link="first.txt")],
    [tar_entry("dev", tarfile.CHRTYPE)],
], ids=["absolute link", "dotdot", "inner dotdot", "write through a link", "hard link out",
        "hard link in", "device"])
def test_cp_from_stdin_refuses_an_unsafe_stream_whole(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider,
    bad: List[tarfile.TarInfo]
) -> None:
    provider.exec(sb, "mkdir -p /workspace/dst/d && echo keep > /workspace/dst/old.txt")
    before = listing(provider, sb, "/workspace")
    stream = tar_of(tar_entry("first.txt"), *bad, data={"first.txt": b"1\n", "out/x.txt": b"x\n",
                                                     "../up.txt": b"u\n",
                                                     "d/../../up.txt": b"u\n"})
    r = run(env, "cp", "-", f"{sb.name}:/workspace/dst", stdin=stream)
    line = one_error_line(r, 1)
    assert "refused, nothing was copied" in line, line
    assert listing(provider, sb, "/workspace") == before  # not even first.txt


def test_cp_dash_usage_and_destination_errors(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    name = str(sb.name)
    provider.write_file(sb, "/workspace/file.txt", b"x")
    ok = tar_of(tar_entry("a.txt"), data={"a.txt": b"a"})
    for args in (["-", "local"], ["local", "-"], ["-", "-"]):
        assert "tar stream" in one_error_line(run(env, "cp", *args, stdin=ok), 2)
    line = one_error_line(run(env, "cp", "-", f"{name}:/workspace/none", stdin=ok), 1)
    assert "no such directory" in line
    line = one_error_line(run(env, "cp", "-", f"{name}:/workspace/file.txt", stdin=ok), 1)
    assert "not a directory" in line
    line = one_error_line(run(env, "cp", "-", f"{name}:/workspace", stdin=b"not a tar\n"), 1)
    assert "not a whole tar stream" in line
    cut = tar_of(tar_entry("big"), data={"big": os.urandom(100_000)})[:50_000]
    assert "not a whole tar stream" in one_error_line(
        run(env, "cp", "-", f"{name}:/workspace", stdin=cut), 1)
    assert provider.exec(sb, "ls /workspace").stdout.split() == ["file.txt"]


# -- port-forward -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def forwarded(child: subprocess.Popen[str], n: int) -> List[Tuple[str, int]]:
    """The ``Forwarding from ADDRESS -> PORT`` lines the child printed first (``n`` of them)."""
    assert child.stdout is not None
    out = []
    for _ in range(n):
        line = child.stdout.readline()
        words = line.split()
        assert words[:2] == ["Forwarding", "from"] and words[3] == "->", line
        out.append((words[2], int(words[4])))
    return out


def test_port_forward_as_kubectl(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    port = free_port()  # the sandbox's server listens on it; so will we, by default
    serve(provider, sb, port)
    chosen = free_port()
    with started(env, "port-forward", str(sb.name), str(port), f":{port}", f"0:{port}",
                 f"{chosen}:{port}") as child:
        lines = forwarded(child, 4)
        addresses = [a for a, _ in lines]
        assert [r for _, r in lines] == [port] * 4
        assert addresses[0] == f"127.0.0.1:{port}"  # REMOTE alone: the same port here
        assert addresses[3] == f"127.0.0.1:{chosen}"
        for a in addresses[1:3]:  # :REMOTE and 0:REMOTE: a free one
            assert a.startswith("127.0.0.1:") and int(a.split(":")[1]) not in (0, port)
        for a in addresses:
            assert requests.get(f"http://{a}/hello", timeout=10).text == "hello\n"
        # the port is ours until we stop: a second port-forward to it fails (exit 1)
        r = run(env, "port-forward", str(sb.name), f"{chosen}:{port}")
        assert "cannot listen on 127.0.0.1:" in one_error_line(r, 1)
        child.send_signal(signal.SIGINT)
        assert child.wait(30) == 0  # as kubectl port-forward: Ctrl-C ends it, status 0
        assert child.stderr is not None and "Traceback" not in child.stderr.read()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{chosen}/hello", timeout=5)
    for bad in ("70000", "x:80", "-1:80", "0"):
        r = run(env, "port-forward", str(sb.name), bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (bad, r.stderr)
    # --address as kubectl's: every address listed, one free port shared by all of them
    with started(env, "port-forward", "--address", "127.0.0.2,localhost", str(sb.name),
                 f":{port}") as child:
        (second, remote), (loop, _) = forwarded(child, 2)
        local = second.split(":")[1]
        assert remote == port and second == f"127.0.0.2:{local}" and loop == f"127.0.0.1:{local}"
        for a in (second, loop):
            assert requests.get(f"http://{a}/hello", timeout=10).text == "hello\n"
        with pytest.raises(requests.ConnectionError):  # an address not listed
            requests.get(f"http://127.0.0.3:{local}/hello", timeout=5)
        child.send_signal(signal.SIGINT)
        assert child.wait(30) == 0
    r = run(env, "port-forward", "--address", "example.com", str(sb.name), str(port))
    assert r.returncode == 2 and "IP address or localhost" in r.stderr
    # forward keeps its own reading: a port alone is served on a free local port
    with started(env, "forward", str(sb.name), str(port)) as child:
        ((address, remote),) = forwarded(child, 1)
        assert remote == port and address != f"127.0.0.1:{port}"
        assert requests.get(f"http://{address}/hello", timeout=10).text == "hello\n"
        child.send_signal(signal.SIGINT)
        assert child.wait(30) == 0


# -- logs --tail --------------------------------------------------------------------------------


def test_logs_tail_shows_the_last_lines_of_each_stream(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    name = str(sb.name)
    r = run(env, "start", name, "--", "for i in $(seq 1 20); do echo out$i; echo err$i >&2; "
            "done; printf 'no newline'")
    cid = r.stdout.strip()
    c = provider.attach(sb, cid)
    c.wait(timeout=60)
    r = run(env, "logs", "--tail", "3", name, cid)
    assert (r.returncode, r.stdout, r.stderr) == (0, "out19\nout20\nno newline",
                                                  "err18\nerr19\nerr20\n")
    r = run(env, "logs", "-n", "0", name, cid)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    whole = run(env, "logs", name, cid)
    for every in ("all", "-1", "1000"):
        r = run(env, "logs", f"--tail={every}", name, cid)
        assert (r.stdout, r.stderr) == (whole.stdout, whole.stderr), every
    for bad in ("x", "-2", "1.5"):
        assert run(env, "logs", "--tail", bad, name, cid).returncode == 2


def test_logs_tail_then_follow_shows_each_line_once(
    env: Dict[str, str], sb: SandboxHandle, provider: E2BSandboxProvider
) -> None:
    name = str(sb.name)
    r = run(env, "start", name, "--", "for i in $(seq 1 50); do echo line$i; done; echo e1 >&2;"
            " while [ ! -e /tmp/go ]; do sleep 0.05; done; echo after; echo e2 >&2; exit 5")
    cid = r.stdout.strip()
    wait_until(lambda: "e1" in provider.attach(sb, cid).output().stderr, 60,
               "the command's first output")
    with started(env, "logs", "--tail", "2", "-f", name, cid) as child:
        assert child.stdout is not None
        assert [child.stdout.readline() for _ in range(2)] == ["line49\n", "line50\n"]
        provider.write_file(sb, "/tmp/go", b"")
        out, err = child.communicate(timeout=60)
    assert (child.returncode, out, err) == (5, "after\n", "e1\ne2\n")
    # once it ended: the tail of all it printed, then its status
    r = run(env, "logs", "-f", "--tail", "1", name, cid)
    assert (r.returncode, r.stdout, r.stderr) == (5, "after\n", "e2\n")


# -- create --replace ---------------------------------------------------------------------------


def test_create_refuses_a_name_in_use_unless_replace(
    env: Dict[str, str], provider: E2BSandboxProvider
) -> None:
    name = unique_name("clidup")
    try:
        r = run(env, "create", name)
        assert r.returncode == 0, r.stderr
        first = r.stdout.strip()
        provider.write_file(first, "/workspace/work.txt", b"precious")
        r = run(env, "create", name)
        line = one_error_line(r, 1)
        assert first in line and "--replace" in line and name in line, line
        assert r.stdout == ""
        (still,) = provider.list_sandboxes(name)
        assert still.id == first
        assert provider.read_file(first, "/workspace/work.txt").data == b"precious"
        # paused counts too: its files are there
        provider.suspend(first)
        assert first in one_error_line(run(env, "create", name), 1)
        r = run(env, "create", "--replace", name)
        assert r.returncode == 0, r.stderr
        second = r.stdout.strip()
        assert second != first
        assert [s.id for s in provider.list_sandboxes(name)] == [second]
        # a bad name is a usage error before any request, as before
        assert run(env, "create", "--replace", "bad name!").returncode == 2
    finally:
        provider.destroy_by_name(name)
