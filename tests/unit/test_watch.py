"""The watch's message parsing and its iterator over a scripted stream (no sockets).

Covered: envd's ``WatchDir`` messages (enum names and numbers, unknown types skipped, bad
shapes refused), absolute paths (a name leading outside the watched directory is refused),
identical neighbours in one read merged (not across reads), the end after the watched
directory's own removal, a watcher error as ``overflow`` with the watch set up again before
the event is handed out, the restart bound, and a stream cut without its end message.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional

import pytest

from e2b_provider import FileEvent, PathNotFound, ProtocolError, RemoteError
from e2b_provider._watchdog import Watchdog
from e2b_provider.files.watch import MAX_RESTARTS, Watch, event_path, parse_message
from e2b_provider.protocol.connect import encode_envelope


def test_messages() -> None:
    assert parse_message({"start": {}}) == ("start", None)
    assert parse_message({"keepalive": {}}) == ("keepalive", None)
    ev = {"filesystem": {"name": "a/b.txt", "type": "EVENT_TYPE_WRITE"}}
    assert parse_message(ev) == ("event", ("write", "a/b.txt"))
    for number, kind in ((1, "create"), (2, "write"), (3, "remove"), (4, "rename"),
                         (5, "chmod")):
        assert parse_message({"filesystem": {"name": "x", "type": number}}) == (
            "event", (kind, "x"))
    # the directory itself has no name on the wire when it is ""; unknown kinds are skipped
    assert parse_message({"filesystem": {"type": "EVENT_TYPE_REMOVE"}}) == ("event", ("remove", ""))
    assert parse_message({"filesystem": {"name": "x", "type": "EVENT_TYPE_NEW"}}) == ("other", None)
    assert parse_message({"filesystem": {"name": "x"}}) == ("other", None)
    assert parse_message({"something": {}}) == ("other", None)
    for bad in ([], {"filesystem": []}, {"filesystem": {"name": 5, "type": 1}}):
        with pytest.raises(ProtocolError):
            parse_message(bad)


def test_paths() -> None:
    assert event_path("/w", ".") == "/w" and event_path("/w", "") == "/w"
    assert event_path("/w", "a") == "/w/a"
    assert event_path("/w", "a/b/c.txt") == "/w/a/b/c.txt"
    assert event_path("/", "etc") == "/etc"
    assert event_path("/w", "x\ufffdy") == "/w/x\ufffdy"  # a name that was not UTF-8
    for bad in ("../x", "a/../../x", "..", "/etc/passwd", "a\x00b"):
        with pytest.raises(ProtocolError, match="not a path inside"):
            event_path("/w", bad)


class FakeStream:
    """Scripted reads; ``abort`` makes the next read fail as an aborted stream's does."""

    def __init__(self, chunks: List[bytes]) -> None:
        self.chunks = list(chunks)
        self.aborted = False
        self.closed = False

    def read1(self, n: int) -> bytes:
        if self.aborted:
            from e2b_provider import TransportError

            raise TransportError("stream aborted")
        return self.chunks.pop(0) if self.chunks else b""

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed = True


class FakeCtx:
    closed = False

    def __init__(self) -> None:
        self.watchdog = Watchdog()

    def closed_error(self) -> None:
        return None

    def fate_during(self, *args: Any) -> Optional[str]:
        return None


class FakeOwner:
    def __init__(self) -> None:
        self._ctx = FakeCtx()
        self._files = None


def fs(name: str, kind: str) -> bytes:
    return encode_envelope({"filesystem": {"name": name, "type": f"EVENT_TYPE_{kind}"}})


def end(code: Optional[str] = None, message: str = "") -> bytes:
    body = {"error": {"code": code, "message": message}} if code else {}
    return encode_envelope(body, end_stream=True)


