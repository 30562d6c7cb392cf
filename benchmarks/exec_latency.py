"""Latency of a trivial command on loopback, five ways, against one local emulator.

- provider:  ``E2BSandboxProvider.exec(h, "true")`` (everything the library does per exec)
- sdk:       the official SDK's ``Sandbox.commands.run("true")`` on a sandbox it connected to
- floor:     one bare ``requests`` ``process.Process/Start`` stream of ``/bin/true`` over a
             kept connection, with no provider logic (the HTTP + envd floor)
- wrapped:   the same bare stream sending the request every exec sends: the library's
             in-sandbox wrapper (``setsid`` -> ``sh`` writing a pid file -> ``timeout -s
             KILL`` -> ``bash -c true``) with the exec's environment; the floor for that
             command line, so ``provider x wrapped`` is the library's own overhead
- reference: the same bare stream running the reference plugin's wrapper, copied below, with
             the reference's environment (``LANG=C.UTF-8`` for every program of the
             wrapper, which then removes its pid file before it exits): what every exec
             cost before the wrapper the library sends now

Contenders are interleaved call by call (order rotated). Prints median and p95 of each and
the ratios of the provider's median to the others'.

    python benchmarks/exec_latency.py [--runs 200]
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any, Callable, Dict, List

import _bench as b

from e2b_provider.protocol import scripts as scripts

#: The reference plugin's exec wrapper (``$1`` control path, ``$2`` command, ``$3`` seconds).
REFERENCE_WRAPPER = (
    'c=$1; echo $$ > "$c.pid" 2>/dev/null; if [ -e "$c.kill" ]; then exit 137; fi; '
    'timeout -s KILL "$3" /bin/bash -c "$2"; s=$?; rm -f "$c.pid"; exit $s'
)
#: The environment every exec's command sees (the reference's).
EXEC_ENV = {"HOME": "/workspace", "LANG": "C.UTF-8"}
#: issue 7's goal, as revised: provider median at most this times the SDK's
GOAL = 1.2


def start(floor: b.RawEnvd, args: List[str], envs: Dict[str, str], tag: str) -> int:
    """One bare ``Start`` of ``setsid args`` as the provider sends it; its exit code."""
    msg: Dict[str, Any] = {
        "process": {"cmd": "setsid", "args": args, "envs": envs, "cwd": "/workspace"},
        "stdin": False,
        "tag": tag,
    }
    r = floor.session.post(
        f"{floor.ep.sandbox_url}/process.Process/Start",
        data=b.envelope(msg),
        headers=floor.rpc_headers(),
        timeout=(10, 600),
    )
    r.raise_for_status()
    for _flags, m in b.frames(r.content):
        end = m.get("event", {}).get("end")
        if end is not None:
            return int(end.get("exitCode", 0))
    raise RuntimeError("Start stream ended without an end event")


def main() -> None:
    ap = argparse.ArgumentParser(
        description="exec('true') latency on loopback: provider vs official SDK vs bare floor."
    )
    ap.add_argument("--runs", type=int, default=200, help="measured calls each (default 200)")
    args = ap.parse_args()

    with b.on_emulator("bn-exec-latency") as (ep, provider, (h,)):
        sdk = b.sdk_connect(ep, h.id)
        floor = b.RawEnvd(ep, h.id)

        def wrapped() -> None:
            ctl = scripts.control_path()
            argv = scripts.exec_args(ctl, "true", 60.0, EXEC_ENV)
            if start(floor, argv, scripts.exec_env(EXEC_ENV, ctl), ctl) != 0:
                raise AssertionError("wrapped: exit code")

        def reference() -> None:
            ctl = f"/tmp/.bn-exec-{uuid.uuid4()}"
            argv = ["-w", "/bin/sh", "-c", REFERENCE_WRAPPER, "bn-exec", ctl, "true", "65"]
            if start(floor, argv, dict(EXEC_ENV, CAPYBARA_EXEC=ctl), ctl) != 0:
                raise AssertionError("reference: exit code")

        contenders: Dict[str, Callable[[], object]] = {
            "provider": lambda: provider.exec(h, "true"),
            "sdk": lambda: sdk.commands.run("true"),
            "floor": lambda: floor.start("/bin/true"),
            "wrapped": wrapped,
            "reference": reference,
        }
        results = b.interleaved(contenders, args.runs, warmup=10)

    med = {k: b.median(v) for k, v in results.items()}
    rows = [
        [name, b.ms(med[name]), b.ms(b.p95(xs)), b.ratio(med["provider"], med[name])]
        for name, xs in results.items()
    ]
    print(
        b.table(
            f"exec('true') latency on loopback, {args.runs} interleaved calls each",
            ["contender", "median ms", "p95 ms", "provider x this"],
            rows,
        )
    )
    ok = med["provider"] <= GOAL * med["sdk"]
    print(
        "provider x wrapped = the library's own overhead over the command line it sends; "
        f"goal: provider <= {GOAL}x sdk: {'ok' if ok else 'not met'}"
    )


if __name__ == "__main__":
    main()
