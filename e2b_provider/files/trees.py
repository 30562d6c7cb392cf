"""Whole trees (or single files) moved between this machine and a sandbox as tar streams.

This module owns :class:`Trees`, the provider's part behind ``upload`` and ``download``.
The two ends of each stream on this machine are its neighbours:
:func:`~e2b_provider.files.upload_plan.plan_upload` and
:func:`~e2b_provider.files.tar_codec.tar_stream` (a local file or directory walked without
following symbolic links, written as a POSIX tar stream piece by piece, so memory stays
flat whatever the size and the number of files; each entry opened through directory
descriptors, never through a link, and checked to be what was planned: what is not any
more is left out), and :func:`~e2b_provider.files.local_extract.extract_stream` (a tar
stream from the sandbox written under the local target by the rules of :mod:`tarfile`'s
``data`` filter: no absolute names, no ``..``, no device, and no link leading outside the
target in the finished tree — the sandbox is not trusted).

In the sandbox the other end is :mod:`e2b_provider.sandbox_side.file_agent`:

* upload: a root helper makes a FIFO in the root-only staging directory and says
  ``ready``; envd's ``POST /files`` streams the tar into it, and the agent's ``extract``
  (as ``sandbox``, or as root under ``/skills``) writes each file to a temporary name in its
  own directory and renames it into place once whole. The stream ends with a member named
  by a random marker, so a cut upload is never taken for a complete one. Two requests,
  whatever the number of files.
* download: the agent's ``pack`` (as ``sandbox``) writes the tar to its standard output,
  read here as it arrives. One request.

Both are file operations: cancelled, timed out or interrupted, every process they started
in the sandbox is killed and their FIFO removed before the error is raised.
"""

from __future__ import annotations

import json
import posixpath
import re
import tarfile
import uuid
from typing import (
    Any,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
)

import attrs

from ..cancel import CancelToken, Deadline
from ..core.context import ProviderContext
from ..core.messages import script_reason
from ..errors import (
    CommandFailed,
    E2BHttpError,
    E2BProviderError,
    ProtocolError,
    UnsafePath,
)
from ..models import Target, TransferSummary
from ..protocol import scripts as scripts
from ..protocol.boot import python_argv
from ..sandbox_side import packed
from .answers import ACCESS_HINT, unsafe_path
from .files import Files
from .helper import Helper
from .local_extract import extract_stream
from .tar_codec import Chunks, Progress, read_upto, tar_length, tar_stream
from .upload_plan import SKIP, Unsent, UploadPlan, opened_entries, plan_upload

__all__ = [
    "Trees",
    "tree_bound",
]


#: A tree transfer may take this long, plus :data:`_MIN_RATE` seconds per byte.
_BASE_SECONDS = 120.0
_MIN_RATE = float(1 << 20)


def tree_bound(total_bytes: int) -> float:
    """Seconds a transfer of ``total_bytes`` of content may take in all."""
    return _BASE_SECONDS + max(0, total_bytes) / _MIN_RATE


