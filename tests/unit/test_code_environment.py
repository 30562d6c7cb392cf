"""The code-interpreter template's Python environment: found only when its build finished with
today's requirements, and the template's service built from it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from e2b_provider.emulator.interpreter import environment
from e2b_provider.emulator.interpreter.environment import (
    DENO,
    REQUIREMENTS,
    STAMP,
    CodeEnvMissing,
    find,
)
from e2b_provider.emulator.interpreter.template import code_interpreter_service


def _fake_env(where: Path, requirements: object = None) -> Path:
    """A directory laid out as a built environment (its python: this interpreter)."""
    (where / "bin").mkdir(parents=True)
    os.symlink(sys.executable, where / "bin" / "python")
    (where / "pyvenv.cfg").write_text(f"home = {os.path.dirname(sys.executable)}\n")
    if requirements is not None:
        (where / STAMP).write_text(json.dumps({"requirements": requirements, "deno": DENO}))
    return where


def test_a_missing_environment_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(CodeEnvMissing) as info:
        find(str(tmp_path / "nothing"))
    assert str(tmp_path / "nothing") in str(info.value)
    assert "./dev code-env" in str(info.value)


def test_an_unfinished_build_is_missing(tmp_path: Path) -> None:
    where = _fake_env(tmp_path / "env")  # no stamp: the build stopped half-way
    with pytest.raises(CodeEnvMissing, match=r"\./dev code-env"):
        find(str(where))


def test_other_requirements_are_out_of_date(tmp_path: Path) -> None:
    where = _fake_env(tmp_path / "env", ["ipykernel"])
    with pytest.raises(CodeEnvMissing, match="out of date"):
        find(str(where))
    # another Deno (or none: a build from before the JavaScript kernel) too
    for deno in ("deno@1.0.0", None):
        (where / STAMP).write_text(json.dumps({"requirements": list(REQUIREMENTS), "deno": deno}))
        with pytest.raises(CodeEnvMissing, match="out of date"):
            find(str(where))


def test_a_built_environment_and_the_service_it_makes(tmp_path: Path) -> None:
    where = _fake_env(tmp_path / "env", list(REQUIREMENTS))
    found = find(str(where))
    assert found.python == os.path.join(os.path.realpath(where), "bin", "python")
    assert found.binds[0] == os.path.realpath(where)
    # the interpreter's prefix (its standard library), whatever links lead to it
    assert os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))) in found.binds
    service = code_interpreter_service(str(where))
    assert service.argv[0] == found.python
    assert service.argv[1] == "-I"  # no PYTHONPATH, no user site: the kernels see the env only
    assert service.ready_port == 49999
    assert ["--port", "49999"] == list(service.argv[-4:-2])
    assert set(found.binds) <= set(service.binds)


def test_the_default_place_follows_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setenv(environment.ENV_VAR, str(tmp_path / "x"))
    assert environment.default_dir() == str(tmp_path / "x")
    monkeypatch.delenv(environment.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    want = tmp_path / "cache" / "e2b-provider" / "code-interpreter"
    assert environment.default_dir() == str(want)
