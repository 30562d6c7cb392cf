"""The OFFICIAL ``e2b-code-interpreter`` client against the emulator's ``code-interpreter-v1``.

``e2b_code_interpreter.Sandbox`` (and ``AsyncSandbox``) create a sandbox of the template it
defaults to and talk to the code-interpreter server on port 49999 through the SDK's
``E2B_SANDBOX_URL``: ``run_code`` (state, execution counts, the streaming callbacks in order,
errors, display data, a matplotlib figure as PNG and chart, a pandas DataFrame, Bash, per-run
environment variables), the code contexts (``create``/``list``/``restart``/``remove``), a
client-side timeout that interrupts the kernel, a kernel that dies, and the server killed and
brought back by the sandbox's PID 1. The expected answers are those of E2B's template server
(``template/server/`` of e2b-dev/code-interpreter: ``main.py``, ``messaging.py``,
``api/models/``; its kernels' formatters in ``template/startup_scripts/``).

One sandbox serves the module; each test that keeps state works in a context of its own.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import zlib
from datetime import datetime
from typing import Any, Iterator, List, Optional, Tuple

import httpx
import pytest
from e2b_code_interpreter import (
    AsyncSandbox,
    Context,
    ExecutionError,
    NotFoundException,
    OutputMessage,
    Result,
    Sandbox,
    SandboxException,
    TimeoutException,
)
from e2b_code_interpreter.charts import ChartType, LineChart
from waiting import wait_until

from e2b_provider.emulator import Emulator

pytestmark = [pytest.mark.conformance, pytest.mark.integration]

#: The server's command line, as ``pkill -f`` finds it (the brackets keep pkill's own out).
SERVER_PATTERN = "emulator[.]interpreter[.]server"


@pytest.fixture(scope="module")
def sandbox(sdk: Emulator) -> Iterator[Sandbox]:
    """One code-interpreter sandbox for the module (the client's default template)."""
    sb = Sandbox.create(timeout=600)
    try:
        yield sb
    finally:
        sb.kill()


@pytest.fixture
def ctx(sandbox: Sandbox) -> Iterator[Context]:
    """A Python context of the test's own (a kernel nobody else uses), removed afterwards."""
    made = sandbox.create_code_context()
    try:
        yield made
    finally:
        try:
            sandbox.remove_code_context(made)
        except NotFoundException:
            pass  # the test removed it


def png_size(b64: str) -> Tuple[int, int]:
    """Width and height of a base64 PNG, after checking it is one: the signature, an IHDR
    chunk whose CRC holds, image data that inflates, and IEND last."""
    raw = base64.b64decode(b64, validate=True)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", raw[:8]
    pos, chunks, idat = 8, [], b""
    while pos < len(raw):
        (length,) = struct.unpack(">I", raw[pos:pos + 4])
        kind, data = raw[pos + 4:pos + 8], raw[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", raw[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + data) == crc, f"bad CRC in {kind!r}"
        chunks.append(kind)
        if kind == b"IDAT":
            idat += data
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND", chunks
    assert zlib.decompress(idat)
    width, height = struct.unpack(">II", raw[16:24])
    return width, height


# -- run_code ---------------------------------------------------------------------------------


def test_state_is_kept_and_each_run_counts(sandbox: Sandbox, ctx: Context) -> None:
    first = sandbox.run_code("kept = 41", context=ctx)
    assert first.results == [] and first.error is None and first.execution_count == 1
    second = sandbox.run_code("kept + 1", context=ctx)
    assert second.text == "42" and second.execution_count == 2
    (value,) = second.results
    assert value.is_main_result and value.formats() == ["text"]
    # the default context is another kernel: it does not see the context's variables
    other = sandbox.run_code("'kept' in globals()")
    assert other.text == "False"


def test_callbacks_stream_in_order(sandbox: Sandbox, ctx: Context) -> None:
    events: List[Tuple[str, Any]] = []
    execution = sandbox.run_code(
        "import sys\n"
        "print('one', flush=True)\n"
        "print('two', file=sys.stderr, flush=True)\n"
        "print('three', flush=True)\n"
        "6 * 7",
        context=ctx,
        on_stdout=lambda m: events.append(("stdout", m)),
        on_stderr=lambda m: events.append(("stderr", m)),
        on_result=lambda r: events.append(("result", r)),
        on_error=lambda e: events.append(("error", e)),
    )
    assert [(kind, getattr(x, "line", None) or getattr(x, "text", None)) for kind, x in events] \
        == [("stdout", "one\n"), ("stderr", "two\n"), ("stdout", "three\n"), ("result", "42")]
    messages = [m for kind, m in events if kind in ("stdout", "stderr")]
    assert all(isinstance(m, OutputMessage) for m in messages)
    assert [m.error for m in messages] == [False, True, False]
    # E2B's server sends each stream line's Jupyter header date (ISO 8601, in UTC)
    stamps = [datetime.fromisoformat(str(m.timestamp)) for m in messages]
    assert all(s.tzinfo is not None for s in stamps) and stamps == sorted(stamps)
    assert execution.logs.stdout == ["one\n", "three\n"]
    assert execution.logs.stderr == ["two\n"]
    assert execution.results == [events[-1][1]] and execution.text == "42"


def test_an_error_in_the_code(sandbox: Sandbox, ctx: Context) -> None:
    errors: List[ExecutionError] = []
    execution = sandbox.run_code(
        "print('before')\ndef boom():\n    raise ValueError('bad value')\nboom()",
        context=ctx,
        on_error=errors.append,
    )
    error = execution.error
    assert error is not None and errors == [error]
    assert (error.name, error.value) == ("ValueError", "bad value")
    assert "boom()" in error.traceback and "ValueError: bad value" in error.traceback
    assert "\x1b[" not in error.traceback  # the kernels' tracebacks have no colors
    assert execution.logs.stdout == ["before\n"] and execution.results == []
    assert execution.execution_count == 1
    # the kernel goes on
    assert sandbox.run_code("boom.__name__", context=ctx).text == "boom"


def test_display_data_and_the_value(sandbox: Sandbox, ctx: Context) -> None:
    shown: List[Result] = []
    execution = sandbox.run_code(
        "from IPython.display import HTML, Markdown, display\n"
        "display(HTML('<b>shown</b>'))\n"
        "display(Markdown('# title'))\n"
        "'the value'",
        context=ctx,
        on_result=shown.append,
    )
    html, markdown, value = execution.results
    assert shown == execution.results
    assert (html.html, html.is_main_result) == ("<b>shown</b>", False)
    assert html.formats() == ["text", "html"]
    assert (markdown.markdown, markdown.is_main_result) == ("# title", False)
    # a string's quotes are dropped from its text, as E2B's server drops them
    assert (value.text, value.is_main_result) == ("the value", True)
    # E2B's server sends what it has no field for in "extra": an empty object when nothing
    assert [r.extra for r in execution.results] == [{}, {}, {}]
    listed = sandbox.run_code("{'a': [1, 2]}", context=ctx).results[0]
    assert listed.json == {"a": [1, 2]} and listed.formats() == ["text", "json"]


def test_a_matplotlib_figure_is_a_png_and_a_chart(sandbox: Sandbox, ctx: Context) -> None:
    execution = sandbox.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9], label='squares')\n"
        "plt.title('Squares')\n"
        "plt.xlabel('n')\n"
        "plt.ylabel('n squared')\n"
        "plt.show()",
        context=ctx,
    )
    assert execution.error is None
    (figure,) = execution.results
    assert not figure.is_main_result
    assert {"text", "png", "chart"} <= set(figure.formats())
    width, height = png_size(figure.png or "")
    assert width > 100 and height > 100
    chart = figure.chart
    assert isinstance(chart, LineChart) and chart.type == ChartType.LINE
    assert (chart.title, chart.x_label, chart.y_label) == ("Squares", "n", "n squared")
    (line,) = chart.elements
    assert line.label == "squares"
    assert [(float(x), float(y)) for x, y in line.points] == [(1, 1), (2, 4), (3, 9)]