class Trees:
    """Upload and download files and directory trees (arguments already validated)."""

    def __init__(self, ctx: ProviderContext, files: Files) -> None:
        self._ctx = ctx
        self._files = files

    def upload(
        self,
        sid: str,
        local_path: str,
        remote_path: str,
        *,
        exclude: Sequence[str],
        cancel: Optional[CancelToken],
        progress: Optional[Progress],
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
        """Send ``local_path`` to ``remote_path``; what was written, and the entries the
        sandbox refused (each ``{"path", "message", ...}``)."""
        single_name = posixpath.basename(remote_path)
        plan = plan_upload(local_path, single_name, exclude)
        dest = remote_path if plan.is_dir else posixpath.dirname(remote_path) or "/"
        skills = scripts.is_skills_path(dest)
        if skills and self._files.lacks_python(sid):
            return self._upload_by_files(sid, plan, dest, cancel, progress)
        deadline = Deadline.after(tree_bound(plan.total))
        try:
            return self._ctx.on_target(
                sid, cancel,
                lambda t: self._upload(t, plan, dest, cancel, deadline, progress),
                need=min(86400.0, tree_bound(plan.total)),
            )
        except _NoPython:
            self._files.mark_missing(sid, "python3")
            return self._upload_by_files(sid, plan, dest, cancel, progress)

    def _upload_by_files(
        self,
        sid: str,
        plan: UploadPlan,
        dest: str,
        cancel: Optional[CancelToken],
        progress: Optional[Progress],
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
        """An upload under ``/skills`` without ``python3`` (whose extractor applies root's
        rules to a tree): each regular file written as :meth:`Files.write` writes one
        there (same rules, each whole); symbolic links and empty directories are reported
        as not written."""
        refused: List[Dict[str, Any]] = []
        unsent = Unsent()
        files = dirs = 0
        done = 0
        parents = {posixpath.dirname(i.rel) for i in plan.items if not i.is_dir}
        if progress is not None:
            progress(0, plan.total)
        walk = opened_entries(plan, unsent)  # each file read as the stream reads it
        try:
            for item, fd in walk:
                path = posixpath.join(dest, item.rel) if item.rel else dest
                if fd == SKIP:
                    continue
                if item.is_dir:
                    if item.rel in parents or any(p.startswith(item.rel + "/")
                                                  for p in parents):
                        dirs += 1
                        continue
                    why = "an empty directory under /skills needs python3 in the sandbox"
                elif item.link:
                    why = "a symbolic link under /skills needs python3 in the sandbox"
                else:
                    data = read_upto(fd, item.size + 1)
                    if len(data) < item.size:  # whole or not at all
                        refused.append({"path": path, "message": "not sent: it shrank while "
                                        "it was uploaded"})
                        continue
                    try:
                        self._files.write(sid, path, data[: item.size], cancel)
                    except (CommandFailed, UnsafePath) as exc:
                        refused.append({"path": path, "message": str(exc)})
                        continue
                    files += 1
                    done += item.size
                    if progress is not None:
                        progress(done, plan.total)
                    continue
                refused.append({"path": path, "message": f"not written: {why}"})
        finally:
            walk.close()
        summary = TransferSummary(files=files, dirs=dirs, symlinks=0, bytes=done)
        return summary, unsent.failures(dest) + refused

    def _upload(
        self,
        target: Target,
        plan: UploadPlan,
        dest: str,
        cancel: Optional[CancelToken],
        deadline: Deadline,
        progress: Optional[Progress],
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
        fifo = scripts.staging_path()
        op_id = uuid.uuid4().hex
        end = ".capybara-end-" + uuid.uuid4().hex
        skills = scripts.is_skills_path(dest)
        bound = f"{max(1.0, deadline.remaining()) + 60.0:.0f}"
        sid = target.sandbox_id
        settle_s = min(5.0, self._ctx.bounds.kill)
        argv = ["timeout", "-k", "5", bound, "/bin/sh",
                *scripts.tree_upload_args(dest, fifo, end, skills, op_id, packed("file_agent"),
                                          prepare=self._files.needs_staging(sid))]

        def body(helper: Helper) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
            length = tar_length(plan, end)  # while the sandbox makes the FIFO
            unsent = Unsent()
            ready = helper.first_line() == b"ready"
            self._files.staged(sid, ready)
            if not ready:
                helper.finish()
                if skills and helper.exit_code == scripts.MISSING_TOOL_EXIT:
                    raise _NoPython()
                raise _helper_failed("the upload could not start", helper, dest)
            helper.posted = True
            try:
                helper.envd.upload_stream(
                    fifo,
                    tar_stream(plan, end, progress=progress, cancel=helper.guard,
                               unsent=unsent),
                    user=scripts.ROOT_USER,
                    cancel=helper.guard,
                    timeout=max(1.0, deadline.remaining()),
                    length=length,
                )
            except E2BHttpError as exc:
                if exc.status == 502:
                    raise
                helper.finish()
                raise _upload_failed(f"the upload was refused: HTTP {exc.status}", helper,
                                     dest) from None
            except Exception:
                # cut (a cancel, the bound, a broken connection): if all of it had gone,
                # the upload is done
                if not (helper.settle(settle_s) and helper.exit_code == 0):
                    raise
                summary = _summary(helper)
                if summary is None or not summary.get("complete"):
                    raise
                return _outcome(plan, summary, helper, dest, unsent)
            helper.finish()
            summary = _summary(helper)
            if summary is None or not summary.get("complete"):
                raise _upload_failed("the upload did not arrive whole", helper, dest)
            return _outcome(plan, summary, helper, dest, unsent)

        return self._files.ops.helped(target, op_id, argv, fifo, cancel, deadline, body)

    def download(
        self,
        sid: str,
        remote_path: str,
        local_path: str,
        *,
        exclude: Sequence[str],
        max_bytes: int,
        cancel: Optional[CancelToken],
        progress: Optional[Progress],
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
        """Fetch ``remote_path`` to ``local_path``; what was written, and the entries the
        sandbox could not read."""
        deadline = Deadline.after(tree_bound(max_bytes))

        def run(shell: bool) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
            # the lease is asked to last the base bound only: how much comes is not known
            # yet (a lease that would end sooner is renewed first)
            return self._ctx.on_target(
                sid, cancel,
                lambda t: self._download(t, remote_path, local_path, exclude, max_bytes,
                                         cancel, deadline, progress, shell),
                need=_BASE_SECONDS,
            )

        if self._files.lacks_python(sid):
            return run(True)
        try:
            return run(False)
        except _NoPython:
            self._files.mark_missing(sid, "python3")
            return run(True)

    def _download(
        self,
        target: Target,
        remote_path: str,
        local_path: str,
        exclude: Sequence[str],
        max_bytes: int,
        cancel: Optional[CancelToken],
        deadline: Deadline,
        progress: Optional[Progress],
        shell: bool = False,
    ) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
        """``shell``: GNU ``tar`` packs the tree
        (:data:`~e2b_provider.protocol.scripts.PACK_SCRIPT`), for a sandbox without ``python3``;
        else the file agent's ``pack``."""
        op_id = uuid.uuid4().hex
        if shell:
            args = scripts.pack_args(remote_path, exclude)
            argv = ["/bin/sh", args[0], args[1], scripts.fileop_name(op_id), *args[3:]]
        else:
            argv = python_argv("capybara-pack", packed("file_agent"), "pack",
                                       remote_path, scripts.fileop_name(op_id), *exclude)

        def body(helper: Helper) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
            reader = Chunks(helper.next_output)
            line = reader.read_line(64 * 1024)
            try:
                head = json.loads(line.decode("utf-8", "surrogateescape"))
            except ValueError:
                head = None
            if not isinstance(head, dict):
                helper.finish()
                if not shell and helper.exit_code in (126, 127):
                    raise _NoPython()
                raise _pack_failed(remote_path, helper, None)
            if "absent" in head:
                helper.finish()
                raise _pack_failed(remote_path, helper, head["absent"])
            refused: List[Dict[str, Any]] = []

            def shrank() -> List[str]:
                helper.finish()
                return shrank_members(helper.stderr_lines())

            try:
                summary = extract_stream(
                    reader.read, local_path, single=bool(head.get("single")),
                    max_bytes=max_bytes, refused=refused, progress=progress,
                    total=_int(head.get("total")), settle=shrank if shell else None,
                )
            except tarfile.TarError as exc:  # the stream ended early, or is not a tar
                helper.finish()
                if helper.exit_code in (0, 1):  # the packer says it finished: its output lies
                    raise CommandFailed(
                        f"the download of {remote_path} failed: the sandbox sent a malformed "
                        f"archive ({exc})"
                    ) from None
                raise _pack_failed(remote_path, helper, None) from None
            helper.finish()
            if shell:  # tar's status: 2 when some entries could not be read
                if helper.exit_code not in (0, 1, 2):
                    raise _pack_failed(remote_path, helper, None)
                return summary, _unread(helper, remote_path) + refused
            tail = _stderr_json(helper) or {}
            if helper.exit_code not in (0, 1):
                raise _pack_failed(remote_path, helper, None)
            return summary, list(tail.get("errors") or []) + refused

        return self._files.ops.helped(
            target, op_id, argv, "", cancel, deadline, body, user=scripts.SANDBOX_USER
        )


def _outcome(
    plan: UploadPlan, summary: Dict[str, Any], helper: Helper, dest: str, unsent: Unsent
) -> Tuple[TransferSummary, List[Dict[str, Any]]]:
    """What a complete upload wrote, and the entries not sent (``unsent``) or that the
    sandbox refused."""
    if summary.get("whole"):  # a new destination, written as one: all that was sent is there
        return unsent.less(plan.summary()), unsent.failures(dest)
    if summary.get("merged"):  # merged into what was there by the shell: E lines refused
        said = helper.outcome().stdout.splitlines()
        refused = [
            {"path": posixpath.join(dest, line[2:].decode("utf-8", "surrogateescape")),
             "message": "not written: something there could not be replaced by it"}
            for line in said if line.startswith(b"E ")
        ]
        whole = unsent.less(plan.summary())
        return (attrs.evolve(whole, files=max(0, whole.files - len(refused))),
                unsent.failures(dest) + refused)
    refused = []
    for e in summary.get("errors") or []:
        if isinstance(e, dict) and isinstance(e.get("path"), str) and not e["path"].startswith(
            "/"
        ):  # the extractor names a member by its path in the tree
            e = dict(e, path=posixpath.join(dest, e["path"].rstrip("/")))
        refused.append(e)
    return _transfer(summary), unsent.failures(dest) + refused


class _NoPython(Exception):
    """The sandbox has no ``python3``, which this path needs: take the shell's."""


#: What ``find`` or ``tar`` says of an entry it could not read: ``find: './x': reason`` or
#: ``tar: x: Cannot open: reason``.
_UNREAD = re.compile(r"(?:find: '\./(.*)'|tar: (.*?)(?:: Cannot \w+)?): ([^:]+)")


def _unread(helper: Helper, remote_path: str) -> List[Dict[str, Any]]:
    """The entries :data:`~e2b_provider.protocol.scripts.PACK_SCRIPT` reported as not read, as the
    file agent's ``pack`` reports them (``{"path", "message"}``)."""
    out: List[Dict[str, Any]] = []
    for line in helper.stderr_lines():
        m = _UNREAD.fullmatch(line.decode("utf-8", "surrogateescape").strip())
        if m is None or "Exiting with failure" in line.decode("utf-8", "replace"):
            continue
        rel = m.group(1) if m.group(1) is not None else m.group(2)
        said = m.group(3)
        shrank = _SHRANK.fullmatch(m.group(0))
        if shrank is not None:  # not written: what was there stays
            rel, said = shrank.group(1), "the file shrank while it was read"
        out.append({"path": posixpath.join(remote_path, rel), "message": said})
    return out


#: What GNU ``tar`` says of a file that shrank while it was read.
_SHRANK = re.compile(r"(?:[^:]*/)?tar: (.*): File shrank by [0-9]+ bytes; padding with zeros")


def shrank_members(stderr_lines: Sequence[bytes]) -> List[str]:
    """The members GNU ``tar`` (:data:`~e2b_provider.protocol.scripts.PACK_SCRIPT`'s) says it sent
    padded with zeros (they shrank while it read them), from its standard error."""
    out = []
    for line in stderr_lines:
        m = _SHRANK.fullmatch(line.decode("utf-8", "surrogateescape").strip())
        if m is not None:
            out.append(m.group(1))
    return out


def _stderr_json(helper: Helper) -> Optional[Dict[str, Any]]:
    """The last line of the helper's standard error, as a JSON object (or None)."""
    lines = helper.stderr_lines()
    if not lines:
        return None
    try:
        value = json.loads(lines[-1].decode("utf-8", "surrogateescape"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _summary(helper: Helper) -> Optional[Dict[str, Any]]:
    for line in reversed(helper.outcome().stdout.splitlines()):
        try:
            value = json.loads(line.decode("utf-8", "surrogateescape"))
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _refusal(helper: Helper) -> Optional[E2BProviderError]:
    """The error for an upload the sandbox refused as a whole (``/skills`` rules), if so."""
    summary = _summary(helper)
    if summary is None or not summary.get("refused"):
        return None
    errors = summary.get("errors") or [{}]
    first = errors[0] if isinstance(errors[0], dict) else {}
    message = str(first.get("message") or "the path is not safe for root")
    return unsafe_path(message.removeprefix("refused: "))


def _transfer(summary: Dict[str, Any]) -> TransferSummary:
    try:
        return TransferSummary(
            files=int(summary.get("files", 0)),
            dirs=int(summary.get("dirs", 0)),
            symlinks=int(summary.get("symlinks", 0)),
            bytes=int(summary.get("bytes", 0)),
        )
    except (TypeError, ValueError):
        raise ProtocolError("the sandbox sent a malformed upload summary") from None


def _upload_failed(what: str, helper: Helper, dest: str) -> E2BProviderError:
    """The error for an upload to ``dest`` that did not complete: refused under
    ``/skills``, a destination the user may not write into, or what its helper said."""
    refused = _refusal(helper)
    if refused is not None:
        return refused
    summary = _summary(helper) or {}
    if summary.get("unwritable"):
        first = (summary.get("errors") or [{}])[0]
        said = str(first.get("message") or "it cannot be written") if isinstance(
            first, dict) else "it cannot be written"
        denied = isinstance(first, dict) and first.get("error") in ("EACCES", "EPERM")
        return CommandFailed(
            f"cannot upload into {dest}: {said[:1].lower()}{said[1:]}; "
            + (ACCESS_HINT if denied else "upload to a directory, or to a path that does "
               "not exist yet")
        )
    return _helper_failed(what, helper, dest)


def _helper_failed(what: str, helper: Helper, dest: str) -> CommandFailed:
    """The error for an upload to ``dest`` whose helper failed: why, in the user's terms
    (no temporary or staging name, no program's traceback), from its standard error."""
    text = helper.outcome().stderr.decode("utf-8", "replace")
    if "Traceback (most recent call last)" in text:  # a crash: its last line says what
        text = text.strip().splitlines()[-1]
    code = helper.exit_code
    if code in (126, 127) and "python3" in text:
        return CommandFailed(f"{what}: the sandbox has no python3", exit_code=code)
    reason = script_reason(text[-2000:], code)
    if reason.startswith(("permission denied", "operation not permitted")):
        return CommandFailed(f"permission denied (cannot create {dest}); {ACCESS_HINT}",
                             exit_code=code)
    return CommandFailed(f"{what}: {reason}", exit_code=code)


def _pack_failed(
    remote_path: str, helper: Helper, absent: Optional[Dict[str, Any]]
) -> CommandFailed:
    if isinstance(absent, dict):
        if absent.get("missing"):
            return CommandFailed(f"{remote_path} does not exist")
        if "noentry" in absent:
            return CommandFailed(
                f"permission denied: user 'sandbox' may not enter {absent['noentry']}, so "
                f"{remote_path} cannot be read"
            )
        said = str(absent.get("message", "cannot be read"))
        return CommandFailed(
            f"{remote_path}: {said}"
            + ("; only files, directories and symbolic links are downloaded"
               if said.startswith("it is ") else "")
        )
    code = helper.exit_code
    said = helper.outcome().stderr.decode("utf-8", "replace").strip()
    if code == 3:
        return CommandFailed(f"{remote_path} does not exist")
    if code == scripts.NO_ENTRY_EXIT:
        return CommandFailed(
            f"permission denied: user 'sandbox' may not enter {said or 'a directory on the way'}"
            f", so {remote_path} cannot be read"
        )
    if code == scripts.CLOSED_DIR_EXIT:
        return CommandFailed(f"permission denied: user 'sandbox' may not read {remote_path}")
    if code == scripts.NOT_REGULAR_EXIT:
        return CommandFailed(f"{said or remote_path + ' is not a file'}: only files, "
                             "directories and symbolic links are downloaded")
    if code == scripts.MISSING_TOOL_EXIT:
        return CommandFailed("the sandbox has neither python3 nor tar, one of which "
                             "downloads need", exit_code=code)
    if code in (126, 127):
        return CommandFailed("the sandbox has no python3, which downloads need",
                             exit_code=code)
    text = helper.outcome().stderr.decode("utf-8", "replace").strip()[-300:]
    return CommandFailed(
        f"the download of {remote_path} failed (status {helper.exit_code})"
        + (f": {text}" if text else ""),
        exit_code=helper.exit_code,
    )
