"""The example notebook, executed in a real Jupyter kernel, with kernel interrupts.

The notebook starts the local emulator inside the kernel. A kernel interrupt (SIGINT to the
kernel's whole process group) during a long command, or while a terminal's program runs,
must end that cell with KeyboardInterrupt within a few seconds, kill what ran in the
sandbox, and leave the emulator and the sandbox usable for the next cells. A terminal's
output shows in its cell as it comes.
"""

from __future__ import annotations

import base64
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, List

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.integration

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"


def _text(cell: Any) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


def _error(cell: Any) -> List[str]:
    return [o["ename"] for o in cell.outputs if o.get("output_type") == "error"]


def test_notebook_runs_and_survives_a_kernel_interrupt(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) == 13
    monkeypatch.delenv("E2B_API_KEY", raising=False)  # the kernel inherits it: the emulator
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with client.setup_kernel():
        (setup, live, long_cell, check, term_live, term_long, term_check, shown, load, plot,
         long_code, code_check, cleanup) = code
        client.execute_cell(setup, nb.cells.index(setup))
        assert _text(setup).startswith("sandbox i"), setup.outputs

        client.execute_cell(live, nb.cells.index(live))
        assert _text(live) == "step 1\nstep 2\nstep 3\ndone\nexit code 0\n"

        for cell, after in ((long_cell, check), (term_long, term_check)):
            _interrupt_once_started(client, nb, cell)
            client.execute_cell(after, nb.cells.index(after))
            assert _text(after) == "nothing left\n", after.outputs
            if cell is long_cell:
                # a terminal's output, live: the echo of what was typed, then the output
                client.execute_cell(term_live, nb.cells.index(term_live))
                text = _text(term_live)
                assert "tick 0\r\ntick 1\r\ntick 2\r\n" in text, term_live.outputs
                assert text.endswith("exit status 3\n"), term_live.outputs

        client.execute_cell(shown, nb.cells.index(shown))
        _check_result_display(shown)

        client.execute_cell(load, nb.cells.index(load))
        assert _text(load) == "30 days loaded\n", load.outputs
        (table,) = [o for o in load.outputs if o.get("output_type") == "execute_result"]
        assert "<table" in table["data"]["text/html"]  # the DataFrame, as a table
        client.execute_cell(plot, nb.cells.index(plot))
        (figure,) = [o for o in plot.outputs if o.get("output_type") == "execute_result"]
        assert base64.b64decode(figure["data"]["image/png"]).startswith(b"\x89PNG")

        # the kernel's interrupt reaches the remote kernel: the loop stops, its state stays
        _interrupt_once_started(client, nb, long_code)
        client.execute_cell(code_check, nb.cells.index(code_check))
        first = _text(code_check)
        assert re.fullmatch(r"the loop stopped at step \d+\n", first), code_check.outputs
        client.execute_cell(code_check, nb.cells.index(code_check))
        assert _text(code_check) == first  # it stopped: the step did not move on

        client.execute_cell(cleanup, nb.cells.index(cleanup))
        assert _error(cleanup) == []


def _check_result_display(cell: Any) -> None:
    """An ExecResult as a cell's value: its status, then its output as text, the head and
    the tail of a long one, as plain text and as HTML (not one long repr line)."""
    (result,) = [o for o in cell.outputs if o.get("output_type") == "execute_result"]
    text = result["data"]["text/plain"].splitlines()
    assert text[:4] == ["ExecResult(exit_code=0)", "stdout: 100 lines, 292 characters",
                        "  1", "  2"], text
    assert "  … 70 lines not shown (.stdout has them all) …" in text
    assert text[-3:] == ["  100", "stderr: 1 line, 5 characters", "  done"], text
    page = result["data"]["text/html"]
    assert "<pre" in page and "\n100</pre>" in page and "done" in page


def _interrupt_once_started(client: NotebookClient, nb: Any, cell: Any) -> None:
    """Run ``cell``, interrupt the kernel once its output says "started", and check the
    cell ended with KeyboardInterrupt within 10 s of the interrupt."""
    interrupted_at: List[float] = []

    def interrupt_once_started() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "started" in _text(cell):  # the program runs: interrupt the kernel
                interrupted_at.append(time.monotonic())
                # what Jupyter's "Interrupt" does: SIGINT to the kernel's process group
                pgid = getattr(getattr(client.km, "provisioner", None), "pgid", None)
                assert pgid, "the kernel runs in no process group of its own"
                os.killpg(pgid, signal.SIGINT)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=interrupt_once_started)
    watcher.start()
    client.execute_cell(cell, nb.cells.index(cell))
    ended = time.monotonic()
    watcher.join(10)
    assert interrupted_at, "the long command never printed 'started'"
    assert _error(cell) == ["KeyboardInterrupt"], cell.outputs
    assert ended - interrupted_at[0] < 10.0
    _check_short_traceback(cell)


def _check_short_traceback(cell: Any) -> None:
    """The interrupted cell's traceback, as the notebook shows it: the cell's own line and
    the library's public call, no internal frame, at most 25 lines, KeyboardInterrupt last."""
    (error,) = [o for o in cell.outputs if o.get("output_type") == "error"]
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))
    lines = shown.rstrip("\n").splitlines()
    assert len(lines) <= 25, shown
    assert lines[-1].startswith("KeyboardInterrupt"), shown
    first = cell.source.splitlines()[0]
    assert re.search(r"^Cell In\[\d+\], line \d+$", shown, re.M), shown
    assert first in shown, shown  # the cell's own code
    assert re.search(r"^File .*e2b_provider/(provider|commands/terminal_handle)\.py:", shown,
                     re.M), shown
    for internal in ("run_engine", "envd_streams", "transport", "urllib3", "socket.py"):
        assert internal not in shown, shown


@pytest.mark.parametrize(
    "tool",
    [["execute"], ["nbconvert", "--execute", "--to", "notebook", "--stdout"]],
    ids=["jupyter-execute", "nbconvert-execute"],
)
def test_the_notebook_runs_unattended_as_shipped(tool: List[str], tmp_path: pathlib.Path) -> None:
    """``jupyter execute`` / ``jupyter nbconvert --execute`` with no extra flags: the long
    cell ends by its own timeout when nobody interrupts it."""
    jupyter = os.path.join(os.path.dirname(sys.executable), "jupyter")
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    t0 = time.monotonic()
    done = subprocess.run([jupyter, *tool, str(NOTEBOOK)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - t0 < 240
    if "nbconvert" in tool:  # the executed notebook: the long cells timed out, nothing left
        ran = nbformat.reads(done.stdout, as_version=4)
        shown = [_text(c) for c in ran.cells if c.cell_type == "code"]
        assert shown[2].endswith("timed out: True\n"), shown
        assert shown[5].endswith("exit status 137 timed out: True\n"), shown
        assert shown[3] == shown[6] == "nothing left\n", shown
        assert shown[10].endswith("timed out: True\n"), shown  # run_code's own timeout
