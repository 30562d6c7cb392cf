"""A test server to run inside a sandbox: HTTP routes and a WebSocket echo, standard library only.

Run it with the sandbox's ``python3`` (3.9 or later)::

    python3 sandbox_server.py PORT [--host 127.0.0.1|0.0.0.0|::1]

It prints ``listening on HOST PORT`` once it accepts connections. Routes (HTTP/1.1, keep-alive,
one thread per connection):

* ``GET /`` — an HTML page whose script opens a WebSocket to ``/ws`` on the same host, sends
  ``hello from the browser`` and shows the echo in ``<p id="echo">echo: …</p>`` (``waiting``
  until then);
* ``GET /ws`` — a minimal RFC 6455 echo server: text and binary messages echoed (payloads up to
  :data:`MAX_WS_PAYLOAD`, 16- and 64-bit lengths, fragments joined), ping answered with pong,
  close echoed with its code; ``/ws?close=CODE`` closes with CODE after the first echo;
* ``GET /big?mib=N`` — N MiB (``x-sha256`` header: their SHA-256), sent in 64 KiB pieces with
  ``Content-Length``;
* ``GET /chunked?n=K`` — K chunks ``chunk i\\n`` with ``Transfer-Encoding: chunked``;
* ``GET /sse?n=K&gap=S`` — K Server-Sent Events ``data: event i`` spaced S seconds;
* ``POST /echo`` — the request body back (``Content-Length`` or chunked request bodies), with
  ``x-sha256`` (of the body), ``x-request-bytes`` and ``x-seen-headers`` (the request's header
  names, lower case, comma-separated) headers;
* ``GET /headers`` — the request's headers as JSON (``{name: value}``);
* ``GET /hello`` — ``hello\\n``.
"""

import base64
import hashlib
import json
import socket
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MAX_WS_PAYLOAD = 64 * 1024 * 1024
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_PIECE = 64 * 1024

