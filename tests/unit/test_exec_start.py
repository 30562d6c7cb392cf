"""run_process when opening the stream fails: after a stop it is a result, as in the reference.

The reference's ``run()`` catches every error of ``envdStart`` (opening included), awaits the
kill, reboots a wedged sandbox, and then returns ``exitCode: null`` when the run timed out or
was aborted; only otherwise does it throw. The envd client here is a stand-in whose ``start``
fails the way a real one does (TransportError/TransportTimeout/E2BHttpError); the code under
test, the exec engine and the watchdog, is real.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, List, Optional

import pytest

from e2b_provider._exec import run_process
from e2b_provider._watchdog import Watchdog
from e2b_provider.cancel import CancelToken
from e2b_provider.errors import E2BHttpError, TransportError, TransportTimeout


@pytest.fixture
def wd() -> Iterator[Watchdog]:
    w = Watchdog(workers=2)
    yield w
    w.close()


class FailingStart:
    """An envd whose ``start`` fails with ``error`` once ``ready`` is set (bounded wait)."""

    def __init__(
        self, error: Exception, ready: Optional[threading.Event] = None, before: Any = None
    ) -> None:
        self.error = error
        self.ready = ready
        self.before = before

    def start(self, **kwargs: Any) -> Any:
        if self.before is not None:
            self.before()
        if self.ready is not None:
            assert self.ready.wait(10.0)
        raise self.error


def _run(envd: Any, wd: Watchdog, **kw: Any) -> Any:
    args = dict(
        user="sandbox",
        cmd="true",
        args=[],
        max_output_bytes=64,
        watchdog=wd,
        grace_seconds=0.2,
        kill_seconds=5.0,
    )
    args.update(kw)
    return run_process(envd, **args)


def test_cancel_while_opening_then_open_fails_is_a_cancelled_result(wd: Watchdog) -> None:
    token = CancelToken()
    killed = threading.Event()
    kills: List[Optional[int]] = []

    def killer(pid: Optional[int], bound: float) -> bool:
        kills.append(pid)
        killed.set()
        return True

    envd = FailingStart(
        TransportError("E2B process start: connection failed"),
        killed,
        before=lambda: token.cancel("user stop"),
    )
    wedged: List[bool] = []
    out = _run(
        envd, wd, timeout=30.0, token=token, killer=killer, on_wedged=lambda: wedged.append(True)
    )
    assert out.cancelled and not out.timed_out
    assert out.exit_code is None
    assert kills == [None]  # the kill still ran (the command may have started)
    assert not out.wedged and wedged == []


def test_timeout_while_opening_then_open_fails_is_a_timed_out_result(wd: Watchdog) -> None:
    killed = threading.Event()

    def killer(pid: Optional[int], bound: float) -> bool:
        killed.set()
        return False  # the kill failed too: the sandbox is wedged and rebooted

    envd = FailingStart(TransportTimeout("E2B process start timed out"), killed)
    wedged: List[bool] = []
    out = _run(
        envd, wd, timeout=0.05, token=None, killer=killer, on_wedged=lambda: wedged.append(True)
    )
    assert out.timed_out and out.exit_code is None
    assert out.wedged and wedged == [True]


def test_open_failure_without_a_stop_is_raised(wd: Watchdog) -> None:
    envd = FailingStart(E2BHttpError(502, "The sandbox was not found", 502))
    with pytest.raises(E2BHttpError) as ei:
        _run(envd, wd, timeout=30.0, token=CancelToken(), killer=lambda p, b: True)
    assert ei.value.status == 502
