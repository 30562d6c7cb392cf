"""The emulator's ``code-interpreter-v1`` template: E2B's base plus the code-interpreter
server on port 49999, as a service PID 1 keeps running (E2B runs it under systemd, restarted
when it exits).

This module owns the service's command line: the template environment's interpreter (see
:mod:`.environment`) runs :mod:`.server` straight from this package's files, without the
package's own dependencies on its path and without ``PYTHONPATH`` (``-I``), so the kernels
it starts see the template's packages only. Pure: builds a value.
"""

from __future__ import annotations

import os
from typing import Optional

from ...protocol.code_output import CODE_INTERPRETER_PORT as PORT
from ..runtime.spec import Service
from .environment import find

__all__ = ["code_interpreter_service"]

#: Where contexts run unless told otherwise.
DEFAULT_CWD = "/home/user"

#: Runs the server from the package's files: each parent package is an empty module whose
#: path is the package's folder, so no ``__init__`` (and no dependency of the library) runs.
_LOADER = """\
import importlib.machinery, importlib.util, os, sys
root = sys.argv[1]
for name in ("e2b_provider", "e2b_provider.emulator", "e2b_provider.emulator.interpreter"):
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [os.path.join(root, *name.split(".")[1:])]
    sys.modules[name] = importlib.util.module_from_spec(spec)
from e2b_provider.emulator.interpreter.server import main
main(sys.argv[2:])
"""


def code_interpreter_service(directory: Optional[str] = None) -> Service:
    """The template's server as a service of a sandbox.

    Args:
        directory: the template's environment (default: :func:`.environment.default_dir`).

    Raises:
        CodeEnvMissing: the environment is not built (the message names the command).
    """
    env = find(directory)
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return Service(
        name="code-interpreter",
        argv=(env.python, "-I", "-c", _LOADER, package,
              "--host", "0.0.0.0", "--port", str(PORT), "--cwd", DEFAULT_CWD),
        env={"MPLBACKEND": "module://matplotlib_inline.backend_inline"},
        cwd="/root",
        ready_port=PORT,
        binds=(*env.binds, package),
    )
