"""File work inside a sandbox, as the sandbox user: a request server, a tar packer, a tar
extractor.

The provider sends this file's text to the sandbox's ``python3`` (``python3 -I -S -X utf8
-c <this text> MODE ARGS...``), run as the user the files belong to. Standard library only,
Python 3.6 or later; it never imports the library.

Modes:

``serve IDLE_SECONDS [NAME]``
    (``NAME`` only names the process for ``ps``.) Answer requests read from standard
    input until it closes, or until no request came for ``IDLE_SECONDS``. A request is
    one line of JSON (``{"id": N, "op": ..., "len": L, ...}``) followed by ``L`` bytes of
    payload. Every answer is one or more frames on
    standard output: a header line ``F <id> <m|e> <json length> <data length>``, then that
    much JSON, then that many bytes of data; ``e`` marks a request's last frame. The first
    frame (id 0) says the server is ready. Requests run on a few worker threads, so a slow
    one does not hold up the others. Operations: ``ping``, ``stat``, ``read``,
    ``read_many``, ``write``, ``write_many``, ``list``, ``sweep``, and ``cmd_read`` /
    ``cmd_list`` over background commands' records (see ``supervisor.py``).
    ``{"op": "cancel", "of": N}`` withdraws request ``N`` at once (it is handled as it
    is read, not queued): one still queued, or not yet arrived, is answered
    ``{"cancelled": true}`` and never run; a running one stops at its next step and is
    answered so, unless it already finished — a write's rename and the cancel exclude each
    other, so ``{"cancelled": true}`` means the file was not replaced, and any other answer
    that it was; a ``write_many`` that renamed its first file is no longer stopped, so
    ``{"cancelled": true}`` means none of its files was replaced. The environment
    variable ``CAPYBARA_FIRST_REQUEST`` may carry the first request (base64 of its bytes
    as they would come on standard input): it is served right after the ready frame, so
    the call that starts the agent costs one round trip. JSON is read and written by the
    C accelerator ``_json`` alone (importing :mod:`json` imports ``re``, which costs
    more than the rest of a start).

``pack SRC NAME [EXCLUDE...]``
    (``NAME`` only names the process.) Write to standard output one line of JSON
    (``{"total": bytes, "files": count, "single": bool}``, or ``{"absent": ...}`` and exit
    4 when ``SRC`` cannot be read), then a tar stream of ``SRC`` (a directory's contents,
    or one file): directories, regular files and symbolic links (kept as links, never
    followed); anything else is skipped. A file that shrank while it was sent is padded
    with zeros to the size in its header, and followed by a global pax header with the
    record ``CAPYBARA.failed=1`` (the reader drops it). The last line on standard error is
    ``{"errors": [...]}`` (exit 1 if there were any).

``extract DEST END [root] [op=ID]``
    (``root``: run by root under ``/skills``: every directory written in, from ``/`` down,
    must be root's and closed to others, or nothing is written (exit 80); files are made
    0644, directories 0755. ``op=ID``: the operation's 32-hex id, which the temporary
    names then carry, so the clean-up of the operation finds them.) Read a tar stream from
    standard input and write it under ``DEST``, each regular file to a temporary name in
    its own directory and renamed into place once complete. No member may name a path
    outside ``DEST`` or reach through a symbolic link (the walk opens every directory with
    ``O_NOFOLLOW``). The stream is complete only if its last
    member is named ``END``; otherwise the exit status is 3. Prints a JSON summary.

Every write here goes to a temporary file (``.capybara-part-<pid>-<hex>``) in the target's
own directory and is renamed over the target only when it is whole; an overwrite keeps the
old file's mode. While a temporary file exists, a symbolic link to it named ``<pid>-<hex>``
stands in :data:`REGISTRY`, so that ``sweep`` can remove what a killed writer left.
"""

import errno
import os
import select
import stat
import sys
import threading
import time

# Annotations are strings, and typing is imported for the type checker only: importing it
# would add tens of milliseconds to every start in the sandbox.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Set, Tuple

    Answer = Dict[str, Any]

VERSION = 2


def _json_codec() -> "Tuple[Callable[[object], str], Callable[[str], Any]]":
    """``(dumps, loads)`` for compact ASCII JSON, on the C accelerator ``_json`` alone:
    importing :mod:`json` imports ``re`` (and ``enum`` and more), which cost more than
    the rest of a start in the sandbox. Falls back to :mod:`json` where ``_json`` is not
    what it is expected to be."""
    try:
        import _json

        class Context(object):
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int

            @staticmethod
            def parse_constant(name: str) -> object:
                raise ValueError("not JSON: %s" % name)

        def unencodable(value: object) -> object:
            raise TypeError("not JSON serializable: %s" % type(value).__name__)

        scan = _json.make_scanner(Context())  # type: ignore[arg-type]  # any such object
        encode = _json.make_encoder(None, unencodable, _json.encode_basestring_ascii, None,
                                    ":", ",", False, False, True)

        def dumps(value: object) -> str:
            return "".join(encode(value, 0))

        def loads(text: str) -> "Any":
            text = text.strip(" \t\n\r")
            try:
                value, end = scan(text, 0)
            except StopIteration:
                raise ValueError("not JSON") from None
            if end != len(text):
                raise ValueError("not JSON: extra data")
            return value

        if loads(dumps({"a": [1, 2.5, "\u00e9", None, True]})) != {
            "a": [1, 2.5, "\u00e9", None, True]
        }:
            raise ValueError("_json does not round-trip")
        return dumps, loads
    except Exception:
        import json

        def dumps_slow(value: object) -> str:
            return json.dumps(value, ensure_ascii=True, separators=(",", ":"))

        return dumps_slow, json.loads


dumps, loads = _json_codec()

#: Marks temporary files: ``.capybara-part-<pid>-<hex>``.
PART = ".capybara-part-"


def _user_name() -> str:
    """``$USER`` when it is a plain ASCII name (as the shell scripts take it), else the
    uid."""
    name = os.environ.get("USER", "")
    plain = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
    if name and all(c in plain for c in name) and name[0] not in ".-":
        return name
    return str(os.getuid())


#: Where writers record their temporary files while they exist: one directory per user,
#: named as the shell scripts name it (``$USER``); root's is in its own staging directory.
REGISTRY = ("/opt/capybara/upload/parts" if os.getuid() == 0
            else "/tmp/.capybara-parts-" + _user_name())
#: The largest request payload accepted.
MAX_REQUEST = 64 << 20
#: The longest request line accepted.
MAX_LINE = 1 << 20
#: Entries per frame of a listing.
LIST_CHUNK = 2000
#: The most entries one listing returns.
MAX_LIST = 1000000
WORKERS = 4

