"""What the scripted envd of the client tests says and is asked: the sandbox id its client
targets, the process service's paths, and the Connect envelopes of a process stream.

The client itself is the ``envd`` fixture (``conftest.py``). Imported by plain name, as
``server`` is.
"""

from __future__ import annotations

import base64
from typing import Any, Dict

from server import Handler, Request, Responder

from e2b_provider.protocol.connect import encode_envelope

__all__ = ["CONNECT", "END_OK", "SID", "SIGNAL", "START", "b64", "ev", "started_then_silent"]

#: The sandbox the ``envd`` fixture's client targets.
SID = "isandbox0123456789abc"
START = "/process.Process/Start"
CONNECT = "/process.Process/Connect"
SIGNAL = "/process.Process/SendSignal"


def b64(data: bytes) -> str:
    """``data`` as a process event carries it (base64 text)."""
    return base64.b64encode(data).decode()


def ev(event: Dict[str, Any]) -> bytes:
    """One process event as a stream message."""
    return encode_envelope({"event": event})


#: The end of a stream that went well.
END_OK = encode_envelope({}, end_stream=True)


def started_then_silent(pid: int) -> Handler:
    """A process stream that starts process ``pid`` and then says nothing (for 30 s)."""

    def stall(q: Request, r: Responder) -> None:
        r.start_chunked()
        r.chunk(ev({"start": {"pid": pid}}))
        r.hold(timeout=30)

    return stall
