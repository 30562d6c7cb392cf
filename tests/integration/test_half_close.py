"""A whole HTTP request followed by a half-close (``shutdown(SHUT_WR)``) is still answered.

A client may send its request and then shut down its write side (``nc -N``, ``socat`` and
many scripts do): the server in the sandbox answers such a request, so the edge in front of
it (``url()``) and the provider's ``forward()`` relay in front of that must answer it too.
Each path is tried five times, with a bodiless GET and with a POST whose body is complete;
the baseline is the same client run inside the sandbox against the server directly. What the
edge does not keep open: a connection with nothing owed, a request cut short, and envd's
streams (they end with their client's input).
"""

from __future__ import annotations

import socket
import urllib.parse
from typing import List, Tuple

import pytest

from e2b_provider import E2BSandboxProvider, SandboxHandle
from e2b_provider.protocol.connect import encode_envelope

from .conftest import SERVER_PORT as PORT
from .conftest import serve

TRIES = 5
BODY = b"half-closed body\n"

#: The same client as :func:`ask`, run inside the sandbox against the server directly.
INSIDE = r"""
import socket, sys
port, tries = int(sys.argv[1]), int(sys.argv[2])
body = b"half-closed body\n"
ok = 0
for i in range(tries):
    for req in (b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n",
                b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(req)
        s.shutdown(socket.SHUT_WR)
        got = b""
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                got += d
                if got.endswith(b"hello\n") or got.endswith(body):
                    break
        except OSError:
            pass
        s.close()
        ok += got.startswith(b"HTTP/1.1 200") and (got.endswith(b"hello\n") or got.endswith(body))
print(ok)
"""


def requests_for(host: str, extra: str = "") -> List[Tuple[bytes, bytes]]:
    """``(request, what the answer ends with)``: a GET without a body, a POST with one."""
    head = f"Host: {host}\r\n{extra}"
    return [
        (f"GET /hello HTTP/1.1\r\n{head}\r\n".encode(), b"hello\n"),
        (
            f"POST /echo HTTP/1.1\r\n{head}Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY,
            BODY,
        ),
    ]


def ask(address: Tuple[str, int], request: bytes, end: bytes) -> bytes:
    """Send ``request``, shut down the write side, read until the answer ends (or EOF)."""
    with socket.create_connection(address, timeout=20) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while not got.endswith(end):
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            got += data
        return got


def answered(address: Tuple[str, int], host: str, extra: str = "") -> List[bytes]:
    """Every answer that was not a whole 200 ending as expected (empty: all answered)."""
    bad = []
    for _ in range(TRIES):
        for request, end in requests_for(host, extra):
            got = ask(address, request, end)
            if not (got.startswith(b"HTTP/1.1 200 ") and got.endswith(end)):
                bad.append(got)
    return bad


@pytest.fixture(scope="module")
def served(shared_provider: E2BSandboxProvider, sandbox: SandboxHandle) -> SandboxHandle:
    p = shared_provider
    p.write_file(sandbox, "/workspace/half_close.py", INSIDE.encode())
    serve(p, sandbox, tag="half-close")
    return sandbox


def test_the_server_answers_a_half_closed_request_inside_the_sandbox(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    r = shared_provider.exec(served, f"python3 /workspace/half_close.py {PORT} {TRIES}",
                             timeout=60)
    assert (r.exit_code, r.stdout) == (0, f"{2 * TRIES}\n"), r


def test_the_edge_answers_a_half_closed_request(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    url = urllib.parse.urlsplit(shared_provider.url(served, PORT))
    edge = ("127.0.0.1", url.port or 80)
    assert answered(edge, url.netloc) == []  # the Host route
    routing = f"E2b-Sandbox-Id: {served.id}\r\nE2b-Sandbox-Port: {PORT}\r\n"
    assert answered(edge, "localhost", routing) == []  # the header route


def test_forward_answers_a_half_closed_request(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    with shared_provider.forward(served, PORT) as url:
        local = urllib.parse.urlsplit(url)
        assert answered(("127.0.0.1", local.port or 80), local.netloc) == []


def test_the_edge_still_closes_a_half_closed_idle_connection(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    """A half-close with nothing owed (no request, or a request cut short) ends the connection
    at once: the edge keeps no connection open for a client that will send nothing more."""
    url = urllib.parse.urlsplit(shared_provider.url(served, PORT))
    cut = f"POST /echo HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Length: 100\r\n\r\nshort"
    for request in (b"", cut.encode()):
        with socket.create_connection(("127.0.0.1", url.port or 80), timeout=20) as s:
            s.sendall(request)
            s.shutdown(socket.SHUT_WR)
            got = s.recv(65536)  # ends by the edge's close, not the 20 s timeout
            assert not got.startswith(b"HTTP/1.1 200"), got


def test_an_envd_stream_still_ends_when_its_client_half_closes(
    shared_provider: E2BSandboxProvider, served: SandboxHandle
) -> None:
    """envd's streams end when their client's input ends (E2B's edge ends them so, and the
    SDK and this library end a stream by closing its connection): a half-close after a
    ``Start`` of a long command closes the connection at once, the command is not awaited."""
    target = shared_provider._ctx.attach(served.id, None)
    body = encode_envelope({"process": {"cmd": "/bin/sleep", "args": ["40"]}})
    head = (
        "POST /process.Process/Start HTTP/1.1\r\nHost: localhost\r\n"
        f"E2b-Sandbox-Id: {served.id}\r\nE2b-Sandbox-Port: 49983\r\n"
        f"X-Access-Token: {target.access_token}\r\n"
        "Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    url = urllib.parse.urlsplit(shared_provider.url(served, PORT))
    with socket.create_connection(("127.0.0.1", url.port or 80), timeout=20) as s:
        s.sendall(head.encode() + body)
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):  # whatever came before the end; a timeout fails the test
            pass
