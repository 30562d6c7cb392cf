"""The record by which ``e2b-provider emulator`` is found (``cli/emulator_record``): where it
is, that only its user can read it, that a stale one is ignored and removed, that a record
not the user's own (or open to others) is refused, and that the environment wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

from e2b_provider.cli import emulator_record as rec
from e2b_provider.errors import ConfigError

KEY = "e2b_" + "5c0f" * 10
SETTINGS = {"api_key": KEY, "api_url": "http://127.0.0.1:4000",
            "sandbox_url": "http://127.0.0.1:4000", "template": "base"}


@pytest.fixture
def env(tmp_path: Path) -> Dict[str, str]:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    return {"XDG_RUNTIME_DIR": str(runtime)}


def test_the_record_is_private_and_read_back(env: Dict[str, str]) -> None:
    path = rec.write(SETTINGS, env)
    assert path == os.path.join(env["XDG_RUNTIME_DIR"], "e2b-provider", "emulator.json")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    assert rec.read(env) == {"pid": str(os.getpid()), **SETTINGS}
    assert os.listdir(os.path.dirname(path)) == ["emulator.json"]  # no temporary left
    rec.remove(env)
    assert not os.path.exists(path) and rec.read(env) is None


def test_without_xdg_runtime_dir_it_is_a_private_dir_of_the_user_in_tmp() -> None:
    assert rec.record_dir({}) == f"/tmp/e2b-provider-{os.geteuid()}"
    assert rec.record_dir({"XDG_RUNTIME_DIR": "relative/dir"}) == rec.record_dir({})


def test_a_record_of_a_process_that_is_gone_is_ignored_and_removed(env: Dict[str, str]) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    path = rec.write(SETTINGS, env)
    body = json.loads(Path(path).read_text())
    Path(path).write_text(json.dumps({**body, "pid": gone.pid}))
    assert rec.read(env) is None
    assert not os.path.exists(path)


def test_a_record_whose_pid_was_given_to_another_process_is_stale(env: Dict[str, str]) -> None:
    path = rec.write(SETTINGS, env)
    body = json.loads(Path(path).read_text())
    Path(path).write_text(json.dumps({**body, "start_time": "1"}))  # not this process's start
    assert rec.read(env) is None and not os.path.exists(path)


def test_remove_leaves_another_emulators_record(env: Dict[str, str]) -> None:
    path = rec.write(SETTINGS, env)
    rec.remove(env, pid=os.getpid() + 1)
    assert os.path.exists(path)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_record_others_may_read_is_refused_without_showing_the_key(
    env: Dict[str, str], mode: int
) -> None:
    path = rec.write(SETTINGS, env)
    os.chmod(path, mode)
    with pytest.raises(rec.RecordRefused) as err:
        rec.read(env)
    assert path in str(err.value) and f"{mode:04o}" in str(err.value)
    assert KEY not in str(err.value)
    assert os.path.exists(path)  # refused, not removed: its owner looks at it


def test_a_record_directory_others_may_enter_is_refused(env: Dict[str, str]) -> None:
    path = rec.write(SETTINGS, env)
    os.chmod(os.path.dirname(path), 0o755)
    with pytest.raises(rec.RecordRefused, match="others may use it"):
        rec.read(env)
    with pytest.raises(rec.RecordRefused):
        rec.write(SETTINGS, env)  # nor is a record written there


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_record_of_another_user_is_refused(env: Dict[str, str]) -> None:
    path = rec.write(SETTINGS, env)
    os.chown(path, 4242, 4242)
    with pytest.raises(rec.RecordRefused, match="belongs to uid 4242"):
        rec.read(env)
    os.chown(path, 0, 0)
    os.chown(os.path.dirname(path), 4242, 4242)
    with pytest.raises(rec.RecordRefused, match="belongs to uid 4242"):
        rec.read(env)


def test_a_link_in_place_of_the_record_is_refused(env: Dict[str, str], tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    path = rec.write(SETTINGS, env)
    os.replace(path, elsewhere)
    os.symlink(elsewhere, path)
    with pytest.raises(rec.RecordRefused, match="symbolic link"):
        rec.read(env)


def test_a_record_that_is_not_one_is_refused(env: Dict[str, str]) -> None:
    path = rec.write(SETTINGS, env)
    Path(path).write_text("[1, 2]")
    with pytest.raises(rec.RecordRefused, match="not one this version writes"):
        rec.read(env)


def test_with_no_emulator_the_error_names_the_command_and_the_variable(
    env: Dict[str, str]
) -> None:
    with pytest.raises(ConfigError) as err:
        rec.emulator_settings(env)
    assert "e2b-provider emulator" in str(err.value) and "E2B_API_KEY" in str(err.value)


def test_the_records_key_goes_only_to_the_records_urls(env: Dict[str, str]) -> None:
    rec.write(SETTINGS, env)
    given = {**env, "E2B_API_URL": "https://elsewhere.example", "E2B_DOMAIN": "example.com",
             "E2B_SANDBOX_URL": "https://sandboxes.example", "E2B_TEMPLATE": "mine"}
    got = rec.emulator_settings(given)
    assert got["E2B_API_KEY"] == KEY
    assert got["E2B_API_URL"] == got["E2B_SANDBOX_URL"] == SETTINGS["api_url"]
    assert "E2B_DOMAIN" not in got
    assert got["E2B_TEMPLATE"] == "mine"  # a template of the environment is kept
    assert rec.emulator_settings(env)["E2B_TEMPLATE"] == "base"