def test_pillow_images_shown_or_saved_are_pngs(sandbox: Sandbox, ctx: Context) -> None:
    """As E2B's kernels show Pillow's images: ``show()`` and a save to a path name each give
    one PNG of the image's size, and no viewer program complains later."""
    make = "from PIL import Image\nimage = Image.new('RGBA', (16, 12), (0, 0, 255, 255))\n"
    for code in (make + "image.show()", "image.save('blue.png')"):
        ex = sandbox.run_code(code, context=ctx)
        assert ex.error is None and len(ex.results) == 1, ex
        assert png_size(ex.results[0].png or "") == (16, 12)
    later = sandbox.run_code("import time; time.sleep(0.5)", context=ctx)
    assert later.logs.stderr == [], later.logs


def test_a_dataframe_has_html_and_data(sandbox: Sandbox, ctx: Context) -> None:
    execution = sandbox.run_code(
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})", context=ctx
    )
    (frame,) = execution.results
    assert frame.is_main_result
    assert frame.data == {"a": [1, 2], "b": ["x", "y"]}
    assert frame.html is not None and "<table" in frame.html and "<td>x</td>" in frame.html
    assert frame.text is not None and "a  b" in frame.text
    assert set(frame.formats()) == {"text", "html", "data"}


def test_bash(sandbox: Sandbox) -> None:
    first = sandbox.run_code("export GREETING=hello\necho $GREETING\npwd", language="bash")
    assert first.error is None and "".join(first.logs.stdout) == "hello\n/home/user\n"
    # the language's default context keeps its shell
    again = sandbox.run_code("echo $GREETING from $0", language="bash")
    assert "".join(again.logs.stdout).startswith("hello from ")
    failed = sandbox.run_code("ls /no/such/dir", language="bash")
    # bash_kernel reports a failed command as an error whose value is the exit status
    assert failed.error is not None and (failed.error.name, failed.error.value) == ("", "2")
    assert "No such file or directory" in "".join(failed.logs.stdout)


