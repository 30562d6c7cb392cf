"""Port forwarding on loopback: what ``forward`` adds on top of the emulator's own relay.

A stdlib server (``tests/support/sandbox_server.py``) runs in an emulator sandbox. Contenders,
interleaved round by round (the order rotated), each a block of requests on one kept-alive
connection (``requests.Session``):

- relay: straight to the emulator's port relay (its URL, with the ``Host`` a browser sends
  for ``url(h, 8000)``): the baseline, what E2B's edge is to a forward;
- forward: the same requests to ``forward(h, 8000)``'s local URL.

Then, once each: 100 concurrent requests through the forward (errors counted), and a 10 MiB
response streamed through it (the client's peak traced memory and the forward's thread
count). The per-request overhead is (forward - relay) / requests per block.

    python benchmarks/forward.py [--rounds 15] [--block 50]
"""

from __future__ import annotations

import argparse
import hashlib
import threading
import tracemalloc
import urllib.parse
from pathlib import Path
from typing import Callable, Dict, List

import _bench as b
import requests

SERVER = Path(__file__).resolve().parents[1] / "tests" / "support" / "sandbox_server.py"
PORT = 8000


def main() -> None:
    ap = argparse.ArgumentParser(description="forward vs the emulator's relay")
    ap.add_argument("--rounds", type=int, default=15, help="measured rounds (default 15)")
    ap.add_argument("--block", type=int, default=50, help="requests per block (default 50)")
    args = ap.parse_args()

    with b.on_emulator("bn-fwd") as (ep, provider, (h,)):
        provider.write_file(h, "/workspace/sandbox_server.py", SERVER.read_bytes())
        provider.start(h, f"python3 /workspace/sandbox_server.py {PORT}")
        url = provider.url(h, PORT)
        host = urllib.parse.urlsplit(url).netloc
        relay_base = ep.sandbox_url
        for _ in range(300):
            try:
                r = requests.get(relay_base + "/hello", headers={"Host": host}, timeout=2)
                if r.status_code == 200:
                    break
            except requests.RequestException:
                pass
            threading.Event().wait(0.1)
        with provider.forward(h, PORT) as local, requests.Session() as direct, \
                requests.Session() as through:

            def relay_block() -> None:
                for _ in range(args.block):
                    assert direct.get(relay_base + "/hello", headers={"Host": host},
                                      timeout=10).text == "hello\n"

            def forward_block() -> None:
                for _ in range(args.block):
                    assert through.get(local + "/hello", timeout=10).text == "hello\n"

            contenders: Dict[str, Callable[[], object]] = {
                "emulator relay": relay_block,
                "forward": forward_block,
            }
            res = b.interleaved(contenders, args.rounds, warmup=2)

            errors: List[BaseException] = []

            def one() -> None:
                try:
                    if requests.get(local + "/hello", timeout=60).text != "hello\n":
                        errors.append(AssertionError("wrong answer"))
                except requests.RequestException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=one) for _ in range(100)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)

            threads_before = b.thread_count()
            tracemalloc.start()
            digest = hashlib.sha256()
            with requests.get(local + "/big?mib=10", stream=True, timeout=60) as resp:
                for piece in resp.iter_content(1 << 16):
                    digest.update(piece)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()

    med = {k: b.median(v) / args.block for k, v in res.items()}
    rows = [[k, b.ms(med[k]), b.ms(b.p95(v) / args.block)] for k, v in res.items()]
    print(b.table(f"one request (GET /hello, kept-alive) on loopback, {args.rounds} rounds "
                  f"of {args.block}", ["contender", "median ms", "p95 ms"], rows))
    print(f"forward adds {(med['forward'] - med['emulator relay']) * 1000:.3f} ms per request "
          f"to the emulator's relay ({med['forward'] / med['emulator relay']:.2f}x; goal: "
          "<= 1 ms)")
    print(f"100 concurrent requests through forward: {len(errors)} errors (goal: 0)")
    print(f"10 MiB through forward: client peak traced memory {peak / (1 << 20):.2f} MiB, "
          f"{threads_before} threads in this process while streaming")


if __name__ == "__main__":
    main()
