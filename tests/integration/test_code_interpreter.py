"""The code interpreter: ``run_code`` and the code contexts against the emulator's
``code-interpreter-v1`` template (real Jupyter kernels in a real sandbox, reached through the
emulator's edge on port 49999)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Iterator, List

import pytest
from waiting import wait_until

from e2b_provider import (
    CancelToken,
    CodeContext,
    E2BHttpError,
    E2BSandboxProvider,
    Execution,
    InvalidArgument,
    NotFound,
    Result,
    SandboxHandle,
)

from .conftest import root, unique_name

pytestmark = pytest.mark.integration

TEMPLATE = "code-interpreter-v1"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cp(emulator) -> Iterator[E2BSandboxProvider]:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emulator.config(template=TEMPLATE)) as p:
        yield p


@pytest.fixture(scope="module")
def box(cp: E2BSandboxProvider) -> Iterator[SandboxHandle]:
    h = cp.create(unique_name("code"))
    yield h
    cp.destroy(h)


@pytest.fixture
def ctx(cp: E2BSandboxProvider, box: SandboxHandle) -> Iterator[CodeContext]:
    """A Python context of the test's own (its own kernel, its own variables)."""
    c = cp.create_code_context(box)
    yield c
    cp.remove_code_context(box, c)


def test_state_text_stdout_and_count(cp: E2BSandboxProvider, box: SandboxHandle,
                                     ctx: CodeContext) -> None:
    first = cp.run_code(box, "x = 41\nprint('hello')\nx + 1", context=ctx)
    assert first.text == "42"
    assert first.stdout == "hello\n"
    assert first.error is None and first.ok
    second = cp.run_code(box, "x", context=ctx)
    assert second.text == "41"  # the variable stayed
    assert second.execution_count == first.execution_count + 1  # type: ignore[operator]


def test_an_exception_in_the_code_is_a_result(cp: E2BSandboxProvider, box: SandboxHandle,
                                              ctx: CodeContext) -> None:
    ex = cp.run_code(box, "print('before')\n1 / 0", context=ctx)
    assert ex.stdout == "before\n"
    assert ex.error is not None
    assert ex.error.name == "ZeroDivisionError"
    assert ex.error.value == "division by zero"
    assert "ZeroDivisionError" in ex.error.traceback
    assert not ex.ok


def test_rich_results_figure_dataframe_json(cp: E2BSandboxProvider, box: SandboxHandle,
                                            ctx: CodeContext) -> None:
    fig = cp.run_code(box, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\n"
                           "plt.title('t')\nplt.show()", context=ctx)
    images = [r for r in fig.results if r.png is not None]
    assert len(images) == 1
    assert images[0].png is not None and images[0].png.startswith(PNG_MAGIC)
    assert images[0].chart is not None and images[0].chart["type"] == "line"
    assert images[0].chart["title"] == "t"
    df = cp.run_code(box, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})",
                     context=ctx)
    main = [r for r in df.results if r.is_main_result]
    assert len(main) == 1
    assert main[0].html is not None and "<table" in main[0].html
    assert main[0].data == {"a": [1, 2], "b": ["x", "y"]}
    listed = cp.run_code(box, "[1, {'k': 2}]", context=ctx)
    assert listed.results[0].json == [1, {"k": 2}]
    assert "image/png" in images[0]._repr_mimebundle_()  # a notebook shows the figure
    assert "image/png" in fig._repr_mimebundle_()  # a cell with only the figure shows it


def test_pillow_images_shown_and_saved_are_results(cp: E2BSandboxProvider, box: SandboxHandle,
                                                   ctx: CodeContext) -> None:
    """As in E2B's kernels: ``Image.show()`` and saving an image to a path name give a PNG
    result, and no viewer program runs (a sandbox has no display: one would fail, and its
    complaint would reach a later run's stderr); the file is still saved."""
    make = ("from PIL import Image\n"
            "image = Image.new('RGB', (8, 8), (255, 0, 0))\n")
    shown = cp.run_code(box, make + "image.show()\nprint('shown')", context=ctx)
    saved = cp.run_code(box, "image.save('red.png')\nprint('saved')", context=ctx)
    for ex, said in ((shown, "shown"), (saved, "saved")):
        assert ex.error is None and ex.stdout == said + "\n", ex
        assert len(ex.results) == 1 and ex.results[0].png is not None, ex.results
        assert ex.results[0].png.startswith(PNG_MAGIC)
    after = cp.run_code(box, "import os, time; time.sleep(0.5); print(os.path.getsize('red.png'))",
                        context=ctx)
    assert after.stderr == "" and int(after.stdout) > 0, after
    # a path object, as in E2B, is only saved; 1 + 1 still loads no Pillow in a new context
    quiet = cp.run_code(box, "import pathlib; image.save(pathlib.Path('p.png'))", context=ctx)
    assert not quiet.results and quiet.error is None
    fresh = cp.create_code_context(box)
    try:
        loaded = cp.run_code(box, "import sys; 1 + 1; 'PIL' in sys.modules", context=fresh)
        assert loaded.text == "False"
    finally:
        cp.remove_code_context(box, fresh)


