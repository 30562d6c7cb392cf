"""The argument parser of ``e2b-provider``: its commands, their options and defaults.

Standard library only: ``--help``, ``--version`` and a usage error load none of the library.
Each command's handler is named here (``"module.function"`` of this package) and imported
only when the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Callable, List, Optional, Tuple, TypeVar

from .._version import __version__
from .exits import EXIT_USAGE, PROG

#: ``exec``'s timeout unless ``--timeout`` says otherwise (``exec -t``: none).
CLI_EXEC_TIMEOUT_SECONDS = 600.0
#: ``code``'s timeout unless ``--timeout`` says otherwise.
CLI_CODE_TIMEOUT_SECONDS = 600.0
#: Output kept (and shown) per ``exec`` unless ``--max-output-bytes`` says otherwise (and
#: per ``code``).
DEFAULT_EXEC_OUTPUT = 64 << 20
#: Output the sandbox keeps per stream of a ``start``-ed command unless told otherwise.
DEFAULT_START_OUTPUT = 1 << 20

#: What ``forward`` and ``port-forward`` do with each connection, to the sandbox port ``{}``.
_RELAY = (
    "relay every connection (HTTP/1.1, streaming, Server-Sent Events, WebSockets) to {} inside "
    "the sandbox, through E2B's edge or the emulator, adding the sandbox's traffic token when "
    "its traffic is private."
)

#: A command's handler: the parsed arguments in, the exit status out.
Handler = Callable[[argparse.Namespace], int]
_N = TypeVar("_N", int, float)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _number(text: str, parse: Callable[[str], _N], problem: str) -> _N:
    """``parse(text)`` (``int`` or ``float``), or ``problem`` as argparse's error."""
    try:
        return parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(problem) from None


def _positive_float(text: str) -> float:
    value = _number(text, float, f"not a number: {text!r}")
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def _handler(where: str) -> Handler:
    """The handler ``where`` (``"module.function"`` of this package), imported when the
    command runs: parsing, ``--help`` and ``--version`` load none of the library."""
    module, _, function = where.partition(".")

    def run(args: argparse.Namespace) -> int:
        handle: Handler = getattr(importlib.import_module(f"{__package__}.{module}"), function)
        return int(handle(args))

    return run


def _command(sub: Any, name: str, handler: str, *, sandbox: bool, **texts: str
             ) -> argparse.ArgumentParser:
    """Add the command ``name`` (``texts``: its ``help`` and ``description``), run by
    ``handler`` (see :func:`_handler`); with ``sandbox``, its first argument is a sandbox."""
    cmd: argparse.ArgumentParser = sub.add_parser(name, **texts)
    if sandbox:
        cmd.add_argument("sandbox", metavar="SANDBOX", help="a sandbox name or id")
    cmd.set_defaults(func=_handler(handler))
    return cmd


def _add_command_words(cmd: argparse.ArgumentParser) -> None:
    """The words after SANDBOX of ``exec`` and ``start``
    (:func:`~.command_words.split_command` takes them off before parsing: only the help
    shows them here)."""
    cmd.add_argument("command", nargs="*", metavar="CMD [ARG...]",
                     help="everything after SANDBOX: one word is a shell command line, "
                     "several are a command and its arguments")


def _add_command_id(cmd: argparse.ArgumentParser) -> None:
    """The background command that ``logs`` and ``kill`` act on."""
    cmd.add_argument("id", metavar="ID", help="a command id, as start and ps print it (or "
                     "what follows its ':': 32 hex digits, after 'root-' for root's)")


def _add_cwd_and_env(cmd: argparse.ArgumentParser) -> None:
    """The options of a command that runs something in the sandbox, with docker's short
    forms: ``-w/--cwd``, ``-e/--env`` and ``-u/--user``."""
    cmd.add_argument("-w", "--cwd", "--workdir", dest="cwd", default=None, metavar="DIR",
                     help="working directory (default /workspace)")
    cmd.add_argument("-e", "--env", action="append", default=[], metavar="K=V",
                     help="an environment variable (repeatable)")
    cmd.add_argument("-u", "--user", choices=("sandbox", "root"), default="sandbox",
                     help="run as this user: sandbox (default) or root (apt-get "
                     "install, say)")


def _add_timeout(cmd: argparse.ArgumentParser, text: str) -> None:
    """``--timeout``: seconds, more than 0; None when not given (``text``: its help)."""
    cmd.add_argument("--timeout", type=_positive_float, default=None, help=text)


