"""Conformance: volumes with the official ``e2b`` SDK, sync (``Volume``, ``Sandbox``) and async
(``AsyncVolume``, ``AsyncSandbox``): the control plane (create with E2B's name rules, list,
info with the content token, destroy), the volume content API (sent by the unmodified SDK to
``E2B_VOLUME_API_URL`` from ``Emulator.sdk_env()``), ``volume_mounts`` seen from inside
sandboxes both ways, and hostile paths and symlinks that must never reach host files.
"""

from __future__ import annotations

import os
import uuid

import pytest
import requests
from e2b import (
    AsyncSandbox,
    AsyncVolume,
    AuthenticationException,
    Sandbox,
    SandboxException,
    Volume,
    VolumeException,
    VolumeFileType,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)

from e2b_provider.emulator import Emulator

from .conftest import arun

pytestmark = [pytest.mark.conformance, pytest.mark.integration]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# -- control plane ---------------------------------------------------------------------------


def test_volume_control_plane_sync(sdk: Emulator) -> None:
    name = _name("cp-sync")
    vol = Volume.create(name)
    assert vol.name == name and str(uuid.UUID(vol.volume_id)) == vol.volume_id
    assert vol.token
    with pytest.raises(VolumeException, match=r"400: Volume with name .* already exists"):
        Volume.create(name)
    for bad in ("", "has space", "dots.not.allowed", "slash/no"):
        with pytest.raises(VolumeException, match="400: Invalid volume name"):
            Volume.create(bad)
    assert (vol.volume_id, name) in {(v.volume_id, v.name) for v in Volume.list()}
    info = Volume.get_info(vol.volume_id)
    assert (info.volume_id, info.name, info.token) == (vol.volume_id, name, vol.token)
    again = Volume.connect(vol.volume_id)
    assert again.token == vol.token
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(str(uuid.uuid4()))
    with pytest.raises(VolumeException, match="400: Invalid volume ID"):
        Volume.get_info("not-a-uuid")
    assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False
    assert vol.volume_id not in {v.volume_id for v in Volume.list()}
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id)
    # the name is free again, and the old token opens nothing
    fresh = Volume.create(name)
    try:
        with pytest.raises(AuthenticationException):
            vol.write_file("/x", "y")
    finally:
        Volume.destroy(fresh.volume_id)


def test_volume_control_plane_async(sdk: Emulator) -> None:
    async def scenario() -> None:
        name = _name("cp-async")
        vol = await AsyncVolume.create(name)
        try:
            assert vol.name == name
            listed = await AsyncVolume.list()
            assert vol.volume_id in {v.volume_id for v in listed}
            info = await AsyncVolume.get_info(vol.volume_id)
            assert info.token == vol.token
            with pytest.raises(VolumeException, match="already exists"):
                await AsyncVolume.create(name)
        finally:
            assert await AsyncVolume.destroy(vol.volume_id) is True
        assert await AsyncVolume.destroy(vol.volume_id) is False

    arun(scenario())


# -- content API ------------------------------------------------------------------------------


