"""A background command's supervisor, inside a sandbox, as the sandbox user or as root.

The provider sends this file's text to the sandbox's ``python3`` (``python3 -I -S -X utf8
-c <boot> capybara-bg ID CTL SECONDS CAP STDIN LC WRAPPER COMMAND``, the text in the
environment, see the package's docstring) through envd's
``Start``; envd keeps it as the command's process (its pid is the command's pid, its
standard input the command's). Standard library only, Python 3.6 or later; it never
imports the library.

It runs ``setsid -w /bin/sh -c WRAPPER capybara-exec CTL COMMAND SECONDS`` — the exec
wrapper, with its own session, pid file, ``.kill`` refusal and ``timeout -s KILL SECONDS``
(``0``: none) — with the exec marker ``CAPYBARA_EXEC=CTL`` added to its environment (the
supervisor itself has none, so the kill scripts stop the command and leave the supervisor
to record how it ended). ``LC`` is ``1`` when ``LC_CTYPE`` was set before Python started
(else a ``LC_CTYPE`` Python added for itself is not passed on).

Everything the command prints is kept in the record directory ``RECORDS/ID`` (mode 0700;
a root supervisor's ``RECORDS`` is :data:`ROOT_RECORDS`, in root's home, where no other
account can make or replace a name):
each stream's last ``CAP`` bytes at least, in generation files ``stdout.<g>`` and
``stderr.<g>`` of ``CAP`` bytes each (byte ``n`` of a stream is in generation ``n // CAP``;
the two newest generations are kept). ``meta.json`` says what runs; ``status.json``
appears, whole, once it ended (``killed`` when a ``killed`` file was put in the record
before the end: the library's kill does).

On standard output it writes frames for live followers (envd's ``Connect``): a header
(:data:`FRAME`: magic ``CB``, kind, stream offset, length) and that many bytes: ``r``
(ready: JSON), ``o`` / ``e`` (output at that offset of stdout / stderr), ``x`` (ended:
the status JSON). Standard output is non-blocking: when nobody reads it fast enough frames
are dropped whole, never the command's output (a follower sees the gap in the offsets and
reads it from the record).
"""

import errno
import fcntl
import json
import os
import select
import signal
import struct
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional  # noqa: F401 (type comments)

#: Where records live (one directory per command, named by its id).
RECORDS = "/tmp/.capybara-cmd"
#: Where root's records live: its home must be root's own directory, open to no other
#: account's writes (a root supervisor refuses to keep records elsewhere).
ROOT_RECORDS = "/root/.capybara-cmd"
#: A frame's header: magic, kind, offset, length.
FRAME = struct.Struct(">2ssQI")
MAGIC = b"CB"
#: Exec marker variable (as the library's exec wrapper uses it).
MARKER = "CAPYBARA_EXEC"
#: After the command's wrapper exited, output still arriving is read for this long.
DRAIN_SECONDS = 2.0
READ_SIZE = 65536


class Log(object):
    """One stream's generation files."""

    def __init__(self, directory, name, cap):
        # type: (str, str, int) -> None
        self.directory = directory
        self.name = name
        self.cap = cap
        self.gen = 0
        self.used = 0
        self.fd = self._open(0)

    def _open(self, gen):
        # type: (int) -> int
        return create(os.path.join(self.directory, "%s.%d" % (self.name, gen)), os.O_APPEND)

    @property
    def total(self):
        # type: () -> int
        return self.gen * self.cap + self.used

    def write(self, data):
        # type: (bytes) -> None
        view = memoryview(data)
        while view:
            room = self.cap - self.used
            if room <= 0:
                os.close(self.fd)
                self.gen += 1
                self.used = 0
                self.fd = self._open(self.gen)
                old = os.path.join(self.directory, "%s.%d" % (self.name, self.gen - 2))
                try:
                    os.unlink(old)
                except OSError:
                    pass
                continue
            piece = view[:room]
            written = 0
            while written < len(piece):
                written += os.write(self.fd, piece[written:])
            self.used += len(piece)
            view = view[len(piece):]


class Frames(object):
    """Frames to standard output, non-blocking; whole frames are dropped when it is full."""

    def __init__(self, fd):
        # type: (int) -> None
        self.fd = fd
        self.pending = b""
        self.broken = False
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        except OSError:
            self.broken = True

    def _push(self):
        # type: () -> bool
        while self.pending and not self.broken:
            try:
                n = os.write(self.fd, self.pending)
            except BlockingIOError:
                return False
            except OSError:
                self.broken = True
                return False
            self.pending = self.pending[n:]
        return not self.pending

    def send(self, kind, offset, data):
        # type: (bytes, int, bytes) -> None
        if self.broken or not self._push():
            return  # still finishing an earlier frame: this one is dropped
        self.pending = FRAME.pack(MAGIC, kind, offset, len(data)) + data
        self._push()

    def flush(self, seconds):
        # type: (float) -> None
        """Finish the frame in progress (blocking up to ``seconds``)."""
        end = time.monotonic() + seconds
        while self.pending and not self.broken and time.monotonic() < end:
            if not self._push():
                select.select([], [self.fd], [], max(0.0, end - time.monotonic()))