PAGE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>sandbox server</title></head>
<body>
<h1>Hello from the sandbox</h1>
<p id="echo">waiting</p>
<script>
(function () {
  var scheme = location.protocol === "https:" ? "wss:" : "ws:";
  var ws = new WebSocket(scheme + "//" + location.host + "/ws");
  var out = document.getElementById("echo");
  ws.onopen = function () { ws.send("hello from the browser"); };
  ws.onmessage = function (ev) { out.textContent = "echo: " + ev.data; };
  ws.onerror = function () { out.textContent = "error"; };
})();
</script>
</body>
</html>
"""


class _Closed(Exception):
    """The peer closed the connection."""


def _read_exact(rfile, n):
    data = rfile.read(n)
    if data is None or len(data) < n:
        raise _Closed()
    return data


def _ws_frame(opcode, payload):
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 65536:
        head += bytes([126]) + struct.pack(">H", n)
    else:
        head += bytes([127]) + struct.pack(">Q", n)
    return head + payload


def _ws_read_frame(rfile):
    b0, b1 = _read_exact(rfile, 2)
    fin, opcode = bool(b0 & 0x80), b0 & 0x0F
    masked, n = bool(b1 & 0x80), b1 & 0x7F
    if n == 126:
        n = struct.unpack(">H", _read_exact(rfile, 2))[0]
    elif n == 127:
        n = struct.unpack(">Q", _read_exact(rfile, 8))[0]
    if n > MAX_WS_PAYLOAD:
        raise ValueError("frame too large")
    mask = _read_exact(rfile, 4) if masked else None
    payload = _read_exact(rfile, n)
    if mask is not None and n:
        key = int.from_bytes(mask * (n // 4) + mask[: n % 4], "big")
        payload = (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")
    return fin, opcode, payload


class Handler(BaseHTTPRequestHandler):
    """The routes of the module docstring."""

    protocol_version = "HTTP/1.1"
    server_version = "sandbox-server/1"
    # a head and a body are two writes: without this, the body of a small answer waits for
    # the client's delayed ACK of the head (about 40 ms on Linux)
    disable_nagle_algorithm = True

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    # -- helpers --

    def _query(self):
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def _send(self, status, body, content_type="text/plain; charset=utf-8", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _request_body(self):
        """The request body (Content-Length or chunked), as a list of pieces."""
        pieces = []
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                pieces.append(_read_exact(self.rfile, size))
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length") or 0)
            while left:
                piece = self.rfile.read(min(left, _PIECE))
                if not piece:
                    raise _Closed()
                pieces.append(piece)
                left -= len(piece)
        return pieces

    # -- routes --

    def do_GET(self):
        route = urlsplit(self.path).path
        try:
            if route == "/":
                self._send(200, PAGE.encode(), "text/html; charset=utf-8")
            elif route == "/hello":
                self._send(200, b"hello\n")
            elif route == "/headers":
                body = json.dumps(dict(self.headers.items())).encode()
                self._send(200, body, "application/json")
            elif route == "/ws":
                self._websocket()
            elif route == "/big":
                self._big(int(self._query().get("mib", "1")))
            elif route == "/chunked":
                self._chunked(int(self._query().get("n", "3")))
            elif route == "/sse":
                q = self._query()
                self._sse(int(q.get("n", "3")), float(q.get("gap", "0.5")))
            else:
                self._send(404, b"not found\n")
        except (_Closed, ConnectionError, BrokenPipeError):
            self.close_connection = True

    def do_HEAD(self):
        self.do_GET()

    def do_POST(self):
        if urlsplit(self.path).path != "/echo":
            self._request_body()
            self._send(404, b"not found\n")
            return
        try:
            pieces = self._request_body()
        except (_Closed, ConnectionError, ValueError):
            self.close_connection = True
            return
        digest = hashlib.sha256()
        total = 0
        for piece in pieces:
            digest.update(piece)
            total += len(piece)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(total))
        self.send_header("x-sha256", digest.hexdigest())
        self.send_header("x-request-bytes", str(total))
        self.send_header("x-seen-headers", ",".join(k.lower() for k in self.headers.keys()))
        self.end_headers()
        for piece in pieces:
            self.wfile.write(piece)

    def _big(self, mib):
        piece = (b"0123456789abcdef" * (_PIECE // 16))[:_PIECE]
        count = mib * 1024 * 1024 // _PIECE
        digest = hashlib.sha256()
        for _ in range(count):
            digest.update(piece)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(count * _PIECE))
        self.send_header("x-sha256", digest.hexdigest())
        self.end_headers()
        if self.command == "HEAD":
            return
        for _ in range(count):
            self.wfile.write(piece)

    def _chunked(self, n):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(n):
            self._chunk(b"chunk %d\n" % i)
        self.wfile.write(b"0\r\n\r\n")

    def _sse(self, n, gap):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(n):
            if i:
                time.sleep(gap)
            self._chunk(b"data: event %d\n\n" % i)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _websocket(self):
        key = self.headers.get("Sec-WebSocket-Key")
        if not key or "websocket" not in self.headers.get("Upgrade", "").lower():
            self._send(400, b"not a websocket request\n")
            return
        accept = base64.b64encode(hashlib.sha1(key.encode() + _WS_GUID).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if offered and offered[0]:
            self.send_header("Sec-WebSocket-Protocol", offered[0])
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        close_after = self._query().get("close")
        message, first = b"", None
        try:
            while True:
                fin, opcode, payload = _ws_read_frame(self.rfile)
                if opcode == 0x8:  # close: echo its code
                    self.wfile.write(_ws_frame(0x8, payload[:2]))
                    return
                if opcode == 0x9:  # ping
                    self.wfile.write(_ws_frame(0xA, payload))
                    continue
                if opcode == 0xA:  # pong
                    continue
                if opcode in (0x1, 0x2):
                    first, message = opcode, payload
                elif opcode == 0x0 and first is not None:
                    message += payload
                    if len(message) > MAX_WS_PAYLOAD:
                        raise ValueError("message too large")
                else:
                    raise ValueError(f"unexpected opcode {opcode}")
                if fin:
                    self.wfile.write(_ws_frame(first, message))
                    self.wfile.flush()
                    message, first = b"", None
                    if close_after:
                        self.wfile.write(_ws_frame(0x8, struct.pack(">H", int(close_after))))
                        self.wfile.flush()
                        # wait for the peer's close answer
                        while _ws_read_frame(self.rfile)[1] != 0x8:
                            pass
                        return
        except (_Closed, ConnectionError, ValueError):
            return


class Server(ThreadingHTTPServer):
    """A threaded HTTP server on IPv4 or IPv6."""

    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    port = int(argv[0])
    host = "127.0.0.1"
    if len(argv) >= 3 and argv[1] == "--host":
        host = argv[2]
    if ":" in host:
        Server.address_family = socket.AF_INET6
    server = Server((host, port), Handler)
    print(f"listening on {host} {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
