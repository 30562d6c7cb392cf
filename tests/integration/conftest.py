"""Fixtures for provider integration tests: a provider bound to the session's emulator."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from e2b_provider import E2BSandboxProvider, SandboxHandle


@pytest.fixture
def provider(emu) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emu.config(template="base")) as p:
        yield p


@pytest.fixture(scope="module")
def shared_provider(emulator) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emulator.config(template="base")) as p:
        yield p


@pytest.fixture(scope="module")
def sandbox(shared_provider: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    h = shared_provider.create(f"it-{uuid.uuid4().hex[:8]}")
    yield h
    shared_provider.destroy(h)


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
