"""Command line of the local E2B emulator: ``python -m e2b_provider.emulator``.

This module owns argument parsing (one definition, :func:`add_arguments`, shared with
``e2b-provider emulator``), the isolation pre-check (exit status 2 with one clear message when
namespaces/cgroups are unavailable), the state directory (a fresh temporary one unless
``--state-dir`` is given; removed at exit), what it prints once it serves (the shell lines on
stdout, the ready line on stderr), and signal handling (SIGINT/SIGTERM: every sandbox is
destroyed, then exit 0).

Usage::

    python -m e2b_provider.emulator [--host 127.0.0.1] [--port 0] [--api-key KEY]
                                    [--state-dir DIR] [--log-level warning]
                                    [--cpu-count 2] [--memory-mb 512] [--disk-mb 1024]
                                    [--max-processes 1024] [--boot-timeout 30]
                                    [--max-boots N]

The resource options size the template every sandbox runs (E2B sizes sandboxes by template, not
by create request); with ``--log-level info`` each boot logs which of them the host enforces.
A boot fails after ``--boot-timeout`` seconds without progress (no step reached, no CPU time
used by its processes; four times that in all), and at most ``--max-boots`` boot at once
(the others wait their turn), so a loaded host makes creates slower, not failed.

Once it serves, it writes (in one flushed write) what a shell needs to point this library or
the official SDK at it, and nothing else, on stdout; so ``python -m e2b_provider.emulator >
e2b.env`` makes a file for ``. ./e2b.env``::

    export E2B_API_KEY=KEY
    export E2B_API_URL=http://127.0.0.1:PORT
    export E2B_SANDBOX_URL=http://127.0.0.1:PORT
    export E2B_VOLUME_API_URL=http://127.0.0.1:PORT
    export E2B_TEMPLATE=base

The last of them is always ``export E2B_TEMPLATE=...``: a reader has all of them once it has
read that line (the :class:`~e2b_provider.emulator.Emulator` handle parses them). Then, once
those are flushed, one line for people on stderr::

    e2b-emulator: ready at http://127.0.0.1:PORT (template base); Ctrl-C stops it

The API key is printed on purpose: it is a local throwaway key (random ``e2b_`` + 40 hex unless
``--api-key`` or ``$E2B_EMULATOR_API_KEY`` gives one) that clients need.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import shlex
import signal
import sys
import tempfile
from typing import Callable, List, Optional, TypeVar

from .api.state import DEFAULT_TEMPLATE, TemplateResources
from .handle import EXIT_UNAVAILABLE, remove_state_dir
from .runtime.boot_wait import BOOT_LIMIT_FACTOR, BOOT_STALL_SECONDS

__all__ = ["add_arguments", "main", "run"]

T = TypeVar("T")
EXIT_INTERRUPTED = 130
#: The name this command line gives itself in its messages.
NAME = "e2b-emulator"
log = logging.getLogger("e2b_provider.emulator")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the emulator's options to ``p`` (``python -m e2b_provider.emulator`` and
    ``e2b-provider emulator`` take the same ones); :func:`run` takes what it parsed."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to bind (0 = a free port)")
    p.add_argument(
        "--api-key",
        default=None,
        help="the API key clients must send (default: $E2B_EMULATOR_API_KEY or a random one)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="where sandboxes keep their files (default: a temporary directory removed at exit)",
    )
    p.add_argument(
        "--remove-state-dir",
        action="store_true",
        help="remove --state-dir at exit as well (it is a temporary directory made for this run)",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        choices=("debug", "info", "warning", "error"),
        help="log level of the messages written to stderr (default warning)",
    )
    defaults = TemplateResources()
    for flag, attr, minimum, what in (
        ("--cpu-count", "cpu_count", 1, "CPUs of every sandbox"),
        ("--memory-mb", "memory_mb", 16, "memory limit of every sandbox, MiB"),
        ("--disk-mb", "disk_mb", 16, "disk size of every sandbox, MiB"),
        ("--max-processes", "max_processes", 16, "processes and threads per sandbox"),
    ):
        p.add_argument(
            flag,
            type=_at_least(minimum),
            default=getattr(defaults, attr),
            help=f"{what} (default {getattr(defaults, attr)})",
        )
    p.add_argument(
        "--boot-timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        default=None,
        help="seconds a sandbox's boot may go without progress (no step reached, no CPU time "
        f"used) before its create fails; a boot that progresses may take {BOOT_LIMIT_FACTOR:g} "
        f"times that (default: $E2B_EMULATOR_BOOT_TIMEOUT or {BOOT_STALL_SECONDS:g})",
    )
    p.add_argument(
        "--max-boots",
        type=_at_least(1),
        metavar="N",
        default=None,
        help="sandboxes booting at once; more creates wait for a turn (default: "
        "$E2B_EMULATOR_MAX_BOOTS or the host's CPUs, at least 2)",
    )
    p.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="shut down cleanly when the parent process exits (used by the Emulator handle)",
    )
    p.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="with --exit-with-parent: the pid of the parent to watch (default: the parent "
        "at startup)",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m e2b_provider.emulator",
        description="A local E2B: control plane + envd on one port, real namespaced sandboxes. "
        "Once it serves, it prints the export lines a shell needs on stdout (e.g. '> e2b.env', "
        "then '. ./e2b.env' in another shell) and a ready line on stderr.",
    )
    add_arguments(p)
    return p


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}: {value}")
        return value

    return parse


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text}")
    return value


def _env_default(name: str, parse: Callable[[str], T], default: Optional[T]) -> Optional[T]:
    """An option's default from environment variable ``name`` (when set), else ``default``.

    Raises:
        ValueError: the variable's value is not valid (the message names it).
    """
    text = os.environ.get(name)
    if not text:
        return default
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"${name}: {exc}") from None


def _url(host: str, port: int) -> str:
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def shell_text(url: str, api_key: str) -> str:
    """What the emulator writes on stdout once it serves: the export lines, and only them
    (``E2B_TEMPLATE`` last)."""
    env = {
        "E2B_API_KEY": api_key,
        "E2B_API_URL": url,
        "E2B_SANDBOX_URL": url,
        "E2B_VOLUME_API_URL": url,
        "E2B_TEMPLATE": DEFAULT_TEMPLATE,
    }
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items())


def ready_line(url: str, name: str = NAME) -> str:
    """The line for people the emulator writes on stderr once the shell lines are out."""
    return f"{name}: ready at {url} (template {DEFAULT_TEMPLATE}); Ctrl-C stops it\n"


async def _serve(
    args: argparse.Namespace,
    api_key: str,
    state_dir: str,
    name: str,
    on_ready: Optional[Callable[[str, str], None]] = None,
) -> None:
    from .api.server import EmulatorServer

    resources = TemplateResources(
        cpu_count=args.cpu_count,
        memory_mb=args.memory_mb,
        disk_mb=args.disk_mb,
        max_processes=args.max_processes,
    )
    server = EmulatorServer(api_key=api_key, state_dir=state_dir, resources=resources,
                            boot_timeout=args.boot_timeout, max_boots=args.max_boots)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watcher: Optional[asyncio.Task[None]] = None
    try:
        host, port = await server.start(args.host, args.port)
        url = _url(host, port)
        if on_ready is not None:  # before the lines: whoever reads them finds what it did
            on_ready(url, api_key)
        # stdout first: whoever waits for the ready line may read the file stdout went to
        sys.stdout.write(shell_text(url, api_key))
        sys.stdout.flush()
        sys.stderr.write(ready_line(url, name))
        sys.stderr.flush()
        if args.exit_with_parent:
            watcher = asyncio.ensure_future(_watch_parent(stop, args.parent_pid))
        await stop.wait()
        log.info("stopping: destroying %d sandbox(es)", len(server.records))
    finally:
        if watcher is not None:
            watcher.cancel()
        await server.close()


async def _watch_parent(stop: asyncio.Event, parent: int) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    log.warning("parent process %d went away: stopping", parent)
    stop.set()


def main(argv: Optional[List[str]] = None) -> int:
    """Run the emulator until SIGINT/SIGTERM; returns the exit status (2 = unavailable,
    130 = interrupted before it served)."""
    parent_pid = os.getppid()  # before anything else: the parent may die at any moment
    try:
        args = _parser().parse_args(argv)
        return run(args, parent_pid=parent_pid)
    except KeyboardInterrupt:
        print(f"{NAME}: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def run(
    args: argparse.Namespace,
    *,
    parent_pid: Optional[int] = None,
    name: str = NAME,
    on_ready: Optional[Callable[[str, str], None]] = None,
) -> int:
    """Run the emulator with the options :func:`add_arguments` defined until SIGINT/SIGTERM;
    returns the exit status (0; 1: it could not serve; 2: it cannot run here). ``name``
    starts its messages; ``parent_pid``: the default of ``--parent-pid``; ``on_ready(url,
    api_key)`` is called once it serves, before the shell lines are written."""
    if args.parent_pid is None:
        args.parent_pid = os.getppid() if parent_pid is None else parent_pid
    try:
        if args.boot_timeout is None:
            args.boot_timeout = _env_default(
                "E2B_EMULATOR_BOOT_TIMEOUT", _positive_seconds, BOOT_STALL_SECONDS
            )
        if args.max_boots is None:
            args.max_boots = _env_default("E2B_EMULATOR_MAX_BOOTS", _at_least(1), None)
    except ValueError as exc:  # 1, not 2: the Emulator handle reads 2 as "isolation unavailable"
        print(f"{name}: {exc}", file=sys.stderr, flush=True)
        return 1
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        import aiohttp  # noqa: F401

        from . import runtime
    except ImportError as exc:
        print(
            f"{name}: cannot start: {exc}. Install the emulator extra: "
            "pip install 'e2b-provider[emulator]'",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_UNAVAILABLE
    try:
        runtime.check_isolation()
    except runtime.IsolationUnavailable as exc:
        print(f"{name}: {exc}", file=sys.stderr, flush=True)
        return EXIT_UNAVAILABLE
    api_key = (
        args.api_key or os.environ.get("E2B_EMULATOR_API_KEY") or ("e2b_" + secrets.token_hex(20))
    )
    temporary = args.state_dir is None or args.remove_state_dir
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="e2b-emulator-")
    try:
        asyncio.run(_serve(args, api_key, state_dir, name, on_ready))
    except (OSError, ValueError) as exc:
        print(f"{name}: cannot serve: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if temporary:
            remove_state_dir(state_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
