"""Fixtures for the transport, control-plane and envd client tests (real sockets, 127.0.0.1).

``tests/http`` is deliberately not a package: as a package rooted at ``tests/`` (which has no
``__init__.py``) it would be imported as ``http`` and shadow the standard library's ``http``.
Its helpers live in ``server.py``, ``envd_wire.py`` and ``control_wire.py``, imported by plain
name.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from envd_wire import SID
from server import ACCESS_TOKEN, ScriptedServer

from e2b_provider.clients.envd import EnvdClient
from e2b_provider.models import Target
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


@pytest.fixture
def envd(server: ScriptedServer, transport: Transport) -> Iterator[EnvdClient]:
    """An envd client of sandbox :data:`envd_wire.SID`, talking to ``server``."""
    yield EnvdClient(transport, Target(url=server.url, sandbox_id=SID, access_token=ACCESS_TOKEN))
