"""Hold every packet of an NFQUEUE queue for a fixed time, then accept it; count what passes.

The WAN mode of ``benchmarks/wan.py`` runs one of these in each of its two network
namespaces, fed by an iptables rule in the *receiving* namespace's ``raw PREROUTING``
chain: a packet is held on arrival, after it has left the sender's TCP stack. (Delaying on
the sending side instead holds the packet while it still counts against the sender's TCP
small queues, which throttles the sender and adds a false extra delay.)

It speaks the kernel's nfnetlink_queue protocol over a raw ``AF_NETLINK`` socket with the
standard library only, so nothing beyond Debian's ``iptables`` (for the rule) is needed.
Packets are released in arrival order with one batch verdict (``NFQNL_MSG_VERDICT_BATCH``)
for everything due.

While holding packets it counts, per queue (= per direction): packets, TCP SYNs without
ACK (new connections opened towards this side), SYN-ACKs, HTTP/1.x request lines and
HTTP/1.x status lines found at the start of a TCP payload (plaintext HTTP only).

Control, on stdin/stdout (one line each): ``stats`` -> one JSON object with the counters;
``quit`` or end of input -> exit. The first line printed is ``ready`` once the queue is
bound. Run it inside the receiving namespace, as root::

    nsenter --net=/run/netns/NAME python benchmarks/nfq_delay.py --queue 0 --delay-ms 10
"""

from __future__ import annotations

import argparse
import collections
import errno
import json
import os
import select
import socket
import struct
import sys
import time
from typing import Deque, Dict, Tuple

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQA_CFG_F_GSO = 4
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_PACKET = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_PAYLOAD = 10
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
SO_RCVBUFFORCE = 33
COPY_RANGE = 256  # enough for IPv4 + TCP headers and the start of an HTTP line

_METHODS = (b"GET /", b"POST /", b"PUT /", b"DELETE /", b"HEAD /", b"PATCH /", b"OPTIONS /")


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(msg_type: int, flags: int, queue: int, attrs: bytes, seq: int = 0) -> bytes:
    body = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack("!H", queue) + attrs
    return struct.pack("=IHHII", 16 + len(body), msg_type, flags, seq, 0) + body


def _attrs(buf: bytes, start: int, end: int) -> Dict[int, bytes]:
    out: Dict[int, bytes] = {}
    while start + 4 <= end:
        length, kind = struct.unpack_from("=HH", buf, start)
        if length < 4:
            break
        out[kind & 0x7FFF] = buf[start + 4 : start + length]
        start += (length + 3) & ~3
    return out


class Counters:
    """What crossed the queue (one direction)."""

    def __init__(self) -> None:
        self.packets = 0
        self.bytes = 0
        self.syn = 0
        self.syn_ack = 0
        self.requests = 0
        self.responses = 0

    def count(self, ip: bytes) -> None:
        self.packets += 1
        if len(ip) < 20 or ip[0] >> 4 != 4:
            return
        self.bytes += struct.unpack_from("!H", ip, 2)[0]
        if ip[9] != socket.IPPROTO_TCP:
            return
        off = (ip[0] & 0x0F) * 4
        if len(ip) < off + 20:
            return
        flags = ip[off + 13]
        if flags & 0x02:
            if flags & 0x10:
                self.syn_ack += 1
            else:
                self.syn += 1
        data = ip[off + (ip[off + 12] >> 4) * 4 :]
        if data.startswith(_METHODS):
            self.requests += 1
        elif data.startswith(b"HTTP/1."):
            self.responses += 1

    def snapshot(self) -> Dict[str, int]:
        return dict(vars(self))


class DelayQueue:
    """One bound nfnetlink queue that releases each packet ``delay`` seconds after arrival."""

    def __init__(self, queue: int, delay: float) -> None:
        self.queue = queue
        self.delay = delay
        self.counters = Counters()
        self.held: Deque[Tuple[float, int]] = collections.deque()
        self.lost = 0  # ENOBUFS: the kernel dropped queue messages we never saw
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        self.sock.bind((0, 0))
        config = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_CONFIG
        self._request(
            config, _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))
        )
        self._request(
            config,
            _attr(NFQA_CFG_PARAMS, struct.pack("!IB", COPY_RANGE, NFQNL_COPY_PACKET))
            + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 1 << 16)),
        )
        self._request(
            config,
            _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
            + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO)),
        )
        self.sock.setblocking(False)

    def _request(self, msg_type: int, attrs: bytes) -> None:
        self.sock.send(_message(msg_type, NLM_F_REQUEST | NLM_F_ACK, self.queue, attrs, seq=1))
        reply = self.sock.recv(65536)
        if len(reply) >= 20 and struct.unpack_from("=H", reply, 4)[0] == NLMSG_ERROR:
            code = -struct.unpack_from("=i", reply, 16)[0]
            if code:
                raise OSError(code, f"nfnetlink_queue config: {os.strerror(code)}")

    def receive(self) -> None:
        """Take every queued packet the kernel has for us."""
        while True:
            try:
                buf = self.sock.recv(1 << 20)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.lost += 1
                    continue
                raise
            due = time.monotonic() + self.delay
            pos = 0
            while pos + 16 <= len(buf):
                length, msg_type = struct.unpack_from("=IH", buf, pos)
                if length < 16:
                    break
                if msg_type == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    attrs = _attrs(buf, pos + 20, pos + length)
                    hdr = attrs.get(NFQA_PACKET_HDR)
                    if hdr is not None:
                        self.held.append((due, struct.unpack_from("!I", hdr)[0]))
                        self.counters.count(attrs.get(NFQA_PAYLOAD, b""))
                pos += (length + 3) & ~3

    def release_due(self) -> None:
        """Accept every packet whose time has come (arrival order = id order)."""
        now = time.monotonic()
        last = None
        while self.held and self.held[0][0] <= now:
            last = self.held.popleft()[1]
        if last is not None:
            verdict = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, last))
            batch = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_VERDICT_BATCH
            self.sock.send(_message(batch, NLM_F_REQUEST, self.queue, verdict))

    def next_due(self) -> float:
        return self.held[0][0] if self.held else float("inf")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queue", type=int, default=0, help="NFQUEUE number (default 0)")
    ap.add_argument("--delay-ms", type=float, default=10.0, help="hold time (default 10 ms)")
    args = ap.parse_args()
    try:
        dq = DelayQueue(args.queue, args.delay_ms / 1000.0)
    except OSError as exc:
        print(f"nfq_delay: cannot bind queue {args.queue}: {exc}", file=sys.stderr, flush=True)
        return 1
    print("ready", flush=True)
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        wait = max(0.0, dq.next_due() - time.monotonic())
        readable, _, _ = select.select([dq.sock, stdin], [], [], min(wait, 1.0))
        if dq.sock in readable:
            dq.receive()
        dq.release_due()
        if stdin in readable:
            chunk = os.read(stdin, 4096)
            if not chunk:
                return 0
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                cmd = line.strip()
                if cmd == b"quit":
                    return 0
                if cmd == b"stats":
                    out = dq.counters.snapshot()
                    out.update(held=len(dq.held), lost=dq.lost)
                    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
