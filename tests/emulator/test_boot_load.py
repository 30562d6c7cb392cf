"""Creates on a loaded host wait for their boot rather than fail.

Thirty-two creates at once across two emulators, while busy loops hold every core of the
machine: each emulator boots a few sandboxes at a time (the others wait their turn) and waits
for a boot by its progress, not by a fixed wall deadline, so every create succeeds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List, Tuple

import pytest

from e2b_provider import E2BSandboxProvider, SandboxHandle
from e2b_provider.emulator import Emulator

pytestmark = pytest.mark.integration

#: Creates at once, spread over the two emulators.
CREATES = 32
#: Busy loops per core of this process's CPU set.
BURNERS_PER_CPU = 1


@pytest.fixture
def burners() -> Iterator[List[subprocess.Popen[bytes]]]:
    """Busy loops pinned to this process's CPUs, one a core, stopped at the end."""
    procs: List[subprocess.Popen[bytes]] = []
    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            for _ in range(BURNERS_PER_CPU):
                p = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                     stdin=subprocess.DEVNULL)
                procs.append(p)
                os.sched_setaffinity(p.pid, {cpu})
        yield procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait(10)


def test_concurrent_creates_on_two_loaded_emulators_all_boot(burners: List[object]) -> None:
    with Emulator() as first, Emulator() as second, \
            E2BSandboxProvider(first.config(template="base")) as a, \
            E2BSandboxProvider(second.config(template="base")) as b:
        providers = [a, b]
        made: List[Tuple[E2BSandboxProvider, SandboxHandle]] = []

        def create(i: int) -> Tuple[E2BSandboxProvider, SandboxHandle]:
            p = providers[i % 2]
            return p, p.create(f"load-{i}")

        errors: List[BaseException] = []
        with ThreadPoolExecutor(CREATES) as pool:
            for fut in [pool.submit(create, i) for i in range(CREATES)]:
                try:
                    made.append(fut.result())
                except Exception as exc:  # every failure is reported, not just the first
                    errors.append(exc)
        try:
            assert errors == [], f"{len(errors)} of {CREATES} creates failed: {errors[:3]}"
            assert len(made) == CREATES
            for p, h in made[:2]:  # the sandboxes work
                assert p.exec(h, "echo ok", timeout=60.0).stdout == "ok\n"
        finally:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda ph: ph[0].destroy(ph[1]), made))
