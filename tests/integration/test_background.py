"""Commands that outlive the call, against the emulator: start, follow, attach from another
process, stdin, kill, kill_all after a crash, pause and resume, and bad input."""

from __future__ import annotations

import hashlib
import io
import json
import os
import string
import subprocess
import sys
import threading
import time
from typing import Dict, List

import pytest
from waiting import run_in_threads, wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    Command,
    CommandEnded,
    CommandNotFound,
    E2BSandboxProvider,
    InvalidArgument,
    OperationTimeout,
    SandboxHandle,
)

from .conftest import root, run_readme_example, unique_name

pytestmark = pytest.mark.integration


def _library_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("e2b-provider"))


def _alive(p: E2BSandboxProvider, h: SandboxHandle, *pgrep: str) -> List[str]:
    """Pids ``pgrep ARGS`` finds (as root: whoever owns them). A ``-f`` pattern should not
    match itself (``capybara-b[g]``): the shell running pgrep has it in its command line."""
    out = root(p, h, "pgrep " + " ".join(pgrep) + " || true")
    return out.split()


def start_follow_and_end(p: E2BSandboxProvider, h: SandboxHandle) -> Command:
    """A command started, listed, followed live one line at a time and ended with exit 4,
    its record kept: checked as any sandbox must show it (also without python3)."""
    go = f"/tmp/go-{unique_name()}"
    c = p.start(h, f"for i in 1 2 3; do echo out $i; echo err $i >&2; "
                   f"while [ ! -e {go}-$i ]; do sleep 0.05; done; done; exit 4", tag="web-1")
    assert c.id.startswith(f"{h.id}:") and c.tag == "web-1" and c.pid > 0
    listed = {info.id: info for info in p.commands(h)}
    assert listed[c.id].pid == c.pid and listed[c.id].tag == "web-1"
    assert listed[c.id].command == c.command and abs(listed[c.id].started_at - time.time()) < 60
    assert c.running
    seen: List[str] = []

    def on_out(text: str) -> None:
        seen.append(text)
        n = "".join(seen).count("\n")
        if n <= 3:
            p.write_file(h, f"{go}-{n}", b"")  # let the command go on, one line at a time

    r = c.wait(timeout=60, on_stdout=on_out)
    assert "".join(seen) == r.stdout == "out 1\nout 2\nout 3\n"
    assert r.stderr == "err 1\nerr 2\nerr 3\n"
    assert (r.exit_code, r.timed_out, r.cancelled, r.truncated) == (4, False, False, False)
    assert not c.running and c.id not in {i.id for i in p.commands(h)}
    assert c.output().stdout == r.stdout
    assert c.wait(timeout=5) == r  # the record stays: waiting again is the same answer
    return c


