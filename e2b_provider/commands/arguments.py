"""The checks of a command's arguments that the provider facade makes before any I/O.

This module owns the checks of ``exec``'s, ``start``'s and ``terminal``'s arguments (the
command, its bounds, working directory, environment, holder tag, output callbacks), of
``kill_tagged``'s tags, and the environment every command runs with.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Iterable, List, Mapping, Optional

from ..errors import InvalidArgument
from ..protocol import validate as v

__all__ = [
    "check_callbacks",
    "check_tags",
    "check_wait_timeout",
    "command_env",
    "exec_env",
    "start_env",
    "terminal_env",
]


def command_env(
    cwd: Optional[str], env: Optional[Mapping[str, str]], tag: Optional[str]
) -> Dict[str, str]:
    """Check a command's ``cwd``, ``env`` and ``tag``; the environment it runs with."""
    if cwd is not None:
        v.check_path(cwd)
    run_env = {"HOME": "/workspace", "LANG": "C.UTF-8"}
    if env is not None:
        run_env.update(v.check_env(env))
    if tag is not None:
        v.check_tag(tag)
    return run_env


def check_wait_timeout(timeout: Optional[float]) -> None:
    """Check the timeout of a wait on a command or a terminal: a non-negative number of
    seconds, or None."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float))
        or not (math.isfinite(timeout) and timeout >= 0)
    ):
        raise InvalidArgument("timeout must be a non-negative number of seconds, or None")


def check_callbacks(
    on_stdout: Optional[Callable[[str], None]], on_stderr: Optional[Callable[[str], None]]
) -> None:
    """Check the output callbacks of an exec or a wait (each a callable or None)."""
    for cb_name, cb in (("on_stdout", on_stdout), ("on_stderr", on_stderr)):
        if cb is not None and not callable(cb):
            raise InvalidArgument(f"{cb_name} must be a callable taking a str, or None")


def exec_env(
    command: str,
    timeout: float,
    max_output_bytes: int,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    tag: Optional[str],
    on_stdout: Optional[Callable[[str], None]],
    on_stderr: Optional[Callable[[str], None]],
) -> Dict[str, str]:
    """Check an exec's arguments (but its standard input); the environment it runs with."""
    v.check_text(command, "command")
    v.check_timeout(timeout)
    v.check_max_bytes(max_output_bytes, "max_output_bytes")
    run_env = command_env(cwd, env, tag)
    check_callbacks(on_stdout, on_stderr)
    return run_env


def start_env(
    command: str,
    timeout: Optional[float],
    max_output_bytes: int,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    tag: Optional[str],
    stdin: bool,
) -> Dict[str, str]:
    """Check a background command's arguments (it keeps at least 1 KiB of each stream);
    the environment it runs with."""
    v.check_text(command, "command")
    if timeout is not None:
        v.check_timeout(timeout)
    v.check_max_bytes(max_output_bytes, "max_output_bytes")
    if max_output_bytes < 1024:
        raise InvalidArgument("max_output_bytes of a background command must be at least "
                              "1024")
    run_env = command_env(cwd, env, tag)
    if not isinstance(stdin, bool):
        raise InvalidArgument("stdin must be True or False")
    return run_env


def terminal_env(
    command: Optional[str],
    cols: int,
    rows: int,
    timeout: Optional[float],
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
) -> Dict[str, str]:
    """Check a terminal's arguments (``command`` None, the login shell, is not checked);
    the environment it runs with."""
    if command is not None:
        v.check_text(command, "command")
        if not command.strip():
            raise InvalidArgument("command is empty: give a shell command, or None for "
                                  "the login shell")
    v.check_terminal_size(cols, rows)
    if timeout is not None:
        v.check_timeout(timeout)
    return command_env(cwd, env, None)


def check_tags(tags: Iterable[str]) -> List[str]:
    """The holder tags of ``kill_tagged``, each checked."""
    return v.check_each(tags, v.check_tag, "tags must be a sequence of tags, not a string")
