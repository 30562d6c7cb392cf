"""The emulator's sandbox logs (``GET /sandboxes/{id}/logs``, ``GET /v2/sandboxes/{id}/logs``):
the agent's structured lines of a real sandbox's processes and file transfers, the v2 filters
(level, search), cursor windows in both directions, limits and their 400s, logs kept across a
pause and a cold boot and after a kill, 404 for unknown sandboxes, and no secret in any line.
The line store and the line parser are also checked on their own.
"""

from __future__ import annotations

import datetime
import json
import re
import struct
from typing import Any, Callable, Dict, List

import pytest
import requests
from waiting import wait_until

from e2b_provider.emulator import Emulator
from e2b_provider.emulator.api.logs import parse_line
from e2b_provider.emulator.runtime import SandboxOutput
from e2b_provider.emulator.runtime.pid1.pid1_log import log_line

from .test_server import envd_headers, read_events, run

pytestmark = pytest.mark.integration

Make = Callable[..., Dict[str, Any]]
Entry = Dict[str, Any]


def _logs(
    api: requests.Session, emu: Emulator, sid: str, v2: bool = True, **params: Any
) -> requests.Response:
    path = f"/v2/sandboxes/{sid}/logs" if v2 else f"/sandboxes/{sid}/logs"
    return api.get(emu.api_url + path, params=params, timeout=30)


def _entries(api: requests.Session, emu: Emulator, sid: str, **params: Any) -> List[Entry]:
    r = _logs(api, emu, sid, **params)
    assert r.status_code == 200, r.text
    logs: List[Entry] = r.json()["logs"]
    return logs


