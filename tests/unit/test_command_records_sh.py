"""The shell supervisor and record readers (``supervisor.sh``, ``records.sh``), run for real
on this machine under ``/bin/sh``: the record they keep is the one ``supervisor.py`` keeps
(either reader reads either supervisor's record, with the same answers), the command runs as
``supervisor.py`` runs it, and the readers' output parses into the file agent's answers.

Each test keeps its records in its own temporary directory (the programs' ``RECORDS`` line
replaced) and uses fresh control paths; what a test starts it ends.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from sandbox_programs import local_program

from e2b_provider.commands.record_scripts import parse_list as _parse_list
from e2b_provider.commands.record_scripts import parse_read as _parse_read
from e2b_provider.core.run_engine import RunOutcome
from e2b_provider.errors import ProtocolError
from e2b_provider.protocol import scripts as scripts
from e2b_provider.protocol.command_records import FrameDecoder
from e2b_provider.sandbox_side import file_agent, source

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("setsid", "split", "timeout", "stat", "dd")),
    reason="needs util-linux setsid and GNU coreutils",
)


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    where = tmp_path / "records"
    monkeypatch.setattr(file_agent, "RECORDS", str(where))
    yield where
    for pid_file in tmp_path.glob("ctl-*.pid"):  # a command a failed test left running
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def shell_supervisor(records: Path) -> str:
    text = local_program("supervisor.sh", records)
    return text


def shell_reader(records: Path) -> str:
    text = local_program("records.sh", records)
    return text


def python_supervisor(records: Path) -> str:
    text = local_program("supervisor", records)
    return text


def ctl_in(records: Path) -> str:
    """A control path in the test's own directory (the wrapper writes ``<ctl>.pid``)."""
    return str(records.parent / f"ctl-{uuid.uuid4()}")


def shell_args(records: Path, cid: str, ctl: str, command: str, *, seconds: str = "0",
               cap: int = 1024, stdin: bool = False, piece: int = 1 << 16) -> List[str]:
    """``/bin/sh`` and what ``Background.start`` gives ``supervisor.sh``."""
    known = json.dumps({"id": cid, "command": command, "ctl": ctl, "cap": cap,
                        "stdin": stdin, "timeout": float(seconds), "supervisor": "sh"})[:-1]
    pieces = [known[i:i + piece] for i in range(0, len(known), piece)]
    return ["/bin/sh", "-c", shell_supervisor(records), "capybara-bg", cid, ctl, seconds,
            str(cap), scripts.LEAN_EXEC_WRAPPER, command, *pieces]


def python_args(records: Path, cid: str, ctl: str, command: str, *, seconds: str = "0",
                cap: int = 1024, stdin: bool = False) -> List[str]:
    return [sys.executable, "-I", "-S", "-c", python_supervisor(records), "capybara-bg", cid,
            ctl, seconds, str(cap), "1" if stdin else "0", "1", scripts.LEAN_EXEC_WRAPPER,
            command]