def test_javascript_and_typescript(sandbox: Sandbox) -> None:
    """As E2B's tests of its JavaScript kernel ask: console.log, an import of Node's
    modules, top-level await (its value the text), TypeScript, process.cwd() and env per
    run; the default context keeps its variables; an exception is the error."""
    hello = sandbox.run_code("console.log('Hello, World!')", language="js")
    assert hello.logs.stdout == ["Hello, World!\n"] and hello.error is None
    esm = sandbox.run_code("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)",
                           language="javascript")
    assert esm.logs.stdout == ["function\n"]
    assert sandbox.run_code("await Promise.resolve('Hello World!')", language="js").text == (
        "Hello World!")
    typed = sandbox.run_code("const message: string = 'typed'; console.log(message)",
                             language="ts")
    assert typed.logs.stdout == ["typed\n"]
    assert sandbox.run_code("process.cwd()", language="js").text == "/home/user"
    assert sandbox.run_code("process.cwd()", language="ts").text == "/home/user"
    assert sandbox.run_code("process.env.FOO", envs={"FOO": "bar"}, language="js").text == "bar"
    assert sandbox.run_code("process.env.FOO || 'default'", language="js").text == "default"
    sandbox.run_code("globalThis.kept = 41", language="js")
    assert sandbox.run_code("kept + 1", language="js").text == "42"
    failed = sandbox.run_code("throw new Error('boom')", language="js")
    assert failed.error is not None and "boom" in failed.error.value
    assert {c.language for c in sandbox.list_code_contexts()} >= {"python", "javascript"}


# -- contexts ---------------------------------------------------------------------------------


