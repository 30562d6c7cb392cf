"""The command line: ``e2b-provider`` (also ``python -m e2b_provider``).

This module owns the shell face of the library: argument parsing (``argparse``), the
configuration from the environment (as :meth:`DeploymentConfig.from_env`), finding a sandbox
by name or id, live command output to our stdout/stderr, file copies with a progress line on
a terminal, a table of sandboxes, and exit codes:

* ``exec`` exits with the command's own status, 124 when it timed out, 130 after Ctrl-C
  (once the remote process tree was killed); so does ``logs -f`` once the background
  command ended (130 after Ctrl-C, which leaves the command running);
* 2 for a usage error (a bad option, a word that can be no sandbox name or id, a missing or
  invalid setting);
* 1 for any other error (no such sandbox, an API or connection error, a local file error),
  printed on one line without a traceback;
* 130 after Ctrl-C in any other command, or while it starts (one line: ``e2b-provider:
  interrupted``), except ``forward``, which runs until Ctrl-C and then exits 0 (as
  ``kubectl port-forward`` does); ``watch`` exits 130 after Ctrl-C, as ``logs -f`` does, and
  0 once its ``--timeout`` passed, its directory went, or the reader of its output went away
  (``| head -n 1``: it stops at once, also when no event comes, quietly);
* ``emulator`` exits 0 once Ctrl-C or SIGTERM stopped it, 1 when it cannot run here.

``watch`` prints one event a line as it comes (``create /workspace/a.txt``; control
characters of a path escaped, so one event stays one line; ``--json``: one JSON object a
line). When its output is a pipe, one daemon thread waits for the pipe's reader to go away
and then ends the watch (a process that only writes when an event comes would otherwise
notice a ``| head`` that has exited only at the next event).

``exec`` and ``start`` take the command after ``--``, as ``docker exec`` does: one word is a
shell command line (``-- 'make && ./run'``), run by ``bash -c``; several words are the
command's argument vector, each reaching it unchanged (``-- python3 -c 'print(1)'``): they are
quoted with :func:`shlex.join` for ``bash -c``.

``exec -it`` and ``shell`` behave as ``docker exec -it``: the command (or the login shell) runs
on a terminal of its own in the sandbox (:meth:`E2BSandboxProvider.terminal`), our terminal is
put in raw mode (every key, Ctrl-C, Ctrl-D and Ctrl-\\ included, goes to the remote program)
and restored on every way out (the program's end, its SIGKILL, a lost connection, a signal to
us), the window size is sent at the start and on every SIGWINCH, and the remote exit status is
ours. One selector loop on the main thread reads our input and the terminal's stream (no
thread). ``-t`` needs our standard input to be a terminal; ``-i`` alone feeds it to a command
without a terminal (a pipe, or a terminal in its usual line mode).

Commands::

    e2b-provider create NAME [--cpu N] [--memory-mb N] [--disk-mb N] [--egress MODE]
                             [--allow-host HOST]...
    e2b-provider exec SANDBOX [-i] [-t] [--timeout S] [--cwd DIR] [--env K=V]... [-- CMD [ARG...]]
                             (our stdin goes to CMD unless it is a terminal, or with -i)
    e2b-provider shell SANDBOX [--cwd DIR] [--env K=V]...   (as exec -it: the login shell)
    e2b-provider start SANDBOX [--timeout S] [--cwd DIR] [--env K=V]... [--tag T]
                              [--max-output-bytes N] -- CMD [ARG...]
    e2b-provider logs [-f] SANDBOX ID
    e2b-provider kill SANDBOX ID
    e2b-provider ps [--no-trunc] SANDBOX
    e2b-provider cp [-r] [--exclude PATTERN]... SRC DST   (one side is SANDBOX:/path)
    e2b-provider ls [--name NAME]
    e2b-provider ls [-l] [--depth N] SANDBOX:/path
    e2b-provider forward SANDBOX [LOCAL:]PORT [--local-port N]   (until Ctrl-C)
    e2b-provider url SANDBOX PORT
    e2b-provider watch SANDBOX PATH [-r] [--json] [--timeout S]   (until Ctrl-C)
    e2b-provider rm SANDBOX...
    e2b-provider suspend SANDBOX
    e2b-provider resume SANDBOX
    e2b-provider emulator [--host H] [--port N] [--api-key KEY] [--state-dir DIR]
                          [--cpu-count N] [--memory-mb N] [--disk-mb N] [--max-processes N]
                          [--log-level LEVEL] ...  (as python -m e2b_provider.emulator)
"""

from __future__ import annotations

import sys

try:
    import argparse
    import contextlib
    import json
    import logging
    import os
    import posixpath
    import re
    import select
    import selectors
    import shlex
    import shutil
    import signal
    import stat
    import threading
    import time
    from datetime import datetime
    from typing import (
        IO,
        Any,
        BinaryIO,
        Callable,
        Dict,
        Iterator,
        List,
        Optional,
        Sequence,
        TextIO,
        Tuple,
        Union,
    )

    from .._version import __version__
    from ..commands.background import Command
    from ..commands.terminals import Terminal
    from ..config import DeploymentConfig
    from ..errors import CommandEnded, E2BProviderError, InvalidArgument, OperationTimeout
    from ..models import ExecResult, FileEvent, SandboxHandle, SandboxLimits
    from ..protocol import validate as v
    from ..provider import E2BSandboxProvider
