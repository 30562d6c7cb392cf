"""Fixtures for the transport, control-plane and envd client tests (real sockets, 127.0.0.1).

``tests/http`` is deliberately not a package: as a package rooted at ``tests/`` (which has no
``__init__.py``) it would be imported as ``http`` and shadow the standard library's ``http``.
Its helpers live in ``server.py``, imported by plain name.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from server import ScriptedServer

from e2b_provider.transport.client import Transport


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def transport() -> Iterator[Transport]:
    t = Transport(pool_connections=4, pool_maxsize=8, connect_timeout=2.0)
    try:
        yield t
    finally:
        t.close()

