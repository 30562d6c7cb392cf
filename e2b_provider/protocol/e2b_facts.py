"""Numbers E2B fixes for every client, shared by the library and the emulator.

This module owns the facts of E2B's platform that are not a grammar or a message shape: the
port envd listens on in every sandbox, and the longest lifetime a sandbox may be given.
"""

from __future__ import annotations

__all__ = ["ENVD_PORT", "MAX_TIMEOUT_SECONDS", "TRAFFIC_TOKEN_HEADER"]

#: The port envd listens on in every sandbox (``49983-<sandbox id>.<domain>``); E2B's edge
#: needs no traffic token for it.
ENVD_PORT = 49983
#: The longest sandbox lifetime (``timeout``) E2B accepts: 24 hours.
MAX_TIMEOUT_SECONDS = 86400
#: The header E2B's edge wants on a port of a sandbox whose traffic is private.
TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"