@pytest.fixture
def make() -> Iterator[Any]:
    owners: List[FakeOwner] = []

    def build(*streams: List[bytes]) -> Watch:
        owner = FakeOwner()
        owners.append(owner)
        w = Watch(owner, "isb", "/w", False, None, None, "watching /w in sandbox isb")  # type: ignore[arg-type]
        scripted = [FakeStream(s) for s in streams]
        opened: List[FakeStream] = []

        def open_next() -> None:
            stream = scripted.pop(0)
            opened.append(stream)
            from e2b_provider.clients.envd_streams import WatchStream

            w._stream = WatchStream(stream)  # type: ignore[arg-type]

        w._open = open_next  # type: ignore[method-assign]
        w._touch_lease = lambda: None  # type: ignore[method-assign]
        w.opened = opened  # type: ignore[attr-defined]
        w.start()
        return w

    yield build
    for owner in owners:
        owner._ctx.watchdog.close()


def test_identical_neighbours_of_one_read_are_merged(make: Any) -> None:
    w = make([fs("a", "WRITE") + fs("a", "WRITE") + fs("a", "WRITE") + fs("b", "WRITE")
              + fs("a", "WRITE"), fs("a", "WRITE"), end("deadline_exceeded", "late")])
    w._timeout = 1.0  # a deadline_exceeded end is the end of a watch with a timeout
    got = list(w)
    assert got == [
        FileEvent("write", "/w/a"), FileEvent("write", "/w/b"), FileEvent("write", "/w/a"),
        FileEvent("write", "/w/a"),  # a later read: a new write
    ]


def test_the_watch_ends_after_its_own_directory_went(make: Any) -> None:
    w = make([fs("x", "CREATE") + fs(".", "REMOVE") + fs("y", "CREATE")])
    assert list(w) == [FileEvent("create", "/w/x"), FileEvent("remove", "/w")]
    assert w.opened[0].closed


def test_a_watcher_error_is_an_overflow_and_the_watch_is_set_up_again_first(make: Any) -> None:
    first = [fs("a", "CREATE") + end("internal", "watcher error: fsnotify: queue or buffer "
                                     "overflow")]
    second = [fs("b", "CREATE"), end("internal", "watcher error: boom")]
    third = [end("not_found", "path /w not found: stat /w: no such file or directory")]
    w = make(first, second, third)
    assert next(w) == FileEvent("create", "/w/a")
    assert len(w.opened) == 2  # set up again before the overflow is handed out
    assert next(w) == FileEvent("overflow", "/w")
    assert next(w) == FileEvent("create", "/w/b")
    assert next(w) == FileEvent("overflow", "/w")
    with pytest.raises(PathNotFound) as info:  # the directory went meanwhile
        next(w)
    assert str(info.value) == "watching /w in sandbox isb failed: /w does not exist"


def test_a_watch_that_keeps_failing_gives_up(make: Any) -> None:
    broken = [end("internal", "watcher error: no space left on device")]
    w = make(*([broken] * (MAX_RESTARTS + 2)))
    got = []
    with pytest.raises(RemoteError) as info:
        for event in w:
            got.append(event)
    assert got == [FileEvent("overflow", "/w")] * MAX_RESTARTS
    assert "no space left on device" in str(info.value)
    assert str(info.value).startswith("watching /w in sandbox isb failed: ")


def test_a_stream_cut_without_its_end_is_a_protocol_error(make: Any) -> None:
    w = make([fs("a", "CREATE") + fs("b", "CREATE")[:4]])
    assert next(w) == FileEvent("create", "/w/a")
    with pytest.raises(ProtocolError):
        next(w)


def test_a_name_outside_the_directory_is_refused(make: Any) -> None:
    w = make([fs("../../etc/shadow", "WRITE")])
    with pytest.raises(ProtocolError, match="not a path inside the watched directory /w"):
        next(w)


def test_close_stops_the_iteration(make: Any) -> None:
    w = make([fs("a", "CREATE")])
    w.close()
    assert list(w) == []
    w.close()  # idempotent
