"""Tests for e2b_provider.protocol.scripts: byte-exact reference scripts, run for real under
/bin/sh.

The process tests start real ``setsid``/``sh``/``bash``/``sleep`` processes on this host. Each
test uses fresh control paths (uuid4) and a unique marker in every process it starts, and the
``procs`` fixture kills whatever is left (by pid, found through the marker) at teardown.
``KILL_ALL_SCRIPT`` kills every exec on the machine it runs on, so it only runs inside a private
PID namespace (``unshare``), and is skipped where that is not possible.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Callable, Dict, Iterator, List, Optional

import pytest

from e2b_provider.errors import InvalidArgument
from e2b_provider.protocol import scripts as S

#: The reference bundle, in ``shared/reference/`` beside the clone (CI lays a copy of
#: ``shared/`` next to its clone): the first such file found walking up from the repository.
REFERENCE_IN_SHARED = Path("shared", "reference", "plugin-sandbox-e2b.mjs")


def _find_reference() -> Optional[Path]:
    repo = Path(__file__).resolve().parents[2]
    for d in repo.parents:
        if (d / REFERENCE_IN_SHARED).is_file():
            return d / REFERENCE_IN_SHARED
    return None

# sha256 of each script as the reference bundle defines it (template literals expanded)
DIGESTS = {
    "EXEC_WRAPPER": "4f9c1b93771be55d44b95748f2cdd7a1311521d285abe6d683fc235be5862f87",
    "KILL_TREE": "28a9765f7b3a88c5fedbb3a0786571b03eb01d36e797ea8214cb9ede33c03d5b",
    "KILL_ALL_SCRIPT": "9fdfd19bf5f5374c26409ce301c77cb49e9e9de19153d175e4035ce300612bf9",
    "KILL_TAGGED_SCRIPT": "72176c81a11a223f5c970e28691acdad9fa6589a9a6d765d9fbc81ed6ca4ec33",
    "KILL_SCRIPT": "240768a4ee3af9736129f9b9ee06916a00093065a692c59d57263297f74a4fc5",
    "READ_SCRIPT": "650cc86136093fa96829ed0ecc6d40a77300f166d36b55c33b504dda7d90f7bd",
    "STAT_SCRIPT": "8697f2a95832126d0b1f3cec23317d53bd5ba34c47cd6fda0aa19dc67bf320d8",
    "USER_WRITE_SCRIPT": "256d805b5e0b8c97422b38f29a45207798d58249a4386c8febcecf9ec1a90c36",
    "SKILLS_WRITE_SCRIPT": "06bc3a90291a90b0e6a566daa1844e5c93bb4907c2194cdc254b43e3e811568e",
}

UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


# -- the strings ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DIGESTS))
def test_script_is_byte_exact(name: str) -> None:
    value: str = getattr(S, name)
    assert hashlib.sha256(value.encode("utf-8")).hexdigest() == DIGESTS[name]


def _reference_scripts(text: str) -> Dict[str, str]:
    """Evaluate the reference's ``var NAME = '...'`` / ``var NAME = `...```; lines."""
    env: Dict[str, str] = {}
    for m in re.finditer(r"^var (\w+) = (['\"`])(.*)\2;$", text, re.M):
        name, quote, body = m.groups()
        assert "\\" not in body, f"{name}: escape sequences are not handled here"
        if quote == "`":
            body = re.sub(r"\$\{(\w+)\}", lambda v: env[v.group(1)], body)
        env[name] = body
    return env


def test_scripts_equal_the_reference_bundle() -> None:
    reference = _find_reference()
    if reference is None:
        missing = f"no {REFERENCE_IN_SHARED} beside the clone or above it"
        if os.environ.get("CI"):
            pytest.fail(f"reference bundle missing in CI: {missing}")
        pytest.skip(reason=f"reference bundle not found: {missing}")
    text = reference.read_text(encoding="utf-8")
    ref = _reference_scripts(text)
    for name in DIGESTS:
        assert getattr(S, name) == ref[name], name
    for name in ("METADATA_NAME", "SANDBOX_USER", "ROOT_USER", "UPLOAD_DIR"):
        assert getattr(S, name) == ref[name]
    assert f"var IN_SANDBOX_GRACE_SECONDS = {S.IN_SANDBOX_GRACE_SECONDS};" in text


