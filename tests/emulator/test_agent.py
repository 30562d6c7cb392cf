"""Tests of the emulator's envd look-alike agent, run directly on this host as root.

One agent subprocess (``python -m e2b_provider.emulator.agent``) serves a temporary unix
socket for the whole module; the tests talk to it with ``http.client`` over that socket and
check what envd 0.6.13 does: Connect streams and proto3 shapes, users, env and cwd, stdin,
keepalives, ``Connect-Timeout-Ms``, detaching, signals, ``List``/``Connect``, ``/files``,
the filesystem RPCs, backpressure and concurrency. Only host users ``root`` and ``nobody``
are used. Every process a test starts is ended by the test (or, at worst, by the agent's
shutdown); the last test checks that the agent has no child left.
"""

from __future__ import annotations

import base64
import concurrent.futures
import grp
import gzip
import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, Optional, Tuple

import pytest

from e2b_provider.emulator.agent.filesystem import go_mode_string, rfc3339
from e2b_provider.emulator.agent.process_exit import exit_info_from_status
from e2b_provider.emulator.agent.process_spawn import DEFAULT_PATH
from e2b_provider.emulator.agent.rpc import basic_username
from e2b_provider.protocol.connect import EndStream, EnvelopeDecoder, Message

from .agent_client import (
    ROOT_ON_LINUX,
    Agent,
    Stream,
    UnixConnection,
    agent_children,
    agent_fixture,
    b64,
    basic,
    list_pids,
    multipart,
    output,
    read_text,
    request,
    rss_kib,
    run_stream,
    signal_pid,
    start,
    unary,
    wait_until,
    workdir_fixture,
)

pytestmark = ROOT_ON_LINUX

NOBODY = pwd.getpwnam("nobody")


# ---- fixture --------------------------------------------------------------------------


agent = agent_fixture()
workdir = workdir_fixture()


# ---- pure helpers ---------------------------------------------------------------------


def test_exit_status_texts_follow_go() -> None:
    assert exit_info_from_status(0).end_event() == {
        "end": {"exited": True, "status": "exit status 0"}
    }
    assert exit_info_from_status(3 << 8).end_event() == {
        "end": {"exitCode": 3, "exited": True, "status": "exit status 3", "error": "exit status 3"}
    }
    assert exit_info_from_status(9).end_event()["end"] == {
        "exitCode": -1,
        "status": "signal: killed",
        "error": "signal: killed",
    }
    assert exit_info_from_status(6 | 0x80).status == "signal: aborted (core dumped)"
    assert exit_info_from_status(2).status == "signal: interrupt"
    assert exit_info_from_status(34).status == "signal: signal 34"


def test_mode_time_and_header_helpers() -> None:
    assert go_mode_string(stat.S_IFREG | 0o644) == "-rw-r--r--"
    assert go_mode_string(stat.S_IFDIR | stat.S_ISVTX | 0o777) == "dtrwxrwxrwx"
    assert go_mode_string(stat.S_IFLNK | 0o777) == "Lrwxrwxrwx"
    assert go_mode_string(stat.S_IFCHR | 0o666) == "Dcrw-rw-rw-"
    assert go_mode_string(stat.S_IFREG | stat.S_ISUID | 0o755) == "urwxr-xr-x"
    assert rfc3339(0) == "1970-01-01T00:00:00Z"
    assert rfc3339(1_500_000_000_123_000_000) == "2017-07-14T02:40:00.123Z"
    assert rfc3339(1_500_000_000_000_000_001) == "2017-07-14T02:40:00.000000001Z"
    assert basic_username(basic("nobody")) == "nobody"
    assert basic_username("Bearer xyz") is None


# ---- process.Process/Start ------------------------------------------------------------


def test_health(agent: Agent) -> None:
    status, _, body = request(agent.sock, "GET", "/health")
    assert (status, body) == (204, b"")


def test_start_exit_zero_proto3_shapes(agent: Agent) -> None:
    events, end, resp = run_stream(
        agent.sock,
        "Start",
        {"process": {"cmd": "sh", "args": ["-c", "printf out; printf err >&2"]}, "stdin": False},
        chunked=True,
    )
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "application/connect+json"
    assert end.ok and end.metadata == {}
    assert set(events[0]) == {"start"} and isinstance(events[0]["start"]["pid"], int)
    assert output(events) == b"out" and output(events, "stderr") == b"err"
    assert events[-1] == {"end": {"exited": True, "status": "exit status 0"}}
    assert all(set(e) == {"data"} for e in events[1:-1])


def test_start_nonzero_exit_and_signal_death(agent: Agent) -> None:
    events, end = start(agent.sock, "sh", "-c", "exit 3")
    assert end.ok
    assert events[-1] == {
        "end": {"exitCode": 3, "exited": True, "status": "exit status 3", "error": "exit status 3"}
    }
    events, end = start(agent.sock, "sh", "-c", "kill -TERM $$")
    assert events[-1] == {
        "end": {"exitCode": -1, "status": "signal: terminated", "error": "signal: terminated"}
    }
    events, _ = start(agent.sock, "/definitely/not/here")
    assert events[-1]["end"]["exitCode"] == 127
    assert b"not" in output(events, "stderr")


