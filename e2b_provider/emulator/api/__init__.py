"""The host-side API: the E2B control plane and envd front the clients talk to.

Runs in the emulator's server process (``python -m e2b_provider.emulator``), on the host, on
one aiohttp app and one TCP port. Modules: :mod:`.server` (:class:`~.server.EmulatorServer`:
the app, dispatch and shutdown), :mod:`.sandboxes` (:class:`~.sandboxes.SandboxHost`: the
sandbox table and lifecycle), :mod:`.admin` (the ``/_emulator/`` routes), :mod:`.request_log`
(the bounded request log), :mod:`.control` (E2B's REST API),
:mod:`.proxy` (the sandbox front: edge answers, token checks, streaming proxy to each sandbox's
agent), :mod:`.ports` (the relay to a sandbox's own ports: HTTP/1.1 and WebSockets over
connections the agent makes inside and passes back), :mod:`.lifecycle` (the interface
control and proxy use to reach the server), :mod:`.state` (sandbox records and pure request
helpers), :mod:`.metrics` and :mod:`.logs` (a sandbox's metrics samples and log entries),
:mod:`.faults` (fault injection), :mod:`.volumes` (the team's volumes and their
control-plane routes), :mod:`.volume_content` (the volume content API) and
:mod:`.volume_files` (a volume's files, reached safely).
It drives sandboxes through :mod:`e2b_provider.emulator.runtime` and talks to the agent inside
them only over its unix sockets; the runtime and the agent never import this package. This
``__init__`` imports nothing, so :mod:`.state` and :mod:`.faults` load without aiohttp.
"""