def test_volume_content_round_trip_sync(sdk: Emulator) -> None:
    vol = Volume.create(_name("content-sync"))
    try:
        entry = vol.write_file("/docs/a.txt", "hello", force=True)
        assert (entry.name, entry.path, entry.type, entry.size) == (
            "a.txt", "/docs/a.txt", VolumeFileType.FILE, 5,
        )  # fmt: skip
        assert (entry.uid, entry.gid, entry.mode) == (9090, 9090, 0o666)  # E2B's defaults
        assert vol.read_file("/docs/a.txt") == "hello"
        assert vol.read_file("docs/a.txt", format="bytes") == b"hello"
        big = os.urandom(3 * 1024 * 1024 + 7)
        vol.write_file("/docs/big.bin", big)
        assert b"".join(vol.read_file("/docs/big.bin", format="stream")) == big
        with pytest.raises(VolumeException, match="409"):
            vol.write_file("/docs/a.txt", "again")  # exists, no force
        vol.write_file("/docs/a.txt", "replaced", force=True)
        assert vol.read_file("/docs/a.txt") == "replaced"
        with pytest.raises(VolumePathNotFoundException):
            vol.write_file("/missing/parent.txt", "x")

        made = vol.make_dir("/docs/sub", mode=0o750, uid=1000, gid=1000)
        assert (made.type, made.mode, made.uid, made.gid) == (
            VolumeFileType.DIRECTORY, 0o750, 1000, 1000,
        )  # fmt: skip
        with pytest.raises(VolumeException, match="409"):
            vol.make_dir("/docs/sub")
        assert vol.make_dir("/docs/sub", force=True).path == "/docs/sub"
        assert vol.make_dir("/deep/er/still", force=True).path == "/deep/er/still"
        with pytest.raises(VolumePathNotFoundException):
            vol.make_dir("/nope/child")
        with pytest.raises(VolumeException, match="400"):
            vol.make_dir("/docs/a.txt/child")  # a file on the way

        assert [e.path for e in vol.list("/docs")] == ["/docs/a.txt", "/docs/big.bin", "/docs/sub"]
        deep = [e.path for e in vol.list("/", depth=3)]
        assert deep == [
            "/deep", "/deep/er", "/deep/er/still", "/docs", "/docs/a.txt", "/docs/big.bin",
            "/docs/sub",
        ]  # fmt: skip
        with pytest.raises(VolumeException, match="400"):
            vol.list("/", depth=11)
        with pytest.raises(VolumePathNotFoundException):
            vol.list("/nothing")

        info = vol.get_info("/docs/a.txt")
        assert (info.size, info.type) == (8, VolumeFileType.FILE)
        assert vol.exists("/docs/sub") and not vol.exists("/docs/none")
        updated = vol.update_metadata("/docs/a.txt", mode=0o600, uid=1000, gid=1001)
        assert (updated.mode, updated.uid, updated.gid) == (0o600, 1000, 1001)
        with pytest.raises(VolumePathNotFoundException):
            vol.update_metadata("/docs/none", mode=0o600)

        vol.remove("/docs")
        assert not vol.exists("/docs") and vol.exists("/deep")
        with pytest.raises(VolumePathNotFoundException):
            vol.remove("/docs")
        with pytest.raises(VolumeException, match="400"):
            vol.remove("/")
    finally:
        Volume.destroy(vol.volume_id)


def test_volume_content_round_trip_async(sdk: Emulator) -> None:
    async def scenario() -> None:
        vol = await AsyncVolume.create(_name("content-async"))
        try:
            await vol.make_dir("/d", force=True)
            await vol.write_file("/d/f.txt", b"\x00\x01bytes")
            assert await vol.read_file("/d/f.txt", format="bytes") == b"\x00\x01bytes"
            chunks = [c async for c in await vol.read_file("/d/f.txt", format="stream")]
            assert b"".join(chunks) == b"\x00\x01bytes"
            assert [e.name for e in await vol.list("/d")] == ["f.txt"]
            assert (await vol.get_info("/d")).type == VolumeFileType.DIRECTORY
            assert (await vol.update_metadata("/d/f.txt", mode=0o644)).mode == 0o644
            with pytest.raises(VolumePathNotFoundException):
                await vol.read_file("/d/none.txt")
            await vol.remove("/d/f.txt")
            assert not await vol.exists("/d/f.txt")
        finally:
            await AsyncVolume.destroy(vol.volume_id)

    arun(scenario())


def test_volume_content_needs_the_volume_token(sdk: Emulator) -> None:
    a, b = Volume.create(_name("tok-a")), Volume.create(_name("tok-b"))
    try:
        url = f"{sdk.api_url}/volumecontent/{a.volume_id}/path"
        for headers in (
            {},
            {"Authorization": f"Bearer {b.token}"},  # another volume's token
            {"X-API-KEY": sdk.api_key},  # the API key is not a volume token
        ):
            r = requests.get(url, params={"path": "/"}, headers=headers, timeout=30)
            assert r.status_code == 401, headers
        ok = requests.get(
            url, params={"path": "/"}, headers={"Authorization": f"Bearer {a.token}"}, timeout=30
        )
        assert ok.status_code == 200 and ok.json()["type"] == "directory"
    finally:
        Volume.destroy(a.volume_id)
        Volume.destroy(b.volume_id)


