"""The emulator's code-interpreter server, run on the host against a real Python kernel.

The server process is started as a sandbox would start it (``python -m``), on a free port of
loopback; every call goes over a real socket to a real ``ipykernel``. What is checked is
E2B's wire behaviour: the lines of ``POST /execute``, state kept between calls, variables
for one execution only, contexts, and a client that goes away interrupting the kernel (a
kernel that ignores the interrupt is restarted).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import ipykernel  # noqa: F401  the kernel the server starts (test extras)
import jupyter_client  # noqa: F401  how the server drives it (test extras)
import pytest
import requests

#: Each request's bound: a server that does not answer fails the test, never hangs it.
BOUND_SECONDS = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("home")
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "e2b_provider.emulator.interpreter.server",
         "--host", "127.0.0.1", "--port", str(port), "--cwd", str(home)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(f"{url}/health", timeout=2).json() == "OK":
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None, "the server exited"
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(url: str, code: str, **fields: Any) -> List[Dict[str, Any]]:
    """The lines of one execution (keepalives dropped)."""
    body = {"code": code, **fields}
    with requests.post(f"{url}/execute", json=body, stream=True, timeout=BOUND_SECONDS) as r:
        assert r.status_code == 200, r.text
        lines = [json.loads(line) for line in r.iter_lines() if line]
    return [line for line in lines if line["type"] != "keepalive"]


def _of(lines: List[Dict[str, Any]], kind: str) -> List[Dict[str, Any]]:
    return [line for line in lines if line["type"] == kind]


def test_a_cell_streams_its_count_output_and_value_then_the_end(server: str) -> None:
    lines = run(server, 'import os\nprint("hi")\nos.getcwd()')
    assert lines[0]["type"] == "number_of_executions"
    assert [s["text"] for s in _of(lines, "stdout")] == ["hi\n"]
    (result,) = _of(lines, "result")
    assert result["is_main_result"] is True and result["text"].endswith("home0")
    assert lines[-1] == {"type": "end_of_execution"}


def test_state_is_kept_and_errors_are_lines(server: str) -> None:
    run(server, "kept = 41")
    assert _of(run(server, "kept + 1"), "result")[0]["text"] == "42"
    (error,) = _of(run(server, "1/0"), "error")
    assert error["name"] == "ZeroDivisionError" and error["value"] == "division by zero"
    assert "ZeroDivisionError" in error["traceback"]


def test_display_calls_are_results_that_are_not_main(server: str) -> None:
    lines = run(server, "from IPython.display import HTML, display\ndisplay(HTML('<b>x</b>'))")
    (shown,) = _of(lines, "result")
    assert shown["is_main_result"] is False and shown["html"] == "<b>x</b>"


def test_env_vars_hold_for_one_execution(server: str) -> None:
    code = "import os\nos.environ.get('E2B_T', 'unset')"
    assert _of(run(server, code, env_vars={"E2B_T": "it's"}), "result")[0]["text"] == "it's"
    assert _of(run(server, code), "result")[0]["text"] == "unset"


def test_contexts_are_kernels_of_their_own(server: str, tmp_path: Path) -> None:
    made = requests.post(f"{server}/contexts", json={"cwd": str(tmp_path)}, timeout=60).json()
    assert made["language"] == "python" and made["cwd"] == str(tmp_path)
    listed = requests.get(f"{server}/contexts", timeout=BOUND_SECONDS).json()
    assert made in listed and len(listed) >= 2
    run(server, "mine = 1", context_id=made["id"])
    lines = run(server, "mine", context_id=made["id"])
    assert _of(lines, "result")[0]["text"] == "1"
    assert _of(run(server, "mine"), "error")[0]["name"] == "NameError"  # not in the default
    restart = requests.post(f"{server}/contexts/{made['id']}/restart", timeout=60)
    assert restart.status_code == 200
    assert _of(run(server, "mine", context_id=made["id"]), "error")[0]["name"] == "NameError"
    gone = requests.delete(f"{server}/contexts/{made['id']}", timeout=BOUND_SECONDS)
    assert gone.status_code == 200
    missing = requests.post(
        f"{server}/execute", json={"code": "1", "context_id": made["id"]}, timeout=BOUND_SECONDS
    )
    assert missing.status_code == 404 and made["id"] in missing.text


def test_bad_requests(server: str) -> None:
    both = requests.post(
        f"{server}/execute",
        json={"code": "1", "context_id": "x", "language": "python"},
        timeout=BOUND_SECONDS,
    )
    assert both.status_code == 400
    assert requests.post(f"{server}/execute", data=b"{", timeout=BOUND_SECONDS).status_code == 400
    bad_env = requests.post(
        f"{server}/execute", json={"code": "1", "env_vars": {"A": 1}}, timeout=BOUND_SECONDS
    )
    assert bad_env.status_code == 422


def _start_and_leave(url: str, code: str) -> None:
    """Start ``code`` and go away once it printed its first line."""
    with requests.post(
        f"{url}/execute", json={"code": code}, stream=True, timeout=BOUND_SECONDS
    ) as r:
        for line in r.iter_lines():
            if line and json.loads(line)["type"] == "stdout":
                break


def test_a_client_that_goes_away_interrupts_the_kernel_and_keeps_its_state(server: str) -> None:
    run(server, "before = 'kept'")
    _start_and_leave(server, "import time\nprint('go', flush=True)\ntime.sleep(600)")
    # the next cell runs on an idle kernel (not aborted, not queued behind the sleep)
    lines = run(server, "before")
    assert _of(lines, "result")[0]["text"] == "kept"


def test_a_kernel_that_ignores_the_interrupt_is_restarted(server: str) -> None:
    run(server, "lost = 1")
    _start_and_leave(
        server,
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('go', flush=True)\ntime.sleep(600)",
    )
    lines = run(server, "lost")
    assert _of(lines, "error")[0]["name"] == "NameError"
