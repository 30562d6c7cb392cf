"""Against real E2B: runs only with E2B_API_KEY and E2B_TEMPLATE set (CI has no E2B account).

The template must provide the reference platform's users (``sandbox``, uid 1000) and tools.
"""

from __future__ import annotations

import os
import uuid

import pytest

from e2b_provider import DeploymentConfig, E2BSandboxProvider, FileContent

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not (os.environ.get("E2B_API_KEY") and os.environ.get("E2B_TEMPLATE")),
        reason="live E2B tests need E2B_API_KEY and E2B_TEMPLATE (no E2B account in CI)",
    ),
]


def test_live_roundtrip() -> None:
    with E2BSandboxProvider(DeploymentConfig.from_env()) as p:
        h = p.create(f"live-{uuid.uuid4().hex[:8]}")
        try:
            r = p.exec(h, "id -un; pwd", timeout=60.0)
            assert r.exit_code == 0 and r.stdout.split() == ["sandbox", "/workspace"]
            r = p.exec(h, "sleep 600 & sleep 600", timeout=2.0)
            assert r.timed_out and r.exit_code is None
            p.write_file(h, "/workspace/live.txt", b"live")
            assert p.read_file(h, "/workspace/live.txt") == FileContent(b"live", False)
            p.suspend(h)
            assert p.resume(h) == "resumed"
        finally:
            p.destroy(h)
        assert p.resume(h) == "gone"
