"""Every README block meant to be run runs as written and leaves nothing behind.

The blocks are read from README.md itself at collection time (an edit of the README is what is
tested): each fenced ``python`` and ``sh`` block, except those whose first line is ``# not run
by the README test: WHY`` (visible to readers; few). A Python block runs in a fresh
interpreter in a directory of its own, with the variables ``e2b-provider emulator > e2b.env``
writes (the README's set-up for its first block); a shell block runs with ``bash -e -o
pipefail`` in the clone (its ``.venv``, as ``./dev`` made it), with no ``E2B_`` variable at
all. Each must exit 0 with no error in its output; afterwards the shared emulator has no
sandbox, and no process started by the block (marked by a variable of its environment) is
left.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
from waiting import wait_until

from e2b_provider import DeploymentConfig, E2BSandboxProvider

REPO = Path(__file__).resolve().parents[2]
NOT_RUN = re.compile(r"# not run by the README test: \S")
BLOCK = re.compile(r"^```(python|sh)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
MARK = "E2B_PROVIDER_README_BLOCK"
BLOCK_SECONDS = 300.0


def readme_blocks() -> List[Tuple[str, str, str]]:
    """(id, language, code) of each block of README.md to run."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = []
    for m in BLOCK.finditer(text):
        lang, code = m.group(1), m.group(2)
        if NOT_RUN.match(code):
            continue
        line = text.count("\n", 0, m.start()) + 1
        heading = [h for h in re.findall(r"^#+ (.+)$", text[: m.start()], re.MULTILINE)]
        where = re.sub(r"\W+", "-", heading[-1] if heading else "top").strip("-").lower()
        found.append((f"line{line}-{lang}-{where}", lang, code))
    return found


BLOCKS = readme_blocks()


def test_the_readme_has_blocks_to_run_and_few_left_out() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    left_out = [m for m in BLOCK.finditer(text) if NOT_RUN.match(m.group(2))]
    assert len(BLOCKS) >= 8 and len(left_out) <= 2, (len(BLOCKS), len(left_out))
    # the first Use block, the shell's set-up, the notebook's
    assert any("DeploymentConfig.from_env()" in code for _, _, code in BLOCKS)
    assert any(lang == "sh" and "e2b-provider emulator" in code for _, lang, code in BLOCKS)


def _without_e2b() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}


@pytest.fixture(scope="module")
def runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runtime directory of this module's own (the emulator records go there)."""
    d = tmp_path_factory.mktemp("runtime")
    d.chmod(0o700)
    return d


@pytest.fixture(scope="module")
def emulator_env(runtime_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Dict[str, str]]:
    """``e2b-provider emulator > e2b.env`` running; the variables of ``. ./e2b.env``."""
    env_file = tmp_path_factory.mktemp("emu") / "e2b.env"
    env = {**_without_e2b(), "XDG_RUNTIME_DIR": str(runtime_dir)}
    with open(env_file, "w") as out:
        child = subprocess.Popen([sys.executable, "-m", "e2b_provider", "emulator"],
                                 stdout=out, stderr=subprocess.PIPE, text=True, env=env,
                                 stdin=subprocess.DEVNULL)
    try:
        assert child.stderr is not None
        line = child.stderr.readline()
        while line and " ready at " not in line:
            line = child.stderr.readline()
        assert " ready at " in line, "the emulator did not start"
        exports = dict(
            ln.removeprefix("export ").split("=", 1)
            for ln in env_file.read_text().splitlines()
        )
        yield {**env, **exports}
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=120)


def _marked(value: str) -> List[int]:
    """The pids of the processes whose environment holds ``MARK=value``."""
    needle = f"{MARK}={value}".encode() + b"\0"
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("lang,code", [pytest.param(lang, code, id=i) for i, lang, code in BLOCKS])
def test_the_readme_block_runs_as_written_and_leaves_nothing(
    lang: str, code: str, emulator_env: Dict[str, str], runtime_dir: Path, tmp_path: Path
) -> None:
    mark = uuid.uuid4().hex
    if lang == "python":
        env = {**emulator_env, MARK: mark, "PYTHONUNBUFFERED": "1"}
        argv, cwd = [sys.executable, "-c", code], str(tmp_path)
    else:
        env = {**_without_e2b(), "XDG_RUNTIME_DIR": str(runtime_dir), MARK: mark}
        argv, cwd = ["bash", "-e", "-o", "pipefail", "-c", code], str(REPO)
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=BLOCK_SECONDS)
    output = r.stdout + r.stderr
    assert r.returncode == 0, output[-3000:]
    for bad in ("Traceback", "ERROR", "error:", "WARNING", "warning:"):
        assert bad not in output, output[-3000:]
    # nothing left: no process the block started, no sandbox in the shared emulator
    wait_until(lambda: not _marked(mark), 120, "the block's processes are gone")
    config = DeploymentConfig.from_env(emulator_env)
    with E2BSandboxProvider(config) as p:
        assert p.list_sandboxes() == []