except KeyboardInterrupt:  # Ctrl-C while the command line starts: one line, no traceback
    sys.stderr.write("e2b-provider: interrupted\n")
    raise SystemExit(130) from None

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_TIMED_OUT", "EXIT_USAGE", "main"]

PROG = "e2b-provider"
#: ``exec``'s timeout unless ``--timeout`` says otherwise (``exec -t``: none).
DEFAULT_EXEC_TIMEOUT = 600.0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TIMED_OUT = 124
EXIT_INTERRUPTED = 130
#: Output kept (and shown) per ``exec`` unless ``--max-output-bytes`` says otherwise.
DEFAULT_EXEC_OUTPUT = 64 << 20
#: Output the sandbox keeps per stream of a ``start``-ed command unless told otherwise.
DEFAULT_START_OUTPUT = 1 << 20
#: Transfers at least this large show a progress line on a terminal.
PROGRESS_FROM_BYTES = 4 << 20


class UsageError(Exception):
    """A mistake in how the command was called (exit status 2)."""


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _config() -> DeploymentConfig:
    return DeploymentConfig.from_env()


def _valid(check: Callable[[str], object], ref: str) -> bool:
    try:
        check(ref)
    except InvalidArgument:
        return False
    return True


def _resolve(p: E2BSandboxProvider, ref: str) -> SandboxHandle:
    """A sandbox by name (created by this library) or by id.

    Raises:
        UsageError: ``ref`` can be neither a name nor an id.
        E2BProviderError: no such sandbox, or several of that name (exit status 1).
    """
    is_name, is_id = _valid(v.check_name, ref), _valid(v.check_sandbox_id, ref)
    if not is_name and not is_id:
        raise UsageError(f"{ref!r} is neither a sandbox name nor a sandbox id")
    named = p.list_sandboxes(ref) if is_name else []
    if len(named) == 1:
        return named[0].handle
    if len(named) > 1:
        ids = ", ".join(s.id for s in named)
        raise E2BProviderError(f"{len(named)} sandboxes are named {ref!r} ({ids}); give an id")
    if not is_id:
        raise E2BProviderError(f"no sandbox is named {ref!r}")
    if not any(s.id == ref for s in p.list_sandboxes()):
        raise E2BProviderError(f"no sandbox is named {ref!r} or has that id")
    return SandboxHandle(ref)


def _env(items: Sequence[str]) -> Dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env takes KEY=VALUE, not {item!r}")
        env[key] = value
    return env


def _command_line(argv: Sequence[str], cmd: str) -> str:
    """The line ``bash -c`` runs for the words after ``--``: one word is a shell command
    line, taken as it is; several are an argument vector, quoted so that each word reaches
    the command unchanged (as ``docker exec`` and ``kubectl exec`` pass them)."""
    if not argv:
        raise UsageError(f"{cmd} needs a command after --")
    if len(argv) == 1:
        return argv[0]
    return shlex.join(argv)


def _our_stdin(even_a_terminal: bool = False) -> Optional[BinaryIO]:
    """Our standard input for the command, unless it is a terminal (or closed); with
    ``even_a_terminal`` (``exec -i``), a terminal too.

    A raw reader of file descriptor 0, not ``sys.stdin.buffer``: the library reads it on
    a daemon thread, which may still be blocked in a read when we exit (the command ended
    without reading all of it), and a buffered reader's lock held there makes the
    interpreter's shutdown abort.
    """
    if sys.stdin is None:
        return None
    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd) and not even_a_terminal:
            return None
        return os.fdopen(fd, "rb", buffering=0, closefd=False)
    except (OSError, ValueError):
        return None


def _exit_status(r: ExecResult, timed_out: str) -> int:
    """The exit status to give for a command's result (``timed_out``: what to say then)."""
    if r.timed_out:
        print(f"{PROG}: {timed_out}", file=sys.stderr)
        return EXIT_TIMED_OUT
    if r.exit_code is None:
        why = "was killed" if r.cancelled else "ended without an exit status"
        print(f"{PROG}: the command {why}", file=sys.stderr)
        return EXIT_ERROR
    return r.exit_code if 0 <= r.exit_code <= 255 else EXIT_ERROR


_CID = re.compile(r"[0-9a-f]{32}")


def _found(p: E2BSandboxProvider, h: SandboxHandle, ref: str) -> Union[Command, Terminal]:
    """The background command (or terminal) ``ref`` of the sandbox: its id, or (a command)
    the 32 hex digits after its ``:``."""
    return p.attach(h, f"{h.id}:{ref}" if _CID.fullmatch(ref) else ref)


def _attach(p: E2BSandboxProvider, h: SandboxHandle, ref: str) -> Command:
    """The background command ``ref`` of the sandbox (see :func:`_found`)."""
    found = _found(p, h, ref)
    if not isinstance(found, Command):
        found.detach()
        raise UsageError(f"{ref[:120]} is a terminal, not a background command: its output "
                         "is not kept (kill stops it)")
    return found