# -- mounts -----------------------------------------------------------------------------------


def test_volume_mounts_both_ways_shared_and_kept_sync(sdk: Emulator) -> None:
    vol = Volume.create(_name("mount-sync"))
    vol.write_file("/from-api.txt", "api wrote this\n")
    one = Sandbox.create(volume_mounts={"/mnt/data": vol})
    two = Sandbox.create(volume_mounts={"/home/user/shared": vol.name})
    try:
        assert one.get_info().volume_mounts == [{"name": vol.name, "path": "/mnt/data"}]
        assert one.files.read("/mnt/data/from-api.txt") == "api wrote this\n"
        # the sandbox's user writes at the volume's root; the content API and the other
        # sandbox see it, owned by that user
        r = one.commands.run("echo sandbox wrote this > /mnt/data/from-sandbox.txt && id -u")
        uid = int(r.stdout)
        entry = vol.get_info("/from-sandbox.txt")
        assert (entry.uid, entry.size) == (uid, len("sandbox wrote this\n"))
        assert two.files.read("/home/user/shared/from-sandbox.txt") == "sandbox wrote this\n"
        two.files.write("/home/user/shared/from-two.txt", "two")
        assert vol.read_file("/from-two.txt") == "two"
        # files the API made (9090, 0666) are writable by the sandbox's user
        one.commands.run("echo appended >> /mnt/data/from-api.txt")
        assert vol.read_file("/from-api.txt") == "api wrote this\nappended\n"
        one.kill()
        assert vol.read_file("/from-sandbox.txt") == "sandbox wrote this\n"
        # destroyed while mounted: gone from the API at once, the files stay for the sandbox
        assert Volume.destroy(vol.volume_id) is True
        with pytest.raises(VolumeNotFoundException):
            Volume.get_info(vol.volume_id)
        two.files.write("/home/user/shared/after.txt", "still there")
        assert two.files.read("/home/user/shared/from-two.txt") == "two"
        with pytest.raises(SandboxException, match=f"volume '{vol.name}' not found"):
            Sandbox.create(volume_mounts={"/mnt/x": vol.name})
    finally:
        for box in (one, two):
            box.kill()
        Volume.destroy(vol.volume_id)
    state = sdk.state_dir
    assert state is not None
    volumes = os.path.join(state, "volumes")
    leftovers = [d for _, dirs, _ in os.walk(volumes) for d in dirs if d == vol.volume_id]
    assert leftovers == []  # removed once the last sandbox mounting it was killed


def test_volume_mounts_async(sdk: Emulator) -> None:
    async def scenario() -> None:
        vol = await AsyncVolume.create(_name("mount-async"))
        await vol.write_file("/seed.txt", "seed")
        box = await AsyncSandbox.create(volume_mounts={"/workspace/vol": vol})
        try:
            assert await box.files.read("/workspace/vol/seed.txt") == "seed"
            await box.files.write("/workspace/vol/back.txt", "back")
            assert await vol.read_file("/back.txt") == "back"
            info = await box.get_info()
            assert info.volume_mounts == [{"name": vol.name, "path": "/workspace/vol"}]
        finally:
            await box.kill()
            await AsyncVolume.destroy(vol.volume_id)

    arun(scenario())


def test_create_refuses_bad_volume_mounts(sdk: Emulator) -> None:
    vol = Volume.create(_name("bad-mounts"))
    try:
        cases = {
            "/mnt/a": "missing-" + uuid.uuid4().hex[:8],
            "relative/path": vol.name,
            "/mnt/../etc": vol.name,
            "/proc/vol": vol.name,
        }
        for path, name in cases.items():
            with pytest.raises(SandboxException, match="400: invalid mounts"):
                Sandbox.create(volume_mounts={path: name})
    finally:
        Volume.destroy(vol.volume_id)


