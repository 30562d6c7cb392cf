"""What the sandbox answers about files, as values and typed errors.

This module owns the reading of the file agent's answers and of the per-call scripts'
outcomes (a read's content, a stat, a write's results) and the errors they become, worded
for the user: a path the sandbox user may not touch (:data:`ACCESS_HINT`), a directory on
the way it may not enter, a root write under ``/skills`` refused because of its path
(:func:`unsafe_path`), a path of the wrong kind.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ..core.agent_session import AgentAnswer
from ..core.context import FILE_OP_TIMEOUT_SECONDS, script_failed
from ..core.messages import clean_stderr, script_reason, scrub
from ..core.run_engine import RunOutcome
from ..errors import CommandFailed, OperationTimeout, ProtocolError, UnsafePath
from ..models import FileContent, FileStat
from ..protocol import scripts as scripts

#: What users are told when the sandbox user may not touch a path.
ACCESS_HINT = (
    "files are read and written as user 'sandbox' (as root under /skills): use a path it may "
    "access, such as one under /workspace"
)


def timed_out() -> OperationTimeout:
    """The error for a file operation that did not finish within its bound."""
    return OperationTimeout(f"it did not finish within {FILE_OP_TIMEOUT_SECONDS:.0f} s")


#: Why a root write under /skills is refused, for its error.
_SKILLS_RULE = (
    "a root write under /skills goes only through directories that are root's and closed to "
    "everyone else, and never through a symbolic link"
)
_REFUSED_DIR = re.compile(r"(/\S*) (?:is|has|names) ")


def _skills_fix(reason: str) -> str:
    """What to do about a root write refused for ``reason`` (it starts with the path)."""
    m = _REFUSED_DIR.match(reason)
    where = m.group(1) if m else ""
    if where and "symbolic link" in reason:
        return f"replace the symbolic link {where} by a directory, or write outside /skills"
    if where and ("owned" in reason or "writable" in reason or "alone" in reason):
        return (f"make {where} root's and closed to others (chown root {where}; chmod go-w "
                f"{where}), or write outside /skills")
    return "write to an absolute path without . or .. under root's own directories"


def unsafe_path(reason: str) -> UnsafePath:
    """The error for a root write refused because of its path (``reason`` names it)."""
    reason = scrub(reason).removeprefix("refused: ")
    return UnsafePath(f"refused: {reason} ({_SKILLS_RULE}); {_skills_fix(reason)}")


def script_error(what: str, r: RunOutcome) -> CommandFailed:
    """:func:`~e2b_provider.core.context.script_failed` with the access hint when the user
    was refused; a root write refused because of its path raises :class:`UnsafePath`
    instead."""
    if r.exit_code == scripts.REFUSED_EXIT:
        lines = clean_stderr(r.stderr.decode("utf-8", "replace")).splitlines()
        raise unsafe_path(lines[-1] if lines else "the path is not safe for root")
    reason = script_reason(r.stderr.decode("utf-8", "replace"), r.exit_code)
    denied = reason.startswith(("permission denied", "operation not permitted"))
    return script_failed(what, r, ACCESS_HINT if denied else _advice(reason))


#: What to do about a path of the wrong kind, by what its error says.
_KIND_ADVICE = (
    ("not a regular file", "only regular files are read and written (a FIFO or a device "
     "could block or never end)"),
    ("is a directory", "give the path of a file"),
    ("not a directory", "a directory on the way is a file: remove it, or choose another path"),
    ("file exists", "a directory on the way is a file: remove it, or choose another path"),
)


def _advice(reason: str) -> str:
    """What to do about ``reason`` when it says a path is of the wrong kind ("" if not)."""
    said = reason.lower()
    for words, advice in _KIND_ADVICE:
        if words in said:
            return advice
    return ""


def no_entry(path: str, r: RunOutcome) -> CommandFailed:
    """The error for a path behind a directory the sandbox user may not enter (the script
    printed which one last on its standard error)."""
    where = r.stderr.decode("utf-8", "replace").strip().splitlines()
    return closed_dir(path, where[-1] if where else "a directory on the way", r.exit_code)


def capped_content(data: bytes, max_bytes: int) -> FileContent:
    """``data`` as a read returns it: at most ``max_bytes``, said truncated if longer."""
    truncated = len(data) > max_bytes
    return FileContent(data[:max_bytes] if truncated else data, truncated)


#: The system's words for a refusal, which "permission denied" already says.
_GENERIC_DENIALS = ("permission denied", "operation not permitted", "eacces", "eperm")
#: Said by :func:`content_of` for a file the fast large-read path should read.
LARGE = FileContent(b"", True)


def agent_failure(path: str, answer: Dict[str, Any], doing: str = "open") -> CommandFailed:
    """The error for a file agent's ``{"error": ...}`` answer about ``path``, worded as the
    per-call scripts word theirs (``doing``: ``"open"`` for reads, ``"create"`` for
    writes): the caller's message already names the operation and the path."""
    code = str(answer.get("error", "EIO"))
    message = str(answer.get("message", "")) or code
    where = str(answer.get("path") or path)
    if code in ("EACCES", "EPERM"):
        said = f"cannot open '{where}' for reading" if doing == "open" else (
            f"cannot create {where}")
        why = said if message.lower() in _GENERIC_DENIALS else message
        return CommandFailed(f"permission denied ({why}); {ACCESS_HINT}", exit_code=None)
    if code == "EISDIR":
        return CommandFailed(f"it is a directory; {_advice('is a directory')}", exit_code=None)
    reason = f"{message[:1].lower()}{message[1:]}"
    if where != path and where not in reason:
        reason = f"{reason} ({where})"
    advice = _advice(reason)
    return CommandFailed(f"{reason}; {advice}" if advice else reason, exit_code=None)


