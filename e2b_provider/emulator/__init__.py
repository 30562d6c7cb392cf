"""A local E2B: control plane + envd on one port, with real namespace-isolated sandboxes.

Start it from Python with :class:`Emulator` (a subprocess running
``python -m e2b_provider.emulator``), or from a shell with that command. Importing this
package needs only the standard library; the server itself needs the ``emulator`` extra
(aiohttp).

Layout, by where the code runs:

* :mod:`.handle` (:class:`Emulator`) — in the user's process: starts and stops the server;
* :mod:`.__main__` — the server process's command line (ready line, signals, state dir);
* :mod:`.api` — in the server process: control plane, envd front, sandbox state, faults;
* :mod:`.runtime` — in the server process, on the host: each sandbox's namespaces, cgroups
  and boot; its :mod:`.runtime.init` runs inside the sandbox as PID 1;
* :mod:`.agent` — inside each sandbox: the envd look-alike agent.

Imports point one way: ``api`` → ``runtime``; ``agent`` and ``runtime`` never import ``api``.
"""

from .handle import Emulator, EmulatorError, EmulatorUnavailable

__all__ = ["Emulator", "EmulatorError", "EmulatorUnavailable"]
