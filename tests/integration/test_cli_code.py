"""``e2b-provider code`` (and ``create --template``) against the emulator's
``code-interpreter-v1`` template: the real command line, real kernels in a real sandbox."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Dict, Iterator

import pytest
from command_line import cli_env, run, started

from e2b_provider import CodeContext, E2BSandboxProvider, SandboxHandle

from .conftest import unique_name

pytestmark = pytest.mark.integration

TEMPLATE = "code-interpreter-v1"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.show()"


@pytest.fixture(scope="module")
def cp(emulator) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emulator.config(template=TEMPLATE)) as p:
        yield p


@pytest.fixture(scope="module")
def box(cp: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    """One code-interpreter sandbox for the tests whose state does not matter."""
    h = cp.create(unique_name("cli-code"))
    yield h
    cp.destroy(h)


@pytest.fixture(scope="module")
def env(emulator) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    return cli_env(emulator)


@pytest.fixture
def ctx(cp: E2BSandboxProvider, box: SandboxHandle) -> Iterator[CodeContext]:
    """A Python context of the test's own, made by the library."""
    c = cp.create_code_context(box)
    yield c
    cp.remove_code_context(box, c)


def test_output_comes_live_then_the_value(env: Dict[str, str], box: SandboxHandle) -> None:
    code = ("import sys\nfrom IPython.display import Markdown, display\nprint('one')\n"
            "print('two', file=sys.stderr)\ndisplay(Markdown('*shown*'))\nprint('three')\n6 * 7")
    r = run(env, "code", box.id, "-c", code)
    assert r.returncode == 0 and r.stderr == "two\n"
    # the output as it came, then the text results in order: the displayed one, the value
    assert r.stdout == "one\nthree\n<IPython.core.display.Markdown object>\n42\n"


def test_state_stays_from_one_run_to_the_next(env: Dict[str, str], box: SandboxHandle) -> None:
    name = f"kept_{unique_name('v').replace('-', '_')}"
    assert run(env, "code", box.id, "-c", f"{name} = 40 + 1").returncode == 0
    r = run(env, "code", box.id, "-c", f"{name} + 1")
    assert (r.returncode, r.stdout, r.stderr) == (0, "42\n", "")


def test_code_from_a_file_and_from_stdin(env: Dict[str, str], box: SandboxHandle,
                                         tmp_path: Path) -> None:
    script = tmp_path / "cell.py"
    script.write_text("print('from the file: é')\n3 * 4\n", encoding="utf-8")
    r = run(env, "code", box.id, str(script))
    assert (r.returncode, r.stdout, r.stderr) == (0, "from the file: é\n12\n", "")
    r = run(env, "code", box.id, "-", stdin="print('from stdin')\n2 ** 10\n")
    assert (r.returncode, r.stdout, r.stderr) == (0, "from stdin\n1024\n", "")
    r = run(env, "code", box.id, str(tmp_path / "missing.py"))
    assert r.returncode == 1 and "missing.py" in r.stderr and "Traceback" not in r.stderr


def test_a_plot_is_written_to_out_as_a_real_png(env: Dict[str, str], box: SandboxHandle,
                                                tmp_path: Path) -> None:
    out = tmp_path / "made" / "here"  # missing: it is created
    r = run(env, "code", box.id, "--out", str(out), "-c", PLOT)
    assert r.returncode == 0, r.stderr
    written = sorted(out.iterdir())
    assert len(written) == 1
    assert re.fullmatch(r"result-\d+-1\.png", written[0].name)
    assert r.stderr == f"wrote {written[0]}\n"
    assert written[0].read_bytes().startswith(PNG_MAGIC)
    assert r.stdout == ""  # the figure's text is no output of its own


def test_without_out_an_image_is_not_written_and_that_is_said(
    env: Dict[str, str], box: SandboxHandle, tmp_path: Path
) -> None:
    r = run(env, "code", box.id, "-c", PLOT + "\nprint('done')")
    assert (r.returncode, r.stdout) == (0, "done\n")
    assert r.stderr == "e2b-provider: 1 image result not written (use --out DIR)\n"


