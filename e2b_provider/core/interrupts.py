"""A Ctrl-C's traceback as the caller needs it: their own frames and the library's entry.

A ``KeyboardInterrupt`` lands wherever the calling thread was: most often deep in a socket
read, under the run engine, the stream reader, the transport, urllib3 and ``http.client``.
Once the library has done what an interrupt asks (the remote command killed, bounded), the
same exception object goes on to the caller, with its traceback cut below the public call it
went through (:func:`shorten`): the caller's frames, the library's entry (the line of the
public method that was running), and the caller's own code the library was calling back when
the interrupt came (an ``on_stdout`` callback, say: see :func:`calls_user_code`). A context
the library itself was handling when the interrupt came is hidden (still in ``__context__``);
one the caller was handling is kept.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType, TracebackType
from typing import Callable, Optional, Set, TypeVar

__all__ = ["calls_user_code", "caller_handling", "shorten", "shorten_in_generator"]

_F = TypeVar("_F", bound=Callable[..., object])

#: The code of the library's functions that call the caller's code (callbacks): the frames
#: below them in a traceback are the caller's, and are kept.
_USER_CODE_CALLERS: Set[CodeType] = set()


def calls_user_code(fn: _F) -> _F:
    """Mark ``fn`` as a function that calls the caller's code (a callback): a Ctrl-C's
    traceback keeps the frames below it. Returns ``fn`` unchanged."""
    code = getattr(fn, "__code__", None)
    if isinstance(code, CodeType):
        _USER_CODE_CALLERS.add(code)
    return fn


def caller_handling() -> Optional[BaseException]:
    """The exception the calling code is handling (``sys.exc_info()``), if any: the context
    a Ctrl-C's traceback keeps (see :func:`shorten`)."""
    return sys.exc_info()[1]


def shorten(
    exc: BaseException, entry: Optional[TracebackType], outer: Optional[BaseException] = None
) -> None:
    """Cut the traceback of a ``KeyboardInterrupt`` below ``entry``, in place.

    Args:
        exc: the exception going on to the caller; only a ``KeyboardInterrupt`` is changed.
        entry: the traceback entry of the library's public entry (the frame whose line
            shows the call the caller made); the entries below it are dropped, but for the
            caller's own code reached through a :func:`calls_user_code` function.
        outer: the exception the caller was handling when it called the library: the
            context kept; another context (the library's own) is hidden.
    """
    if not isinstance(exc, KeyboardInterrupt) or entry is None:
        return
    tail: Optional[TracebackType] = None
    below = entry.tb_next
    while below is not None:
        if below.tb_frame.f_code in _USER_CODE_CALLERS:
            tail = below.tb_next
            break
        below = below.tb_next
    entry.tb_next = tail
    if exc.__context__ is not None and exc.__context__ is not outer:
        exc.__suppress_context__ = True


def shorten_in_generator(
    exc: BaseException, here: Optional[FrameType], outer: Optional[BaseException] = None
) -> None:
    """:func:`shorten` for a ``contextlib.contextmanager`` generator (frame ``here``) that
    the public entry runs its body in: the entry is the frame the ``with`` statement is in
    (the entry after the generator's own in the traceback)."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame is here:
        tb = tb.tb_next
    shorten(exc, tb, outer)
