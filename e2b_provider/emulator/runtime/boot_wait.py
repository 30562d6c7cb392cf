"""How long a sandbox's boot may take: progress, not a fixed wall deadline, and its messages.

This module owns the rule a boot is waited for by. A boot goes through steps (PID 1 starting,
PID 1 making the agent's socket, the agent answering ``GET /health``, the template's
services listening); it fails when it made no
progress for ``stall`` seconds (no new step, and no CPU time used by the sandbox's processes),
or when it ran past its hard bound (``BOOT_LIMIT_FACTOR`` times ``stall``) in all. On a loaded
host a boot's processes get little CPU but some: such a boot waits, where a fixed 30 s
deadline failed it. It also owns the words of a failed boot: which step, why, and the last
whole lines of the sandbox's log (never a line cut at its start). Pure: the caller reads
the clock and the CPU time.
"""

from __future__ import annotations

from typing import Optional

import attrs

__all__ = [
    "BOOT_LIMIT_FACTOR",
    "BOOT_STALL_SECONDS",
    "BootProgress",
    "failure_message",
    "whole_lines",
]

#: Seconds a boot may go without progress before it fails (the emulator's ``--boot-timeout``).
BOOT_STALL_SECONDS = 30.0
#: A boot that keeps making progress may take this many times its stall bound in all.
BOOT_LIMIT_FACTOR = 4.0
#: How much of the sandbox's log a failed boot's message ends with, at most, in characters.
LOG_TAIL_CHARS = 1500

#: The steps of a boot, in order, as a failure names them.
STEPS = (
    "starting PID 1",
    "waiting for PID 1 to make the agent's socket",
    "waiting for the agent to answer GET /health",
    "waiting for the template's services to listen on their ports",
)


@attrs.define
class BootProgress:
    """The progress of one boot: its step, the CPU time its processes used, and when either
    last moved (monotonic seconds).

    Args:
        stall: seconds without progress that fail the boot.
        started: when the boot began (monotonic).
    """

    stall: float
    started: float
    step: int = 0
    cpu_usec: int = 0
    moved: float = attrs.field(default=0.0)

    def __attrs_post_init__(self) -> None:
        self.moved = self.started

    @property
    def limit(self) -> float:
        """The hard bound of the whole boot, in seconds."""
        return self.stall * BOOT_LIMIT_FACTOR

    def reached(self, step: int, now: float) -> None:
        """The boot reached ``step`` (an index of :data:`STEPS`)."""
        if step > self.step:
            self.step = step
            self.moved = now

    def used_cpu(self, cpu_usec: Optional[int], now: float) -> None:
        """The sandbox's processes have used ``cpu_usec`` in all (None: unknown)."""
        if cpu_usec is not None and cpu_usec > self.cpu_usec:
            self.cpu_usec = cpu_usec
            self.moved = now

    def why_stop(self, now: float) -> Optional[str]:
        """Why the boot must stop waiting now, in words; None while it may go on."""
        if now - self.started >= self.limit:
            return (f"it was still {STEPS[self.step]} after {self.limit:g} s, the bound of a "
                    f"whole boot ({BOOT_LIMIT_FACTOR:g} times the boot timeout)")
        if now - self.moved >= self.stall:
            return (f"it made no progress for {self.stall:g} s while {STEPS[self.step]}: "
                    "no step reached and no CPU time used by its processes")
        return None

    def next_check(self, now: float) -> float:
        """Seconds until :meth:`why_stop` could first say stop."""
        return max(0.0, min(self.started + self.limit, self.moved + self.stall) - now)


def whole_lines(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    """The last whole lines of ``text`` that fit in ``limit`` characters (a line longer than
    that: its end, from a word's start)."""
    text = text.strip("\n")
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    newline = cut.find("\n")
    if newline >= 0:
        return cut[newline + 1:]
    space = cut.find(" ")
    return "…" + (cut[space + 1:] if space >= 0 else cut)


def failure_message(sandbox_id: str, why: str, log_tail: str) -> str:
    """A failed boot's message: the sandbox, the step and why, then the end of its log."""
    lines = whole_lines(log_tail)
    text = f"sandbox {sandbox_id} did not boot: {why}"
    return text + (f"; its log ends:\n{lines}" if lines else " (its log is empty)")

