"""The volume content API's file access (``api.volume_files.VolumeRoot``) on a real
directory: paths resolve as if the volume were the root, and no path, ``..`` or symlink
reaches a file outside it; ids map between the sandbox's view and the host's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Tuple

import pytest

from e2b_provider.emulator.api.volume_files import (
    IdMap,
    VolumeError,
    VolumeRoot,
    clean_path,
)

SELF = IdMap(
    uids=((0, os.geteuid(), 1),), gids=((0, os.getegid(), 1),), can_chown=False
)


@pytest.fixture
def setup(tmp_path: Path) -> Tuple[VolumeRoot, Path, Path]:
    """A volume directory, and a host directory beside it holding a secret file."""
    data = tmp_path / "vol" / "data"
    data.mkdir(parents=True)
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("host secret")
    (host / "dir").mkdir()
    (host / "dir" / "keep").write_text("keep me")
    return VolumeRoot(str(data), SELF), data, host


def _status(exc: pytest.ExceptionInfo[VolumeError]) -> int:
    return exc.value.status


def test_clean_path_stops_at_the_root() -> None:
    assert clean_path("../../etc/passwd") == "/etc/passwd"
    assert clean_path("//a//b/../c/.") == "/a/c"
    assert clean_path("") == "/"


def test_symlinks_resolve_inside_the_volume(setup: Tuple[VolumeRoot, Path, Path]) -> None:
    root, data, host = setup
    (data / "abs").symlink_to(host / "secret")
    (data / "rel").symlink_to("../../host/secret")
    (data / "hostdir").symlink_to(host / "dir")
    (data / "up").symlink_to("../../..")
    (data / "loop").symlink_to("loop")
    for path in ("/abs", "/rel", "/hostdir/keep", "/up/host/secret", "../host/secret"):
        with pytest.raises(VolumeError) as exc:
            root.open_read(path)
        assert _status(exc) == 404, path
        with pytest.raises(VolumeError) as exc:
            root.update(path, uid=None, gid=None, mode=0o777)
        assert _status(exc) == 404, path
    with pytest.raises(VolumeError) as exc:
        root.open_read("/loop")
    assert _status(exc) == 400
    # an absolute target starts from the volume's root
    (data / "etc").mkdir()
    (data / "etc" / "passwd").write_text("volume's own")
    (data / "to-etc").symlink_to("/etc")
    fd, size = root.open_read("/to-etc/passwd")
    try:
        assert os.read(fd, 100) == b"volume's own" and size == 12
    finally:
        os.close(fd)
    entry = root.stat("/up")
    assert (entry["type"], entry["target"]) == ("directory", "/")
    entry = root.stat("/abs")
    assert (entry["type"], entry["target"]) == ("unknown", str(host / "secret"))


def test_writes_through_planted_links_stay_inside(setup: Tuple[VolumeRoot, Path, Path]) -> None:
    root, data, host = setup
    (data / "hostdir").symlink_to(host / "dir")
    (data / "abs").symlink_to(host / "secret")
    fd, where = root.open_write("/hostdir/new", uid=None, gid=None, mode=None, force=True)
    os.close(fd)
    assert where == f"{host}/dir/new" and (data / str(host).lstrip("/") / "dir" / "new").exists()
    fd, where = root.open_write("/abs", uid=None, gid=None, mode=None, force=True)
    os.write(fd, b"x")
    os.close(fd)
    assert (host / "secret").read_text() == "host secret"
    root.make_dir("/hostdir/sub", uid=None, gid=None, mode=None, force=True)
    assert sorted(p.name for p in (host / "dir").iterdir()) == ["keep"]


def test_remove_never_follows_a_symlink(setup: Tuple[VolumeRoot, Path, Path]) -> None:
    root, data, host = setup
    (data / "d").mkdir()
    (data / "d" / "hostdir").symlink_to(host / "dir")
    (data / "link").symlink_to(host / "dir")
    root.remove("/link")
    root.remove("/d")
    assert os.listdir(data) == []
    assert (host / "dir" / "keep").read_text() == "keep me"
    with pytest.raises(VolumeError) as exc:
        root.remove("/")
    assert _status(exc) == 400
    with pytest.raises(VolumeError) as exc:
        root.remove("/..")
    assert _status(exc) == 400


def test_list_and_errors(setup: Tuple[VolumeRoot, Path, Path]) -> None:
    root, data, _ = setup
    (data / "b" / "c").mkdir(parents=True)
    (data / "b" / "c" / "f").write_text("f")
    (data / "a").write_text("a")
    assert [e["path"] for e in root.list_dir("/", 1)] == ["/a", "/b"]
    assert [e["path"] for e in root.list_dir("/", 10)] == ["/a", "/b", "/b/c", "/b/c/f"]
    for path, depth, status in (("/", 11, 400), ("/a", 1, 400), ("/none", 1, 404)):
        with pytest.raises(VolumeError) as exc:
            root.list_dir(path, depth)
        assert _status(exc) == status
    with pytest.raises(VolumeError) as exc:
        root.make_dir("/a/x", uid=None, gid=None, mode=None, force=False)
    assert _status(exc) == 400
    with pytest.raises(VolumeError) as exc:
        root.open_write("/a", uid=None, gid=None, mode=None, force=False)
    assert _status(exc) == 409
    assert root.stat("/")["type"] == "directory" and root.stat("/")["path"] == "/"


def test_id_map_both_ways() -> None:
    ids = IdMap(uids=((0, 100000, 65536),), gids=((0, 200000, 65536),), can_chown=True)
    assert ids.inside(101000, 201000) == (1000, 1000)
    assert ids.inside(0, 5) == (65534, 65534)  # unmapped host ids: the overflow id
    assert ids.outside(9090, 0) == (109090, 200000)
    assert ids.outside(70000, 1) == (None, 200001)
    rootless = IdMap(uids=((0, 1000, 1), (1, 500000, 65535)), gids=(), can_chown=False)
    assert rootless.inside(1000, 0)[0] == 0 and rootless.inside(500999, 0)[0] == 1000
