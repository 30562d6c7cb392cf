"""What the parts of the file operations share.

This module owns :class:`FilePart`, the base of :class:`~e2b_provider.files.reads.Reads`,
:class:`~e2b_provider.files.writes.Writes` and :class:`~e2b_provider.files.listing.Listing`
(which :class:`~e2b_provider.files.files.Files` brings together): the provider's context,
the file agents, what is known about each sandbox, the processes of each file operation,
and each operation's bound (:data:`~e2b_provider.core.context.FILE_OP_TIMEOUT_SECONDS`).
"""

from __future__ import annotations

from ..cancel import Deadline
from ..core.context import FILE_OP_TIMEOUT_SECONDS, ProviderContext
from ..core.file_agents import FileAgents
from .facts import SandboxFacts
from .fileops import FileOps


class FilePart:
    """The state every part of the file operations works with."""

    def __init__(self, ctx: ProviderContext, agents: FileAgents) -> None:
        self._ctx = ctx
        self._agents = agents
        self._facts = SandboxFacts()
        ctx.on_fork(self._facts.forget_all)
        #: Runs file operations' scripts and helpers, and cleans up after them.
        self.ops = FileOps(ctx)

    @staticmethod
    def _bound() -> Deadline:
        """A new file operation's deadline: :data:`FILE_OP_TIMEOUT_SECONDS` from now."""
        return Deadline.after(FILE_OP_TIMEOUT_SECONDS)
