"""``exec -it`` and ``shell``: a command (or the login shell) on a terminal in the sandbox,
ours attached, as ``docker exec -it``.

The command runs on a terminal of its own in the sandbox (:meth:`E2BSandboxProvider.terminal`),
our terminal is put in raw mode (every key, Ctrl-C, Ctrl-D and Ctrl-\\ included, goes to the
remote program) and restored on every way out (the program's end, its SIGKILL, a lost
connection, a signal to us), the window size is sent at the start and on every SIGWINCH, and
the remote exit status is ours. One selector loop on the main thread reads our input and the
terminal's stream (no thread). ``-t`` needs our standard input to be a terminal; ``-i`` alone
feeds it to a command without a terminal (a pipe, or a terminal in its usual line mode).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ..commands.terminal_handle import Terminal
from ..errors import CommandEnded, OperationTimeout
from .exits import EXIT_ERROR, EXIT_TIMED_OUT, PROG, UsageError
from .inputs import env_vars
from .lookup import connect, resolve


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


def run_terminal(args: argparse.Namespace, command: Optional[str], *, interactive: bool) -> int:
    """Run ``command`` (None: the login shell) on a terminal in the sandbox, ours attached:
    see the module's docstring. Returns the remote exit status."""
    fd_in = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd_in < 0 or not os.isatty(fd_in):
        raise UsageError(
            "the input device is not a terminal: -t (and shell) need one; use -i alone to "
            "feed a pipe or file to a command"
        )
    fd_out = sys.stdout.fileno()
    env = env_vars(args.env)
    with connect() as p:
        h = resolve(p, args.sandbox)
        cols, rows = _window((fd_out, fd_in))
        sys.stdout.flush()
        term = p.terminal(h, command, cols=cols, rows=rows, cwd=args.cwd, env=env or None,
                          timeout=getattr(args, "timeout", None), user=args.user)
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
