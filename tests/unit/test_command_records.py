"""Background commands without a sandbox: ids, frames, kept output, and the supervisor and
the file agent's record reads run as real programs on this machine."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sandbox_programs import local_program

from e2b_provider import InvalidArgument, ProtocolError
from e2b_provider.protocol import scripts as scripts
from e2b_provider.protocol.command_records import (
    FRAME,
    RECORDS,
    ROOT_RECORDS,
    FrameDecoder,
    KeptOutput,
    command_id,
    decode_tail,
    parse_command_id,
    records_of,
    tag_of_control_path,
)
from e2b_provider.sandbox_side import file_agent

CID = "0123456789abcdef0123456789abcdef"


def test_command_ids_round_trip_and_refuse_other_shapes() -> None:
    assert parse_command_id(command_id("sbx1", CID)) == ("sbx1", CID, "sandbox")
    assert parse_command_id(f"a:b:{CID}") == ("a:b", CID, "sandbox")
    assert command_id("sbx1", CID, "root") == f"sbx1:root-{CID}"
    assert parse_command_id(command_id("sbx1", CID, "root")) == ("sbx1", CID, "root")
    assert records_of("root") == ROOT_RECORDS != records_of("sandbox") == RECORDS
    for bad in ("", CID, f":{CID}", "sbx:" + CID.upper(), "sbx:" + CID[:-1], "sbx:x" * 3, 7,
                None, f"sbx:ROOT-{CID}", f"sbx:root{CID}", f"sbx:root-root-{CID}",
                f"sbx:sandbox-{CID}", f"sbx:root-{CID[:-1]}"):
        with pytest.raises(InvalidArgument):
            parse_command_id(bad)


def test_tags_come_back_from_control_paths() -> None:
    assert tag_of_control_path(scripts.control_path("web-1")) == "web-1"
    assert tag_of_control_path(scripts.control_path()) is None
    assert tag_of_control_path("/etc/passwd") is None


def frames(*items: Tuple[bytes, int, bytes]) -> bytes:
    return b"".join(FRAME.pack(b"CB", k, off, len(d)) + d for k, off, d in items)


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
def test_frames_decode_however_the_bytes_are_cut(cuts: List[int]) -> None:
    wire = frames((b"r", 0, b"{}"), (b"o", 0, b"hello"), (b"e", 0, b""), (b"o", 5, b"x" * 70),
                  (b"x", 0, b'{"exit_code": 0}'))
    dec = FrameDecoder()
    got = []
    pos = 0
    for n in cuts * 10:
        got.extend(dec.feed(wire[pos:pos + n]))
        pos += n
    got.extend(dec.feed(wire[pos:]))
    assert [(f.kind, f.offset, f.data) for f in got] == [
        ("r", 0, b"{}"), ("o", 0, b"hello"), ("e", 0, b""), ("o", 5, b"x" * 70),
        ("x", 0, b'{"exit_code": 0}'),
    ]


def test_frames_refuse_what_is_not_a_frame() -> None:
    for wire in (b"XX" + b"\0" * 20, FRAME.pack(b"CB", b"z", 0, 0),
                 FRAME.pack(b"CB", b"o", 0, 1 << 30)):
        with pytest.raises(ProtocolError):
            list(FrameDecoder().feed(wire))


def test_kept_output_drops_overlaps_refuses_gaps_and_keeps_the_tail() -> None:
    k = KeptOutput(8)
    k.reset(0, b"abc")
    assert k.add(1, b"bcde") == b"de"
    assert k.add(0, b"abc") == b""
    with pytest.raises(ValueError):
        k.add(9, b"z")
    assert k.add(5, b"fghij") == b"fghij"
    assert (k.data, k.start, k.end, k.cut) == (b"cdefghij", 2, 10, True)
    k.reset(100, b"0123456789")
    assert (k.data, k.start, k.end) == (b"23456789", 102, 110)


def test_a_cut_tail_drops_the_rest_of_a_character() -> None:
    text = "ab€c".encode()
    assert decode_tail(text[3:], cut=True) == "c"
    assert decode_tail(text[3:], cut=False) == "\ufffd\ufffdc"
    assert decode_tail(b"\xff" * 5, cut=True) == "\ufffd" * 5  # not continuation bytes


# -- the supervisor and the agent's reads, on this machine -------------------------------


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "records"
    monkeypatch.setattr(file_agent, "RECORDS", str(where))
    return where


def supervise(records: Path, command: str, *, seconds: str = "0", cap: int = 1024,
              stdin: bytes = b"", ctl: str = "") -> Tuple[str, Dict[str, Any], List[Any]]:
    """Run the supervisor program to its end; its record id, status and frames."""
    program = local_program("supervisor", records)
    cid = uuid.uuid4().hex
    ctl = ctl or scripts.control_path("unit")
    p = subprocess.run(
        [sys.executable, "-I", "-S", "-c", program, "capybara-bg", cid, ctl, seconds,
         str(cap), "1" if stdin else "0", "1", scripts.LEAN_EXEC_WRAPPER, command],
        input=stdin, capture_output=True, timeout=60, check=True,
    )
    got = list(FrameDecoder().feed(p.stdout))
    status = json.loads((records / cid / "status.json").read_text())
    return cid, status, got


def test_supervisor_keeps_the_last_generations_and_frames_carry_offsets(records: Path) -> None:
    cid, status, got = supervise(
        records, "head -c 5000 /dev/zero | tr '\\0' a; printf err >&2; exit 3", cap=1024)
    assert status["exit_code"] == 3 and not status["timed_out"] and not status["killed"]
    assert (status["stdout_total"], status["stderr_total"]) == (5000, 3)
    assert got[0].kind == "r" and json.loads(got[0].data)["id"] == cid
    assert got[-1].kind == "x" and json.loads(got[-1].data) == status
    out = b"".join(f.data for f in got if f.kind == "o")
    assert out == b"a" * 5000
    assert next(f.offset for f in got if f.kind == "o") == 0
    names = sorted(os.listdir(records / cid))
    assert names == ["meta.json", "status.json", "stderr.0", "stdout.3", "stdout.4"]
    assert (records / cid).stat().st_mode & 0o777 == 0o700
    # the agent's read: the last ``cap`` bytes, or from an offset still kept
    answer, data = file_agent.do_cmd_read(cid, -1, -1, 1024)
    assert answer["out"] == [3976, 5000, 1024] and answer["err"] == [0, 3, 3]
    assert data == b"a" * 1024 + b"err"
    assert answer["status"] == status and answer["alive"] is False
    answer, data = file_agent.do_cmd_read(cid, 4990, 2, 100)
    assert answer["out"] == [4990, 5000, 10] and data == b"a" * 10 + b"r"
    answer, data = file_agent.do_cmd_read(cid, 0, 0, 100)  # offset 0 is gone: from 3072
    assert answer["out"][0] == 3072


def test_supervisor_output_keeps_its_order_and_bytes(records: Path) -> None:
    rnd = random.Random(5)
    blob = bytes(rnd.getrandbits(8) for _ in range(200_000))
    cid, status, got = supervise(records, "cat", cap=1 << 20, stdin=blob)
    assert status["exit_code"] == 0 and status["stdout_total"] == len(blob)
    _, data = file_agent.do_cmd_read(cid, 0, 0, 1 << 20)
    assert data == blob
    # frames may be dropped (whole) when their reader is slow; those sent are exact
    outs = [f for f in got if f.kind == "o"]
    assert outs and all(blob[f.offset:f.offset + len(f.data)] == f.data for f in outs)
    assert [f.offset for f in outs] == sorted(f.offset for f in outs)


def test_supervisor_tells_a_timeout_from_a_kill_and_a_crash(records: Path) -> None:
    t0 = time.monotonic()
    _, status, _ = supervise(records, "sleep 30", seconds="1")
    assert status["timed_out"] and status["exit_code"] == 137
    assert time.monotonic() - t0 < 20
    _, status, _ = supervise(records, "kill -9 $$")
    assert status["exit_code"] == 137 and not status["timed_out"] and not status["killed"]
    cid = uuid.uuid4().hex
    ctl = scripts.control_path("unit")
    program = local_program("supervisor", records)
    with subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", program, "capybara-bg", cid, ctl, "0", "1024", "0",
         "1", scripts.LEAN_EXEC_WRAPPER, "sleep 60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ) as child:
        _killed_while_running(records, cid, ctl, child)
    status = json.loads((records / cid / "status.json").read_text())
    assert status["killed"] and not status["timed_out"]
    assert file_agent.do_cmd_list() == []


def _killed_while_running(records: Path, cid: str, ctl: str, child: Any) -> None:
    try:
        # the command's pid file (its wrapper's) and the record's meta.json (the supervisor's,
        # written after the fork) come in either order; start() returns after both
        deadline = time.monotonic() + 30
        while not (os.path.exists(f"{ctl}.pid") and (records / cid / "meta.json").exists()):
            assert time.monotonic() < deadline, "the supervisor did not start the command"
            time.sleep(0.02)
        assert [m["id"] for m in file_agent.do_cmd_list()] == [cid]
        (records / cid / "killed").touch()
        kill = subprocess.run(["/bin/sh", *scripts.kill_batch_args([ctl])], timeout=30)
        assert kill.returncode == 0
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
        child.wait()


def test_records_that_are_not_the_supervisors_are_refused(records: Path) -> None:
    assert file_agent.do_cmd_read("../../etc", 0, 0, 10) == ({"absent": True}, b"")
    assert file_agent.do_cmd_read(CID, 0, 0, 10) == ({"absent": True}, b"")
    (records / CID).mkdir(parents=True)
    (records / CID / "meta.json").write_text(json.dumps({"pid": os.getpid(), "id": CID}))
    answer, _ = file_agent.do_cmd_read(CID, 0, 0, 10)
    assert answer["alive"] is False  # this pid is not a supervisor of that id
    assert file_agent.do_cmd_list() == []