def test_start_lists_follows_and_ends_with_the_exit_code(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    start_follow_and_end(shared_provider, sandbox)


_STARTER = """
import sys
from e2b_provider import DeploymentConfig, E2BSandboxProvider
cfg = DeploymentConfig(api_key=sys.argv[1], template="base", api_url=sys.argv[2],
                       sandbox_url=sys.argv[3])
with E2BSandboxProvider(cfg) as p:
    c = p.start(sys.argv[4], "for i in $(seq 1 200); do echo line $i; done; "
                "echo oops >&2; sleep 1; exit 7")
    print(c.id, flush=True)
"""


def started_by_another_process(emu, h: SandboxHandle) -> str:  # type: ignore[no-untyped-def]
    """Run :data:`_STARTER` in a Python process of its own, which ends once it started its
    command (200 lines out, ``oops`` on stderr, exit 7); that command's id."""
    starter = subprocess.run(
        [sys.executable, "-c", _STARTER, emu.api_key, emu.api_url, emu.sandbox_url, h.id],
        capture_output=True, text=True, timeout=120, check=True,
    )
    return starter.stdout.strip()


def test_another_process_attaches_after_the_starter_exited(
    emulator, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle  # type: ignore[no-untyped-def]
) -> None:
    p, h = shared_provider, sandbox
    cid = started_by_another_process(emulator, h)
    c = p.attach(h, cid)
    assert c.command.startswith("for i in") and c.id == cid
    r = c.wait(timeout=60)
    assert r.exit_code == 7
    assert r.stdout == "".join(f"line {i}\n" for i in range(1, 201)) and r.stderr == "oops\n"
    # long after it ended, from yet another handle: the same
    assert p.attach(h, cid).wait(timeout=10) == r


def test_100_commands_followed_live_with_few_library_threads(emu) -> None:  # type: ignore[no-untyped-def]
    lines = 40
    with E2BSandboxProvider(emu.config(template="base")) as p:
        boxes = [p.create(unique_name("bg100")) for _ in range(4)]  # 512 MiB each
        try:
            cmds = [p.start(boxes[i % 4], f"for i in $(seq 1 {lines}); do echo c{i} $i; "
                                          "sleep 0.02; done; echo done >&2")
                    for i in range(100)]
            peak = [0]
            got: Dict[int, List[str]] = {i: [] for i in range(100)}
            results = {}

            def follow(i: int) -> None:
                def on_out(text: str) -> None:
                    got[i].append(text)
                    peak[0] = max(peak[0], _library_threads())

                results[i] = cmds[i].wait(timeout=300, on_stdout=on_out)

            run_in_threads(follow, 100, 320)
            assert len(results) == 100
            for i in range(100):
                want = "".join(f"c{i} {n}\n" for n in range(1, lines + 1))
                assert "".join(got[i]) == want and results[i].stdout == want
                assert results[i].exit_code == 0 and results[i].stderr == "done\n"
            assert peak[0] <= 3, peak
        finally:
            for b in boxes:
                p.destroy(b)


def test_stdin_round_trip_of_1_mib(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    data = "".join(string.ascii_letters[i % 52] for i in range(1 << 20)).encode()
    c = p.start(h, "cat", stdin=True, max_output_bytes=2 << 20)
    assert c.stdin
    c.send_stdin(data[: 1 << 19])
    c.send_stdin(data[1 << 19 :].decode())  # str is sent as UTF-8
    c.close_stdin()
    c.close_stdin()  # again: nothing
    r = c.wait(timeout=60)
    assert r.exit_code == 0 and r.stdout.encode() == data and not r.truncated
    with pytest.raises(InvalidArgument, match="closed"):
        c.send_stdin(b"more")
    late = p.attach(h, c.id)
    with pytest.raises(CommandEnded):
        late.send_stdin(b"more")
    plain = p.start(h, "cat")
    with pytest.raises(InvalidArgument, match="without stdin=True"):
        plain.send_stdin(b"x")
    assert plain.wait(timeout=30).exit_code == 0  # /dev/null: cat ends at once


def test_exec_takes_stdin_as_bytes_text_or_a_file(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    assert p.exec(h, "cat", stdin="héllo\n").stdout == "héllo\n"
    blob = os.urandom(3 << 20)
    r = p.exec(h, "sha256sum", stdin=io.BytesIO(blob))
    assert r.stdout.split()[0] == hashlib.sha256(blob).hexdigest()
    # much output before any input is read: the input is written while the output is read
    r = p.exec(h, "head -c 4000000 /dev/zero | tr '\\0' a; wc -c", stdin=blob,
               max_output_bytes=8 << 20)
    assert r.stdout.endswith(f"{len(blob)}\n") and r.exit_code == 0
    r = p.exec(h, "head -c 3", stdin=blob)  # reads less than it is given
    assert r.exit_code == 0 and len(r.stdout.encode("utf-8", "surrogateescape")) >= 1
    assert p.exec(h, "cat").stdout == ""  # no stdin: /dev/null
    with pytest.raises(InvalidArgument):
        p.exec(h, "cat", stdin=12)  # type: ignore[arg-type]


def kill_after_the_first_line(p: E2BSandboxProvider, h: SandboxHandle) -> None:
    """A command killed once its first line came ends cancelled with that line; a second
    kill does nothing."""
    c = p.start(h, "echo started; sleep 300")
    wait_until(lambda: c.output().stdout == "started\n", 30, "the command's first line")
    c.kill()
    r = c.wait(timeout=30)
    assert (r.exit_code, r.cancelled, r.timed_out, r.stdout) == (None, True, False, "started\n")
    c.kill()  # ended: nothing to do


def test_kill_timeout_and_the_tail_of_long_output(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    kill_after_the_first_line(p, h)
    t = p.start(h, "sleep 300", timeout=1)
    r = t.wait(timeout=60)
    assert r.timed_out and r.exit_code is None
    big = p.start(h, "seq 1 300000", max_output_bytes=64 * 1024)
    r = big.wait(timeout=60)
    assert r.truncated and r.exit_code == 0
    assert r.stdout.endswith("299999\n300000\n") and len(r.stdout) <= 64 * 1024
    assert r.stdout == big.output().stdout and big.output().truncated


def test_a_slow_follower_loses_nothing_within_the_cap(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    c = p.start(h, "seq 1 60000", max_output_bytes=1 << 20)  # about 340 KiB
    pieces: List[str] = []

    def slow(text: str) -> None:
        pieces.append(text)
        time.sleep(0.002)  # frames are dropped meanwhile: the gaps are read from the record

    r = c.wait(timeout=120, on_stdout=slow)
    want = "".join(f"{i}\n" for i in range(1, 60001))
    assert "".join(pieces) == want and r.stdout == want and not r.truncated


def a_keyboard_interrupt_stops_only_the_wait(p: E2BSandboxProvider, h: SandboxHandle,
                                             c: Command) -> None:
    """A ``KeyboardInterrupt`` raised by the output callback ends ``c.wait()``; ``c`` runs on,
    listed."""
    def interrupt(text: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        c.wait(timeout=30, on_stdout=interrupt)
    assert c.running and c.id in {i.id for i in p.commands(h)}


def test_stopping_a_wait_leaves_the_command_running(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    c = p.start(h, "echo tick; sleep 300")
    with pytest.raises(OperationTimeout, match="still runs"):
        c.wait(timeout=0.5)
    token = CancelToken()
    threading.Timer(0.3, token.cancel).start()
    with pytest.raises(Cancelled):
        c.wait(cancel=token)
    a_keyboard_interrupt_stops_only_the_wait(p, h, c)
    c.kill()
    assert c.wait(timeout=30).cancelled


def test_bad_ids_are_typed_errors_and_kill_nothing(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    bystander = p.start(h, "sleep 300")
    try:
        with pytest.raises(InvalidArgument, match="not a command id"):
            p.attach(h, "nope")
        with pytest.raises(InvalidArgument, match="belongs to sandbox other"):
            p.attach(h, "other:" + "a" * 32)
        with pytest.raises(CommandNotFound):
            p.attach(h, f"{h.id}:" + "b" * 32)
        with pytest.raises(InvalidArgument):
            p.start(h, "true", max_output_bytes=10)
        with pytest.raises(InvalidArgument):
            p.start(h, "true", stdin="yes")  # type: ignore[arg-type]
        assert bystander.running
    finally:
        bystander.kill()


_CRASHER = """
import os, sys
from e2b_provider import DeploymentConfig, E2BSandboxProvider
cfg = DeploymentConfig(api_key=sys.argv[1], template="base", api_url=sys.argv[2],
                       sandbox_url=sys.argv[3])
p = E2BSandboxProvider(cfg)
ids = [p.start(sys.argv[4], cmd).id for cmd in (
    "sleep 300", "setsid sleep 301 & sleep 302", "(sleep 303 &); sleep 304")]
print(" ".join(ids), flush=True)
os._exit(9)  # a crash: nothing closed, nothing cleaned up
"""


def kill_all_after_a_client_crash(emu, p: E2BSandboxProvider,  # type: ignore[no-untyped-def]
                                  h: SandboxHandle) -> List[str]:
    """Run :data:`_CRASHER` in a Python process of its own (its three commands, five sleeps,
    outlive it), then ``p.kill_all(h)``: no sleep and no supervisor is left. The three
    commands' ids."""
    crashed = subprocess.run(
        [sys.executable, "-c", _CRASHER, emu.api_key, emu.api_url, emu.sandbox_url, h.id],
        capture_output=True, text=True, timeout=120,
    )
    assert crashed.returncode == 9, crashed.stderr
    ids = crashed.stdout.split()
    assert len(ids) == 3
    wait_until(lambda: len(_alive(p, h, "-x", "sleep")) == 5, 30, "the five sleeps")
    assert {i.id for i in p.commands(h)} == set(ids)
    p.kill_all(h)
    wait_until(lambda: not _alive(p, h, "-x", "sleep"), 30, "no command left")
    wait_until(lambda: not _alive(p, h, "-f", "'capybara-b[g] '"), 30, "no supervisor left")
    return ids


def test_kill_all_after_a_client_crash_leaves_nothing_running(emu) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emu.config(template="base")) as p:
        h = p.create(unique_name("bgcrash"))
        try:
            ids = kill_all_after_a_client_crash(emu, p, h)
            assert p.commands(h) == []
            for cid in ids:  # each end is recorded, by the supervisor that watched it
                r = p.attach(h, cid).wait(timeout=10)
                assert r.exit_code == 137 and not r.cancelled
        finally:
            p.destroy(h)


def test_a_command_runs_on_through_a_pause(emu) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emu.config(template="base")) as p:
        h = p.create(unique_name("bgpause"))
        try:
            c = p.start(h, "i=0; while [ $i -lt 100000 ]; do echo $i; i=$((i+1)); "
                           "sleep 0.05; done")
            wait_until(lambda: c.output().stdout.count("\n") >= 5, 30, "some lines")
            p.suspend(h)
            p.resume(h)
            before = c.output().stdout.count("\n")
            wait_until(lambda: c.output().stdout.count("\n") > before + 5, 30,
                       "more lines after the resume")
            assert c.running
            out = c.output().stdout.split()
            assert out == [str(i) for i in range(len(out))]  # none lost, none repeated
            c.kill()
            assert c.wait(timeout=30).cancelled
        finally:
            p.destroy(h)


def test_records_are_the_sandbox_users_own(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    c = p.start(h, "true")
    c.wait(timeout=30)
    cid = c.id.rsplit(":", 1)[1]
    listing = root(p, h, f"stat -c '%U %a' /tmp/.capybara-cmd /tmp/.capybara-cmd/{cid}")
    assert listing.split("\n")[:2] == ["user 700", "user 700"] or listing.split(
        "\n")[:2] == ["sandbox 700", "sandbox 700"], listing
    meta = json.loads(root(p, h, f"cat /tmp/.capybara-cmd/{cid}/meta.json"))
    assert meta["id"] == cid and meta["pid"] == c.pid


def test_the_readme_dev_server_example_runs_as_written() -> None:
    out = run_readme_example("### Long-running commands")
    lines = out.stdout.splitlines()
    assert lines[0] == "200" and lines[-1] == "True"
    assert '"GET / HTTP/1.1" 200' in out.stdout  # the server's own log, read back


def test_kill_tagged_reaches_background_commands_and_spares_others(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    p, h = shared_provider, sandbox
    mine = p.start(h, "sleep 300", tag="holder-a")
    other = p.start(h, "sleep 300", tag="holder-b")
    untagged = p.start(h, "sleep 300")
    p.kill_tagged(h, ["holder-a"])
    r = mine.wait(timeout=30)
    assert r.exit_code == 137 and not r.cancelled
    assert other.running and untagged.running
    for c in (other, untagged):
        c.kill()
        assert c.wait(timeout=30).cancelled


def test_misusing_a_command_raises_and_leaves_it_running(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    """Every ``Command`` method refuses bad use with a typed error and never stops the
    command: a call without ``stdin=True``, bad arguments, a raising callback, a cancelled
    or timed-out wait, input cancelled mid-way."""
    p, h = shared_provider, sandbox
    plain = p.start(h, "echo up; sleep 300", tag="misuse")
    fed = p.start(h, "echo up; cat > /dev/null; sleep 300", stdin=True, tag="misuse")

    def raising(_text: str) -> None:
        raise ValueError("the caller's callback failed")

    fired = CancelToken()
    fired.cancel()
    soon = CancelToken()
    misuses = [
        (lambda: plain.send_stdin(b"x"), InvalidArgument, "without stdin=True"),
        (lambda: plain.close_stdin(), InvalidArgument, "without stdin=True"),
        (lambda: fed.send_stdin(42), InvalidArgument, "bytes or str"),  # type: ignore[arg-type]
        (lambda: fed.send_stdin(b"x", cancel=5), InvalidArgument, "CancelToken"),  # type: ignore[arg-type]
        (lambda: fed.close_stdin(cancel="now"), InvalidArgument, "CancelToken"),  # type: ignore[arg-type]
        (lambda: plain.wait(-1), InvalidArgument, "non-negative"),
        (lambda: plain.wait("5"), InvalidArgument, "non-negative"),  # type: ignore[arg-type]
        (lambda: plain.wait(5, on_stdout=5), InvalidArgument, "callable"),  # type: ignore[arg-type]
        (lambda: plain.wait(5, cancel=5), InvalidArgument, "CancelToken"),  # type: ignore[arg-type]
        (lambda: plain.output(cancel="x"), InvalidArgument, "CancelToken"),  # type: ignore[arg-type]
        (lambda: plain.kill(cancel=object()), InvalidArgument, "CancelToken"),  # type: ignore[arg-type]
        (lambda: plain.wait(5, cancel=fired), Cancelled, "cancelled"),
        (lambda: plain.wait(0.3), OperationTimeout, "still runs"),
        (lambda: plain.wait(30, on_stdout=raising), ValueError, "callback failed"),
        (lambda: fed.send_stdin(b"x" * (8 << 20), cancel=soon), Cancelled, "cancelled"),
    ]
    threading.Timer(0.05, soon.cancel).start()  # mid-way through the 8 MiB of input
    for misuse, kind, words in misuses:
        with pytest.raises(kind, match=words):
            misuse()
    for c in (plain, fed):
        assert c.running, c
    # and each still works as before
    fed.send_stdin("more\n")
    fed.close_stdin()
    assert "up\n" in plain.output().stdout
    for c in (plain, fed):
        c.kill()
        assert c.wait(timeout=30).cancelled
