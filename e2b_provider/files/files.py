"""Files in a sandbox: read (capped), write (as the sandbox user), stat, list.

This module owns :class:`Files`, the provider's part that reads, writes and examines files
with the sandbox user's permissions: it gives each call its bound
(:data:`~e2b_provider.core.context.FILE_OP_TIMEOUT`) and hands it to the part that does the
work (:mod:`~e2b_provider.files.reads`, :mod:`~e2b_provider.files.writes`,
:mod:`~e2b_provider.files.listing`, over :mod:`~e2b_provider.files.fileops`). Arguments
arrive validated (the provider facade checks them). Every path keeps the reference's
semantics: reads and stats as user ``sandbox``; writes by ``sandbox`` (parents created by
it, the file owned by it), or by root with mode 0644 under ``/skills``.

How many requests each call costs on a warm sandbox:

* ``stat`` and a read of a small file: one ``process.Process/Start`` running a script as
  ``sandbox`` (``head -c`` prints the bytes).
* a write of up to :data:`~e2b_provider.protocol.scripts.INLINE_WRITE_MAX` bytes: one
  ``Start``; the bytes travel base64 in an argument of that request.
* a larger write: a ``Start`` (as root) that makes a FIFO in the root-only staging
  directory and says ``ready``, then one ``POST /files`` into that FIFO; on the other end
  ``runuser -u sandbox … cat > path`` (or root's ``cat`` under ``/skills``) writes the bytes
  as they arrive, through a pipe buffer enlarged to 1 MiB. Nothing is staged at rest and
  envd never opens the destination. The staging directory is made root-only (and swept of
  what killed operations left) on the provider's first large write to a sandbox, and
  again whenever it is found missing, a symlink or not root's.
* a read asking for more than :data:`~e2b_provider.protocol.scripts.LARGE_READ_MIN` bytes
  of a larger regular file: the first script says so instead of printing it; then a root
  holder opens the file *with the user's credentials* and prints its pid and descriptor,
  envd serves ``GET /files?path=/proc/<pid>/fd/<n>`` (a ``Range`` caps it; the body is read
  in one call into the bytes returned) at the wire's speed, and the holder is killed
  through envd while the body comes — which also proves it was alive while envd opened the
  descriptor, so the pid named a process of ours (see
  :meth:`~e2b_provider.files.reads.Reads._read_fast`). Without a ``python3`` in the
  template the read is streamed by ``head -c`` as before.

A file operation that ends early (cancel, timeout, Ctrl-C, a failed request) kills every
process it started — its top process is named
:data:`~e2b_provider.protocol.scripts.FILEOP_MARKER` ``<id>``, the rest are found as its
descendants, and the process envd started is killed by its pid — and removes its FIFO and
temporary files before the error reaches the caller. A transfer cut half-way is first let
end on its own (its helper refuses the short input and exits), so a cancelled write leaves
neither the new file, nor a part of it, nor anything staged. envd's processes are never
selected by tag: envd 0.6.13's lookup by tag stops at the first process with another tag,
so it misses whenever other tagged processes run.

When the answer is lost (the connection broke or went silent, or the stream could not be
read), the operation may or may not have taken effect. A write is then done once more
(its first attempt's processes stopped first): writing the same bytes again gives the same
file, so the caller gets the write's real outcome instead of an error for a write that
happened. A sandbox paused under the operation is reported as
:class:`~e2b_provider.SandboxPaused`; an answer that stopped coming within the bound, as
:class:`~e2b_provider.OperationTimeout`. A path that only *seems* missing because a
directory on the way is closed to the user is "permission denied", not None.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..cancel import CancelToken, Deadline
from ..core.context import FILE_OP_TIMEOUT, ProviderContext, script_failed, silence_is_timeout
from ..core.file_agents import FileAgents
from ..errors import CommandFailed, E2BProviderError
from ..models import DirEntry, FileContent, FileStat
from ..protocol import scripts as scripts
from .facts import STAGED, SandboxFacts
from .fileops import FileOps
from .listing import Listing
from .reads import Reads
from .writes import Writes

__all__ = ["Files"]


def _bound() -> Deadline:
    """A new file operation's deadline: :data:`FILE_OP_TIMEOUT` from now."""
    return Deadline.after(FILE_OP_TIMEOUT)