def test_contexts_create_list_restart_remove(sandbox: Sandbox) -> None:
    py = sandbox.create_code_context(cwd="/tmp")
    sh = sandbox.create_code_context(cwd="/tmp", language="bash")
    try:
        assert (py.language, py.cwd) == ("python", "/tmp")
        assert (sh.language, sh.cwd) == ("bash", "/tmp")
        assert sandbox.run_code("import os\nos.getcwd()", context=py).text == "/tmp"
        assert sandbox.run_code("pwd", context=sh).logs.stdout == ["/tmp\n"]
        listed = {c.id: (c.language, c.cwd) for c in sandbox.list_code_contexts()}
        assert listed[py.id] == ("python", "/tmp") and listed[sh.id] == ("bash", "/tmp")
        assert ("python", "/home/user") in listed.values()  # the default context

        assert sandbox.run_code("mine = 1", context=py).execution_count == 2
        sandbox.restart_code_context(py.id)  # by id (AsyncSandbox's test passes the Context)
        lost = sandbox.run_code("mine", context=py)
        assert lost.error is not None and lost.error.name == "NameError"
        assert lost.execution_count == 1  # a new kernel counts from one again
    finally:
        sandbox.remove_code_context(py)
        sandbox.remove_code_context(sh.id)
    remaining = {c.id for c in sandbox.list_code_contexts()}
    assert py.id not in remaining and sh.id not in remaining
    with pytest.raises(NotFoundException, match=py.id):
        sandbox.run_code("1", context=py)
    with pytest.raises(NotFoundException, match=py.id):
        sandbox.restart_code_context(py)
    with pytest.raises(NotFoundException, match=py.id):
        sandbox.remove_code_context(py)


def test_envs_hold_for_one_run(sandbox: Sandbox, ctx: Context) -> None:
    code = "import os\nos.environ.get('E2B_T', 'unset')"
    assert sandbox.run_code(code, context=ctx, envs={"E2B_T": "a b"}).text == "a b"
    assert sandbox.run_code(code, context=ctx).text == "unset"
    # also after code that failed
    failed = sandbox.run_code("raise KeyError(os.environ['E2B_T'])", context=ctx,
                              envs={"E2B_T": "x"})
    assert failed.error is not None and failed.error.value == "'x'"
    assert sandbox.run_code(code, context=ctx).text == "unset"
    shell = sandbox.run_code('echo "[$E2B_T]"', language="bash", envs={"E2B_T": "in bash"})
    assert shell.logs.stdout == ["[in bash]\n"]
    assert sandbox.run_code('echo "[$E2B_T]"', language="bash").logs.stdout == ["[]\n"]


# -- interrupts, dead kernels, a dead server ------------------------------------------------


def test_a_client_timeout_interrupts_the_kernel(sandbox: Sandbox, ctx: Context) -> None:
    sandbox.run_code("before = 'kept'", context=ctx)
    with pytest.raises(TimeoutException, match="Execution timed out"):
        sandbox.run_code("import time\ntime.sleep(90)\nafter = 1", context=ctx, timeout=1)
    # The client went away: the server interrupts the kernel, so the next run is not queued
    # behind the sleep (it would time out after 30 s) and the state from before survives.
    execution = sandbox.run_code("before, 'after' in globals()", context=ctx, timeout=30)
    assert execution.error is None and execution.text == "('kept', False)"


def test_a_kernel_that_dies_is_restarted(sandbox: Sandbox, ctx: Context) -> None:
    sandbox.run_code("gone = 1", context=ctx)
    died = sandbox.run_code(
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", context=ctx, timeout=60
    )
    # as E2B's server says when Jupyter restarts a kernel under an execution
    assert died.error is not None
    assert (died.error.name, died.error.value) == ("ContextRestarting", "Context was restarted")
    after = sandbox.run_code("'gone' in globals()", context=ctx, timeout=60)
    assert after.error is None and after.text == "False" and after.execution_count == 1
    pid = sandbox.run_code("import os\nagain = 1\nos.getpid()", context=ctx).text
    assert pid is not None
    # killed between runs: the next run ends with ContextRestarting (it reached the dead
    # kernel, as on E2B before Jupyter's restarter noticed) or runs on a restarted kernel;
    # the one after runs on a restarted kernel
    sandbox.commands.run(f"kill -KILL {pid}", user="root", timeout=30)
    code = f"import os\n'again' in globals(), os.getpid() != {pid}"
    fresh = sandbox.run_code(code, context=ctx, timeout=60)
    if fresh.error is not None:
        assert (fresh.error.name, fresh.error.value) == ("ContextRestarting",
                                                         "Context was restarted")
        fresh = sandbox.run_code(code, context=ctx, timeout=60)
    assert fresh.error is None and fresh.text == "(False, True)"


