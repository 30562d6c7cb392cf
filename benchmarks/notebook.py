"""Issue 9's goal figures, in a real Jupyter kernel that starts the local emulator itself.

* **Interrupt:** in one kernel (the example notebook's set-up: ``Emulator().start()`` inside
  the kernel, a provider, one sandbox), ``--runs`` times: run ``exec("echo started; sleep
  300")``, interrupt the kernel once ``started`` arrived (SIGINT to the kernel's process
  group, as Jupyter's *Interrupt* does), and time until the cell ends with
  ``KeyboardInterrupt``; then check, in the next cell, that no ``sleep`` is left in the
  sandbox and that the emulator and sandbox still answer. The official SDK's
  ``commands.run`` gets the same treatment (``--sdk-runs``, interleaved with ours) on a
  sandbox of the same emulator, as the baseline: it re-raises at once and leaves its
  ``sleep`` running, so its "nothing left" count is the figure to compare, not its time.
* **Live output:** a command prints its own clock (``date +%s.%N``) every 0.2 s; the
  ``on_stdout`` callback in the kernel takes the difference to the kernel's clock (one host,
  one clock): how long printed output takes to be visible. The SDK's ``on_stdout`` is
  measured the same way.

    python benchmarks/notebook.py [--runs 10] [--sdk-runs 2] [--lines 25]
"""

from __future__ import annotations

import argparse
import ast
import os
import queue
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import _bench as b
from jupyter_client.manager import KernelManager

SETUP = """
import time
from e2b_provider import E2BSandboxProvider
from e2b_provider.emulator import Emulator
from e2b import Sandbox
emulator = Emulator().start()
provider = E2BSandboxProvider(emulator.config(template="base"))
sandbox = provider.create("notebook-bench")
sdk = Sandbox.create(template="base", **{
    "api_key": emulator.api_key, "api_url": emulator.api_url,
    "sandbox_url": emulator.sandbox_url, "domain": emulator.domain})

class Late:
    def __init__(self):
        self.buf, self.lags = "", []
    def __call__(self, text):
        now = time.time()
        self.buf += text
        *lines, self.buf = self.buf.split("\\n")
        self.lags += [now - float(x) for x in lines if x.strip()]

def show(text):
    print(text, end="", flush=True)

print("ready")
"""

LONG = {
    "provider": 'provider.exec(sandbox, "echo started; sleep 300", timeout=600, on_stdout=show)',
    "sdk": 'sdk.commands.run("echo started; sleep 300", timeout=600, on_stdout=show)',
}
LEFT = {
    "provider": 'print(provider.exec(sandbox, "pgrep -x sleep || echo nothing left").stdout)',
    "sdk": 'print(sdk.commands.run("pgrep -x sleep || echo nothing left").stdout)',
}
LIVE = {
    "provider": "late = Late(); provider.exec(sandbox, {cmd!r}, on_stdout=late); "
    "print(repr(late.lags))",
    "sdk": "late = Late(); sdk.commands.run({cmd!r}, on_stdout=late); print(repr(late.lags))",
}


