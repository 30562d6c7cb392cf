"""A provider made before os.fork keeps working in the child (multiprocessing, servers)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import attrs
import pytest

from e2b_provider import SandboxHandle

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from e2b_provider import DeploymentConfig, E2BSandboxProvider
    p = E2BSandboxProvider(DeploymentConfig(**json.loads(sys.argv[1])))
    assert p.exec(sys.argv[2], "true", timeout=30.0).exit_code == 0  # threads + pools in use
    pid = os.fork()
    if pid == 0:
        t0 = time.monotonic()
        r = p.exec(sys.argv[2], "sleep 20", timeout=1.0)
        took = time.monotonic() - t0
        ok = r.timed_out and r.exit_code is None and took < 10 and p.exec(
            sys.argv[2], "echo child", timeout=30.0).stdout == "child\\n"
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert p.exec(sys.argv[2], "echo parent", timeout=30.0).stdout == "parent\\n"
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


def test_provider_survives_fork(emu, sandbox: SandboxHandle) -> None:  # type: ignore[no-untyped-def]
    cfg = json.dumps(attrs.asdict(emu.config(template="base")))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, cfg, sandbox.id], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
