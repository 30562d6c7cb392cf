"""Fixtures for tests in a real browser (headless Chromium, see :mod:`browser.chromium`).

* ``chromium_binary`` (session): the browser's path. Without one the tests are skipped, with
  the reason printed, except in CI (``CI`` set): there a missing browser is an error (``./dev``
  installs the Debian package ``chromium`` as root).
* ``browser`` (function): ``browser(url, timeout=60.0)``, a context manager yielding a
  :class:`~browser.chromium.Page` with ``url`` loaded; failure artifacts are named after the
  test.
* ``shared_provider``, ``sandbox``: the integration tests' provider against the session's
  emulator and a sandbox of it (module-scoped), from ``tests/integration/conftest.py``.
"""

from __future__ import annotations

import os
from typing import ContextManager

import pytest
from integration.conftest import sandbox, shared_provider

from browser.chromium import CANDIDATES, OpenPage, Page, find_chromium, open_page

__all__ = ["browser", "chromium_binary", "sandbox", "shared_provider"]

@pytest.fixture(scope="session")
def chromium_binary() -> str:
    path = find_chromium()
    if path is None:
        reason = (f"no headless browser: none of {', '.join(CANDIDATES)} is on PATH "
                  "(./dev installs the Debian package chromium when run as root)")
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the browser tests", pytrace=False)
        pytest.skip(reason=reason)
    return path


@pytest.fixture
def browser(request: pytest.FixtureRequest, chromium_binary: str) -> OpenPage:
    def open_(url: str, timeout: float = 60.0) -> ContextManager[Page]:
        return open_page(url, name=request.node.name, timeout=timeout, binary=chromium_binary)

    return open_
