"""The command line (``e2b-provider``, ``python -m e2b_provider``) against the emulator."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from typing import IO, Dict, Iterator, List

import pytest
from command_line import CLI, SCRIPT, STALL_IMPORT, cli_env, default_sigint, run, started

from e2b_provider import E2BSandboxProvider, SandboxHandle
from e2b_provider.cli.entry import parser
from e2b_provider.emulator.__main__ import _parser as emulator_parser

from .conftest import unique_name

pytestmark = pytest.mark.integration


@pytest.fixture
def env(emu) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    return cli_env(emu)


@pytest.fixture
def named(env: Dict[str, str], provider: E2BSandboxProvider) -> Iterator[str]:
    name = unique_name("cli")
    r = run(env, "create", name)
    assert r.returncode == 0, r.stderr
    yield name
    provider.destroy_by_name(name)


def test_round_trip_create_exec_cp_ls_rm(env: Dict[str, str], tmp_path, provider) -> None:  # type: ignore[no-untyped-def]
    name = unique_name("cli")
    r = run(env, "create", name, "--cpu", "2", "--memory-mb", "1024")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    assert provider.list_sandboxes(name)[0].id == sid
    r = run(
        env,
        "exec",
        name,
        "--env",
        "GREETING=hi",
        "--cwd",
        "/tmp",
        "--",
        "echo $GREETING; pwd; echo oops >&2; exit 7",
    )
    assert (r.returncode, r.stdout, r.stderr) == (7, "hi\n/tmp\n", "oops\n")
    src = tmp_path / "up.bin"
    src.write_bytes(os.urandom(300_000))
    assert run(env, "cp", str(src), f"{name}:/workspace/d/up.bin").returncode == 0
    down = tmp_path / "down.bin"
    r = run(env, "cp", f"{sid}:/workspace/d/up.bin", str(down))  # by id this time
    assert r.returncode == 0, r.stderr
    assert down.read_bytes() == src.read_bytes()
    r = run(env, "ls")
    assert r.returncode == 0
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "STATE", "STARTED"]
    assert any(row.split()[:3] == [sid, name, "running"] for row in rows), r.stdout
    assert run(env, "suspend", name).returncode == 0
    assert provider.list_sandboxes(name)[0].state == "paused"
    assert run(env, "resume", name).returncode == 0
    assert provider.list_sandboxes(name)[0].state == "running"
    assert run(env, "rm", name).returncode == 0
    assert provider.list_sandboxes(name) == []


def test_exec_exit_codes_timeout_and_missing_sandbox(env: Dict[str, str], named: str) -> None:
    assert run(env, "exec", named, "--", "true").returncode == 0
    assert run(env, "exec", named, "--", "ls", "-la", "/nonexistent").returncode == 2
    r = run(env, "exec", named, "--timeout", "1", "--", "sleep", "30")
    assert r.returncode == 124 and "timed out" in r.stderr
    r = run(env, "exec", "no-such-sandbox", "--", "true")
    assert r.returncode == 1 and "no sandbox is named 'no-such-sandbox'" in r.stderr
    assert "Traceback" not in r.stderr


def test_words_after_dashdash_are_an_argument_vector(env: Dict[str, str], named: str) -> None:
    # several words: each reaches the command unchanged (as docker exec passes them)
    r = run(env, "exec", named, "--", "printf", "%s|", "a b", "c'd", "$HOME")
    assert (r.returncode, r.stdout, r.stderr) == (0, "a b|c'd|$HOME|", "")
    r = run(env, "exec", named, "--", "sh", "-c", "echo hi; exit 3")
    assert (r.returncode, r.stdout) == (3, "hi\n"), r.stderr
    r = run(env, "exec", named, "--", "python3", "-c", "print(1)")
    assert (r.returncode, r.stdout) == (0, "1\n"), r.stderr
    r = run(env, "exec", named, "--", "printf", "[%s]", "", "x\ny", "*")
    assert (r.returncode, r.stdout) == (0, "[][x\ny][*]"), r.stderr
    # one word: a shell command line
    r = run(env, "exec", named, "--", "echo $((1+2))")
    assert (r.returncode, r.stdout) == (0, "3\n"), r.stderr
    r = run(env, "exec", named, "--", "echo a b | tr a-z A-Z; exit 4")
    assert (r.returncode, r.stdout) == (4, "A B\n"), r.stderr


def test_every_word_after_the_sandbox_is_the_command(env: Dict[str, str], named: str) -> None:
    # as docker exec: no -- needed; words that look like options belong to the command
    assert run(env, "exec", named, "--", "mkdir -p /workspace/d && touch /workspace/d/f"
               ).returncode == 0
    r = run(env, "exec", named, "ls", "-l", "/workspace/d")
    assert r.returncode == 0 and r.stdout.startswith("total") and " f\n" in r.stdout, r.stderr
    r = run(env, "exec", named, "printf", "%s|", "--cwd", "--", "-e", "x")
    assert (r.returncode, r.stdout) == (0, "--cwd|--|-e|x|"), r.stderr
    r = run(env, "exec", named, "python3", "-c", "import sys; print(sys.argv[1:])", "-h", "-q")
    assert (r.returncode, r.stdout) == (0, "['-h', '-q']\n"), r.stderr
    r = run(env, "exec", named, "echo $((6*7))")  # one word: a shell command line
    assert (r.returncode, r.stdout) == (0, "42\n"), r.stderr
    # -- is taken right after SANDBOX, and before it (the end of exec's options)
    r = run(env, "exec", named, "--", "printf", "%s|", "a", "--", "b")
    assert (r.returncode, r.stdout) == (0, "a|--|b|"), r.stderr
    r = run(env, "exec", "-w", "/tmp", "--", named, "pwd")
    assert (r.returncode, r.stdout) == (0, "/tmp\n"), r.stderr
    # the older form: options after SANDBOX, then -- and the command
    r = run(env, "exec", named, "--cwd", "/tmp", "--env", "A=1", "--", "echo $A; pwd")
    assert (r.returncode, r.stdout) == (0, "1\n/tmp\n"), r.stderr
    # no command
    r = run(env, "exec", named)
    assert r.returncode == 2 and "exec needs a command after SANDBOX" in r.stderr
    r = run(env, "exec", "--help")
    assert r.returncode == 0 and "[OPTIONS] SANDBOX [CMD [ARG...]]" in r.stdout
    assert "everything after SANDBOX is the command" in " ".join(r.stdout.split())


def test_docker_short_options_and_root(env: Dict[str, str], named: str) -> None:
    r = run(env, "exec", "-e", "A=1", "-eB=2", "-w", "/tmp", named, "sh", "-c",
            'echo "$A$B $(pwd) $(id -un)"')
    assert (r.returncode, r.stdout) == (0, "12 /tmp sandbox\n"), r.stderr
    r = run(env, "exec", "--workdir=/var", "--user", "sandbox", named, "pwd")
    assert (r.returncode, r.stdout) == (0, "/var\n"), r.stderr
    # no password-less sudo in the sandbox: root is asked for by -u root
    r = run(env, "exec", named, "sudo -n true")
    assert r.returncode != 0
    r = run(env, "exec", "-u", "root", named, "sh", "-c",
            "id -u; touch /etc/by-root && stat -c %U /etc/by-root")
    assert (r.returncode, r.stdout) == (0, "0\nroot\n"), r.stderr
    r = run(env, "start", "-w", "/tmp", "-e", "A=7", named, "sh", "-c", "echo $A; pwd")
    assert r.returncode == 0, r.stderr
    cid = r.stdout.strip()
    r = run(env, "logs", "-f", named, cid)
    assert (r.returncode, r.stdout) == (0, "7\n/tmp\n"), r.stderr
    r = run(env, "exec", "-u", "nobody", named, "true")
    assert r.returncode == 2 and "invalid choice: 'nobody'" in r.stderr


def _one_line(r: subprocess.CompletedProcess, code: int, text: str) -> None:  # type: ignore[type-arg]
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("e2b-provider: error: "), r.stderr
    assert text in lines[0], r.stderr


def test_every_command_exits_1_for_a_sandbox_that_is_gone(
    env: Dict[str, str], provider: E2BSandboxProvider, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    name = unique_name("gone")
    h = provider.create(name)
    provider.suspend(h)
    provider.destroy(h)
    local = tmp_path / "f"
    local.write_text("x")
    cid = "0123456789abcdef" * 2
    for ref, text in ((h.id, f"no sandbox is named {h.id!r} or has that id"),
                      (name, f"no sandbox is named {name!r}")):
        for args in (
            ["exec", ref, "--", "true"],
            ["start", ref, "--", "true"],
            ["logs", ref, cid],
            ["logs", "-f", ref, cid],
            ["kill", ref, cid],
            ["ps", ref],
            ["ls", f"{ref}:/workspace"],
            ["cp", str(local), f"{ref}:/workspace/f"],
            ["cp", f"{ref}:/workspace/f", str(tmp_path / "g")],
            ["rm", ref],
            ["suspend", ref],
            ["resume", ref],
            ["watch", ref, "/workspace"],
        ):
            _one_line(run(env, *args), 1, text)
    assert not (tmp_path / "g").exists()
    # a word that can be no sandbox is a usage error
    _one_line(run(env, "resume", "bad name!"), 2, "neither a sandbox name nor a sandbox id")


def test_local_file_errors_are_one_line(env: Dict[str, str], named: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert run(env, "exec", named, "--", "echo hi > /workspace/f").returncode == 0
    (tmp_path / "file").write_text("")
    r = run(env, "cp", f"{named}:/workspace/f", str(tmp_path / "file" / "below"))
    _one_line(r, 1, str(tmp_path / "file"))


# -- Ctrl-C while the command line starts -------------------------------------------------------

def _read_until(stream: IO[bytes], marker: bytes, timeout: float) -> bytes:
    """What ``stream`` (a pipe) gives until ``marker``, waiting ``timeout`` s at most."""
    got = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while marker not in got:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} within {timeout:g} s: {got!r}"
            if sel.select(min(left, 0.5)):
                piece = os.read(stream.fileno(), 4096)
                assert piece, f"end of output before {marker!r}: {got!r}"
                got += piece
    return got


def _interrupt_while_importing(tmp_path, argv: List[str], module: str) -> str:  # type: ignore[no-untyped-def]
    """Run ``argv`` with the import of ``module`` stalled, send SIGINT once it stalls, and
    return its stderr from then on (after checking it exited 130)."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(STALL_IMPORT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(PYTHONPATH=str(hook), CLI_TEST_STALL_IMPORT=module, E2B_API_KEY="e2b_x",
               E2B_API_URL="http://127.0.0.1:9", E2B_TEMPLATE="base")
    with subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, preexec_fn=default_sigint) as child:
        try:  # leaving the with block closes the pipes, whatever happened
            assert child.stderr is not None
            _read_until(child.stderr, f"stalled importing {module}\n".encode(), 60)
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert (child.returncode, out) == (130, b""), err
    return err.decode()