def create(path, flags=0):
    # type: (str, int) -> int
    """A new regular file ``path`` of the record, open for writing. The record is the
    sandbox user's to write: whatever was put in its place (a FIFO, whose open would wait
    for a reader; a link, which would lead elsewhere) is removed first."""
    for _ in range(5):
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                           | os.O_CLOEXEC | flags, 0o600)
        except FileExistsError:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    raise OSError(errno.EEXIST, "something keeps taking the place of a record file", path)


def write_json(directory, name, value):
    # type: (str, str, Dict[str, Any]) -> None
    tmp = os.path.join(directory, ".%s.%d" % (name, os.getpid()))
    with os.fdopen(create(tmp), "w") as f:
        json.dump(value, f)
    os.rename(tmp, os.path.join(directory, name))


def own_directory(path, mode, closed):
    # type: (str, int, int) -> bool
    """Make directory ``path`` (``mode``) if it is missing; whether it is now a directory
    of this user's, not a link, with none of the ``closed`` mode bits."""
    try:
        os.mkdir(path, mode)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise
    st = os.lstat(path)
    return (st.st_uid == os.getuid() and (st.st_mode & closed) == 0
            and os.path.isdir(path) and not os.path.islink(path))


def records_directory():
    # type: () -> Optional[str]
    """This user's records directory, made if missing; None when it (or, for root, root's
    home) is not this user's own."""
    if os.getuid() != 0:
        return RECORDS if own_directory(RECORDS, 0o700, 0o077) else None
    home = os.path.dirname(ROOT_RECORDS)
    if not own_directory(home, 0o700, 0o022):
        return None
    return ROOT_RECORDS if own_directory(ROOT_RECORDS, 0o700, 0o077) else None


def main(argv):
    # type: (List[str]) -> int
    # argv[0] is "-c", argv[1] the name "capybara-bg" (for ps)
    (cid, ctl, seconds, cap_text, stdin_flag, lc_flag, wrapper, command) = argv[2:10]
    cap = max(1024, int(cap_text))
    secs = float(seconds)
    os.umask(0o077)
    records = records_directory()
    if records is None:
        sys.stderr.write("capybara-bg: %s is not this user's own directory\n"
                         % (ROOT_RECORDS if os.getuid() == 0 else RECORDS))
        return 90
    directory = os.path.join(records, cid)
    os.mkdir(directory, 0o700)  # a fresh id: an existing record is an error
    started = time.time()
    env = dict(os.environ)
    if lc_flag != "1":
        env.pop("LC_CTYPE", None)
    env[MARKER] = ctl
    logs = {b"o": Log(directory, "stdout", cap), b"e": Log(directory, "stderr", cap)}
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the command: the exec wrapper in its own session
        try:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.execvpe("setsid", ["setsid", "-w", "/bin/sh", "-c", wrapper, "capybara-exec",
                                  ctl, command, seconds], env)
        finally:
            os._exit(127)
    os.close(out_w)
    os.close(err_w)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the command alone holds envd's stdin pipe: CloseStdin reaches it
    os.close(devnull)
    frames = Frames(1)
    meta = {"id": cid, "command": command, "ctl": ctl, "started_at": started, "cap": cap,
            "stdin": stdin_flag == "1", "timeout": secs, "pid": os.getpid(),
            "wrapper_pid": pid}
    write_json(directory, "meta.json", meta)
    frames.send(b"r", 0, json.dumps(meta).encode())

    def stop(_sig, _frame):
        # type: (int, object) -> None
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    open_fds = {out_r: b"o", err_r: b"e"}
    status = None  # type: Optional[int]
    drain_until = None  # type: Optional[float]
    while open_fds:
        wait = 0.5
        if drain_until is not None:
            wait = drain_until - time.monotonic()
            if wait <= 0:
                break
        try:
            ready, _, _ = select.select(list(open_fds), [], [], min(wait, 0.5))
        except InterruptedError:
            ready = []
        for fd in ready:
            try:
                data = os.read(fd, READ_SIZE)
            except OSError:
                data = b""
            kind = open_fds[fd]
            if not data:
                del open_fds[fd]
                os.close(fd)
                continue
            log = logs[kind]
            offset = log.total
            log.write(data)
            frames.send(kind, offset, data)
        if status is None:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status = code
                drain_until = time.monotonic() + DRAIN_SECONDS
    if status is None:
        while True:
            try:
                status = os.waitpid(pid, 0)[1]
                break
            except InterruptedError:
                continue
    ended = time.time()
    killed = os.path.exists(os.path.join(directory, "killed"))
    exit_code = None  # type: Optional[int]
    sig = None  # type: Optional[int]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        exit_code = 128 + sig
    else:
        exit_code = os.WEXITSTATUS(status)
    timed_out = (not killed and sig is None and exit_code == 137 and secs > 0
                 and ended - started >= secs - 1.0)
    result = {"exit_code": exit_code, "signal": sig, "timed_out": timed_out,
              "killed": killed, "ended_at": ended,
              "stdout_total": logs[b"o"].total, "stderr_total": logs[b"e"].total}
    write_json(directory, "status.json", result)
    frames.flush(1.0)
    frames.send(b"x", 0, json.dumps(result).encode())
    frames.flush(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
