"""A Ctrl-C's traceback, cut below the library's public entry (sans-IO): the caller's frames,
the entry, and the caller's own callback frames; the same exception object; a context the
library was handling hidden, the caller's kept."""

from __future__ import annotations

import traceback
from typing import Callable, List, Optional

import pytest

from e2b_provider.core.interrupts import calls_user_code, shorten
from e2b_provider.core.messages import describe


def _frames(exc: BaseException) -> List[str]:
    return [f.name for f in traceback.extract_tb(exc.__traceback__)]


def entry(fn: Callable[[], None]) -> None:
    """A public call: its body runs in ``describe``, as the handles' calls do."""
    with describe("doing it"):
        internal_a(fn)


def internal_a(fn: Callable[[], None]) -> None:
    internal_b(fn)


def internal_b(fn: Callable[[], None]) -> None:
    callback_site(fn)


@calls_user_code
def callback_site(fn: Callable[[], None]) -> None:
    fn()


def raise_ki() -> None:
    raise KeyboardInterrupt


def test_the_traceback_ends_at_the_entry() -> None:
    def quietly() -> None:
        internal_deep()

    with pytest.raises(KeyboardInterrupt) as info:
        with describe("doing it"):
            quietly()
    assert _frames(info.value) == ["test_the_traceback_ends_at_the_entry"]


def internal_deep() -> None:
    internal_deeper()


def internal_deeper() -> None:
    raise KeyboardInterrupt


def test_the_callers_callback_frames_are_kept() -> None:
    def on_output() -> None:
        users_helper()

    def users_helper() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        entry(on_output)
    assert _frames(info.value) == [
        "test_the_callers_callback_frames_are_kept", "entry", "on_output", "users_helper"]


def test_it_is_the_same_exception_object() -> None:
    raised: List[BaseException] = []

    def remember() -> None:
        exc = KeyboardInterrupt("mine")
        raised.append(exc)
        raise exc

    with pytest.raises(KeyboardInterrupt) as info:
        with describe("doing it"):
            internal_a(remember)
    assert info.value is raised[0] and info.value.args == ("mine",)
    assert _frames(info.value) == ["test_it_is_the_same_exception_object", "remember"]


def test_other_exceptions_keep_their_traceback() -> None:
    def fail() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError) as info:
        entry(fail)
    assert _frames(info.value)[1:] == ["entry", "internal_a", "internal_b", "callback_site",
                                       "fail"]


def test_a_context_of_the_library_is_hidden_the_callers_kept() -> None:
    def interrupted_while_handling_internally() -> None:
        try:
            raise OSError("internal")
        except OSError:
            raise KeyboardInterrupt  # noqa: B904 (a Ctrl-C comes where it comes)

    with pytest.raises(KeyboardInterrupt) as info:
        with describe("doing it"):
            internal_b_plain(interrupted_while_handling_internally)
    assert isinstance(info.value.__context__, OSError)
    assert info.value.__suppress_context__
    shown = "".join(traceback.format_exception(type(info.value), info.value,
                                               info.value.__traceback__))
    assert "OSError" not in shown and "During handling" not in shown

    mine: Optional[BaseException] = None
    try:
        raise LookupError("the caller's")
    except LookupError as exc:
        mine = exc
        with pytest.raises(KeyboardInterrupt) as info:
            with describe("doing it"):
                internal_b_plain(raise_ki)
    assert info.value.__context__ is mine
    assert not info.value.__suppress_context__


def internal_b_plain(fn: Callable[[], None]) -> None:
    fn()


def test_shorten_leaves_anything_but_a_keyboard_interrupt_alone() -> None:
    try:
        internal_deeper_value_error()
    except ValueError as exc:
        before = _frames(exc)
        shorten(exc, exc.__traceback__)
        assert _frames(exc) == before


def internal_deeper_value_error() -> None:
    raise ValueError("x")


def test_the_printed_traceback_is_short() -> None:
    with pytest.raises(KeyboardInterrupt) as info:
        entry(lambda: internal_deeper())
    shown = traceback.format_exception(type(info.value), info.value, info.value.__traceback__)
    text = "".join(shown)
    assert "in internal_a" not in text and "in internal_b" not in text
    assert "in callback_site" not in text
    assert "in <lambda>" in text and "in internal_deeper" in text  # the caller's callback