# -- hostile paths -----------------------------------------------------------------------------


def test_hostile_paths_and_planted_symlinks_stay_inside_the_volume(sdk: Emulator) -> None:
    state = sdk.state_dir
    assert state is not None
    canary = os.path.join(state, f"canary-{uuid.uuid4().hex}")
    with open(canary, "w") as f:
        f.write("host file")
    os.chmod(canary, 0o644)
    vol = Volume.create(_name("hostile"))
    box = Sandbox.create(volume_mounts={"/mnt/v": vol})
    try:
        # a sandbox plants symlinks at host paths: absolute, relative, to the host root
        box.commands.run(
            f"ln -s {canary} /mnt/v/abs && ln -s ../../../../../../../..{canary} /mnt/v/rel "
            "&& ln -s / /mnt/v/root && ln -s loop /mnt/v/loop && mkdir /mnt/v/d "
            f"&& ln -s ../../../../../../../../../{os.path.dirname(canary)} /mnt/v/d/up"
        )
        for path in ("/abs", "/rel", f"/root{canary}", f"/d/up/{os.path.basename(canary)}"):
            with pytest.raises(VolumePathNotFoundException):
                vol.read_file(path)
            with pytest.raises(VolumePathNotFoundException):
                vol.update_metadata(path, mode=0o777)
        for path in ("../../../../etc/passwd", "/../../etc/passwd", "//etc/passwd"):
            with pytest.raises(VolumePathNotFoundException):
                vol.read_file(path)
        with pytest.raises(VolumeException, match="400"):
            vol.read_file("/loop")
        # a symlink reports its target inside the volume, never the host's
        link = vol.get_info("/abs")
        assert (link.target, link.type) == (canary, VolumeFileType.UNKNOWN)
        root = vol.get_info("/root")
        assert (root.target, root.type) == ("/", VolumeFileType.DIRECTORY)
        # writing through a planted link creates inside the volume
        vol.write_file(f"/root{canary}", "inside", force=True)
        assert box.files.read(f"/mnt/v{canary}") == "inside"
        vol.write_file("/rel", "through rel", force=True)
        assert box.files.read(f"/mnt/v{canary}") == "through rel"
        # removing a link removes the link only
        vol.remove("/abs")
        vol.remove("/d")
        assert not vol.exists("/abs") and not vol.exists("/d")
        with open(canary) as f:
            assert f.read() == "host file"
        assert os.stat(canary).st_mode & 0o777 == 0o644
    finally:
        box.kill()
        Volume.destroy(vol.volume_id)
        os.unlink(canary)


def test_cold_boot_remounts_and_refuses_a_planted_mount_point(sdk: Emulator) -> None:
    vol = Volume.create(_name("reboot"))
    box = Sandbox.create(volume_mounts={"/mnt/v": vol})
    try:
        box.files.write("/mnt/v/kept.txt", "kept")
        box.pause()
        box = Sandbox.connect(box.sandbox_id, on_resume="reboot")
        assert box.files.read("/mnt/v/kept.txt") == "kept"  # mounted again by the new boot
        # the sandbox's root replaces the way to the mount point with a symlink to /etc
        box.commands.run("sudo mv /mnt /mnt.old && sudo ln -s /etc /mnt", user="user")
        box.pause()
        with pytest.raises(SandboxException, match="500: sandbox boot failed"):
            Sandbox.connect(box.sandbox_id, on_resume="reboot")
        assert sdk.state_dir is not None
        with open(os.path.join(sdk.state_dir, box.sandbox_id, "init.log")) as f:
            assert "volume mount point /mnt/v: mnt is not a directory" in f.read()
        assert vol.read_file("/kept.txt") == "kept"
    finally:
        box.kill()
        Volume.destroy(vol.volume_id)
