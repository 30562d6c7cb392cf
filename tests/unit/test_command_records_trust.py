"""What a background command's record may not do, on this machine: name a process envd
did not start for it (:func:`supervisor_of` reads envd's list, not the record), or stall a
reader with a file that is not a regular file (a FIFO, a link) — the file agent's and
``records.sh`` alike refuse such a record at once and say which file, and a listing leaves
it out; the kill's ``killed`` mark does not wait on a FIFO either.

Each test keeps its records in its own temporary directory (the programs' ``RECORDS`` line
replaced).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from sandbox_programs import local_program
from waiting import wait_until

from e2b_provider.commands.background import _BAD_RECORD_EXIT, _KILL
from e2b_provider.commands.record_scripts import parse_list as _parse_list
from e2b_provider.commands.record_scripts import parse_read as _parse_read
from e2b_provider.core.run_engine import RunOutcome
from e2b_provider.protocol import scripts as scripts
from e2b_provider.protocol.command_records import (
    COMMAND_TAG_PREFIX,
    supervisor_of,
    supervisor_tag,
    supervisor_users,
)
from e2b_provider.sandbox_side import file_agent, source

from .test_command_records_sh import shell_args

#: The longest a reader may take on a bad record here (a FIFO made them wait for ever).
PROMPT = 20.0


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    where = tmp_path / "records"
    where.mkdir(mode=0o700)
    monkeypatch.setattr(file_agent, "RECORDS", str(where))
    yield where


def _reader(records: Path) -> str:
    text = local_program("records.sh", records)
    return text


def _run(records: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["/bin/sh", "-c", _reader(records), "capybara-cmd", *args],
                          capture_output=True, timeout=PROMPT)


def _record(records: Path, *, pid: int = 0, cap: int = 1024) -> Tuple[str, Path]:
    """A record of an ended command: meta, status and one generation of each stream."""
    cid = uuid.uuid4().hex
    d = records / cid
    d.mkdir(mode=0o700)
    (d / "meta.json").write_text(json.dumps({"id": cid, "pid": pid or os.getpid(), "cap": cap,
                                             "ctl": scripts.control_path(), "command": "x"}))
    (d / "stdout.0").write_bytes(b"out\n")
    (d / "stderr.0").write_bytes(b"err\n")
    (d / "status.json").write_text(json.dumps({"exit_code": 0, "stdout_total": 4,
                                               "stderr_total": 4}))
    return cid, d


def _fifo_in_place_of(path: Path) -> None:
    if path.exists():
        path.unlink()
    os.mkfifo(path)


# -- what envd says ------------------------------------------------------------------------


def _info(pid: Any, tag: str, args: List[Any]) -> Dict[str, Any]:
    return {"pid": pid, "tag": tag, "config": {"cmd": "/bin/sh", "args": args}}


def test_supervisor_of_reads_envds_tag_and_arguments_not_a_record() -> None:
    cid = uuid.uuid4().hex
    ctl = scripts.control_path("web")
    tag = COMMAND_TAG_PREFIX + cid
    python = ["-c", "exec python3 ...", "capybara-bg", "<program>", cid, ctl, "0", "1024"]
    shell = ["-c", "<program>", "capybara-bg", cid, ctl, "0", "1024"]
    assert supervisor_of([_info(41, tag, python)], cid) == (41, ctl)
    assert supervisor_of([_info(7, "other", []), _info(42, tag, shell)], cid) == (42, ctl)
    other = uuid.uuid4().hex
    for wrong in (
        _info(41, COMMAND_TAG_PREFIX + other, python),  # another command's supervisor
        _info(41, tag, ["-c", "x", "capybara-bg", other, ctl]),  # its arguments, another id
        _info(41, tag, ["-c", "x", "capybara-bg", cid, "/etc/passwd"]),  # not a control path
        _info(41, tag, ["-c", "x", "capybara-bg", cid]),
        _info(41, tag, ["-c", "x", cid, ctl]),
        _info(True, tag, python), _info(0, tag, python), _info("41", tag, python),
        {"pid": 41, "tag": tag}, {"pid": 41, "tag": tag, "config": {"args": "x"}},
    ):
        assert supervisor_of([wrong], cid) is None, wrong
    assert supervisor_of([], cid) is None


def test_a_root_commands_supervisor_is_told_apart_by_its_tag() -> None:
    """The sandbox user's supervisor of the same 32 hex digits is not root's, nor the
    other way round; ``supervisor_users`` says whose supervisors run."""
    cid = uuid.uuid4().hex
    ctl = scripts.control_path()
    args = ["-c", "<program>", "capybara-bg", cid, ctl, "0", "1024"]
    roots = _info(43, supervisor_tag(cid, "root"), args)
    mine = _info(44, supervisor_tag(cid), args)
    assert supervisor_tag(cid, "root") == COMMAND_TAG_PREFIX + "root-" + cid
    assert supervisor_of([roots], cid, "root") == (43, ctl)
    assert supervisor_of([roots], cid) is None
    assert supervisor_of([mine], cid, "root") is None
    assert supervisor_of([mine, roots], cid) == (44, ctl)
    assert supervisor_users([]) == []
    assert supervisor_users([_info(1, "web", [])]) == []
    assert supervisor_users([roots]) == ["root"]
    assert supervisor_users([mine]) == ["sandbox"]
    assert supervisor_users([roots, _info(1, "x", []), mine]) == ["sandbox", "root"]


# -- records that are not regular files ----------------------------------------------------


@pytest.mark.parametrize("name", ["meta.json", "status.json", "stdout.0", "stderr.0"])
def test_a_fifo_in_a_record_is_refused_at_once_by_both_readers(records: Path,
                                                                name: str) -> None:
    cid, d = _record(records)
    _fifo_in_place_of(d / name)
    began = time.monotonic()
    answer, data = file_agent.do_cmd_read(cid, -1, -1, 1024)
    assert answer["error"] == "EBADREC" and answer["message"].startswith(name), answer
    assert "FIFO" in answer["message"] and data == b""
    p = _run(records, "read", cid, "-1", "-1", "1024", "0")
    assert p.returncode == _BAD_RECORD_EXIT, p
    assert f"{name} is a FIFO, not a regular file" in p.stderr.decode()
    assert time.monotonic() - began < PROMPT


@pytest.mark.parametrize("name", ["meta.json", "stdout.0"])
def test_a_link_in_a_record_is_refused_by_both_readers(records: Path, name: str) -> None:
    cid, d = _record(records)
    elsewhere = records.parent / "elsewhere"
    elsewhere.write_bytes((d / name).read_bytes())
    (d / name).unlink()
    (d / name).symlink_to(elsewhere)
    answer, _ = file_agent.do_cmd_read(cid, -1, -1, 1024)
    assert answer == {"error": "EBADREC", "message": f"{name} is a symbolic link"}
    p = _run(records, "read", cid, "-1", "-1", "1024", "0")
    assert p.returncode == _BAD_RECORD_EXIT
    assert f"{name} is a symbolic link" in p.stderr.decode()


def test_a_good_record_still_reads_the_same_through_both(records: Path) -> None:
    cid, _ = _record(records)
    p = _run(records, "read", cid, "-1", "-1", "1024", "0")
    r = RunOutcome(p.returncode, p.stdout, p.stderr, False, False, False, False)
    assert _parse_read(r, cid) == file_agent.do_cmd_read(cid, -1, -1, 1024)
    assert _parse_read(r, cid)[1] == b"out\nerr\n"


def test_a_listing_leaves_a_fifo_meta_out_and_names_it(records: Path) -> None:
    # a record that runs: its meta's pid is a process whose arguments hold its id
    cid = uuid.uuid4().hex
    runs = subprocess.Popen(["/bin/sh", "-c", "sleep 60; :", "capybara-bg", cid])
    try:
        # its arguments are the shell's once it has started (before, the forked child's are
        # this test's, and the listing rightly takes the record for one that ended)
        wait_until(lambda: cid.encode() in Path(f"/proc/{runs.pid}/cmdline").read_bytes(),
                   10, "the shell to start")
        (records / cid).mkdir()
        (records / cid / "meta.json").write_text(json.dumps({"id": cid, "pid": runs.pid}))
        bad, _ = _record(records)
        (records / bad / "status.json").unlink()  # it would run, were its meta readable
        _fifo_in_place_of(records / bad / "meta.json")
        began = time.monotonic()
        named: List[str] = []
        assert [m["id"] for m in file_agent.do_cmd_list(named)] == [cid]
        assert named == [bad]
        p = _run(records, "list")
        assert p.returncode == 0 and [m["id"] for m in _parse_list(p.stdout)] == [cid]
        assert f"record {bad}: meta.json is not a regular file" in p.stderr.decode()
        assert time.monotonic() - began < PROMPT
    finally:
        runs.kill()
        runs.wait()


@pytest.mark.skipif(shutil.which("touch") is None, reason="needs coreutils touch")
def test_the_killed_mark_does_not_wait_on_a_fifo(tmp_path: Path) -> None:
    mark = tmp_path / "killed"
    os.mkfifo(mark)
    ctl = scripts.control_path()  # a fresh one: nothing carries it, so nothing is killed
    p = subprocess.run(["/bin/sh", "-c", _KILL, "capybara-bgkill", str(mark), ctl],
                       capture_output=True, timeout=PROMPT)
    assert p.returncode == 0, p


@pytest.mark.parametrize("shell", [False, True], ids=["supervisor.py", "supervisor.sh"])
def test_the_supervisor_writes_past_what_was_put_in_its_records_place(records: Path,
                                                                      shell: bool) -> None:
    """A FIFO and a link put where a supervisor's next generation files and its status's
    temporary file go: it removes them and makes its own (a FIFO made it wait for ever; a
    link led elsewhere)."""
    cid = uuid.uuid4().hex
    go = records.parent / "go"
    elsewhere = records.parent / "elsewhere"
    elsewhere.write_bytes(b"")
    command = f"while [ ! -e {go} ]; do sleep 0.05; done; head -c 5000 /dev/zero | tr '\\0' a"
    if shell:
        args = shell_args(records, cid, scripts.control_path("unit"), command)
    else:
        program = local_program("supervisor", records)
        args = [sys.executable, "-I", "-S", "-c", program, "capybara-bg", cid,
                scripts.control_path("unit"), "0", "1024", "0", "1",
                scripts.LEAN_EXEC_WRAPPER, command]
    sup = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        d = records / cid
        deadline = time.monotonic() + PROMPT
        while not (d / "meta.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.mkfifo(d / "stdout.2")
        (d / "stdout.3").symlink_to(elsewhere)
        os.mkfifo(d / f".status.json.{sup.pid}")
        go.write_bytes(b"")
        assert sup.wait(timeout=PROMPT) == 0, sup.stderr.read() if sup.stderr else ""
    finally:
        sup.kill()
        sup.wait()
        if sup.stderr:
            sup.stderr.close()
        for fifo in (d / "stdout.2", d / f".status.json.{sup.pid}"):
            if fifo.is_fifo():  # a writer still waiting on it (split's) opens, and ends
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    status = json.loads((d / "status.json").read_text())
    assert status["exit_code"] == 0 and status["stdout_total"] == 5000
    assert elsewhere.read_bytes() == b""
    answer, data = file_agent.do_cmd_read(cid, -1, -1, 1 << 20)
    assert answer["out"] == [3976, 5000, 1024] and data == b"a" * 1024


def _function(name: str) -> str:
    """The text of one shell function of records.sh (from ``name() {`` to its ``}``)."""
    text = source("records.sh")
    start = text.index(f"\n{name}() {{\n") + 1
    return text[start:text.index("\n}\n", start) + 3]


@pytest.mark.parametrize("newer, made", [(True, True), (False, False)])
def test_a_generation_the_readers_open_made_is_removed_again(tmp_path: Path, newer: bool,
                                                             made: bool) -> None:
    """records.sh opens files for reading and writing (no wait on a FIFO), which makes a
    generation file its supervisor removed between the reader's look and its open: such a
    file (empty, with the generation two after it there, whose making removed it) is found
    and removed again; an empty newest generation is not."""
    (tmp_path / "stdout.3").write_bytes(b"")  # what the open made (or a fresh one)
    (tmp_path / "stdout.4").write_bytes(b"x" * 1024)
    if newer:
        (tmp_path / "stdout.5").write_bytes(b"y")
    script = (_function("stray") + 'exec 3<>"$1/stdout.3"; '
              'if stray 3 "$1/stdout.3" "$1/stdout.5"; then echo made; else echo kept; fi')
    p = subprocess.run(["/bin/sh", "-c", script, "sh", str(tmp_path)], capture_output=True,
                       timeout=PROMPT, check=True)
    assert p.stdout == (b"made\n" if made else b"kept\n")
    assert (tmp_path / "stdout.3").exists() is not made
