"""The emulator's host server over real HTTP: control plane, envd front, faults, CLI, cleanup.

Everything runs against real sandboxes (namespaces + the envd agent) through the session's
emulator subprocess; the CLI tests start their own emulator processes and check that no sandbox
process survives them.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote, urlencode

import pytest
import requests
import urllib3
from waiting import last_request, wait_until

from e2b_provider.emulator import Emulator, EmulatorError, EmulatorUnavailable
from e2b_provider.errors import ProtocolError
from e2b_provider.protocol.connect import EndStream, EnvelopeDecoder, Message

pytestmark = pytest.mark.integration

Make = Callable[..., Dict[str, Any]]
ID_RE = re.compile(r"^i[a-z0-9]{20}$")


# -- helpers --------------------------------------------------------------------------------


def envd_headers(sb: Dict[str, Any], **extra: str) -> Dict[str, str]:
    h = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "49983"}
    if sb.get("envdAccessToken"):
        h["X-Access-Token"] = sb["envdAccessToken"]
    h.update(extra)
    return h


def start_body(cmd: str, **process: Any) -> bytes:
    body = json.dumps(
        {"process": {"cmd": "/bin/sh", "args": ["-c", cmd], **process}, "stdin": False}
    ).encode()
    return struct.pack(">BI", 0, len(body)) + body


def open_start(
    emu: Emulator, sb: Dict[str, Any], cmd: str, *, user: Optional[str] = None, timeout: Any = 60
) -> requests.Response:
    headers = envd_headers(sb, **{"Content-Type": "application/connect+json"})
    if user:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:".encode()).decode()
    return requests.post(
        emu.sandbox_url + "/process.Process/Start",
        headers=headers,
        data=start_body(cmd),
        stream=True,
        timeout=timeout,
    )


def read_events(resp: requests.Response) -> Tuple[List[Dict[str, Any]], EndStream]:
    dec = EnvelopeDecoder()
    events: List[Dict[str, Any]] = []
    end: Optional[EndStream] = None
    for chunk in resp.raw.stream(65536, decode_content=False):
        dec.feed(chunk)
        for item in dec:
            if isinstance(item, Message):
                events.append(item.data["event"])
            else:
                end = item
    dec.close()
    resp.close()
    assert end is not None
    return events, end


def run(
    emu: Emulator, sb: Dict[str, Any], cmd: str, check: bool = True, **kw: Any
) -> Tuple[str, Dict[str, Any]]:
    """Run ``cmd`` through envd Start; return (stdout+stderr text, end event).

    With ``check``, the command must exit 0."""
    resp = open_start(emu, sb, cmd, **kw)
    assert resp.status_code == 200, resp.text
    events, end = read_events(resp)
    assert end.ok, end
    out = b""
    for ev in events:
        data = ev.get("data") or {}
        for key in ("stdout", "stderr"):
            if key in data:
                out += base64.b64decode(data[key])
    ends = [ev["end"] for ev in events if "end" in ev]
    assert len(ends) == 1, events
    if check:
        assert ends[0].get("exitCode", 0) == 0, (cmd, out, ends[0])
    return out.decode(), ends[0]


def health(emu: Emulator, sb: Dict[str, Any], timeout: float = 10) -> requests.Response:
    return requests.get(
        emu.sandbox_url + "/health",
        headers={"E2b-Sandbox-Id": sb["sandboxID"]},
        timeout=timeout,
    )


def detail(api: requests.Session, emu: Emulator, sid: str) -> Dict[str, Any]:
    r = api.get(f"{emu.api_url}/sandboxes/{sid}", timeout=30)
    assert r.status_code == 200, r.text
    out: Dict[str, Any] = r.json()
    return out


def wait_for_file(
    emu: Emulator, sb: Dict[str, Any], path: str, content: str, what: str, timeout: float = 10
) -> None:
    """Wait until the sandbox's file ``path`` holds exactly ``content``."""
    wait_until(lambda: run(emu, sb, f"cat {path} 2>/dev/null || true")[0] == content, timeout, what)