def test_constants() -> None:
    assert S.SANDBOX_USER == "sandbox"
    assert S.ROOT_USER == "root"
    assert S.UPLOAD_DIR == "/opt/capybara/upload"
    assert S.IN_SANDBOX_GRACE_SECONDS == 5
    assert S.METADATA_NAME == "capybara-sandbox-name"
    assert "${" not in S.USER_WRITE_SCRIPT and "runuser -u sandbox --" in S.USER_WRITE_SCRIPT
    for script in (S.KILL_ALL_SCRIPT, S.KILL_TAGGED_SCRIPT, S.KILL_SCRIPT):
        assert script.startswith(S.KILL_TREE)


# -- builders ------------------------------------------------------------------------------


def test_control_path_shapes() -> None:
    a, b = S.control_path(), S.control_path(None)
    assert re.fullmatch(r"/tmp/\.capybara-exec-" + UUID4, a)
    assert a != b
    assert re.fullmatch(r"/tmp/\.capybara-exec-my_tag-1-" + UUID4, S.control_path("my_tag-1"))
    assert S.control_path("x" * 64).startswith("/tmp/.capybara-exec-" + "x" * 64 + "-")


@pytest.mark.parametrize(
    "tag", ["", "a b", "a.b", "x" * 65, "a*", "ä", "tag\n", "a/b", "(x)", "a$", "a|b", "-\x00"]
)
def test_bad_tags_are_refused(tag: str) -> None:
    message = "invalid sandbox tag: use 1-64 characters from A-Z a-z 0-9 _ -"
    with pytest.raises(InvalidArgument) as ei:
        S.control_path(tag)
    assert str(ei.value) == message
    with pytest.raises(InvalidArgument) as ei:
        S.kill_tagged_args(["ok", tag])
    assert str(ei.value) == message


def test_exec_args() -> None:
    ctl = S.control_path()
    assert S.exec_args(ctl, "echo hi", 30, {"LANG": "C.UTF-8", "A": "1"}) == [
        "-w", "/bin/sh", "-c", S.LEAN_EXEC_WRAPPER, "capybara-exec", ctl, "echo hi", "35",
        "C.UTF-8",
    ]  # fmt: skip
    # without LANG there is no fourth argument: the wrapper leaves the environment alone
    args = S.exec_args(ctl, "echo hi", 30, {"A": "1"})
    assert args[4:] == ["capybara-exec", ctl, "echo hi", "35"]
    assert S.exec_args(ctl, "x", 1, {"LANG": ""})[-2:] == ["6", ""]
    assert S.exec_args(ctl, "x", 30.2, {})[-1] == "36"
    assert S.exec_args(ctl, "x", 0, {})[-1] == "5"
    assert S.exec_args(ctl, "x", 0.001, {})[-1] == "6"
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(InvalidArgument) as ei:
            S.exec_args(ctl, "x", bad, {})
        assert str(ei.value) == "timeout must be a finite, non-negative number of seconds"


def test_exec_env_gives_the_wrapper_the_c_locale_in_langs_place() -> None:
    ctl = S.control_path()
    env = {"HOME": "/workspace", "LANG": "C.UTF-8", "A": "1"}
    out = S.exec_env(env, ctl)
    assert list(out.items()) == [
        ("HOME", "/workspace"), ("LANG", S.HELPER_LANG), ("A", "1"), (S.EXEC_MARKER, ctl),
    ]  # fmt: skip
    assert env["LANG"] == "C.UTF-8"  # the caller's mapping is not changed
    assert S.exec_env({"A": "1"}, ctl) == {"A": "1", S.EXEC_MARKER: ctl}


def test_lean_wrapper_is_the_reference_with_its_two_changes() -> None:
    # what the reference does before the command is unchanged, word for word
    head = S.EXEC_WRAPPER[: S.EXEC_WRAPPER.index("timeout ")]
    assert S.LEAN_EXEC_WRAPPER.startswith(head)
    assert 'timeout -s KILL "$3" /bin/bash -c "$2"; s=$?;' in S.LEAN_EXEC_WRAPPER
    assert S.LEAN_EXEC_WRAPPER.endswith(" & exit $s")


