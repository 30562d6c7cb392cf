"""Isolation and limits of the emulator's sandboxes, adversarially, through its API.

Root mode (these tests need root, as CI has): the sandbox's root, which every API client can
run commands as, must not read host files that are not world-readable, nor write the host-side
agent log; a fork bomb stops at the sandbox's process limit; a full disk is ENOSPC for
processes and 507 for uploads; each boot has its own boot id, which a memory resume keeps and a
cold boot renews. The limits come from the emulator's template (``--disk-mb`` etc.), as on E2B,
where a create request carries no resources: a module-scoped emulator runs a small template.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from typing import Any, Callable, Dict, Iterator, List

import pytest
import requests
from waiting import wait_until

from e2b_provider.emulator import Emulator
from e2b_provider.emulator.runtime import disk, linux

from .test_server import detail, envd_headers, run

Make = Callable[..., Dict[str, Any]]

_NOT_ROOT = os.geteuid() != 0
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_NOT_ROOT, reason="root mode isolation (rootless: test_rootless.py)"),
]

SMALL = {"disk_mb": 16, "max_processes": 64, "cpu_count": 1, "memory_mb": 256}


@pytest.fixture(scope="module")
def small(emulator: Emulator) -> Iterator[Emulator]:
    """An emulator whose template is small: 16 MiB disks, 64 processes, 1 CPU, 256 MiB.

    Depends on the session's ``emulator`` only to share its skip when isolation is missing.
    """
    with Emulator(log_level="info", **SMALL) as emu:
        yield emu


def _create(emu: Emulator, **body: Any) -> Dict[str, Any]:
    r = requests.post(
        emu.api_url + "/v2/sandboxes",
        json={"templateID": "base", **body},
        headers={"X-API-KEY": emu.api_key},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    out: Dict[str, Any] = r.json()
    return out


@pytest.fixture
def small_sandbox(small: Emulator) -> Iterator[Dict[str, Any]]:
    sb = _create(small)
    try:
        yield sb
    finally:
        requests.delete(
            f"{small.api_url}/sandboxes/{sb['sandboxID']}",
            headers={"X-API-KEY": small.api_key},
            timeout=60,
        )


def _controllers() -> List[str]:
    v2 = linux.cgroup2_mount()
    available: List[str] = []
    if v2 is not None:
        with open(os.path.join(v2, "cgroup.controllers")) as f:
            available = f.read().split()
    return [c for c in ("memory", "cpu", "pids") if c in available or linux.cgroup1_mount(c)]


def test_template_resources_are_reported_enforced_and_logged(
    small: Emulator, small_sandbox: Dict[str, Any]
) -> None:
    sid = small_sandbox["sandboxID"]
    with requests.Session() as api:
        api.headers["X-API-KEY"] = small.api_key
        d = detail(api, small, sid)
    assert (d["cpuCount"], d["memoryMB"], d["diskSizeMB"]) == (1, 256, 16)
    item = next(s for s in small.list_sandboxes() if s["sandboxID"] == sid)
    assert item["maxProcesses"] == 64
    expected = set(_controllers()) | ({"disk"} if disk.disk_support() is None else set())
    assert set(item["enforcedLimits"]) == expected
    line = next(
        (ln for ln in small._stderr_tail(1 << 20).splitlines() if f"sandbox {sid} limits:" in ln),
        None,
    )
    assert line is not None
    assert "cpu 1 (" in line and "memory 256 MiB (" in line and "processes 64 (" in line
    out, _ = run(small, small_sandbox, "nproc; df -m / | tail -1 | awk '{print $2}'")
    assert int(out.split()[1]) <= 16


def test_full_disk_is_enospc_and_507(small: Emulator, small_sandbox: Dict[str, Any]) -> None:
    if disk.disk_support() is not None:
        pytest.skip(reason=f"no sandbox disks on this host: {disk.disk_support()}")
    sb = small_sandbox
    out, end = run(small, sb, "head -c 32M /dev/zero > ~/fill", check=False)
    assert end.get("exitCode", 0) != 0 and "No space left on device" in out
    url = small.sandbox_url + "/files"
    headers = envd_headers(sb, **{"Content-Type": "application/octet-stream"})
    r = requests.post(
        url, params={"path": "/home/user/more"}, data=b"x" * (4 << 20), headers=headers,
        timeout=60,
    )  # fmt: skip
    assert r.status_code == 507, r.text
    assert r.json()["code"] == 507
    # freeing space lets writes through again; nothing went to the host's disk
    run(small, sb, "rm ~/fill")
    r = requests.post(
        url, params={"path": "/home/user/more"}, data=b"x" * (4 << 20), headers=headers,
        timeout=60,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    state = small.state_dir
    assert state is not None
    image = os.path.join(state, sb["sandboxID"], "disk.img")
    assert os.stat(image).st_blocks * 512 <= 17 << 20


def test_fork_bomb_is_contained(small: Emulator, small_sandbox: Dict[str, Any]) -> None:
    sb = small_sandbox
    sid = sb["sandboxID"]
    seen: List[int] = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen[0] = max(seen[0], len(small.sandbox_pids(sid)))
            stop.wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # A real fork bomb as `user`; timeout SIGKILLs its process group after 3 s.
        bomb = "timeout -s KILL 3 bash -c 'b(){ b|b& }; b; exec sleep 60' >/dev/null 2>&1"
        _, end = run(small, sb, bomb, check=False, user="user", timeout=120)
        assert end.get("exitCode") != 0 or "signal" in str(end.get("status", ""))
    finally:
        stop.set()
        watcher.join(10)
    # every process of the sandbox, unshare included, stayed within the limit (64 + 1)
    assert 0 < seen[0] <= SMALL["max_processes"] + 1
    wait_until(
        lambda: run(small, sb, "pgrep -c -u user || true", user="root")[0].strip() == "0",
        30,
        "the bomb to be gone",
    )
    assert run(small, sb, "echo alive")[0] == "alive\n"


def test_sandbox_root_reads_no_private_host_file(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    tag = uuid.uuid4().hex
    secret, public = f"/etc/e2b-iso-secret-{tag}", f"/etc/e2b-iso-public-{tag}"
    try:
        for path, mode in ((secret, 0o600), (public, 0o644)):
            with open(path, "w") as f:
                f.write(f"host {tag}\n")
            os.chmod(path, mode)
        out, end = run(emu, sb, f"id -u; cat {public}; cat {secret}", check=False, user="root")
        assert end.get("exitCode") != 0
        assert out.splitlines()[:2] == ["0", f"host {tag}"] and out.count(f"host {tag}") == 1
        out, _ = run(emu, sb, "sudo -n cat /etc/shadow- 2>&1 || true", user="user")
        assert "root:" not in out
        # envd's own file routes run as the sandbox's root too
        r = requests.get(
            emu.sandbox_url + "/files",
            params={"path": secret, "username": "root"},
            headers=envd_headers(sb),
            timeout=30,
        )
        assert r.status_code >= 400 and f"host {tag}" not in r.text
        r = requests.post(
            emu.sandbox_url + "/files",
            params={"path": public, "username": "root"},
            data=b"overwritten",
            headers=envd_headers(sb, **{"Content-Type": "application/octet-stream"}),
            timeout=30,
        )
        assert r.status_code >= 400
        with open(public) as f:
            assert f.read() == f"host {tag}\n"
    finally:
        for path in (secret, public):
            if os.path.exists(path):
                os.unlink(path)


def test_agent_log_is_not_writable_from_the_sandbox(emu: Emulator, make_sandbox: Make) -> None:
    sb = make_sandbox()
    mark = f"e2b-iso-{uuid.uuid4().hex}"
    script = (
        "agent=$(pgrep -f -o e2b_provider.emulator.agent); test -n \"$agent\" || exit 9; "
        f"for p in $agent 1; do for fd in 1 2; do echo {mark} > /proc/$p/fd/$fd "
        "&& echo wrote $p $fd; done; done 2>/dev/null; true"
    )
    for user in ("root", "user"):
        out, _ = run(emu, sb, script, user=user)
        assert "wrote" not in out, (user, out)
    state = emu.state_dir
    assert state is not None
    log_dir = os.path.join(state, sb["sandboxID"])
    logs = [n for n in os.listdir(log_dir) if n.startswith("init.log")]
    assert logs
    for name in logs:
        with open(os.path.join(log_dir, name), "rb") as f:
            assert mark.encode() not in f.read()


def _boot_id(emu: Emulator, sb: Dict[str, Any]) -> str:
    out, _ = run(emu, sb, "cat /proc/sys/kernel/random/boot_id")
    return out.strip()


def test_cold_boot_is_a_boot(
    emu: Emulator, api: requests.Session, make_sandbox: Make
) -> None:
    with open("/proc/sys/kernel/random/boot_id") as f:
        host = f.read().strip()
    sb = make_sandbox()
    sid = sb["sandboxID"]
    first = _boot_id(emu, sb)
    assert first != host
    # a pause with memory and its resume: the same boot
    assert api.post(f"{emu.api_url}/sandboxes/{sid}/pause", json={}).status_code == 204
    assert api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect", json={}).status_code == 201
    assert _boot_id(emu, sb) == first
    # a filesystem-only pause and its resume: a new boot, uptime from 0 again
    r = api.post(f"{emu.api_url}/sandboxes/{sid}/pause", json={"memory": False})
    assert r.status_code == 204
    assert api.post(f"{emu.api_url}/v2/sandboxes/{sid}/connect", json={}).status_code == 201
    second = _boot_id(emu, sb)
    assert second not in (first, host)
    if os.path.exists("/proc/self/ns/time"):
        with open("/proc/uptime") as f:
            host_uptime = float(f.read().split()[0])
        uptime = float(run(emu, sb, "cut -d' ' -f1 /proc/uptime")[0])
        assert uptime < min(60.0, host_uptime)
    # an auto-pause without memory, then a resume: a new boot again
    auto = make_sandbox(timeout=2, autoPause=True, autoPauseMemory=False)
    before = _boot_id(emu, auto)
    wait_until(
        lambda: detail(api, emu, auto["sandboxID"]).get("pauseMode") == "filesystem",
        20,
        "auto-pause",
    )
    r = api.post(f"{emu.api_url}/v2/sandboxes/{auto['sandboxID']}/connect", json={"timeout": 60})
    assert r.status_code == 201
    assert _boot_id(emu, auto) not in (before, host)


@pytest.mark.parametrize(
    "args",
    [["--disk-mb", "15"], ["--max-processes", "0"], ["--cpu-count", "two"], ["--memory-mb", "8"]],
)
def test_resource_options_are_checked_before_anything_starts(args: List[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "e2b_provider.emulator", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert f"argument {args[0]}" in done.stderr
