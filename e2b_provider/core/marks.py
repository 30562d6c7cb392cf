"""Bounded memories of sandboxes: the least recently marked dropped first.

This module owns :func:`remember`, the one way the provider keeps a mark per sandbox (a
pause, a reboot, a lease, a missing program...) in an ordered dict of bounded size.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, TypeVar

__all__ = ["remember"]

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


def remember(marks: OrderedDict[_K, _V], key: _K, value: _V, most: int) -> None:
    """Set ``marks[key]`` to ``value`` as the most recent mark, then drop the oldest marks
    until at most ``most`` are left (the caller holds the lock guarding ``marks``)."""
    marks[key] = value
    marks.move_to_end(key)
    while len(marks) > most:
        marks.popitem(last=False)
