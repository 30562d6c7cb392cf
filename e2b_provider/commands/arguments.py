"""The checks of a command's arguments that the provider facade makes before any I/O.

This module owns the checks shared by ``exec``, ``start`` and ``terminal`` (working directory,
environment, holder tag, output callbacks) and by ``kill_tagged`` (its tags), and the
environment every command runs with.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Mapping, Optional

from ..errors import InvalidArgument
from ..protocol import validate as v

__all__ = [
    "check_callbacks",
    "check_kept_output",
    "check_tags",
    "check_terminal_command",
    "command_env",
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


def check_callbacks(
    on_stdout: Optional[Callable[[str], None]], on_stderr: Optional[Callable[[str], None]]
) -> None:
    """Check an exec's output callbacks (each a callable or None)."""
    for cb_name, cb in (("on_stdout", on_stdout), ("on_stderr", on_stderr)):
        if cb is not None and not callable(cb):
            raise InvalidArgument(f"{cb_name} must be a callable taking a str, or None")


def check_tags(tags: Iterable[str]) -> List[str]:
    """The holder tags of ``kill_tagged``, each checked."""
    if isinstance(tags, str):
        raise InvalidArgument("tags must be a sequence of tags, not a string")
    tag_list = list(tags)
    for t in tag_list:
        v.check_tag(t)
    return tag_list


def check_kept_output(max_output_bytes: int) -> None:
    """Check how much of each stream a background command keeps (at least 1 KiB)."""
    v.check_max_bytes(max_output_bytes, "max_output_bytes")
    if max_output_bytes < 1024:
        raise InvalidArgument("max_output_bytes of a background command must be at least "
                              "1024")


def check_terminal_command(command: str) -> None:
    """Check a terminal's command (a shell command; None, the login shell, is not checked)."""
    v.check_text(command, "command")
    if not command.strip():
        raise InvalidArgument("command is empty: give a shell command, or None for "
                              "the login shell")