def supervise(records: Path, command: str, *, shell: bool = True, seconds: str = "0",
              cap: int = 1024, stdin: bytes = b"", env: Any = None,
              ) -> Tuple[str, Dict[str, Any], List[Any]]:
    """Run a supervisor to its end; its record id, status and frames."""
    cid = uuid.uuid4().hex
    ctl = ctl_in(records)
    make = shell_args if shell else python_args
    p = subprocess.run(make(records, cid, ctl, command, seconds=seconds, cap=cap,
                            stdin=bool(stdin)),
                       input=stdin, capture_output=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    got = list(FrameDecoder().feed(p.stdout))
    status = json.loads((records / cid / "status.json").read_text())
    return cid, status, got


def read_sh(records: Path, cid: str, out: int, err: int, limit: int,
            wait: int = 0) -> Tuple[Dict[str, Any], bytes]:
    """``records.sh read``, parsed as the provider parses it."""
    p = subprocess.run(["/bin/sh", "-c", shell_reader(records), "capybara-cmd", "read", cid,
                        str(out), str(err), str(limit), str(wait)],
                       capture_output=True, timeout=60)
    if p.returncode == 3:
        return {"absent": True}, b""
    r = RunOutcome(p.returncode, p.stdout, p.stderr, False, False, False, False)
    return _parse_read(r, cid)


def list_sh(records: Path) -> List[Dict[str, Any]]:
    p = subprocess.run(["/bin/sh", "-c", shell_reader(records), "capybara-cmd", "list"],
                       capture_output=True, timeout=60, check=True)
    return _parse_list(p.stdout)


# -- the supervisor ------------------------------------------------------------------------


def test_shell_supervisor_keeps_the_record_the_python_one_keeps(records: Path) -> None:
    command = "head -c 5000 /dev/zero | tr '\\0' a; printf err >&2; exit 3"
    made = {}
    for shell in (True, False):
        cid, status, got = supervise(records, command, shell=shell)
        assert status["exit_code"] == 3 and not status["timed_out"] and not status["killed"]
        assert (status["stdout_total"], status["stderr_total"]) == (5000, 3)
        assert got[0].kind == "r" and got[0].offset == 0
        meta = json.loads(got[0].data)
        assert meta == json.loads((records / cid / "meta.json").read_text())
        assert meta["id"] == cid and meta["cap"] == 1024 and meta["command"] == command
        assert isinstance(meta["pid"], int) and isinstance(meta["wrapper_pid"], int)
        assert abs(meta["started_at"] - time.time()) < 60 and meta["stdin"] is False
        names = sorted(n for n in os.listdir(records / cid) if not n.startswith("."))
        assert (records / cid).stat().st_mode & 0o777 == 0o700
        assert all((records / cid / n).stat().st_mode & 0o077 == 0 for n in names)
        made[shell] = (names, set(status), (records / cid / "stdout.4").read_bytes())
        if shell:  # its FIFOs are gone
            assert sorted(os.listdir(records / cid)) == names
    # the same files, the same status fields
    assert made[True][0] == made[False][0] == [
        "meta.json", "status.json", "stderr.0", "stdout.3", "stdout.4"]
    assert made[True][1] == made[False][1]
    assert made[True][2] == made[False][2] == b"a" * (5000 - 4 * 1024)


def test_shell_supervisor_keeps_order_bytes_and_input(records: Path) -> None:
    blob = bytes(random.Random(5).getrandbits(8) for _ in range(200_000))
    cid, status, got = supervise(records, "cat", cap=1 << 20, stdin=blob)
    assert status["exit_code"] == 0 and status["stdout_total"] == len(blob)
    assert [f.kind for f in got] == ["r"]  # the ready frame only: no live frames
    data = read_sh(records, cid, 0, 0, 1 << 20)[1]
    assert data == blob
    assert file_agent.do_cmd_read(cid, 0, 0, 1 << 20)[1] == blob


def test_shell_supervisor_tells_a_timeout_from_a_kill_and_a_crash(records: Path) -> None:
    t0 = time.monotonic()
    _, status, _ = supervise(records, "sleep 30", seconds="1")
    assert status["timed_out"] and status["exit_code"] == 137 and status["signal"] is None
    assert time.monotonic() - t0 < 20
    _, status, _ = supervise(records, "kill -9 $$")
    assert status["exit_code"] == 137 and not status["timed_out"] and not status["killed"]
    _, status, _ = supervise(records, "exit 200")
    assert status["exit_code"] == 200
    cid = uuid.uuid4().hex
    ctl = ctl_in(records)
    with subprocess.Popen(shell_args(records, cid, ctl, "sleep 60"),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as child:
        try:
            deadline = time.monotonic() + 30
            while not (os.path.exists(f"{ctl}.pid") and (records / cid / "meta.json").exists()):
                assert time.monotonic() < deadline, "the supervisor did not start the command"
                time.sleep(0.02)
            assert [m["id"] for m in list_sh(records)] == [cid]
            assert [m["id"] for m in file_agent.do_cmd_list()] == [cid]
            (records / cid / "killed").touch()
            kill = subprocess.run(  # as the library's kill, for this test's control path
                ["/bin/sh", "-c", scripts.KILL_BATCH_SCRIPT, "capybara-killbatch", ctl],
                timeout=30)
            assert kill.returncode == 0
            assert child.wait(timeout=30) == 0
        finally:
            child.kill()
            child.wait()
    status = json.loads((records / cid / "status.json").read_text())
    assert status["killed"] and not status["timed_out"] and status["exit_code"] == 137
    assert list_sh(records) == [] and file_agent.do_cmd_list() == []


def test_the_command_runs_as_under_the_python_supervisor(records: Path) -> None:
    """Same environment (but the marker's value, the control path), umask, session, and
    standard input: the command's, not the supervisor's."""
    probe = ("env | LC_ALL=C sort | grep -v '^CAPYBARA_EXEC='; "
             "[ -e \"$CAPYBARA_EXEC.pid\" ] && echo marked; umask; "
             "[ $(($(ps -o sid= -p $$))) -eq \"$(cat \"$CAPYBARA_EXEC.pid\")\" ] && "
             "echo own-session; head -c 5")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/workspace",
           "LANG": "C.UTF-8", "MINE": "a b\nc"}
    outs = []
    for shell in (True, False):
        cid, status, _ = supervise(records, probe, shell=shell, stdin=b"input", env=env)
        assert status["exit_code"] == 0
        outs.append(read_sh(records, cid, 0, 0, 1 << 20)[1])
    assert outs[0] == outs[1]
    assert b"MINE=a b\n" in outs[0] and b"LANG=C.UTF-8\n" in outs[0]
    assert outs[0].endswith(b"marked\n0077\nown-session\ninput"), outs[0]


def test_only_the_command_holds_its_standard_input(records: Path) -> None:
    """envd's CloseStdin closes the pipe the supervisor was given: the command alone holds
    it, so it reads its end of file (nothing of the supervisor's keeps it open)."""
    cid = uuid.uuid4().hex
    ctl = ctl_in(records)
    with subprocess.Popen(shell_args(records, cid, ctl, "cat; echo after-eof", stdin=True),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as child:
        try:
            assert child.stdin is not None and child.stdout is not None
            head = child.stdout.read(15)
            meta = json.loads(child.stdout.read(int.from_bytes(head[11:], "big")))
            assert os.readlink(f"/proc/{meta['pid']}/fd/0") == "/dev/null"
            child.stdin.write(b"fed\n")
            child.stdin.close()
            assert child.wait(timeout=30) == 0
        finally:
            child.kill()
            child.wait()
    assert read_sh(records, cid, 0, 0, 100)[1] == b"fed\nafter-eof\n"


def test_a_long_command_and_its_meta_in_pieces(records: Path) -> None:
    """META comes in several arguments (none over Linux's 128 KiB): meta.json is their
    JSON whole, whatever the command holds."""
    tricky = "echo '\"\\\\ \t é 🙂 %s %%'; : '" + "x\"y\\z\n\x01" * 10_000 + "'"
    cid = uuid.uuid4().hex
    ctl = ctl_in(records)
    args = shell_args(records, cid, ctl, tricky, piece=1000)
    assert len(args) > 20
    p = subprocess.run(args, capture_output=True, timeout=60, check=True)
    meta = json.loads((records / cid / "meta.json").read_bytes())
    assert meta["command"] == tricky and meta["supervisor"] == "sh"
    assert json.loads(next(iter(FrameDecoder().feed(p.stdout))).data) == meta
    assert read_sh(records, cid, 0, 0, 100)[1] == "\"\\\\ \t é 🙂 %s %%\n".encode()


def test_records_that_are_not_this_users_are_refused(records: Path) -> None:
    records.mkdir(mode=0o755)
    os.chmod(records, 0o755)
    cid = uuid.uuid4().hex
    p = subprocess.run(shell_args(records, cid, ctl_in(records), "true"), capture_output=True,
                       timeout=60)
    assert p.returncode == 90 and b"is not this user's own directory" in p.stderr
    assert not (records / cid).exists()


# -- the readers ---------------------------------------------------------------------------


@pytest.mark.parametrize("shell", [True, False], ids=["supervisor.sh", "supervisor.py"])
def test_the_shell_reader_answers_as_the_agent(records: Path, shell: bool) -> None:
    cid, status, _ = supervise(
        records, "head -c 5000 /dev/zero | tr '\\0' a; printf err >&2; exit 3", shell=shell)
    for out, err, limit in [(-1, -1, 1024), (4990, 2, 100), (0, 0, 100), (5000, 3, 10),
                            (9999, 0, 10), (-1, 0, 0), (3500, -1, 4000)]:
        assert read_sh(records, cid, out, err, limit) == file_agent.do_cmd_read(
            cid, out, err, limit), (out, err, limit)
    answer, data = read_sh(records, cid, -1, -1, 1024)
    assert answer["out"] == [3976, 5000, 1024] and answer["err"] == [0, 3, 3]
    assert data == b"a" * 1024 + b"err" and answer["status"] == status
    assert answer["alive"] is False


def test_the_shell_reader_refuses_what_is_not_a_record(records: Path) -> None:
    for cid in ("../../etc", "A" * 32, "a" * 31, "b" * 32):
        assert read_sh(records, cid, 0, 0, 10) == ({"absent": True}, b"")
    cid = "c" * 32
    (records / cid).mkdir(parents=True)
    (records / cid / "meta.json").write_text(json.dumps({"pid": os.getpid(), "id": cid}))
    answer, _ = read_sh(records, cid, 0, 0, 10)
    assert answer["alive"] is False  # this pid is not a supervisor of that id
    assert answer == file_agent.do_cmd_read(cid, 0, 0, 10)[0]
    (records / cid / "meta.json").write_text("not json")
    assert read_sh(records, cid, 0, 0, 10) == ({"absent": True}, b"")
    assert list_sh(records) == [] == file_agent.do_cmd_list()


def test_a_read_waits_for_news_and_no_longer(records: Path) -> None:
    cid = uuid.uuid4().hex
    ctl = ctl_in(records)
    go = records.parent / "go"
    command = (f"echo one; while [ ! -e {go} ]; do sleep 0.05; done; echo two >&2; "
               f"while [ ! -e {go}2 ]; do sleep 0.05; done; echo three")
    with subprocess.Popen(shell_args(records, cid, ctl, command), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL) as child:
        try:
            deadline = time.monotonic() + 30
            while read_sh(records, cid, 0, 0, 100)[1] != b"one\n":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            t0 = time.monotonic()
            answer, data = read_sh(records, cid, 4, 0, 100, wait=5)  # nothing new: 0.5 s
            assert 0.4 < time.monotonic() - t0 < 5 and data == b"" and answer["alive"]
            t0 = time.monotonic()
            answer, data = read_sh(records, cid, 0, 0, 100, wait=50)  # news already there
            assert time.monotonic() - t0 < 3 and data == b"one\n"
            go.touch()
            t0 = time.monotonic()
            answer, data = read_sh(records, cid, 4, 0, 100, wait=100)  # up to 10 s
            assert time.monotonic() - t0 < 8 and data == b"two\n"  # news on stderr
            assert answer["err"] == [0, 4, 4] and answer["alive"]
            (records.parent / "go2").touch()
            t0 = time.monotonic()
            answer, data = read_sh(records, cid, 4, 4, 100, wait=100)
            assert time.monotonic() - t0 < 8 and data.startswith(b"three")  # on stdout
            assert child.wait(timeout=30) == 0
            answer, data = read_sh(records, cid, 10, 4, 100, wait=100)  # ended: at once
            assert answer["status"]["exit_code"] == 0 and not answer["alive"] and data == b""
        finally:
            child.kill()
            child.wait()


def test_parsers_refuse_what_the_readers_do_not_print() -> None:
    def outcome(stdout: bytes, code: int = 0) -> RunOutcome:
        return RunOutcome(code, stdout, b"", False, False, False, False)

    good = b'1 2 0 0 3 3 0 0 0\n{}abc'
    assert _parse_read(outcome(good), "x") == (
        {"meta": {}, "status": None, "alive": True, "out": [0, 3, 3], "err": [0, 0, 0]},
        b"abc")
    for bad in (b"", b"1 2 0 0 3 3 0 0\n{}abc", b'1 2 0 0 3 9 0 0 0\n{}abc', b"x" * 40,
                b'1 2 0 0 3 -3 0 0 0\n{}abc'):
        with pytest.raises(ProtocolError):
            _parse_read(outcome(bad), "x")
    assert _parse_read(outcome(b'1 3 0 0 0 0 0 0 0\n[1]'), "x") == ({"absent": True}, b"")
    assert _parse_list(b'2\n{}7\n{"a":1}3\n[1]') == [{}, {"a": 1}]
    for bad in (b"2\n{", b"x\n{}", b"{}"):
        with pytest.raises(ProtocolError):
            _parse_list(bad)


def test_the_programs_never_look_like_an_exec_to_the_kill_scripts() -> None:
    """The kill scripts find exec wrappers by ``capybara-exec <control path>`` in a command
    line; a supervisor's command line holds its program's text and must not match."""
    for name in ("supervisor.sh", "records.sh"):
        assert "capybara-exec /" not in source(name)
        assert "capybara-exec $" not in source(name)
