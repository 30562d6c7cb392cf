"""What users read: errors said in their terms, without internal names (e2b_provider.core.messages),
and the bounded per-key locks the provider's parts share (e2b_provider.core.context.KeyedLocks)."""

from __future__ import annotations

import pickle
import threading
from typing import List

import pytest

from e2b_provider import errors as e
from e2b_provider.cancel import CancelReason, CancelToken
from e2b_provider.core import messages as m
from e2b_provider.core.context import KeyedLocks
from e2b_provider.emulator.api.faults import TrailerCut


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        (
            "capybara-write: 1: cannot create /root/x: Permission denied",
            "permission denied (cannot create /root/x)",
        ),
        (
            "capybara-fileop-0123456789abcdef0123456789abcdef: 1: cannot create /x: "
            "Is a directory",
            "it is a directory (cannot create /x)",
        ),
        (
            "head: cannot open '/etc/shadow' for reading: Permission denied",
            "permission denied (cannot open '/etc/shadow' for reading)",
        ),
        (
            "mkdir: cannot create directory '/a/b': No space left on device",
            "no space left on the sandbox's disk (cannot create directory '/a/b')",
        ),
        ("/bin/sh: 1: capybara-x: not found", "not found"),
        ("short upload", "short upload"),
        ("", "exit status 2"),
    ],
)
def test_script_reasons_hold_no_internal_names(stderr: str, reason: str) -> None:
    got = m.script_reason(stderr, 2)
    assert got == reason
    assert "capybara" not in got and "head:" not in got and "/bin/sh" not in got


def test_command_failed_keeps_a_cleaned_stderr() -> None:
    err = m.command_failed("permission denied", 2, "capybara-write: 1: cannot create /x: "
                           "Permission denied\n")
    assert str(err) == "permission denied"
    assert err.stderr == "cannot create /x: Permission denied"
    assert err.exit_code == 2


def _worded(exc: e.E2BProviderError, doing: str = "reading /x in sandbox isb") -> str:
    m.reword(exc, doing)
    return str(exc)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (
            e.SandboxGoneError("E2B sandbox isb no longer exists"),
            "reading /x in sandbox isb failed: the sandbox no longer exists; create a new "
            "sandbox",
        ),
        (
            e.E2BHttpError(502, "The sandbox was not found", operation="process start"),
            "reading /x in sandbox isb failed: E2B answered HTTP 502: The sandbox was not "
            "found; E2B could not serve the request; try again later",
        ),
        (
            e.AuthenticationError(401, "bad key", operation="POST /v2/sandboxes/{id}/connect"),
            "reading /x in sandbox isb failed: E2B answered HTTP 401: bad key; check the API "
            "key (E2B_API_KEY) and that it belongs to the sandbox's team",
        ),
        (
            e.TransportError(
                "E2B process start: connection to https://49983-isb.e2b.app:443/process."
                "Process/Start failed: the connection was reset (ConnectionError, ECONNRESET)"
            ),
            "reading /x in sandbox isb failed: connection to https://49983-isb.e2b.app:443/"
            "process.Process/Start failed: the connection was reset (ConnectionError, "
            "ECONNRESET); check the URL (E2B_API_URL for the API; E2B_SANDBOX_URL or "
            "E2B_DOMAIN for sandboxes), the network and the proxy settings (HTTPS_PROXY, "
            "HTTP_PROXY, NO_PROXY), then try again",
        ),
        (
            e.TransportTimeout("E2B POST /v2/sandboxes/{id}/connect timed out (read)"),
            "reading /x in sandbox isb failed: timed out (read); E2B or the sandbox did not "
            "answer in time; check the network, then try again",
        ),
        (
            e.TransportTimeout(
                "E2B GET /v2/sandboxes timed out: http://127.0.0.1:3000/v2/sandboxes gave no "
                "complete answer within 120 s"
            ),
            "reading /x in sandbox isb failed: timed out: http://127.0.0.1:3000/v2/sandboxes "
            "gave no complete answer within 120 s; E2B or the sandbox did not answer in "
            "time; check the network, then try again",
        ),
        (
            e.RemoteError("internal", "boom", operation="process start"),
            "reading /x in sandbox isb failed: the sandbox reported internal: boom; try again; "
            "if it persists, the sandbox may need to be recreated",
        ),
        (
            e.Cancelled(CancelReason("explicit", "user stop")),
            "reading /x in sandbox isb was cancelled: user stop",
        ),
        (
            e.CommandFailed("permission denied (cannot open '/x')"),
            "reading /x in sandbox isb failed: permission denied (cannot open '/x')",
        ),
    ],
)
def test_errors_say_what_failed_in_the_callers_terms(
    exc: e.E2BProviderError, expected: str
) -> None:
    cls = type(exc)
    assert _worded(exc) == expected
    assert type(exc) is cls  # the class (and so every except clause) is kept
    assert "process start" not in str(exc) and "{id}" not in str(exc)


def test_reword_keeps_attributes_pickles_and_words_once() -> None:
    exc = e.E2BHttpError(503, "busy", 503, error_code="x", operation="POST /sandboxes/{id}/pause")
    m.reword(exc, "suspending sandbox isb")
    m.reword(exc, "something else")
    assert str(exc).startswith("suspending sandbox isb failed: E2B answered HTTP 503: busy [x]")
    assert (exc.status, exc.code, exc.error_code) == (503, 503, "x")
    back = pickle.loads(pickle.dumps(exc))
    assert str(back) == str(exc) and back.status == 503