def test_launch_like_envd(agent: Agent) -> None:
    script = (
        "import os\n"
        "print(os.getpid(), os.getpgid(0), os.getsid(0), os.nice(0),"
        " open('/proc/self/oom_score_adj').read().strip())"
    )
    events, end = start(agent.sock, sys.executable, "-c", script)
    assert end.ok, end
    pid, pgid, sid, nice, oom = output(events).split()
    assert int(pid) == events[0]["start"]["pid"]  # exec chain: the pid is the program's
    assert int(pgid) == os.getpgid(agent.pid) and int(sid) == os.getsid(agent.pid)
    assert (nice, oom) == (b"0", b"100")
    if shutil.which("ionice"):  # envd: "ionice -c 2 -n 4" when it is on PATH
        events, end = start(agent.sock, "sh", "-c", "ionice -p $$")
        assert end.ok and output(events).strip() == b"best-effort: prio 4", output(events)


def test_env_cwd_and_user(agent: Agent) -> None:
    script = 'id -u; id -g; id -G; pwd; echo "$HOME|$USER|$LOGNAME|$PATH|$FOO|$E2B_SANDBOX"; env'
    events, end = start(
        agent.sock,
        "sh",
        "-c",
        script,
        cwd="/tmp",
        envs={"FOO": "bar", "LOGNAME": "over"},
        headers={"Authorization": basic("nobody")},
    )
    assert end.ok, end
    lines = output(events).decode().splitlines()
    uid, gid = str(NOBODY.pw_uid), str(NOBODY.pw_gid)
    assert lines[:4] == [uid, gid, gid, "/tmp"]
    assert lines[4] == f"{NOBODY.pw_dir}|nobody|over|{DEFAULT_PATH}|bar|true"
    names = {line.split("=", 1)[0] for line in lines[5:]}
    assert names <= {"PATH", "HOME", "USER", "LOGNAME", "FOO", "E2B_SANDBOX", "PWD"}, names
    # default user (root, from --default-user) and default cwd = home; "~/" expands there too
    events, _ = start(agent.sock, "sh", "-c", "id -un; pwd")
    assert output(events) == b"root\n/root\n"
    events, _ = start(agent.sock, "pwd", cwd="~/")
    assert output(events) == b"/root\n"


def test_start_errors_arrive_in_the_end_stream_frame(agent: Agent) -> None:
    events, end = start(agent.sock, "true", headers={"Authorization": basic("nobody")})
    assert events == []
    assert end.error_code == "invalid_argument"
    assert end.error_message == f"cwd '{NOBODY.pw_dir}' does not exist"
    events, end, resp = run_stream(
        agent.sock,
        "Start",
        {"process": {"cmd": "true"}},
        headers={"Authorization": basic("no-such-user-xyz")},
    )
    assert resp.status == 200 and events == []
    assert (end.error_code, end.error_message) == (
        "unauthenticated",
        "invalid username: 'no-such-user-xyz'",
    )
    _, end = start(agent.sock, "true", headers={"Connect-Timeout-Ms": "soon"})
    assert end.error_code == "invalid_argument"
    status, _, _ = request(
        agent.sock, "POST", "/process.Process/Start", b"{}", {"Content-Type": "text/plain"}
    )
    assert status == 415
    # an un-enveloped application/json body is accepted too (robustness)
    status, headers, raw = request(
        agent.sock,
        "POST",
        "/process.Process/Start",
        json.dumps({"process": {"cmd": "echo", "args": ["plain"]}, "stdin": False}).encode(),
        {"Content-Type": "application/json"},
    )
    decoder = EnvelopeDecoder()
    decoder.feed(raw)
    items = list(decoder)
    assert status == 200 and headers["content-type"] == "application/connect+json"
    assert isinstance(items[-1], EndStream) and items[-1].ok
    assert output([i.data["event"] for i in items if isinstance(i, Message)]) == b"plain\n"


def test_cwd_is_entered_with_the_users_rights(agent: Agent, tmp_path: Any) -> None:
    """handler.go sets cmd.SysProcAttr.Credential and cmd.Dir; Go's child switches uid/gids
    before its chdir, and os.StartProcess (SysProcAttr set) reports any child failure as
    ``fork/exec /bin/sh: <errno>``, wrapped by Start (or by pty.StartWithSize)."""
    assert stat.S_IMODE(os.stat("/root").st_mode) & 0o001 == 0  # no search right for nobody
    nobody = {"Authorization": basic("nobody")}
    events, end = start(agent.sock, "pwd", cwd="/root", headers=nobody)
    assert events == []
    assert (end.error_code, end.error_message) == (
        "invalid_argument",
        "error starting process 'pwd': fork/exec /bin/sh: permission denied",
    )
    events, end = start(
        agent.sock, "pwd", "-P", cwd="/root", headers=nobody, pty={"size": {"cols": 80, "rows": 24}}
    )
    assert events == []
    assert (end.error_code, end.error_message) == (
        "invalid_argument",
        "error starting pty with command 'pwd -P' in dir '/root' with '80' cols and '24' rows: "
        "fork/exec /bin/sh: permission denied",
    )
    # root enters it; a file as cwd exists (envd's os.Stat passes) and fails in the child
    events, end = start(agent.sock, "pwd", cwd="/root")
    assert end.ok and output(events) == b"/root\n"
    afile = str(tmp_path / "a-file")
    with open(afile, "wb"):
        pass
    for headers in ({}, nobody):
        _, end = start(agent.sock, "pwd", cwd=afile, headers=headers)
        assert (end.error_code, end.error_message) == (
            "invalid_argument",
            "error starting process 'pwd': fork/exec /bin/sh: "
            + ("not a directory" if not headers else "permission denied"),
        )