def closed_dir(path: str, closed: str, exit_code: Optional[int] = None) -> CommandFailed:
    """The error for ``path``, behind directory ``closed`` the sandbox user may not enter."""
    return CommandFailed(
        f"permission denied: user 'sandbox' may not enter {closed}, so {path} cannot be "
        f"examined (it may exist); {ACCESS_HINT}",
        exit_code=exit_code,
    )


def absent(path: str, answer: Dict[str, Any]) -> bool:
    """Whether a file agent's answer about ``path`` says it does not exist.

    Raises:
        CommandFailed: the answer says a directory on the way is closed to the sandbox
            user, or that the call failed.
    """
    if answer.get("missing"):
        return True
    if "noentry" in answer:
        raise closed_dir(path, str(answer["noentry"]))
    if "error" in answer:
        raise agent_failure(path, answer)
    return False


def content_of(
    path: str, answer: Dict[str, Any], data: bytes, max_bytes: int
) -> Optional[FileContent]:
    """A file agent's read answer as :meth:`Files.read` returns it (``LARGE``: take the
    fast path)."""
    if absent(path, answer):
        return None
    kind = answer.get("kind")
    if kind == "dir":
        return None
    if kind == "other":
        raise CommandFailed(
            f"{path} is {answer.get('type', 'not a regular file')}: only regular files are "
            "read (a FIFO or device could block or never end)"
        )
    if kind != "file":
        raise ProtocolError("the file agent answered a read with something unknown")
    if answer.get("large"):
        return LARGE
    return capped_content(data, max_bytes)


def stat_of(path: str, answer: Dict[str, Any]) -> Optional[FileStat]:
    """A file agent's stat answer as :meth:`Files.stat` returns it (None: missing)."""
    if absent(path, answer):
        return None
    size = answer.get("size")
    if answer.get("kind") not in ("file", "dir", "other") or not isinstance(size, int):
        raise ProtocolError("the file agent answered a stat with something unknown")
    return FileStat(size=size, is_dir=answer["kind"] == "dir")


def write_results(answer: AgentAnswer, paths: List[str]) -> Dict[str, CommandFailed]:
    """The failures in a file agent's write answer, by path."""
    results = answer.answer.get("results")
    if not isinstance(results, list) or len(results) != len(paths):
        if "error" in answer.answer:
            failure = agent_failure(paths[0] if paths else "", answer.answer, "create")
            return {p: failure for p in paths}
        raise ProtocolError("the file agent answered a write with something unknown")
    failed: Dict[str, CommandFailed] = {}
    for path, r in zip(paths, results):
        if not isinstance(r, dict) or r.get("ok") is True:
            continue
        failed[path] = agent_failure(path, r, "create")
    return failed
