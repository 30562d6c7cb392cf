"""Live output: ``exec(on_stdout=..., on_stderr=...)`` against real sandboxes."""

from __future__ import annotations

from typing import Any, List, Tuple

import pytest

from e2b_provider import E2BSandboxProvider, ExecResult, InvalidArgument, SandboxHandle

pytestmark = pytest.mark.integration


def exec_collecting(
    provider: E2BSandboxProvider, sandbox: SandboxHandle, command: str, **kwargs: Any
) -> Tuple[ExecResult, List[str], List[str]]:
    """Run ``command`` with callbacks that collect the stdout and stderr pieces shown."""
    out: List[str] = []
    err: List[str] = []
    r = provider.exec(
        sandbox, command, timeout=30.0, on_stdout=out.append, on_stderr=err.append, **kwargs
    )
    return r, out, err


def test_pieces_add_up_to_the_result(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    r, out, err = exec_collecting(
        shared_provider,
        sandbox,
        "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.1; done; printf 'é€😀'",
    )
    assert r.exit_code == 0
    assert "".join(out) == r.stdout == "out1\nout2\nout3\né€😀"
    assert "".join(err) == r.stderr == "err1\nerr2\nerr3\n"
    assert len(out) >= 3  # it came in pieces, as printed


def test_output_arrives_while_the_command_runs(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    # The command waits for a file that only the callback creates: it can only finish if the
    # first line reached us while it was still running.
    shared_provider.exec(sandbox, "rm -f /tmp/live-go", timeout=30.0)
    seen: List[str] = []

    def on_out(text: str) -> None:
        seen.append(text)
        if "first" in text and len(seen) == 1:
            shared_provider.write_file(sandbox, "/tmp/live-go", b"")

    r = shared_provider.exec(
        sandbox,
        "echo first; i=0; while [ ! -e /tmp/live-go ] && [ $i -lt 200 ]; do sleep 0.05; "
        "i=$((i+1)); done; [ -e /tmp/live-go ] && echo second",
        timeout=30.0,
        on_stdout=on_out,
    )
    assert r.exit_code == 0 and r.stdout == "first\nsecond\n"


def test_only_output_inside_the_cap_is_shown(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    # 5 bytes fit; the euro sign (3 bytes) is cut after its first byte and dropped
    r, out, err = exec_collecting(
        shared_provider, sandbox, "printf 'abcd€zz'; printf 'late' >&2", max_output_bytes=5
    )
    assert r.truncated
    assert "".join(out) == r.stdout == "abcd"
    assert "".join(err) == r.stderr == ""


def test_stderr_cut_inside_a_character(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    err: List[str] = []
    r = shared_provider.exec(
        sandbox, "printf 'ab€' >&2", timeout=30.0, max_output_bytes=4, on_stderr=err.append
    )
    assert r.truncated and r.stderr == "ab" and "".join(err) == "ab"


def test_callback_error_stops_the_command_and_propagates(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    class Stop(Exception):
        pass

    def boom(text: str) -> None:
        raise Stop(text)

    with pytest.raises(Stop):
        shared_provider.exec(sandbox, "echo go; exec sleep 471", timeout=60.0, on_stdout=boom)
    left = shared_provider.exec(sandbox, "pgrep -x sleep -a | grep -c 471 || true", timeout=30.0)
    assert left.stdout.strip() == "0"


def test_callbacks_are_checked_before_any_io(shared_provider: E2BSandboxProvider) -> None:
    with pytest.raises(InvalidArgument):
        shared_provider.exec("inosuchsandbox", "true", on_stdout="print")  # type: ignore[arg-type]