@pytest.mark.parametrize("how", ["console script", "python -m"])
def test_ctrl_c_while_the_command_line_imports_is_one_line(tmp_path, how: str) -> None:  # type: ignore[no-untyped-def]
    argv = [SCRIPT] if how == "console script" else CLI
    err = _interrupt_while_importing(tmp_path, [*argv, "ls"], "argparse")
    assert err == "e2b-provider: interrupted\n"


@pytest.mark.parametrize(("how", "module"), [
    # what the command line's first lines import before they can take a Ctrl-C: the entry
    # module and what it imports (the package's own first lines import nothing: see the test
    # below; the interpreter's own first finds, of e2b_provider and of the module it runs,
    # come before any line of ours: a Ctrl-C there is Python's to report)
    ("console script", "e2b_provider._version"),
    ("console script", "e2b_provider.cli.entry"),
    ("console script", "e2b_provider.cli.arguments"),
    ("python -m", "e2b_provider.cli"),
    ("python -m", "e2b_provider.cli.entry"),
])
def test_ctrl_c_in_any_import_of_ours_is_one_line(tmp_path, how: str, module: str) -> None:  # type: ignore[no-untyped-def]
    argv = [SCRIPT] if how == "console script" else CLI
    err = _interrupt_while_importing(tmp_path, [*argv, "exec", "sb", "ls", "-l"], module)
    assert err == "e2b-provider: interrupted\n"


