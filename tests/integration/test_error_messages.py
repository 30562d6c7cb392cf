"""Errors say what failed in the caller's terms (operation, sandbox, path) and what to do;
no internal script or request name reaches the caller (against the emulator)."""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

import pytest

from e2b_provider import (
    CommandEnded,
    CommandFailed,
    CommandNotFound,
    E2BHttpError,
    E2BProviderError,
    E2BSandboxProvider,
    FilesFailed,
    InvalidArgument,
    OperationTimeout,
    ProtocolError,
    SandboxGoneError,
    TransportError,
    UnsafePath,
)

from .conftest import no_file_agent, own_sandbox, root, unique_name, warm_file_agent

pytestmark = pytest.mark.integration

#: Words of the library's insides that a caller must never have to read.
INTERNAL = ("capybara", "head:", "runuser", "/bin/sh", "process start", "process signal",
            "{id}", "POST /", "GET /", "DELETE /")


def internal_words(text: str) -> List[str]:
    return [w for w in INTERNAL if w in text]


@pytest.fixture
def fresh(provider: E2BSandboxProvider):  # type: ignore[no-untyped-def]
    with own_sandbox(provider, "msg") as h:
        yield h


def test_file_errors_name_the_path_the_sandbox_and_the_reason(provider, fresh) -> None:  # type: ignore[no-untyped-def]
    sid = fresh.id
    cases: List[Tuple[Callable[[], Any], str]] = [
        (lambda: provider.write_file(fresh, "/root/x", b"x"),
         f"writing /root/x in sandbox {sid} failed: permission denied (cannot create /root/x)"),
        (lambda: provider.write_file(fresh, "/root/x", b"x" * 200_000),  # the streamed path
         f"writing /root/x in sandbox {sid} failed: permission denied (cannot create /root/x)"),
        (lambda: provider.write_file(fresh, "/workspace", b"x"),
         f"writing /workspace in sandbox {sid} failed: it is a directory"),
        (lambda: provider.read_file(fresh, "/etc/shadow"),
         f"reading /etc/shadow in sandbox {sid} failed: permission denied (cannot open "
         "'/etc/shadow' for reading)"),
        (lambda: provider.read_file(fresh, "/root/x"),
         f"reading /root/x in sandbox {sid} failed: permission denied: user 'sandbox' may not "
         "enter /root"),
        (lambda: provider.stat(fresh, "/root/x"),
         f"examining /root/x in sandbox {sid} failed: permission denied: user 'sandbox' may not "
         "enter /root"),
    ]
    for call, start in cases:
        with pytest.raises(CommandFailed) as ei:
            call()
        text = str(ei.value)
        assert text.startswith(start), text
        assert internal_words(text) == [], text
        assert internal_words(ei.value.stderr) == [], ei.value.stderr
    # what to do: the user the files are written as, and where it may write
    with pytest.raises(CommandFailed, match="under /workspace"):
        provider.write_file(fresh, "/root/x", b"x")


def test_failed_requests_name_the_callers_operation(emu, provider, fresh) -> None:  # type: ignore[no-untyped-def]
    sid = fresh.id
    warm_file_agent(provider, fresh)  # the file agent starts in the background, now
    emu.edge_not_found(sandbox_id=sid, count=2)
    with pytest.raises(E2BHttpError) as http:
        provider.read_file(fresh, "/workspace/x")
    emu.stream_cut(after_bytes=0, sandbox_id=sid)
    with pytest.raises(TransportError) as cut:
        provider.exec(fresh, "true", timeout=30.0)
    emu.bad_envelope("malformed", sandbox_id=sid)
    with pytest.raises(ProtocolError) as bad:
        provider.kill_all(fresh)
    emu.control_error("connect", 500)
    with pytest.raises(E2BHttpError) as five:
        provider.resume(fresh)
    checks = [
        (http, f"reading /workspace/x in sandbox {sid} failed: E2B answered HTTP 502", "again"),
        (cut, f"running a command in sandbox {sid} failed:", "may or may not have run"),
        (bad, f"stopping leftover commands in sandbox {sid} failed: E2B's answer could not be "
         "read", "try again"),
        (five, f"resuming sandbox {sid} failed: E2B answered HTTP 500", "try again later"),
    ]
    for info, start, advice in checks:
        text = str(info.value)
        assert text.startswith(start) and advice in text, text
        assert internal_words(text) == [], text
    assert http.value.status == 502 and five.value.status == 500  # attributes are kept


