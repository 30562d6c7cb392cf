"""What the scripted control plane of the client tests is asked and answers: the sandbox id
the tests name, its connect path, and the sandbox a connect returns.

Imported by plain name, as ``server`` and ``envd_wire`` are.
"""

from __future__ import annotations

from typing import Any, Dict

from server import ACCESS_TOKEN

__all__ = ["CONNECT", "SANDBOX", "SID"]

#: The sandbox the tests ask the control plane about.
SID = "iabcdefghij0123456789"
CONNECT = f"/v2/sandboxes/{SID}/connect"
#: The sandbox as a connect (or a create) answers it.
SANDBOX: Dict[str, Any] = {
    "sandboxID": SID,
    "templateID": "base",
    "clientID": "6532622b",
    "envdVersion": "0.6.13",
    "envdAccessToken": ACCESS_TOKEN,
    "domain": "e2b.test",
}