def _add_max_output(cmd: argparse.ArgumentParser, default: int, text: str) -> None:
    """``--max-output-bytes`` of ``exec`` and ``start`` (``text``: its help)."""
    cmd.add_argument("--max-output-bytes", type=int, default=default, help=text)


def _port_type(text: str) -> int:
    value = _number(text, int, f"{text!r} is not a port number")
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError("ports are from 1 to 65535")
    return value


def _ports_type(text: str) -> Tuple[Optional[int], int]:
    """``PORT`` or ``LOCAL:PORT`` (as ``kubectl port-forward`` takes them)."""
    local, sep, remote = text.rpartition(":")
    return (_port_type(local) if sep else None), _port_type(remote)


def _forward_type(text: str) -> Tuple[int, int]:
    """``port-forward``'s ``[LOCAL:]REMOTE``, as ``kubectl port-forward`` reads it:
    ``REMOTE`` alone listens on the same port here; ``:REMOTE`` or ``0:REMOTE`` on a free
    one (0 in the pair)."""
    local, sep, remote = text.rpartition(":")
    port = _port_type(remote)
    if not sep:
        return port, port
    return (0 if local in ("", "0") else _port_type(local)), port


def _addresses_type(text: str) -> List[str]:
    """``port-forward --address``: IP addresses or ``localhost``, comma separated (as
    ``kubectl port-forward`` takes them), each once."""
    from ..errors import InvalidArgument
    from ..ports.relay import listen_address  # only when given: the relay loads asyncio

    try:
        found = [listen_address(part.strip()) for part in text.split(",")]
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return list(dict.fromkeys(found))


def _tail_type(text: str) -> Optional[int]:
    """``logs --tail``: a number of lines (0 or more), or ``all`` (or -1: all, as
    ``kubectl logs --tail=-1``); None for all."""
    if text in ("all", "-1"):
        return None
    value = _number(text, int, f"{text!r} is not a number of lines")
    if value < 0:
        raise argparse.ArgumentTypeError("give 0 or more lines, or all")
    return value


