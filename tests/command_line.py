"""Running the command line (``python -m e2b_provider``) as a child process, for its tests: the
words that start it, SIGINT as in a terminal, an environment that points it at an emulator, a
run to its end or in the background, and the hook that stalls an import."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any, Dict, Iterator, Tuple, Union

CLI = [sys.executable, "-m", "e2b_provider"]
SCRIPT = os.path.join(os.path.dirname(sys.executable), "e2b-provider")

#: Put on PYTHONPATH (as sitecustomize), this makes the import of the module named by
#: $CLI_TEST_STALL_IMPORT wait for a signal, after saying so on stderr: a Ctrl-C then lands
#: while the command line is still importing, every time.
STALL_IMPORT = """
import os, signal, sys
_name = os.environ.pop("CLI_TEST_STALL_IMPORT", "")

class _Stall:
    def find_spec(self, name, path=None, target=None):
        if name == _name:
            sys.meta_path.remove(self)
            os.write(2, b"stalled importing " + name.encode() + b"\\n")
            while True:
                signal.pause()
        return None

if _name:
    sys.meta_path.insert(0, _Stall())
"""


def default_sigint() -> None:
    # As in a terminal, also when this test run was started with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli_env(emu: Any, *, drop: Tuple[str, ...] = ("E2B_",), **extra: str) -> Dict[str, str]:
    """Our environment without the variables starting with ``drop``, pointed at the emulator
    ``emu`` (template ``base``, unbuffered output), plus ``extra``."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    e.update(
        E2B_API_URL=emu.api_url,
        E2B_SANDBOX_URL=emu.sandbox_url,
        E2B_API_KEY=emu.api_key,
        E2B_TEMPLATE="base",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return e


def run(
    env: Dict[str, str],
    *args: str,
    stdin: Union[str, bytes, None] = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """The command line to its end; ``stdin`` is what it reads (None: /dev/null, not ours)."""
    return subprocess.run(
        [*CLI, *args],
        env=env,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=not isinstance(stdin, bytes),
        timeout=timeout,
        preexec_fn=default_sigint,
    )


@contextlib.contextmanager
def started(env: Dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    """The command line running in the background with piped output, reading /dev/null (a
    non-terminal stdin is forwarded to the command); killed if still running, its pipes closed."""
    with subprocess.Popen(
        [*CLI, *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    ) as child:
        try:
            yield child
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