def test_callbacks_stream_as_the_code_runs(cp: E2BSandboxProvider, box: SandboxHandle,
                                           ctx: CodeContext) -> None:
    seen: List[str] = []
    arrived: List[float] = []
    results: List[Result] = []
    code = textwrap.dedent("""
        import sys, time
        print('one', flush=True)
        time.sleep(1.0)
        print('two', file=sys.stderr, flush=True)
        from IPython.display import display, HTML
        display(HTML('<b>x</b>'))
        7
    """)
    began = time.monotonic()
    ex = cp.run_code(
        box, code, context=ctx,
        on_stdout=lambda s: (seen.append("out:" + s), arrived.append(time.monotonic() - began)),
        on_stderr=lambda s: seen.append("err:" + s),
        on_result=results.append,
    )
    assert seen == ["out:one\n", "err:two\n"]
    assert arrived[0] < ex_duration(began) - 0.5  # the first line came before the end
    assert [r.html for r in results if r.html] == ["<b>x</b>"]
    assert results[-1].is_main_result and results[-1].text == "7"
    assert ex.text == "7"


def ex_duration(began: float) -> float:
    return time.monotonic() - began


def test_timeout_interrupts_and_keeps_state(cp: E2BSandboxProvider, box: SandboxHandle,
                                            ctx: CodeContext) -> None:
    cp.run_code(box, "kept = 'yes'", context=ctx)
    ex = cp.run_code(box, "import time\nprint('started', flush=True)\ntime.sleep(60)",
                     context=ctx, timeout=1.0)
    assert ex.timed_out and not ex.restarted
    assert ex.stdout == "started\n"
    after = cp.run_code(box, "kept", context=ctx, timeout=10.0)
    assert after.text == "yes"


def test_a_kernel_that_ignores_the_interrupt_is_restarted(
    cp: E2BSandboxProvider, box: SandboxHandle, ctx: CodeContext
) -> None:
    cp.run_code(box, "kept = 1", context=ctx)
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(120)"
    ex = cp.run_code(box, code, context=ctx, timeout=1.0)
    assert ex.timed_out and ex.restarted
    after = cp.run_code(box, "'kept' in globals()", context=ctx, timeout=10.0)
    assert after.text == "False"  # a new kernel: the state is gone, as the result said


def test_cancel_from_another_thread(cp: E2BSandboxProvider, box: SandboxHandle,
                                    ctx: CodeContext) -> None:
    token = CancelToken()
    timer = threading.Timer(0.5, token.cancel)
    timer.start()
    ex = cp.run_code(box, "import time\ntime.sleep(60)", context=ctx, cancel=token)
    timer.join()
    assert ex.cancelled and not ex.timed_out and not ex.restarted
    assert cp.run_code(box, "2 + 2", context=ctx, timeout=10.0).text == "4"


def test_a_callback_that_raises_stops_the_code(cp: E2BSandboxProvider, box: SandboxHandle,
                                               ctx: CodeContext) -> None:
    def boom(_: str) -> None:
        raise RuntimeError("enough")

    code = "import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.1)"
    with pytest.raises(RuntimeError, match="enough"):
        cp.run_code(box, code, context=ctx, on_stdout=boom)
    # the kernel was interrupted: it takes the next cell at once, with i where it stopped
    assert int(cp.run_code(box, "i", context=ctx, timeout=10.0).text or "-1") < 100


def test_javascript_runs_in_its_own_default_context(cp: E2BSandboxProvider,
                                                   box: SandboxHandle) -> None:
    """JavaScript (and TypeScript) through run_code: output, the value as text, env for one
    run; a JavaScript context of its own keeps its variables and its cwd."""
    ex = cp.run_code(box, "console.log('hi'); 6 * 7", language="javascript")
    assert ex.stdout == "hi\n" and ex.text == "42" and ex.error is None
    assert cp.run_code(box, "process.env.ONE", language="typescript",
                       env={"ONE": "1"}).text == "1"
    mine = cp.create_code_context(box, language="javascript", cwd="/tmp")
    try:
        cp.run_code(box, "var n = 5", context=mine)
        assert cp.run_code(box, "[n, process.cwd()].join(' ')", context=mine).text == "5 /tmp"
        # Node's require, as in E2B's Node kernel, also after a restart
        for _ in range(2):
            assert cp.run_code(box, "typeof require('fs').readFileSync",
                               context=mine).text == "function"
            cp.restart_code_context(box, mine)
    finally:
        cp.remove_code_context(box, mine)


def test_output_cap_shared_by_stdout_and_stderr(cp: E2BSandboxProvider, box: SandboxHandle,
                                                ctx: CodeContext) -> None:
    code = ("import sys\nprint('é' * 40, flush=True)\nprint('x' * 100, file=sys.stderr, "
            "flush=True)\n'done'")
    ex = cp.run_code(box, code, context=ctx, max_output_bytes=51)
    assert ex.truncated
    assert ex.stdout == "é" * 25  # 50 bytes: the 51st would split a character
    assert ex.stderr == ""
    assert ex.text == "done"  # results are kept whole