def _split_remote(spec: str) -> Optional[tuple[str, str]]:
    """``("SANDBOX", "/path")`` for ``SANDBOX:/path``; None for a local path."""
    head, sep, tail = spec.partition(":")
    if not sep or not head or not tail.startswith("/") or "/" in head:
        return None
    return head, tail.rstrip("/") or "/"


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class _Progress:
    """A one-line progress display on a terminal, fed by a transfer's ``progress``
    callback (at most 8 updates a second; nothing when stderr is not a terminal)."""

    def __init__(self, what: str, stream: TextIO) -> None:
        self._what = what
        self._stream = stream
        self._on = stream.isatty()
        self._t0 = time.monotonic()
        self._last = 0.0
        self._done = 0
        self._total: Optional[int] = None
        self.shown = False

    def __call__(self, done: int, total: Optional[int]) -> None:
        self._done, self._total = done, total
        now = time.monotonic()
        if not self._on or now - self._last < 0.125:
            return
        self._last = now
        took = now - self._t0
        if took < 0.5 and (total or 0) < PROGRESS_FROM_BYTES:
            return
        share = f" {100 * done / total:.0f}%" if total else ""
        of = f" of {_mib(total)}" if total else ""
        self._stream.write(f"\r{self._what}: {_mib(done)}{of}{share} {took:.1f} s\033[K")
        self._stream.flush()
        self.shown = True

    def finish(self, ok: bool) -> None:
        """End the line: the total and rate when it went well, else just clear it."""
        if not self.shown:
            return
        took = time.monotonic() - self._t0
        if ok:
            rate = self._done / took if took > 0 else 0.0
            line = f"\r{self._what}: {_mib(self._done)} in {took:.1f} s ({_mib(rate)}/s)\033[K\n"
        else:
            line = "\r\033[K"
        self._stream.write(line)
        self._stream.flush()


def _writer(stream: IO[str]) -> Callable[[str], None]:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


# --------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------


def _cmd_create(args: argparse.Namespace) -> int:
    given = {"cpu": args.cpu, "memory_mb": args.memory_mb, "disk_mb": args.disk_mb}
    limits = SandboxLimits(
        egress=args.egress,
        allow_hosts=tuple(args.allow_host),
        **{k: val for k, val in given.items() if val is not None},
    )
    with E2BSandboxProvider(_config()) as p:
        h = p.create(args.name, limits)
    print(h.id)
    if any(val is not None for val in given.values()):
        sizes = (f"{h.cpu_count if h.cpu_count is not None else '?'} CPUs, "
                 f"{h.memory_mb if h.memory_mb is not None else '?'} MiB memory, "
                 f"{h.disk_mb if h.disk_mb is not None else '?'} MiB disk")
        print(f"{PROG}: sandbox {h.id} has {sizes} (its template's sizes)", file=sys.stderr)
    return 0


def _cmd_exec(args: argparse.Namespace) -> int:
    if args.tty:
        command = _command_line(args.command, "exec") if args.command else None
        return _terminal(args, command, interactive=args.interactive)
    command = _command_line(args.command, "exec")
    env = _env(args.env)
    timeout = DEFAULT_EXEC_TIMEOUT if args.timeout is None else args.timeout
    with E2BSandboxProvider(_config()) as p:
        h = _resolve(p, args.sandbox)
        r = p.exec(
            h,
            command,
            timeout=timeout,
            cwd=args.cwd,
            env=env or None,
            max_output_bytes=args.max_output_bytes,
            on_stdout=_writer(sys.stdout),
            on_stderr=_writer(sys.stderr),
            stdin=_our_stdin(even_a_terminal=args.interactive),
        )
    if r.truncated:
        print(f"{PROG}: output past {args.max_output_bytes} bytes was dropped", file=sys.stderr)
    return _exit_status(r, f"timed out after {timeout:g} s (the command was killed)")


def _cmd_shell(args: argparse.Namespace) -> int:
    return _terminal(args, None, interactive=True)


# -- terminals (exec -it, shell) ----------------------------------------------------------