_umask = os.umask(0)
os.umask(_umask)
NEW_FILE_MODE = 0o666 & ~_umask


# -- errors ------------------------------------------------------------------------------------


def error_of(exc: BaseException, path: "Optional[str]" = None) -> "Answer":
    """The JSON form of an ``OSError`` (or another exception)."""
    if isinstance(exc, OSError) and exc.errno:
        return {
            "error": errno.errorcode.get(exc.errno, "EIO"),
            "message": exc.strerror or str(exc),
            "path": path if path is not None else exc.filename,
        }
    return {"error": "EIO", "message": "%s: %s" % (type(exc).__name__, exc), "path": path}


def absent(path: str) -> "Answer":
    """For a path that cannot be examined: ``{"missing": True}``, or ``{"noentry": dir}``
    when the nearest ancestor that exists is a directory the user may not enter."""
    p = path
    while p not in ("/", "") and not os.path.lexists(p):
        p = os.path.dirname(p)
    if os.path.isdir(p) and not os.access(p, os.X_OK):
        return {"noentry": p}
    return {"missing": True}


def unexamined(exc: OSError, path: str) -> "Answer":
    """For a path whose ``stat`` failed with ``exc``: :func:`absent` when it is not there
    for this user (missing, or behind a directory it may not enter), else the error."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
        return absent(path)
    return error_of(exc, path)


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def type_of(mode: int) -> str:
    """What a file that is not regular is, in words."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


# -- temporary files ---------------------------------------------------------------------------


def part_name() -> str:
    return "%s%d-%s" % (PART, os.getpid(), os.urandom(6).hex())