def test_the_server_killed_comes_back(sdk: Emulator) -> None:
    # a sandbox whose ports need its traffic token: the client sends it on every call
    sb = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
    try:
        assert sb.traffic_access_token
        unsent = httpx.post(
            f"{sdk.sandbox_url}/execute",
            json={"code": "1"},
            headers={"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49999"},
            timeout=30,
        )
        assert unsent.status_code == 403
        assert sb.run_code("marker = 1").execution_count == 1
        made = sb.create_code_context()
        killed = sb.commands.run(f"pkill -KILL -f '{SERVER_PATTERN}'", user="root")
        assert killed.exit_code == 0

        def answer() -> Optional[str]:
            try:
                return sb.run_code("'marker' in globals()", timeout=10).text
            except (SandboxException, httpx.HTTPError):
                return None  # not listening yet (502), or cut off

        # a new server with new kernels: the variable and the context are gone
        assert wait_until(answer, 60, "the code interpreter to answer again", 0.2) == "False"
        contexts = {c.id: (c.language, c.cwd) for c in sb.list_code_contexts()}
        assert made.id not in contexts and ("python", "/home/user") in contexts.values()
    finally:
        sb.kill()


# -- AsyncSandbox ---------------------------------------------------------------------------


def run_async(body: Any) -> Any:
    """Run one async scenario on a fresh event loop (bounded)."""
    return asyncio.run(asyncio.wait_for(body, 120))


def test_async_run_code_with_async_callbacks(sandbox: Sandbox) -> None:
    async def body() -> Tuple[Any, ...]:
        sb = await AsyncSandbox.connect(sandbox.sandbox_id)
        made = await sb.create_code_context(cwd="/tmp")
        seen: List[str] = []

        async def on_stdout(message: OutputMessage) -> None:
            seen.append(message.line)

        execution = await sb.run_code(
            "import os\nprint(os.getcwd(), flush=True)\nx = 6\nx * 7",
            context=made,
            on_stdout=on_stdout,
            on_result=lambda r: seen.append(f"result {r.text}"),
        )
        failed = await sb.run_code("x / 0", context=made)
        listed = [c.id for c in await sb.list_code_contexts()]
        await sb.restart_code_context(made)
        lost = await sb.run_code("x", context=made)
        await sb.remove_code_context(made)
        remaining = [c.id for c in await sb.list_code_contexts()]
        return made, seen, execution, failed, listed, lost, remaining

    made, seen, execution, failed, listed, lost, remaining = run_async(body())
    assert seen == ["/tmp\n", "result 42"]
    assert execution.text == "42" and execution.execution_count == 1
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    assert made.id in listed and made.id not in remaining
    assert lost.error is not None and lost.error.name == "NameError"


def test_async_timeout_and_bash(sandbox: Sandbox) -> None:
    async def body() -> Tuple[Any, ...]:
        sb = await AsyncSandbox.connect(sandbox.sandbox_id)
        shell = await sb.run_code("echo async-$((6 * 7))", language="bash")
        try:
            # output all along: the server notices the client gone when it writes
            await sb.run_code(
                "import time\nwhile True:\n    print('.', end='', flush=True)\n"
                "    time.sleep(0.1)",
                timeout=1,
            )
        except TimeoutException as exc:
            timed_out: Optional[Exception] = exc
        else:
            timed_out = None
        after = await sb.run_code("'still here'", timeout=30)
        return shell, timed_out, after

    shell, timed_out, after = run_async(body())
    assert shell.logs.stdout == ["async-42\n"] and shell.error is None
    assert isinstance(timed_out, TimeoutException)
    assert after.text == "still here"
