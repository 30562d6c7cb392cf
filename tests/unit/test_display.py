"""The library's values in IPython and Jupyter: IPython's own pretty printer and the HTML
display. A command's output shows as text, head and tail, with what was left out said;
``repr()`` stays the valid one-line repr; nothing hidden from ``repr`` (a secret) shows."""

from __future__ import annotations

import datetime
import re

from IPython.lib.pretty import pretty  # IPython comes with the test extras (ipykernel)

from e2b_provider import (
    CommandInfo,
    CommandOutput,
    DeploymentConfig,
    DirEntry,
    ExecResult,
    FileContent,
    FileEvent,
    FileStat,
    SandboxHandle,
    SandboxLimits,
    SandboxSummary,
    TransferSummary,
)
from e2b_provider.models import DISPLAY_HEAD_LINES, DISPLAY_TAIL_LINES, Target

UTC = datetime.timezone.utc


def test_a_long_output_shows_as_text_its_head_and_tail() -> None:
    out = "".join(f"line {i}\n" for i in range(2000))
    r = ExecResult(3, out, "boom\n", truncated=True)
    shown = pretty(r).splitlines()
    assert shown[0] == "ExecResult(exit_code=3, truncated=True)"
    assert shown[1] == "stdout: 2,000 lines, 18,890 characters"
    body = shown[2:2 + DISPLAY_HEAD_LINES + 1 + DISPLAY_TAIL_LINES]
    assert body[0] == "  line 0" and body[DISPLAY_HEAD_LINES - 1] == "  line 19"
    assert body[DISPLAY_HEAD_LINES] == "  … 1,970 lines not shown (.stdout has them all) …"
    assert body[-1] == "  line 1999"
    assert shown[-3:] == ["stderr: 1 line, 5 characters", "  boom",
                          "the output was cut at max_output_bytes (truncated=True)"]
    assert len(shown) < 40
    # repr() is untouched: one line, and it makes the same value again
    assert "\n" not in repr(r) and eval(repr(r), {"ExecResult": ExecResult}) == r


def test_a_short_result_shows_whole_and_says_what_is_empty_or_unfinished() -> None:
    assert pretty(ExecResult(0, "hi\nthere\n")).splitlines() == [
        "ExecResult(exit_code=0)", "stdout: 2 lines, 9 characters", "  hi", "  there",
        "stderr: empty"]
    assert pretty(ExecResult(None, "partial", timed_out=True)).splitlines() == [
        "ExecResult(exit_code=None, timed_out=True)",
        "stdout: 1 line, 7 characters, no newline at the end", "  partial", "stderr: empty"]


def test_the_sandboxs_output_cannot_drive_the_viewers_terminal_or_page() -> None:
    r = ExecResult(0, "\x1b]52;c;aGk=\x07red\x1b[31m\r\n<script>alert(1)</script>\n" + "x" * 500)
    text = pretty(r)
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "\\x1b]52;c;aGk=\\x07red\\x1b[31m\n" in text
    assert "… (200 more characters)" in text  # a long line is cut
    page = r._repr_html_()
    assert page is not None and "<script>" not in page and "&lt;script&gt;" in page
    assert "\x1b" not in page


def test_the_other_values_break_over_lines_only_when_long() -> None:
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert pretty(FileStat(10, False)) == "FileStat(size=10, is_dir=False)"
    assert pretty(SandboxHandle("i1", "job", cpu_count=2)) == \
        "SandboxHandle(id='i1', name='job', cpu_count=2)"
    assert pretty(SandboxLimits()) == "SandboxLimits()"
    assert pretty(FileEvent("create", "/w/a")) == "FileEvent(type='create', path='/w/a')"
    assert pretty(TransferSummary(files=3, bytes=10)) == "TransferSummary(files=3, bytes=10)"
    entry = DirEntry("a.txt", "/workspace/project/src/a.txt", "file", 3, 0o644, when)
    lines = pretty([entry]).splitlines()
    assert lines[0] == "[DirEntry(name='a.txt',"
    assert "          mode=0o644," in lines
    assert len(lines) == 6  # one field a line, symlink_target=None left out
    summary = SandboxSummary("i1", "job", "running", when, "base", cpu_count=2)
    assert pretty(summary).startswith("SandboxSummary(id='i1',\n")
    big = pretty(FileContent(b"x" * 1000))
    assert big.endswith("… (1,000 bytes),\n            truncated=False)") or \
        "… (1,000 bytes)" in big
    assert len(big) < 400


def test_background_command_values() -> None:
    out = CommandOutput("a\n" * 100, "", True)
    lines = pretty(out).splitlines()
    assert lines[0] == "CommandOutput(truncated=True)"
    assert lines[1] == "stdout: 100 lines, 200 characters"
    assert "  … 70 lines not shown (.stdout has them all) …" in lines
    assert lines[-2:] == ["stderr: empty",
                          "the output was cut at max_output_bytes (truncated=True)"]
    info = CommandInfo("i1:ab", 42, None, "sleep 1", 1.5)
    assert pretty(info) == \
        "CommandInfo(id='i1:ab', pid=42, tag=None, command='sleep 1', started_at=1.5)"
    assert info._repr_html_() is None and out._repr_html_() is not None


def test_no_secret_shows() -> None:
    target = Target("https://49983-i1.e2b.app", "i1", "tok-very-secret-123",
                    traffic_token="traffic-secret-456")
    config = DeploymentConfig("e2b_" + "k" * 40, "base")
    for value in (target, config):
        shown = pretty(value)
        assert not re.search(r"very-secret|traffic-secret|kkkkkkkk", shown), shown