def test_stdin_pipe_when_absent_devnull_when_false(agent: Agent) -> None:
    events, end = start(agent.sock, "cat")  # stdin false: /dev/null, exits at once
    assert output(events) == b"" and events[-1]["end"]["exited"] is True
    st = Stream(agent.sock, "Start", {"process": {"cmd": "cat"}})  # stdin absent: a pipe
    try:
        pid = st.next_event()["start"]["pid"]  # type: ignore[index]
        status, body = unary(
            agent.sock,
            "/process.Process/SendInput",
            {"process": {"pid": pid}, "input": {"stdin": b64(b"hello\n")}},
        )
        assert (status, body) == (200, {})
        assert st.next_event() == {"data": {"stdout": b64(b"hello\n")}}
        assert unary(agent.sock, "/process.Process/CloseStdin", {"process": {"pid": pid}}) == (
            200,
            {},
        )
        events, end = st.collect()
        assert end.ok and events == [{"end": {"exited": True, "status": "exit status 0"}}]
    finally:
        st.close()
    st = Stream(agent.sock, "Start", {"process": {"cmd": "sleep", "args": ["30"]}, "stdin": False})
    try:
        pid = st.next_event()["start"]["pid"]  # type: ignore[index]
        status, body = unary(
            agent.sock,
            "/process.Process/SendInput",
            {"process": {"pid": pid}, "input": {"stdin": b64(b"x")}},
        )
        assert (status, body) == (
            500,
            {"code": "internal", "message": "error writing to stdin: stdin not enabled or closed"},
        )
        assert signal_pid(agent.sock, pid) == (200, {})
        assert st.collect()[0][-1]["end"]["status"] == "signal: killed"
    finally:
        st.close()


def test_keepalive_follows_the_header(agent: Agent) -> None:
    # pings at 2 and 4 s of a 5 s run, each a second away from the run's end: only lower
    # bounds on their times (late is load, early is a wrong interval); the count bounds them
    t0 = time.monotonic()
    st = Stream(
        agent.sock,
        "Start",
        {"process": {"cmd": "sleep", "args": ["5"]}, "stdin": False},
        {"Keepalive-Ping-Interval": "2"},
    )
    try:
        times = []
        while True:
            ev = st.next_event()
            if ev is None:
                break
            if "keepalive" in ev:
                assert ev == {"keepalive": {}}
                times.append(time.monotonic() - t0)
    finally:
        st.close()
    assert len(times) == 2, times
    assert times[0] > 1.9 and times[1] - times[0] > 1.5, times
    events, _ = start(agent.sock, "sleep", "0.3")  # default interval is 90 s
    assert not any("keepalive" in e for e in events)


