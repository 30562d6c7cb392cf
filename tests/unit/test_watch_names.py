"""The library's own files in a watch (sans-IO): hidden, and a staged write said as a write
of its target, as envd says a direct one."""

from __future__ import annotations

from typing import List, Tuple

from e2b_provider.files.watch_names import MAX_STAGED, OwnNames, is_internal

PART = ".capybara-part-9-cb21a604d304"


def feed(own: OwnNames, events: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    out: List[Tuple[str, str]] = []
    for kind, name in events:
        out.extend(own.events(kind, name))  # type: ignore[arg-type]
    return out


def test_a_staged_write_is_said_as_the_targets_create_and_write() -> None:
    # what envd reports for write_file(new.txt): the staging file, then its move onto new.txt
    got = feed(OwnNames("/workspace"), [
        ("create", PART), ("write", PART), ("chmod", PART), ("rename", PART),
        ("create", "new.txt"),
    ])
    assert got == [("create", "new.txt"), ("write", "new.txt")]


def test_an_empty_staged_file_and_a_staged_directory_are_a_create_only() -> None:
    own = OwnNames("/w")
    assert feed(own, [("create", PART), ("rename", PART), ("create", "empty")]) == [
        ("create", "empty")]
    tree = [("create", PART), (
        "create", f"{PART}/a.txt"), ("write", f"{PART}/a.txt"), ("rename", PART),
        ("create", "tree")]
    assert feed(own, tree) == [("create", "tree")]


def test_staged_writes_in_subdirectories_of_a_recursive_watch() -> None:
    own = OwnNames("/w")
    got = feed(own, [("create", f"d/{PART}"), ("write", f"d/{PART}"),
                     ("rename", f"d/{PART}"), ("create", "d/x")])
    assert got == [("create", "d/x"), ("write", "d/x")]


def test_a_create_elsewhere_after_a_staging_rename_is_only_itself() -> None:
    own = OwnNames("/w")
    got = feed(own, [("write", PART), ("rename", PART), ("create", "other/x"),
                     ("create", "y")])
    assert got == [("create", "other/x"), ("create", "y")]


def test_the_users_events_pass_unchanged() -> None:
    events = [("create", "a.txt"), ("write", "a.txt"), ("chmod", "a.txt"),
              ("rename", "a.txt"), ("create", "b.txt"), ("remove", "b.txt"),
              ("create", ".capybara"), ("write", "capybara-part-1")]
    assert feed(OwnNames("/w"), events) == events


def test_every_internal_name_is_hidden_but_in_a_watch_of_it() -> None:
    assert is_internal("/tmp", ".capybara-exec-1234")
    assert is_internal("/tmp", ".capybara-parts-sandbox/9-ab")
    assert is_internal("/tmp", ".capybara-commit-ab")
    assert is_internal("/tmp", ".capybara-cmd/ab/out")
    assert is_internal("/workspace", "d/.capybara-end-ab")
    assert is_internal("/opt", "capybara/upload/x")
    assert not is_internal("/opt/capybara/upload", "x")
    assert not is_internal("/tmp/.capybara-cmd", "ab/out")  # the user watches it
    assert not is_internal("/tmp", "capybara-exec")
    assert feed(OwnNames("/tmp"), [("create", ".capybara-exec-1"), ("remove",
                                   ".capybara-exec-1")]) == []


def test_what_is_remembered_of_staging_files_is_bounded() -> None:
    own = OwnNames("/w")
    feed(own, [("write", f".capybara-part-{i}") for i in range(MAX_STAGED + 50)])
    assert len(own._written) == MAX_STAGED
    # the oldest were forgotten: their move-in is a create only
    assert feed(own, [("rename", ".capybara-part-0"), ("create", "a")]) == [("create", "a")]
    last = f".capybara-part-{MAX_STAGED + 49}"
    assert feed(own, [("rename", last), ("create", "b")]) == [("create", "b"), ("write", "b")]
    assert len(own._written) == MAX_STAGED - 1
