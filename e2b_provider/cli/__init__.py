"""The ``e2b-provider`` command line: entry point, parser, commands, terminal session, output."""

from __future__ import annotations

from .entry import console_main, main, parser

__all__ = ["console_main", "main", "parser"]