def test_a_gone_sandbox_says_so_in_every_call(provider) -> None:  # type: ignore[no-untyped-def]
    h = provider.create(unique_name("gone"))
    provider.destroy(h)
    calls: List[Tuple[str, Callable[[], Any]]] = [
        ("running a command in", lambda: provider.exec(h, "true", timeout=30.0)),
        ("reading /x in", lambda: provider.read_file(h, "/x")),
        ("writing /x in", lambda: provider.write_file(h, "/x", b"x")),
        ("examining /x in", lambda: provider.stat(h, "/x")),
        ("stopping leftover commands in", lambda: provider.kill_all(h)),
    ]
    for doing, call in calls:
        with pytest.raises(SandboxGoneError) as ei:
            call()
        assert str(ei.value) == (
            f"{doing} sandbox {h.id} failed: the sandbox no longer exists; create a new sandbox"
        )
    assert provider.resume(h) == "gone"


def test_a_wrong_api_key_says_what_to_check(emu) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emu.config(template="base", api_key="e2b_wrong_key_0123456789")) as p:
        with pytest.raises(E2BProviderError) as ei:
            p.list_sandboxes()
    text = str(ei.value)
    assert text.startswith("listing sandboxes failed: E2B answered HTTP 401") and "API key" in text
    assert "e2b_wrong_key_0123456789" not in text


#: What a message must never show: the library's process names, places, script text or
#: request names (the caller never asked for them).
NEVER = ("capybara", "/opt/", "$0", "$1", "sh -c", "python3 -I", "runuser", "Traceback",
         "process.Process", "SendInput", "Filesystem/", "POST /", "GET /", "{id}")


Case = Tuple[str, Callable[[], Any], type, Tuple[str, ...]]


def _walk_cases(p: E2BSandboxProvider, h: Any, local: Any) -> List[Case]:
    """Every way the file, tree and command parts refuse or fail, with the words (the
    caller's path or id, and what to do) their error must say."""
    big = b"b" * (2 << 20)
    return [
        ("write denied", lambda: p.write_file(h, "/root/x", b"x"), CommandFailed,
         ("/root/x", "under /workspace")),
        ("write denied, large", lambda: p.write_file(h, "/root/x", big), CommandFailed,
         ("/root/x", "under /workspace")),
        ("write a directory", lambda: p.write_file(h, "/workspace", b"x"), CommandFailed,
         ("/workspace", "path of a file")),
        ("write a FIFO", lambda: p.write_file(h, "/workspace/fifo", b"x"), CommandFailed,
         ("/workspace/fifo", "only regular files")),
        ("write below a file", lambda: p.write_file(h, "/workspace/file/x", b"x"),
         CommandFailed, ("/workspace/file/x", "remove it, or choose another path")),
        ("write /skills unsafe", lambda: p.write_file(h, "/skills/a.md", b"x"), UnsafePath,
         ("/skills/a.md", "chmod go-w /skills")),
        ("write /skills unsafe, large", lambda: p.write_file(h, "/skills/a.md", big),
         UnsafePath, ("/skills/a.md", "chmod go-w /skills")),
        ("read denied", lambda: p.read_file(h, "/etc/shadow"), CommandFailed,
         ("/etc/shadow", "under /workspace")),
        ("read behind a closed dir", lambda: p.read_file(h, "/root/big", max_bytes=4 << 20),
         CommandFailed, ("/root/big", "under /workspace")),
        ("read a FIFO", lambda: p.read_file(h, "/workspace/fifo"), CommandFailed,
         ("/workspace/fifo", "only regular files")),
        ("stat behind a closed dir", lambda: p.stat(h, "/root/x"), CommandFailed,
         ("/root/x", "under /workspace")),
        ("batch write", lambda: p.write_files(h, {"/root/a": b"x", "/workspace/ok": b"y"}),
         FilesFailed, ("/root/a", "under /workspace")),
        ("batch read", lambda: p.read_files(h, ["/etc/shadow", "/workspace/ok"]), FilesFailed,
         ("/etc/shadow", "under /workspace")),
        ("list a file", lambda: p.list_dir(h, "/workspace/file"), CommandFailed,
         ("/workspace/file", "not a directory")),
        ("list denied", lambda: p.list_dir(h, "/root"), CommandFailed,
         ("/root", "under /workspace")),
        ("upload denied", lambda: p.upload(h, local, "/etc/tree"), CommandFailed,
         ("/etc/tree", "under /workspace")),
        ("upload into a closed dir", lambda: p.upload(h, local, "/etc"), FilesFailed,
         ("/etc/sub/f", "under /workspace")),
        ("upload into a file", lambda: p.upload(h, local, "/workspace/file"), CommandFailed,
         ("/workspace/file", "upload to a directory")),
        ("upload /skills unsafe", lambda: p.upload(h, local, "/skills/tree"), UnsafePath,
         ("/skills", "chmod go-w /skills")),
        ("download missing", lambda: p.download(h, "/workspace/nothing", local / "d1"),
         CommandFailed, ("/workspace/nothing", "does not exist")),
        ("download a FIFO", lambda: p.download(h, "/workspace/fifo", local / "d2"),
         CommandFailed, ("/workspace/fifo", "only files, directories")),
        ("download past max_bytes", lambda: p.download(h, "/workspace", local / "d3",
                                                       max_bytes=1),
         CommandFailed, ("/workspace", "larger max_bytes")),
        ("start in a missing cwd", lambda: p.start(h, "true", cwd="/nope"), InvalidArgument,
         ("/nope", "mkdir -p")),
        ("attach unknown", lambda: p.attach(h, f"{h.id}:{'0' * 32}"), CommandNotFound,
         (f"{h.id}:{'0' * 32}", "started in this sandbox")),
    ]


