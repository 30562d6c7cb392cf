"""Background commands in a sandbox without python3, against the emulator: every call goes
through the shell supervisor and the shell record readers, and does what it does with
python3 (start with stdin, tag and timeout, live follow, output and its cap, running,
attach from another provider and another process, commands, input, kill, kill_all,
kill_tagged, the README's dev-server flow); the sandbox is remembered after one failed start.

The sandboxes are made from the emulator's template ``base-without-python3`` (E2B's base
with ``python3`` hidden from ``PATH``); the emulator's own envd runs from an interpreter
bound outside ``PATH``.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator, List, Tuple

import pytest
from waiting import wait_until

from e2b_provider import (
    Cancelled,
    CancelToken,
    CommandEnded,
    E2BSandboxProvider,
    InvalidArgument,
    OperationTimeout,
    SandboxHandle,
)
from e2b_provider.emulator import Emulator

from .conftest import NO_PYTHON, count_requests, root, unique_name
from .test_background import (
    _alive,
    a_keyboard_interrupt_stops_only_the_wait,
    kill_after_the_first_line,
    kill_all_after_a_client_crash,
    start_follow_and_end,
    started_by_another_process,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bare_emu(emulator: Emulator) -> Iterator[Emulator]:
    """The session's emulator (its template without python3 is asked for by name)."""
    yield emulator


@pytest.fixture(scope="module")
def bare(bare_emu: Emulator) -> Iterator[Tuple[E2BSandboxProvider, SandboxHandle]]:
    """A provider and a sandbox without python3 (checked as the sandbox user)."""
    with E2BSandboxProvider(bare_emu.config(template=NO_PYTHON)) as p:
        h = p.create(unique_name("nopy"))
        try:
            r = p.exec(h, "command -v python3 || echo none")
            assert r.stdout == "none\n", r
            yield p, h
        finally:
            p.destroy(h)


def test_start_follows_live_lists_and_ends_with_the_exit_code(
    bare: Tuple[E2BSandboxProvider, SandboxHandle],
) -> None:
    p, h = bare
    c = start_follow_and_end(p, h)
    assert not c._frames  # the shell supervisor's
    cid = c.id.rsplit(":", 1)[1]
    listing = root(p, h, f"stat -c '%U %a' /tmp/.capybara-cmd /tmp/.capybara-cmd/{cid}")
    assert listing.split("\n")[:2] == ["sandbox 700", "sandbox 700"], listing


def test_stdin_round_trip_and_its_close(bare: Tuple[E2BSandboxProvider, SandboxHandle]) -> None:
    p, h = bare
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    c = p.start(h, "cat", stdin=True, max_output_bytes=2 << 20)
    assert c.stdin
    c.send_stdin(data[: 1 << 19])
    c.send_stdin(data[1 << 19 :])
    c.close_stdin()
    c.close_stdin()  # again: nothing
    r = c.wait(timeout=60)
    assert r.exit_code == 0 and not r.truncated
    assert r.stdout == data.decode("utf-8", "replace")
    with pytest.raises(InvalidArgument, match="closed"):
        c.send_stdin(b"more")
    with pytest.raises(CommandEnded):
        p.attach(h, c.id).send_stdin(b"more")
    fed = p.start(h, "read -r line; echo got $line", stdin=True)
    fed.send_stdin("héllo\n")
    assert fed.wait(timeout=30).stdout == "got héllo\n"
    plain = p.start(h, "cat")
    with pytest.raises(InvalidArgument, match="without stdin=True"):
        plain.send_stdin(b"x")
    assert plain.wait(timeout=30).exit_code == 0  # /dev/null: cat ends at once


def test_kill_timeout_and_the_tail_of_long_output(
    bare: Tuple[E2BSandboxProvider, SandboxHandle],
) -> None:
    p, h = bare
    kill_after_the_first_line(p, h)
    t = p.start(h, "sleep 300", timeout=1)
    r = t.wait(timeout=60)
    assert r.timed_out and r.exit_code is None and not r.cancelled
    big = p.start(h, "seq 1 300000", max_output_bytes=64 * 1024)
    r = big.wait(timeout=60)
    assert r.truncated and r.exit_code == 0
    assert r.stdout.endswith("299999\n300000\n") and len(r.stdout) == 64 * 1024
    out = big.output()
    assert out.stdout == r.stdout and out.truncated and out.stderr == ""
    files = root(p, h, f"ls /tmp/.capybara-cmd/{big.id.rsplit(':', 1)[1]}").split()
    assert files == ["meta.json", "status.json", "stdout.29", "stdout.30"]  # the cap is kept


def test_stopping_a_wait_leaves_the_command_running(
    bare: Tuple[E2BSandboxProvider, SandboxHandle],
) -> None:
    p, h = bare
    c = p.start(h, "echo tick; sleep 300")
    t0 = time.monotonic()
    with pytest.raises(OperationTimeout, match="still runs"):
        c.wait(timeout=0.5)
    assert time.monotonic() - t0 < 5
    token = CancelToken()
    threading.Timer(0.3, token.cancel).start()
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        c.wait(cancel=token)  # while a read waits in the sandbox for news
    assert time.monotonic() - t0 < 2
    a_keyboard_interrupt_stops_only_the_wait(p, h, c)
    c.kill()
    r = c.wait(timeout=30)
    assert r.cancelled and r.stdout == "tick\n"