class _Signalled(Exception):
    """A signal that ends a terminal session (SIGTERM, SIGHUP, SIGQUIT sent to us)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def _window(fds: Sequence[int]) -> Tuple[int, int]:
    """``(cols, rows)`` of the first of ``fds`` that is a terminal (80 x 24 if none is)."""
    for fd in fds:
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        if size.columns > 0 and size.lines > 0:
            return min(size.columns, 0xFFFF), min(size.lines, 0xFFFF)
    return 80, 24


@contextlib.contextmanager
def _raw(fd: int, on: bool) -> Iterator[None]:
    """Our terminal in raw mode for the block (as ``docker exec -it`` sets it: no line
    editing, no echo, no signals from keys, no output processing), restored however the
    block ends."""
    if not on:
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _signals() -> Iterator[Tuple[int, List[int]]]:
    """For the block: SIGWINCH noted (its number appended to the list) and SIGTERM, SIGHUP,
    SIGQUIT raised as :class:`_Signalled`; every signal wakes the descriptor yielded (a
    selector waits on it). The previous handlers come back afterwards."""
    got: List[int] = []
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    previous: Dict[int, Any] = {}

    def note(signum: int, _frame: object) -> None:
        got.append(signum)

    def stop(signum: int, _frame: object) -> None:
        raise _Signalled(signum)

    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        previous[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, note)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            previous[sig] = signal.signal(sig, stop)
        yield r, got
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        signal.set_wakeup_fd(old_fd)
        os.close(r)
        os.close(w)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _terminal(args: argparse.Namespace, command: Optional[str], *, interactive: bool) -> int:
    """Run ``command`` (None: the login shell) on a terminal in the sandbox, ours attached:
    see the module's docstring. Returns the remote exit status."""
    fd_in = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd_in < 0 or not os.isatty(fd_in):
        raise UsageError(
            "the input device is not a terminal: -t (and shell) need one; use -i alone to "
            "feed a pipe or file to a command"
        )
    fd_out = sys.stdout.fileno()
    env = _env(args.env)
    with E2BSandboxProvider(_config()) as p:
        h = _resolve(p, args.sandbox)
        cols, rows = _window((fd_out, fd_in))
        sys.stdout.flush()
        term = p.terminal(h, command, cols=cols, rows=rows, cwd=args.cwd, env=env or None,
                          timeout=getattr(args, "timeout", None))
        try:
            with _signals() as (wake, got), _raw(fd_in, interactive):
                code = _session(term, fd_in, fd_out, wake, got, interactive)
        except _Signalled as stopped:
            print(f"{PROG}: stopped by signal {stopped.signum}; the remote terminal was "
                  "killed", file=sys.stderr)
            return 128 + stopped.signum
        finally:
            term.close()  # kills it if it still runs (our terminal is restored already)
    if term.timed_out:
        print(f"{PROG}: timed out after {args.timeout:g} s (the terminal was killed)",
              file=sys.stderr)
        return EXIT_TIMED_OUT
    return code if 0 <= code <= 255 else EXIT_ERROR


def _session(term: Terminal, fd_in: int, fd_out: int, wake: int, got: List[int],
             interactive: bool) -> int:
    """Pass our keys to ``term`` and its output to ``fd_out`` until it ends; its status."""
    sel = selectors.DefaultSelector()
    try:
        sel.register(term.fileno(), selectors.EVENT_READ, "out")
        sel.register(wake, selectors.EVENT_READ, "wake")
        if interactive:
            sel.register(fd_in, selectors.EVENT_READ, "in")
        while True:
            while True:  # what the terminal sent (also what the select cannot see)
                try:
                    data = term.read(timeout=0)
                except OperationTimeout:
                    break
                if not data:
                    return term.wait(timeout=30)
                _write_all(fd_out, data)
            _resize_if_signalled(term, got, (fd_out, fd_in))
            for key, _ in sel.select(timeout=5.0):
                if key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake, 512)
                elif key.data == "in":
                    typed = os.read(fd_in, 65536)
                    if not typed:  # our terminal hung up
                        sel.unregister(fd_in)
                        continue
                    # a resize noted with these keys goes first: a command typed after a
                    # resize (`stty size`) must see the new size
                    _resize_if_signalled(term, got, (fd_out, fd_in))
                    try:
                        term.write(typed)
                    except CommandEnded:
                        pass  # its end is read next
    finally:
        sel.close()


def _resize_if_signalled(term: Terminal, got: List[int], fds: Tuple[int, int]) -> None:
    """Send our window's size to ``term`` if a SIGWINCH was noted since the last time."""
    if got:
        got.clear()
        try:
            term.resize(*_window(fds))
        except CommandEnded:
            pass


def _cmd_start(args: argparse.Namespace) -> int:
    command = _command_line(args.command, "start")
    env = _env(args.env)
    with E2BSandboxProvider(_config()) as p:
        h = _resolve(p, args.sandbox)
        c = p.start(
            h,
            command,
            timeout=args.timeout,
            cwd=args.cwd,
            env=env or None,
            tag=args.tag,
            max_output_bytes=args.max_output_bytes,
        )
    print(c.id)
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    with E2BSandboxProvider(_config()) as p:
        c = _attach(p, _resolve(p, args.sandbox), args.id)
        if not args.follow:
            out = c.output()
            sys.stdout.write(out.stdout)
            sys.stdout.flush()
            sys.stderr.write(out.stderr)
            if out.truncated:
                print(f"{PROG}: earlier output was not kept (the sandbox keeps the last "
                      "--max-output-bytes of each stream)", file=sys.stderr)
            return 0
        try:
            r = c.wait(on_stdout=_writer(sys.stdout), on_stderr=_writer(sys.stderr))
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted (command {c.id} goes on)", file=sys.stderr)
            return EXIT_INTERRUPTED
    return _exit_status(r, "the command timed out (it was killed)")


def _cmd_kill(args: argparse.Namespace) -> int:
    with E2BSandboxProvider(_config()) as p:
        c = _found(p, _resolve(p, args.sandbox), args.id)
        c.kill()
        if isinstance(c, Terminal):
            c.detach()
    print(c.id)
    return 0


def _cmd_ps(args: argparse.Namespace) -> int:
    with E2BSandboxProvider(_config()) as p:
        rows = p.commands(_resolve(p, args.sandbox))
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