class Kernel:
    """One kernel: run a cell, collect its stream text, and its reply."""

    def __init__(self) -> None:
        self.km = KernelManager(kernel_name="python3")
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def send(self, code: str) -> str:
        return str(self.kc.execute(code, store_history=False, stop_on_error=False))

    def stream_until(self, msg_id: str, needle: str, timeout: float) -> str:
        """The cell's stream output, read until ``needle`` shows (or the cell goes idle)."""
        text = ""
        deadline = time.monotonic() + timeout
        while not needle or needle not in text:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {needle!r} within {timeout} s; got {text!r}")
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                text += msg["content"]["text"]
            elif msg["msg_type"] == "error":
                raise RuntimeError("".join(msg["content"]["traceback"])[-2000:])
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                if needle:
                    raise RuntimeError(f"the cell ended without {needle!r}: {text!r}")
                break
        return text

    def reply(self, msg_id: str, timeout: float) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_shell_msg(timeout=max(0.0, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return dict(msg["content"])

    def run(self, code: str, timeout: float = 120.0) -> str:
        """Run a cell to its end; its printed text (raises on an error)."""
        mid = self.send(code)
        reply = self.reply(mid, timeout)
        text = self.stream_until(mid, "", timeout)
        if reply["status"] != "ok":
            raise RuntimeError(f"cell {code[:60]!r} ended {reply}")
        return text

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def interrupt_round(k: Kernel, who: str) -> Tuple[float, bool, str]:
    """(seconds from the interrupt to the cell's end, ended by KeyboardInterrupt, left)."""
    mid = k.send(LONG[who])
    k.stream_until(mid, "started", 60)
    t0 = time.monotonic()
    k.km.interrupt_kernel()
    reply = k.reply(mid, 300)
    took = time.monotonic() - t0
    keyboard = reply.get("status") == "error" and reply.get("ename") == "KeyboardInterrupt"
    left = ""
    for _ in range(50):  # the SDK leaves its sleep running: say so, but go on
        left = k.run(LEFT[who]).strip()
        if left == "nothing left" or who == "sdk":
            break
    return took, keyboard, left


def live_round(k: Kernel, who: str, lines: int) -> List[float]:
    cmd = f"for i in $(seq {lines}); do date +%s.%N; sleep 0.2; done"
    out = k.run(LIVE[who].format(cmd=cmd))
    lags = ast.literal_eval(out.strip().splitlines()[-1])  # floats printed by repr()
    return [float(x) for x in lags]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="interrupts of our exec")
    ap.add_argument("--sdk-runs", type=int, default=2, help="interrupts of the SDK's run")
    ap.add_argument("--lines", type=int, default=25, help="timestamped lines per live run")
    args = ap.parse_args(argv)

    k = Kernel()
    try:
        assert "ready" in k.run(SETUP, timeout=180)
        ours: List[Tuple[float, bool, str]] = []
        theirs: List[Tuple[float, bool, str]] = []
        for i in range(max(args.runs, args.sdk_runs)):
            order = b.rotated(["provider", "sdk"], i)
            for who in order:
                if who == "provider" and i < args.runs:
                    ours.append(interrupt_round(k, who))
                    print(f"  provider interrupt {i + 1}: {ours[-1][0]:.2f} s, "
                          f"KeyboardInterrupt={ours[-1][1]}, {ours[-1][2]!r}", flush=True)
                if who == "sdk" and i < args.sdk_runs:
                    theirs.append(interrupt_round(k, who))
                    print(f"  SDK interrupt {i + 1}: {theirs[-1][0]:.2f} s, "
                          f"KeyboardInterrupt={theirs[-1][1]}, {theirs[-1][2]!r}", flush=True)
        alive = k.run('print(provider.exec(sandbox, "echo alive").stdout)').strip()
        lags: Dict[str, List[float]] = {"provider": [], "sdk": []}
        for i in range(2):
            for who in b.rotated(["provider", "sdk"], i):
                lags[who] += live_round(k, who, args.lines)
        k.run("sdk.kill(); provider.destroy(sandbox); provider.close(); emulator.stop()")
    finally:
        k.close()

    ok = sum(1 for t, kb, left in ours if kb and left == "nothing left" and t <= 2.0)
    rows = [
        ["interrupt → KeyboardInterrupt, median s", f"{b.median([r[0] for r in ours]):.2f}",
         f"{b.median([r[0] for r in theirs]):.2f}"],
        ["interrupt, max s", f"{max(r[0] for r in ours):.2f}",
         f"{max((r[0] for r in theirs), default=float('nan')):.2f}"],
        ["runs: ≤ 2 s, KeyboardInterrupt, nothing left", f"{ok} of {len(ours)}",
         f"{sum(1 for r in theirs if r[1] and r[2] == 'nothing left')} of {len(theirs)}"],
        ["emulator and sandbox alive after all", alive, ""],
        ["live output lag, median ms", f"{1000 * b.median(lags['provider']):.1f}",
         f"{1000 * b.median(lags['sdk']):.1f}"],
        ["live output lag, max ms", f"{1000 * max(lags['provider']):.1f}",
         f"{1000 * max(lags['sdk']):.1f}"],
    ]
    print()
    print(b.table("in a Jupyter kernel", ["figure", "provider", "official SDK"], rows))
    return 0 if ok == len(ours) and alive == "alive" else 1


if __name__ == "__main__":
    sys.exit(main())