def _ms(entry: Entry) -> int:
    """An entry's time in unix ms (the answer's RFC 3339 time has ms precision)."""
    stamp = datetime.datetime.strptime(entry["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
    stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return int(stamp.timestamp() * 1000 + 0.5)


def _events(entries: List[Entry], event_type: str) -> List[Entry]:
    return [e for e in entries if e["fields"].get("event_type") == event_type]


def _start_with_bad_keepalive(emu: Emulator, sb: Dict[str, Any], tag: str) -> None:
    """A tagged ``true`` whose stream asks for keepalives every 0 s: the agent logs a warning."""
    body = json.dumps({"process": {"cmd": "/bin/true"}, "tag": tag, "stdin": False}).encode()
    headers = envd_headers(
        sb, **{"Content-Type": "application/connect+json", "Keepalive-Ping-Interval": "0"}
    )
    resp = requests.post(
        emu.sandbox_url + "/process.Process/Start",
        headers=headers,
        data=struct.pack(">BI", 0, len(body)) + body,
        stream=True,
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    _, end = read_events(resp)
    assert end.ok, end


def _transfer_file(emu: Emulator, sb: Dict[str, Any]) -> None:
    url = emu.sandbox_url + "/files"
    r = requests.post(
        url,
        params={"path": "/tmp/logged.txt"},
        data=b"payload",
        headers=envd_headers(sb, **{"Content-Type": "application/octet-stream"}),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    r = requests.get(url, params={"path": "/tmp/logged.txt"}, headers=envd_headers(sb), timeout=30)
    assert r.status_code == 200 and r.content == b"payload", r.text


def test_logs_of_a_sandbox_filters_cursor_direction_limit(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    sb = make_sandbox(secure=True)
    sid = sb["sandboxID"]
    for word in ("one", "two", "three"):
        run(emu, sb, f"echo {word}")
    _start_with_bad_keepalive(emu, sb, "tagged")
    _transfer_file(emu, sb)

    def settled() -> bool:
        entries = _entries(api, emu, sid, direction="forward")
        return len(_events(entries, "process_end")) == 4 and bool(
            _events(entries, "file_read")
        )

    wait_until(settled, 10, "the agent's process and file lines")
    forward = _entries(api, emu, sid, direction="forward")
    backward = _entries(api, emu, sid)  # backward is the default
    assert backward == forward[::-1]
    stamps = [_ms(e) for e in forward]
    assert stamps == sorted(stamps)

    # the agent's structured lines: level, message, string fields
    starts = _events(forward, "process_start")
    assert len(starts) == 4
    for entry in starts:
        fields = entry["fields"]
        assert entry["level"] == "info" and fields["logger"] == "process"
        assert fields["pid"].isdigit()
        assert entry["message"] == f"Process with pid {fields['pid']} started"
    assert [e["fields"].get("tag") for e in starts] == [None, None, None, "tagged"]
    ends = _events(forward, "process_end")
    assert [e["fields"]["exit_code"] for e in ends] == ["0"] * 4
    assert {e["fields"]["pid"] for e in ends} == {e["fields"]["pid"] for e in starts}
    (written,) = _events(forward, "file_processing")
    (read,) = _events(forward, "file_read")
    for entry in (written, read):
        assert entry["fields"]["path"] == "/tmp/logged.txt"
        assert entry["fields"]["logger"] == "filesystem"
    # PID 1's lines are JSON too: logger "init"
    init = [e for e in forward if e["fields"].get("logger") == "init"]
    assert init and all(e["level"] == "info" and e["fields"] == {"logger": "init"} for e in init)

    # level is the least level kept; search is a case-sensitive substring of the message
    warned = _entries(api, emu, sid, level="warn")
    assert warned and all(e["level"] in ("warn", "error") for e in warned)
    assert any("Keepalive-Ping-Interval" in e["message"] for e in warned)
    assert _entries(api, emu, sid, level="debug") == backward
    info_up = _entries(api, emu, sid, level="info", direction="forward")
    assert info_up == [e for e in forward if e["level"] != "debug"]
    found = _entries(api, emu, sid, search="Process with pid", direction="forward")
    assert found == [e for e in forward if "Process with pid" in e["message"]]
    assert len(found) == 8
    assert _entries(api, emu, sid, search="process with pid") == []
    assert _entries(api, emu, sid, search="Process with pid", level="warn") == []

    # limit, and cursors: a window from (forward) or up to (backward) the cursor, inclusive
    assert _entries(api, emu, sid, direction="forward", limit=2) == forward[:2]
    assert _entries(api, emu, sid, limit=3) == backward[:3]
    assert _entries(api, emu, sid, limit=0) == []
    middle = stamps[len(stamps) // 2]
    after = [e for e in forward if _ms(e) >= middle]
    before = [e for e in backward if _ms(e) <= middle]
    assert _entries(api, emu, sid, cursor=middle, direction="forward") == after
    assert _entries(api, emu, sid, cursor=middle, direction="forward", limit=2) == after[:2]
    assert _entries(api, emu, sid, cursor=middle, direction="backward") == before
    assert _entries(api, emu, sid, cursor=middle, limit=2) == before[:2]
    assert _entries(api, emu, sid, cursor=stamps[-1] + 1, direction="forward") == []
    assert _entries(api, emu, sid, cursor=stamps[0] - 1) == []

    # paging forward with cursor = last time + 1 visits every time once, in order
    paged: List[Entry] = []
    cursor = stamps[0]
    for _ in range(len(forward)):
        page = _entries(api, emu, sid, cursor=cursor, direction="forward", limit=3)
        if not page:
            break
        paged += page
        cursor = _ms(page[-1]) + 1
    assert [_ms(e) for e in paged] == sorted(_ms(e) for e in paged)
    assert {_ms(e) for e in paged} == set(stamps)

    # v1: oldest first from start, the raw lines beside the entries
    r = _logs(api, emu, sid, v2=False, start=middle)
    assert r.status_code == 200, r.text
    v1 = r.json()
    assert v1["logEntries"] == after
    assert [line["timestamp"] for line in v1["logs"]] == [e["timestamp"] for e in after]
    r = _logs(api, emu, sid, v2=False)
    assert r.status_code == 200 and r.json()["logEntries"] == forward
    tagged = r.json()["logs"][forward.index(starts[-1])]["line"]
    assert json.loads(tagged)["tag"] == "tagged"
    r = _logs(api, emu, sid, v2=False, limit=1)
    assert r.status_code == 200 and r.json()["logEntries"] == forward[:1]

    # no secret in any line
    everything = _logs(api, emu, sid, v2=False).text + _logs(api, emu, sid).text
    assert sb["envdAccessToken"] and sb["envdAccessToken"] not in everything
    assert emu.api_key not in everything


@pytest.mark.parametrize(
    ("v2", "params", "name", "message"),
    [
        (True, {"limit": "1001"}, "limit", "number must be at most 1000"),
        (True, {"limit": "-1"}, "limit", "number must be at least 0"),
        (True, {"limit": "x"}, "limit", "value x: an invalid integer"),
        (True, {"cursor": "-5"}, "cursor", "number must be at least 0"),
        (True, {"direction": "up"}, "direction", "value is not one of the allowed values"),
        (True, {"level": "trace"}, "level", "value is not one of the allowed values"),
        (True, {"search": "s" * 257}, "search", "maximum string length is 256"),
        (False, {"start": "soon"}, "start", "value soon: an invalid integer"),
        (False, {"limit": "-2"}, "limit", "number must be at least 0"),
    ],
)
def test_bad_log_queries_answer_400(
    emu: Emulator,
    api: requests.Session,
    v2: bool,
    params: Dict[str, str],
    name: str,
    message: str,
) -> None:
    r = _logs(api, emu, "iunknownsandbox00000", v2=v2, **params)
    assert r.status_code == 400, r.text
    body = r.json()
    assert set(body) == {"code", "message"} and body["code"] == 400
    prefix = f'validation error: parameter "{name}" in query has an error: '
    assert body["message"].startswith(prefix + message), body


def test_logs_across_pause_and_after_kill_404_for_unknown(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    sid = make_sandbox()["sandboxID"]

    def boots() -> int:
        entries = _entries(api, emu, sid, search="agent started (pid")
        return len(entries)

    wait_until(lambda: boots() == 1, 10, "the first boot's lines")
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/pause", json={"memory": False}, timeout=60)
    assert r.status_code == 204, r.text
    assert boots() == 1  # a paused sandbox still has its logs
    r = api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect", json={"timeout": 60}, timeout=60)
    assert r.status_code == 201, r.text
    wait_until(lambda: boots() == 2, 10, "the second boot's lines")
    before = _entries(api, emu, sid, direction="forward")

    assert api.delete(f"{emu.api_url}/sandboxes/{sid}", timeout=60).status_code == 204
    after = _entries(api, emu, sid, direction="forward")
    assert after[: len(before)] == before
    r = _logs(api, emu, sid, v2=False)
    assert r.status_code == 200 and r.json()["logEntries"][: len(before)] == before

    for unknown in ("inosuchsandbox000000", sid + "x"):
        r = _logs(api, emu, unknown)
        assert r.status_code == 404, r.text
        assert _logs(api, emu, unknown, v2=False).status_code == 404
    assert _logs(api, emu, "Not_An_Id").status_code == 400


def test_every_log_line_is_a_json_object_the_cli_can_parse(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    """E2B's ``e2b sandbox logs`` does ``JSON.parse(line)`` on every v1 line, then reads
    ``level`` (upper-cased) and ``logger``: PID 1's lines are JSON objects like the agent's."""
    sb = make_sandbox()
    sid = sb["sandboxID"]
    run(emu, sb, "echo hi")
    wait_until(
        lambda: _events(_entries(api, emu, sid), "process_end"), 10, "the agent's lines"
    )
    r = _logs(api, emu, sid, v2=False)
    assert r.status_code == 200, r.text
    lines = [json.loads(log["line"]) for log in r.json()["logs"]]
    assert lines and all(isinstance(line, dict) for line in lines)
    for line in lines:
        assert line["level"] in ("debug", "info", "warn", "error"), line
        assert isinstance(line["logger"], str) and isinstance(line["message"], str), line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"]), line
    init = [line for line in lines if line["logger"] == "init"]
    assert any(re.fullmatch(r"agent started \(pid \d+\)", line["message"]) for line in init)
    assert any(re.fullmatch(r"sandbox \S+ set up in \d+ ms", line["message"]) for line in init)
    assert not any("e2b-init" in log["line"] for log in r.json()["logs"])
    v2 = _entries(api, emu, sid, search="agent started (pid")
    assert v2 and all(e["fields"] == {"logger": "init"} for e in v2)


def test_init_log_lines_and_raw_lines_become_json_objects() -> None:
    raw = log_line("setup failed:\nTraceback (most recent call last):\n  boom", "error")
    assert raw.endswith("\n") and raw.count("\n") == 1
    entry = parse_line(7, raw.rstrip("\n"))
    assert (entry.level, entry.message, dict(entry.fields)) == (
        "error",
        "setup failed:\nTraceback (most recent call last):\n  boom",
        {"logger": "init"},
    )
    assert json.loads(entry.line_json()["line"])["time"].endswith("Z")
    cut = parse_line(8, '{"level": "info", "message": "cut at the length li')
    assert json.loads(cut.line_json()["line"]) == {
        "level": "info",
        "time": "1970-01-01T00:00:00.008Z",
        "logger": "output",
        "message": '{"level": "info", "message": "cut at the length li',
    }


def test_logs_need_the_api_key(emu: Emulator, make_sandbox: Make) -> None:
    sid = make_sandbox()["sandboxID"]
    r = requests.get(f"{emu.api_url}/v2/sandboxes/{sid}/logs", timeout=30)
    assert r.status_code == 401, r.text


# -- the pieces on their own ----------------------------------------------------------------


def test_output_splits_stamps_and_bounds_lines() -> None:
    out = SandboxOutput(max_lines=3, max_bytes=1 << 20)
    out.feed(b"first\nsec", now_ms=1000)
    out.feed(b"ond\r\nthird\n", now_ms=990)  # a clock step back repeats the last time
    assert out.lines() == [(1000, "first"), (1000, "second"), (1000, "third")]
    out.feed(b"unterminated", now_ms=2000)
    out.end(now_ms=2001)
    assert out.lines() == [(1000, "second"), (1000, "third"), (2001, "unterminated")]
    out.feed(b"x" * 100_000 + b"\n", now_ms=3000)
    assert out.lines()[-1] == (3000, "x" * 16384)  # a line is cut at 16 KiB
    out.feed(b"\xff\xfe bytes\n", now_ms=3001)
    assert out.lines()[-1] == (3001, "\ufffd\ufffd bytes")
    out.clear()
    assert out.lines() == []
    small = SandboxOutput(max_lines=100, max_bytes=10)
    small.feed(b"12345\n67890\nabc\n", now_ms=1)
    assert small.lines() == [(1, "67890"), (1, "abc")]


def test_parse_line_maps_levels_and_fields() -> None:
    entry = parse_line(
        5, '{"level":"warning","time":"t","message":"m","pid":7,"ok":true,"o":{"a":1},"s":"x"}'
    )
    assert (entry.timestamp_ms, entry.level, entry.message) == (5, "warn", "m")
    assert dict(entry.fields) == {"pid": "7", "ok": "true", "o": '{"a":1}', "s": "x"}
    assert parse_line(1, '{"level":"fatal","msg":"gone"}').entry_json()["level"] == "error"
    assert parse_line(1, '{"level":"loud"}').level == "info"
    for raw in ("plain text", "{not json", "[1, 2]", '"just a string"'):
        plain = parse_line(1, raw)
        assert (plain.level, plain.message) == ("info", raw)
        assert dict(plain.fields) == {"logger": "output"}
    assert parse_line(1234, "x").line_json() == {
        "timestamp": "1970-01-01T00:00:01.234Z",
        "line": '{"level": "info", "time": "1970-01-01T00:00:01.234Z", "logger": "output", '
        '"message": "x"}',
    }
