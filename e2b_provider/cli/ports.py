"""The commands on a sandbox's ports: ``port-forward`` (as ``kubectl port-forward``),
``forward`` (its older form: one port, a free local one unless told) and ``url``.

Both forwards run until Ctrl-C, then exit 0, as ``kubectl port-forward`` does (it stops on
SIGINT and returns without an error).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import List, Tuple

from ..errors import E2BProviderError, InvalidArgument
from ..ports.relay import address_port
from .exits import PROG, UsageError
from .lookup import connect, resolve


def _until_ctrl_c() -> None:
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print(f"{PROG}: stopped forwarding", file=sys.stderr)


def cmd_port_forward(args: argparse.Namespace) -> int:
    """``port-forward``: serve sandbox ports on 127.0.0.1 (or ``--address``) until Ctrl-C,
    as ``kubectl port-forward`` (``REMOTE`` alone: the same port here; ``:REMOTE``: a free
    one, the same on every address)."""
    pairs: List[Tuple[int, int]] = args.ports
    addresses: List[str] = args.address
    with connect() as p:
        h = resolve(p, args.sandbox)
        with contextlib.ExitStack() as forwards:
            for local_port, port in pairs:
                for address in addresses:
                    try:
                        url = forwards.enter_context(
                            p.forward(h, port, local_port=local_port, address=address))
                    except InvalidArgument as exc:  # the port is taken: not a usage error
                        raise E2BProviderError(str(exc)) from None
                    local_port = int(url.rsplit(":", 1)[1])
                    print(f"Forwarding from {address_port(address, local_port)} -> {port}",
                          flush=True)
            print(f"{PROG}: forwarding to sandbox {h.id}; Ctrl-C stops", file=sys.stderr,
                  flush=True)
            _until_ctrl_c()
    return 0


def cmd_forward(args: argparse.Namespace) -> int:
    """``forward``: serve a sandbox port on 127.0.0.1 until Ctrl-C."""
    local_port, port = args.port
    if args.local_port is not None:
        if local_port is not None and local_port != args.local_port:
            raise UsageError("give the local port once (LOCAL:PORT or --local-port)")
        local_port = args.local_port
    with connect() as p:
        h = resolve(p, args.sandbox)
        with p.forward(h, port, local_port=local_port or 0) as url:
            print(f"Forwarding from {url[len('http://'):]} -> {port}", flush=True)
            print(f"{PROG}: open {url}/ (port {port} of sandbox {h.id}); Ctrl-C stops",
                  file=sys.stderr, flush=True)
            _until_ctrl_c()
    return 0


def cmd_url(args: argparse.Namespace) -> int:
    """``url``: print the URL of a sandbox port."""
    with connect() as p:
        print(p.url(resolve(p, args.sandbox), args.port))
    return 0
