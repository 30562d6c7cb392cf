"""Conformance: the OFFICIAL ``e2b`` SDK (sync ``Sandbox``, ``e2b>=2.63,<3``) against the emulator.

If the real SDK can create, list, run commands, move files, pause/resume and kill sandboxes
through the emulator, the emulator speaks E2B's wire format. The SDK is pointed at the emulator
through ``Emulator.sdk_env()`` (``E2B_API_KEY``/``E2B_API_URL``/``E2B_SANDBOX_URL``/``E2B_DOMAIN``).

The concurrent-streams and large-output tests print what they took (run with ``-s``); the
SDK's latency is measured by ``benchmarks/sdk_latency.py``, not here.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from typing import Callable, Iterator, List, Optional

import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    ConnectionConfig,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxQuery,
    SandboxState,
)

from e2b_provider.emulator import Emulator

from .conftest import sdk_sandbox

pytestmark = [pytest.mark.conformance, pytest.mark.integration]


@pytest.fixture(scope="module")
def sandbox(sdk: Emulator) -> Iterator[Sandbox]:
    with sdk_sandbox(metadata={"suite": "conformance"}, timeout=600) as sb:
        yield sb


def _report(name: str, value: str) -> None:
    print(f"\n[conformance] {name}: {value}")


# -- lifecycle ------------------------------------------------------------------------------


def test_create_with_metadata_and_list_by_metadata(sdk: Emulator) -> None:
    tag = uuid.uuid4().hex
    odd = "name with spaces & = + / é"
    created = [Sandbox.create(metadata={"tag": tag, "n": str(i), "odd": odd}) for i in range(2)]
    other = Sandbox.create(metadata={"tag": "other"})
    try:
        info = created[0].get_info()
        assert info.metadata == {"tag": tag, "n": "0", "odd": odd}
        assert info.state == SandboxState.RUNNING
        assert info.envd_version == "0.6.13"
        found = Sandbox.list(query=SandboxQuery(metadata={"tag": tag, "odd": odd})).next_items()
        assert sorted(s.sandbox_id for s in found) == sorted(s.sandbox_id for s in created)
        one = Sandbox.list(query=SandboxQuery(metadata={"tag": tag, "n": "1"})).next_items()
        assert [s.sandbox_id for s in one] == [created[1].sandbox_id]
        # paging through the SDK's paginator
        pager = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=1)
        seen: List[str] = []
        while pager.has_next:
            seen += [s.sandbox_id for s in pager.next_items()]
        assert sorted(seen) == sorted(s.sandbox_id for s in created)
        assert created[0].is_running()
    finally:
        for sb in [*created, other]:
            sb.kill()


def test_pause_then_connect_keeps_files(fresh: Sandbox) -> None:
    fresh.files.write("/home/user/keep.txt", "still here")
    assert fresh.pause() is True
    assert fresh.get_info().state == SandboxState.PAUSED
    assert fresh.pause() is False  # already paused: 409 → False
    back = Sandbox.connect(fresh.sandbox_id)
    assert back.is_running()
    assert back.files.read("/home/user/keep.txt") == "still here"
    assert back.commands.run("echo ok").stdout == "ok\n"


def test_filesystem_pause_and_reboot_resume(fresh: Sandbox) -> None:
    fresh.files.write("/home/user/keep.txt", "on disk")
    fresh.commands.run("sleep 300", background=True)
    assert fresh.pause(mode="filesystem") is True
    back = Sandbox.connect(fresh.sandbox_id, on_resume="reboot")
    assert back.files.read("/home/user/keep.txt") == "on disk"
    assert [p for p in back.commands.list() if p.args[-1:] == ["sleep 300"]] == []


def test_kill_then_connect_fails(sdk: Emulator) -> None:
    sb = Sandbox.create()
    sid = sb.sandbox_id
    assert sb.kill() is True
    assert Sandbox.kill(sid) is False  # 404 → False
    with pytest.raises(NotFoundException):
        Sandbox.connect(sid)
    assert not sb.is_running()


def test_wrong_api_key_is_refused(sdk: Emulator) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 40)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="e2b_" + "0" * 40).next_items()


def test_wrong_envd_token_is_refused(sandbox: Sandbox) -> None:
    cfg = ConnectionConfig(
        extra_sandbox_headers={
            "X-Access-Token": "0" * 64,
            "E2b-Sandbox-Id": sandbox.sandbox_id,
            "E2b-Sandbox-Port": "49983",
        }
    )
    impostor = Sandbox(
        sandbox_id=sandbox.sandbox_id,
        sandbox_domain=sandbox.sandbox_domain,
        envd_version=sandbox._envd_version,
        envd_access_token="0" * 64,
        traffic_access_token=None,
        connection_config=cfg,
    )
    with pytest.raises(AuthenticationException):
        impostor.commands.run("touch /tmp/impostor")
    with pytest.raises(AuthenticationException):
        impostor.files.read("/etc/hostname")
    assert sandbox.files.exists("/tmp/impostor") is False


# -- commands -------------------------------------------------------------------------------


def test_run_default_user_and_sandbox_user(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("whoami; pwd")
    assert r.exit_code == 0 and r.stdout == "user\n/home/user\n"
    r = sandbox.commands.run("whoami; pwd", user="sandbox", cwd="/workspace")
    assert r.stdout == "sandbox\n/workspace\n"
    r = sandbox.commands.run("whoami", user="root")
    assert r.stdout == "root\n"


def test_base_template_sudo_and_python(sandbox: Sandbox) -> None:
    # E2B's base template: `user` may sudo without a password, and `python` is Python 3.
    if shutil.which("sudo", path="/usr/bin") is None:
        pytest.skip(reason="sudo is not installed on this host (./dev installs it)")
    r = sandbox.commands.run("sudo -n true", user="user")
    assert r.exit_code == 0
    assert sandbox.commands.run("sudo -n whoami", user="user").stdout == "root\n"
    r = sandbox.commands.run("python -c 'import sys; print(sys.version_info[0])'")
    assert r.stdout == "3\n"
    info = sandbox.get_info()
    assert (info.cpu_count, info.memory_mb) == (2, 512)


def test_run_envs_stderr_and_exit_codes(sandbox: Sandbox) -> None:
    r = sandbox.commands.run('echo "$A-$B"; echo oops >&2', envs={"A": "1", "B": "two words"})
    assert r.stdout == "1-two words\n" and r.stderr == "oops\n" and r.exit_code == 0
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run("echo partial; echo bad >&2; exit 3")
    assert ei.value.exit_code == 3
    assert ei.value.stderr == "bad\n" and ei.value.stdout == "partial\n"
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run("/no/such/program")
    assert ei.value.exit_code == 127
    with pytest.raises(InvalidArgumentException, match="/no/such/dir"):
        sandbox.commands.run("true", cwd="/no/such/dir")


def test_large_output(sandbox: Sandbox) -> None:
    t0 = time.monotonic()
    r = sandbox.commands.run("head -c 5242880 /dev/zero | tr '\\0' 'y'", timeout=120)
    took = time.monotonic() - t0
    assert len(r.stdout) == 5 * 1024 * 1024 and set(r.stdout) == {"y"}
    _report("5 MiB of stdout through the SDK", f"{took:.2f} s")


def test_background_command_and_kill(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("echo started; sleep 300", background=True)
    assert handle.pid > 0
    assert any(p.pid == handle.pid for p in sandbox.commands.list())
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as ei:
        handle.wait()
    assert ei.value.exit_code == -1
    assert ei.value.error is not None and "killed" in ei.value.error
    assert all(p.pid != handle.pid for p in sandbox.commands.list())
    assert sandbox.commands.kill(handle.pid) is False  # not_found → False


def test_background_disconnect_keeps_running(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 1; echo done > /tmp/bg-done", background=True)
    handle.disconnect()
    deadline = time.monotonic() + 10
    while not sandbox.files.exists("/tmp/bg-done"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert sandbox.files.read("/tmp/bg-done") == "done\n"


# -- files ----------------------------------------------------------------------------------


def test_files_text_binary_list_exists(sandbox: Sandbox) -> None:
    info = sandbox.files.write("/home/user/dir/hello.txt", "héllo\n")
    assert info.path == "/home/user/dir/hello.txt"
    assert sandbox.files.read("/home/user/dir/hello.txt") == "héllo\n"
    blob = bytes(range(256)) * 1000
    sandbox.files.write("/home/user/dir/blob.bin", blob)
    assert bytes(sandbox.files.read("/home/user/dir/blob.bin", format="bytes")) == blob
    names = sorted(e.name for e in sandbox.files.list("/home/user/dir"))
    assert names == ["blob.bin", "hello.txt"]
    assert sandbox.files.exists("/home/user/dir/hello.txt")
    assert not sandbox.files.exists("/home/user/dir/missing.txt")
    sandbox.files.write("/workspace/owned.txt", "x", user="sandbox")
    r = sandbox.commands.run("stat -c %U /workspace/owned.txt")
    assert r.stdout == "sandbox\n"
    sandbox.files.remove("/home/user/dir/hello.txt")
    assert not sandbox.files.exists("/home/user/dir/hello.txt")


# -- measurements ---------------------------------------------------------------------------


def test_measure_concurrent_streams(sandbox: Sandbox, run_in_threads: Callable[..., float]) -> None:
    n = 200
    errors: List[BaseException] = []
    outputs: List[Optional[str]] = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            outputs[i] = sandbox.commands.run(f"sleep 1; echo {i}", timeout=120).stdout
        except BaseException as exc:
            errors.append(exc)

    took = run_in_threads(worker, n, 180)
    assert errors == []
    assert outputs == [f"{i}\n" for i in range(n)]
    _report("concurrent SDK command streams", f"{n} in {took:.2f} s (each sleeps 1 s)")
