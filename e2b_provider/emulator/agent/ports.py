"""The agent's ports socket: connections to the sandbox's TCP ports, handed to the host.

The sandbox's network namespace has loopback only, so the host server cannot reach a server
listening inside. PID 1 makes a second listening unix socket (``/run/e2b/ports.sock``, the
host's ``<state_dir>/e2b/ports.sock``; inherited by the agent as fd 4 with ``LISTEN_FDS=2``)
and the agent serves it here, on its event loop (no threads). One request per connection:

* the host writes a port number (ASCII decimal, 1-65535) and ``\\n``;
* the agent connects to ``127.0.0.1:<port>``, and when that is refused to ``[::1]:<port>``
  (bounded: :data:`CONNECT_TIMEOUT_SECONDS` seconds in all), from inside the sandbox's namespace;
* it answers one byte ``+`` carrying the connected socket as ``SCM_RIGHTS``, or a line
  ``-<reason>\\n`` (``refused``, ``timeout``, ``bad request`` or an errno name), and closes.

The host then speaks to the sandbox's server over that socket directly: no byte passes through
the agent.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Optional, Set

__all__ = ["CONNECT_TIMEOUT_SECONDS", "REQUEST_TIMEOUT_SECONDS", "PortsServer", "parse_port"]

log = logging.getLogger("e2b_provider.emulator.agent.ports")

#: Bound on connecting to a port (both addresses together), seconds.
CONNECT_TIMEOUT_SECONDS = 4.0
#: Bound on reading a request line, seconds.
REQUEST_TIMEOUT_SECONDS = 5.0
_MAX_REQUEST = 16
OK = b"+"


def parse_port(line: bytes) -> Optional[int]:
    """The port of a request line (``b"8000\\n"``), or None when it is not one."""
    text = line.strip()
    if not text.isdigit() or len(text) > 5:
        return None
    port = int(text)
    return port if 1 <= port <= 65535 else None


async def _connect(port: int, timeout: float) -> socket.socket:
    """A socket connected to ``port`` on 127.0.0.1, else on ::1.

    Raises:
        OSError: neither accepted (the IPv4 error when both refused).
        asyncio.TimeoutError: no answer within ``timeout`` seconds.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    first: Optional[OSError] = None
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:  # no IPv6 in this kernel
            first = first or exc
            continue
        sock.setblocking(False)
        try:
            remaining = max(0.01, deadline - loop.time())
            await asyncio.wait_for(loop.sock_connect(sock, (host, port)), remaining)
            return sock
        except BaseException as exc:
            sock.close()
            if not isinstance(exc, OSError) or isinstance(exc, asyncio.TimeoutError):
                raise
            first = first or exc
            if exc.errno not in (errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.ENETUNREACH):
                raise
    assert first is not None
    raise first


class PortsServer:
    """Serves the ports socket (see the module docstring).

    Args:
        listener: the listening unix socket (inherited from PID 1, or made by the agent).
    """

    def __init__(self, listener: socket.socket) -> None:
        self._listener = listener
        self._tasks: Set[asyncio.Task[None]] = set()
        self._accepting: Optional[asyncio.Task[None]] = None

    def start(self) -> None:
        """Start accepting on the running loop."""
        self._listener.setblocking(False)
        self._accepting = asyncio.ensure_future(self._accept_loop())

    async def close(self) -> None:
        """Stop accepting and end the requests in flight (the listener stays open)."""
        tasks = [t for t in (self._accepting, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._listener)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("ports socket: accept failed: %s", exc)
                    await asyncio.sleep(0.1)
                    continue
                if exc.errno in (errno.ECONNABORTED, errno.EINTR, errno.EAGAIN):
                    continue
                raise
            task = asyncio.ensure_future(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        target: Optional[socket.socket] = None
        try:
            line = b""
            try:
                while b"\n" not in line and len(line) <= _MAX_REQUEST:
                    data = await asyncio.wait_for(loop.sock_recv(conn, 64), REQUEST_TIMEOUT_SECONDS)
                    if not data:
                        break
                    line += data
            except (OSError, asyncio.TimeoutError):
                return
            port = parse_port(line.split(b"\n", 1)[0]) if b"\n" in line else None
            if port is None:
                await self._answer(conn, b"-bad request\n")
                return
            try:
                target = await _connect(port, CONNECT_TIMEOUT_SECONDS)
            except asyncio.TimeoutError:
                await self._answer(conn, b"-timeout\n")
                return
            except OSError as exc:
                reason = "refused" if exc.errno == errno.ECONNREFUSED else _errno_name(exc)
                await self._answer(conn, f"-{reason}\n".encode())
                return
            try:
                socket.send_fds(conn, [OK], [target.fileno()])
            except OSError as exc:
                log.info("ports socket: passing a connection to port %d failed: %s", port, exc)
        finally:
            if target is not None:
                target.close()  # the host holds its own descriptor now
            conn.close()

    @staticmethod
    async def _answer(conn: socket.socket, data: bytes) -> None:
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(conn, data), 1.0)
        except (OSError, asyncio.TimeoutError):
            pass


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "error").lower()