def test_argument_errors_and_closed_providers_are_left_as_they_are() -> None:
    for exc in (e.InvalidArgument("invalid sandbox path '/a/../b'"), e.ProviderClosed("closed")):
        text = str(exc)
        m.reword(exc, "reading /a in sandbox isb")
        assert str(exc) == text


def test_reworded_messages_are_redacted() -> None:
    secret = "e2b_messages_test_secret_0123456789"
    e.register_secret(secret)
    exc = e.TransportError("boom")
    m.reword(exc, f"reading /{secret} in sandbox isb")
    assert secret not in str(exc)


def test_describe_rewords_and_reraises_the_same_exception() -> None:
    original = e.ProtocolError("E2B process start failed: bad frame")
    with pytest.raises(e.ProtocolError) as ei, m.describe("stopping leftover commands in isb"):
        raise original
    assert ei.value is original
    assert str(original).startswith(
        "stopping leftover commands in isb failed: E2B's answer could not be read (bad frame);"
    )


def test_ambiguous_failures() -> None:
    assert m.is_ambiguous(e.TransportError("cut"))
    assert m.is_ambiguous(e.TransportTimeout("silent"))
    assert m.is_ambiguous(e.ProtocolError("bad frame"))
    assert m.is_ambiguous(e.RemoteError("internal"))
    for clear in (
        e.SandboxPaused("paused"),
        e.MissingAccessToken("no token"),
        e.CommandFailed("no"),
        e.E2BHttpError(500, "x"),
        e.Cancelled(),
        e.OperationTimeout("late"),
    ):
        assert not m.is_ambiguous(clear)


# -- KeyedLocks ---------------------------------------------------------------------------


def test_keyed_locks_exist_only_while_used() -> None:
    locks = KeyedLocks()
    for i in range(1000):
        with locks.hold(f"sandbox-{i}") as got:
            assert got and len(locks) == 1
    assert len(locks) == 0


def test_keyed_locks_serialize_one_key_only() -> None:
    locks = KeyedLocks()
    inside: List[str] = []
    entered = threading.Event()
    release = threading.Event()

    def hold_a() -> None:
        with locks.hold("a"):
            entered.set()
            release.wait(10)

    t = threading.Thread(target=hold_a)
    t.start()
    assert entered.wait(10)
    with locks.hold("b") as got:  # another key is free
        assert got
        inside.append("b")
    with locks.hold("a", timeout=0.3) as got:  # this one is not
        assert not got
    tok = CancelToken()
    tok.cancel()
    with pytest.raises(e.Cancelled):
        with locks.hold("a", cancel=tok):
            pass
    release.set()
    t.join(10)
    with locks.hold("a", timeout=5) as got:
        assert got
    assert inside == ["b"] and len(locks) == 0


# -- the emulator's stream_cut_at_end splitter --------------------------------------------


def _frame(flags: int, body: bytes) -> bytes:
    return bytes([flags]) + len(body).to_bytes(4, "big") + body


def test_trailer_cut_passes_every_message_but_the_end_of_stream() -> None:
    stream = _frame(0, b'{"event":{"start":{"pid":1}}}') + _frame(0, b'{"event":{"end":{}}}')
    stream += _frame(2, b"{}")
    for step in (1, 3, 7, len(stream)):
        cut = TrailerCut()
        out = b"".join(cut.feed(stream[i : i + step]) for i in range(0, len(stream), step))
        assert out == stream[: -len(_frame(2, b"{}"))]
        assert cut.done


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("refused: capybara-fileop-b5d6ea3e0f7749e3a7e6df1d5922f66c: /skills is writable by "
         "other users", "refused: /skills is writable by other users"),
        ("mkdir: cannot create directory '/etc/.capybara-part-60-7d867be581204697afa374638b"
         "a75f8b': Permission denied",
         "mkdir: cannot create directory a temporary file in /etc: Permission denied"),
        ("cannot remove /workspace/.capybara-part-1-ab.tmp", "cannot remove a temporary file "
         "in /workspace"),
        ("rm: /opt/capybara/upload/3f2a-11/x: busy; /tmp/.capybara-parts-sandbox/9-ab: gone",
         "rm: the staging directory: busy; the registry of temporary files: gone"),
        ("/tmp/.capybara-cmd/0123abcd/stdout.0: No space left",
         "the command records: No space left"),
        ("capybara-write: 1: cannot create /x: Permission denied",
         "cannot create /x: Permission denied"),
        ("member .capybara-end-0123 missing", "member the end of the stream missing"),
        ("/workspace/a.txt: fine", "/workspace/a.txt: fine"),
    ],
)
def test_scrub_says_internal_places_in_words(text: str, said: str) -> None:
    assert m.scrub(text) == said
    assert "capybara" not in m.scrub(text)


def test_reworded_messages_and_their_parts_hold_no_internal_names() -> None:
    part = e.UnsafePath("refused: capybara-fileop-0123: /skills is a symbolic link")
    batch = e.FilesFailed("writing 1 files in sandbox s", {"/skills/a": part})
    m.reword(batch, "writing 1 files in sandbox s")
    assert "capybara" not in str(batch) and "capybara" not in str(batch.failed["/skills/a"])
    # an UnsafePath is found in the sandbox, after I/O: it is said as what the caller asked
    refused = e.UnsafePath("refused: /skills/x is not owned by root")
    m.reword(refused, "writing /skills/x/a in sandbox s")
    assert str(refused).startswith("writing /skills/x/a in sandbox s failed: refused: ")
    # other argument errors are raised before any I/O and name the value: left alone
    bad = e.InvalidArgument("path must be absolute")
    m.reword(bad, "writing x in sandbox s")
    assert str(bad) == "path must be absolute"
