"""The emulator's rule for waiting on a boot: progress, a hard bound, and whole-word messages."""

from __future__ import annotations

from e2b_provider.emulator.runtime.boot_wait import (
    BOOT_LIMIT_FACTOR,
    BootProgress,
    failure_message,
    whole_lines,
)


def test_a_boot_using_cpu_keeps_waiting_until_its_hard_bound() -> None:
    p = BootProgress(stall=10.0, started=100.0)
    assert p.why_stop(109.9) is None
    for t in range(105, 140, 5):  # CPU time used every 5 s: progress
        p.used_cpu(t * 1000, float(t))
        assert p.why_stop(float(t) + 4.9) is None
    assert p.why_stop(100.0 + 10.0 * BOOT_LIMIT_FACTOR) == (
        "it was still starting PID 1 after 40 s, the bound of a whole boot (4 times the boot "
        "timeout)"
    )


def test_a_boot_without_progress_stops_naming_its_step() -> None:
    p = BootProgress(stall=10.0, started=0.0)
    p.used_cpu(500, 1.0)
    p.reached(1, 2.0)
    p.used_cpu(500, 5.0)  # no more CPU time: no progress
    p.used_cpu(None, 6.0)  # unknown: no progress either
    assert p.why_stop(11.9) is None and abs(p.next_check(11.9) - 0.1) < 1e-9
    assert p.why_stop(12.0) == (
        "it made no progress for 10 s while waiting for PID 1 to make the agent's socket: no "
        "step reached and no CPU time used by its processes"
    )


def test_whole_lines_never_start_inside_a_line_or_word() -> None:
    text = "first line\n" + "second line\n" * 3 + "last line\n"
    assert whole_lines(text, limit=30) == "second line\nlast line"
    assert whole_lines(text) == text.strip("\n")
    assert whole_lines("alpha beta gamma delta", limit=12) == "…gamma delta"


def test_failure_message_is_whole_words_then_whole_lines() -> None:
    log = "x" * 50 + "\n" + "agent: listening\n"
    msg = failure_message("iabc", "it made no progress for 30 s while starting PID 1", log)
    assert msg == ("sandbox iabc did not boot: it made no progress for 30 s while starting PID "
                   "1; its log ends:\n" + "x" * 50 + "\nagent: listening")
    assert failure_message("iabc", "PID 1 exited with status 1", "").endswith(
        "status 1 (its log is empty)")
