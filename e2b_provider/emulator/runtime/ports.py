"""Host side of a sandbox's ports socket: a connection to one of the sandbox's TCP ports.

The sandbox's network namespace has loopback only. Its agent serves ``ports.sock`` (see
:mod:`e2b_provider.emulator.agent.ports`): asked for a port, it connects to it from inside
and passes the connected socket back as ``SCM_RIGHTS``. This module owns the asking, on the
event loop and bounded, and the distrust of what comes back: the sandbox may be hostile (its
root may be anyone), so at most one descriptor is accepted, and only a connected
``AF_INET``/``AF_INET6`` ``SOCK_STREAM`` TCP socket is kept; anything else is closed.
"""

from __future__ import annotations

import array
import asyncio
import os
import socket
import stat
from typing import List, Tuple

__all__ = ["PortClosed", "connect_port"]

_OK = b"+"
_MAX_ANSWER = 64
_IPPROTO_TCP = 6


class PortClosed(OSError):
    """No connection to the port: nothing listens there, or the agent did not answer.

    The message is the agent's reason (``refused``, ``timeout``…) or what went wrong here.
    """


def _close_all(fds: List[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _receive(sock: socket.socket) -> Tuple[bytes, List[int], int]:
    """One ``recvmsg`` with room for one descriptor; every descriptor received is returned."""
    fds = array.array("i")
    msg, ancdata, flags, _ = sock.recvmsg(_MAX_ANSWER, socket.CMSG_SPACE(fds.itemsize))
    received: List[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % fds.itemsize
            chunk = array.array("i")
            chunk.frombytes(data[:usable])
            received.extend(chunk)
    return msg, received, flags


def _checked(fd: int) -> socket.socket:
    """Adopt ``fd`` if it is a connected TCP socket over IPv4 or IPv6; else close it.

    Raises:
        PortClosed: it is anything else.
    """
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise PortClosed("the agent passed something that is not a socket")
        sock = socket.socket(fileno=fd)
    except BaseException:
        _close_all([fd])
        raise
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            raise PortClosed("the agent passed a socket that is not IPv4 or IPv6")
        if sock.type != socket.SOCK_STREAM:
            raise PortClosed("the agent passed a socket that is not a stream")
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) != _IPPROTO_TCP:
            raise PortClosed("the agent passed a socket that is not TCP")
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise PortClosed("the agent passed a listening socket")
        sock.getpeername()  # ENOTCONN for a socket that is not connected
        sock.setblocking(False)
        sock.set_inheritable(False)
    except BaseException as exc:
        sock.close()
        if isinstance(exc, OSError) and not isinstance(exc, PortClosed):
            raise PortClosed(f"the agent passed an unusable socket: {exc.strerror}") from None
        raise
    return sock


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Wait until ``sock`` has something to read (or an error, or its end)."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


async def _ask(path: str, port: int) -> socket.socket:
    loop = asyncio.get_running_loop()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.setblocking(False)
    try:
        try:
            await loop.sock_connect(conn, path)
            await loop.sock_sendall(conn, f"{port}\n".encode("ascii"))
        except OSError as exc:
            raise PortClosed(f"the sandbox's ports socket refused: {exc.strerror}") from None
        answer = b""
        while True:
            await _readable(loop, conn)
            try:
                msg, fds, flags = _receive(conn)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                raise PortClosed(f"the sandbox's ports socket failed: {exc.strerror}") from None
            if fds:
                if len(fds) != 1 or flags & socket.MSG_CTRUNC or answer or msg != _OK:
                    _close_all(fds)
                    raise PortClosed("the agent's answer was not one socket")
                return _checked(fds[0])
            if flags & socket.MSG_CTRUNC:
                raise PortClosed("the agent's answer was not one socket")
            answer += msg
            if not msg or b"\n" in answer or len(answer) > _MAX_ANSWER:
                break
        reason = answer.split(b"\n", 1)[0].lstrip(b"-")[:_MAX_ANSWER]
        text = reason.decode("ascii", "replace") or "no answer"
        raise PortClosed(text if text.isprintable() else "unreadable answer")
    finally:
        conn.close()


async def connect_port(path: str, port: int, timeout: float = 8.0) -> socket.socket:
    """A non-blocking socket connected to ``port`` inside the sandbox whose ports socket is
    ``path`` (host path).

    Args:
        path: the sandbox's ``ports.sock`` on the host.
        port: the TCP port inside the sandbox (1-65535).
        timeout: bound on the whole exchange, seconds.

    Raises:
        PortClosed: nothing listens there, the agent did not answer in time, or its answer was
            not a connected TCP socket.
    """
    if not 1 <= port <= 65535:
        raise PortClosed(f"bad port {port}")
    try:
        return await asyncio.wait_for(_ask(path, port), timeout)
    except asyncio.TimeoutError:
        raise PortClosed("the sandbox's agent did not answer in time") from None