def parser(*, emulator_options: bool = True) -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests).

    ``emulator_options=False`` leaves the options of ``emulator`` out: they come from
    :mod:`e2b_provider.emulator.__main__`, whose import the other commands need not pay for.
    """
    env_help = (
        "Configuration comes from the environment: E2B_API_KEY, E2B_TEMPLATE, and optionally "
        "E2B_API_URL, E2B_DOMAIN, E2B_SANDBOX_URL, E2B_TIMEOUT_SECONDS. "
        f"Without E2B_API_KEY, the commands use the '{PROG} emulator' running on this "
        "machine (it prints the variables too)."
    )
    p = _Parser(prog=PROG, description="E2B sandboxes from the shell.", epilog=env_help)
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    c = _command(
        sub, "create", "sandboxes.cmd_create", sandbox=False,
        help="create a sandbox (refused when one of that name exists, unless --replace)",
        description="Create a sandbox and print its id. When a running or paused sandbox "
        "of that name exists, create refuses (exit 1, naming it) unless --replace is given: "
        "then the older sandboxes of that name are destroyed first, files and all.",
    )
    c.add_argument("name", metavar="NAME")
    c.add_argument("--template", default=None, metavar="NAME",
                   help="the template to create it from (default: E2B_TEMPLATE's); "
                   "code-interpreter-v1 for a sandbox the code command runs code in")
    c.add_argument("--replace", action="store_true",
                   help="destroy the sandboxes of that name (and everything in them) first")
    c.add_argument("--cpu", type=int, default=None,
                   help="vCPUs: a request; E2B gives the template's sizes (a warning says "
                   "when they differ)")
    c.add_argument("--memory-mb", type=int, default=None,
                   help="memory in MiB: a request, as --cpu")
    c.add_argument("--disk-mb", type=int, default=None, help="disk in MiB: a request, as --cpu")
    c.add_argument(
        "--egress",
        choices=("none", "allowlist", "open"),
        default="none",
        help="outbound network: none (default), allowlist, open",
    )
    c.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="with --egress allowlist: a host the sandbox may reach (repeatable)",
    )

    e = _command(
        sub, "exec", "commands.cmd_exec", sandbox=True,
        usage=f"{PROG} exec [OPTIONS] SANDBOX [CMD [ARG...]]",
        help="run a command, output streamed live (-it: on a terminal, as docker exec -it)",
        description="Run a command in the sandbox as user sandbox (-u root: as root), "
        "streaming its output. As docker exec: the options come before SANDBOX, and "
        "everything after SANDBOX is the command ('exec SB ls -l /workspace'; a -- there "
        "is taken too: 'exec SB -- ls -l'). One word is a shell command line, run by bash "
        "-c ('make && ./run'); several words are the command and its arguments, each "
        "passed unchanged (python3 -c 'print(1)'). When our standard input is not a "
        "terminal (a pipe, a file), the command reads it, e.g. 'echo hi | e2b-provider "
        "exec SB cat'; on a terminal it reads nothing "
        "(</dev/null) unless -i is given. Exits with the command's status; 124 if it timed "
        "out; 130 on Ctrl-C, after the remote command was killed. With -it the command "
        "(without one: the login shell) runs on a terminal in the sandbox and ours is "
        "attached to it in raw mode, as docker exec -it: every key goes to it (Ctrl-C too), "
        "its window follows ours, and we exit with its status.",
    )
    e.add_argument("-i", "--interactive", action="store_true",
                   help="feed our standard input to the command even when it is a terminal "
                   "(with -t: our keys, in raw mode)")
    e.add_argument("-t", "--tty", action="store_true",
                   help="run the command on a terminal (pty) in the sandbox; our standard "
                   "input must be a terminal")
    _add_timeout(e, f"seconds before the command is killed (default {CLI_EXEC_TIMEOUT_SECONDS:g}; "
                 "with -t: none)")
    _add_cwd_and_env(e)
    _add_max_output(e, DEFAULT_EXEC_OUTPUT, f"output shown at most (default {DEFAULT_EXEC_OUTPUT})")
    _add_command_words(e)

    sh = _command(
        sub, "shell", "commands.cmd_shell", sandbox=True,
        help="open the sandbox user's login shell on a terminal (as exec -it)",
        description="Open the login shell of user sandbox (-u root: root's) on a terminal "
        "in the sandbox, ours attached in raw mode, as 'docker exec -it C bash' or 'kubectl "
        "exec -it P -- bash'; the same as 'exec -it SANDBOX'. Exits with the shell's status.",
    )
    _add_cwd_and_env(sh)

    st = _command(
        sub, "start", "commands.cmd_start", sandbox=True,
        usage=f"{PROG} start [OPTIONS] SANDBOX CMD [ARG...]",
        help="start a command in the background and print its id",
        description="Start a command in the sandbox in the background, as user sandbox "
        "(-u root: as root), and print its id. As for exec: the options come before "
        "SANDBOX, everything after it is the command (a -- there is taken too); one word is "
        "a shell command line, run by bash -c; several words are the command and its "
        "arguments, each passed unchanged. It runs on after we exit; the sandbox keeps the "
        "last --max-output-bytes of its stdout and of its stderr, and its exit status: see "
        "logs, ps and kill. It reads nothing on its standard input.",
    )
    _add_timeout(st, "seconds before the command is killed (default: none, it runs until it ends)")
    _add_cwd_and_env(st)
    st.add_argument("--tag", default=None, help="a tag, shown by ps")
    _add_max_output(st, DEFAULT_START_OUTPUT, f"output kept per stream, the latest (default "
                    f"{DEFAULT_START_OUTPUT}, at least 1024)")
    _add_command_words(st)

    lg = _command(
        sub, "logs", "commands.cmd_logs", sandbox=True,
        help="show the output of a background command",
        description="Print the output the sandbox keeps of a background command "
        "(stdout to stdout, stderr to stderr); with --tail N, only the last N lines of "
        "each. With -f, then follow it live until the "
        "command ends and exit with its status (124 if it timed out, 1 if it was killed "
        "or its status is unknown); Ctrl-C stops following (exit 130), not the command.",
    )
    _add_command_id(lg)
    lg.add_argument("-f", "--follow", action="store_true",
                    help="follow the output until the command ends")
    lg.add_argument("-n", "--tail", type=_tail_type, default=None, metavar="N",
                    help="show only the last N lines of each stream kept (default all); "
                    "with -f, then follow")

    k = _command(
        sub, "kill", "commands.cmd_kill", sandbox=True,
        help="stop a background command",
        description="Stop a background command and its whole process tree (killing "
        "one that has ended does nothing). Prints its id.",
    )
    _add_command_id(k)

    ps = _command(
        sub, "ps", "commands.cmd_ps", sandbox=True,
        help="list the background commands and terminals that run in a sandbox",
        description="List the background commands and the terminals (their ids have "
        "pty-) that still run in the sandbox, whoever started them, oldest first: id, pid, "
        "tag, start time (local) and command line (cut to the terminal's width unless "
        "--no-trunc). logs takes a command's id, kill either.",
    )
    ps.add_argument("--no-trunc", action="store_true", help="show whole command lines")

    cd = _command(
        sub, "code", "code.cmd_code", sandbox=True,
        usage=f"{PROG} code [OPTIONS] SANDBOX (-c CODE | FILE | -)",
        help="run code in a sandbox's code interpreter (a Jupyter kernel that keeps its state)",
        description="Run a cell of code in the sandbox's code interpreter, a Jupyter kernel "
        "whose variables stay from one run to the next (the sandbox must come from the "
        "template code-interpreter-v1: 'create NAME --template code-interpreter-v1'). The "
        "code is -c CODE, the local file FILE, or standard input (-). Its stdout and stderr "
        "are shown as they come, then its text results in order: the cell's value and each "
        "displayed result that is no image. Image results (PNG, JPEG, SVG, PDF: a "
        "matplotlib figure, say) are written to --out DIR as result-<count>-<n>.<ext>, one "
        "line on stderr each; without --out they are not written. Exits 1 when the code "
        "raised (its traceback on stderr), 124 if it timed out and 130 on Ctrl-C, both once "
        "the kernel was interrupted (its variables are kept, unless it did not stop and had "
        "to be restarted).",
    )
    cd.add_argument("-c", "--code", default=None, metavar="CODE", help="the code to run")
    cd.add_argument("file", nargs="?", default=None, metavar="FILE",
                    help="a local file of code to run; - reads it from standard input")
    cd.add_argument("--context", default=None, metavar="ID",
                    help="the id of a code context (a kernel of its own) to run it in "
                    "(default: the language's default context)")
    cd.add_argument("--language", default=None, metavar="L",
                    help="the kernel's language: python (default), bash, ... (the default "
                    "context of that language; not with --context)")
    cd.add_argument("--out", default=None, metavar="DIR",
                    help="write the image results to DIR (created if missing)")
    _add_timeout(cd, f"seconds before the kernel is interrupted (default "
                 f"{CLI_CODE_TIMEOUT_SECONDS:g})")

    cp = _command(
        sub, "cp", "files.cmd_cp", sandbox=False,
        help="copy files or directories to or from a sandbox",
        description="Copy a file, or with -r a directory tree, between this machine "
        "and a sandbox; write the sandbox side as SANDBOX:/absolute/path. As cp does: "
        "when DST is an existing directory the copy goes into it. Each file is written "
        "whole or not at all; symbolic links are copied as links. A progress line is "
        "shown on a terminal. As docker cp: DST - writes a tar stream of SRC (a file or "
        "a directory, -r not needed) to standard output, its entries named from SRC's "
        "base name; SRC - reads a tar stream (plain, gzip, bzip2 or xz) from standard "
        "input and extracts it into the sandbox directory DST, which must exist. Such a "
        "stream is refused whole, nothing copied, when an entry is unsafe (an absolute "
        "link, '..', a link leading outside, a hard link or a device). Both go through "
        "a private temporary directory on this machine.",
    )
    cp.add_argument("-r", "-R", "--recursive", action="store_true",
                    help="copy directories and everything below them")
    cp.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                    help="skip entries whose relative path or name matches (repeatable)")
    cp.add_argument("src", metavar="SRC")
    cp.add_argument("dst", metavar="DST")

    ls = _command(
        sub, "ls", "sandboxes.cmd_ls", sandbox=False,
        help="list sandboxes, or the files in one",
        description="Without an argument, list running and paused sandboxes; with "
        "SANDBOX:/path, list the entries of that directory as user sandbox sees them.",
    )
    ls.add_argument("where", nargs="?", default=None, metavar="SANDBOX:/PATH",
                    help="a directory in a sandbox")
    ls.add_argument("--name", default=None, help="only sandboxes of this name")
    ls.add_argument("-l", "--long", action="store_true",
                    help="with SANDBOX:/PATH: type, mode, size and time too")
    ls.add_argument("--depth", type=int, default=1,
                    help="with SANDBOX:/PATH: levels to list (default 1)")

    fw = _command(
        sub, "forward", "ports.cmd_forward", sandbox=True,
        help="serve a sandbox port on this machine (like kubectl port-forward)",
        description=f"Listen on 127.0.0.1 and {_RELAY.format('PORT')} Prints 'Forwarding from "
        "127.0.0.1:LOCAL -> PORT', then runs until Ctrl-C (exit 0).",
    )
    fw.add_argument("port", type=_ports_type, metavar="[LOCAL:]PORT",
                    help="the port inside the sandbox, optionally after the local port")
    fw.add_argument("--local-port", type=_port_type, default=None, metavar="N",
                    help="the local port (default: a free one)")

    pf = _command(
        sub, "port-forward", "ports.cmd_port_forward", sandbox=True,
        help="serve sandbox ports on this machine, as kubectl port-forward",
        description=f"As kubectl port-forward: listen on 127.0.0.1 and {_RELAY.format('REMOTE')} "
        "REMOTE alone listens on the same port here; LOCAL:REMOTE on LOCAL; :REMOTE or 0:REMOTE "
        "on a free port. Prints 'Forwarding from ADDRESS:LOCAL -> REMOTE' for each, then runs "
        "until Ctrl-C (exit 0). A local port that is taken is an error (exit 1).",
    )
    pf.add_argument("ports", type=_forward_type, nargs="+", metavar="[LOCAL:]REMOTE",
                    help="a port inside the sandbox, optionally after the local port")
    pf.add_argument("--address", type=_addresses_type, default=["127.0.0.1"],
                    metavar="ADDRESS[,ADDRESS...]",
                    help="the local addresses to listen on: IP addresses or localhost "
                    "(127.0.0.1, the default); 0.0.0.0 serves the ports, with the "
                    "sandbox's traffic token added, to every machine that reaches this one")

    ur = _command(
        sub, "url", "ports.cmd_url", sandbox=True,
        help="print the URL of a sandbox port",
        description="Print the URL at which E2B serves PORT of the sandbox (on the "
        "emulator, one a browser on this machine opens). Requests to it need the "
        "sandbox's traffic token when its traffic is private; 'forward' adds it.",
    )
    ur.add_argument("port", type=_port_type, metavar="PORT")

    wt = _command(
        sub, "watch", "files.cmd_watch", sandbox=True,
        help="print the changes in a sandbox directory as they happen",
        description="Watch a directory of the sandbox (as user sandbox: it must exist and "
        "be readable by it) and print one line per change as it happens, until Ctrl-C "
        "(exit 130): 'create PATH', 'write PATH', 'remove PATH', 'rename PATH' (the old "
        "name; the new one comes as create), 'chmod PATH', or 'overflow DIR' when changes "
        "came faster than they were read and some were lost (the watch goes on). Paths are "
        "absolute. Exits 0 once --timeout passed, the directory itself was removed or "
        "renamed, or the reader of the output went away (| head -n 1).",
    )
    wt.add_argument("path", metavar="PATH", help="an absolute directory path in the sandbox")
    wt.add_argument("-r", "--recursive", action="store_true",
                    help="watch every directory below PATH too")
    wt.add_argument("--json", action="store_true",
                    help='one JSON object per line: {"type": ..., "path": ...}')
    _add_timeout(wt, "stop after this many seconds (exit 0)")

    rm = _command(sub, "rm", "sandboxes.cmd_rm", sandbox=False, help="destroy sandboxes",
                  description="Destroy sandboxes.")
    rm.add_argument("sandboxes", nargs="+", metavar="SANDBOX")

    for name, what in (("suspend", "pause a sandbox (memory kept)"),
                       ("resume", "resume a paused sandbox")):
        s = _command(sub, name, f"sandboxes.cmd_{name}", sandbox=False, help=what,
                     description=what[0].upper() + what[1:] + ".")
        s.add_argument("sandbox", metavar="SANDBOX")

    em = _command(
        sub, "emulator", "local_emulator.cmd_emulator", sandbox=False,
        help="run the local E2B emulator (in the foreground, or -d: the background)",
        description="Run the local E2B emulator in the foreground (-d: in the background) "
        "until Ctrl-C or SIGTERM (which destroy its sandboxes), as python -m "
        "e2b_provider.emulator does, with the same options. Once it serves, it writes the "
        "export lines another shell needs, and only them, on stdout, then a ready line on "
        "stderr: e.g. 'e2b-provider emulator > e2b.env' here and '. ./e2b.env' there. While "
        "it serves, the other commands of this user find it without any variable (when "
        "E2B_API_KEY is unset): it records where it listens, and its key, in a file only you "
        "can read ($XDG_RUNTIME_DIR/e2b-provider/ or /tmp/e2b-provider-UID/), removed when it "
        "stops.",
    )
    if emulator_options:
        from ..emulator.__main__ import add_arguments

        add_arguments(em)
        em.add_argument(
            "-d", "--detach", action="store_true",
            help="run it in the background (a session of its own) and return once it serves, "
            "printing its pid ('kill PID' stops it); its log goes to a file beside its record",
        )
    return p


