"""1 GiB of command output under a 1 MiB cap: client wall time, CPU and RSS growth.

The command ``head -c 1073741824 /dev/zero`` runs in one sandbox of one local emulator:

- provider: ``exec(h, "head -c ...", max_output_bytes=1 MiB)`` (must come back with exactly
  1 MiB of stdout and ``truncated=True``);
- discard:  the bare floor the goal is measured against: the same command started with one
  raw ``process.Process/Start`` request through ``requests`` (``stream=True``), the body
  read with ``raw.read(1 MiB)`` and dropped: urllib3 undoes the chunked framing, nothing
  is JSON- or base64-decoded;
- discard-socket: the same request on a plain socket, every byte received dropped, not even
  the chunked framing undone (it only watches for the terminator): the lowest cost any
  client can have, shown for scale.

Each measurement runs in a fresh child process (this script with ``--child``), so the
client's CPU (``time.process_time``, all threads) and its RSS growth (peak RSS during the
call, reset just before via ``/proc/self/clear_refs``, minus the RSS before the call) belong
to that contender alone. Contenders alternate, order rotated each round. The emulator's own
CPU is not counted (it encodes and sends the stream; it dominates the wall time).

    python benchmarks/capped_output.py [--runs 2] [--mib 1024] [--cap-kib 1024]
"""

from __future__ import annotations

import argparse
import json
import socket
import time
import urllib.parse
from typing import Any, Dict, List

import _bench as b

from e2b_provider import E2BSandboxProvider

#: issue 7's goals: provider CPU at most this times the discard reader's; RSS growth in MiB
CPU_GOAL, RSS_GOAL_MIB = 2.0, 32
CONTENDERS = ("provider", "discard", "discard-socket")


def vm_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def discard_socket(ep: b.Endpoint, env: b.RawEnvd, cmd: str, args: List[str]) -> int:
    """POST one Start request on a raw socket; read the response and drop it. Bytes read."""
    url = urllib.parse.urlsplit(ep.sandbox_url)
    body = env.start_body(cmd, args)
    headers = {
        "Host": url.netloc,
        "Content-Length": str(len(body)),
        **env.rpc_headers(),
        **{k: str(v) for k, v in env.session.headers.items() if k.startswith(("E2b-", "X-"))},
    }
    head = "POST /process.Process/Start HTTP/1.1\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    total = 0
    with socket.create_connection((url.hostname, url.port or 80), timeout=600) as sock:
        sock.sendall(head.encode() + body)
        n = sock.recv_into(buf)
        header_end = bytes(view[:n]).find(b"\r\n\r\n")
        if header_end < 0 or not buf.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected answer: {bytes(view[:200])!r}")
        if b"chunked" not in bytes(view[:header_end]).lower():
            raise RuntimeError("expected a chunked response")
        tail = bytes(view[max(0, n - 7) : n])
        total += n
        while not tail.endswith(b"\r\n0\r\n\r\n"):
            n = sock.recv_into(buf)
            if n == 0:
                raise RuntimeError("the stream ended without its terminator")
            total += n
            tail = (tail + bytes(view[max(0, n - 7) : n]))[-7:]
    return total


def discard_urllib3(ep: b.Endpoint, env: b.RawEnvd, cmd: str, args: List[str]) -> int:
    """The same Start request with ``requests`` (urllib3 undoes the chunked framing); every
    byte of the body dropped without JSON or base64 decoding. Bytes read."""
    total = 0
    with env.post_start(cmd, args, stream=True) as r:
        while True:
            chunk = r.raw.read(1 << 20, decode_content=False)
            if not chunk:
                return total
            total += len(chunk)


def child(args: argparse.Namespace) -> None:
    """One measured run in this (fresh) process; prints one JSON line."""
    ep = b.child_endpoint(args.url)
    size, cap = args.mib * b.MiB, args.cap_kib * 1024
    command = f"head -c {size} /dev/zero"
    check: Dict[str, Any] = {}
    if args.child == "provider":
        provider = E2BSandboxProvider(b.provider_config(ep))
        provider.exec(args.sandbox, "true")  # warm: connections, imports, threads

        def call() -> None:
            r = provider.exec(args.sandbox, command, max_output_bytes=cap, timeout=900)
            check.update(stdout=len(r.stdout), truncated=r.truncated, exit=r.exit_code)
    else:
        env = b.RawEnvd(ep, args.sandbox)
        env.start("/bin/true")
        reader = discard_socket if args.child == "discard-socket" else discard_urllib3

        def call() -> None:
            argv = ["-c", str(size), "/dev/zero"]
            check.update(received=reader(ep, env, "/usr/bin/head", argv))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    rss0 = vm_kib("VmRSS")
    c0, t0 = time.process_time(), time.perf_counter()
    call()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = vm_kib("VmHWM")
    print(json.dumps({"wall": wall, "cpu": cpu, "rss_growth_kib": peak - rss0, **check}))


def main() -> None:
    ap = argparse.ArgumentParser(
        description="1 GiB of output under a 1 MiB cap: provider vs a bare discard reader "
        "(client wall, CPU, RSS growth)."
    )
    ap.add_argument("--runs", type=int, default=2, help="rounds (default 2)")
    ap.add_argument("--mib", type=int, default=1024, help="output size in MiB (default 1024)")
    ap.add_argument("--cap-kib", type=int, default=1024, help="output cap in KiB (default 1024)")
    ap.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--sandbox", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    results: Dict[str, List[Dict[str, Any]]] = {name: [] for name in CONTENDERS}
    with b.on_emulator("bn-capped") as (ep, _, (h,)):
        for r in range(args.runs):
            for name in b.rotated(CONTENDERS, r):
                child_args = ["--child", name, "--url", ep.sandbox_url, "--sandbox", h.id]
                child_args += ["--mib", str(args.mib), "--cap-kib", str(args.cap_kib)]
                results[name].append(b.run_child(__file__, child_args, ep.api_key, 1800))

    for run in results["provider"]:
        if run["stdout"] != args.cap_kib * 1024 or not run["truncated"]:
            raise SystemExit(f"provider result is wrong: {run}")
    med = {
        name: {k: b.median([run[k] for run in runs]) for k in ("wall", "cpu", "rss_growth_kib")}
        for name, runs in results.items()
    }
    rows = []
    base, sock = med["discard"], med["discard-socket"]
    for name in results:
        m = med[name]
        rows.append(
            [
                name,
                f"{m['wall']:.2f}",
                f"{m['cpu']:.2f}",
                f"{m['rss_growth_kib'] / 1024:.1f}",
                b.ratio(m["wall"], base["wall"]),
                b.ratio(m["cpu"], base["cpu"]),
                b.ratio(m["cpu"], sock["cpu"]),
            ]
        )
    print(
        b.table(
            f"{args.mib} MiB of output under a {args.cap_kib} KiB cap, median of {args.runs} "
            "runs (each in a fresh client process)",
            [
                "contender",
                "wall s",
                "client CPU s",
                "RSS growth MiB",
                "wall x discard",
                "CPU x discard",
                "CPU x socket",
            ],
            rows,
        )
    )
    cpu_ratio = med["provider"]["cpu"] / base["cpu"]
    rss = med["provider"]["rss_growth_kib"] / 1024
    print(
        f"goals: CPU <= {CPU_GOAL}x discard: {'ok' if cpu_ratio <= CPU_GOAL else 'not met'}; "
        f"RSS growth <= {RSS_GOAL_MIB} MiB: {'ok' if rss <= RSS_GOAL_MIB else 'not met'}"
    )


if __name__ == "__main__":
    main()
