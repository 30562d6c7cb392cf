"""The host side of a sandbox's ports socket against a hostile agent, and the agent's side.

A stand-in "agent" (a unix socket served by a thread of this test) answers what a sandbox's
root could: a pipe, a unix socket, a listening TCP socket, two descriptors, garbage. The host
keeps only one connected TCP socket and closes everything else (no descriptor leaks). The real
agent's :class:`~e2b_provider.emulator.agent.ports.PortsServer` is exercised on the host too.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
from typing import Callable, Iterator, List

import pytest

from e2b_provider.emulator.agent.ports import PortsServer, parse_port
from e2b_provider.emulator.runtime import PortClosed, connect_port

Answer = Callable[[socket.socket], None]


def open_fds() -> List[str]:
    return sorted(os.listdir("/proc/self/fd"))


@pytest.fixture
def sock_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="e2b-ps-") as path:
        yield path


def serve_once(path: str, answer: Answer) -> threading.Thread:
    """Serve one request on ``path`` with ``answer`` (after reading the request line)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def run() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(64)
                answer(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_parse_port() -> None:
    assert parse_port(b"8000") == 8000 and parse_port(b" 1\r") == 1
    for bad in (b"0", b"65536", b"-1", b"80a", b"", b"123456", b"+80"):
        assert parse_port(bad) is None, bad


def test_a_connected_tcp_socket_is_kept(sock_dir: str) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(server.getsockname())
    path = os.path.join(sock_dir, "p.sock")
    thread = serve_once(path, lambda c: socket.send_fds(c, [b"+"], [peer.fileno()]))
    got = asyncio.run(connect_port(path, 80, timeout=5))
    thread.join(5)
    with got, server, peer:
        assert got.family == socket.AF_INET and got.type == socket.SOCK_STREAM
        assert got.getpeername() == server.getsockname()
        assert not got.getblocking()


def _pipe_answer(conn: socket.socket) -> None:
    r, w = os.pipe()
    socket.send_fds(conn, [b"+"], [r])
    os.close(r)
    os.close(w)


def _unix_answer(conn: socket.socket) -> None:
    a, b = socket.socketpair()
    socket.send_fds(conn, [b"+"], [a.fileno()])
    a.close()
    b.close()


def _listening_answer(conn: socket.socket) -> None:
    with socket.create_server(("127.0.0.1", 0)) as lst:
        socket.send_fds(conn, [b"+"], [lst.fileno()])


def _two_answer(conn: socket.socket) -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        p1 = socket.create_connection(srv.getsockname())
        p2 = socket.create_connection(srv.getsockname())
        with p1, p2:
            socket.send_fds(conn, [b"+"], [p1.fileno(), p2.fileno()])


def _udp_answer(conn: socket.socket) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect(("127.0.0.1", 9))
        socket.send_fds(conn, [b"+"], [udp.fileno()])


@pytest.mark.parametrize(
    "answer,reason",
    [
        (lambda c: c.sendall(b"-refused\n"), "refused"),
        (lambda c: c.sendall(b"-\x1b[31mevil\n"), "unreadable answer"),
        (lambda c: None, "no answer"),
        (_pipe_answer, "not a socket"),
        (_unix_answer, "not IPv4 or IPv6"),
        (_listening_answer, "listening socket"),
        (_two_answer, "not one socket"),
        (_udp_answer, "not a stream"),
    ],
    ids=["refused", "garbage", "eof", "pipe", "unix", "listening", "two", "udp"],
)
def test_anything_else_is_refused_and_closed(sock_dir: str, answer: Answer, reason: str) -> None:
    path = os.path.join(sock_dir, "p.sock")
    before = open_fds()
    thread = serve_once(path, answer)
    with pytest.raises(PortClosed) as info:
        asyncio.run(connect_port(path, 80, timeout=5))
    thread.join(5)
    assert reason in str(info.value)
    assert open_fds() == before  # nothing the agent passed stays open here


def test_a_silent_agent_times_out(sock_dir: str) -> None:
    path = os.path.join(sock_dir, "p.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)  # accepted by the kernel, never answered
    with listener, pytest.raises(PortClosed) as info:
        asyncio.run(connect_port(path, 80, timeout=0.3))
    assert "did not answer in time" in str(info.value)


def test_the_agents_ports_server(sock_dir: str) -> None:
    path = os.path.join(sock_dir, "ports.sock")
    target = socket.create_server(("127.0.0.1", 0))
    free = socket.create_server(("127.0.0.1", 0))
    closed_port = free.getsockname()[1]
    free.close()

    async def scenario() -> List[str]:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(8)
        server = PortsServer(listener)
        server.start()
        out: List[str] = []
        try:
            got = await connect_port(path, target.getsockname()[1], timeout=5)
            out.append(f"{got.getpeername()[1] == target.getsockname()[1]}")
            got.close()
            for port in (closed_port, 0):
                try:
                    await connect_port(path, port, timeout=5)
                except PortClosed as exc:
                    out.append(str(exc))
        finally:
            await server.close()
            listener.close()
        return out

    with target:
        assert asyncio.run(scenario()) == ["True", "refused", "bad port 0"]
