"""Connections to a warm sandbox are kept; aborted ones are closed; output past the cap is exact.

New connections are counted on the client side where urllib3 opens every TCP connection
(``HTTPConnection._new_conn``, also when a pooled connection object reconnects); the process's
open sockets are counted from ``/proc/self/fd`` (the emulator runs in another process, so
every socket here is a client's).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator, List

import pytest
import urllib3.connection

from e2b_provider import E2BSandboxProvider, SandboxHandle

pytestmark = pytest.mark.integration


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> Iterator[List[int]]:
    """A list that gets one entry per TCP connection opened while the test runs."""
    opened: List[int] = []
    real = urllib3.connection.HTTPConnection._new_conn

    def counting(self: Any) -> Any:
        opened.append(1)
        return real(self)

    monkeypatch.setattr(urllib3.connection.HTTPConnection, "_new_conn", counting)
    yield opened


def _open_sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def test_calls_on_a_warm_sandbox_open_no_new_connection(
    provider: E2BSandboxProvider, sandbox: SandboxHandle, connects: List[int]
) -> None:
    path = f"/workspace/keepalive-{uuid.uuid4().hex[:8]}.txt"
    assert provider.exec(sandbox, "true").exit_code == 0  # the first call connects
    assert len(connects) >= 1  # (the counter does count)
    connects.clear()
    for i in range(10):
        assert provider.exec(sandbox, f"echo {i}").stdout == f"{i}\n"
        provider.write_file(sandbox, path, b"x" * i)
        content = provider.read_file(sandbox, path)
        assert content is not None and content.data == b"x" * i
        st = provider.stat(sandbox, path)
        assert st is not None and st.size == i
    assert len(connects) <= 1


def test_timed_out_execs_leave_no_sockets_behind(
    emu: object, sandbox: SandboxHandle
) -> None:
    before = _open_sockets()
    with E2BSandboxProvider(emu.config(template="base")) as p:  # type: ignore[attr-defined]
        counts = []
        for _ in range(4):
            r = p.exec(sandbox, "sleep 30", timeout=1.0)
            assert r.timed_out and r.exit_code is None
            counts.append(_open_sockets() - before)
        # The aborted streams' sockets are closed at once; what stays is the pool (the
        # stream's and the kill job's connections at most), not one more per timeout.
        assert max(counts) <= 3, counts
    # none of this provider's is left; the module's shared provider (whose sockets were
    # counted in ``before``) may close a pooled connection meanwhile, never open one here
    assert _open_sockets() <= before


def test_output_past_the_cap_is_exact(
    provider: E2BSandboxProvider, sandbox: SandboxHandle, connects: List[int]
) -> None:
    provider.exec(sandbox, "true")
    connects.clear()
    many = "head -c 200000 /dev/zero | tr '\\0' a"  # several output events
    r = provider.exec(sandbox, many, max_output_bytes=200000)
    assert (r.exit_code, len(r.stdout), r.truncated) == (0, 200000, False)
    r = provider.exec(sandbox, many, max_output_bytes=199999)
    assert (r.exit_code, len(r.stdout), r.truncated) == (0, 199999, True)
    both = "head -c 70000 /dev/zero | tr '\\0' o; head -c 70000 /dev/zero | tr '\\0' e >&2"
    r = provider.exec(sandbox, both, max_output_bytes=140000)
    assert (len(r.stdout), len(r.stderr), r.truncated) == (70000, 70000, False)
    r = provider.exec(sandbox, both, max_output_bytes=139999)
    assert len(r.stdout) + len(r.stderr) == 139999 and r.truncated
    # Far past the cap: skipped unparsed, the exit status still found.
    r = provider.exec(
        sandbox, "head -c 30000000 /dev/zero; echo; echo tail >&2; exit 3", max_output_bytes=1000
    )
    assert (r.exit_code, len(r.stdout), r.stderr, r.truncated) == (3, 1000, "", True)
    assert len(connects) == 0  # the capped streams were read to their end and kept