def test_another_process_and_another_provider_attach(
    bare_emu: Emulator, bare: Tuple[E2BSandboxProvider, SandboxHandle],
) -> None:
    p, h = bare
    cid = started_by_another_process(bare_emu, h)
    with E2BSandboxProvider(bare_emu.config(template=NO_PYTHON)) as fresh:
        c = fresh.attach(h, cid)  # knows nothing of the sandbox yet: the agent cannot run
        assert c.command.startswith("for i in") and c.id == cid and not c._frames
        r = c.wait(timeout=60)
    assert r.exit_code == 7
    assert r.stdout == "".join(f"line {i}\n" for i in range(1, 201)) and r.stderr == "oops\n"
    assert p.attach(h, cid).wait(timeout=10) == r


def test_kill_all_after_a_client_crash_and_kill_tagged(bare_emu: Emulator) -> None:
    with E2BSandboxProvider(bare_emu.config(template=NO_PYTHON)) as p:
        h = p.create(unique_name("nopycrash"))
        try:
            ids = kill_all_after_a_client_crash(bare_emu, p, h)
            wait_until(lambda: not _alive(p, h, "-x", "split"), 30, "no output keeper left")
            assert p.commands(h) == []
            for cid in ids:  # each end is recorded, by the supervisor that watched it
                r = p.attach(h, cid).wait(timeout=10)
                assert r.exit_code == 137 and not r.cancelled
            mine = p.start(h, "sleep 300", tag="holder-a")
            other = p.start(h, "sleep 300", tag="holder-b")
            p.kill_tagged(h, ["holder-a"])
            r = mine.wait(timeout=30)
            assert r.exit_code == 137 and not r.cancelled
            assert other.running
            other.kill()
            assert other.wait(timeout=30).cancelled
        finally:
            p.destroy(h)


#: The README's dev-server example with a server that needs no python3 (perl's).
_PERL_SERVER = (
    "perl -MIO::Socket::INET -e '$| = 1; my $s = IO::Socket::INET->new(LocalAddr => "
    "q(127.0.0.1:8000), Listen => 5, ReuseAddr => 1) or die; while (my $c = $s->accept) "
    "{ my $l = <$c>; $l =~ s/\\r?\\n$//; print STDERR qq(\"$l\" 200\\n); "
    "print $c qq(HTTP/1.0 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok); close $c }'"
)


def test_the_readme_dev_server_flow(bare: Tuple[E2BSandboxProvider, SandboxHandle]) -> None:
    p, h = bare
    server = p.start(h, _PERL_SERVER, tag="dev-server")
    up = p.exec(h, "for i in $(seq 100); do (: < /dev/tcp/127.0.0.1/8000) 2>/dev/null "
                   "&& exit 0; sleep 0.1; done; exit 1")
    assert up.ok
    page = p.exec(h, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/")
    assert page.stdout == "200"
    assert server.id in [c.id for c in p.commands(h)]
    wait_until(lambda: '"GET / HTTP/1.1" 200' in server.output().stderr, 30, "the log line")
    server.kill()
    assert server.wait().cancelled
    assert server.id not in [c.id for c in p.commands(h)]


def test_the_sandbox_is_remembered_after_one_start(
    bare_emu: Emulator, bare: Tuple[E2BSandboxProvider, SandboxHandle],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, h = bare
    with E2BSandboxProvider(bare_emu.config(template=NO_PYTHON)) as p:
        sent = count_requests(p, monkeypatch)
        assert p.start(h, "true").wait(timeout=30).exit_code == 0
        assert sent.count("POST Start") >= 2  # python3's supervisor, then the shell's
        assert p._background.lacks_python(h.id)
        del sent[:]
        c = p.start(h, "echo again")
        assert sent.count("POST Start") == 1
        assert c.wait(timeout=30).stdout == "again\n"
    with E2BSandboxProvider(bare_emu.config(template=NO_PYTHON)) as p:
        p.stat(h, "/workspace")  # starts a file agent in the background, which cannot run
        wait_until(lambda: p._files._agents.unavailable(h.id) is not None, 30,
                   "the agent found unavailable")
        sent = count_requests(p, monkeypatch)
        p.start(h, "true")
        assert sent.count("POST Start") == 1  # straight to the shell's supervisor


def test_with_python3_the_python_supervisor_runs_alone(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, h = shared_provider, sandbox
    sent = count_requests(p, monkeypatch)
    c = p.start(h, "echo with python")
    assert sent.count("POST Start") == 1 and c._frames
    assert not p._background.lacks_python(h.id)
    assert c.wait(timeout=30).stdout == "with python\n"


def test_a_shell_supervised_command_is_followed_through_the_file_agent(
    emulator: Emulator, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle,
) -> None:
    """Where python3 runs after all, the file agent reads the shell supervisor's record (the
    same layout), and a follower without live frames reads it again after a short pause."""
    p, h = shared_provider, sandbox
    p._background._mark_no_python(h.id)  # as if its python3 could not run
    try:
        c = p.start(h, "for i in 1 2 3; do echo line $i; sleep 0.2; done; echo e >&2; exit 3",
                    max_output_bytes=4096)
    finally:
        with p._background._lock:
            p._background._no_python.pop(h.id, None)
    assert not c._frames
    with E2BSandboxProvider(emulator.config(template="base")) as fresh:
        late = fresh.attach(h, c.id)
        assert not fresh._background.lacks_python(h.id) and not late._frames
        seen: List[str] = []
        r = late.wait(timeout=60, on_stdout=seen.append)
        assert fresh._files._agents.sessions()  # read by the file agent
    assert "".join(seen) == r.stdout == "line 1\nline 2\nline 3\n"
    assert (r.exit_code, r.stderr, r.truncated) == (3, "e\n", False)
    assert c.output().stdout == r.stdout
