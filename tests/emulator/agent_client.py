"""Client helpers for the tests of the emulator's envd look-alike agent.

``http.client`` over the agent's unix socket (requests, unary Connect calls, Connect server
streams), small wire helpers, and :func:`running_agent`, which starts one agent subprocess
(``python -m e2b_provider.emulator.agent``, as root, default user ``root``) for a test
module and stops it afterwards.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import pytest
import waiting

from e2b_provider.protocol.connect import EndStream, EnvelopeDecoder, Message, encode_envelope

Body = Union[bytes, Iterable[bytes], None]

#: ``pytestmark`` of the agent's test modules
ROOT_ON_LINUX = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="the agent tests run the agent as root on Linux",
)

# ---- client helpers -----------------------------------------------------------------


class UnixConnection(http.client.HTTPConnection):
    """``http.client`` over a unix socket."""

    def __init__(self, path: str, timeout: float = 20.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self._unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._unix_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Stream:
    """An open Connect server stream; iterate events with :meth:`next_event`."""

    def __init__(
        self,
        sock: str,
        method: str,
        msg: Dict[str, Any],
        headers: Optional[Dict[str, str]] = None,
        chunked: bool = False,
    ) -> None:
        self.conn = UnixConnection(sock)
        env = encode_envelope(msg)
        hdrs = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
        hdrs.update(headers or {})
        body: Body = env
        if chunked:
            body = iter([env[:3], env[3:]])
        path = method if method.startswith("/") else f"/process.Process/{method}"
        self.conn.request("POST", path, body=body, headers=hdrs)
        self.resp = self.conn.getresponse()
        self.decoder = EnvelopeDecoder()
        self.pending: List[Union[Message, EndStream]] = []
        self.end: Optional[EndStream] = None

    def next_item(self) -> Union[Message, EndStream]:
        while not self.pending:
            chunk = self.resp.read1(65536)
            if not chunk:
                raise AssertionError("stream ended without an end-of-stream frame")
            self.decoder.feed(chunk)
            self.pending.extend(self.decoder)
        item = self.pending.pop(0)
        if isinstance(item, EndStream):
            self.end = item
        return item

    def next_message(self) -> Optional[Dict[str, Any]]:
        """The next message, or ``None`` at the end-of-stream frame (see :attr:`end`)."""
        item = self.next_item()
        if isinstance(item, EndStream):
            return None
        message: Dict[str, Any] = item.data
        return message

    def next_event(self) -> Optional[Dict[str, Any]]:
        """The next process event, or ``None`` at the end-of-stream frame."""
        message = self.next_message()
        return None if message is None else message["event"]

    def collect(self) -> Tuple[List[Dict[str, Any]], EndStream]:
        events: List[Dict[str, Any]] = []
        while True:
            ev = self.next_event()
            if ev is None:
                assert self.end is not None
                return events, self.end
            events.append(ev)

    def close(self) -> None:
        self.conn.close()


def run_stream(
    sock: str,
    method: str,
    msg: Dict[str, Any],
    headers: Optional[Dict[str, str]] = None,
    chunked: bool = False,
) -> Tuple[List[Dict[str, Any]], EndStream, http.client.HTTPResponse]:
    st = Stream(sock, method, msg, headers, chunked)
    try:
        events, end = st.collect()
        return events, end, st.resp
    finally:
        st.close()


def start(
    sock: str, cmd: str, *args: str, headers: Optional[Dict[str, str]] = None, **fields: Any
) -> Tuple[List[Dict[str, Any]], EndStream]:
    process: Dict[str, Any] = {"cmd": cmd, "args": list(args)}
    for key in ("envs", "cwd"):
        if key in fields:
            process[key] = fields.pop(key)
    msg: Dict[str, Any] = {"process": process, "stdin": False}
    msg.update(fields)
    events, end, _ = run_stream(sock, "Start", msg, headers)
    return events, end


def output(events: List[Dict[str, Any]], key: str = "stdout") -> bytes:
    return b"".join(base64.b64decode(e["data"][key]) for e in events if key in e.get("data", {}))


def request(
    sock: str,
    method: str,
    path: str,
    body: Body = None,
    headers: Optional[Dict[str, str]] = None,
) -> Tuple[int, Dict[str, str], bytes]:
    conn = UnixConnection(sock)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def unary(
    sock: str, path: str, msg: Any, headers: Optional[Dict[str, str]] = None
) -> Tuple[int, Any]:
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    status, resp_headers, body = request(sock, "POST", path, json.dumps(msg).encode(), hdrs)
    assert resp_headers.get("content-type", "").startswith("application/json"), resp_headers
    return status, json.loads(body)


def signal_pid(sock: str, pid: int, sig: str = "SIGNAL_SIGKILL") -> Tuple[int, Any]:
    return unary(sock, "/process.Process/SendSignal", {"process": {"pid": pid}, "signal": sig})


def list_pids(sock: str) -> List[int]:
    status, body = unary(sock, "/process.Process/List", {})
    assert status == 200
    return [p["pid"] for p in body.get("processes", [])]


def wait_until(pred: Callable[[], object], timeout: float = 5.0, what: str = "condition") -> None:
    """:func:`waiting.wait_until` with the agent tests' 5 s bound."""
    waiting.wait_until(pred, timeout, what)


def multipart(parts: List[Tuple[str, str, bytes]]) -> Tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    out = b""
    for name, filename, data in parts:
        out += (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
            ).encode()
            + data
            + b"\r\n"
        )
    out += f"--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def agent_children(pid: int) -> List[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(x) for x in fh.read().split()]


# ---- the agent process ------------------------------------------------------------------


class Agent:
    def __init__(self, proc: subprocess.Popen[bytes], sock: str, log_path: str) -> None:
        self.proc = proc
        self.sock = sock
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextlib.contextmanager
def running_agent(base: str) -> Iterator[Agent]:
    """An agent serving ``<base>/envd.sock`` until the block ends (then SIGTERM)."""
    sock = os.path.join(base, "envd.sock")
    log_path = os.path.join(base, "agent.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "e2b_provider.emulator.agent",
                "--socket",
                sock,
                "--default-user",
                "root",
                "--log-level",
                "WARNING",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError("agent exited: " + read_text(log_path))
            try:
                if request(sock, "GET", "/health")[0] == 204:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("agent not healthy: " + read_text(log_path))
            time.sleep(0.05)
        yield Agent(proc, sock, log_path)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    assert not os.path.exists(sock)


def agent_fixture() -> Any:
    """A module-scoped ``agent`` fixture: one running agent for the test module."""

    @pytest.fixture(scope="module")
    def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
        with running_agent(str(tmp_path_factory.mktemp("agent"))) as running:
            yield running

    return agent


def workdir_fixture() -> Any:
    """A ``workdir`` fixture: an empty directory per test."""

    @pytest.fixture
    def workdir(tmp_path: Any) -> str:
        path = str(tmp_path / "w")
        os.mkdir(path)
        return path

    return workdir
