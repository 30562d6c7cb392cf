"""The commands that run things in a sandbox: ``exec`` (live output, our stdin, exit status),
``shell``, ``start``, ``logs``, ``kill`` and ``ps``.

``exec`` exits with the command's own status, 124 when it timed out, 130 after Ctrl-C (once
the remote process tree was killed); so does ``logs -f`` once the background command ended
(130 after Ctrl-C, which leaves the command running).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from datetime import datetime
from typing import Tuple

from ..commands.terminal_handle import Terminal
from .arguments import CLI_EXEC_TIMEOUT_SECONDS
from .exits import EXIT_INTERRUPTED, PROG, exit_status
from .inputs import command_line, env_vars, our_stdin
from .lookup import attach, connect, found, resolve
from .output import writer
from .tail import AfterShown, last_lines
from .terminal_session import run_terminal


def cmd_exec(args: argparse.Namespace) -> int:
    """``exec``: run a command with its output streamed live (``-t``: on a terminal)."""
    if args.tty:
        command = command_line(args.command, "exec") if args.command else None
        return run_terminal(args, command, interactive=args.interactive)
    command = command_line(args.command, "exec")
    env = env_vars(args.env)
    timeout = CLI_EXEC_TIMEOUT_SECONDS if args.timeout is None else args.timeout
    with connect() as p:
        h = resolve(p, args.sandbox)
        r = p.exec(
            h,
            command,
            timeout=timeout,
            cwd=args.cwd,
            env=env or None,
            max_output_bytes=args.max_output_bytes,
            on_stdout=writer(sys.stdout),
            on_stderr=writer(sys.stderr),
            stdin=our_stdin(even_a_terminal=args.interactive),
            user=args.user,
        )
    if r.truncated:
        print(f"{PROG}: output past {args.max_output_bytes} bytes was dropped", file=sys.stderr)
    return exit_status(r, f"timed out after {timeout:g} s (the command was killed)")


def cmd_shell(args: argparse.Namespace) -> int:
    """``shell``: the login shell on a terminal (as ``exec -it``)."""
    return run_terminal(args, None, interactive=True)


def cmd_start(args: argparse.Namespace) -> int:
    """``start``: a command in the background; prints its id."""
    command = command_line(args.command, "start")
    env = env_vars(args.env)
    with connect() as p:
        h = resolve(p, args.sandbox)
        c = p.start(
            h,
            command,
            timeout=args.timeout,
            cwd=args.cwd,
            env=env or None,
            tag=args.tag,
            max_output_bytes=args.max_output_bytes,
            user=args.user,
        )
    print(c.id)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """``logs``: the output kept of a background command (``-f``: followed to its end;
    ``--tail N``: from its last ``N`` lines)."""
    with connect() as p:
        c = attach(p, resolve(p, args.sandbox), args.id)
        on_stdout, on_stderr = writer(sys.stdout), writer(sys.stderr)
        after: Tuple[AfterShown, ...] = ()
        if not args.follow or args.tail is not None:
            out = c.output()
            shown = (last_lines(out.stdout, args.tail), last_lines(out.stderr, args.tail))
            on_stdout(shown[0])
            sys.stderr.write(shown[1])
            if not args.follow:
                if out.truncated and shown == (out.stdout, out.stderr):
                    print(f"{PROG}: earlier output was not kept (the sandbox keeps the last "
                          "--max-output-bytes of each stream)", file=sys.stderr)
                return 0
            # --tail -f: what was kept is dealt with; only what comes after it is shown
            after = (AfterShown(out.stdout, on_stdout), AfterShown(out.stderr, on_stderr))
        try:
            r = c.wait(on_stdout=after[0] if after else on_stdout,
                       on_stderr=after[1] if after else on_stderr)
            for one in after:
                one.finish()
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted (command {c.id} goes on)", file=sys.stderr)
            return EXIT_INTERRUPTED
    return exit_status(r, "the command timed out (it was killed)")


def cmd_kill(args: argparse.Namespace) -> int:
    """``kill``: stop a background command (or terminal); prints its id."""
    with connect() as p:
        c = found(p, resolve(p, args.sandbox), args.id)
        c.kill()
        if isinstance(c, Terminal):
            c.detach()
    print(c.id)
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    """``ps``: a table of the background commands and terminals that run."""
    with connect() as p:
        rows = p.commands(resolve(p, args.sandbox))
    table = [("ID", "PID", "TAG", "STARTED")]
    commands = ["COMMAND"]
    for c in rows:
        started = datetime.fromtimestamp(c.started_at).strftime("%Y-%m-%d %H:%M:%S")
        table.append((c.id, str(c.pid), c.tag or "-", started))
        line = " ".join(c.command.split())  # one line, as docker ps shows it
        commands.append((line or "(login shell)") if c.kind == "terminal" else line)
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    room = max(20, shutil.get_terminal_size().columns - sum(widths) - 2 * len(widths))
    for row, command in zip(table, commands):
        if not args.no_trunc and len(command) > room:
            command = command[: room - 3] + "..."
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + command)
    return 0
