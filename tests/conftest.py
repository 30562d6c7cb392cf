"""Shared fixtures: the local E2B emulator for every test that needs a server.

* a ``XDG_RUNTIME_DIR`` of the run's own (session, automatic), so the record an
  ``e2b-provider emulator`` keeps never replaces the user's.

* ``emulator`` (session): one :class:`~e2b_provider.emulator.Emulator` subprocess for the whole
  run. Skipped — with the reason printed in the summary — only when sandbox isolation is
  unavailable on this machine (:class:`~e2b_provider.emulator.EmulatorUnavailable`); any other
  start failure is an error.
* ``emu`` (function): the same emulator; its faults are cleared after each test.
* ``make_sandbox`` (function): ``make_sandbox(**create_body) -> create answer (dict)``; creates
  sandboxes over the REST API and deletes them after the test.
* ``api`` (function): a ``requests.Session`` that sends the emulator's API key; use it with
  ``emu.api_url + "/v2/sandboxes"`` etc.
* ``sdk`` (module): the same emulator, with the official SDK pointed at it through the
  environment (``Emulator.sdk_env()``) for the module's tests.
* ``run_in_threads`` (function): ``run_in_threads(worker, n, join_timeout) -> seconds``; runs
  ``worker(i)`` for ``i`` in ``range(n)``, one thread each, and joins them (bounded).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterator, List

import pytest
import requests
import waiting

from e2b_provider.emulator import Emulator, EmulatorUnavailable

_UNAVAILABLE: List[str] = []


@pytest.fixture(scope="session", autouse=True)
def _own_runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A runtime directory of the run's own: the records of the ``e2b-provider emulator``s
    tests start go there, never over the record of an emulator the user runs."""
    runtime = tmp_path_factory.mktemp("xdg-runtime")
    runtime.chmod(0o700)
    before = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    yield
    if before is None:
        os.environ.pop("XDG_RUNTIME_DIR", None)
    else:
        os.environ["XDG_RUNTIME_DIR"] = before


@pytest.fixture(scope="session", autouse=True)
def _no_stale_cgroups() -> Iterator[None]:
    """After the run, remove the empty cgroups of emulators that tests killed with SIGKILL."""
    yield
    if os.geteuid() == 0:
        from e2b_provider.emulator.runtime import remove_stale_cgroups

        remove_stale_cgroups()


@pytest.fixture(scope="session")
def emulator() -> Iterator[Emulator]:
    """One emulator for the whole test session (skipped only if isolation is unavailable)."""
    if _UNAVAILABLE:
        pytest.skip(reason=_UNAVAILABLE[0])
    try:
        emu = Emulator(startup_timeout=60.0).start()
    except EmulatorUnavailable as exc:
        _UNAVAILABLE.append(f"local E2B emulator unavailable: {exc}")
        pytest.skip(reason=_UNAVAILABLE[0])
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture
def emu(emulator: Emulator) -> Iterator[Emulator]:
    """The session's emulator; every fault armed by the test is cleared afterwards."""
    try:
        yield emulator
    finally:
        if emulator.running:
            emulator.clear_faults()


@pytest.fixture(scope="module")
def sdk(emulator: Emulator) -> Iterator[Emulator]:
    """Point the SDK at the emulator for this module (environment variables)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in emulator.sdk_env().items():
            mp.setenv(key, value)
        yield emulator


@pytest.fixture
def api(emulator: Emulator) -> Iterator[requests.Session]:
    """A requests session carrying the emulator's ``X-API-KEY``."""
    with requests.Session() as s:
        s.headers["X-API-KEY"] = emulator.api_key
        yield s


@pytest.fixture
def make_sandbox(
    emulator: Emulator, api: requests.Session
) -> Iterator[Callable[..., Dict[str, Any]]]:
    """Create sandboxes through ``POST /v2/sandboxes``; all are deleted after the test."""
    created: List[str] = []

    def make(**body: Any) -> Dict[str, Any]:
        body.setdefault("templateID", "base")
        r = api.post(emulator.api_url + "/v2/sandboxes", json=body, timeout=60)
        assert r.status_code == 201, r.text
        answer: Dict[str, Any] = r.json()
        created.append(answer["sandboxID"])
        return answer

    yield make
    for sid in created:
        if emulator.running:
            api.delete(f"{emulator.api_url}/sandboxes/{sid}", timeout=60)


@pytest.fixture
def run_in_threads() -> Callable[[Callable[[int], None], int, float], float]:
    """:func:`waiting.run_in_threads`: ``run_in_threads(worker, n, join_timeout) -> seconds``."""
    return waiting.run_in_threads


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print why emulator tests were skipped, even without ``-rs``."""
    if _UNAVAILABLE:
        terminalreporter.write_line(_UNAVAILABLE[0], yellow=True)