def test_connect_timeout_kills_the_process(agent: Agent) -> None:
    t0 = time.monotonic()
    events, end = start(agent.sock, "sleep", "30", headers={"Connect-Timeout-Ms": "600"})
    elapsed = time.monotonic() - t0
    assert end.error_code == "deadline_exceeded" and 0.5 < elapsed < 5, (end, elapsed)
    pid = events[0]["start"]["pid"]
    wait_until(lambda: pid not in list_pids(agent.sock), what="timed-out process to go")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # its exit stays available to Connect for a while
    events, end, _ = run_stream(agent.sock, "Connect", {"process": {"pid": pid}})
    assert end.ok
    assert events == [
        {"start": {"pid": pid}},
        {"end": {"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}},
    ]


def test_disconnect_keeps_the_process_and_drops_output(agent: Agent) -> None:
    st = Stream(agent.sock, "Start", {"process": {"cmd": "yes"}, "stdin": False})
    pid = st.next_event()["start"]["pid"]  # type: ignore[index]
    st.close()
    try:
        time.sleep(0.3)  # a window in which `yes` writes with nobody reading the stream
        t0 = time.monotonic()
        assert request(agent.sock, "GET", "/health")[0] == 204
        # unread output does not starve the agent (a starved one: the client's 20 s timeout)
        assert time.monotonic() - t0 < 5.0
        assert pid in list_pids(agent.sock)
        os.kill(pid, 0)
        st2 = Stream(agent.sock, "Connect", {"process": {"pid": pid}})
        try:
            assert st2.next_event() == {"start": {"pid": pid}}
            assert output([st2.next_event()]).startswith(b"y\n")  # type: ignore[list-item]
        finally:
            st2.close()
    finally:
        assert signal_pid(agent.sock, pid) == (200, {})
    wait_until(lambda: pid not in list_pids(agent.sock), what="killed process to go")
    assert signal_pid(agent.sock, pid) == (
        404,
        {"code": "not_found", "message": f"process with pid {pid} not found"},
    )


def test_send_signal_errors_and_tags(agent: Agent) -> None:
    assert signal_pid(agent.sock, 999_999) == (
        404,
        {"code": "not_found", "message": "process with pid 999999 not found"},
    )
    status, body = unary(
        agent.sock,
        "/process.Process/SendSignal",
        {"process": {"tag": "nope"}, "signal": "SIGNAL_SIGKILL"},
    )
    assert (status, body["code"]) == (404, "not_found")
    st = Stream(
        agent.sock,
        "Start",
        {"process": {"cmd": "sleep", "args": ["30"]}, "tag": "t-sig", "stdin": False},
    )
    try:
        pid = st.next_event()["start"]["pid"]  # type: ignore[index]
        status, body = unary(
            agent.sock,
            "/process.Process/SendSignal",
            {"process": {"pid": pid}, "signal": "SIGNAL_SIGHUP"},
        )
        assert (status, body["code"]) == (501, "unimplemented")
        assert unary(
            agent.sock,
            "/process.Process/SendSignal",
            {"process": {"tag": "t-sig"}, "signal": "SIGNAL_SIGTERM"},
        ) == (200, {})
        events, end = st.collect()
        assert end.ok and events[-1]["end"]["status"] == "signal: terminated"
    finally:
        st.close()


def test_send_signal_to_a_pid_not_managed_is_not_found_whatever_the_signal(agent: Agent) -> None:
    """signal.go: getProcess (the live handlers only) comes before the signal switch, so a pid
    envd did not start, or whose process ended (its exit is only kept for Connect), is
    ``not_found`` for every signal value, and nothing is signalled."""
    outsider = subprocess.Popen(["sleep", "60"])
    try:
        events, end = start(agent.sock, "true")
        assert end.ok, end
        finished = events[0]["start"]["pid"]
        signals = (
            "SIGNAL_SIGKILL",
            "SIGNAL_SIGTERM",
            "SIGNAL_SIGHUP",
            "SIGNAL_UNSPECIFIED",
            "NO_SUCH_SIGNAL",
            None,
            0,
            1,
            9,
            15,
            99,
        )
        for pid in (outsider.pid, finished, 999_999):
            for sig in signals:
                body: Dict[str, Any] = {"process": {"pid": pid}}
                if sig is not None:
                    body["signal"] = sig
                assert unary(agent.sock, "/process.Process/SendSignal", body) == (
                    404,
                    {"code": "not_found", "message": f"process with pid {pid} not found"},
                ), (pid, sig)
        for sig in signals:
            body = {"process": {"tag": "no-such-tag"}, "signal": sig}
            assert unary(agent.sock, "/process.Process/SendSignal", body) == (
                404,
                {"code": "not_found", "message": "process with tag no-such-tag not found"},
            ), sig
        assert outsider.poll() is None
    finally:
        outsider.kill()
        outsider.wait()


def test_list_and_connect(agent: Agent) -> None:
    a = Stream(
        agent.sock,
        "Start",
        {
            "process": {
                "cmd": "sh",
                "args": ["-c", "read x; echo got $x"],
                "envs": {"K": "v"},
                "cwd": "/tmp",
            },
            "tag": "t-a",
        },
    )
    b = Stream(agent.sock, "Start", {"process": {"cmd": "sleep", "args": ["30"]}, "stdin": False})
    try:
        pid_a = a.next_event()["start"]["pid"]  # type: ignore[index]
        pid_b = b.next_event()["start"]["pid"]  # type: ignore[index]
        _, body = unary(agent.sock, "/process.Process/List", {})
        infos = {p["pid"]: p for p in body["processes"]}
        assert infos[pid_a] == {
            "pid": pid_a,
            "tag": "t-a",
            "config": {
                "cmd": "sh",
                "args": ["-c", "read x; echo got $x"],
                "envs": {"K": "v"},
                "cwd": "/tmp",
            },
        }
        assert infos[pid_b] == {"pid": pid_b, "config": {"cmd": "sleep", "args": ["30"]}}
        c = Stream(agent.sock, "Connect", {"process": {"tag": "t-a"}})
        d = Stream(agent.sock, "Connect", {"process": {"pid": pid_a}}, chunked=True)
        try:
            assert c.next_event() == {"start": {"pid": pid_a}}
            assert d.next_event() == {"start": {"pid": pid_a}}
            unary(
                agent.sock,
                "/process.Process/SendInput",
                {"process": {"pid": pid_a}, "input": {"stdin": b64(b"abc\n")}},
            )
            for s in (a, c, d):
                events, end = s.collect()
                assert end.ok and output(events) == b"got abc\n"
                assert events[-1]["end"]["status"] == "exit status 0"
        finally:
            c.close()
            d.close()
        assert signal_pid(agent.sock, pid_b) == (200, {})
        assert b.collect()[0][-1]["end"]["status"] == "signal: killed"
    finally:
        a.close()
        b.close()
    _, end, _ = run_stream(agent.sock, "Connect", {"process": {"pid": 999_999}})
    assert (end.error_code, end.error_message) == ("not_found", "process with pid 999999 not found")


def test_init_sets_default_env(agent: Agent) -> None:
    status, _, _ = request(
        agent.sock,
        "POST",
        "/init",
        json.dumps({"envVars": {"FROM_INIT": "1"}}).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 204
    events, _ = start(agent.sock, "sh", "-c", 'echo "$FROM_INIT"')
    assert output(events) == b"1\n"


def test_pty(agent: Agent) -> None:
    st = Stream(
        agent.sock,
        "Start",
        {
            "process": {"cmd": "sh", "args": ["-c", "stty size; read x; echo got:$x"]},
            "pty": {"size": {"cols": 80, "rows": 24}},
        },
    )
    try:
        pid = st.next_event()["start"]["pid"]  # type: ignore[index]
        seen = b""
        while b"24 80" not in seen:
            ev = st.next_event()
            assert ev is not None and "pty" in ev["data"]
            seen += base64.b64decode(ev["data"]["pty"])
        unary(
            agent.sock,
            "/process.Process/SendInput",
            {"process": {"pid": pid}, "input": {"pty": b64(b"hi\n")}},
        )
        events, end = st.collect()
        assert end.ok and b"got:hi" in output(events, "pty")
        assert events[-1]["end"]["exited"] is True
    finally:
        st.close()


PTY = {"size": {"cols": 80, "rows": 24}}


def _pty_until(st: Stream, want: bytes) -> bytes:
    seen = b""
    while want not in seen:
        ev = st.next_event()
        assert ev is not None, seen
        seen += base64.b64decode(ev.get("data", {}).get("pty", ""))
    return seen


def test_pty_slave_stays_the_agents_and_term_is_not_added(agent: Agent) -> None:
    """creack/pty's open() never chowns the slave: /dev/pts/N stays owned by envd (root),
    also for a command of another user; envd adds no TERM (nor LANG) to the environment:
    only the request's ``envs`` give one."""
    nobody = {"Authorization": basic("nobody")}
    script = 'echo "u=$(id -u) owner=$(stat -c %u "$(tty)") term=${TERM-unset} lang=${LANG-unset}"'
    for envs, term in (({}, "unset"), ({"TERM": "xterm-256color"}, "xterm-256color")):
        events, end = start(agent.sock, "sh", "-c", script, headers=nobody, pty=PTY, envs=envs,
                            cwd="/")
        assert end.ok, end
        text = output(events, "pty").decode()
        uid = pwd.getpwnam("nobody").pw_uid
        assert f"u={uid} owner=0 term={term} lang=unset" in text, text


def test_pty_is_the_controlling_terminal_of_a_new_session(agent: Agent) -> None:
    """setsid + TIOCSCTTY: the command leads its own session, the pty is its /dev/tty and
    its foreground process group's; the size is set before the exec."""
    script = ('echo "sid=$(ps -o sid= -p $$ | tr -d \' \') pid=$$"; '
              'stty size < /dev/tty; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-tty')
    events, end = start(agent.sock, "sh", "-c", script, pty={"size": {"cols": 132, "rows": 50}})
    assert end.ok, end
    text = output(events, "pty").decode()
    pid = re.search(r"pid=(\d+)", text)
    assert pid is not None and f"sid={pid.group(1)} " in text, text
    assert "50 132" in text and "all-tty" in text, text


def test_pty_input_kinds_close_stdin_and_update_errors(agent: Agent) -> None:
    """envd's texts: stdin bytes to a PTY process, pty bytes to a pipe process, CloseStdin
    of a PTY process (send Ctrl-D instead), Update of a process without a PTY; a Ctrl-D
    typed into the PTY ends ``cat``."""
    st = Stream(agent.sock, "Start", {"process": {"cmd": "cat"}, "pty": PTY})
    plain = Stream(agent.sock, "Start", {"process": {"cmd": "sleep", "args": ["30"]},
                                         "stdin": True})
    try:
        pid = st.next_event()["start"]["pid"]  # type: ignore[index]
        plain_pid = plain.next_event()["start"]["pid"]  # type: ignore[index]
        send = "/process.Process/SendInput"
        assert unary(agent.sock, send, {"process": {"pid": pid}, "input": {"stdin": b64(b"x")}}
                     ) == (500, {"code": "internal", "message": (
                         "error writing to stdin: tty assigned to process — input should be "
                         "written to the pty, not the stdin")})
        assert unary(agent.sock, send, {"process": {"pid": plain_pid},
                                        "input": {"pty": b64(b"x")}}) == (500, {
                     "code": "internal", "message": (
                         "error writing to tty: tty not assigned to process — input should be "
                         "written to the stdin, not the tty")})
        assert unary(agent.sock, "/process.Process/CloseStdin", {"process": {"pid": pid}}) == (
            500, {"code": "unknown", "message": (
                "error closing stdin: cannot close stdin for PTY process — send Ctrl+D (0x04) "
                "instead")})
        assert unary(agent.sock, "/process.Process/Update", {
            "process": {"pid": plain_pid}, "pty": {"size": {"cols": 10, "rows": 10}},
        }) == (500, {"code": "internal",
                     "message": "error resizing tty: tty not assigned to process"})
        # without a pty field Update is a no-op, for any process
        assert unary(agent.sock, "/process.Process/Update", {"process": {"pid": plain_pid}}
                     ) == (200, {})
        assert unary(agent.sock, send, {"process": {"pid": pid}, "input": {"pty": b64(b"hi\r")}}
                     ) == (200, {})
        _pty_until(st, b"hi\r\nhi\r\n")  # the echo, then cat's copy
        assert unary(agent.sock, send, {"process": {"pid": pid}, "input": {"pty": b64(b"\x04")}}
                     ) == (200, {})
        events, end = st.collect()
        assert end.ok and events[-1]["end"]["exited"] is True
    finally:
        signal_pid(agent.sock, plain_pid)
        plain.collect()
        plain.close()
        st.close()


def test_pty_ctrl_c_reaches_the_foreground_program(agent: Agent) -> None:
    """A 0x03 typed into the PTY is the terminal's SIGINT for its foreground process group
    (the line discipline's ISIG, as on a real terminal)."""
    st = Stream(agent.sock, "Start", {
        "process": {"cmd": "sh", "args": ["-c", "trap 'echo got-INT; exit 7' INT; echo ready; "
                                                "while :; do sleep 0.1; done"]},
        "pty": PTY,
    })
    try:
        pid = st.next_event()["start"]["pid"]  # type: ignore[index]
        _pty_until(st, b"ready")
        unary(agent.sock, "/process.Process/SendInput",
              {"process": {"pid": pid}, "input": {"pty": b64(b"\x03")}})
        events, end = st.collect()
        assert end.ok and b"got-INT" in output(events, "pty")
        assert events[-1]["end"]["status"] == "exit status 7"
    finally:
        st.close()


# ---- robustness -----------------------------------------------------------------------


def test_concurrent_streams(agent: Agent) -> None:
    def one(i: int) -> bytes:
        events, end = start(agent.sock, "sh", "-c", "sleep 0.2; echo $0", str(i))
        assert end.ok and events[-1]["end"]["status"] == "exit status 0"
        return output(events)

    with concurrent.futures.ThreadPoolExecutor(100) as pool:
        results = list(pool.map(one, range(100)))
    assert results == [f"{i}\n".encode() for i in range(100)]


def test_large_output_is_streamed_with_backpressure(agent: Agent) -> None:
    total = 50_000_000
    before = rss_kib(agent.pid)
    cmd = {"cmd": "head", "args": ["-c", str(total), "/dev/zero"]}
    st = Stream(agent.sock, "Start", {"process": cmd, "stdin": False})
    try:
        time.sleep(1.0)  # do not read: the agent must stop reading the process's pipe
        assert rss_kib(agent.pid) - before < 20_000
        received, biggest = 0, 0
        while True:
            ev = st.next_event()
            if ev is None:
                break
            if "data" in ev:
                n = len(base64.b64decode(ev["data"]["stdout"]))
                received += n
                biggest = max(biggest, n)
        assert st.end is not None and st.end.ok
        assert received == total and biggest <= 32 * 1024
    finally:
        st.close()


# ---- /files ---------------------------------------------------------------------------


def test_multipart_upload_creates_parents_owned_by_the_user(agent: Agent, workdir: str) -> None:
    body, ctype = multipart(
        [
            ("file", f"{workdir}/new/sub/a.txt", b"alpha"),
            ("other", "ignored.txt", b"zzz"),
            ("file", f"{workdir}/b.txt", b"beta"),
        ]
    )
    status, headers, raw = request(
        agent.sock, "POST", "/files?username=nobody", body, {"Content-Type": ctype}
    )
    # envd writes the JSON without a Content-Type: Go's server sniffs text/plain
    assert status == 200 and headers["content-type"] == "text/plain; charset=utf-8"
    assert json.loads(raw) == [
        {"name": "a.txt", "type": "file", "path": f"{workdir}/new/sub/a.txt"},
        {"name": "b.txt", "type": "file", "path": f"{workdir}/b.txt"},
    ]
    assert not os.path.exists(f"{workdir}/ignored.txt")
    for path, mode in (
        (f"{workdir}/new", 0o755),
        (f"{workdir}/new/sub", 0o755),
        (f"{workdir}/new/sub/a.txt", 0o644),
        (f"{workdir}/b.txt", 0o644),
    ):
        st = os.stat(path)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (
            NOBODY.pw_uid,
            NOBODY.pw_gid,
            mode,
        ), path
    assert os.stat(workdir).st_uid == 0  # existing parents are left alone
    with open(f"{workdir}/new/sub/a.txt", "rb") as fh:
        assert fh.read() == b"alpha"
    # same path twice in one request
    body, ctype = multipart([("file", "x", b"1"), ("file", "y", b"2")])
    status, _, raw = request(
        agent.sock, "POST", f"/files?path={workdir}/same", body, {"Content-Type": ctype}
    )
    assert status == 400 and json.loads(raw)["code"] == 400


def test_octet_stream_upload_relative_path_and_overwrite(agent: Agent, workdir: str) -> None:
    rel = f".e2b-agent-test-{uuid.uuid4().hex}"
    try:
        status, _, raw = request(
            agent.sock,
            "POST",
            f"/files?path={rel}/x.bin",
            b"raw!",
            {"Content-Type": "application/octet-stream"},
        )
        assert status == 200
        assert json.loads(raw) == [{"name": "x.bin", "type": "file", "path": f"/root/{rel}/x.bin"}]
        with open(f"/root/{rel}/x.bin", "rb") as fh:
            assert fh.read() == b"raw!"
    finally:
        shutil.rmtree(f"/root/{rel}", ignore_errors=True)
    target = f"{workdir}/keep.txt"
    with open(target, "w") as fh:
        fh.write("old content that is longer")
    os.chmod(target, 0o600)
    status, _, _ = request(
        agent.sock,
        "POST",
        f"/files?path={target}&username=nobody",
        b"new",
        {"Content-Type": "application/octet-stream"},
    )
    assert status == 200
    st = os.stat(target)
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, NOBODY.pw_uid)
    with open(target, "rb") as fh:
        assert fh.read() == b"new"
    status, _, raw = request(
        agent.sock, "POST", "/files", b"x", {"Content-Type": "application/octet-stream"}
    )
    assert status == 400
    status, _, raw = request(
        agent.sock,
        "POST",
        f"/files?path={workdir}",
        b"x",
        {"Content-Type": "application/octet-stream"},
    )
    assert (status, json.loads(raw)["message"]) == (400, f"path is a directory: {workdir}")
    status, _, raw = request(
        agent.sock, "POST", f"/files?path={target}", b"x", {"Content-Type": "text/plain"}
    )
    assert status == 400
    status, _, raw = request(
        agent.sock,
        "POST",
        f"/files?path={target}&username=nosuchuserxyz",
        b"x",
        {"Content-Type": "application/octet-stream"},
    )
    assert (status, json.loads(raw)["code"]) == (401, 401)


def test_large_upload_and_download_stream(agent: Agent, workdir: str) -> None:
    size = 20 * 1024 * 1024
    block = hashlib.sha256(b"seed").digest() * 2048  # 64 KiB
    expected = hashlib.sha256(block * (size // len(block))).hexdigest()
    before = rss_kib(agent.pid)
    path = f"{workdir}/big.bin"
    status, _, _ = request(
        agent.sock,
        "POST",
        f"/files?path={path}",
        (block for _ in range(size // len(block))),
        {"Content-Type": "application/octet-stream"},
    )
    assert status == 200 and os.path.getsize(path) == size
    conn = UnixConnection(agent.sock)
    try:
        conn.request("GET", f"/files?path={path}")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Length") == str(size)
        digest = hashlib.sha256()
        while True:
            chunk = resp.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
    finally:
        conn.close()
    assert digest.hexdigest() == expected
    assert rss_kib(agent.pid) - before < 15_000


def test_download(agent: Agent, workdir: str) -> None:
    path = f"{workdir}/d.txt"
    with open(path, "wb") as fh:
        fh.write(b"0123456789")
    status, headers, body = request(agent.sock, "GET", f"/files?path={path}")
    assert (status, body) == (200, b"0123456789")
    assert headers["content-length"] == "10"
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["content-disposition"] == "inline; filename=d.txt"
    status, headers, body = request(
        agent.sock, "GET", f"/files?path={path}", headers={"Range": "bytes=2-4"}
    )
    assert (status, body, headers["content-range"]) == (206, b"234", "bytes 2-4/10")
    status, headers, body = request(
        agent.sock, "GET", f"/files?path={path}", headers={"Accept-Encoding": "gzip"}
    )
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert gzip.decompress(body) == b"0123456789"
    status, _, body = request(agent.sock, "GET", f"/files?path={workdir}/missing")
    assert status == 404 and json.loads(body) == {
        "code": 404,
        "message": f"path '{workdir}/missing' does not exist",
    }
    status, _, body = request(agent.sock, "GET", f"/files?path={workdir}")
    assert status == 400 and json.loads(body)["code"] == 400


# ---- filesystem.Filesystem ------------------------------------------------------------


def fs(
    agent: Agent, method: str, msg: Dict[str, Any], user: Optional[str] = None
) -> Tuple[int, Any]:
    headers = {"Authorization": basic(user)} if user else None
    return unary(agent.sock, f"/filesystem.Filesystem/{method}", msg, headers)


def test_filesystem_rpcs(agent: Agent, workdir: str) -> None:
    status, body = fs(agent, "MakeDir", {"path": f"{workdir}/m/n"}, "nobody")
    entry = body["entry"]
    assert status == 200 and entry.pop("modifiedTime").endswith("Z")
    assert entry == {
        "name": "n",
        "type": "FILE_TYPE_DIRECTORY",
        "path": f"{workdir}/m/n",
        "size": str(os.lstat(f"{workdir}/m/n").st_size),
        "mode": 0o755,
        "permissions": "drwxr-xr-x",
        "owner": "nobody",
        "group": grp.getgrgid(NOBODY.pw_gid).gr_name,
    }
    assert os.stat(f"{workdir}/m").st_uid == NOBODY.pw_uid
    assert fs(agent, "MakeDir", {"path": f"{workdir}/m/n"})[1]["code"] == "already_exists"
    assert fs(agent, "MakeDir", {"path": f"{workdir}/m/n"})[0] == 409
    with open(f"{workdir}/m/f.txt", "w") as fh:
        fh.write("hello")
    status, body = fs(agent, "MakeDir", {"path": f"{workdir}/m/f.txt"})
    assert (status, body["code"]) == (400, "invalid_argument")

    status, body = fs(agent, "Stat", {"path": f"{workdir}/m/f.txt"})
    entry = body["entry"]
    assert status == 200 and entry.pop("modifiedTime").endswith("Z")
    assert entry == {
        "name": "f.txt",
        "type": "FILE_TYPE_FILE",
        "path": f"{workdir}/m/f.txt",
        "size": "5",
        "mode": 0o644,
        "permissions": "-rw-r--r--",
        "owner": "root",
        "group": "root",
    }
    os.symlink(f"{workdir}/m", f"{workdir}/link")
    entry = fs(agent, "Stat", {"path": f"{workdir}/link"})[1]["entry"]
    assert entry["type"] == "FILE_TYPE_DIRECTORY" and "isSymlink" not in entry
    assert entry["symlinkTarget"] == f"{workdir}/m" and entry["permissions"] == "Lrwxrwxrwx"
    assert fs(agent, "Stat", {"path": f"{workdir}/nope"}) == (
        404,
        {
            "code": "not_found",
            "message": f"file not found: lstat {workdir}/nope: no such file or directory",
        },
    )

    names = [e["path"] for e in fs(agent, "ListDir", {"path": workdir})[1]["entries"]]
    assert names == [f"{workdir}/link", f"{workdir}/m"]
    names = [e["path"] for e in fs(agent, "ListDir", {"path": workdir, "depth": 2})[1]["entries"]]
    assert names == [f"{workdir}/link", f"{workdir}/m", f"{workdir}/m/f.txt", f"{workdir}/m/n"]
    names = [e["name"] for e in fs(agent, "ListDir", {"path": f"{workdir}/link"})[1]["entries"]]
    assert names == ["f.txt", "n"]
    assert fs(agent, "ListDir", {"path": f"{workdir}/m/n"}) == (200, {})
    assert fs(agent, "ListDir", {"path": f"{workdir}/m/f.txt"})[1]["code"] == "invalid_argument"
    assert fs(agent, "ListDir", {"path": f"{workdir}/nope"})[0] == 404

    status, body = fs(
        agent,
        "Move",
        {"source": f"{workdir}/m/f.txt", "destination": f"{workdir}/o/g.txt"},
        "nobody",
    )
    assert status == 200 and body["entry"]["path"] == f"{workdir}/o/g.txt"
    assert os.stat(f"{workdir}/o").st_uid == NOBODY.pw_uid
    assert (
        fs(agent, "Move", {"source": f"{workdir}/nope", "destination": f"{workdir}/x"})[1]["code"]
        == "not_found"
    )

    assert fs(agent, "Remove", {"path": f"{workdir}/link"}) == (200, {})
    assert os.path.isdir(f"{workdir}/m")  # a symlink is removed, not its target
    assert fs(agent, "Remove", {"path": f"{workdir}/m"}) == (200, {})
    assert fs(agent, "Remove", {"path": f"{workdir}/m"}) == (200, {})
    assert not os.path.exists(f"{workdir}/m")

    status, body = fs(agent, "Stat", {"path": workdir}, "no-such-user-xyz")
    assert (status, body["code"]) == (401, "unauthenticated")
    status, _, raw = request(
        agent.sock, "POST", "/filesystem.Filesystem/Stat", b"", {"Content-Type": "application/json"}
    )
    assert (status, json.loads(raw)["code"]) == (400, "invalid_argument")


def test_no_child_left_behind(agent: Agent) -> None:
    """Every process started above has been reaped (no zombies, nothing running)."""
    wait_until(lambda: agent_children(agent.pid) == [], what="agent children to be reaped")
    assert list_pids(agent.sock) == []
    assert re.search(r"Traceback", read_text(agent.log_path)) is None


def test_a_lookup_by_tag_misses_as_envds_does_when_other_tags_run(agent: Agent) -> None:
    """service.go getProcess by tag: a sync.Map.Range (Go's random map order) that skips
    untagged processes, goes on after a match and stops at the first process with another
    tag. So with two tags alive a lookup of either finds it in some tries and answers
    ``not_found`` in others; a pid always works; alone, a tag is always found."""
    def tagged(tag: str) -> Stream:
        return Stream(agent.sock, "Start",
                      {"process": {"cmd": "sleep", "args": ["30"]}, "tag": tag, "stdin": False})

    a, untagged = tagged("t-one"), Stream(
        agent.sock, "Start", {"process": {"cmd": "sleep", "args": ["30"]}, "stdin": False})
    try:
        pid_a = a.next_event()["start"]["pid"]  # type: ignore[index]
        untagged.next_event()

        def found(tag: str) -> bool:
            status, _ = unary(agent.sock, "/process.Process/Update",
                              {"process": {"tag": tag}})  # a no-op on a hit
            assert status in (200, 404), status
            return status == 200

        assert all(found("t-one") for _ in range(30))  # alone (untagged ones are skipped)
        b = tagged("t-two")
        try:
            pid_b = b.next_event()["start"]["pid"]  # type: ignore[index]
            seen = {found("t-one") for _ in range(60)} | {found("t-two") for _ in range(60)}
            assert seen == {True, False}  # each is missed in some tries (2**-60 otherwise)
            assert unary(agent.sock, "/process.Process/Update",
                         {"process": {"pid": pid_a}}) == (200, {})
        finally:
            signal_pid(agent.sock, pid_b)
            b.close()
    finally:
        signal_pid(agent.sock, pid_a)
        a.close()
        untagged.close()


def test_a_new_process_of_a_tag_drops_the_old_ones_kept_exit(agent: Agent) -> None:
    """start.go: clearTerminatedForTag, so a Connect by tag after a tagged restart never
    gets the earlier process's end."""
    _, end = start(agent.sock, "sh", "-c", "exit 3", tag="t-again")
    assert end.ok
    s = Stream(agent.sock, "Start", {"process": {"cmd": "sh", "args": ["-c", "read x"]},
                                     "tag": "t-again", "stdin": True})
    try:
        pid = s.next_event()["start"]["pid"]  # type: ignore[index]
        c = Stream(agent.sock, "Connect", {"process": {"tag": "t-again"}})
        try:
            assert c.next_event() == {"start": {"pid": pid}}
        finally:
            c.close()
    finally:
        s.close()


def test_an_input_into_a_full_pipe_waits_as_long_as_it_takes_and_arrives_whole(
    agent: Agent,
) -> None:
    """envd's SendInput writes its bytes to the pipe whatever the request's deadline, and
    holds the process's stdin lock meanwhile (a later input and CloseStdin wait behind it):
    a reader that starts late gets every byte, in order, even after a client gave up."""
    s = Stream(agent.sock, "Start", {"process": {"cmd": "sh", "args": [
        "-c", "sleep 1.5; cat | sha256sum"]}, "stdin": True})
    try:
        pid = s.next_event()["start"]["pid"]  # type: ignore[index]
        first, second = os.urandom(4 << 20), os.urandom(1 << 20)

        def send(data: bytes, timeout: Optional[float] = None) -> Any:
            conn = UnixConnection(agent.sock)
            conn.timeout = timeout
            try:
                body = {"process": {"pid": pid}, "input": {"stdin": b64(data)}}
                conn.request("POST", "/process.Process/SendInput", json.dumps(body).encode(),
                             {"Content-Type": "application/json",
                              "Connect-Timeout-Ms": "200"})
                resp = conn.getresponse()
                return resp.status, resp.read()
            except OSError as exc:  # the client gave up
                return exc
            finally:
                conn.close()

        t0 = time.monotonic()
        gave_up = send(first, timeout=0.3)  # blocked on the full pipe: the client leaves
        assert isinstance(gave_up, OSError), gave_up
        # the next input waits behind the first, past its own deadline, then succeeds
        assert send(second) == (200, b"{}")
        assert time.monotonic() - t0 > 1.0
        assert unary(agent.sock, "/process.Process/CloseStdin", {"process": {"pid": pid}}) == (
            200, {})
        events, end = s.collect()
        assert end.ok
        digest = output(events).split()[0].decode()
        assert digest == hashlib.sha256(first + second).hexdigest()
    finally:
        s.close()


def test_an_upload_makes_the_parents_of_the_cleaned_path_only(agent: Agent, workdir: str) -> None:
    """upload.go: EnsureDirs(filepath.Dir(path)), and Go's Dir cleans the path, so a ``..``
    never makes the directory before it; the open of the path as given then fails."""
    status, _, raw = request(
        agent.sock, "POST", f"/files?path={workdir}/nodir/../made/f",
        b"x", {"Content-Type": "application/octet-stream"},
    )
    assert status == 500, raw
    assert os.path.isdir(f"{workdir}/made") and not os.path.exists(f"{workdir}/nodir")
