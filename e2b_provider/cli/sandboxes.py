"""The commands on sandboxes themselves: ``create`` (from the configured template, or
``--template``'s), ``ls`` (the table of sandboxes, or the files of one), ``rm``, ``suspend``
and ``resume``.

``create NAME`` refuses when a running or paused sandbox of that name exists (as ``docker
create --name`` refuses a name in use), naming it and ``--replace``; with ``--replace`` it
does what the library's ``create`` does: destroys the older ones, files and all.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ..errors import E2BProviderError
from ..models import SandboxLimits, SandboxSummary
from ..protocol import validate as v
from ..provider import E2BSandboxProvider
from .exits import EXIT_ERROR, PROG, UsageError
from .files import list_files
from .inputs import split_remote
from .lookup import connect, resolve


def cmd_create(args: argparse.Namespace) -> int:
    """``create``: a sandbox; prints its id, and its sizes when some were asked for."""
    given = {"cpu": args.cpu, "memory_mb": args.memory_mb, "disk_mb": args.disk_mb}
    limits = SandboxLimits(
        egress=args.egress,
        allow_hosts=tuple(args.allow_host),
        **{k: val for k, val in given.items() if val is not None},
    )
    v.check_name(args.name)
    v.check_limits(limits)
    with _provider(args.template) as p:
        if not args.replace:
            _refuse_a_name_in_use(p.list_sandboxes(args.name), args.name)
        h = p.create(args.name, limits)
    print(h.id)
    if any(val is not None for val in given.values()):
        sizes = (f"{h.cpu_count if h.cpu_count is not None else '?'} CPUs, "
                 f"{h.memory_mb if h.memory_mb is not None else '?'} MiB memory, "
                 f"{h.disk_mb if h.disk_mb is not None else '?'} MiB disk")
        print(f"{PROG}: sandbox {h.id} has {sizes} (its template's sizes)", file=sys.stderr)
    return 0


def _provider(template: Optional[str]) -> E2BSandboxProvider:
    """The provider the environment configures (:func:`~.lookup.connect`); with
    ``template``, one that creates its sandboxes from that template instead."""
    p = connect()
    if template is None:
        return p
    try:
        config = p.config.replace(template=template)
    finally:
        p.close()
    return E2BSandboxProvider(config)


def _refuse_a_name_in_use(there: List[SandboxSummary], name: str) -> None:
    """Raise when ``there`` (the sandboxes named ``name``, as the library lists them) is not
    empty: ``create`` replaces them only with ``--replace``."""
    if not there:
        return
    which = ", ".join(f"{s.id} ({s.state})" for s in there)
    one = len(there) == 1
    raise E2BProviderError(
        f"{'a sandbox' if one else f'{len(there)} sandboxes'} named {name!r} already "
        f"exist{'s' if one else ''}: {which}; pass --replace to destroy "
        f"{'it' if one else 'them'}, files and all, and create a new one"
    )


def cmd_ls(args: argparse.Namespace) -> int:
    """``ls``: the table of sandboxes; with ``SANDBOX:/path``, the files there."""
    if args.where is not None:
        where = split_remote(args.where)
        if where is None:
            raise UsageError("ls takes SANDBOX:/absolute/path (or no argument: the sandboxes)")
        return list_files(args, where)
    with connect() as p:
        rows = p.list_sandboxes(args.name)
    table = [("ID", "NAME", "STATE", "STARTED")]
    for s in rows:
        started = s.started_at.strftime("%Y-%m-%d %H:%M:%S UTC") if s.started_at else "-"
        table.append((s.id, s.name or "-", s.state, started))
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """``rm``: destroy sandboxes, printing each as it goes."""
    with connect() as p:
        for ref in args.sandboxes:
            p.destroy(resolve(p, ref))
            print(ref)
    return 0


def cmd_suspend(args: argparse.Namespace) -> int:
    """``suspend``: pause a sandbox (its memory kept)."""
    with connect() as p:
        p.suspend(resolve(p, args.sandbox))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """``resume``: resume a paused sandbox (exit 1 when it no longer exists)."""
    with connect() as p:
        outcome = p.resume(resolve(p, args.sandbox))
    if outcome == "gone":
        print(f"{PROG}: sandbox {args.sandbox} no longer exists", file=sys.stderr)
        return EXIT_ERROR
    return 0