def register(tmp_path: str) -> "Optional[str]":
    """Record ``tmp_path`` in the registry; the record's path, or None (no registry)."""
    try:
        try:
            os.mkdir(REGISTRY, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(REGISTRY)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        entry = os.path.join(REGISTRY, os.path.basename(tmp_path)[len(PART):])
        os.symlink(tmp_path, entry)
        return entry
    except OSError:
        return None


def unregister(entry: "Optional[str]") -> None:
    if entry is not None:
        try:
            os.unlink(entry)
        except OSError:
            pass


def unlink_quietly(path: str, dir_fd: "Optional[int]" = None) -> None:
    try:
        os.unlink(path, dir_fd=dir_fd)
    except OSError:
        pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def sweep() -> int:
    """Remove the temporary files of writers that are gone; how many were removed."""
    removed = 0
    try:
        st = os.lstat(REGISTRY)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return 0
    for name in os.listdir(REGISTRY):
        entry = os.path.join(REGISTRY, name)
        pid_text = name.split("-", 1)[0]
        if pid_text.isdigit() and alive(int(pid_text)):
            continue
        try:
            target = os.readlink(entry)
        except OSError:
            unlink_quietly(entry)
            continue
        if os.path.basename(target) == PART + name:
            try:
                os.unlink(target)
                removed += 1
            except FileNotFoundError:
                pass
            except OSError:
                continue
        unlink_quietly(entry)
    return removed


# -- one file ----------------------------------------------------------------------------------


def do_stat(path: str) -> "Answer":
    try:
        st = os.stat(path)
    except OSError as exc:
        return unexamined(exc, path)
    out = {
        "kind": kind_of(st.st_mode),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }
    if out["kind"] == "other":
        out["type"] = type_of(st.st_mode)
    return out


def do_read(path: str, limit: int, large: int = 0) -> "Tuple[Answer, bytes]":
    """``(answer, data)``: at most ``limit`` bytes of a regular file; with ``large`` set,
    a regular file larger than that (when more is asked for) is only announced
    (``"large": true``): the provider reads it a faster way."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return absent(path), b""
        if exc.errno == errno.EACCES and not os.path.exists(path):
            return absent(path), b""
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):  # a socket, say
            try:
                return {"kind": "other", "type": type_of(os.stat(path).st_mode)}, b""
            except OSError:
                pass
        return error_of(exc, path), b""
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return {"kind": "dir"}, b""
        if not stat.S_ISREG(st.st_mode):
            return {"kind": "other", "type": type_of(st.st_mode)}, b""
        if 0 < large < st.st_size and limit > large:
            return {"kind": "file", "size": st.st_size, "large": True}, b""
        chunks = []
        left = limit
        while left > 0:
            piece = os.read(fd, min(left, 1 << 20))
            if not piece:
                break
            chunks.append(piece)
            left -= len(piece)
        return {"kind": "file", "size": st.st_size}, b"".join(chunks)
    except OSError as exc:
        return error_of(exc, path), b""
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class Withdrawn(Exception):
    """The request was cancelled before it took effect."""


class Job(object):
    """A request being served: whether it was cancelled, and the lock that makes its
    commit (a rename) and a cancel exclusive. Once ``committed`` (a batch renamed its first
    file) a cancel no longer stops it: the batch goes on to its end, so a cancelled batch
    replaced all of its files or none."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False
        self.committed = False

    def check(self) -> None:
        if self.cancelled and not self.committed:
            raise Withdrawn()


#: A job that is never cancelled (for callers outside the server).
NEVER = Job()


def write_file(path: str, data: bytes, job: Job = NEVER) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the target's directory,
    renamed over the target once whole. A symbolic link at ``path`` is followed (the file
    it names is replaced); an existing file keeps its mode and must be writable by the
    user; missing parent directories are made. A ``job`` cancelled before the rename
    raises :class:`Withdrawn` and leaves the target as it was."""
    target = os.path.realpath(path) if os.path.islink(path) else path
    parent, name = os.path.split(target)
    if not name:
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is None:
        os.makedirs(parent or "/", exist_ok=True)
        mode = NEW_FILE_MODE
    elif stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    elif not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "it is %s, not a regular file" % type_of(st.st_mode), path)
    elif not os.access(target, os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    else:
        mode = stat.S_IMODE(st.st_mode)
    tmp = os.path.join(parent or "/", part_name())
    entry = register(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            write_all(fd, data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        with job.lock:
            job.check()
            try:
                os.rename(tmp, target)
            except PermissionError as exc:
                raise replace_refused(exc, parent or "/", st, path) from None
    except BaseException:
        unlink_quietly(tmp)
        raise
    finally:
        unregister(entry)


def replace_refused(
    exc: OSError, parent: str, st: "Optional[os.stat_result]", path: str
) -> OSError:
    """Why a rename over an existing file was refused, in words (a sticky directory lets
    only a file's owner replace it)."""
    try:
        sticky = os.stat(parent).st_mode & stat.S_ISVTX
    except OSError:
        sticky = 0
    if sticky and st is not None and st.st_uid != os.getuid():
        return PermissionError(
            exc.errno,
            "it belongs to another user in a sticky directory (%s): a write replaces the "
            "whole file, which there only its owner may do" % parent,
            path,
        )
    return exc


# -- listings ----------------------------------------------------------------------------------


def entry_of(dirpath: str, name: str) -> "Optional[Answer]":
    path = dirpath.rstrip("/") + "/" + name
    try:
        st = os.lstat(path)
    except OSError:
        return None
    out = {
        "name": name,
        "path": path,
        "type": kind_of(st.st_mode),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }
    if stat.S_ISLNK(st.st_mode):
        try:
            out["target"] = os.readlink(path)
        except OSError:
            out["target"] = ""
    return out


def do_list(path: str, depth: int, emit: "Callable[[List[Answer]], None]") -> "Answer":
    """List ``path`` down to ``depth`` levels; ``emit(entries)`` is called with each chunk.
    Returns the final answer."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return unexamined(exc, path)
    if not stat.S_ISDIR(st.st_mode):
        return {"notdir": True, "type": kind_of(st.st_mode)}
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        return error_of(exc, path)
    chunk = []  # type: List[Answer]
    count = 0
    skipped = []  # type: List[Answer]
    level = [(path, names)]
    for d in range(depth):
        following = []
        for dirpath, entries in level:
            for name in entries:
                e = entry_of(dirpath, name)
                if e is None:
                    continue
                chunk.append(e)
                count += 1
                if count >= MAX_LIST:
                    emit(chunk)
                    return {"count": count, "skipped": skipped, "cut": True}
                if len(chunk) >= LIST_CHUNK:
                    emit(chunk)
                    chunk = []
                if e["type"] == "dir" and d + 1 < depth:
                    try:
                        following.append((e["path"], sorted(os.listdir(e["path"]))))
                    except OSError as exc:
                        skipped.append(error_of(exc, e["path"]))
        level = following
        if not level:
            break
    if chunk:
        emit(chunk)
    return {"count": count, "skipped": skipped}


# -- background commands' records (written by the supervisor program) ----------------------

#: Where background commands' records live (as the supervisor writes them).
RECORDS = "/tmp/.capybara-cmd"


def _record(cid: str) -> "Optional[str]":
    if len(cid) != 32 or any(c not in "0123456789abcdef" for c in cid):
        return None
    return os.path.join(RECORDS, cid)


class BadRecord(Exception):
    """A record's file that is not a regular file (a FIFO, a link, a device): never read,
    since the sandbox user can put anything in a record."""


def _open_record_file(path: str) -> "Optional[int]":
    """A descriptor of the record file ``path``, opened without blocking (a FIFO) and
    without following a link; None when there is no such file.

    Raises:
        BadRecord: ``path`` is not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY
                     | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        if exc.errno == errno.ELOOP:
            raise BadRecord("%s is a symbolic link" % os.path.basename(path)) from None
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):
            raise BadRecord("%s is not a regular file" % os.path.basename(path)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BadRecord("%s is %s, not a regular file" % (os.path.basename(path),
                                                          type_of(mode)))
    return fd


def _load(path: str) -> "Optional[Answer]":
    """A record's JSON object, or None (no such file, or not a JSON object).

    Raises:
        BadRecord: ``path`` is not a regular file.
    """
    try:
        fd = _open_record_file(path)
    except OSError:
        return None
    if fd is None:
        return None
    try:
        chunks = []  # type: List[bytes]
        left = 1 << 20
        while left > 0:
            piece = os.read(fd, left)
            if not piece:
                break
            chunks.append(piece)
            left -= len(piece)
        value = loads(b"".join(chunks).decode("utf-8", "surrogateescape"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return value if isinstance(value, dict) else None


def _alive(meta: "Answer", cid: str) -> bool:
    """Whether the record's supervisor still runs (and is that supervisor: a reused pid is
    another program)."""
    try:
        with open("/proc/%d/cmdline" % int(meta.get("pid", 0)), "rb") as f:
            return ("\0%s\0" % cid).encode() in f.read()
    except (OSError, ValueError, TypeError):
        return False


def _stream(
    directory: str, name: str, cap: int, offset: int, limit: int
) -> "Tuple[int, int, bytes]":
    """(offset of the bytes returned, total written, bytes from ``offset`` on (or the
    first kept), at most ``limit``) of one stream; ``offset`` -1: the last ``cap`` bytes.
    Each generation file is opened once (without blocking or following a link) and read
    through that descriptor, so one removed meanwhile is still read whole.

    Raises:
        BadRecord: a generation file is not a regular file.
    """
    for _ in range(5):  # a generation removed before it was opened: read again
        gens = []
        for entry in os.listdir(directory):
            if entry.startswith(name + ".") and entry[len(name) + 1:].isdigit():
                gens.append(int(entry[len(name) + 1:]))
        if not gens:
            return 0, 0, b""
        gens.sort()
        gens = gens[-2:]
        fds = {}  # type: Dict[int, int]
        try:
            for gen in gens:
                fd = _open_record_file(os.path.join(directory, "%s.%d" % (name, gen)))
                if fd is not None:
                    fds[gen] = fd
            if len(fds) < len(gens):
                continue
            total = gens[-1] * cap + os.fstat(fds[gens[-1]]).st_size
            first = gens[0] * cap
            start = max(first, total - cap) if offset < 0 else max(first, offset)
            out = []  # type: List[bytes]
            want = max(0, min(limit, total - start))
            pos = start
            while want > 0:
                gen = pos // cap
                if gen not in fds:
                    break  # not consecutive generations: what is there is given
                piece = os.pread(fds[gen], min(want, (gen + 1) * cap - pos), pos - gen * cap)
                if not piece:
                    break
                out.append(piece)
                pos += len(piece)
                want -= len(piece)
            return start, total, b"".join(out)
        finally:
            for fd in fds.values():
                os.close(fd)
    raise OSError(errno.EAGAIN, "the record changed while it was read")


def do_cmd_read(cid: str, out_from: int, err_from: int, limit: int) -> "Tuple[Answer, bytes]":
    """A background command's record: what it is, whether it ended, and its output from the
    given offsets (-1: the last ``cap`` bytes). A record with a file that is not a regular
    file is said as ``{"error": "EBADREC", "message": ...}`` (which file)."""
    directory = _record(cid)
    try:
        meta = _load(os.path.join(directory, "meta.json")) if directory else None
        if directory is None or meta is None:
            return {"absent": True}, b""
        status = _load(os.path.join(directory, "status.json"))
        try:
            cap = max(1, min(int(meta.get("cap", 1 << 20)), 1 << 30))
        except (TypeError, ValueError):
            cap = 1 << 20
        o_first, o_total, o_data = _stream(directory, "stdout", cap, out_from, limit)
        e_first, e_total, e_data = _stream(directory, "stderr", cap, err_from, limit)
    except BadRecord as exc:
        return {"error": "EBADREC", "message": str(exc)}, b""
    answer = {"meta": meta, "status": status,
              "alive": status is None and _alive(meta, cid),
              "out": [o_first, o_total, len(o_data)], "err": [e_first, e_total, len(e_data)]}
    return answer, o_data + e_data


def do_cmd_list(bad: "Optional[List[str]]" = None) -> "List[Answer]":
    """The background commands whose supervisor still runs. A record whose meta.json is not
    a regular file is left out (its id added to ``bad``)."""
    found = []  # type: List[Answer]
    try:
        names = sorted(os.listdir(RECORDS))
    except OSError:
        return found
    for cid in names:
        directory = _record(cid)
        if directory is None or os.path.lexists(os.path.join(directory, "status.json")):
            continue
        try:
            meta = _load(os.path.join(directory, "meta.json"))
        except BadRecord:
            if bad is not None:
                bad.append(cid)
            continue
        if meta is not None and _alive(meta, cid):
            found.append(meta)
    return found


# -- the server --------------------------------------------------------------------------------


class Frames(object):
    """Answer frames on a binary stream, one writer at a time."""

    def __init__(self, out: "BinaryIO") -> None:
        self._out = out
        self._lock = threading.Lock()

    def send(self, rid: int, last: bool, answer: "Answer", data: bytes = b"") -> None:
        body = dumps(answer).encode("ascii")
        head = ("F %d %s %d %d\n" % (rid, "e" if last else "m", len(body), len(data)))
        with self._lock:
            self._out.write(head.encode("ascii"))
            self._out.write(body)
            if data:
                self._out.write(data)
            self._out.flush()


def handle(req: "Answer", payload: bytes, frames: Frames, job: Job = NEVER) -> None:
    rid = req["id"]
    op = req.get("op")
    if op == "ping":
        frames.send(rid, True, {"pong": True})
    elif op == "stat":
        frames.send(rid, True, do_stat(req["path"]))
    elif op == "read":
        answer, data = do_read(req["path"], int(req["max"]), int(req.get("large", 0)))
        frames.send(rid, True, answer, data)
    elif op == "read_many":
        limit = int(req["max"])
        large = int(req.get("large", 0))
        paths = req["paths"]
        for i, path in enumerate(paths):
            job.check()
            answer, data = do_read(path, limit, large)
            answer["i"] = i
            frames.send(rid, False, answer, data)
        frames.send(rid, True, {"count": len(paths)})
    elif op in ("write", "write_many"):
        files = req["files"] if op == "write_many" else [{"path": req["path"], "len": len(payload)}]
        results = []
        pos = 0
        for f in files:
            n = int(f["len"])
            data = payload[pos:pos + n]
            pos += n
            try:
                write_file(f["path"], data, job)
                results.append({"ok": True})
                job.committed = True  # from now on the batch is done whole
            except Withdrawn:
                # no file was replaced (the first rename commits the whole batch)
                frames.send(rid, True, {"cancelled": True, "done": len(results)})
                return
            except Exception as exc:  # each file stands alone; report which failed
                results.append(error_of(exc, f["path"]))
        frames.send(rid, True, {"results": results})
    elif op == "list":
        def emit(chunk: "List[Answer]") -> None:
            job.check()
            frames.send(rid, False, {"entries": chunk})

        frames.send(rid, True, do_list(req["path"], max(1, int(req.get("depth", 1))), emit))
    elif op == "sweep":
        frames.send(rid, True, {"removed": sweep()})
    elif op == "cmd_read":
        answer, data = do_cmd_read(str(req["cid"]), int(req["out"]), int(req["err"]),
                                   int(req["max"]))
        frames.send(rid, True, answer, data)
    elif op == "cmd_list":
        bad = []  # type: List[str]
        commands = do_cmd_list(bad)
        frames.send(rid, True, {"commands": commands, "bad": bad})
    else:
        frames.send(rid, True, {"error": "EINVAL", "message": "unknown operation %r" % (op,)})


#: Ids of requests cancelled before they arrived, remembered at most.
MAX_WITHDRAWN = 4096


class Server(object):
    def __init__(self, idle: float, frames: Frames) -> None:
        self.idle = idle
        self.frames = frames
        self.lock = threading.Condition()
        self.queue = []  # type: List[Tuple[Answer, bytes]]
        self.jobs = {}  # type: Dict[int, Job]
        self.withdrawn = []  # type: List[int]
        self.busy = 0
        self.threads = 0
        self.closing = False
        self.last = time.monotonic()

    def cancel(self, rid: int) -> None:
        """Withdraw request ``rid`` (see the module's docstring)."""
        answer = False
        with self.lock:
            job = self.jobs.get(rid)
            if job is not None:
                with job.lock:
                    job.cancelled = True
            else:
                for i, (req, _) in enumerate(self.queue):
                    if req["id"] == rid:
                        del self.queue[i]
                        self.busy -= 1
                        self.last = time.monotonic()
                        break
                else:  # not arrived yet (or done: then its answer went already)
                    self.withdrawn.append(rid)
                    del self.withdrawn[:-MAX_WITHDRAWN]
                answer = True
        if answer:
            self.frames.send(rid, True, {"cancelled": True})

    def submit(self, req: "Answer", payload: bytes) -> None:
        with self.lock:
            if req["id"] in self.withdrawn:
                self.withdrawn.remove(req["id"])
                return  # answered when it was withdrawn
            self.queue.append((req, payload))
            self.busy += 1
            if self.threads < WORKERS and self.threads < self.busy:
                self.threads += 1
                t = threading.Thread(target=self.work)
                t.daemon = True
                t.start()
            self.lock.notify()

    def work(self) -> None:
        while True:
            with self.lock:
                while not self.queue and not self.closing:
                    self.lock.wait()
                if not self.queue:
                    self.threads -= 1
                    return
                req, payload = self.queue.pop(0)
                job = self.jobs[req["id"]] = Job()
            try:
                handle(req, payload, self.frames, job)
            except Withdrawn:
                self.frames.send(req["id"], True, {"cancelled": True})
            except Exception as exc:
                try:
                    self.frames.send(req.get("id", 0), True, error_of(exc))
                except Exception:
                    pass
            finally:
                with self.lock:
                    self.jobs.pop(req["id"], None)
                    self.busy -= 1
                    self.last = time.monotonic()
                    self.lock.notify_all()

    def idle_for(self) -> float:
        with self.lock:
            if self.busy:
                return 0.0
            return time.monotonic() - self.last

    def drain(self) -> None:
        with self.lock:
            self.closing = True
            self.lock.notify_all()
            while self.busy:
                self.lock.wait(1.0)


def parse_requests(buf: bytearray, server: Server) -> None:
    """Take every complete request out of ``buf`` (a bytearray) and submit it."""
    while True:
        nl = buf.find(b"\n")
        if nl < 0:
            if len(buf) > MAX_LINE:
                raise ValueError("request line too long")
            return
        try:
            req = loads(bytes(buf[:nl]).decode("utf-8"))
            need = req.get("len", 0)
            rid = req["id"]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError("malformed request line") from None
        for value in (need, rid):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError("malformed request line")
        if rid == 0:
            raise ValueError("malformed request line")
        if not 0 <= need <= MAX_REQUEST:
            raise ValueError("request payload too large")
        if len(buf) < nl + 1 + need:
            return
        payload = bytes(buf[nl + 1:nl + 1 + need])
        del buf[:nl + 1 + need]
        if req.get("op") == "cancel":
            of = req.get("of")
            if isinstance(of, bool) or not isinstance(of, int) or of <= 0:
                raise ValueError("malformed request line")
            server.cancel(of)
        else:
            server.submit(req, payload)


def enlarge_pipe(fd: int, size: int = 1 << 20) -> None:
    """Ask for a larger pipe buffer (Linux), so a large request crosses in few steps."""
    try:
        import fcntl

        fcntl.fcntl(fd, 1031, size)  # F_SETPIPE_SZ
    except (ImportError, OSError):
        pass


#: The environment variable that may carry the first request (base64 of its bytes as
#: they would come on standard input): the call that starts the agent sends its request
#: with the start, so both cost one round trip.
CARRIED = "CAPYBARA_FIRST_REQUEST"


def carried() -> bytes:
    """The request the agent was started with (``b""``: none); taken out of the
    environment."""
    text = os.environ.pop(CARRIED, "")
    if not text:
        return b""
    import binascii

    try:
        return binascii.a2b_base64(text)
    except binascii.Error:
        raise ValueError("malformed carried request") from None


def serve(idle: float) -> int:
    enlarge_pipe(0)
    frames = Frames(sys.stdout.buffer)
    server = Server(idle, frames)
    frames.send(0, True, {"ready": True, "version": VERSION, "pid": os.getpid(),
                          "uid": os.getuid()})
    buf = bytearray()
    status = 0
    chunk = b""
    try:
        chunk = carried()
    except ValueError as exc:
        sys.stderr.write("file agent: %s\n" % exc)
        status = 2
    while not status:
        if chunk:
            buf += chunk
            try:
                parse_requests(buf, server)
            except ValueError as exc:
                sys.stderr.write("file agent: %s\n" % exc)
                status = 2
                break
        left = idle - server.idle_for()
        if left <= 0:
            break
        ready, _, _ = select.select([0], [], [], min(left, 5.0))
        if not ready:
            chunk = b""
            continue
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
    server.drain()
    return status


# -- tar streams -------------------------------------------------------------------------------


def excluded(rel: str, name: str, patterns: "List[str]") -> bool:
    import fnmatch

    return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


def walk(
    src: str, patterns: "List[str]", errors: "List[Answer]"
) -> "Iterator[Tuple[str, str, os.stat_result]]":
    """``(relative path, lstat)`` of everything under directory ``src`` (depth first,
    sorted), skipping excluded names; unreadable directories are reported in
    ``errors``."""
    stack = [("", src)]
    while stack:
        rel_dir, abs_dir = stack.pop()
        try:
            names = sorted(os.listdir(abs_dir), reverse=True)
        except OSError as exc:
            errors.append(error_of(exc, abs_dir))
            continue
        later = []
        for name in reversed(names):
            rel = rel_dir + "/" + name if rel_dir else name
            if excluded(rel, name, patterns):
                continue
            path = abs_dir.rstrip("/") + "/" + name
            try:
                st = os.lstat(path)
            except OSError as exc:
                errors.append(error_of(exc, path))
                continue
            yield rel, path, st
            if stat.S_ISDIR(st.st_mode):
                later.append((rel, path))
        stack.extend(reversed(later))


#: Small files and headers are gathered into writes of about this many bytes; a larger
#: file goes from its page cache to the output with ``sendfile``.
PACK_GATHER = 1 << 18


def tar_header(name: str, kind: bytes, mode: int, size: int, mtime: int,
               link: str = "") -> bytes:
    """The tar header of one member, as ``tarfile`` writes it in PAX format: a plain one
    (ASCII name and link of at most 100 bytes, numbers that fit) packed here, which is
    several times faster for a tree of many small files; the rest by ``tarfile``."""
    full = name + "/" if kind == b"5" and not name.endswith("/") else name
    try:
        raw_name, raw_link = full.encode("ascii"), link.encode("ascii")
        plain = (len(raw_name) <= 100 and len(raw_link) <= 100 and 0 <= size < 8 ** 11
                 and 0 <= mtime < 8 ** 11)
    except UnicodeEncodeError:
        plain = False
    if plain:
        head = raw_name.ljust(100, b"\0") + b"%07o\0%07o\0%07o\0%011o\0%011o\0" % (
            mode & 0o7777, 0, 0, size, mtime)
        tail = kind + raw_link.ljust(100, b"\0") + b"ustar\x0000" + bytes(247)
        # the checksum is the sum of the header's bytes with its own field as spaces
        return head + b"%06o\0 " % (sum(head) + 256 + sum(tail)) + tail
    import tarfile

    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.mtime, ti.linkname = kind, mode, mtime, link
    ti.size = size if kind == b"0" else 0
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _failed_header() -> bytes:
    record = b" CAPYBARA.failed=1\n"
    record = b"%d" % (len(record) + 2) + record  # its length counts itself: two digits
    return (tar_header("././@PaxHeader", b"g", 0o644, len(record), 0) + record
            + bytes(-len(record) % 512))


#: A global pax header saying that the member before it was not read whole (it shrank
#: while it was sent, and was padded): the provider drops that member.
FAILED_HEADER = _failed_header()


class TarOut(object):
    """A tar stream written to descriptor ``fd``: headers and small files gathered in
    memory (less than twice :data:`PACK_GATHER` bytes), larger files sent straight from
    their descriptors."""

    def __init__(self, fd: int, errors: "List[Answer]") -> None:
        self.fd = fd
        self.errors = errors
        self.buf = bytearray()
        self.sendfile = hasattr(os, "sendfile")

    def flush(self) -> None:
        with memoryview(self.buf) as view:
            done = 0
            while done < len(view):
                done += os.write(self.fd, view[done:])
        del self.buf[:]

    def add(self, header: bytes) -> None:
        self.buf += header
        if len(self.buf) >= PACK_GATHER:
            self.flush()

    def add_file(self, header: bytes, fd: int, size: int, path: str) -> None:
        """``header``, then exactly ``size`` bytes of ``fd``: cut if the file grew, padded
        with zeros (and reported) if it shrank while it was read."""
        self.buf += header
        left = size
        if size > PACK_GATHER and self.sendfile:
            self.flush()
            left = self._send(fd, size)
        short = False
        while left > 0:
            piece = b"" if short else os.read(fd, min(left, PACK_GATHER))
            if not piece:
                if not short:
                    short = True
                    self.errors.append({"error": "EIO", "path": path,
                                        "message": "the file shrank while it was read"})
                piece = bytes(min(left, PACK_GATHER))
            self.buf += piece
            left -= len(piece)
            if len(self.buf) >= PACK_GATHER:
                self.flush()
        self.add(bytes(-size % 512))
        if short:  # says so before the next member: the reader drops this one
            self.add(FAILED_HEADER)

    def _send(self, fd: int, size: int) -> int:
        """Send up to ``size`` bytes of ``fd`` with ``sendfile``; what is left (the end of
        a file that shrank, or all of it where ``sendfile`` does not work)."""
        offset = 0
        try:
            while offset < size:
                n = os.sendfile(self.fd, fd, offset, min(size - offset, 1 << 20))
                if not n:
                    break
                offset += n
        except OSError as exc:
            if offset or exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            self.sendfile = False
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        return size - offset

    def finish(self) -> None:
        self.add(bytes(1024))  # the end-of-archive blocks
        self.flush()


def pack(src: str, patterns: "List[str]") -> int:
    out = sys.stdout.buffer
    errors = []  # type: List[Answer]

    def head(**fields: object) -> None:
        out.write((dumps(fields) + "\n").encode("ascii"))
        out.flush()

    try:
        top = os.lstat(src)
    except OSError as exc:
        head(absent=unexamined(exc, src))
        return 4
    if stat.S_ISDIR(top.st_mode):
        items = list(walk(src, patterns, errors))
        single = False
    elif stat.S_ISREG(top.st_mode) or stat.S_ISLNK(top.st_mode):
        items = [(os.path.basename(src.rstrip("/")) or "file", src, top)]
        single = True
    else:
        head(absent={"error": "EINVAL", "path": src, "message": "it is " + type_of(top.st_mode)})
        return 4
    total = sum(st.st_size for _, _, st in items if stat.S_ISREG(st.st_mode))
    files = sum(1 for _, _, st in items if stat.S_ISREG(st.st_mode))
    head(total=total, files=files, single=single)
    enlarge_pipe(1)  # the output is read in large pieces, with fewer switches
    tar = TarOut(1, errors)
    for rel, path, st in items:
        mode, mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
        if stat.S_ISDIR(st.st_mode):
            tar.add(tar_header(rel, b"5", mode, 0, mtime))
        elif stat.S_ISLNK(st.st_mode):
            try:
                link = os.readlink(path)
            except OSError as exc:
                errors.append(error_of(exc, path))
                continue
            tar.add(tar_header(rel, b"2", mode, 0, mtime, link))
        elif stat.S_ISREG(st.st_mode):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                             | os.O_CLOEXEC)
            except OSError as exc:
                errors.append(error_of(exc, path))
                continue
            try:
                kind = os.fstat(fd).st_mode
                if stat.S_ISREG(kind):  # not something put in its place meanwhile
                    tar.add_file(tar_header(rel, b"0", mode, st.st_size, mtime), fd,
                                 st.st_size, path)
                else:
                    errors.append({"error": "EINVAL", "path": path,
                                   "message": "skipped: it is " + type_of(kind)})
            finally:
                os.close(fd)
        else:
            errors.append({"error": "EINVAL", "path": path,
                           "message": "skipped: it is " + type_of(st.st_mode)})
    tar.finish()
    sys.stderr.write(dumps({"errors": errors}) + "\n")
    return 1 if errors else 0


def check_root_only(fd: int, name: str) -> None:
    """Under the ``/skills`` rules: a directory root writes in must be root's and closed
    to everybody else (so nothing in it can change under root's feet)."""
    st = os.fstat(fd)
    if st.st_uid != 0 or st.st_mode & 0o022:
        raise PermissionError(
            errno.EPERM, "refused: %s is not root's alone (owner %d, mode %o)"
            % (name, st.st_uid, stat.S_IMODE(st.st_mode)), name)


def is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_dir(
    root_fd: int,
    parts: "List[str]",
    make: bool,
    root_rules: bool = False,
    made: "Optional[List[bool]]" = None,
    named: str = "",
) -> int:
    """Open the directory ``parts`` below ``root_fd`` without following a symbolic link,
    making missing ones when ``make``; a new descriptor. With ``root_rules`` every
    directory must pass :func:`check_root_only` (new ones are made 0755). ``made`` gets
    whether the last one was made here (so it holds nothing but what this run puts in);
    ``named`` is ``root_fd``'s path, for messages."""
    fd = os.dup(root_fd)
    try:
        for n, part in enumerate(parts):
            if made is not None:
                made[:] = [False]
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            except FileNotFoundError:
                if not make:
                    raise
                os.mkdir(part, 0o755 if root_rules else 0o777, dir_fd=fd)
                if made is not None:
                    made[:] = [True]
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
                if root_rules:
                    os.chmod(nfd, 0o755)
            except OSError as exc:
                # O_DIRECTORY | O_NOFOLLOW on a link fails with ENOTDIR (or ELOOP)
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and is_link(part, fd):
                    raise OSError(errno.ELOOP, "a symbolic link is in the way", part) from None
                raise
            os.close(fd)
            fd = nfd
            if root_rules:
                check_root_only(fd, named + "/".join(parts[:n + 1]))
        return fd
    except BaseException:
        os.close(fd)
        raise


def member_parts(name: str) -> "List[str]":
    """The components of a member's name; ValueError for one that leaves the
    destination."""
    if name.startswith("/") or "\0" in name:
        raise ValueError("absolute name")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError("name leaves the destination")
    return parts


def replace_with(
    dfd: int, name: str, tmp: str, make_tmp: "Callable[[str], None]", fresh: bool = False
) -> None:
    """Create the temporary entry ``tmp`` with ``make_tmp(tmp)`` in directory ``dfd`` and
    rename it over ``name``; the temporary entry never outlives a failure. Unless the
    directory is ``fresh`` (made by this run), what is in the way is checked first: a
    directory, or a file the user may not write, is refused."""
    old = None
    try:
        if not fresh:
            old = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    if old is not None:
        if stat.S_ISDIR(old.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a directory is in the way", name)
        if stat.S_ISREG(old.st_mode) and not os.access(name, os.W_OK, dir_fd=dfd):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
    try:
        make_tmp(tmp)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        unlink_quietly(tmp, dir_fd=dfd)
        raise


def open_root_dest(dest: str) -> int:
    """Open ``dest`` for root under the ``/skills`` rules: every directory from ``/`` down
    is opened without following a link and must be root's alone; missing ones are made."""
    top = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        check_root_only(top, "/")
        parts = [p for p in dest.split("/") if p]
        try:
            return open_dir(top, parts, True, root_rules=True, named="/")
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PermissionError(errno.EPERM, "refused: a symbolic link is on the way "
                                      "to %s" % dest, dest) from None
            raise
    finally:
        os.close(top)


class Extractor(object):
    """Writes tar members under one destination directory (see ``extract``).

    Directories are opened once and kept open while members keep coming for them (a tar
    stream lists a directory's entries together); each directory written in gets one
    temporary name for this run, registered once, used by one file at a time.
    """

    OPEN_DIRS = 32

    def __init__(self, root: int, dest: str, root_rules: bool, run: str = "") -> None:
        self.root = root
        self.dest = dest
        self.root_rules = root_rules
        self.files = self.dirs = self.symlinks = self.bytes = 0
        self.errors = []  # type: List[Answer]
        self.dir_modes = []  # type: List[Tuple[List[str], int, float]]
        self.open = []  # type: List[Tuple[Tuple[str, ...], int]]
        self.temps = {}  # type: Dict[Tuple[str, ...], str]
        self.entries = []  # type: List[Optional[str]]
        # the temporary names carry this (the operation's id, when the provider gave one,
        # so the clean-up of that operation finds them)
        self.run = run or os.urandom(6).hex()
        self.fresh: "Set[Tuple[str, ...]]" = set()

    def dir_fd(self, parts: "List[str]") -> int:
        """A descriptor of directory ``parts`` (kept open; do not close it)."""
        key = tuple(parts)
        if self.open and self.open[0][0] == key:  # the usual case: the last one again
            return self.open[0][1]
        for i, (k, fd) in enumerate(self.open):
            if k == key:
                self.open.insert(0, self.open.pop(i))
                return fd
        made = []  # type: List[bool]
        fd = open_dir(self.root, parts, True, self.root_rules, made,
                      named=self.dest.rstrip("/") + "/")
        if made == [True]:
            self.fresh.add(key)
        self.open.insert(0, (key, fd))
        while len(self.open) > self.OPEN_DIRS:
            os.close(self.open.pop()[1])
        return fd

    def temp_in(self, parts: "List[str]") -> str:
        """This run's temporary name in directory ``parts`` (registered on first use)."""
        key = tuple(parts)
        name = self.temps.get(key)
        if name is None:
            name = "%s%d-%s%x" % (PART, os.getpid(), self.run, len(self.temps))
            self.temps[key] = name
            self.entries.append(register(os.path.join(self.dest, *parts, name)))
        return name

    def member(self, tf: "TarReader", m: "Member") -> None:
        try:
            parts = member_parts(m.name)
        except ValueError as exc:
            self.errors.append({"error": "EINVAL", "path": m.name, "message": str(exc)})
            return
        try:
            if m.isdir():
                self.directory(parts, m)
                return
            dfd = self.dir_fd(parts[:-1])
            tmp = self.temp_in(parts[:-1])
            # in a directory this run made, nothing but its own entries can be in the way
            fresh = tuple(parts[:-1]) in self.fresh
            if m.isfile():
                replace_with(dfd, parts[-1], tmp, lambda t: self.file(dfd, t, tf, m), fresh)
                self.files += 1
                self.bytes += m.size
            elif m.issym():
                replace_with(dfd, parts[-1], tmp,
                             lambda t: os.symlink(m.linkname, t, dir_fd=dfd), fresh)
                self.symlinks += 1
            else:
                self.errors.append({"error": "EINVAL", "path": m.name, "message":
                                    "skipped: not a file, directory or symbolic link"})
        except OSError as exc:
            self.errors.append(error_of(exc, m.name))

    def directory(self, parts: "List[str]", m: "Member") -> None:
        dfd = self.dir_fd(parts)
        if not self.root_rules:
            os.chmod(dfd, 0o700 | (m.mode & 0o777))
            self.dir_modes.append((parts, m.mode & 0o777, m.mtime))
        self.dirs += 1

    def file(self, dfd: int, tmp: str, src: "TarReader", m: "Member") -> None:
        """Write member ``m`` (its data read from ``src``) to ``tmp`` in ``dfd``."""
        mode = 0o644 if self.root_rules else m.mode & 0o777
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=dfd)
        try:
            size = 0
            while size < m.size:
                block = src.read(min(m.size - size, 1 << 20))
                if not block:
                    break
                write_all(fd, block)
                size += len(block)
            if size != m.size:
                raise EOFError("incomplete member")
            if mode & _umask:
                os.fchmod(fd, mode)  # what the umask took at the open
            os.utime(fd, (m.mtime, m.mtime))
        finally:
            os.close(fd)

    def finish(self) -> None:
        """Close the directories, drop the registry entries, and give directories their
        own modes last (deepest first: a read-only directory must not stop what goes below
        it)."""
        for _, fd in self.open:
            os.close(fd)
        self.open = []
        for entry in self.entries:
            unregister(entry)
        for parts, mode, mtime in reversed(self.dir_modes):
            try:
                dfd = open_dir(self.root, parts, False)
                try:
                    os.chmod(dfd, mode)
                    os.utime(dfd, (mtime, mtime))
                finally:
                    os.close(dfd)
            except OSError:
                pass

    def summary(self, complete: bool) -> "Answer":
        return {"files": self.files, "dirs": self.dirs, "symlinks": self.symlinks,
                "bytes": self.bytes, "errors": self.errors, "complete": complete}


class TarError(Exception):
    """The stream is not a tar stream (or broke off)."""


class Member(object):
    """One tar member's header: what ``extract`` needs of it."""

    def __init__(self, name: str, kind: bytes, mode: int, mtime: float, size: int,
                 linkname: str) -> None:
        self.name = name
        self.kind = kind
        self.mode = mode
        self.mtime = mtime
        self.size = size
        self.linkname = linkname

    def isdir(self) -> bool:
        return self.kind == b"5"

    def isfile(self) -> bool:
        return self.kind in (b"0", b"\0", b"7")

    def issym(self) -> bool:
        return self.kind == b"2"


def tar_number(field: bytes) -> int:
    """A tar header's number: octal text, or base-256 (a first byte with its high bit)."""
    if field[:1] and field[0] & 0x80:
        value = field[0] & 0x3F
        for byte in field[1:]:
            value = value * 256 + byte
        return -value if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarError("a header number is not octal") from None


class TarReader(object):
    """POSIX (ustar and pax) tar members read from a stream in order, at the speed of the
    stream: a reader for what the provider's upload writes (regular files, directories,
    symbolic links, pax path/linkpath/size/mtime records). Python's own tarfile costs
    about ten times as much per member read from a pipe."""

    BLOCK = 512

    def __init__(self, f: "BinaryIO") -> None:
        self.f = f
        self.left = 0  # data of the current member not read yet
        self.pad = 0

    def exactly(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise TarError("unexpected end of data")
        return data

    def skip_rest(self) -> None:
        while self.left > 0:
            self.read(min(self.left, 1 << 20))
        if self.pad:
            self.exactly(self.pad)
            self.pad = 0

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of the current member's data."""
        if n < 0 or n > self.left:
            n = self.left
        if n == 0:
            return b""
        data = self.f.read(n)
        if len(data) != n:
            raise TarError("unexpected end of data")
        self.left -= n
        return data

    def header(self) -> "Optional[Tuple[bytes, Dict[str, str]]]":
        block = self.f.read(self.BLOCK)
        if not block or block == bytes(self.BLOCK):
            return None
        if len(block) != self.BLOCK:
            raise TarError("unexpected end of data")
        stored = tar_number(block[148:156])
        total = sum(block) - sum(block[148:156]) + 8 * 32
        if stored != total:
            raise TarError("a header's checksum is wrong")
        return block, {}

    def next(self) -> "Optional[Member]":
        self.skip_rest()
        pax = {}  # type: Dict[str, str]
        while True:
            got = self.header()
            if got is None:
                return None
            block, _ = got
            kind = block[156:157]
            size = tar_number(block[124:136])
            if size < 0:
                raise TarError("a negative size")
            if kind in (b"x", b"g"):
                if size > (1 << 20):
                    raise TarError("an extended header is too large")
                data = self.exactly(size)
                self.exactly(-size % self.BLOCK)
                if kind == b"x":
                    pax.update(pax_records(data))
                continue
            name = block[0:100].split(b"\0", 1)[0]
            prefix = block[345:500].split(b"\0", 1)[0]
            if prefix and block[257:262] == b"ustar":
                name = prefix + b"/" + name
            link = block[157:257].split(b"\0", 1)[0]
            text_name = pax.get("path") or name.decode("utf-8", "surrogateescape")
            text_link = pax.get("linkpath") or link.decode("utf-8", "surrogateescape")
            if "size" in pax:
                size = int(pax["size"])
            mtime = float(pax["mtime"]) if "mtime" in pax else float(tar_number(block[136:148]))
            member = Member(text_name, kind, tar_number(block[100:108]) & 0o7777, mtime,
                            size, text_link)
            data_size = size if member.isfile() else 0
            self.left = data_size
            self.pad = -data_size % self.BLOCK
            return member


def pax_records(data: bytes) -> "Dict[str, str]":
    """The ``length key=value`` records of a pax extended header."""
    out = {}  # type: Dict[str, str]
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            raise TarError("a malformed pax record")
        try:
            length = int(data[pos:space])
        except ValueError:
            raise TarError("a malformed pax record") from None
        if length <= 0 or pos + length > len(data):
            raise TarError("a malformed pax record")
        record = data[space + 1 : pos + length - 1]
        key, eq, value = record.partition(b"=")
        if not eq:
            raise TarError("a malformed pax record")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def extract(dest: str, end_name: str, root_rules: bool = False, run: str = "") -> int:
    import io

    if root_rules:
        try:
            root = open_root_dest(dest)
        except OSError as exc:
            out = {"files": 0, "dirs": 0, "symlinks": 0, "bytes": 0, "complete": False,
                   "refused": True, "errors": [error_of(exc, dest)]}
            sys.stdout.write(dumps(out) + "\n")
            sys.stdout.flush()
            return 80
    else:
        try:
            os.makedirs(dest, exist_ok=True)
            root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:  # not a directory, or the user may not make or open it
            if isinstance(exc, FileExistsError) or exc.errno == errno.ENOTDIR:
                exc = NotADirectoryError(errno.ENOTDIR, "it is not a directory", dest)
            out = {"files": 0, "dirs": 0, "symlinks": 0, "bytes": 0, "complete": False,
                   "unwritable": True, "errors": [error_of(exc, dest)]}
            sys.stdout.write(dumps(out) + "\n")
            sys.stdout.flush()
            return 4
    x = Extractor(root, dest, root_rules, run)
    complete = False
    reader = TarReader(io.BufferedReader(io.FileIO(0, closefd=False), buffer_size=1 << 20))
    try:
        while True:
            m = reader.next()
            if m is None:
                break
            if m.name == end_name:
                complete = True
            elif complete:
                x.errors.append({"error": "EINVAL", "path": m.name,
                                 "message": "member after the end marker"})
            else:
                x.member(reader, m)
    except (TarError, EOFError, ValueError) as exc:
        x.errors.append({"error": "EIO", "path": None,
                         "message": "the archive broke off: %s" % exc})
        complete = False
    finally:
        x.finish()
        os.close(root)
    sys.stdout.write(dumps(x.summary(complete)) + "\n")
    sys.stdout.flush()
    if not complete:
        return 3
    return 1 if x.errors else 0


def main(argv: "List[str]") -> int:
    mode = argv[0] if argv else ""
    if mode == "serve":
        return serve(float(argv[1]))
    if mode == "pack":
        return pack(argv[1], argv[3:])
    if mode == "extract":
        ops = [a[3:] for a in argv[3:] if a.startswith("op=")]
        run = ops[0] if ops and len(ops[0]) == 32 and all(c in "0123456789abcdef"
                                                           for c in ops[0]) else ""
        return extract(argv[1], argv[2], "root" in argv[3:], run)
    if mode == "sweep":
        sys.stdout.write("%d\n" % sweep())
        return 0
    sys.stderr.write("usage: serve IDLE | pack SRC [EXCLUDE...] | extract DEST END | sweep\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
