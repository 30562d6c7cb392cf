"""The commands on a sandbox's files: ``cp`` (with a progress line on a terminal; with ``-``
on one side, a tar stream as ``docker cp``: :mod:`.archives`), ``ls SANDBOX:/path`` and
``watch``.

``watch`` prints one event a line as it comes (``create /workspace/a.txt``; control
characters of a path escaped, so one event stays one line; ``--json``: one JSON object a
line). It exits 130 after Ctrl-C, as ``logs -f`` does, and 0 once its ``--timeout`` passed,
its directory went, or the reader of its output went away (``| head -n 1``: it stops at once,
also when no event comes, quietly). When its output is a pipe, one daemon thread waits for the
pipe's reader to go away and then ends the watch (a process that only writes when an event
comes would otherwise notice a ``| head`` that has exited only at the next event).
"""

from __future__ import annotations

import argparse
import os
import posixpath
import sys
import threading
from typing import Optional, Tuple

from ..errors import E2BProviderError
from .exits import EXIT_INTERRUPTED, PROG, UsageError
from .inputs import split_remote
from .lookup import connect, resolve
from .output import Progress, event_line, mode_text, on_reader_gone


def cmd_cp(args: argparse.Namespace) -> int:
    """``cp``: a file or tree between this machine and a sandbox, as ``cp`` copies."""
    src, dst = split_remote(args.src), split_remote(args.dst)
    if "-" in (args.src, args.dst):
        return _cp_stream(args, src, dst)
    if (src is None) == (dst is None):
        raise UsageError(
            "cp copies between this machine and a sandbox: write exactly one "
            "side as SANDBOX:/absolute/path"
        )
    exclude = list(args.exclude)
    progress = Progress(f"{args.src} -> {args.dst}", sys.stderr)
    with connect() as p:
        ok = False
        try:
            if dst is not None:  # upload
                if os.path.isdir(args.src) and not args.recursive:
                    raise E2BProviderError(f"-r not given; omitting directory {args.src!r}")
                if not os.path.lexists(args.src):
                    raise E2BProviderError(f"cannot stat {args.src!r}: No such file or directory")
                h = resolve(p, dst[0])
                target = dst[1]
                there = p.stat(h, target)
                if there is not None and there.is_dir:
                    name = os.path.basename(os.path.normpath(args.src))
                    target = posixpath.join(target, name) if name not in ("", ".", "..") \
                        else target
                p.upload(h, args.src, target, exclude=exclude, progress=progress)
            else:
                assert src is not None
                h = resolve(p, src[0])
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


def _cp_stream(args: argparse.Namespace, src: Optional[Tuple[str, str]],
               dst: Optional[Tuple[str, str]]) -> int:
    """``cp SANDBOX:/path -`` and ``cp - SANDBOX:/dir``: a tar stream on our standard output
    or input, as ``docker cp`` (see :mod:`.archives`)."""
    if not ((src is not None and args.dst == "-") or (args.src == "-" and dst is not None)):
        raise UsageError("cp with - copies between a sandbox and a tar stream: SANDBOX:/path - "
                         "writes one to standard output, - SANDBOX:/dir reads one from "
                         "standard input")
    from .archives import tar_from_stdin, tar_to_stdout

    progress = Progress(f"{args.src} -> {args.dst}", sys.stderr)
    with connect() as p:
        ok = False
        try:
            if src is not None:
                h = resolve(p, src[0])
                if p.stat(h, src[1]) is None:
                    raise E2BProviderError(
                        f"{args.src}: no such file or directory in the sandbox")
                tar_to_stdout(p, h, src[1], exclude=args.exclude, progress=progress,
                              where=args.src)
            else:
                assert dst is not None
                h = resolve(p, dst[0])
                tar_from_stdin(p, h, dst[1], exclude=args.exclude, progress=progress,
                               where=args.dst)
            ok = True
        finally:
            progress.finish(ok)
    return 0


def list_files(args: argparse.Namespace, where: Tuple[str, str]) -> int:
    """``ls SANDBOX:/path``: the entries of a directory in the sandbox (``-l``: long)."""
    with connect() as p:
        h = resolve(p, where[0])
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
        print(f"{kind}{mode_text(e.mode)} {e.size:>12} {when} {name}{link}")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    """``watch``: one line per change in a sandbox directory, as it happens."""
    gone = threading.Event()
    with connect() as p:
        h = resolve(p, args.sandbox)
        try:
            with p.watch(h, args.path, recursive=args.recursive, timeout=args.timeout) as events:
                print(f"{PROG}: watching {args.path} in sandbox {h.id}; Ctrl-C stops",
                      file=sys.stderr, flush=True)

                def reader_gone() -> None:
                    gone.set()
                    events.close()

                on_reader_gone(sys.stdout, reader_gone)
                for event in events:
                    sys.stdout.write(event_line(event, args.json) + "\n")
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
