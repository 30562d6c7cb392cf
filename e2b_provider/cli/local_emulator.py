"""``e2b-provider emulator``: the local E2B emulator, as ``python -m e2b_provider.emulator``
runs it, that the other commands find while it serves (exit 0 once Ctrl-C or SIGTERM stopped
it, 1 when it cannot run here).

While it serves it keeps its record (:mod:`.emulator_record`: where it listens, its key), so
``e2b-provider create`` and the rest need no variable, as ``docker`` finds its local daemon;
the record goes when it stops. ``--detach`` (``-d``) runs it in the background, in a session
of its own, and returns once it serves, printing its pid (``kill PID`` stops it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import List

from ..emulator.__main__ import run
from ..emulator.handle import EXIT_UNAVAILABLE
from ..errors import ConfigError
from . import emulator_record
from .exits import EXIT_ERROR, PROG

#: How long ``--detach`` waits for the emulator to serve (its isolation check and first
#: boot included, on a loaded machine).
DETACH_START_SECONDS = 120.0
#: How long ``--detach`` waits for an emulator that did not come up to stop.
DETACH_STOP_SECONDS = 30.0
_POLL_SECONDS = 0.05
LOG_NAME = "emulator.log"


def cmd_emulator(args: argparse.Namespace) -> int:
    """``emulator``: run the emulator until it is stopped (``--detach``: in the background)."""
    if getattr(args, "detach", False):
        return _detach(args)

    def record(url: str, api_key: str) -> None:
        try:
            emulator_record.write({"api_key": api_key, "api_url": url, "sandbox_url": url,
                                   "template": "base"})
        except (OSError, ConfigError) as exc:
            print(f"{PROG} emulator: warning: the other commands will not find this "
                  f"emulator (use the lines on stdout): {exc}", file=sys.stderr, flush=True)

    # The same options, output and signal handling as python -m e2b_provider.emulator: the
    # export lines alone on stdout, the ready line on stderr; Ctrl-C and SIGTERM stop it.
    try:
        status = run(args, name=f"{PROG} emulator", on_ready=record)
    finally:
        emulator_record.remove()
    # "cannot run here" is a runtime error for this command line (2 is for usage errors)
    return EXIT_ERROR if status == EXIT_UNAVAILABLE else status


def _words(args: argparse.Namespace) -> List[str]:
    """The command line of the emulator ``--detach`` starts (the key is not on it: a
    command line is readable by every user of the machine)."""
    words = [sys.executable, "-m", "e2b_provider", "emulator", "--host", args.host,
             "--port", str(args.port), "--log-level", args.log_level]
    for flag in ("cpu_count", "memory_mb", "disk_mb", "max_processes"):
        words += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    if args.state_dir:
        words += ["--state-dir", args.state_dir]
    if args.remove_state_dir:
        words.append("--remove-state-dir")
    return words


def _detach(args: argparse.Namespace) -> int:
    """Start the emulator in a session of its own; return once its record says it serves."""
    directory = emulator_record.record_dir()
    emulator_record.private_dir(directory, create=True)
    log_path = os.path.join(directory, LOG_NAME)
    env = dict(os.environ)
    if args.api_key:
        env["E2B_EMULATOR_API_KEY"] = args.api_key
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        child = subprocess.Popen(_words(args), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=log, env=env,
                                 start_new_session=True)
    finally:
        os.close(log)
    try:
        deadline = time.monotonic() + DETACH_START_SECONDS
        while True:
            found = emulator_record.read()
            if found is not None and found["pid"] == str(child.pid):
                break
            if child.poll() is not None:
                print(f"{PROG} emulator: it stopped before it served (exit status "
                      f"{child.returncode}); its log, {log_path}:", file=sys.stderr)
                with open(log_path, encoding="utf-8", errors="replace") as f:
                    sys.stderr.write(f.read()[-4000:])
                return EXIT_ERROR
            if time.monotonic() > deadline:
                _stop(child)
                print(f"{PROG} emulator: it did not serve within {DETACH_START_SECONDS:g} s "
                      f"(stopped); its log: {log_path}", file=sys.stderr)
                return EXIT_ERROR
            time.sleep(_POLL_SECONDS)
    except BaseException:  # Ctrl-C while it starts: it does not stay behind
        _stop(child)
        raise
    print(child.pid, flush=True)
    print(f"{PROG} emulator: ready at {found['api_url']} (template {found['template']}), in "
          f"the background as pid {child.pid}: 'kill {child.pid}' stops it; log: {log_path}",
          file=sys.stderr, flush=True)
    return 0


def _stop(child: subprocess.Popen) -> None:  # type: ignore[type-arg]
    child.terminate()
    try:
        child.wait(timeout=DETACH_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(timeout=DETACH_STOP_SECONDS)
