"""Files in a sandbox: read (capped), write (as the sandbox user), stat, list.

This module owns :class:`Files`, the provider's part that reads, writes and examines files
with the sandbox user's permissions. It brings its parts together
(:mod:`~e2b_provider.files.reads`, :mod:`~e2b_provider.files.writes`,
:mod:`~e2b_provider.files.listing`, over :mod:`~e2b_provider.files.fileops`; each call
bound by :data:`~e2b_provider.core.context.FILE_OP_TIMEOUT_SECONDS`) and owns what concerns a whole
sandbox: what it lacks, its staging directory, the sweep of its file operations. Arguments
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

from typing import Optional

from ..cancel import CancelToken
from ..core.context import script_failed, silence_is_timeout
from ..protocol import scripts as scripts
from .facts import STAGED
from .listing import Listing
from .reads import Reads
from .writes import Writes

__all__ = ["Files"]


class Files(Reads, Writes, Listing):
    """Read, write, stat and list files as the sandbox user (arguments already validated).

    Its parts do the work: :class:`~e2b_provider.files.reads.Reads` (``read``,
    ``read_many``, ``stat``), :class:`~e2b_provider.files.writes.Writes` (``write``,
    ``write_many``) and :class:`~e2b_provider.files.listing.Listing` (``list_dir``), over
    :attr:`ops` (the processes of each file operation, and their clean-up).
    """

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

    # -- the whole sandbox ----------------------------------------------------------------

    def sweep(self, sid: str, cancel: Optional[CancelToken]) -> None:
        """Kill every file operation's processes in the sandbox and remove staged FIFOs."""
        deadline = self._bound()
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