def test_the_package_imports_nothing_when_it_runs() -> None:
    # A Ctrl-C in the package's first lines could only land in an import they make (the issue
    # saw one in typing's): they make none. Whether typing itself is loaded before any line
    # of ours depends on the interpreter and its site (some virtualenvs' site loads it), so
    # the property is checked directly, in a fresh interpreter.
    code = ("import sys; before = set(sys.modules); import e2b_provider; "
            "print(sorted(set(sys.modules) - before))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "['e2b_provider']", done.stderr


def test_ctrl_c_while_the_library_imports_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    err = _interrupt_while_importing(tmp_path, [SCRIPT, "ls"], "e2b_provider.provider")
    assert err == "e2b-provider: interrupted\n"


def test_exec_streams_output_live(env: Dict[str, str], named: str, provider) -> None:  # type: ignore[no-untyped-def]
    h = provider.list_sandboxes(named)[0].handle
    provider.exec(h, "rm -f /tmp/cli-go", timeout=30.0)
    command = "echo first; while [ ! -e /tmp/cli-go ]; do sleep 0.05; done; echo second"
    with started(env, "exec", named, "--", command) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "first\n"  # shown while the command still runs
        provider.write_file(h, "/tmp/cli-go", b"")
        out, err = child.communicate(timeout=60)
        assert (child.returncode, out) == (0, "second\n"), err


def test_ctrl_c_kills_the_remote_command_and_exits_130(
    env: Dict[str, str], named: str, provider
) -> None:  # type: ignore[no-untyped-def]
    h = provider.list_sandboxes(named)[0].handle
    marker = str(time.monotonic_ns())[-6:]
    with started(env, "exec", named, "--", f"echo started; sleep 9{marker}") as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "started\n"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    left = provider.exec(h, f"pgrep -f '[s]leep 9{marker}' || true", timeout=30.0)
    assert left.stdout.strip() == ""


def test_usage_and_config_errors_are_one_line(env: Dict[str, str]) -> None:
    r = run(env, "exec")
    assert r.returncode == 2 and "usage:" in r.stderr
    r = run(env, "create", "bad name!")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run({**env, "E2B_API_KEY": ""}, "ls")
    assert r.returncode == 2 and "E2B_API_KEY" in r.stderr and "Traceback" not in r.stderr
    r = run(env, "ls", "--", "x")
    assert r.returncode == 2
    r = run(env, "cp", "/a", "/b")
    assert r.returncode == 2 and "SANDBOX:/" in r.stderr


def test_every_command_has_help() -> None:
    sub = next(a for a in parser()._actions if a.dest == "cmd")
    names: List[str] = list(sub.choices)  # type: ignore[union-attr]
    assert set(names) == {"create", "exec", "start", "logs", "kill", "ps", "code", "cp", "ls",
                          "rm", "suspend", "resume", "emulator", "forward", "port-forward", "url",
                          "watch", "shell"}
    for name in [*names, None]:
        args = [name, "--help"] if name else ["--help"]
        r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "usage: e2b-provider" in r.stdout


def test_emulator_command_prints_exports_and_stops_on_ctrl_c(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with started({**os.environ, "PYTHONUNBUFFERED": "1"}, "emulator") as child:
        assert child.stdout is not None and child.stderr is not None
        lines = [child.stdout.readline().strip() for _ in range(5)]
        ready = child.stderr.readline()
        while ready and " ready at " not in ready:  # after any log line
            ready = child.stderr.readline()
        assert re.fullmatch(r"e2b-provider emulator: ready at http://127\.0\.0\.1:\d+ "
                            r"\(template base\); Ctrl-C stops it\n", ready), ready
        exports = dict(line.removeprefix("export ").split("=", 1) for line in lines)
        assert set(exports) == {
            "E2B_API_URL",
            "E2B_SANDBOX_URL",
            "E2B_VOLUME_API_URL",
            "E2B_API_KEY",
            "E2B_TEMPLATE",
        }
        assert exports["E2B_TEMPLATE"] == "base"
        env = {**os.environ, **exports}
        r = run(env, "create", "emu-cli")
        assert r.returncode == 0, r.stderr
        r = run(env, "exec", "emu-cli", "--", "echo", "hello")
        assert (r.returncode, r.stdout) == (0, "hello\n")
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
        assert (child.returncode, out) == (0, "")  # nothing but the export lines on stdout
        r = run(env, "ls", timeout=30)
        # the emulator is gone: the message names the URL that failed, and why
        api = exports["E2B_API_URL"].rstrip("/")
        assert r.returncode == 1 and f"connection to {api}/v2/sandboxes failed: connection " \
            "refused" in r.stderr, r.stderr


def test_emulator_command_takes_the_options_of_python_dash_m() -> None:
    def options(p) -> Dict[str, object]:  # type: ignore[no-untyped-def]
        return {o: (a.default, getattr(a.type, "__qualname__", a.type), a.choices, a.help)
                for a in p._actions for o in a.option_strings}

    sub = next(a for a in parser()._actions if a.dest == "cmd")
    em = sub.choices["emulator"]  # type: ignore[index]
    ours, theirs = options(em), options(emulator_parser())
    detach = {o: ours.pop(o) for o in ("-d", "--detach")}  # the command line's own
    assert detach["-d"] == detach["--detach"]
    assert ours == theirs
    assert {"--api-key", "--state-dir", "--memory-mb", "--cpu-count", "--disk-mb",
            "--max-processes", "--host", "--port", "--log-level"} <= set(ours)
    r = subprocess.run([*CLI, "emulator", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--max-processes" in r.stdout and "stderr" in r.stdout
    r = subprocess.run([*CLI, "emulator", "--memory-mb", "1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "must be at least 16" in r.stderr


def test_python_dash_m_and_console_script_agree() -> None:
    script = SCRIPT
    a = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    b = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=60)
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout != ""


def test_handle_of_a_listed_sandbox(provider: E2BSandboxProvider) -> None:
    name = unique_name("ls")
    h = provider.create(name)
    try:
        (s,) = provider.list_sandboxes(name)
        assert s.handle == SandboxHandle(h.id, name) and s.state == "running"
        assert s.started_at is not None and s.started_at.tzinfo is not None
    finally:
        provider.destroy(h)


def test_cp_r_both_ways_and_ls_of_a_directory(
    env: Dict[str, str], named: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "proj"
    (src / "src").mkdir(parents=True)
    (src / "src" / "main.py").write_text("print(1)\n")
    (src / "README").write_text("hi\n")
    (src / "x.pyc").write_bytes(b"compiled")
    # a directory without -r is refused, as cp does
    r = run(env, "cp", str(src), f"{named}:/workspace/")
    assert r.returncode == 1 and "-r not given" in r.stderr
    # into an existing directory: the copy goes inside it, under its own name
    r = run(env, "cp", "-r", "--exclude", "*.pyc", str(src), f"{named}:/workspace/")
    assert r.returncode == 0, r.stderr
    r = run(env, "ls", f"{named}:/workspace/proj")
    assert (r.returncode, r.stdout.split()) == (0, ["README", "src"]), r.stderr
    r = run(env, "ls", "-l", "--depth", "2", f"{named}:/workspace/proj")
    lines = r.stdout.splitlines()
    assert any(line.startswith("-rw-r--r--") and line.endswith("/workspace/proj/src/main.py")
               for line in lines), r.stdout
    assert any(line.startswith("d") and line.endswith("/workspace/proj/src") for line in lines)
    # and back, into a new directory
    back = tmp_path / "back"
    r = run(env, "cp", "-r", f"{named}:/workspace/proj", str(back))
    assert r.returncode == 0, r.stderr
    assert (back / "src" / "main.py").read_text() == "print(1)\n"
    assert not (back / "x.pyc").exists()
    # a missing path says so and exits 1
    r = run(env, "cp", f"{named}:/workspace/none", str(tmp_path / "n"))
    assert r.returncode == 1 and "no such file or directory" in r.stderr
    r = run(env, "ls", f"{named}:/workspace/none")
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_cp_shows_a_progress_line_on_a_terminal(
    env: Dict[str, str], named: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import pty

    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(48 << 20))
    leader, follower = pty.openpty()
    try:
        child = subprocess.Popen(
            [*CLI, "cp", str(src), f"{named}:/workspace/big.bin"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower,
            preexec_fn=default_sigint,
        )
        os.close(follower)
        follower = -1
        seen = b""
        while True:
            try:
                piece = os.read(leader, 4096)
            except OSError:  # the child closed the terminal
                break
            if not piece:
                break
            seen += piece
        assert child.wait(120) == 0, seen
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    text = seen.decode("utf-8", "replace")
    assert f"{src} -> {named}:/workspace/big.bin" in text
    assert "48.0 MiB in" in text and "MiB/s" in text, text


def test_ctrl_c_during_cp_leaves_the_old_file_whole(
    env: Dict[str, str], named: str, tmp_path, provider
) -> None:  # type: ignore[no-untyped-def]
    h = provider.list_sandboxes(named)[0].handle
    old = os.urandom(1 << 20)
    provider.write_file(h, "/workspace/up/big.bin", old)
    src = tmp_path / "up"  # cp -r up SANDBOX:/workspace writes /workspace/up
    src.mkdir()
    with open(src / "big.bin", "wb") as f:  # 400 MiB: Ctrl-C lands while it is written
        for _ in range(25):
            f.write(os.urandom(16 << 20))
    with started(env, "cp", "-r", str(src), f"{named}:/workspace") as child:
        # interrupt once the upload runs in the sandbox
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = provider.exec(h, "pgrep -f '[e]xtract /workspace/up' || true", timeout=30.0)
            if r.stdout.strip():
                break
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert "Traceback" not in err
    got = provider.read_file(h, "/workspace/up/big.bin", max_bytes=2 << 20)
    assert got is not None and got.data == old
    parts = provider.exec(h, "find /workspace -name '.capybara-part-*'", timeout=30.0)
    assert parts.stdout == ""


def test_create_says_the_sizes_the_sandbox_got(env: Dict[str, str], provider) -> None:  # type: ignore[no-untyped-def]
    name = unique_name("sizes")
    r = run(env, "create", name, "--memory-mb", "1024")
    try:
        assert r.returncode == 0 and r.stdout.strip().startswith("i"), r.stderr
        lines = r.stderr.splitlines()
        # the template's 512 MiB, not the 1024 asked for: one warning, then the sizes
        assert any(x.startswith("e2b-provider: warning: ") and "1024" in x for x in lines), lines
        assert lines[-1].startswith(f"e2b-provider: sandbox {r.stdout.strip()} has ")
        assert "512 MiB memory" in lines[-1]
    finally:
        provider.destroy_by_name(name)
