"""How a process of the agent ended, in Go's terms: exit statuses and retained exit records.

This module owns the translation of a ``waitpid`` status into what envd reports (Go's
``os.ProcessState``: ``ExitCode()``, ``Exited()``, ``String()``, the ``end`` event of a
``ProcessEvent``), Go's signal names, and the :class:`ExitRecord` kept of a finished process
for a late ``Connect``. Pure: no I/O.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

import attrs

from ...protocol.process_events import SIGNALS

__all__ = ["ExitInfo", "ExitRecord", "exit_info_from_status", "go_signal_name"]

# Go's syscall signal table (linux), by number: what ProcessState.String() prints after
# "signal: ". The client side parses the same table back
# (``e2b_provider.protocol.process_events.SIGNALS``).
_GO_SIGNALS: Mapping[int, str] = {number: name for name, number in SIGNALS.items()}


def go_signal_name(sig: int) -> str:
    """The name Go's ``syscall.Signal.String()`` gives a Linux signal number."""
    return _GO_SIGNALS.get(sig, f"signal {sig}")


@attrs.frozen
class ExitInfo:
    """How a process ended, in the terms of Go's ``os.ProcessState``."""

    exit_code: int
    exited: bool
    status: str
    error: Optional[str]

    def end_event(self) -> Dict[str, Any]:
        """The ``ProcessEvent`` ``{"end": …}`` with proto3 JSON omissions."""
        end: Dict[str, Any] = {}
        if self.exit_code:
            end["exitCode"] = self.exit_code
        if self.exited:
            end["exited"] = True
        if self.status:
            end["status"] = self.status
        if self.error is not None:
            end["error"] = self.error
        return {"end": end}


def exit_info_from_status(status: int) -> ExitInfo:
    """Translate a ``waitpid`` status like Go's ``ExitCode()``/``Exited()``/``String()``.

    A non-zero exit or a signal death also carries ``error`` (the text of ``cmd.Wait()``'s
    error, identical to the status text); a clean exit does not.
    """
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        exited = True
        text = f"exit status {code}"
    elif os.WIFSIGNALED(status):
        code = -1
        exited = False
        text = "signal: " + go_signal_name(os.WTERMSIG(status))
    else:  # stopped/continued never reach us (no WUNTRACED), kept for completeness
        code = -1
        exited = False
        text = "unknown status"
    if os.WCOREDUMP(status):
        text += " (core dumped)"
    error = None if (exited and code == 0) else text
    return ExitInfo(code, exited, text, error)


@attrs.frozen(eq=False)
class ExitRecord:
    """What is kept of a finished process for ``Connect`` during the retention period."""

    pid: int
    tag: Optional[str]
    info: ExitInfo
