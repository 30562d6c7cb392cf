"""Fixtures of the SDK conformance tests.

* ``sdk`` (module): the session's emulator, with the official SDK pointed at it through the
  environment (``Emulator.sdk_env()``: ``E2B_API_KEY``, ``E2B_API_URL``, ``E2B_SANDBOX_URL``,
  ``E2B_DOMAIN``) for the module's tests.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from e2b_provider.emulator import Emulator


@pytest.fixture(scope="module")
def sdk(emulator: Emulator) -> Iterator[Emulator]:
    """Point the SDK at the emulator for this module (environment variables)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in emulator.sdk_env().items():
            mp.setenv(key, value)
        yield emulator
