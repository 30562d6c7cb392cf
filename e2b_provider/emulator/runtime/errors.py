"""Errors of the emulator's sandbox runtime.

This module owns the exceptions every runtime module raises: :class:`SandboxRuntimeError` (a
sandbox could not be booted, frozen, thawed, halted or destroyed) and its subclass
:class:`IsolationUnavailable` (this host cannot isolate sandboxes). Standard library only.
"""

from __future__ import annotations

__all__ = ["IsolationUnavailable", "SandboxRuntimeError"]


class SandboxRuntimeError(RuntimeError):
    """A sandbox could not be booted, frozen, thawed, halted or destroyed."""


class IsolationUnavailable(SandboxRuntimeError):
    """This host cannot isolate sandboxes; the message says what is missing and how to fix it."""