def proc_start_time(pid: int) -> Optional[str]:
    """The start time of a live process (None when gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def alive(pids: Dict[int, Optional[str]]) -> List[int]:
    """The pids of ``{pid: start time}`` still alive as the same process (not reused)."""
    return [p for p, st in pids.items() if st is not None and proc_start_time(p) == st]


# -- control plane: auth and validation -----------------------------------------------------


def test_api_key_is_required(emu: Emulator) -> None:
    for headers in ({}, {"X-API-KEY": "e2b_wrong"}):
        for method, path in (
            ("GET", "/v2/sandboxes"),
            ("POST", "/v2/sandboxes"),
            ("DELETE", "/sandboxes/iabc"),
            ("GET", "/_emulator/faults"),
        ):
            r = requests.request(method, emu.api_url + path, headers=headers, json={}, timeout=10)
            assert r.status_code == 401
            assert r.json() == {"code": 401, "message": "Invalid API key"}
    log = emu.requests(path="/v2/sandboxes")
    assert any(e["api_key"] == "invalid" for e in log)
    assert emu.api_key not in json.dumps(emu.requests())


def test_validation_errors(emu: Emulator, api: requests.Session) -> None:
    base = emu.api_url
    r = api.post(base + "/v2/sandboxes", json={"templateID": "no-such-template"})
    assert r.status_code == 404 and r.json()["code"] == 404
    r = api.post(base + "/v2/sandboxes", json={"timeout": 10})
    assert r.status_code == 400 and "templateID" in r.json()["message"]
    r = api.post(base + "/v2/sandboxes", data=b"{not json", headers={"Content-Type": "x"})
    assert r.status_code == 400
    r = api.post(base + "/v2/sandboxes", json={"templateID": "base", "timeout": 0})
    assert r.status_code == 400
    r = api.post(base + "/v2/sandboxes", json={"templateID": "base", "autoPauseMemory": False})
    assert r.status_code == 400
    for bad in ("UPPER", "a-b-c", "x_y"):
        r = api.get(f"{base}/sandboxes/{bad}")
        assert r.status_code == 400 and r.json()["message"] == "Invalid sandbox ID"
    r = api.get(f"{base}/sandboxes/iunknown0000000000000")
    assert r.status_code == 404 and "doesn't exist" in r.json()["message"]
    r = api.post(f"{base}/sandboxes/iunknown0000000000000/pause")
    assert r.status_code == 404
    r = api.get(base + "/v3/nothing")
    assert r.status_code == 404 and r.json()["message"].startswith("validation error:")
    r = api.get(base + "/v2/sandboxes", params={"nextToken": "garbage!"})
    assert r.status_code == 400 and r.json()["message"] == "Invalid next token"


# -- control plane: lifecycle ---------------------------------------------------------------


def test_create_get_delete(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    t0 = time.monotonic()
    sb = make_sandbox(metadata={"k": "v"}, envVars={"FOO": "bar"}, timeout=120)
    took = time.monotonic() - t0
    sid = sb["sandboxID"]
    assert ID_RE.match(sid)
    assert re.fullmatch(r"[0-9a-f]{64}", sb["envdAccessToken"])
    assert sb["envdVersion"] == "0.6.13"
    assert sb["clientID"] and sb["templateID"] == "base" and sb["domain"]
    assert took < 10
    d = detail(api, emu, sid)
    assert d["state"] == "running" and d["metadata"] == {"k": "v"}
    assert d["envdAccessToken"] == sb["envdAccessToken"]
    for field in ("startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "envdVersion"):
        assert field in d
    assert "pauseMode" not in d
    out, _ = run(emu, sb, 'echo "$FOO"; hostname')
    assert out.split()[0] == "bar"
    pids = emu.sandbox_pids(sid)
    assert pids
    r = api.delete(f"{emu.api_url}/sandboxes/{sid}")
    assert r.status_code == 204
    assert api.delete(f"{emu.api_url}/sandboxes/{sid}").status_code == 404
    assert api.get(f"{emu.api_url}/sandboxes/{sid}").status_code == 404
    assert emu.sandbox_pids(sid) == []
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]
    r = health(emu, sb)
    assert r.status_code == 502 and r.json()["message"] == "The sandbox was not found"


def test_v1_create_and_legacy_id_form(emu: Emulator, api: requests.Session) -> None:
    r = api.post(emu.api_url + "/sandboxes", json={"templateID": "base", "secure": True})
    assert r.status_code == 201
    sb = r.json()
    try:
        d = detail(api, emu, f"{sb['sandboxID']}-{sb['clientID']}")
        assert d["sandboxID"] == sb["sandboxID"]
        end = d["endAt"]
        assert end > d["startedAt"]  # default v1 timeout is 15 s
    finally:
        api.delete(f"{emu.api_url}/sandboxes/{sb['sandboxID']}")


def test_list_paging_metadata_and_state(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    tag = f"list-{time.monotonic_ns()}"
    name = "a b&c=d+e/é"
    ids = [make_sandbox(metadata={"tag": tag, "capybara-sandbox-name": name})["sandboxID"]]
    ids += [make_sandbox(metadata={"tag": tag})["sandboxID"] for _ in range(2)]
    make_sandbox(metadata={"tag": "other"})
    # the SDK's / reference's encoding: urlencode({quote(k): quote(v)})
    meta = urlencode({quote("tag"): quote(tag)})
    seen: List[str] = []
    token = None
    pages = 0
    while True:
        params = {"metadata": meta, "limit": "2", "state": "running,paused"}
        if token:
            params["nextToken"] = token
        r = api.get(emu.api_url + "/v2/sandboxes", params=params)
        assert r.status_code == 200
        seen += [s["sandboxID"] for s in r.json()]
        pages += 1
        token = r.headers.get("x-next-token")
        if not token:
            break
    assert pages == 2 and sorted(seen) == sorted(ids)
    both = urlencode({quote("tag"): quote(tag), quote("capybara-sandbox-name"): quote(name)})
    r = api.get(emu.api_url + "/v2/sandboxes", params={"metadata": both})
    assert [s["sandboxID"] for s in r.json()] == [ids[0]]
    item = r.json()[0]
    for field in ("templateID", "clientID", "startedAt", "endAt", "cpuCount", "state"):
        assert field in item
    assert "envdAccessToken" not in item
    assert api.post(f"{emu.api_url}/sandboxes/{ids[1]}/pause").status_code == 204
    r = api.get(emu.api_url + "/v2/sandboxes", params={"metadata": meta, "state": "running"})
    assert sorted(s["sandboxID"] for s in r.json()) == sorted([ids[0], ids[2]])
    r = api.get(emu.api_url + "/v2/sandboxes", params={"metadata": meta, "state": "paused"})
    assert [s["sandboxID"] for s in r.json()] == [ids[1]]
    r = api.get(emu.api_url + "/sandboxes", params={"metadata": meta})  # v1: running only
    assert sorted(s["sandboxID"] for s in r.json()) == sorted([ids[0], ids[2]])


def test_connect_only_extends(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    sb = make_sandbox(timeout=100)
    sid = sb["sandboxID"]
    end0 = detail(api, emu, sid)["endAt"]
    r = api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect", json={"timeout": 10})
    assert r.status_code == 200 and r.json()["envdAccessToken"] == sb["envdAccessToken"]
    assert detail(api, emu, sid)["endAt"] == end0
    r = api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect")  # body optional: 300 s
    assert r.status_code == 200
    assert detail(api, emu, sid)["endAt"] > end0
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/connect", json={})  # v1: timeout required
    assert r.status_code == 400
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/connect", json={"timeout": 1000})
    assert r.status_code == 200
    end_long = detail(api, emu, sid)["endAt"]
    # /timeout can shorten; /refreshes only extends
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/timeout", json={"timeout": 50})
    assert r.status_code == 204
    end1 = detail(api, emu, sid)["endAt"]
    assert end1 < end_long
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/refreshes", json={"duration": 10})
    assert r.status_code == 204 and detail(api, emu, sid)["endAt"] == end1
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/refreshes", json={"duration": 3600})
    assert r.status_code == 204 and detail(api, emu, sid)["endAt"] > end1


def test_full_pause_keeps_processes(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    sb = make_sandbox()
    sid = sb["sandboxID"]
    run(emu, sb, "echo data > ~/f; (sleep 300 > /dev/null 2>&1 &) ; true")
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/pause")  # no body = memory:true
    assert r.status_code == 204
    d = detail(api, emu, sid)
    assert d["state"] == "paused" and d["pauseMode"] == "full"
    assert "envdUnresponsiveAtPause" not in d
    assert emu.sandbox_pids(sid)  # frozen, not dead
    r = health(emu, sb)
    assert r.status_code == 502 and r.json()["message"] == "The sandbox was not found"
    assert r.json()["sandboxId"] == sid
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/pause", json={"memory": True})
    assert r.status_code == 409
    r = api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect", json={"timeout": 60})
    assert r.status_code == 201 and r.json()["envdAccessToken"] == sb["envdAccessToken"]
    out, _ = run(emu, sb, "cat ~/f; pgrep -c -x sleep")
    assert out.split() == ["data", "1"]
    assert detail(api, emu, sid)["state"] == "running"


def test_filesystem_pause_reboots(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    sb = make_sandbox()
    sid = sb["sandboxID"]
    run(emu, sb, "echo kept > ~/f; (sleep 300 > /dev/null 2>&1 &) ; true")
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/pause", json={"memory": False})
    assert r.status_code == 204
    d = detail(api, emu, sid)
    assert d["state"] == "paused" and d["pauseMode"] == "filesystem"
    assert emu.sandbox_pids(sid) == []  # every process ended
    r = api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect", json={"timeout": 60})
    assert r.status_code == 201
    out, _ = run(emu, sb, "cat ~/f; pgrep -c -x sleep || true")
    assert out.split() == ["kept", "0"]


def test_connect_memory_false_cold_boots_a_full_pause(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    sb = make_sandbox()
    sid = sb["sandboxID"]
    run(emu, sb, "echo kept > ~/f; (sleep 300 > /dev/null 2>&1 &) ; true")
    assert api.post(f"{emu.api_url}/sandboxes/{sid}/pause", json={}).status_code == 204
    r = api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect", json={"memory": False})
    assert r.status_code == 201
    out, _ = run(emu, sb, "cat ~/f; pgrep -c -x sleep || true")
    assert out.split() == ["kept", "0"]
    # memory:false on a running sandbox is a plain TTL extension
    r = api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect", json={"memory": False})
    assert r.status_code == 200


def test_legacy_resume(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    sid = make_sandbox()["sandboxID"]
    assert api.post(f"{emu.api_url}/sandboxes/{sid}/resume", json={}).status_code == 409
    assert api.post(f"{emu.api_url}/sandboxes/{sid}/pause").status_code == 204
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/resume", json={"timeout": 30})
    assert r.status_code == 201 and r.json()["sandboxID"] == sid
    assert detail(api, emu, sid)["state"] == "running"


def test_timeout_paused_sandbox_and_unknown(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    sid = make_sandbox()["sandboxID"]
    assert api.post(f"{emu.api_url}/sandboxes/{sid}/pause").status_code == 204
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/timeout", json={"timeout": 30})
    assert r.status_code == 404


def test_expiry_auto_pauses(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    full = make_sandbox(timeout=2, autoPause=True)
    fs = make_sandbox(timeout=2, autoPause=True, autoPauseMemory=False)
    assert detail(api, emu, full["sandboxID"])["lifecycle"]["onTimeout"] == "pause"
    run(emu, fs, "echo survives > ~/f")
    # pauseMode appears once the pause has finished (state is "paused" already while pausing)
    wait_until(
        lambda: (
            "pauseMode" in detail(api, emu, full["sandboxID"])
            and "pauseMode" in detail(api, emu, fs["sandboxID"])
        ),
        15,
        "auto-pause",
    )
    assert detail(api, emu, full["sandboxID"])["state"] == "paused"
    assert detail(api, emu, full["sandboxID"])["pauseMode"] == "full"
    assert detail(api, emu, fs["sandboxID"])["pauseMode"] == "filesystem"
    assert emu.sandbox_pids(fs["sandboxID"]) == []
    r = api.post(f"{emu.api_url}/v2/sandboxes/{fs['sandboxID']}/connect", json={"timeout": 30})
    assert r.status_code == 201
    assert run(emu, fs, "cat ~/f")[0] == "survives\n"


def test_expiry_kills_without_auto_pause(emu: Emulator, api: requests.Session) -> None:
    r = api.post(emu.api_url + "/v2/sandboxes", json={"templateID": "base", "timeout": 1})
    assert r.status_code == 201
    sid = r.json()["sandboxID"]
    pids = {p: proc_start_time(p) for p in emu.sandbox_pids(sid)}
    assert pids
    wait_until(lambda: api.get(f"{emu.api_url}/sandboxes/{sid}").status_code == 404, 15, "expiry")
    wait_until(lambda: not alive(pids), 10, "sandbox processes to end")
    assert emu.sandbox_pids(sid) == []


def test_idempotency_key(emu: Emulator, api: requests.Session) -> None:
    key = f"key-{time.monotonic_ns()}"
    body = {"templateID": "base", "metadata": {"idem": key}}
    r1 = api.post(emu.api_url + "/v2/sandboxes", json=body, headers={"Idempotency-Key": key})
    r2 = api.post(emu.api_url + "/v2/sandboxes", json=body, headers={"Idempotency-Key": key})
    try:
        assert r1.status_code == r2.status_code == 201
        assert r1.json()["sandboxID"] == r2.json()["sandboxID"]
        r3 = api.post(
            emu.api_url + "/v2/sandboxes",
            json={**body, "timeout": 60},
            headers={"Idempotency-Key": key},
        )
        assert r3.status_code == 422
        assert r3.json()["error_code"] == "idempotency_request_mismatch"
        r4 = api.post(emu.api_url + "/v2/sandboxes", json=body, headers={"Idempotency-Key": "UP"})
        assert r4.status_code == 400
    finally:
        api.delete(f"{emu.api_url}/sandboxes/{r1.json()['sandboxID']}")


# -- envd front -----------------------------------------------------------------------------


def test_envd_token_and_routing(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    sid = sb["sandboxID"]
    assert health(emu, sb).status_code == 204  # no token needed for /health
    wrong = {**sb, "envdAccessToken": "0" * 64}
    nothing = {k: v for k, v in sb.items() if k != "envdAccessToken"}
    for bad in (wrong, nothing):
        r = requests.post(
            emu.sandbox_url + "/process.Process/Start",
            headers=envd_headers(bad, **{"Content-Type": "application/connect+json"}),
            data=start_body("touch /tmp/should-not-exist"),
            timeout=10,
        )
        assert r.status_code == 401 and r.json()["code"] == 401
        r = requests.get(
            emu.sandbox_url + "/files",
            params={"path": "/etc/hostname"},
            headers=envd_headers(bad),
            timeout=10,
        )
        assert r.status_code == 401
    assert run(emu, sb, "test -e /tmp/should-not-exist && echo yes || echo no")[0] == "no\n"
    r = requests.get(
        emu.sandbox_url + "/files",
        params={"path": "/etc/hostname"},
        headers=envd_headers(sb),
        timeout=10,
    )
    assert r.status_code == 200
    # other ports are closed; unknown sandboxes are not found
    r = requests.get(
        emu.sandbox_url + "/health",
        headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "8080"},
        timeout=10,
    )
    assert r.status_code == 502 and "port is not open" in r.json()["message"]
    r = requests.get(
        emu.sandbox_url + "/health", headers={"E2b-Sandbox-Id": "iunknown"}, timeout=10
    )
    assert r.status_code == 502 and r.json()["message"] == "The sandbox was not found"
    # Host-based routing: 49983-<id>.<domain>
    r = requests.get(
        emu.sandbox_url + "/health", headers={"Host": f"49983-{sid}.e2b.localhost"}, timeout=10
    )
    assert r.status_code == 204
    r = requests.get(
        emu.sandbox_url + "/health", headers={"Host": f"3000-{sid}.e2b.localhost"}, timeout=10
    )
    assert r.status_code == 502
    log = emu.requests(sandbox_id=sid, path="/process.Process/Start")
    assert {e["token"] for e in log if e["status"] == 401} == {"invalid", "missing"}
    assert sb["envdAccessToken"] not in json.dumps(emu.requests())


def test_user_selection_and_streaming(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    assert run(emu, sb, "id -un", user="sandbox")[0] == "sandbox\n"
    assert run(emu, sb, "id -un", user="root")[0] == "root\n"
    # output flows as it is produced, not buffered until the end: the command waits (20 s
    # at most) for a gate the test opens only once it has seen the first line
    gate = f"/tmp/gate-{time.monotonic_ns()}"
    cmd = (
        f"echo first; i=0; while [ ! -e {gate} ] && [ $i -lt 400 ]; do sleep 0.05; "
        f"i=$((i+1)); done; [ -e {gate} ] && echo second || echo timed-out"
    )
    resp = open_start(emu, sb, cmd)
    dec = EnvelopeDecoder()
    seen: List[bytes] = []
    for chunk in resp.raw.stream(65536, decode_content=False):
        dec.feed(chunk)
        for item in dec:
            if isinstance(item, Message) and "data" in item.data["event"]:
                seen.append(base64.b64decode(item.data["event"]["data"].get("stdout", "")))
                if len(seen) == 1:
                    assert seen == [b"first\n"]
                    run(emu, sb, f"touch {gate}")
    resp.close()
    assert b"".join(seen) == b"first\nsecond\n"


def test_large_output_streams(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    out, _ = run(emu, sb, "head -c 6000000 /dev/zero | tr '\\0' 'x'")
    assert len(out) == 6_000_000 and set(out) == {"x"}


def test_send_signal_is_logged(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    resp = open_start(emu, sb, "sleep 300")
    dec = EnvelopeDecoder()
    pid = None
    ends = []
    for chunk in resp.raw.stream(1024, decode_content=False):
        dec.feed(chunk)
        for item in dec:
            if not isinstance(item, Message):
                continue
            event = item.data["event"]
            if "start" in event:
                pid = event["start"]["pid"]
                r = requests.post(
                    emu.sandbox_url + "/process.Process/SendSignal",
                    headers=envd_headers(sb, **{"Content-Type": "application/json"}),
                    json={"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"},
                    timeout=10,
                )
                assert r.status_code == 200
            if "end" in event:
                ends.append(event["end"])
    resp.close()
    assert len(ends) == 1 and ends[0]["status"] == "signal: killed"
    log = emu.requests(sandbox_id=sb["sandboxID"], path="SendSignal")
    assert len(log) == 1 and json.loads(log[0]["body"])["process"]["pid"] == pid


def test_client_disconnect_keeps_process_running(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    resp = open_start(emu, sb, "sleep 1; echo done > ~/after-disconnect")
    resp.raw.read(5)
    resp.close()  # the client goes away mid-stream
    wait_for_file(
        emu, sb, "~/after-disconnect", "done\n", "the process to finish after the client left"
    )


def test_concurrent_streams(
    emu: Emulator, make_sandbox: Make, run_in_threads: Callable[..., float]
) -> None:
    sb = make_sandbox()
    n = 200
    results: List[Optional[str]] = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        barrier.wait(timeout=30)
        results[i] = run(emu, sb, f"sleep 1; echo {i}", timeout=60)[0]

    took = run_in_threads(worker, n, 90)
    assert results == [f"{i}\n" for i in range(n)]
    assert took < 45


def test_listening_socket_queues_a_burst_of_connections(emu: Emulator) -> None:
    # a client that starts 1,000 commands at once opens 1,000 connections: the accept queue
    # holds them all (a listener's Send-Q in ss is its queue's size; the kernel caps it at
    # net.core.somaxconn), so no SYN is dropped and no connection is reset
    port = urllib3.util.parse_url(emu.sandbox_url).port
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    with open("/proc/sys/net/core/somaxconn") as f:
        somaxconn = int(f.read())
    assert out[0] == "LISTEN" and int(out[2]) == min(4096, somaxconn), out


# -- faults ---------------------------------------------------------------------------------


def test_fault_connect_conflict(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    sid = make_sandbox()["sandboxID"]
    emu.connect_conflict(count=2, error_code="sandbox_start_in_flight")
    url = f"{emu.api_url}/v2/sandboxes/{sid}/connect"
    answers = [api.post(url, json={}) for _ in range(3)]
    assert [a.status_code for a in answers] == [409, 409, 200]
    assert answers[0].json()["error_code"] == "sandbox_start_in_flight"
    emu.connect_conflict(count=-1)
    assert [api.post(url).status_code for _ in range(3)] == [409, 409, 409]
    emu.clear_faults()
    assert api.post(url).status_code == 200


def test_fault_control_error(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    sid = make_sandbox()["sandboxID"]
    base = emu.api_url
    calls = {
        "create": lambda: api.post(base + "/v2/sandboxes", json={"templateID": "base"}),
        "list": lambda: api.get(base + "/v2/sandboxes"),
        "get": lambda: api.get(f"{base}/sandboxes/{sid}"),
        "connect": lambda: api.post(f"{base}/v2/sandboxes/{sid}/connect"),
        "pause": lambda: api.post(f"{base}/sandboxes/{sid}/pause"),
        "delete": lambda: api.delete(f"{base}/sandboxes/{sid}"),
    }
    before = len(emu.list_sandboxes())
    for route, call in calls.items():
        emu.control_error(route, 503, error_code="sandbox_capacity_unavailable", retry_after=0.5)
        r = call()
        assert r.status_code == 503, route
        assert r.json() == {
            "code": 503,
            "message": "injected fault",
            "error_code": "sandbox_capacity_unavailable",
        }
        assert r.headers["Retry-After"] == "0.5"
    assert len(emu.list_sandboxes()) == before  # nothing was created, paused or deleted
    assert detail(api, emu, sid)["state"] == "running"
    emu.control_error("any", 500, count=2)
    assert calls["get"]().status_code == 500
    assert calls["list"]().status_code == 500
    assert calls["get"]().status_code == 200


def test_fault_control_redirect(emu: Emulator, api: requests.Session) -> None:
    emu.clear_requests()
    emu.control_redirect("list")
    r = api.get(emu.api_url + "/v2/sandboxes", allow_redirects=False)
    assert r.status_code == 307
    assert r.headers["Location"].endswith("/_emulator/redirect-target")
    assert api.get(emu.api_url + "/v2/sandboxes", allow_redirects=False).status_code == 200
    emu.control_redirect("list")
    r = api.get(emu.api_url + "/v2/sandboxes")  # a client that follows redirects is caught
    assert r.json() == {"redirected": True, "method": "GET"}
    assert [e["path"] for e in emu.requests(path="redirect-target")] == [
        "/_emulator/redirect-target"
    ]


def test_fault_no_token(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    emu.no_token()
    first = make_sandbox()
    second = make_sandbox()
    assert "envdAccessToken" not in first and "envdAccessToken" in second
    emu.no_token()
    r = api.post(f"{emu.api_url}/v2/sandboxes/{second['sandboxID']}/connect")
    assert r.status_code == 200 and "envdAccessToken" not in r.json()


def test_fault_envd_error(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    sid = sb["sandboxID"]
    emu.envd_error(502, sandbox_id=sid)
    resp = open_start(emu, sb, "echo ran > ~/envd-error")
    assert resp.status_code == 502
    assert resp.json() == {"code": 502, "message": "Bad gateway"}
    resp.close()
    assert emu.faults() == []
    (hit,) = [e for e in emu.requests(sandbox_id=sid, path="Start") if e.get("fault")]
    assert (hit["fault"], hit["status"]) == ("envd_error", 502)
    # nothing reached envd: the command never ran, and the next request is served
    assert run(emu, sb, "cat ~/envd-error 2>/dev/null || echo never ran")[0] == "never ran\n"
    emu.envd_error(500, sandbox_id="iother0123456789abcde")  # limited to another sandbox
    assert health(emu, sb).status_code == 204
    assert [f["kind"] for f in emu.faults()] == ["envd_error"]


def test_fault_stream_cut(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    emu.stream_cut(after_bytes=12, sandbox_id=sb["sandboxID"])
    resp = open_start(emu, sb, "echo hello; sleep 1; echo world > ~/cut")
    got = b""
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        for chunk in resp.iter_content(None):
            got += chunk
    assert len(got) == 12
    resp.close()
    # the process kept running in the sandbox; the next stream is whole again
    wait_for_file(emu, sb, "~/cut", "world\n", "the cut process to finish")


def test_fault_stream_stall(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    sid = sb["sandboxID"]
    emu.stream_stall(sandbox_id=sid, after_bytes=7)
    resp = open_start(emu, sb, "echo hi", timeout=(10, 1.0))
    assert len(resp.raw.read(7)) == 7
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        resp.raw.read(1)  # nothing more comes (the command ended long ago): the read times out
    resp.close()

    # clearing the faults closes a stalled stream, without an end of stream
    mark = last_request(emu)
    emu.stream_stall(sandbox_id=sid, after_bytes=0)
    resp = open_start(emu, sb, "echo hi", timeout=(10, 20))
    done = threading.Event()
    outcome: Dict[str, Any] = {}

    def reader() -> None:
        try:
            outcome["data"] = resp.raw.read()
        except Exception as exc:
            outcome["error"] = exc
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    wait_until(
        lambda: any(e["seq"] > mark and e.get("stalled") for e in emu.requests(sandbox_id=sid)),
        10,
        "the emulator to stall the stream",
    )
    assert not done.is_set()
    emu.clear_faults()
    assert done.wait(10)
    resp.close()
    # the connection was closed in the middle of the chunked body: nothing was delivered
    assert "data" not in outcome, outcome
    assert isinstance(outcome["error"], urllib3.exceptions.ProtocolError), outcome

    # cleared before the stream reached its stall point: it is closed there, not stalled
    emu.stream_stall(sandbox_id=sid, after_bytes=100)
    resp = open_start(
        emu, sb, "while [ ! -e /tmp/go ]; do sleep 0.02; done; head -c 5000 /dev/zero",
        timeout=(10, 20),
    )
    emu.clear_faults()
    run(emu, sb, "touch /tmp/go")
    with pytest.raises(urllib3.exceptions.ProtocolError):
        resp.raw.read()  # ends at once (a read timeout here would mean it stalled after all)
    resp.close()


def test_fault_bad_envelope(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    expected = {
        "oversized": lambda head: struct.unpack(">BI", head[:5]) == (0, 1 << 30),
        "malformed": lambda head: head[0] == 0 and b"not json" in head,
        "compressed": lambda head: head[0] == 1,
    }
    for mode, check in expected.items():
        emu.bad_envelope(mode, sandbox_id=sb["sandboxID"])
        resp = open_start(emu, sb, "echo hi")
        head = resp.raw.read(40)
        resp.close()
        assert check(head), (mode, head)
        dec = EnvelopeDecoder()
        with pytest.raises(ProtocolError):  # the library's codec must refuse it
            dec.feed(head)
            list(dec)
            dec.close()
    assert run(emu, sb, "echo fine")[0] == "fine\n"


def test_fault_envd_unresponsive(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    sb = make_sandbox()
    sid = sb["sandboxID"]
    # a stream opened before the fault keeps flowing
    resp = open_start(emu, sb, "sleep 1; echo late")
    emu.envd_unresponsive(sid)
    with pytest.raises(requests.exceptions.ReadTimeout):
        health(emu, sb, timeout=1.0)
    with pytest.raises(requests.exceptions.ReadTimeout):
        run(emu, sb, "echo never", timeout=(5, 1.0))
    events, end = read_events(resp)
    assert end.ok and any("end" in e for e in events)
    # filesystem-only pause refused; full pause proceeds and marks the snapshot
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/pause", json={"memory": False})
    assert r.status_code == 503
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/pause", json={"requireHealthyGuest": True})
    assert r.status_code == 503
    assert detail(api, emu, sid)["state"] == "running"
    assert api.post(f"{emu.api_url}/sandboxes/{sid}/pause").status_code == 204
    d = detail(api, emu, sid)
    assert d["envdUnresponsiveAtPause"] is True and d["pauseMode"] == "full"
    listed = api.get(emu.api_url + "/v2/sandboxes", params={"state": "paused"}).json()
    assert [s.get("envdUnresponsiveAtPause") for s in listed if s["sandboxID"] == sid] == [True]
    r = api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect", json={"timeout": 60})
    assert r.status_code == 409
    assert r.json()["error_code"] == "sandbox_snapshot_guest_agent_unresponsive"
    r = api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect", json={"memory": False})
    assert r.status_code == 201  # cold boot: the fault is gone with the old agent
    assert health(emu, sb).status_code == 204
    assert "envdUnresponsiveAtPause" not in detail(api, emu, sid)


def test_fault_envd_unresponsive_released_by_clear(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    emu.envd_unresponsive(sb["sandboxID"])
    done = threading.Event()
    status: Dict[str, int] = {}

    def probe() -> None:
        status["code"] = health(emu, sb, timeout=20).status_code
        done.set()

    threading.Thread(target=probe, daemon=True).start()
    assert not done.wait(1.0)
    assert [f["kind"] for f in emu.faults()] == ["envd_unresponsive"]
    emu.clear_faults()
    assert done.wait(10) and status["code"] == 204


def test_faults_are_per_sandbox(emu: Emulator, api: requests.Session, make_sandbox: Make) -> None:
    # A stalled stream of sandbox A stays stalled while other sandboxes' faults go away with
    # them: B (envd_unresponsive, stream_cut) is killed, C (envd_unresponsive) is rebooted.
    a, b, c = make_sandbox(), make_sandbox(), make_sandbox()
    emu.stream_stall(sandbox_id=a["sandboxID"])
    resp = open_start(emu, a, "echo hi", timeout=(10, 60))

    def start_entry() -> Dict[str, Any]:
        entries = emu.requests(sandbox_id=a["sandboxID"], path="/process.Process/Start")
        return entries[-1] if entries else {}

    wait_until(lambda: bool(start_entry().get("stalled")), 10, "A's Start stream to stall")
    emu.envd_unresponsive(b["sandboxID"])
    emu.stream_cut(after_bytes=1, sandbox_id=b["sandboxID"])  # goes with B
    emu.envd_unresponsive(c["sandboxID"])
    assert api.delete(f"{emu.api_url}/sandboxes/{b['sandboxID']}").status_code == 204
    assert api.post(f"{emu.api_url}/sandboxes/{c['sandboxID']}/pause").status_code == 204
    r = api.post(f"{emu.api_url}/v2/sandboxes/{c['sandboxID']}/connect", json={"memory": False})
    assert r.status_code == 201
    assert health(emu, c).status_code == 204  # C's fault went with its reboot
    # (each request above ran after the server woke whatever B's and C's ends woke)
    assert not start_entry().get("cut"), start_entry()
    assert emu.faults() == []
    # a fault of A is released by A's own end: clearing the faults closes the stall
    emu.clear_faults()
    with pytest.raises(
        (requests.exceptions.ChunkedEncodingError, urllib3.exceptions.ProtocolError)
    ):
        resp.raw.read()
    resp.close()
    assert start_entry().get("cut") is True


def test_fault_admin_validation(emu: Emulator) -> None:
    with pytest.raises(EmulatorError, match="400"):
        emu.control_error("nowhere", 500)
    with pytest.raises(EmulatorError, match="400"):
        emu.bad_envelope("weird")
    with pytest.raises(EmulatorError, match="400"):
        emu.stream_cut(after_bytes=-1)
    with pytest.raises(EmulatorError, match="400"):
        emu.envd_error(302)
    assert emu.faults() == []


# -- CLI, handle and cleanup ----------------------------------------------------------------


@pytest.fixture
def short_tmp() -> Iterator[str]:
    """A short temporary directory (sandbox socket paths must stay under 108 bytes)."""
    path = tempfile.mkdtemp(prefix="e2bt-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _close(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _cli(tmp_path: Any, *args: str) -> Tuple[subprocess.Popen[bytes], Dict[str, str]]:
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "e2b_provider.emulator", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    # stdout: the export lines alone; stderr: the ready line, once they are written
    line = proc.stderr.readline().decode()
    m = re.fullmatch(
        r"e2b-emulator: ready at (http://127\.0\.0\.1:\d+) \(template base\); Ctrl-C stops it\n",
        line,
    )
    if m is None:
        proc.kill()
        err = proc.communicate()[1]
        _close(proc)
        raise AssertionError(f"bad ready line {line!r}: {err!r}")
    shell = "".join(proc.stdout.readline().decode() for _ in range(5))
    exports = dict(x.removeprefix("export ").split("=", 1) for x in shell.splitlines())
    return proc, {
        "api_url": exports["E2B_API_URL"],
        "sandbox_url": exports["E2B_SANDBOX_URL"],
        "api_key": exports["E2B_API_KEY"],
        "url": m.group(1),
        "shell": shell,
    }


_FROM_SHELL = """
from e2b_provider import DeploymentConfig, E2BSandboxProvider
with E2BSandboxProvider(DeploymentConfig.from_env()) as p:
    h = p.create("from-shell")
    print(p.exec(h, "echo hi").stdout, end="")
    p.destroy(h)