class Files:
    """Read, write, stat and list files as the sandbox user (arguments already validated).

    The work is done by its parts: :class:`~e2b_provider.files.reads.Reads`,
    :class:`~e2b_provider.files.writes.Writes` and :class:`~e2b_provider.files.listing.Listing`,
    over :attr:`ops` (the processes of each file operation, and their clean-up).
    """

    def __init__(self, ctx: ProviderContext, agents: FileAgents) -> None:
        self._ctx = ctx
        self._agents = agents
        self._facts = SandboxFacts()
        ctx.on_fork(self._facts.forget_all)
        #: Runs file operations' scripts and helpers, and cleans up after them.
        self.ops = FileOps(ctx)
        self._reads = Reads(ctx, agents, self._facts, self.ops, _bound)
        self._writes = Writes(ctx, agents, self._facts, self.ops, _bound)
        self._listing = Listing(agents, self.ops, _bound)

    # -- what a sandbox lacks -------------------------------------------------------------

    def lacks_python(self, sid: str) -> bool:
        """Whether the sandbox was found to have no ``python3`` (the file agent could not
        start there, or a helper that needs it could not run)."""
        return self._facts.lacks(sid, "python3") or self._agents.unavailable(sid) is not None

    def mark_missing(self, sid: str, tool: str) -> None:
        """Remember that the sandbox has no ``tool`` (the slower paths are taken)."""
        self._facts.mark_missing(sid, tool)

    def needs_staging(self, sid: str) -> bool:
        """Whether an upload to ``sid`` should make the staging directory root-only (and
        sweep it) first: this provider has not done so yet, or lost track."""
        return not self._facts.known(sid, STAGED)

    def staged(self, sid: str, ok: bool) -> None:
        """Note that an upload's helper found (``ok``) or could not make the staging
        directory."""
        if ok:
            self._facts.remember(sid, STAGED)
        else:
            self._facts.forget(sid, STAGED)

    # -- the operations -------------------------------------------------------------------

    def read(
        self, sid: str, path: str, max_bytes: int, cancel: Optional[CancelToken]
    ) -> Optional[FileContent]:
        """The file's first ``max_bytes`` (None: missing or a directory)."""
        return self._reads.read(sid, path, max_bytes, cancel)

    def read_many(
        self,
        sid: str,
        paths: List[str],
        max_bytes: int,
        cancel: Optional[CancelToken],
    ) -> Tuple[Dict[str, Optional[FileContent]], Dict[str, CommandFailed]]:
        """Read every path (at most ``max_bytes`` each): the contents (None: missing or a
        directory) and the failures, by path."""
        return self._reads.read_many(sid, paths, max_bytes, cancel)

    def stat(self, sid: str, path: str, cancel: Optional[CancelToken]) -> Optional[FileStat]:
        """The file's size and kind (None: missing)."""
        return self._reads.stat(sid, path, cancel)

    def write(self, sid: str, path: str, payload: bytes, cancel: Optional[CancelToken]) -> None:
        """Write ``payload`` to ``path`` (atomically)."""
        self._writes.write(sid, path, payload, cancel)

    def write_many(
        self,
        sid: str,
        files: List[Tuple[str, bytes]],
        cancel: Optional[CancelToken],
    ) -> Dict[str, E2BProviderError]:
        """Write every file (each atomically); the failures, by path (empty: all written)."""
        return self._writes.write_many(sid, files, cancel)

    def list_dir(
        self, sid: str, path: str, depth: int, cancel: Optional[CancelToken]
    ) -> Optional[List[DirEntry]]:
        """The entries below ``path`` down to ``depth`` levels, as the sandbox user sees
        them; None when ``path`` does not exist."""
        return self._listing.list_dir(sid, path, depth, cancel)

    def sweep(self, sid: str, cancel: Optional[CancelToken]) -> None:
        """Kill every file operation's processes in the sandbox and remove staged FIFOs."""
        deadline = _bound()
        args = scripts.fileop_cleanup_args("")
        with silence_is_timeout():
            r = self._ctx.on_target(
                sid, cancel,
                lambda t: self.ops.run(t, scripts.ROOT_USER, args, cancel, deadline,
                                       marked=False),
            )
        if r.exit_code != 0:
            raise script_failed("the clean-up script failed", r)


    def forget(self, sid: str) -> None:
        """Drop what is kept about a sandbox that is being paused or destroyed."""
        self._agents.forget(sid)

    def close(self) -> None:
        """End the file agent sessions (the provider is closing)."""
        self._agents.close()