@pytest.mark.parametrize("scripts", [False, True], ids=["agent", "scripts"])
def test_every_file_tree_and_command_error_names_the_path_and_what_to_do(
    emu, fresh, tmp_path: Any, scripts: bool
) -> None:  # type: ignore[no-untyped-def]
    with E2BSandboxProvider(emu.config(template="base")) as p:
        if scripts:
            no_file_agent(p)
        h = fresh
        root(p, h, "rm -rf /workspace/fifo /workspace/file /skills; mkfifo -m 0666 "
                   "/workspace/fifo; echo x > /workspace/file; mkdir -p /skills; "
                   "chmod 0777 /skills; head -c 3000000 /dev/zero > /root/big")
        local = tmp_path / "local"
        (local / "sub").mkdir(parents=True)
        (local / "sub" / "f").write_text("x")
        p.stat(h, "/workspace")
        for name, call, kind, words in _walk_cases(p, h, local):
            with pytest.raises(kind) as ei:
                call()
            texts = [str(ei.value)]
            texts += [str(e) for e in getattr(ei.value, "failed", {}).values()]
            for text in texts:
                assert [w for w in NEVER if w in text] == [], (name, text)
            assert all(w in texts[0] for w in words), (name, texts[0])
        # the command part: a command that ended, one started without stdin
        c = p.start(h, "true")
        c.wait(timeout=30)
        late = p.attach(h, c.id)
        fed = p.start(h, "cat", stdin=True)
        fed.kill()
        fed.wait(timeout=30)
        for name, call, kind, words in [
            ("input without stdin", lambda: c.send_stdin(b"x"), InvalidArgument,
             (c.id, "stdin=True")),
            ("input after the end", lambda: p.attach(h, fed.id).send_stdin(b"x"), CommandEnded,
             (fed.id, "wait()")),
            ("wait past its timeout", lambda: p.start(h, "sleep 30").wait(0.2),
             OperationTimeout, ("still runs",)),
            ("output of another sandbox's id", lambda: p.attach(h, "iother:" + "0" * 32),
             InvalidArgument, ("iother", h.id)),
        ]:
            with pytest.raises(kind) as ei:
                call()
            text = str(ei.value)
            assert [w for w in NEVER if w in text] == [] and all(w in text for w in words), (
                name, text)
        assert late.wait(timeout=30).exit_code == 0