"""


def test_cli_ready_line_and_sigterm_cleanup(short_tmp: str) -> None:
    tmp_path = short_tmp
    proc, info = _cli(tmp_path)
    try:
        assert re.fullmatch(r"e2b_[0-9a-f]{40}", info["api_key"])
        assert info["api_url"] == info["sandbox_url"] == info["url"]
        assert os.listdir(tmp_path)  # the temporary state dir
        headers = {"X-API-KEY": info["api_key"]}
        pids: Dict[int, Optional[str]] = {}
        for body in ({"templateID": "base"}, {"templateID": "base", "autoPause": True}):
            r = requests.post(info["api_url"] + "/v2/sandboxes", json=body, headers=headers)
            assert r.status_code == 201
            sid = r.json()["sandboxID"]
            got = requests.get(
                f"{info['api_url']}/_emulator/sandboxes/{sid}/pids", headers=headers
            ).json()["pids"]
            assert got
            pids.update({p: proc_start_time(p) for p in got})
        requests.post(f"{info['api_url']}/sandboxes/{sid}/pause", headers=headers)
        # on stdout: what a shell needs, and it works as printed
        assert proc.stdout is not None
        shell = info["shell"]
        assert shell == (
            f"export E2B_API_KEY={info['api_key']}\n"
            f"export E2B_API_URL={info['api_url']}\n"
            f"export E2B_SANDBOX_URL={info['sandbox_url']}\n"
            f"export E2B_VOLUME_API_URL={info['api_url']}\n"
            "export E2B_TEMPLATE=base\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        done = subprocess.run(
            ["sh", "-c", shell + 'exec "$0" -c "$1"', sys.executable, _FROM_SHELL],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.stdout == "hi\n", done.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read() == b""  # nothing else on stdout
        assert alive(pids) == []
        assert os.listdir(tmp_path) == []  # temporary state dir removed
    finally:
        _close(proc)


def test_cli_api_key_from_env_and_sigint(short_tmp: str, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "e2b_" + "ab" * 20
    monkeypatch.setenv("E2B_EMULATOR_API_KEY", key)
    state = os.path.join(short_tmp, "state")
    proc, info = _cli(short_tmp, "--state-dir", state)
    try:
        assert info["api_key"] == key
        r = requests.get(info["api_url"] + "/v2/sandboxes", headers={"X-API-KEY": key})
        assert r.status_code == 200 and r.json() == []
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert os.path.isdir(state)  # a given state dir is kept
    finally:
        _close(proc)


def test_emulator_death_leaves_no_sandbox_process() -> None:
    with Emulator(api_key="e2b_" + "cd" * 20) as emu:
        assert emu.api_key == "e2b_" + "cd" * 20
        assert emu.sdk_env()["E2B_API_URL"] == emu.api_url
        headers = {"X-API-KEY": emu.api_key}
        pids: Dict[int, Optional[str]] = {}
        for _ in range(2):
            r = requests.post(
                emu.api_url + "/v2/sandboxes", json={"templateID": "base"}, headers=headers
            )
            assert r.status_code == 201
            sid = r.json()["sandboxID"]
            pids.update({p: proc_start_time(p) for p in emu.sandbox_pids(sid)})
        assert len(emu.list_sandboxes()) == 2
        assert pids and not [p for p in pids if pids[p] is None]
        emu.kill()  # SIGKILL: the emulator cannot clean up
        wait_until(lambda: not alive(pids), 10, "sandbox processes to die with the emulator")
    assert not emu.running


def _emulator_children() -> List[int]:
    me = str(os.getpid())
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                ppid = fh.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if ppid == me and b"e2b_provider.emulator" in cmdline:
            found.append(int(name))
    return found


def test_handle_never_leaves_the_subprocess_behind() -> None:
    before = set(_emulator_children())
    emu = Emulator(startup_timeout=0.05)
    with pytest.raises(EmulatorError, match="did not become ready"):
        emu.start()
    assert not emu.running and emu.pid is None
    assert set(_emulator_children()) <= before


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
def test_isolation_unavailable_exits_2_and_handle_raises(
    short_tmp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a real environment without CAP_SYS_ADMIN: the CLI's pre-check must refuse to start
    drop = ["setpriv", "--bounding-set=-sys_admin", "--"]
    done = subprocess.run(
        [*drop, sys.executable, "-m", "e2b_provider.emulator", "--port", "0"],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == b""
    assert b"CAP_SYS_ADMIN" in done.stderr and done.stderr.count(b"\n") == 1
    wrapper = os.path.join(short_tmp, "python-without-sys-admin")
    with open(wrapper, "w") as fh:
        fh.write(f'#!/bin/sh\nexec {" ".join(drop)} {sys.executable} "$@"\n')
    os.chmod(wrapper, 0o755)
    monkeypatch.setattr(sys, "executable", wrapper)
    with pytest.raises(EmulatorUnavailable, match="CAP_SYS_ADMIN"):
        Emulator(startup_timeout=60).start()


_CHILD = """
import signal, sys, time
# Ctrl-C works as in a terminal even when this test run was started with SIGINT ignored
# (a background job of a non-interactive shell).
signal.signal(signal.SIGINT, signal.default_int_handler)
from e2b_provider.emulator import Emulator
with Emulator() as emu:
    print(emu.pid, emu.state_dir, flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_handle_owner_death_stops_the_emulator(how: str) -> None:
    # SIGINT: KeyboardInterrupt inside the with-block stops it; SIGKILL: the emulator notices
    # its parent is gone and shuts down by itself.
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        pid_text, state_dir = child.stdout.readline().decode().split()
        emu_pid = int(pid_text)
        assert os.path.isdir(state_dir)
        started = proc_start_time(emu_pid)
        assert started is not None
        child.send_signal(getattr(signal, how))
        child.wait(timeout=60)
        wait_until(lambda: proc_start_time(emu_pid) != started, 30, "the emulator to exit")
        assert not os.path.exists(state_dir)  # removed by the handle or by the emulator
    finally:
        _close(child)


_IDLE_CHILD = """
import json, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from e2b_provider import E2BSandboxProvider
from e2b_provider.emulator import Emulator
emu = Emulator().start()
p = E2BSandboxProvider(emu.config(template="base"))
h = p.create("idle-interrupt")
info = {"emulator": emu.pid, "state_dir": emu.state_dir, "sandbox": emu.sandbox_pids(h.id)}
print(json.dumps(info), flush=True)
try:
    print("idle", flush=True)
    time.sleep(120)
except KeyboardInterrupt:
    print("interrupted", flush=True)
print(json.dumps({"after": p.exec(h, "echo alive", timeout=60.0).stdout}), flush=True)
p.close()
# exits without stopping the emulator: it must go with this process
"""


def _line(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None and child.stderr is not None
    line = child.stdout.readline()
    if not line:
        child.wait(timeout=60)
        raise AssertionError(f"the child ended early ({child.returncode}): {child.stderr.read()}")
    return line.rstrip("\n")


def test_emulator_survives_an_interrupt_of_its_starters_group() -> None:
    # A script or notebook kernel that started Emulator() gets SIGINT to its whole process
    # group (a terminal's Ctrl-C, a kernel interrupt) while idle: it sees KeyboardInterrupt,
    # the emulator keeps serving, and still goes (with its sandbox) when the starter exits.
    child = subprocess.Popen(
        [sys.executable, "-c", _IDLE_CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a terminal's foreground job has
    )
    try:
        info = json.loads(_line(child))
        started = {p: proc_start_time(p) for p in [info["emulator"], *info["sandbox"]]}
        assert len(started) >= 2 and None not in started.values(), started
        assert _line(child) == "idle"
        os.killpg(child.pid, signal.SIGINT)
        assert _line(child) == "interrupted"
        assert json.loads(_line(child)) == {"after": "alive\n"}
        assert child.wait(timeout=60) == 0
        wait_until(lambda: not alive(started), 30, "the emulator and its sandbox to exit")
        wait_until(lambda: not os.path.exists(info["state_dir"]), 30, "the state dir removal")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        _close(child)  # type: ignore[arg-type]
