"""exec against the emulator: environment, output budget, timeouts, cancellation, tags."""

from __future__ import annotations

import re
import threading
import time
from typing import Dict, List

import pytest
from waiting import wait_until

from e2b_provider import CancelToken, E2BSandboxProvider, InvalidArgument, SandboxHandle
from e2b_provider.core.run_engine import RunOutcome, run_process
from e2b_provider.protocol import scripts as scripts

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


def _as_envd_runs(
    p: E2BSandboxProvider, h: SandboxHandle, args: List[str], env: Dict[str, str]
) -> RunOutcome:
    """Start ``setsid args`` as ``sandbox`` with ``env``, in /workspace, the way an exec's
    request does (test set-up and comparison only)."""
    ctx = p._ctx
    return run_process(
        ctx.envd(ctx.attach(h.id, None)), user=scripts.SANDBOX_USER, cmd="setsid", args=args,
        env=env, cwd="/workspace", max_output_bytes=1 << 20, timeout=60.0, cancel=None,
        watchdog=ctx.watchdog,
    )


#: What a command sees: its environment as the kernel keeps it (order included), the one
#: it hands a child (bash's export order), its arguments, options and locale.
SHOW_ENVIRONMENT = (
    'tr "\\0" "\\n" < /proc/$$/environ; echo ---; env; echo ---; '
    'echo "$0|$#|$-|$LANG|$SHLVL|$PWD"; locale; printf \'\\303\\244\' | wc -m'
)


@pytest.mark.parametrize(
    "env",
    [None, {"LANG": "de_DE.UTF-8"}, {"LANG": ""}, {"HOME": "/tmp", "LC_ALL": "C"},
     {f"V{i}_{'x' * (i % 7)}": str(i) for i in range(80)}],
    ids=["default", "lang", "empty-lang", "home-lc-all", "many"],
)  # fmt: skip
def test_exec_environment_is_the_reference_wrappers_byte_for_byte(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, env: Dict[str, str]
) -> None:
    # the reference: its wrapper, started with HOME, LANG, the caller's env and the marker
    r = shared_provider.exec(sandbox, SHOW_ENVIRONMENT, env=env, timeout=30.0)
    assert r.exit_code == 0, r
    ctl = scripts.control_path()
    ref_env = {"HOME": "/workspace", "LANG": "C.UTF-8", **(env or {}), scripts.EXEC_MARKER: ctl}
    args = ["-w", "/bin/sh", "-c", scripts.EXEC_WRAPPER, "capybara-exec", ctl,
            SHOW_ENVIRONMENT, "35"]  # fmt: skip
    ref = _as_envd_runs(shared_provider, sandbox, args, ref_env)
    assert ref.exit_code == 0, ref

    def same(text: str) -> str:
        return re.sub(r"/tmp/[.]capybara-exec-[0-9a-f-]{36}", "CTL", text)

    assert same(r.stdout) == same(ref.stdout.decode())
    assert f"\nLANG={ref_env['LANG']}\n" in r.stdout


def test_exec_pid_file_exists_while_the_command_runs(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    r = shared_provider.exec(
        sandbox, 'p=$(cat /tmp/.capybara-exec-pf-*.pid); tr "\\0" " " < /proc/$p/cmdline',
        tag="pf", timeout=30.0,
    )  # fmt: skip
    assert r.exit_code == 0, r
    # the pid file names the wrapper, whose command line the kill scripts look for
    m = re.search(r"capybara-exec (/tmp/[.]capybara-exec-pf-[0-9a-f-]{36}) ", r.stdout)
    assert m, r.stdout
    ctl = m.group(1)
    # removed in the background once the wrapper has exited
    wait_until(
        lambda: shared_provider.stat(sandbox, ctl + ".pid") is None, 10.0, "the pid file to go"
    )


def test_a_kill_before_the_wrapper_starts_prevents_the_command(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    # the provider's kill (one batch) reaches an exec before its wrapper started: the
    # wrapper then refuses to start (137) and the command never runs
    ctl = scripts.control_path()
    r = shared_provider._ctx.script_on(sandbox.id, scripts.kill_batch_args([ctl]), None)
    assert r.exit_code == 0, r
    assert shared_provider.stat(sandbox, ctl + ".kill") is not None
    env = {"HOME": "/workspace", "LANG": "C.UTF-8"}
    command = f"touch {ctl}.ran"
    out = _as_envd_runs(
        shared_provider, sandbox, scripts.exec_args(ctl, command, 30, env),
        scripts.exec_env(env, ctl),
    )  # fmt: skip
    assert out.exit_code == 137
    assert shared_provider.stat(sandbox, ctl + ".ran") is None


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
