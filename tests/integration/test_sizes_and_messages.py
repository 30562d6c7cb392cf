"""Sizes are never silently ignored, and errors say what happened (against the emulator).

E2B sizes a sandbox by its template: ``create`` warns once per size requested that the new
sandbox did not get, and the handle (and ``info``) report the sizes it has. A missing exec
cwd says the command did not run; a sandbox deleted under a running exec is "gone", not a
network error; a sandbox name passed where an id is expected says calls take the handle or
the id.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, List

import pytest
import requests

from e2b_provider import (
    E2BHttpError,
    E2BSandboxProvider,
    InvalidArgument,
    SandboxGoneError,
    SandboxHandle,
    SandboxLimits,
    SandboxSummary,
)

from .conftest import unique_name

pytestmark = pytest.mark.integration


def _reported(emu: Any, api: requests.Session, sid: str) -> Dict[str, Any]:
    """What the emulator's control plane says about the sandbox (the sizes' truth)."""
    r = api.get(f"{emu.api_url}/sandboxes/{sid}", timeout=30)
    assert r.status_code == 200, r.text
    answer: Dict[str, Any] = r.json()
    return answer


def _size_warnings(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "e2b_provider" and r.levelno == logging.WARNING and "requested" in
        r.getMessage()
    ]


def test_create_warns_once_per_size_the_template_does_not_give(
    emu: Any, api: requests.Session, provider: E2BSandboxProvider,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = unique_name("sizes")
    with caplog.at_level(logging.WARNING, logger="e2b_provider"):
        h = provider.create(name, SandboxLimits(cpu=64, memory_mb=100_000))
    try:
        real = _reported(emu, api, h.id)
        # the handle carries the sandbox's real sizes (its template's)
        assert (h.cpu_count, h.memory_mb, h.disk_mb) == (
            real["cpuCount"], real["memoryMB"], real["diskSizeMB"]
        )
        warnings = _size_warnings(caplog)
        assert len(warnings) == 2, warnings  # one per mismatch: cpu and memory, not disk
        cpu, memory = warnings
        assert f"has {real['cpuCount']} CPUs, not the 64 CPUs requested (cpu=64)" in cpu
        assert (
            f"has {real['memoryMB']} MiB of memory, not the 100000 MiB requested "
            "(memory_mb=100000)" in memory
        )
        for text in warnings:
            assert h.id in text and name in text and "template 'base'" in text, text
            assert emu.api_key not in text
            assert real["envdAccessToken"] not in text
    finally:
        provider.destroy(h)


def test_create_with_the_template_sizes_or_none_warns_nothing(
    emu: Any, api: requests.Session, provider: E2BSandboxProvider,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="e2b_provider"):
        first = provider.create(unique_name("sizes"))  # no sizes requested
    try:
        real = _reported(emu, api, first.id)
        assert (first.cpu_count, first.memory_mb, first.disk_mb) == (
            real["cpuCount"], real["memoryMB"], real["diskSizeMB"]
        )
        with caplog.at_level(logging.WARNING, logger="e2b_provider"):
            second = provider.create(
                unique_name("sizes"),
                SandboxLimits(cpu=real["cpuCount"], memory_mb=real["memoryMB"],
                              disk_mb=real["diskSizeMB"]),
            )
        provider.destroy(second)
        assert _size_warnings(caplog) == []
    finally:
        provider.destroy(first)


def test_info_reports_state_name_and_sizes_of_any_sandbox(
    emu: Any, api: requests.Session, provider: E2BSandboxProvider
) -> None:
    name = unique_name("info")
    h = provider.create(name)
    real = _reported(emu, api, h.id)
    sizes = (real["cpuCount"], real["memoryMB"], real["diskSizeMB"])
    info = provider.info(h.id)
    assert isinstance(info, SandboxSummary)
    assert (info.id, info.name, info.state) == (h.id, name, "running")
    assert (info.cpu_count, info.memory_mb, info.disk_mb) == sizes
    assert info.handle == h and info.handle.cpu_count == real["cpuCount"]
    listed = provider.list_sandboxes(name)
    assert [(s.id, s.cpu_count, s.memory_mb, s.disk_mb) for s in listed] == [(h.id, *sizes)]
    provider.suspend(h)
    assert provider.info(h).state == "paused"  # and it stays paused: one GET, no connect
    assert _reported(emu, api, h.id)["state"] == "paused"
    provider.destroy(h)
    with pytest.raises(SandboxGoneError) as ei:
        provider.info(h)
    assert str(ei.value) == (
        f"describing sandbox {h.id} failed: the sandbox no longer exists; create a new sandbox"
    )


def test_exec_in_a_missing_directory_says_it_did_not_run(
    provider: E2BSandboxProvider, sandbox: SandboxHandle
) -> None:
    with pytest.raises(InvalidArgument) as ei:
        provider.exec(sandbox, "touch /workspace/ran-in-missing-cwd", cwd="/workspace/no/such")
    text = str(ei.value)
    assert text.startswith(
        f"running a command in sandbox {sandbox.id} failed: the working directory "
        "/workspace/no/such does not exist in the sandbox, so the command did not run"
    ), text
    assert "may or may not" not in text and "try again" not in text, text
    # it did not run
    assert provider.exec(sandbox, "test -e /workspace/ran-in-missing-cwd").exit_code == 1
    assert provider.exec(sandbox, "pwd", cwd="/tmp").stdout == "/tmp\n"


def _raised_when_deleted_under(
    emu: Any, api: requests.Session, h: SandboxHandle, call: Callable[[], object],
    started: threading.Event, not_started: str,
) -> List[BaseException]:
    """Run ``call`` in a thread; once it set ``started`` (``not_started`` says it did not),
    another client deletes ``h`` through the control plane. What the call raised."""
    outcome: List[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # recorded for the main thread
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        assert started.wait(60), not_started
        # another client deletes the sandbox through the control plane
        r = api.delete(f"{emu.api_url}/sandboxes/{h.id}", timeout=60)
        assert r.status_code == 204, r.text
    finally:
        worker.join(120)
    assert not worker.is_alive()
    return outcome


def test_a_sandbox_deleted_under_a_running_exec_is_gone_not_a_network_error(
    emu: Any, api: requests.Session, provider: E2BSandboxProvider
) -> None:
    h = provider.create(unique_name("killed"))
    running = threading.Event()
    outcome = _raised_when_deleted_under(
        emu, api, h,
        lambda: provider.exec(h, "echo up; sleep 120", timeout=150.0,
                              on_stdout=lambda text: running.set()),
        running, "the command did not start",
    )
    assert len(outcome) == 1 and isinstance(outcome[0], SandboxGoneError), outcome
    text = str(outcome[0])
    assert text == (
        f"running a command in sandbox {h.id} failed: the sandbox was deleted while the "
        "command ran (by destroy() or another client, or by E2B): the command ended with it; "
        "create a new sandbox"
    ), text
    assert "proxy" not in text and "network" not in text


def test_a_name_passed_as_an_id_says_calls_take_the_handle(
    provider: E2BSandboxProvider,
) -> None:
    name = unique_name("job")
    h = provider.create(name)
    try:
        with pytest.raises(SandboxGoneError) as ei:
            provider.exec(name, "true", timeout=30.0)
        text = str(ei.value)
        assert text.startswith(
            f"running a command in sandbox {name} failed: no sandbox has the id {name!r}: that "
            f"is the name of sandbox {h.id}; calls take the handle create() returned, or the "
            "sandbox id, not the name"
        ), text
        assert "create a new sandbox" not in text
        with pytest.raises(SandboxGoneError) as unknown:
            provider.read_file("nosuchjob-1", "/x")  # E2B: 404, no such sandbox
        assert str(unknown.value).startswith(
            "reading /x in sandbox nosuchjob-1 failed: no sandbox has the id 'nosuchjob-1', "
            "which looks like a sandbox name rather than an E2B sandbox id"
        ), str(unknown.value)
        with pytest.raises(E2BHttpError) as invalid:
            provider.kill_all(f"my-{name}")  # E2B: 400 "Invalid sandbox ID" (two dashes)
        assert invalid.value.status == 400
        assert str(invalid.value).startswith(
            f"stopping leftover commands in sandbox my-{name} failed: no sandbox has the id "
            f"'my-{name}', which looks like a sandbox name"
        ), str(invalid.value)
        # a name no id can be is refused before any I/O, saying the same
        with pytest.raises(InvalidArgument) as refused:
            provider.stat("job_1.v2", "/x")
        assert "'job_1.v2' looks like a sandbox name: calls take the handle create() " \
            "returned, or the sandbox id" in str(refused.value), str(refused.value)
        assert provider.exec(h, "true", timeout=30.0).ok  # the handle works
    finally:
        provider.destroy(h)


def test_a_sandbox_deleted_under_a_file_call_is_gone_not_a_network_error(
    emu: Any, api: requests.Session, provider: E2BSandboxProvider, tmp_path: Any
) -> None:
    h = provider.create(unique_name("killedfiles"))
    provider.exec(h, "mkdir -p /workspace/big && for i in $(seq 1 64); do "
                     "head -c 4194304 /dev/urandom > /workspace/big/f$i; done", timeout=120.0)
    moving = threading.Event()

    def progress(done: int, total: Any) -> None:
        if done:
            moving.set()
            time.sleep(0.01)  # a slow reader: the transfer is still under way at the delete

    outcome = _raised_when_deleted_under(
        emu, api, h,
        lambda: provider.download(h, "/workspace/big", str(tmp_path / "big"),
                                  progress=progress),
        moving, "the download did not start",
    )
    assert len(outcome) == 1 and isinstance(outcome[0], SandboxGoneError), outcome
    assert "was deleted meanwhile" in str(outcome[0]) and "network" not in str(outcome[0])
