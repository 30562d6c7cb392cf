"""What becomes of a terminal around its handle, against the emulator: one whose client was
SIGKILLed is listed by commands() and ps, attached to and killed; a process the sandbox user
dresses as one is not listed; a handle left unread longer than the stream's silence bound
reads on (also once the output filled every buffer on the way), while a peer that really
went silent is still caught; and the calls of a terminal whose sandbox was deleted or
paused, and attaches to ids that name no terminal, raise the error that says so."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Dict, Iterator, List

import pytest
from command_line import cli_env
from waiting import wait_until

from e2b_provider import E2BSandboxProvider, SandboxHandle, Terminal
from e2b_provider.commands.terminal_wrapper import TERMINAL_WRAPPER
from e2b_provider.commands.terminal_wrapper import listed_terminal as _listed_terminal
from e2b_provider.errors import (
    CommandNotFound,
    InvalidArgument,
    SandboxGoneError,
    SandboxPaused,
    TransportTimeout,
)
from e2b_provider.transport.client import Transport
from e2b_provider.transport.raw_stream import RawStream

from .conftest import child_config, count_requests, own_sandbox, root, unique_name, until

pytestmark = pytest.mark.integration

#: The silence bound of a stream of a provider with ``keepalive_seconds=1`` (twice the
#: keepalive plus 10 s).
SILENCE_BOUND = 12.0


@pytest.fixture
def sb(shared_provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    """A sandbox of the test's own (some tests delete or pause it)."""
    with own_sandbox(shared_provider, "tl") as h:
        yield h


# -- terminals of a client that died ------------------------------------------------------------

OPENER = textwrap.dedent(
    """
    import json, sys
    from e2b_provider import DeploymentConfig, E2BSandboxProvider
    cfg = DeploymentConfig(**json.loads(sys.argv[1]))
    p = E2BSandboxProvider(cfg)
    t = p.terminal(sys.argv[2], sys.argv[3])
    print(t.id, flush=True)
    sys.stdin.read()  # until the test kills us
    """
)

BEATING = "i=0; while :; do echo \"beat $i\"; i=$((i+1)); sleep 1; done"


