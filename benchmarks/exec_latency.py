"""Latency of a trivial command, three ways, against one local emulator in the same run.

- provider: ``E2BSandboxProvider.exec(h, "true")`` (lease + wrapper + stream + escalation)
- sdk:      the official SDK's ``Sandbox.commands.run("true")`` on a sandbox it connected to
- floor:    one bare ``requests`` ``process.Process/Start`` stream of ``/bin/true`` with no
            provider logic (the HTTP + envd floor)
- wrapped:  the same bare stream, running the reference's in-sandbox wrapper
            (``setsid`` → ``sh`` pid file → ``timeout -s KILL`` → ``bash -c true``) that every
            provider exec runs so its tree can be killed: the floor for that command line

Prints median and p95 for each and the ratios provider/floor and provider/sdk.

    python benchmarks/exec_latency.py [--runs 200]
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import time
from typing import Callable, List

import requests

from e2b_provider import E2BSandboxProvider
from e2b_provider._connect import EndStream, EnvelopeDecoder, encode_envelope
from e2b_provider._scripts import control_path, exec_args
from e2b_provider.emulator import Emulator


def measure(fn: Callable[[], None], runs: int, warmup: int = 10) -> List[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def p95(xs: List[float]) -> float:
    return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()

    with Emulator() as emu, E2BSandboxProvider(emu.config(template="base")) as provider:
        h = provider.create("bench-exec-latency")
        try:
            target = provider._attach(h.id, None)  # the same envd the provider talks to
            session = requests.Session()
            headers = {
                "E2b-Sandbox-Id": target.sandbox_id,
                "E2b-Sandbox-Port": "49983",
                "X-Access-Token": target.access_token,
                "Content-Type": "application/connect+json",
                "Connect-Protocol-Version": "1",
                "Authorization": "Basic " + base64.b64encode(b"sandbox:").decode(),
            }
            body = encode_envelope({"process": {"cmd": "/bin/true", "args": []}, "stdin": False})
            wrapped_body = encode_envelope(
                {
                    "process": {
                        "cmd": "setsid",
                        "args": exec_args(control_path(None), "true", 30.0),
                        "envs": {"HOME": "/workspace", "LANG": "C.UTF-8"},
                        "cwd": "/workspace",
                    },
                    "stdin": False,
                }
            )

            def floor(body: bytes = body) -> None:
                with session.post(
                    f"{target.url}/process.Process/Start",
                    data=body,
                    headers=headers,
                    stream=True,
                    timeout=(10, 60),
                ) as r:
                    dec = EnvelopeDecoder()
                    while True:
                        chunk = r.raw.read1(65536)
                        if not chunk:
                            break
                        dec.feed(chunk)
                        if any(isinstance(m, EndStream) for m in dec):
                            break

            def via_provider() -> None:
                r = provider.exec(h, "true", timeout=30.0)
                assert r.exit_code == 0

            os.environ.update(emu.sdk_env())
            from e2b import Sandbox

            sdk_box = Sandbox.connect(h.id)

            def via_sdk() -> None:
                sdk_box.commands.run("true")

            results = {
                "floor": measure(floor, args.runs),
                "wrapped": measure(lambda: floor(wrapped_body), args.runs),
                "provider": measure(via_provider, args.runs),
                "sdk": measure(via_sdk, args.runs),
            }
        finally:
            provider.destroy(h)

    print(f"exec('true') latency over {args.runs} runs (same emulator, same run)")
    for name, xs in results.items():
        print(
            f"  {name:9s} median {statistics.median(xs) * 1000:7.2f} ms"
            f"   p95 {p95(xs) * 1000:7.2f} ms"
        )
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"  ratio provider/floor (median): {med['provider'] / med['floor']:.2f}")
    print(
        f"  ratio provider/wrapped (median, the library's own overhead): "
        f"{med['provider'] / med['wrapped']:.2f}"
    )
    print(f"  ratio provider/sdk   (median): {med['provider'] / med['sdk']:.2f}")
    print(
        f"  ratio provider/floor (p95):    {p95(results['provider']) / p95(results['floor']):.2f}"
    )
    print(f"  ratio provider/sdk   (p95):    {p95(results['provider']) / p95(results['sdk']):.2f}")


if __name__ == "__main__":
    main()