def test_script_args() -> None:
    assert S.kill_args("/tmp/c") == ["-c", S.KILL_SCRIPT, "capybara-kill", "/tmp/c"]
    assert S.kill_all_args() == ["-c", S.KILL_ALL_MARKED_SCRIPT, "capybara-killall"]
    assert S.kill_tagged_args(["a", "b-1"]) == [
        "-c", S.KILL_TAGGED_MARKED_SCRIPT, "capybara-killtagged", "a", "b-1",
    ]  # fmt: skip
    assert S.kill_tagged_args([]) == ["-c", S.KILL_TAGGED_MARKED_SCRIPT, "capybara-killtagged"]
    ctls = [S.control_path(), S.control_path("t-1")]
    assert S.kill_batch_args(ctls) == ["-c", S.KILL_BATCH_SCRIPT, "capybara-killbatch", *ctls]
    for bad in (["/tmp/x"], ["/tmp/.capybara-exec-a b-" + str(uuid.uuid4())], [ctls[0] + " "]):
        with pytest.raises(InvalidArgument):
            S.kill_batch_args(bad)
    with pytest.raises(InvalidArgument):
        S.kill_batch_args([S.control_path() for _ in range(S.KILL_BATCH_MAX + 1)])
    assert S.exec_env({"A": "1", S.EXEC_MARKER: "mine"}, ctls[0]) == {
        "A": "1", S.EXEC_MARKER: ctls[0],
    }  # fmt: skip
    with pytest.raises(InvalidArgument) as ei:
        S.kill_tagged_args("abc")
    assert str(ei.value) == "tags must be a list of tags, not one string"
    assert S.read_args("/a b", 11) == ["-c", S.READ_SCRIPT, "capybara-read", "/a b", "11"]
    assert S.read_args("/a", 0)[-1] == "0"  # nothing but whether the file exists
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidArgument) as ei:
            S.read_args("/a", bad)  # type: ignore[arg-type]
        assert str(ei.value) == "want must be a non-negative integer"
    assert S.stat_args("/x") == ["-c", S.STAT_SCRIPT, "capybara-stat", "/x"]
    assert S.write_args("/w/f", "/s", False) == [
        "-c", S.USER_WRITE_SCRIPT, "capybara-write", "/w/f", "/s",
    ]  # fmt: skip
    assert S.write_args("/skills/f", "/s", True)[1] == S.SKILLS_WRITE_SCRIPT
    assert re.fullmatch(r"/opt/capybara/upload/" + UUID4, S.staging_path())


@pytest.mark.parametrize(
    ("path", "expected"),
    [("/skills", True), ("/skills/", True), ("/skills/a/b.md", True), ("/skillsx", False),
     ("/workspace/skills", False), ("/", False), ("skills/a", False)],
)  # fmt: skip
def test_is_skills_path(path: str, expected: bool) -> None:
    assert S.is_skills_path(path) is expected


# -- real processes ------------------------------------------------------------------------

pytestmark_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or not all(shutil.which(t) for t in ("setsid", "pgrep", "pkill", "timeout", "bash")),
    reason="needs Linux with setsid, pgrep, pkill, timeout and bash",
)


def pgrep(pattern: str) -> List[int]:
    r = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True, timeout=10)
    return [int(p) for p in r.stdout.split()]