def test_a_terminal_of_a_killed_client_is_listed_attached_and_killed(
    shared_provider: E2BSandboxProvider, sb: SandboxHandle, emulator  # type: ignore[no-untyped-def]
) -> None:
    t0 = float(root(shared_provider, sb, "date +%s.%N"))  # the sandbox's clock
    opener = subprocess.Popen(
        [sys.executable, "-c", OPENER, json.dumps(child_config(emulator)), sb.id, BEATING],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert opener.stdout is not None
        tid = opener.stdout.readline().strip()
        assert re.fullmatch(rf"{sb.id}:pty-\d+-[0-9a-f]{{32}}", tid), tid
    finally:
        opener.kill()  # SIGKILL: nothing of it runs on to clean up
        opener.communicate(timeout=60)
    assert opener.returncode == -signal.SIGKILL
    bg = shared_provider.start(sb, "sleep 600")  # a background command is listed beside it

    with E2BSandboxProvider(emulator.config(template="base")) as fresh:
        info, cmd = fresh.commands(sb)  # oldest first
        assert (info.id, cmd.id) == (tid, bg.id)
        assert (info.kind, info.tag, info.command) == ("terminal", None, BEATING)
        assert tid == f"{sb.id}:pty-{info.pid}-{tid.rsplit('-', 1)[1]}"
        assert cmd.kind == "command"
        # when it started, by the sandbox's clock
        assert t0 - 1 <= info.started_at <= cmd.started_at

        shell = shared_provider.terminal(sb)  # the login shell: no command to show
        ps = subprocess.run([sys.executable, "-m", "e2b_provider", "ps", "--no-trunc", sb.id],
                            env=cli_env(emulator, COLUMNS="200"), capture_output=True, text=True,
                            timeout=120)
        shell.close()
        assert ps.returncode == 0, ps.stderr
        (row,) = [line for line in ps.stdout.splitlines() if line.startswith(tid)]
        assert row.split(maxsplit=5)[1:3] == [str(info.pid), "-"]
        assert row.endswith(BEATING)
        (row,) = [line for line in ps.stdout.splitlines() if line.startswith(shell.id)]
        assert row.endswith("  (login shell)")

        t = fresh.attach(sb, tid)
        assert isinstance(t, Terminal) and t.pid == info.pid
        with t:
            until(t, r"beat \d+\r\nbeat \d+\r\n")  # its output, from now on
            t.kill()
            assert t.wait(timeout=60) == 137
        assert [c.id for c in fresh.commands(sb)] == [bg.id]
    bg.kill()


def test_a_process_the_sandbox_user_dresses_as_a_terminal_is_not_listed(
    shared_provider: E2BSandboxProvider, sb: SandboxHandle
) -> None:
    p = shared_provider
    ctl = f"/tmp/.capybara-exec-{uuid.uuid4()}"
    # the wrapper itself, run by the sandbox user with the marker of a control path of its
    # choosing (its pid file included): not a process envd started as a terminal
    fake = p.start(sb, f"exec env CAPYBARA_EXEC={ctl} /bin/sh -c {shlex.quote(TERMINAL_WRAPPER)} "
                       f"capybara-exec {ctl} 'sleep 600'")
    try:
        wait_until(lambda: root(p, sb, f"cat {ctl}.pid 2>/dev/null || true").strip(), 30,
                   "the dressed-up wrapper's pid file")
        pid = int(root(p, sb, f"cat {ctl}.pid").strip())
        listed = p.commands(sb)
        assert [(c.id, c.kind) for c in listed] == [(fake.id, "command")]
        hexa = uuid.UUID(ctl[len("/tmp/.capybara-exec-"):]).hex
        with pytest.raises(CommandNotFound, match="no terminal"):
            p.attach(sb, f"{sb.id}:pty-{pid}-{hexa}")
    finally:
        fake.kill()


def test_attach_finds_a_terminal_among_processes_of_long_configs(
    shared_provider: E2BSandboxProvider, sb: SandboxHandle
) -> None:
    p = shared_provider
    # background commands and the file agent (their listing starts it): envd lists each
    # with its program, some 60 KB in all
    cmds = [p.start(sb, "sleep 600") for _ in range(3)]
    try:
        assert len(p.commands(sb)) == 3
        with p.terminal(sb, "cat") as t:
            viewer = p.attach(sb, t.id)
            assert isinstance(viewer, Terminal)
            with viewer:
                viewer.write("seen\n")
                until(viewer, r"seen\r\nseen\r\n")
            assert sorted(c.kind for c in p.commands(sb)) == ["command"] * 3 + ["terminal"]
    finally:
        for c in cmds:
            c.kill()


def test_only_what_envd_started_as_a_terminal_is_listed_as_one() -> None:
    ctl = f"/tmp/.capybara-exec-{uuid.uuid4()}"
    config: Dict[str, object] = {
        "cmd": "/bin/sh", "args": ["-c", TERMINAL_WRAPPER, "capybara-exec", ctl, "top"],
        "envs": {"TERM": "xterm", "CAPYBARA_EXEC": ctl}, "cwd": "/workspace"}
    entry = {"pid": 42, "tag": ctl, "config": config}
    assert _listed_terminal(entry) == (42, ctl, "top")
    other = f"/tmp/.capybara-exec-{uuid.uuid4()}"
    for change in (
        {"pid": True}, {"pid": 0}, {"pid": 2**32}, {"pid": "42"}, {"tag": None},
        {"tag": other},  # the arguments name another control path
        {"tag": f"/tmp/.capybara-exec-web-{uuid.uuid4()}"},  # an exec's, with a holder tag
        {"tag": ctl.upper()}, {"tag": ctl.replace("-", "")}, {"config": None},
    ):
        assert _listed_terminal({**entry, **change}) is None, change
    for config_change in (
        {"cmd": "setsid"}, {"args": ["-c", TERMINAL_WRAPPER + " ", "capybara-exec", ctl, "x"]},
        {"args": ["-c", TERMINAL_WRAPPER, "capybara-exec", ctl]},
        {"args": ["-c", TERMINAL_WRAPPER, "capybara-exec", ctl, "x", "y"]},
        {"args": ["-c", TERMINAL_WRAPPER, "capybara-exec", ctl, 7]},
        {"envs": {"CAPYBARA_EXEC": other}}, {"envs": {}}, {"envs": None},
    ):
        changed = {**config, **config_change}
        assert _listed_terminal({**entry, "config": changed}) is None, config_change


# -- a handle left unread ----------------------------------------------------------------------


@pytest.fixture
def quick(emulator) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    """A provider whose streams count as dead after 12 s of silence."""
    with E2BSandboxProvider(emulator.config(template="base"), keepalive_seconds=1) as p:
        yield p


def beats(text: str) -> List[int]:
    return [int(n) for n in re.findall(r"beat (\d+)\r\n", text)]


def test_a_terminal_left_unread_past_the_silence_bound_reads_on_in_order(
    quick: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    with quick.terminal(sandbox, BEATING) as t:
        first = beats(until(t, r"beat \d+\r\n"))
        idle = threading.Event()
        idle.wait(SILENCE_BOUND + 3)  # nobody reads, the program prints on
        seen = until(t, rf"beat {first[-1] + int(SILENCE_BOUND) + 2}\r\n")
        got = first + beats(seen)
        assert got == list(range(got[0], got[0] + len(got)))


def test_output_held_back_while_unread_past_the_silence_bound_all_comes(
    quick: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    n = 1_500_000  # about 12 MB: more than the buffers on the way hold
    with quick.terminal(sandbox, f"seq {n}; echo all-done") as t:
        wait_until(lambda: root(quick, sandbox, "pgrep -x seq || true").strip(), 30,
                   "seq to run")
        threading.Event().wait(SILENCE_BOUND + 3)
        # the program waits for its reader: the output is held back, not dropped
        assert root(quick, sandbox, "pgrep -x seq || true").strip(), "seq was not held back"
        out = bytearray()
        while True:
            data = t.read(timeout=120)
            if not data:
                break
            out += data
        assert t.exit_code == 0
    lines = bytes(out).split(b"\r\n")
    assert lines[-2:] == [b"all-done", b""]
    assert lines[:-2] == [str(i).encode() for i in range(1, n + 1)]


def _silent_after(chunks: int, ready: threading.Event, stop: threading.Event,
                  server: socket.socket) -> None:
    """Serve one chunked answer: ``chunks`` chunks 0.2 s apart, then nothing."""
    conn, _ = server.accept()
    with conn:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        ready.set()
        for i in range(chunks):
            piece = f"<{i}>".encode()
            conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            time.sleep(0.2)
        stop.wait(60)


@contextlib.contextmanager
def _stream_from_a_peer_silent_after(chunks: int) -> Iterator[RawStream]:
    """A raw stream (1 s silence bound) from a local peer that sends ``chunks`` chunks
    (:func:`_silent_after`) and then nothing; open once the peer has answered."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        ready, stop = threading.Event(), threading.Event()
        serving = threading.Thread(target=_silent_after, args=(chunks, ready, stop, server))
        serving.start()
        transport = Transport()
        try:
            url = f"http://127.0.0.1:{server.getsockname()[1]}/x"
            raw = transport.open_raw_stream("POST", url, data=b"{}", read_timeout=1.0,
                                            operation="terminal stream")
            try:
                assert ready.wait(30)
                yield raw
            finally:
                raw.close()
        finally:
            stop.set()
            serving.join(30)
            transport.close()


def test_a_peer_silent_past_the_bound_of_reading_is_still_caught() -> None:
    with _stream_from_a_peer_silent_after(10) as raw:
        first = raw.read(30)
        assert first == b"<0>"
        threading.Event().wait(3.0)  # unread for 3 s while 9 more chunks come
        got = b""
        while len(got) < len(b"".join(f"<{i}>".encode() for i in range(1, 10))):
            piece = raw.read(30)
            assert piece, "the stream ended"
            got += piece
        assert got == b"".join(f"<{i}>".encode() for i in range(1, 10))
        # then the peer is silent while we read: caught after the bound
        with pytest.raises(TransportTimeout, match=r"sent nothing for 1 s"):
            raw.read(None)


def test_a_silent_peer_is_caught_by_a_reader_that_polls_as_a_select_loop_does() -> None:
    with _stream_from_a_peer_silent_after(1) as raw:
        assert raw.read(30) == b"<0>"

        def polled() -> bool:  # a look without waiting, now and then
            try:
                assert raw.read(0) is None
            except TransportTimeout:
                return True
            return False

        wait_until(polled, 30, "the silence to be caught", interval=0.1)


# -- a terminal whose sandbox was deleted or paused --------------------------------------------

CALLS = ("read", "write", "resize", "kill", "wait")


def _call(t: Terminal, name: str) -> object:
    if name == "read":
        return t.read(timeout=30)
    if name == "write":
        return t.write("echo more\n")
    if name == "resize":
        return t.resize(100, 30)
    if name == "kill":
        return t.kill()
    return t.wait(timeout=30)


def test_every_call_of_a_terminal_whose_sandbox_was_deleted_says_so(
    shared_provider: E2BSandboxProvider, caplog: pytest.LogCaptureFixture
) -> None:
    p = shared_provider
    h = p.create(unique_name("tl-gone"))
    terms = {name: p.terminal(h, "cat") for name in (*CALLS, "close")}
    for t in terms.values():
        t.write("hi\n")
        until(t, r"hi\r\nhi\r\n")
    p.destroy(h)
    for name in CALLS:
        with pytest.raises(SandboxGoneError, match=r"was deleted .* ended with it") as got:
            _call(terms[name], name)
        assert terms[name].id in str(got.value)
    with caplog.at_level(logging.INFO, logger="e2b_provider"):
        terms["close"].close()  # closing never raises; it says what happened
    said = [r for r in caplog.records if terms["close"].id in r.getMessage()]
    assert said and all(r.levelno < logging.WARNING for r in said), said
    assert any("was deleted" in r.getMessage() for r in said)
    for t in terms.values():
        t.detach()


def test_a_pause_cuts_the_stream_and_says_so_and_other_calls_resume_the_sandbox(
    shared_provider: E2BSandboxProvider, sb: SandboxHandle, caplog: pytest.LogCaptureFixture
) -> None:
    p = shared_provider
    terms = {name: p.terminal(sb, "cat") for name in (*CALLS, "close")}
    for t in terms.values():
        t.write("hi\n")
        until(t, r"hi\r\nhi\r\n")
    p.suspend(sb)
    with pytest.raises(SandboxPaused, match=r"was paused .* cut the stream .* attach\(\) to it "
                       r"again") as got:
        terms["read"].read(timeout=30)
    assert terms["read"].id in str(got.value) and got.value.sandbox_id == sb.id
    # a call that sends resumes the sandbox, as every call does
    terms["write"].write("again\n")
    terms["resize"].resize(100, 30)
    terms["kill"].kill()
    # the handle's stream was cut all the same
    with pytest.raises(SandboxPaused, match="was paused"):
        terms["wait"].wait(timeout=30)
    with caplog.at_level(logging.INFO, logger="e2b_provider"):
        terms["close"].close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
    # the terminal written to runs on: attached again, it reads and writes
    t = p.attach(sb, terms["write"].id)
    assert isinstance(t, Terminal)
    with t:
        t.write("after\n")
        until(t, r"after\r\n")
    running = {c.id for c in p.commands(sb)}
    assert terms["write"].id in running and terms["kill"].id not in running
    assert terms["close"].id not in running
    for t in terms.values():
        t.detach()
    p.kill_all(sb)


# -- ids that name no terminal -----------------------------------------------------------------


def test_attach_to_an_id_that_names_no_terminal_is_typed_and_worded(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = shared_provider
    hexa = uuid.uuid4().hex
    sent = count_requests(p, monkeypatch)
    for pid in ("9999999999", "4294967296"):  # past any pid envd can have
        with pytest.raises(CommandNotFound, match=r"no terminal .*larger than any"):
            p.attach(sandbox, f"{sandbox.id}:pty-{pid}-{hexa}")
    for bad in (f"pty-12x-{hexa}", f"pty-0-{hexa}", f"pty-12-{hexa[:-1]}", "pty-"):
        with pytest.raises(InvalidArgument, match=r"is not a terminal id"):
            p.attach(sandbox, f"{sandbox.id}:{bad}")
    # all of them before any I/O (a lease renewal may run in the background meanwhile)
    assert [r for r in sent if "sandboxes" not in r and "connect" not in r] == [], sent
    with pytest.raises(CommandNotFound, match=r"no terminal .* it ended"):
        p.attach(sandbox, f"{sandbox.id}:pty-4294967295-{hexa}")
    with pytest.raises(CommandNotFound, match=r"no terminal .* it ended"):
        p.attach(sandbox, f"{sandbox.id}:pty-999999-{hexa}")