def _cmd_cp(args: argparse.Namespace) -> int:
    src, dst = _split_remote(args.src), _split_remote(args.dst)
    if (src is None) == (dst is None):
        raise UsageError(
            "cp copies between this machine and a sandbox: write exactly one "
            "side as SANDBOX:/absolute/path"
        )
    exclude = list(args.exclude)
    progress = _Progress(f"{args.src} -> {args.dst}", sys.stderr)
    with E2BSandboxProvider(_config()) as p:
        ok = False
        try:
            if dst is not None:  # upload
                if os.path.isdir(args.src) and not args.recursive:
                    raise E2BProviderError(f"-r not given; omitting directory {args.src!r}")
                if not os.path.lexists(args.src):
                    raise E2BProviderError(f"cannot stat {args.src!r}: No such file or directory")
                h = _resolve(p, dst[0])
                target = dst[1]
                there = p.stat(h, target)
                if there is not None and there.is_dir:
                    name = os.path.basename(os.path.normpath(args.src))
                    target = posixpath.join(target, name) if name not in ("", ".", "..") \
                        else target
                p.upload(h, args.src, target, exclude=exclude, progress=progress)
            else:
                assert src is not None
                h = _resolve(p, src[0])
                st = p.stat(h, src[1])
                if st is None:
                    raise E2BProviderError(f"{args.src}: no such file or directory in the sandbox")
                if st.is_dir and not args.recursive:
                    raise E2BProviderError(f"-r not given; omitting directory {args.src!r}")
                target = args.dst
                if os.path.isdir(target):
                    name = posixpath.basename(src[1].rstrip("/"))
                    if name:
                        target = os.path.join(target, name)
                p.download(h, src[1], target, exclude=exclude, progress=progress)
            ok = True
        finally:
            progress.finish(ok)
    return 0


def _cmd_ls_files(args: argparse.Namespace, where: Tuple[str, str]) -> int:
    with E2BSandboxProvider(_config()) as p:
        h = _resolve(p, where[0])
        entries = p.list_dir(h, where[1], depth=args.depth)
    if entries is None:
        raise E2BProviderError(f"{where[0]}:{where[1]}: no such file or directory")
    for e in entries:
        name = e.path if args.depth > 1 else e.name
        if not args.long:
            print(name)
            continue
        kind = {"dir": "d", "symlink": "l", "file": "-"}.get(e.type, "?")
        when = e.mtime.strftime("%Y-%m-%d %H:%M")
        link = f" -> {e.symlink_target}" if e.symlink_target is not None else ""
        print(f"{kind}{_mode_text(e.mode)} {e.size:>12} {when} {name}{link}")
    return 0


def _mode_text(mode: int) -> str:
    bits = "rwxrwxrwx"
    return "".join(b if mode & (1 << (8 - i)) else "-" for i, b in enumerate(bits))


def _cmd_ls(args: argparse.Namespace) -> int:
    if args.where is not None:
        where = _split_remote(args.where)
        if where is None:
            raise UsageError("ls takes SANDBOX:/absolute/path (or no argument: the sandboxes)")
        return _cmd_ls_files(args, where)
    with E2BSandboxProvider(_config()) as p:
        rows = p.list_sandboxes(args.name)
    table = [("ID", "NAME", "STATE", "STARTED")]
    for s in rows:
        started = s.started_at.strftime("%Y-%m-%d %H:%M:%S UTC") if s.started_at else "-"
        table.append((s.id, s.name or "-", s.state, started))
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    with E2BSandboxProvider(_config()) as p:
        for ref in args.sandboxes:
            p.destroy(_resolve(p, ref))
            print(ref)
    return 0


