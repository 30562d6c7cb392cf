"""A local E2B: control plane + envd on one port, with real namespace-isolated sandboxes.

Start it from Python with :class:`Emulator` (a subprocess running
``python -m e2b_provider.emulator``), or from a shell with that command. Importing this
package needs only the standard library; the server itself needs the ``emulator`` extra
(aiohttp). Layout: ``server`` (app, lifecycle, admin routes), ``control`` (REST API),
``proxy`` (envd front), ``state`` (records, paging), ``faults`` (fault injection),
``runtime``/``init`` (sandbox namespaces), ``agent`` (the envd look-alike inside a sandbox),
``handle`` (this package's :class:`Emulator`).
"""

from .handle import Emulator, EmulatorError, EmulatorUnavailable

__all__ = ["Emulator", "EmulatorError", "EmulatorUnavailable"]
