"""Quickstart: create a sandbox, run commands, move a file, watch a timeout, clean up.

Runs against real E2B when E2B_API_KEY is set (and E2B_TEMPLATE names a template with a
``sandbox`` user, as built from the reference platform's Dockerfile); otherwise it starts the
local E2B emulator that ships with the package.

    python examples/quickstart.py
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Iterator

from e2b_provider import DeploymentConfig, E2BSandboxProvider, SandboxLimits


@contextlib.contextmanager
def deployment() -> Iterator[DeploymentConfig]:
    if os.environ.get("E2B_API_KEY"):
        print("using real E2B (E2B_API_KEY is set)")
        yield DeploymentConfig.from_env()
        return
    from e2b_provider.emulator import Emulator

    print("E2B_API_KEY is not set: starting the local E2B emulator ...")
    with Emulator() as emu:
        print(f"emulator ready at {emu.api_url}")
        yield emu.config(template="base")


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with deployment() as config, E2BSandboxProvider(config) as provider:
        t0 = time.monotonic()
        # No sizes requested: E2B gives every sandbox its template's (a request for others
        # is logged as a warning); the handle says what the sandbox has.
        sandbox = provider.create("quickstart", SandboxLimits())
        print(
            f"created sandbox {sandbox.id} in {time.monotonic() - t0:.2f} s: "
            f"{sandbox.cpu_count} CPUs, {sandbox.memory_mb} MiB memory, {sandbox.disk_mb} MiB disk"
        )
        try:
            r = provider.exec(sandbox, "echo hello from $(whoami) in $PWD; uname -s", timeout=30.0)
            print(f"exec -> exit {r.exit_code}: {r.stdout.strip()!r}")

            r = provider.exec(sandbox, "echo oops >&2; exit 3", timeout=30.0)
            print(f"non-zero exit is a result -> exit {r.exit_code}, stderr {r.stderr.strip()!r}")

            provider.write_file(sandbox, "/workspace/notes/hello.txt", "héllo, wörld\n".encode())
            content = provider.read_file(sandbox, "/workspace/notes/hello.txt")
            assert content is not None
            print(f"wrote and read back {content.data.decode()!r}")
            st = provider.stat(sandbox, "/workspace/notes")
            print(f"stat /workspace/notes -> {st}")
            r = provider.exec(sandbox, "ls -l /workspace/notes", timeout=30.0)
            print(r.stdout.strip())

            t0 = time.monotonic()
            r = provider.exec(sandbox, "sleep 600 & sleep 600; echo never", timeout=2.0)
            took = time.monotonic() - t0
            print(
                f"timeout enforced -> timed_out={r.timed_out} exit_code={r.exit_code}"
                f" after {took:.1f} s"
            )
            r = provider.exec(sandbox, "pgrep -c sleep || true", timeout=30.0)
            print(f"sleep processes left in the sandbox: {r.stdout.strip()}")

            r = provider.exec(
                sandbox,
                "head -c 5000000 /dev/zero | tr '\\0' x",
                max_output_bytes=1000,
                timeout=30.0,
            )
            print(f"output capped -> {len(r.stdout)} chars kept, truncated={r.truncated}")
        finally:
            provider.destroy(sandbox)
            print(f"destroyed sandbox {sandbox.id}")
    print("quickstart finished OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