def test_an_exception_exits_1_with_its_traceback(env: Dict[str, str], box: SandboxHandle,
                                                 cp: E2BSandboxProvider,
                                                 ctx: CodeContext) -> None:
    r = run(env, "code", box.id, "-c", "print('before')\n1 / 0")
    assert (r.returncode, r.stdout) == (1, "before\n")
    assert "1 / 0" in r.stderr and "ZeroDivisionError: division by zero" in r.stderr
    assert "e2b_provider" not in r.stderr  # the kernel's traceback, none of ours
    # a kernel that colours its tracebacks (as E2B's does): the colours are stripped
    cp.run_code(box, "%colors Linux", context=ctx)
    coloured = cp.run_code(box, "1 / 0", context=ctx)
    assert coloured.error is not None and "\x1b[" in coloured.error.traceback
    r = run(env, "code", box.id, "--context", ctx.id, "-c", "1 / 0")
    assert r.returncode == 1
    assert "ZeroDivisionError: division by zero" in r.stderr and "\x1b" not in r.stderr


def test_a_timeout_exits_124_and_the_state_stays(env: Dict[str, str], box: SandboxHandle,
                                                 ctx: CodeContext) -> None:
    assert run(env, "code", box.id, "--context", ctx.id, "-c", "kept = 7").returncode == 0
    r = run(env, "code", box.id, "--context", ctx.id, "--timeout", "1", "-c",
            "import time\nprint('started', flush=True)\ntime.sleep(60)")
    assert (r.returncode, r.stdout) == (124, "started\n")
    assert r.stderr.startswith("e2b-provider: timed out after 1 s"), r.stderr
    r = run(env, "code", box.id, "--context", ctx.id, "-c", "kept")
    assert (r.returncode, r.stdout) == (0, "7\n")


def test_ctrl_c_exits_130_once_the_kernel_was_interrupted(
    env: Dict[str, str], box: SandboxHandle, cp: E2BSandboxProvider, ctx: CodeContext
) -> None:
    cp.run_code(box, "kept = 1", context=ctx)
    code = "import time\nprint('started', flush=True)\ntime.sleep(60)\nkept = 2"
    with started(env, "code", box.id, "--context", ctx.id, "-c", code) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "started\n"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    after = cp.run_code(box, "kept", context=ctx, timeout=10.0)  # free at once, state kept
    assert after.text == "1" and not after.timed_out


def test_language_bash(env: Dict[str, str], box: SandboxHandle) -> None:
    r = run(env, "code", box.id, "--language", "bash", "-c", "echo $((6 * 7)); pwd")
    assert (r.returncode, r.stdout, r.stderr) == (0, "42\n/home/user\n", "")


def test_context_made_by_the_library(env: Dict[str, str], box: SandboxHandle,
                                     cp: E2BSandboxProvider, ctx: CodeContext) -> None:
    cp.run_code(box, "only_here = 5", context=ctx)
    r = run(env, "code", box.id, "--context", ctx.id, "-c", "only_here * 2")
    assert (r.returncode, r.stdout, r.stderr) == (0, "10\n", "")
    r = run(env, "code", box.id, "-c", "only_here")  # the default context has its own
    assert r.returncode == 1 and "NameError" in r.stderr
    r = run(env, "code", box.id, "--context", "no-such-context", "-c", "1")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr


def test_usage_errors_exit_2(env: Dict[str, str], box: SandboxHandle, tmp_path: Path) -> None:
    for words in (
        [],  # no code
        ["-c", "1", str(tmp_path / "cell.py")],  # two codes
        ["--context", "c1", "--language", "bash", "-c", "1"],
        ["--timeout", "0", "-c", "1"],
    ):
        r = run(env, "code", box.id, *words)
        assert r.returncode == 2, (words, r.stderr)
        assert "Traceback" not in r.stderr


def test_create_template_makes_a_code_interpreter_sandbox(
    env: Dict[str, str], cp: E2BSandboxProvider
) -> None:
    plain, made = unique_name("cli-plain"), unique_name("cli-ci")
    try:
        assert run(env, "create", plain).returncode == 0  # E2B_TEMPLATE: base
        r = run(env, "code", plain, "-c", "1 + 1")
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
        assert f"--template {TEMPLATE}" in r.stderr and "has no code interpreter" in r.stderr
        r = run(env, "create", made, "--template", TEMPLATE)
        assert r.returncode == 0, r.stderr
        assert cp.info(r.stdout.strip()).template_id == TEMPLATE
        r = run(env, "code", made, "-c", "1 + 1")
        assert (r.returncode, r.stdout, r.stderr) == (0, "2\n", "")
        r = run(env, "create", unique_name("cli-bad"), "--template", "has space")
        assert r.returncode == 2 and "template" in r.stderr and "Traceback" not in r.stderr
    finally:
        cp.destroy_by_name(plain)
        cp.destroy_by_name(made)
