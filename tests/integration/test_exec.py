"""exec against the emulator: environment, output budget, timeouts, cancellation, tags."""

from __future__ import annotations

import threading
import time

import pytest
from waiting import wait_until

from e2b_provider import CancelToken, E2BSandboxProvider, InvalidArgument, SandboxHandle

pytestmark = pytest.mark.integration


def _running(p: E2BSandboxProvider, h: SandboxHandle, pattern: str) -> int:
    """How many processes in the sandbox match ``pgrep -f pattern``."""
    return int(p.exec(h, f"pgrep -fc '{pattern}' || true", timeout=30.0).stdout.strip())


def test_exec_runs_as_sandbox_user_with_reference_environment(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    r = shared_provider.exec(sandbox, 'id -un; echo "$HOME"; pwd; echo "$LANG"', timeout=30.0)
    assert r.exit_code == 0, r
    assert r.stdout.split("\n")[:4] == ["sandbox", "/workspace", "/workspace", "C.UTF-8"]
    assert not (r.truncated or r.timed_out or r.cancelled)


def test_exec_cwd_env_and_exit_code(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    r = shared_provider.exec(
        sandbox.id,
        'pwd; echo "$FOO-$BAR"; echo err >&2; exit 7',
        cwd="/tmp",
        env={"FOO": "x y", "BAR": "$(id)"},
        timeout=30.0,
    )
    assert r.exit_code == 7
    assert r.stdout == "/tmp\nx y-$(id)\n"
    assert r.stderr == "err\n"


def test_exec_signal_exit_code(shared_provider: E2BSandboxProvider, sandbox: SandboxHandle) -> None:
    r = shared_provider.exec(sandbox, "kill -TERM $$", timeout=30.0)
    assert r.exit_code == 128 + 15


def test_bad_input_is_rejected_before_io(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    with pytest.raises(InvalidArgument):
        shared_provider.exec(sandbox, "true", env={"BAD-KEY": "1"})
    with pytest.raises(InvalidArgument):
        shared_provider.exec(sandbox, "true", tag="bad tag")
    with pytest.raises(InvalidArgument):
        shared_provider.exec(sandbox, "true", cwd="/tmp/../etc")
    with pytest.raises(InvalidArgument):
        shared_provider.exec("not/an/id", "true")
    with pytest.raises(ValueError):
        shared_provider.exec(sandbox, "true", timeout=-1.0)


def test_output_budget_is_shared_and_cut_utf8_safely(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    # 9 ASCII bytes then a 3-byte euro sign: a 10- or 11-byte budget cuts inside it.
    for cap in (10, 11):
        r = shared_provider.exec(
            sandbox, "printf 'aaaaaaaaa\\xe2\\x82\\xacbbb'", max_output_bytes=cap, timeout=30.0
        )
        assert r.exit_code == 0
        assert r.truncated
        assert r.stdout == "aaaaaaaaa"
    r = shared_provider.exec(
        sandbox, "printf 'aaaaaaaaa\\xe2\\x82\\xacbbb'", max_output_bytes=12, timeout=30.0
    )
    assert r.stdout == "aaaaaaaaa€" and r.truncated
    # the same on stderr, which is decoded the same way
    for cap in (10, 11):
        r = shared_provider.exec(
            sandbox, "printf 'aaaaaaaaa\\xe2\\x82\\xacbbb' >&2", max_output_bytes=cap, timeout=30.0
        )
        assert r.exit_code == 0 and r.truncated
        assert (r.stdout, r.stderr) == ("", "aaaaaaaaa")
    # stdout and stderr share one budget; the stream is drained past it (exit status arrives)
    r = shared_provider.exec(
        sandbox,
        "head -c 3000 /dev/zero | tr '\\0' o; head -c 3000 /dev/zero | tr '\\0' e >&2; exit 4",
        max_output_bytes=4000,
        timeout=30.0,
    )
    assert r.exit_code == 4
    assert r.truncated
    assert len(r.stdout) + len(r.stderr) == 4000


def test_large_output_is_drained_past_the_cap(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    r = shared_provider.exec(
        sandbox,
        "head -c 20000000 /dev/urandom | base64 -w0; echo; echo done >&2",
        max_output_bytes=1000,
        timeout=60.0,
    )
    assert r.exit_code == 0 and r.truncated and len(r.stdout) == 1000


def test_timeout_kills_the_whole_tree(
    emulator, shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:  # type: ignore[no-untyped-def]
    marker = f"{time.monotonic_ns()}"
    t0 = time.monotonic()
    r = shared_provider.exec(
        sandbox,
        f"sleep 1{marker} & (sleep 2{marker} &); "
        f"bash -c 'sleep 3{marker} & wait' & sleep 4{marker}",
        timeout=1.5,
    )
    took = time.monotonic() - t0
    assert r.timed_out and r.exit_code is None and not r.cancelled and not r.wedged
    assert took < 1.5 + 20 + 3 + 5
    left = shared_provider.exec(sandbox, f"pgrep -f '[s]leep [0-9]{marker}' || true", timeout=30.0)
    assert left.stdout.strip() == "", left


def test_cancel_from_another_thread(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    tok = CancelToken()
    marker = f"{time.monotonic_ns()}"

    def cancel_once_running() -> None:
        wait_until(lambda: _running(shared_provider, sandbox, f"[s]leep 5{marker}") >= 1, 30.0)
        tok.cancel("stop please")

    canceller = threading.Thread(target=cancel_once_running)
    canceller.start()
    r = shared_provider.exec(sandbox, f"echo started; sleep 5{marker}", timeout=60.0, cancel=tok)
    canceller.join(30)
    assert tok.cancelled  # by the canceller, once the command ran
    assert r.cancelled and r.exit_code is None and not r.timed_out
    assert r.stdout == "started\n"
    left = shared_provider.exec(sandbox, f"pgrep -f '[s]leep [0-9]{marker}' || true", timeout=30.0)
    assert left.stdout.strip() == ""


def test_token_cancelled_before_start_raises(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    from e2b_provider import Cancelled

    tok = CancelToken()
    tok.cancel("already")
    with pytest.raises(Cancelled):
        shared_provider.exec(sandbox, "touch /workspace/should-not-exist", cancel=tok)
    assert shared_provider.stat(sandbox, "/workspace/should-not-exist") is None


def test_kill_tagged_kills_only_given_tags(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    results = {}

    def run(tag: str) -> None:
        results[tag] = shared_provider.exec(
            sandbox, f"echo {tag}; sleep 120", timeout=60.0, tag=tag
        )

    threads = [threading.Thread(target=run, args=(t,)) for t in ("alpha", "beta", "gamma")]
    for t in threads:
        t.start()
    wait_until(
        lambda: _running(
            shared_provider, sandbox, "capybara-exec /tmp/[.]capybara-exec-(alpha|beta|gamma)-"
        )
        == 3,
        20.0,
        "the three tagged commands to run",
    )
    shared_provider.kill_tagged(sandbox, ["alpha", "gamma"])
    for t in (threads[0], threads[2]):
        t.join(30)
        assert not t.is_alive()
    assert results["alpha"].exit_code == 137 and results["gamma"].exit_code == 137
    assert threads[1].is_alive()
    shared_provider.kill_all(sandbox)
    threads[1].join(30)
    assert results["beta"].exit_code == 137
    assert (
        shared_provider.exec(
            sandbox, "pgrep -fc '[s]leep 120' || true", timeout=30.0
        ).stdout.strip()
        == "0"
    )
    shared_provider.kill_tagged(sandbox, [])  # nothing to do, no error
    with pytest.raises(InvalidArgument):
        shared_provider.kill_tagged(sandbox, ["a.*"])