def wait_for(pred: Callable[[], object], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


class Procs:
    """Starts exec wrappers with unique markers and cleans everything up."""

    def __init__(self) -> None:
        self.marker = "cbtest" + uuid.uuid4().hex[:16]
        self.popens: List[subprocess.Popen[bytes]] = []
        self.ctls: List[str] = []

    def ctl(self, tag: Optional[str] = None) -> str:
        c = S.control_path(tag)
        self.ctls.append(c)
        return c

    def start(
        self, ctl: str, command: str, seconds: float = 60, stdout: Optional[IO[bytes]] = None
    ) -> subprocess.Popen[bytes]:
        # as envd starts it for the provider: the exec's marker in its environment
        p = subprocess.Popen(
            ["setsid", *S.exec_args(ctl, command, seconds, os.environ)],
            stdout=subprocess.DEVNULL if stdout is None else stdout,
            stderr=subprocess.DEVNULL,
            env=S.exec_env(os.environ, ctl),
        )
        self.popens.append(p)
        return p

    def alive(self, suffix: str = "") -> List[int]:
        # only processes whose argv[0] carries the marker (the renamed sleeps), not the shells
        return pgrep("^" + self.marker + suffix)

    def anything(self) -> List[int]:
        return pgrep(self.marker)

    def cleanup(self) -> None:
        for pid in self.anything():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.popens:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(timeout=10)
        for c in self.ctls:
            for ext in (".pid", ".kill"):
                try:
                    os.unlink(c + ext)
                except FileNotFoundError:
                    pass


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    try:
        yield p
    finally:
        p.cleanup()


def sleeper(marker: str, n: int = 300) -> str:
    """A bash snippet for a sleep whose argv[0] is ``marker`` (visible to ``pgrep -f``)."""
    return f"exec -a {marker} sleep {n}"


@pytestmark_linux
def test_wrapper_runs_command_and_manages_pid_file(procs: Procs, tmp_path: Path) -> None:
    ctl = procs.ctl()
    out = tmp_path / "out"
    with out.open("wb") as f:
        p = procs.start(ctl, f'cat "{ctl}.pid"; echo "$0|$1"; exit 7', stdout=f)
        assert p.wait(timeout=10) == 7
    # setsid did not fork: the wrapper is the started process and leads its own session
    first, second = out.read_text().splitlines()
    assert int(first) == p.pid
    assert second == "/bin/bash|"
    # removed in the background, a moment after the wrapper exited
    assert wait_for(lambda: not os.path.exists(ctl + ".pid"))


@pytestmark_linux
def test_wrapper_refuses_to_start_once_kill_file_exists(procs: Procs, tmp_path: Path) -> None:
    ctl = procs.ctl()
    Path(ctl + ".kill").touch()
    ran = tmp_path / "ran"
    p = procs.start(ctl, f"touch {ran}")
    assert p.wait(timeout=10) == 137
    assert not ran.exists()


@pytestmark_linux
@pytest.mark.parametrize("wrapper", ["EXEC_WRAPPER", "LEAN_EXEC_WRAPPER"])
def test_wrapper_in_sandbox_timeout_kills_the_command_group(procs: Procs, wrapper: str) -> None:
    ctl = procs.ctl()
    m = procs.marker
    cmd = f"({sleeper(m + '-bg')}) & {sleeper(m + '-fg')}"
    argv = ["/bin/sh", "-c", getattr(S, wrapper), "capybara-exec", ctl, cmd, "1"]
    start = time.monotonic()
    p = subprocess.Popen(["setsid", "-w", *argv])
    procs.popens.append(p)
    assert wait_for(lambda: len(procs.alive()) == 2)
    assert p.wait(timeout=10) == 137
    assert 0.9 <= time.monotonic() - start < 5.0
    assert wait_for(lambda: not procs.alive())
    assert wait_for(lambda: not os.path.exists(ctl + ".pid"))


def _run_wrapper(
    wrapper: str, ctl: str, command: str, env: Dict[str, str], lang: bool = True
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` as envd runs an exec: under ``wrapper`` with envd's environment
    (``env`` as :func:`~e2b_provider.protocol.scripts.exec_env` makes it for the lean wrapper, plus
    the marker for both); its exit status and output."""
    if wrapper == "EXEC_WRAPPER":
        args = ["-w", "/bin/sh", "-c", S.EXEC_WRAPPER, "capybara-exec", ctl, command, "60"]
        envs = dict(env, **{S.EXEC_MARKER: ctl})
    else:
        args = S.exec_args(ctl, command, 55, env if lang else {})
        envs = S.exec_env(env, ctl)
    return subprocess.run(["setsid", *args], env=envs, capture_output=True, timeout=30)


#: Prints what the command sees: its own environment as the kernel keeps it (order
#: included), the one it gives a child (bash's export order), its arguments and options,
#: and the locale its programs use.
SHOW_ENVIRONMENT = (
    'tr "\\0" "\\n" < /proc/$$/environ; echo ---; env; echo ---; '
    'echo "$0|$#|$-|${LANG-unset}|$SHLVL"; echo ---; locale; echo ---; '
    "printf '%s\\n' \"$(date -d @0 +%c)\" \"$(printf '\\303\\244' | wc -m)\""
)


@pytestmark_linux
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"LANG": "C"},
        {"LANG": ""},
        {"LANG": "C.UTF-8", "LC_TIME": "C", "ZED": "z", "ABC": "a b"},
        # enough names to share every hash bucket of sh's variable table with LANG
        {f"V{i}_{'x' * (i % 7)}": str(i) for i in range(80)},
    ],
    ids=["default", "C", "empty", "lc", "many"],
)
def test_lean_wrapper_gives_the_command_the_reference_environment(
    procs: Procs, extra: Dict[str, str]
) -> None:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/workspace",
            "LANG": "C.UTF-8", "USER": "u", "LOGNAME": "u"}  # fmt: skip
    env = dict(base, **extra)
    seen = []
    for wrapper in ("EXEC_WRAPPER", "LEAN_EXEC_WRAPPER"):
        ctl = procs.ctl()
        r = _run_wrapper(wrapper, ctl, SHOW_ENVIRONMENT, env)
        assert r.returncode == 0, r.stderr
        seen.append(r.stdout.replace(ctl.encode(), b"CTL"))
    assert seen[0] == seen[1]
    lang = env["LANG"]
    assert f"|{lang}|".encode() in seen[1]
    assert (b"\nLANG=" + lang.encode() + b"\n") in seen[1]


@pytestmark_linux
def test_lean_wrapper_without_lang_leaves_the_environment_alone(procs: Procs) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/w", "A": "1"}
    seen = []
    for wrapper in ("EXEC_WRAPPER", "LEAN_EXEC_WRAPPER"):
        ctl = procs.ctl()
        r = _run_wrapper(wrapper, ctl, SHOW_ENVIRONMENT, env, lang=False)
        assert r.returncode == 0, r.stderr
        seen.append(r.stdout.replace(ctl.encode(), b"CTL"))
    assert seen[0] == seen[1]
    assert b"|unset|" in seen[1]


@pytestmark_linux
def test_lean_wrapper_runs_its_own_programs_in_the_c_locale(procs: Procs) -> None:
    # the wrapper (the pid file's process) has LANG=C; the command has the caller's LANG
    ctl = procs.ctl()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    command = f'tr "\\0" "\\n" < /proc/$(cat "{ctl}.pid")/environ | grep ^LANG=; echo "$LANG"'
    r = _run_wrapper("LEAN_EXEC_WRAPPER", ctl, command, env)
    assert (r.returncode, r.stdout) == (0, b"LANG=C\nC.UTF-8\n"), r.stderr


@pytestmark_linux
@pytest.mark.parametrize(
    ("command", "code"),
    [("true", 0), ("exit 7", 7), ("kill -TERM $$", 143), ("kill -KILL $$", 137),
     ("exit 300", 44), ("sh -c 'kill -USR1 $$'; exit $?", 138)],
)  # fmt: skip
def test_lean_wrapper_exits_as_the_reference(procs: Procs, command: str, code: int) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    for wrapper in ("EXEC_WRAPPER", "LEAN_EXEC_WRAPPER"):
        assert _run_wrapper(wrapper, procs.ctl(), command, env).returncode == code, wrapper


@pytestmark_linux
def test_lean_wrapper_ends_before_its_pid_file_is_removed(
    procs: Procs, tmp_path: Path
) -> None:
    # an `rm` that waits for the test's go (20 s at most): the wrapper's exit and the end of
    # its output (what envd's end event waits for) do not wait for it; the pid file goes
    # when it is done
    slow = tmp_path / "bin"
    slow.mkdir()
    go = tmp_path / "go"
    (slow / "rm").write_text(
        f'#!/bin/sh\ni=0\nwhile [ ! -e "{go}" ] && [ $i -lt 400 ]; do\n'
        "  sleep 0.05; i=$((i+1))\ndone\n"
        'exec /bin/rm "$@"\n'
    )
    (slow / "rm").chmod(0o755)
    env = {"PATH": f"{slow}:{os.environ.get('PATH', '/usr/bin:/bin')}", "LANG": "C.UTF-8"}
    ctl = procs.ctl()
    start = time.monotonic()
    r = _run_wrapper("LEAN_EXEC_WRAPPER", ctl, f'cat "{ctl}.pid"; exit 3', env)
    took = time.monotonic() - start
    assert r.returncode == 3 and r.stdout.strip().isdigit()
    assert took < 5.0, took  # waiting for the rm would take its 20 s
    assert os.path.exists(ctl + ".pid")
    go.touch()
    assert wait_for(lambda: not os.path.exists(ctl + ".pid"), timeout=10.0)


@pytestmark_linux
def test_kill_script_kills_the_whole_tree(procs: Procs) -> None:
    ctl = procs.ctl()
    m = procs.marker
    cmd = (
        f"({sleeper(m + '-bg')}) & "
        f"( ({sleeper(m + '-gc')}) & ) ; "  # double fork: reparented away from the wrapper
        f"bash -c '{sleeper(m + '-sub')} & wait' & "
        f"{sleeper(m + '-fg')}"
    )
    p = procs.start(ctl, cmd)
    assert wait_for(lambda: len(procs.alive()) == 4), procs.alive()
    for suffix in ("-bg", "-gc", "-sub", "-fg"):
        assert len(procs.alive(suffix)) == 1
    r = subprocess.run(["/bin/sh", *S.kill_args(ctl)], capture_output=True, timeout=15)
    assert r.returncode == 0, r.stderr
    assert p.wait(timeout=10) in (-9, 137)
    assert wait_for(lambda: not procs.anything()), procs.anything()
    assert not os.path.exists(ctl + ".pid")
    assert not os.path.exists(ctl + ".kill")


@pytestmark_linux
def test_kill_script_before_start_prevents_the_command(procs: Procs, tmp_path: Path) -> None:
    ctl = procs.ctl()
    r = subprocess.run(["/bin/sh", *S.kill_args(ctl)], timeout=15)  # waits ~1 s for a pid file
    assert r.returncode == 0
    assert os.path.exists(ctl + ".kill")
    ran = tmp_path / "ran"
    p = procs.start(ctl, f"touch {ran}")
    assert p.wait(timeout=10) == 137
    assert not ran.exists()


@pytestmark_linux
def test_kill_tagged_kills_only_the_given_tag(procs: Procs) -> None:
    tag = "t" + uuid.uuid4().hex[:10]
    other = tag + "-x"  # shares a prefix: must not match the first tag's pattern
    m = procs.marker
    ctl_a, ctl_b, ctl_c = procs.ctl(tag), procs.ctl(other), procs.ctl()
    pa = procs.start(ctl_a, sleeper(m + "-a"))
    pb = procs.start(ctl_b, sleeper(m + "-b"))
    pc = procs.start(ctl_c, sleeper(m + "-c"))
    assert wait_for(lambda: len(procs.alive()) == 3)
    r = subprocess.run(["/bin/sh", *S.kill_tagged_args([tag])], timeout=15)
    assert r.returncode == 0
    assert pa.wait(timeout=10) in (-9, 137)
    assert wait_for(lambda: not procs.alive("-a"))
    assert len(procs.alive("-b")) == 1 and len(procs.alive("-c")) == 1
    assert pb.poll() is None and pc.poll() is None
    r = subprocess.run(["/bin/sh", *S.kill_tagged_args([other])], timeout=15)
    assert r.returncode == 0
    assert pb.wait(timeout=10) in (-9, 137)
    assert len(procs.alive("-c")) == 1


def escaping(m: str) -> str:
    """A command whose processes leave the exec's session and group: one calls ``setsid``,
    one is double-forked and calls ``setsid`` (reparented away from the wrapper), one stays."""
    return (
        f"setsid bash -c '{sleeper(m + '-sid')}' & "
        f"( (setsid bash -c '{sleeper(m + '-dbl')}' &) ) ; "
        f"{sleeper(m + '-fg')}"
    )


@pytestmark_linux
def test_reference_kill_script_misses_what_left_the_session(procs: Procs) -> None:
    # why the marker exists: the reference's tree kill cannot find a setsid-ed process
    ctl = procs.ctl()
    procs.start(ctl, escaping(procs.marker))
    assert wait_for(lambda: len(procs.alive()) == 3), procs.alive()
    r = subprocess.run(["/bin/sh", *S.kill_args(ctl)], capture_output=True, timeout=15)
    assert r.returncode == 0, r.stderr
    assert wait_for(lambda: not procs.alive("-fg"))
    assert len(procs.alive("-sid")) == 1 and len(procs.alive("-dbl")) == 1


@pytestmark_linux
def test_kill_batch_kills_every_tree_and_what_left_it(procs: Procs) -> None:
    m = procs.marker
    a, b, c = procs.ctl(), procs.ctl("tagged"), procs.ctl()
    # exec a also has a child without the marker (an emptied environment) in its session
    clean = f"(env -i /bin/bash -c '{sleeper(m + '-a-clean')}') & "
    pa = procs.start(a, clean + escaping(m + "-a"))
    pb = procs.start(b, escaping(m + "-b") + f"; ({sleeper(m + '-b-bg')}) & wait")
    pc = procs.start(c, escaping(m + "-c"))
    assert wait_for(lambda: len(procs.alive()) == 10), procs.alive()
    r = subprocess.run(["/bin/sh", *S.kill_batch_args([a, b])], capture_output=True, timeout=15)
    assert (r.returncode, r.stderr) == (0, b"")
    assert pa.wait(timeout=10) in (-9, 137) and pb.wait(timeout=10) in (-9, 137)
    assert wait_for(lambda: not procs.alive("-a-") and not procs.alive("-b-")), procs.alive()
    # the exec that was not asked for is untouched, escaped processes included
    assert len(procs.alive("-c-")) == 3 and pc.poll() is None
    for ctl in (a, b):
        assert not os.path.exists(ctl + ".pid") and not os.path.exists(ctl + ".kill")


@pytestmark_linux
def test_kill_batch_ignores_a_pid_file_naming_another_process(procs: Procs) -> None:
    # a pid file left from before a reboot may name an unrelated process (pid reused)
    other = subprocess.Popen(["setsid", "bash", "-c", sleeper(procs.marker + "-other")])
    procs.popens.append(other)
    assert wait_for(lambda: len(procs.alive("-other")) == 1)
    (pid,) = procs.alive("-other")
    ctl = procs.ctl()
    Path(ctl + ".pid").write_text(f"{pid}\n")
    r = subprocess.run(["/bin/sh", *S.kill_batch_args([ctl])], capture_output=True, timeout=15)
    assert (r.returncode, r.stderr) == (0, b"")
    assert procs.alive("-other") == [pid] and other.poll() is None
    assert not os.path.exists(ctl + ".pid")


@pytestmark_linux
def test_kill_batch_before_start_prevents_the_commands(procs: Procs, tmp_path: Path) -> None:
    a, b = procs.ctl(), procs.ctl()
    r = subprocess.run(["/bin/sh", *S.kill_batch_args([a, b])], timeout=15)  # waits ~1 s
    assert r.returncode == 0
    assert os.path.exists(a + ".kill") and os.path.exists(b + ".kill")
    ran = tmp_path / "ran"
    assert procs.start(a, f"touch {ran}").wait(timeout=10) == 137
    assert not ran.exists()


@pytestmark_linux
def test_marked_kill_continues_a_process_that_no_longer_matches(
    procs: Procs, tmp_path: Path
) -> None:
    # stands for a pid reused between the scan and the stop: the scan finds both processes,
    # they are stopped and checked again; the one that no longer matches is continued
    m = procs.marker
    ctl = procs.ctl()
    env = S.exec_env(os.environ, ctl)
    for name in ("kept", "killed"):
        p = subprocess.Popen(["setsid", "bash", "-c", sleeper(f"{m}-{name}")], env=env)
        procs.popens.append(p)
    assert wait_for(lambda: len(procs.alive()) == 2)
    (kept,) = procs.alive("-kept")
    script = (
        S.MARKED_KILL
        # the first scan (in a subshell, hence the file) sees the process, the check not
        + 'grep() { if [ ! -e "$F" ]; then : > "$F"; command grep "$@"; else '
        'command grep "$@" | command grep -v "/$P/"; fi; }; z -xF -e "$E"; '
        'echo "$(ps -o stat= -p "$P")"'
    )
    flag = str(tmp_path / "scanned")
    env = dict(os.environ, P=str(kept), E=f"{S.EXEC_MARKER}={ctl}", F=flag)
    r = subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=15
    )
    assert r.returncode == 0, r.stderr
    assert os.path.exists(flag)  # the scan ran
    assert r.stdout.strip().startswith("S"), r.stdout  # sleeping again, not stopped
    assert wait_for(lambda: not procs.alive("-killed"))
    assert procs.alive("-kept") == [kept]


@pytestmark_linux
def test_kill_tagged_also_kills_what_left_the_session(procs: Procs) -> None:
    tag = "t" + uuid.uuid4().hex[:10]
    m = procs.marker
    procs.start(procs.ctl(tag), escaping(m + "-a"))
    procs.start(procs.ctl(tag + "-x"), escaping(m + "-b"))
    assert wait_for(lambda: len(procs.alive()) == 6), procs.alive()
    r = subprocess.run(["/bin/sh", *S.kill_tagged_args([tag])], timeout=15)
    assert r.returncode == 0
    assert wait_for(lambda: not procs.alive("-a-")), procs.alive()
    assert len(procs.alive("-b-")) == 3


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        r = subprocess.run(
            ["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


KILL_ALL_DRIVER = r"""
CAPYBARA_EXEC=$C1 setsid -w /bin/sh -c "$W" capybara-exec "$C1" "exec -a $M-1 sleep 300" 300 &
CAPYBARA_EXEC=$C2 setsid -w /bin/sh -c "$W" capybara-exec "$C2" \
  "(exec -a $M-2 sleep 300) & (setsid bash -c 'exec -a $M-4 sleep 300' &) ; \
   exec -a $M-3 sleep 300" 300 &
i=0; while [ "$(pgrep -c -f -- "^$M")" -lt 4 ] && [ $i -lt 200 ]; do sleep 0.02; i=$((i+1)); done
echo "before=$(pgrep -c -f -- "^$M")"
/bin/sh -c "$K" capybara-killall; echo "rc=$?"
wait
i=0; while [ "$(pgrep -c -f -- "$M")" -gt $LEFT ] && [ $i -lt 100 ]; do sleep 0.02; i=$((i+1)); done
echo "left=$(pgrep -c -f -- "$M")"
"""


@pytestmark_linux
@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare -p -f --mount-proc` (root)")
@pytest.mark.parametrize(("name", "left"), [("KILL_ALL_SCRIPT", 1), ("KILL_ALL_MARKED_SCRIPT", 0)])
def test_kill_all_inside_a_private_pid_namespace(procs: Procs, name: str, left: int) -> None:
    # the reference's script misses the process that called setsid; the marked one does not
    env = dict(
        os.environ,
        W=S.LEAN_EXEC_WRAPPER,
        K=getattr(S, name),
        M=procs.marker,
        C1=procs.ctl(),
        C2=procs.ctl("all"),
        LEFT=str(left),
    )
    r = subprocess.run(
        ["unshare", "-p", "-f", "--mount-proc", "--kill-child", "/bin/sh", "-c", KILL_ALL_DRIVER],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["before=4", "rc=0", f"left={left}"], (r.stdout, r.stderr)


@pytestmark_linux
def test_read_script(tmp_path: Path) -> None:
    f = tmp_path / "f.bin"
    f.write_bytes(b"hello\x00world\n")

    def run(path: str, want: int) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["/bin/sh", *S.read_args(path, want)], capture_output=True, timeout=10
        )

    r = run(str(f), 5)
    assert (r.returncode, r.stdout) == (0, b"hello")
    r = run(str(f), 1000)
    assert (r.returncode, r.stdout) == (0, b"hello\x00world\n")
    r = run(str(tmp_path / "missing"), 5)
    assert (r.returncode, r.stdout) == (3, b"")
    r = run(str(tmp_path), 5)
    assert (r.returncode, r.stdout) == (4, b"")


@pytestmark_linux
def test_stat_script(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 11)
    link = tmp_path / "link"
    link.symlink_to(f)

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        args = ["/bin/sh", *S.stat_args(str(path))]
        return subprocess.run(args, capture_output=True, text=True, timeout=10)

    assert run(f).stdout == "11 file\n"
    assert run(link).stdout == "11 file\n"
    r = run(tmp_path)
    assert r.returncode == 0
    assert re.fullmatch(r"\d+ directory\n", r.stdout)
    r = run(tmp_path / "missing")
    assert (r.returncode, r.stdout) == (3, "")


@pytestmark_linux
def test_skills_write_script(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.write_bytes(b"skill body\n")
    dest = tmp_path / "skills" / "a" / "SKILL.md"
    args = ["/bin/sh", *S.write_args(str(dest), str(staging), skills=True)]
    r = subprocess.run(args, capture_output=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert dest.read_bytes() == b"skill body\n"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644
    assert not staging.exists()

    # failure (the parent is a file): exit 1, and the staged upload is still removed
    staging.write_bytes(b"again")
    args = ["/bin/sh", *S.write_args(str(dest / "x"), str(staging), skills=True)]
    r = subprocess.run(args, capture_output=True, timeout=10)
    assert r.returncode == 1
    assert not staging.exists()


@pytestmark_linux
def test_user_write_script(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.write_bytes(b"user data")
    dest = tmp_path / "w" / "sub" / "f.txt"
    has_user = subprocess.run(["id", S.SANDBOX_USER], capture_output=True).returncode == 0
    if has_user:
        os.chmod(tmp_path, 0o777)
    args = ["/bin/sh", *S.write_args(str(dest), str(staging), skills=False)]
    r = subprocess.run(args, capture_output=True, timeout=10)
    if has_user:
        assert r.returncode == 0, r.stderr
        assert dest.read_bytes() == b"user data"
    else:
        # no `sandbox` user on this host: runuser fails, the script reports it
        assert r.returncode == 1
        assert not dest.exists()
    assert not staging.exists()


def test_agent_retire_finds_an_agent_by_its_name_when_its_pid_is_unknown() -> None:
    """``agent_retire_args(0, name)``: the agent whose start was given up before envd said
    its pid is found by its name and killed; a process without the name is left alone."""
    name = "capybara-files-" + uuid.uuid4().hex
    sleep = "import time; time.sleep(60)"
    agent = subprocess.Popen([sys.executable, "-c", sleep, "serve", "60", name])
    other = subprocess.Popen([sys.executable, "-c", sleep, "serve", "60", name[:-1] + "x"])
    try:
        r = subprocess.run(["/bin/sh", *S.agent_retire_args(0, name)], timeout=30)
        assert r.returncode == 0
        assert agent.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
        # nothing carries the name any more: the retirement finds nothing and says so by 0
        assert subprocess.run(["/bin/sh", *S.agent_retire_args(0, name)],
                              timeout=30).returncode == 0
    finally:
        for proc in (agent, other):
            proc.kill()
            proc.wait()
    with pytest.raises(InvalidArgument):
        S.agent_retire_args(1, name)