def test_env_for_one_run(cp: E2BSandboxProvider, box: SandboxHandle, ctx: CodeContext) -> None:
    code = "import os\nstr(os.environ.get('GREETING'))"
    assert cp.run_code(box, code, context=ctx, env={"GREETING": "hi there"}).text == "hi there"
    assert cp.run_code(box, code, context=ctx).text == "None"


def test_default_context_and_language(cp: E2BSandboxProvider, box: SandboxHandle) -> None:
    cp.run_code(box, "shared_default = 5")
    assert cp.run_code(box, "shared_default * 2").text == "10"
    bash = cp.run_code(box, "echo $((6 * 7)); pwd", language="bash")
    assert bash.stdout == "42\n/home/user\n"
    languages = [c.language for c in cp.code_contexts(box)]
    assert "python" in languages and "bash" in languages


def test_contexts_create_list_restart_remove(cp: E2BSandboxProvider, box: SandboxHandle) -> None:
    c = cp.create_code_context(box, language="bash", cwd="/tmp")
    assert (c.language, c.cwd) == ("bash", "/tmp")
    assert c.id in [x.id for x in cp.code_contexts(box)]
    assert cp.run_code(box, "pwd; export KEEP=1", context=c).stdout == "/tmp\n"
    cp.restart_code_context(box, c)
    assert cp.run_code(box, "echo ${KEEP:-gone}", context=c.id).stdout == "gone\n"
    cp.remove_code_context(box, c)
    assert c.id not in [x.id for x in cp.code_contexts(box)]
    with pytest.raises(NotFound):
        cp.run_code(box, "echo", context=c)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"language": "py thon"},
        {"context": "../contexts"},
        {"context": 5},
        {"timeout": 0},
        {"env": {"A B": "x"}},
        {"env": {"A": "it's"}},
        {"max_output_bytes": -1},
        {"on_result": "print"},
    ],
)
def test_bad_arguments_are_refused_before_any_io(cp: E2BSandboxProvider,
                                                 kwargs: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgument):
        cp.run_code("no-such-sandbox-id-123", "1", **kwargs)


def test_a_sandbox_without_the_server_says_which_template(emulator) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emulator.config(template="base")) as p:
        h = p.create(unique_name("plain"))
        try:
            with pytest.raises(E2BHttpError) as info:
                p.run_code(h, "1")
        finally:
            p.destroy(h)
    assert info.value.status == 502
    assert "code-interpreter-v1" in str(info.value)


def test_the_server_comes_back_when_killed(cp: E2BSandboxProvider, box: SandboxHandle) -> None:
    root(cp, box, "pkill -KILL -f 'emulator[.]interpreter[.]server'")

    def answers() -> bool:
        try:
            return cp.run_code(box, "3 * 3", timeout=10.0).text == "9"
        except E2BHttpError:
            return False

    wait_until(answers, timeout=60.0, what="the code interpreter back after it was killed")


CHILD = textwrap.dedent(
    """
    import json, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from e2b_provider import DeploymentConfig, E2BSandboxProvider
    with E2BSandboxProvider(DeploymentConfig(**json.loads(sys.argv[1]))) as p:
        p.run_code(sys.argv[2], "interrupted_at = None", context=sys.argv[3])
        print("ready", flush=True)
        try:
            p.run_code(sys.argv[2], "import time\\nfor step in range(10**6):\\n"
                       "    interrupted_at = step\\n    time.sleep(0.01)",
                       context=sys.argv[3], timeout=300.0)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
            raise
    """
)


def test_ctrl_c_interrupts_the_kernel_then_raises(
    emulator, cp: E2BSandboxProvider, box: SandboxHandle, ctx: CodeContext  # type: ignore[no-untyped-def]
) -> None:
    cfg = {"api_key": emulator.api_key, "template": TEMPLATE, "api_url": emulator.api_url,
           "sandbox_url": emulator.sandbox_url, "domain": "e2b.localhost"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(cfg), box.id, ctx.id],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert "KeyboardInterrupt" in out, err
    assert child.returncode != 0
    first = cp.run_code(box, "interrupted_at", context=ctx, timeout=10.0)
    assert first.text is not None and int(first.text) > 0, (out, err)  # state kept
    time.sleep(0.3)
    second = cp.run_code(box, "interrupted_at", context=ctx, timeout=10.0)
    assert second.text == first.text  # the loop is not running any more


def test_results_show_in_ipython(cp: E2BSandboxProvider, box: SandboxHandle,
                                 ctx: CodeContext) -> None:
    ex: Execution = cp.run_code(box, "from IPython.display import Markdown\nMarkdown('**b**')",
                                context=ctx)
    bundle = ex._repr_mimebundle_()
    assert bundle.get("text/markdown") == "**b**"
