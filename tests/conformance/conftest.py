"""The official ``e2b`` SDK needs Python 3.11+; on older Pythons this directory is not run.
The SDK is imported by the tests only, never here, so this file loads on every Python.

On Python 3.9 and 3.10 the SDK cannot be installed (the test extra installs it only on 3.11+),
so these tests are skipped there with the reason printed in the summary. CI runs them on
3.11, where a missing SDK is an error, never a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TYPE_CHECKING, Any, Awaitable, Iterator, TypeVar

import pytest

from e2b_provider.emulator import Emulator

if TYPE_CHECKING:
    from e2b import Sandbox

T = TypeVar("T")

SDK_FLOOR = (3, 11)
REASON = (
    "SDK conformance tests not run: the official e2b SDK needs Python 3.11+, this is "
    f"{sys.version_info.major}.{sys.version_info.minor}"
)

if sys.version_info < SDK_FLOOR:
    collect_ignore_glob = ["test_*.py"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if sys.version_info < SDK_FLOOR:
        terminalreporter.write_line(REASON, yellow=True)


@contextlib.contextmanager
def sdk_sandbox(**create: Any) -> Iterator[Sandbox]:
    """A sandbox the official SDK creates (``Sandbox.create(**create)``; the SDK pointed at
    the emulator by the ``sdk`` fixture), killed at the end."""
    from e2b import Sandbox

    sb = Sandbox.create(**create)
    try:
        yield sb
    finally:
        sb.kill()


@pytest.fixture
def fresh(sdk: Emulator) -> Iterator[Sandbox]:
    """A sandbox of the test's own."""
    with sdk_sandbox(timeout=300) as sb:
        yield sb


def arun(coro: Awaitable[T]) -> T:
    """Run one async SDK scenario to its end on a fresh event loop."""

    async def main() -> T:
        return await coro

    return asyncio.run(main())
