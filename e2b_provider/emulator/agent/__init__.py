"""The envd agent: runs inside each sandbox, as root, and speaks envd's API on a unix socket.

Started by the sandbox's PID 1 (:mod:`e2b_provider.emulator.runtime.init`) as ``python -m
e2b_provider.emulator.agent`` (see :mod:`.__main__`), with the host's ``e2b_provider`` package
and ``aiohttp`` bound read-only into the sandbox; it also runs directly on a host (as root) for
its own tests. Modules: :mod:`.app` (routes, ``/init``, ``/health``, process lifetime),
:mod:`.process` (the ``process.Process`` service's processes; their requests
:mod:`.process_requests`, launch :mod:`.process_spawn`, output :mod:`.process_output`, exit
statuses :mod:`.process_exit`), :mod:`.filesystem` (the
``filesystem.Filesystem`` service), :mod:`.files` (``GET``/``POST /files``), :mod:`.rpc`
(Connect plumbing, users, paths), :mod:`.journal` (its JSON log lines, the sandbox's logs),
:mod:`.ports` (the ports socket: connections to the sandbox's TCP ports, passed to the host).
Nothing here imports the host API (:mod:`e2b_provider.emulator.api`) or the runtime; this
``__init__`` imports nothing, so the agent's start loads only what it serves with.
"""
