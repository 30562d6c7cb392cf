"""The commands on a sandbox's ports: ``forward`` (until Ctrl-C, then exit 0, as ``kubectl
port-forward`` does) and ``url``."""

from __future__ import annotations

import argparse
import sys
import time

from .exits import PROG, UsageError
from .lookup import connect, resolve


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
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                print(f"{PROG}: stopped forwarding", file=sys.stderr)
    return 0


def cmd_url(args: argparse.Namespace) -> int:
    """``url``: print the URL of a sandbox port."""
    with connect() as p:
        print(p.url(resolve(p, args.sandbox), args.port))
    return 0
