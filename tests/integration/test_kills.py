"""Kills under load: a burst of timeouts, a busy worker pool, escaped processes, close().

A timeout kills its own command's tree and nothing else; a sandbox is rebooted only on
evidence about that sandbox, never because kills queued; an exec comes back within its
timeout + kill bound + grace; processes that left the exec's session die with it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterator, List, Optional

import pytest
from waiting import run_in_threads

from e2b_provider import E2BSandboxProvider, ExecResult, SandboxHandle
from e2b_provider._watchdog import Watchdog

from .conftest import unique_name

pytestmark = pytest.mark.integration

#: The sleeps these tests start carry this in their command line (found with pgrep -f).
MARK = "4711"


def wait_until(pred: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll ``pred`` until it holds, at most ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def left(p: E2BSandboxProvider, h: SandboxHandle, pattern: str) -> int:
    """How many processes in the sandbox match ``pgrep -f pattern``."""
    r = p.exec(h, f"pgrep -fc -- '{pattern}' || true", timeout=30.0)
    return int(r.stdout.strip() or "0")


class Reboots(logging.Handler):
    """Counts the reboots the provider starts (its log line)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: List[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "rebooting sandbox" in record.getMessage():
            self.started.append(time.monotonic())


@pytest.fixture
def reboots() -> Iterator[Reboots]:
    handler = Reboots()
    logger = logging.getLogger("e2b_provider")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _bystander(p: E2BSandboxProvider, h: SandboxHandle, flag: str, out: List[object]) -> None:
    try:
        out.append(
            p.exec(h, f"while [ ! -e {flag} ]; do sleep 0.1; done; echo survived", timeout=600)
        )
    except Exception as exc:  # collected and asserted by the test
        out.append(exc)


def test_a_burst_of_timeouts_kills_only_its_own_commands(emu, reboots) -> None:  # type: ignore[no-untyped-def]
    """320 timeouts at once over 4 sandboxes, one ordinary command per sandbox beside them.

    Two kill workers instead of eight make the kills queue on any machine: 320 kills one
    after the other would take far longer than the kill bound.
    """
    n, sandboxes, timeout = 320, 4, 2.0
    kill_bound, grace = 20.0, 3.0
    with Watchdog(workers=2) as wd, E2BSandboxProvider(
        emu.config(template="base"), watchdog=wd, kill_bound=kill_bound, kill_grace=grace
    ) as p:
        hs = [p.create(unique_name("burst")) for _ in range(sandboxes)]
        try:
            flag = "/workspace/burst-done"
            ordinary: List[List[object]] = [[] for _ in hs]
            watchers = [
                threading.Thread(target=_bystander, args=(p, h, flag, out))
                for h, out in zip(hs, ordinary)
            ]
            for t in watchers:
                t.start()
            assert wait_until(lambda: all(left(p, h, "[w]hile .*burst-done") for h in hs))

            results: List[Optional[ExecResult]] = [None] * n
            took = [0.0] * n
            errors: List[BaseException] = []
            go = threading.Barrier(n)

            def one(i: int) -> None:
                try:
                    go.wait(60)
                    t0 = time.monotonic()
                    results[i] = p.exec(hs[i % sandboxes], f"sleep 6{MARK}", timeout=timeout)
                    took[i] = time.monotonic() - t0
                except BaseException as exc:  # collected and asserted below
                    errors.append(exc)

            run_in_threads(one, n, 300)
            assert wd.thread_count() <= 1 + 2  # constant: the timer thread and two workers
            assert not errors, errors[:3]
            assert all(r is not None and r.timed_out and r.exit_code is None for r in results)
            assert [r for r in results if r is not None and r.wedged] == []
            assert reboots.started == []
            # each back within its timeout + kill bound + grace (+1 s: the wait for a verdict)
            assert max(took) < timeout + kill_bound + 1.0 + grace
            # the ordinary commands were left alone, and none of the burst's is left
            for h in hs:
                p.write_file(h, flag, b"")
            for t in watchers:
                t.join(60)
            assert [type(r).__name__ if isinstance(r, Exception) else r.stdout for r in
                    (out[0] for out in ordinary)] == ["survived\n"] * sandboxes  # type: ignore[union-attr]
            for h in hs:
                assert wait_until(lambda h=h: left(p, h, f"[s]leep 6{MARK}") == 0)  # type: ignore[misc]
        finally:
            for h in hs:
                p.destroy(h)


@pytest.fixture
def busy_pool() -> Iterator[tuple[Watchdog, threading.Event]]:
    """A private watchdog whose only worker is held until the event is set."""
    wd = Watchdog(workers=1)
    release = threading.Event()
    blocker = wd.submit(release.wait, 60.0)
    try:
        yield wd, release
    finally:
        release.set()
        blocker.result(timeout=10.0)
        wd.close()


def test_a_kill_queued_behind_a_busy_pool_is_no_evidence(emu, busy_pool, reboots) -> None:  # type: ignore[no-untyped-def]
    wd, release = busy_pool
    timeout, kill_bound, grace = 1.0, 2.0, 1.0
    with E2BSandboxProvider(
        emu.config(template="base"), watchdog=wd, kill_bound=kill_bound, kill_grace=grace
    ) as p:
        h = p.create(unique_name("killq"))
        try:
            flag = "/workspace/queue-done"
            ordinary: List[object] = []
            watcher = threading.Thread(target=_bystander, args=(p, h, flag, ordinary))
            watcher.start()
            t0 = time.monotonic()
            r = p.exec(h, f"sleep 3{MARK}", timeout=timeout)
            took = time.monotonic() - t0
            assert r.timed_out and r.exit_code is None
            # The kill never got a worker: no verdict, so not wedged and nothing rebooted;
            # the result still came back within the kill's bound from its submission.
            assert not r.wedged
            assert reboots.started == []
            assert took < timeout + kill_bound + 1.0 + grace
            # Once the pool is free, the queued kill still runs and stops the command.
            release.set()
            assert wait_until(lambda: left(p, h, f"[s]leep 3{MARK}") == 0)
            p.write_file(h, flag, b"")
            watcher.join(60)
            assert [getattr(x, "stdout", x) for x in ordinary] == ["survived\n"]
        finally:
            p.destroy(h)


ESCAPING = (
    "setsid sleep 71{m} & "  # leaves the session and the process group
    "( (setsid sleep 72{m} &) ) ; "  # double-forked too: reparented away from the wrapper
    "(env -i /bin/sleep 73{m} &) ; "  # no marker, still in the session
    "echo started; sleep 74{m}"
)


@pytest.mark.parametrize("stop", ["timeout", "cancel"])
def test_processes_that_left_the_session_die_with_their_exec(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, stop: str
) -> None:
    from e2b_provider import CancelToken

    m = f"{time.monotonic_ns() % 10**9}"
    tok = CancelToken()
    kwargs = {"timeout": 1.5} if stop == "timeout" else {"timeout": 60.0, "cancel": tok}
    r = shared_provider.exec(
        sandbox,
        ESCAPING.format(m=m),
        on_stdout=lambda s: tok.cancel("stop") if "started" in s else None,
        **kwargs,  # type: ignore[arg-type]
    )
    assert (r.timed_out, r.cancelled) == (stop == "timeout", stop == "cancel")
    assert not r.wedged and r.exit_code is None
    assert wait_until(lambda: left(shared_provider, sandbox, f"^(/bin/)?sleep 7[1-4]{m}") == 0)


@pytest.mark.parametrize("how", ["kill_all", "kill_tagged"])
def test_kill_all_and_kill_tagged_reach_processes_that_left_the_session(
    shared_provider: E2BSandboxProvider, sandbox: SandboxHandle, how: str
) -> None:
    m = f"{time.monotonic_ns() % 10**9}"
    tag = f"esc{m}"
    results: List[ExecResult] = []
    t = threading.Thread(
        target=lambda: results.append(
            shared_provider.exec(sandbox, ESCAPING.format(m=m), timeout=120.0, tag=tag)
        )
    )
    t.start()
    assert wait_until(lambda: left(shared_provider, sandbox, f"^(/bin/)?sleep 7[1-4]{m}") == 4)
    if how == "kill_all":
        shared_provider.kill_all(sandbox)
    else:
        shared_provider.kill_tagged(sandbox, [tag])
    t.join(30)
    assert results and results[0].exit_code == 137
    # the setsid-ed ones by their marker, the one with an emptied environment with the session
    assert wait_until(lambda: left(shared_provider, sandbox, f"^(/bin/)?sleep 7[1-4]{m}") == 0)


def test_a_timeout_after_close_is_not_reported_wedged(emu, reboots) -> None:  # type: ignore[no-untyped-def]
    p = E2BSandboxProvider(emu.config(template="base"))
    with E2BSandboxProvider(emu.config(template="base")) as other:
        h = other.create(unique_name("closed"))
        try:
            started = threading.Event()
            results: List[ExecResult] = []
            t = threading.Thread(
                target=lambda: results.append(
                    p.exec(h, f"echo started; sleep 5{MARK}", timeout=2.0,
                           on_stdout=lambda s: started.set())
                )
            )
            t.start()
            assert started.wait(30)
            p.close()
            t.join(30)
            # nothing was killed or rebooted: the result says so (timed out, not wedged)
            (r,) = results
            assert r.timed_out and r.exit_code is None and not r.wedged
            assert reboots.started == []
            assert emu.get_sandbox(h.id)["state"] == "running"
            # the command is left to the in-sandbox timeout (2 s + 5 s)
            assert wait_until(lambda: left(other, h, f"[s]leep 5{MARK}") == 0)
        finally:
            other.destroy(h)


def test_a_kill_after_a_reboot_never_reaches_the_sandbox(emu, provider) -> None:  # type: ignore[no-untyped-def]
    # A kill that waited while its sandbox was rebooted must not act there: a pid file left
    # from before may name another process by now. The batcher drops it unsent.
    from e2b_provider.commands.kills import KillBatcher

    h = provider.create(unique_name("afterboot"))
    try:
        target = provider._ctx.leases.get(h.id, need=60, lease_seconds=300, cancel=None)
        batcher = KillBatcher(provider._ctx, rebooted_since=lambda sid, t: True)
        emu.clear_requests()
        from e2b_provider.protocol import scripts as scripts

        ctl = scripts.control_path()
        fut = batcher.kill(target, ctl, time.monotonic(), 5.0, lambda: 12345)
        assert fut.result(timeout=30) is None
        assert [e["path"] for e in emu.requests(sandbox_id=h.id) if "Process" in e["path"]] == []
    finally:
        provider.destroy(h)


#: Makes a FIFO at the kill mark of every exec running in the sandbox (the sandbox user can:
#: the marks live in /tmp, named by the wrappers' command lines), then sleeps.
PLANT_FIFO_KILL_MARKS = (
    "for p in $(pgrep -f 'capybara-exec /tmp/[.]capybara-exec-'); do "
    "c=$(tr '\\0' '\\n' < /proc/$p/cmdline 2>/dev/null | grep '^/tmp/[.]capybara-exec-' "
    "| head -n 1); [ -n \"$c\" ] && mkfifo \"$c.kill\" 2>/dev/null; done; "
    "echo planted; exec sleep 47{m}"
)


def test_a_fifo_planted_as_the_kill_mark_neither_stalls_the_kill_nor_reboots(
    emu, reboots  # type: ignore[no-untyped-def]
) -> None:
    with E2BSandboxProvider(emu.config(template="base")) as p:
        h = p.create(unique_name("fifo-mark"))
        try:
            m = f"{time.monotonic_ns() % 10**9}"
            r = p.exec(h, PLANT_FIFO_KILL_MARKS.format(m=m), timeout=3.0)
            assert r.stdout.strip() == "planted", r
            assert r.timed_out and not r.wedged, r
            assert reboots.started == []
            assert wait_until(lambda: left(p, h, f"^sleep 47{m}") == 0)
        finally:
            p.destroy(h)