def _port_type(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError("ports are from 1 to 65535")
    return value


def _ports_type(text: str) -> Tuple[Optional[int], int]:
    """``PORT`` or ``LOCAL:PORT`` (as ``kubectl port-forward`` takes them)."""
    local, sep, remote = text.rpartition(":")
    return (_port_type(local) if sep else None), _port_type(remote)


def _cmd_forward(args: argparse.Namespace) -> int:
    local_port, port = args.port
    if args.local_port is not None:
        if local_port is not None and local_port != args.local_port:
            raise UsageError("give the local port once (LOCAL:PORT or --local-port)")
        local_port = args.local_port
    with E2BSandboxProvider(_config()) as p:
        h = _resolve(p, args.sandbox)
        with p.forward(h, port, local_port=local_port or 0) as url:
            print(f"Forwarding from {url[len('http://'):]} -> {port}", flush=True)
            print(f"{PROG}: open {url}/ (port {port} of sandbox {h.id}); Ctrl-C stops",
                  file=sys.stderr, flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                print(f"{PROG}: stopped forwarding", file=sys.stderr)
    return 0


def _cmd_url(args: argparse.Namespace) -> int:
    with E2BSandboxProvider(_config()) as p:
        print(p.url(_resolve(p, args.sandbox), args.port))
    return 0


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _event_line(event: FileEvent, as_json: bool) -> str:
    """One line for one event: ``create /workspace/a.txt`` (control characters in the path
    escaped, so one event stays one line), or a JSON object."""
    if as_json:
        return json.dumps({"type": event.type, "path": event.path})
    path = _CONTROL.sub(lambda m: repr(m.group())[1:-1], event.path)
    return f"{event.type} {path}"


def _on_reader_gone(stream: TextIO, stop: Callable[[], None]) -> None:
    """Call ``stop`` (once, from a daemon thread) when the reader of ``stream`` goes away
    (a pipe whose other end closed: ``| head``), even while nothing is written to it."""
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return  # a terminal or a file: its reader does not go away
        poller = select.poll()
        poller.register(fd, select.POLLERR | select.POLLHUP)
    except (OSError, ValueError, AttributeError):
        return

    def wait() -> None:
        try:
            while not poller.poll(3600 * 1000):
                pass
        except (OSError, ValueError):
            return
        stop()

    threading.Thread(target=wait, name="e2b-provider-cli-stdout", daemon=True).start()


def _cmd_watch(args: argparse.Namespace) -> int:
    gone = threading.Event()
    with E2BSandboxProvider(_config()) as p:
        h = _resolve(p, args.sandbox)
        try:
            with p.watch(h, args.path, recursive=args.recursive, timeout=args.timeout) as events:
                print(f"{PROG}: watching {args.path} in sandbox {h.id}; Ctrl-C stops",
                      file=sys.stderr, flush=True)

                def reader_gone() -> None:
                    gone.set()
                    events.close()

                _on_reader_gone(sys.stdout, reader_gone)
                for event in events:
                    sys.stdout.write(_event_line(event, args.json) + "\n")
                    sys.stdout.flush()
        except KeyboardInterrupt:
            print(f"{PROG}: stopped watching", file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            gone.set()
        if gone.is_set():
            # Our reader went away: end quietly (nothing more is written to the pipe).
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
    return 0


def _cmd_suspend(args: argparse.Namespace) -> int:
    with E2BSandboxProvider(_config()) as p:
        p.suspend(_resolve(p, args.sandbox))
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    with E2BSandboxProvider(_config()) as p:
        outcome = p.resume(_resolve(p, args.sandbox))
    if outcome == "gone":
        print(f"{PROG}: sandbox {args.sandbox} no longer exists", file=sys.stderr)
        return EXIT_ERROR
    return 0


def _cmd_emulator(args: argparse.Namespace) -> int:
    from ..emulator.__main__ import EXIT_UNAVAILABLE, run

    # The same options, output and signal handling as python -m e2b_provider.emulator: the
    # export lines alone on stdout, the ready line on stderr; Ctrl-C and SIGTERM stop it.
    status = run(args, name=f"{PROG} emulator")
    # "cannot run here" is a runtime error for this command line (2 is for usage errors)
    return EXIT_ERROR if status == EXIT_UNAVAILABLE else status


# --------------------------------------------------------------------------------------
# parser and main
# --------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def _add_cwd_and_env(cmd: argparse.ArgumentParser) -> None:
    """The options of a command that runs something in the sandbox: ``--cwd``, ``--env``."""
    cmd.add_argument("--cwd", default=None, help="working directory (default /workspace)")
    cmd.add_argument("--env", action="append", default=[], metavar="K=V",
                     help="an environment variable (repeatable)")


def parser(*, emulator_options: bool = True) -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests).

    ``emulator_options=False`` leaves the options of ``emulator`` out: they come from
    :mod:`e2b_provider.emulator.__main__`, whose import the other commands need not pay for.
    """
    env_help = (
        "Configuration comes from the environment: E2B_API_KEY, E2B_TEMPLATE, and optionally "
        "E2B_API_URL, E2B_DOMAIN, E2B_SANDBOX_URL, E2B_TIMEOUT_SECONDS. "
        f"'{PROG} emulator' prints them for a local emulator."
    )
    p = _Parser(prog=PROG, description="E2B sandboxes from the shell.", epilog=env_help)
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    c = sub.add_parser(
        "create",
        help="create a sandbox (older ones of that name are destroyed)",
        description="Create a sandbox and print its id. Older sandboxes of the "
        "same name are destroyed first.",
    )
    c.add_argument("name", metavar="NAME")
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
    c.set_defaults(func=_cmd_create)

    e = sub.add_parser(
        "exec",
        help="run a command, output streamed live (-it: on a terminal, as docker exec -it)",
        description="Run a command in the sandbox as user sandbox, streaming its output. "
        "After --, one word is a shell command line, run by bash -c (-- 'make && ./run'); "
        "several words are the command and its arguments, each passed unchanged (-- python3 "
        "-c 'print(1)'), as docker exec does. When our standard input is not a terminal "
        "(a pipe, a file), the command reads it, e.g. 'echo hi | e2b-provider exec SB -- "
        "cat'; on a terminal it reads nothing "
        "(</dev/null) unless -i is given. Exits with the command's status; 124 if it timed "
        "out; 130 on Ctrl-C, after the remote command was killed. With -it the command "
        "(without one: the login shell) runs on a terminal in the sandbox and ours is "
        "attached to it in raw mode, as docker exec -it: every key goes to it (Ctrl-C too), "
        "its window follows ours, and we exit with its status.",
    )
    e.add_argument("sandbox", metavar="SANDBOX", help="a sandbox name or id")
    e.add_argument("-i", "--interactive", action="store_true",
                   help="feed our standard input to the command even when it is a terminal "
                   "(with -t: our keys, in raw mode)")
    e.add_argument("-t", "--tty", action="store_true",
                   help="run the command on a terminal (pty) in the sandbox; our standard "
                   "input must be a terminal")
    e.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        help=f"seconds before the command is killed (default {DEFAULT_EXEC_TIMEOUT:g}; "
        "with -t: none)",
    )
    _add_cwd_and_env(e)
    e.add_argument(
        "--max-output-bytes",
        type=int,
        default=DEFAULT_EXEC_OUTPUT,
        help=f"output shown at most (default {DEFAULT_EXEC_OUTPUT})",
    )
    e.add_argument("command", nargs="*", metavar="CMD [ARG...]",
                   help="after --: one shell command line, or a command and its arguments")
    e.set_defaults(func=_cmd_exec)

    sh = sub.add_parser(
        "shell",
        help="open the sandbox user's login shell on a terminal (as exec -it)",
        description="Open the login shell of user sandbox on a terminal in the sandbox, "
        "ours attached in raw mode, as 'docker exec -it C bash' or 'kubectl exec -it P -- "
        "bash'; the same as 'exec -it SANDBOX'. Exits with the shell's status.",
    )
    sh.add_argument("sandbox", metavar="SANDBOX", help="a sandbox name or id")
    _add_cwd_and_env(sh)
    sh.set_defaults(func=_cmd_shell)

    st = sub.add_parser(
        "start",
        help="start a command in the background and print its id",
        description="Start a command in the sandbox in the background, as user sandbox, "
        "and print its id. After --, as for exec: one word is a shell command line, run by "
        "bash -c; several words are the command and its arguments, each passed unchanged. "
        "It runs on after we exit; the sandbox keeps the last --max-output-bytes of its "
        "stdout and of its stderr, and its exit status: see logs, ps and kill. It reads "
        "nothing on its standard input.",
    )
    st.add_argument("sandbox", metavar="SANDBOX", help="a sandbox name or id")
    st.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        help="seconds before the command is killed (default: none, it runs until it ends)",
    )
    _add_cwd_and_env(st)
    st.add_argument("--tag", default=None, help="a tag, shown by ps")
    st.add_argument(
        "--max-output-bytes",
        type=int,
        default=DEFAULT_START_OUTPUT,
        help=f"output kept per stream, the latest (default {DEFAULT_START_OUTPUT}, "
        "at least 1024)",
    )
    st.add_argument("command", nargs="*", metavar="CMD [ARG...]",
                    help="after --: one shell command line, or a command and its arguments")
    st.set_defaults(func=_cmd_start)

    id_help = "a command id, as start and ps print it (or its 32 hex digits after the ':')"
    lg = sub.add_parser(
        "logs",
        help="show the output of a background command",
        description="Print the output the sandbox keeps of a background command "
        "(stdout to stdout, stderr to stderr). With -f, then follow it live until the "
        "command ends and exit with its status (124 if it timed out, 1 if it was killed "
        "or its status is unknown); Ctrl-C stops following (exit 130), not the command.",
    )
    lg.add_argument("sandbox", metavar="SANDBOX", help="a sandbox name or id")
    lg.add_argument("id", metavar="ID", help=id_help)
    lg.add_argument("-f", "--follow", action="store_true",
                    help="follow the output until the command ends")
    lg.set_defaults(func=_cmd_logs)

    k = sub.add_parser(
        "kill",
        help="stop a background command",
        description="Stop a background command and its whole process tree (killing "
        "one that has ended does nothing). Prints its id.",
    )
    k.add_argument("sandbox", metavar="SANDBOX", help="a sandbox name or id")
    k.add_argument("id", metavar="ID", help=id_help)
    k.set_defaults(func=_cmd_kill)

    ps = sub.add_parser(
        "ps",
        help="list the background commands and terminals that run in a sandbox",
        description="List the background commands and the terminals (their ids have "
        "pty-) that still run in the sandbox, whoever started them, oldest first: id, pid, "
        "tag, start time (local) and command line (cut to the terminal's width unless "
        "--no-trunc). logs takes a command's id, kill either.",
    )
    ps.add_argument("sandbox", metavar="SANDBOX", help="a sandbox name or id")
    ps.add_argument("--no-trunc", action="store_true", help="show whole command lines")
    ps.set_defaults(func=_cmd_ps)

    cp = sub.add_parser(
        "cp",
        help="copy files or directories to or from a sandbox",
        description="Copy a file, or with -r a directory tree, between this machine "
        "and a sandbox; write the sandbox side as SANDBOX:/absolute/path. As cp does: "
        "when DST is an existing directory the copy goes into it. Each file is written "
        "whole or not at all; symbolic links are copied as links. A progress line is "
        "shown on a terminal.",
    )
    cp.add_argument("-r", "-R", "--recursive", action="store_true",
                    help="copy directories and everything below them")
    cp.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                    help="skip entries whose relative path or name matches (repeatable)")
    cp.add_argument("src", metavar="SRC")
    cp.add_argument("dst", metavar="DST")
    cp.set_defaults(func=_cmd_cp)

    ls = sub.add_parser(
        "ls",
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
    ls.set_defaults(func=_cmd_ls)

    fw = sub.add_parser(
        "forward",
        help="serve a sandbox port on this machine (like kubectl port-forward)",
        description="Listen on 127.0.0.1 and relay every connection (HTTP/1.1, streaming, "
        "Server-Sent Events, WebSockets) to PORT inside the sandbox, through E2B's edge or "
        "the emulator, adding the sandbox's traffic token when its traffic is private. "
        "Prints 'Forwarding from 127.0.0.1:LOCAL -> PORT', then runs until Ctrl-C "
        "(exit 0).",
    )
    fw.add_argument("sandbox", metavar="SANDBOX", help="a sandbox name or id")
    fw.add_argument("port", type=_ports_type, metavar="[LOCAL:]PORT",
                    help="the port inside the sandbox, optionally after the local port")
    fw.add_argument("--local-port", type=_port_type, default=None, metavar="N",
                    help="the local port (default: a free one)")
    fw.set_defaults(func=_cmd_forward)

    ur = sub.add_parser(
        "url",
        help="print the URL of a sandbox port",
        description="Print the URL at which E2B serves PORT of the sandbox (on the "
        "emulator, one a browser on this machine opens). Requests to it need the "
        "sandbox's traffic token when its traffic is private; 'forward' adds it.",
    )
    ur.add_argument("sandbox", metavar="SANDBOX", help="a sandbox name or id")
    ur.add_argument("port", type=_port_type, metavar="PORT")
    ur.set_defaults(func=_cmd_url)

    wt = sub.add_parser(
        "watch",
        help="print the changes in a sandbox directory as they happen",
        description="Watch a directory of the sandbox (as user sandbox: it must exist and "
        "be readable by it) and print one line per change as it happens, until Ctrl-C "
        "(exit 130): 'create PATH', 'write PATH', 'remove PATH', 'rename PATH' (the old "
        "name; the new one comes as create), 'chmod PATH', or 'overflow DIR' when changes "
        "came faster than they were read and some were lost (the watch goes on). Paths are "
        "absolute. Exits 0 once --timeout passed, the directory itself was removed or "
        "renamed, or the reader of the output went away (| head -n 1).",
    )
    wt.add_argument("sandbox", metavar="SANDBOX", help="a sandbox name or id")
    wt.add_argument("path", metavar="PATH", help="an absolute directory path in the sandbox")
    wt.add_argument("-r", "--recursive", action="store_true",
                    help="watch every directory below PATH too")
    wt.add_argument("--json", action="store_true",
                    help='one JSON object per line: {"type": ..., "path": ...}')
    wt.add_argument("--timeout", type=_positive_float, default=None,
                    help="stop after this many seconds (exit 0)")
    wt.set_defaults(func=_cmd_watch)

    rm = sub.add_parser("rm", help="destroy sandboxes", description="Destroy sandboxes.")
    rm.add_argument("sandboxes", nargs="+", metavar="SANDBOX")
    rm.set_defaults(func=_cmd_rm)

    for name, func, what in (
        ("suspend", _cmd_suspend, "pause a sandbox (memory kept)"),
        ("resume", _cmd_resume, "resume a paused sandbox"),
    ):
        s = sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        s.add_argument("sandbox", metavar="SANDBOX")
        s.set_defaults(func=func)

    em = sub.add_parser(
        "emulator",
        help="run the local E2B emulator in the foreground",
        description="Run the local E2B emulator in the foreground until Ctrl-C or "
        "SIGTERM (which destroy its sandboxes), as python -m e2b_provider.emulator does, "
        "with the same options. Once it serves, it writes the export lines another shell "
        "needs, and only them, on stdout, then a ready line on stderr: e.g. "
        "'e2b-provider emulator > e2b.env' here and '. ./e2b.env' there.",
    )
    if emulator_options:
        from ..emulator.__main__ import add_arguments

        add_arguments(em)
    em.set_defaults(func=_cmd_emulator)
    return p


class _WarningLines(logging.Formatter):
    """The library's warnings as the command line's own lines: ``e2b-provider: warning: ...``."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if text.startswith("e2b_provider: "):
            text = text[len("e2b_provider: "):]
        return f"{PROG}: warning: {text}"


def _show_warnings() -> None:
    lib = logging.getLogger("e2b_provider")
    if not lib.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(_WarningLines())
        lib.addHandler(handler)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    _show_warnings()
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # while it starts (parsing, configuration) or waits
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(words: List[str]) -> int:
    tail: Optional[List[str]] = None
    if "--" in words:
        # argparse's sub-commands do not pass "--" on: split it off here.
        i = words.index("--")
        words, tail = words[:i], words[i + 1 :]
    p = parser(emulator_options="emulator" in words)
    args = p.parse_args(words)
    if tail is not None:
        if args.cmd not in ("exec", "start"):
            p.error("only exec and start take a command after --")
        args.command = [*args.command, *tail]
    try:
        return int(args.func(args))
    except (UsageError, InvalidArgument) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except E2BProviderError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # stdout closed early (| head): not an error of ours
        sys.stderr.close()
        return EXIT_ERROR
    except OSError as exc:  # a local file (cp, ls) or our own output
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def console_main() -> None:  # pragma: no cover - the console-script entry point
    """Entry point of the ``e2b-provider`` console script."""
    sys.exit(main())
