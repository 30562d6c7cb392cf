"""A headless Chromium for tests: load a page, wait for what its JavaScript writes, read it.

``--dump-dom`` is not enough for pages that change after network traffic: it prints the DOM
when the load event has fired (``--virtual-time-budget`` does not wait for a WebSocket
either), so a page that writes a WebSocket echo is printed before the echo arrives, or after,
by chance. This module drives the browser over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: JSON messages ending in NUL, commands on the browser's fd 3,
answers on its fd 4), which needs no port and no WebSocket client, and polls the page with
``Runtime.evaluate`` until the expected text is there or the time is up.

Every browser runs headless as root in a container (``--no-sandbox``), with a temporary
profile and home directory and no network services of its own (no updates, sync, metrics,
crash reports). Everything is bounded: each DevTools call by the page's deadline, closing by
a few seconds; the browser's whole process tree (its session) is then killed and the
temporary directory removed, whatever happened.

When an expectation fails, :meth:`Page.expect_text` saves a screenshot (and the page's HTML)
into the artifacts directory (``$E2B_PROVIDER_ARTIFACTS``, else ``artifacts/`` in the
repository) and names it in the ``AssertionError``, with the text it last saw, the page's
console messages and the browser's last stderr lines.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Iterator, List, NoReturn, Optional

__all__ = [
    "BrowserError",
    "OpenPage",
    "Page",
    "artifacts_dir",
    "find_chromium",
    "open_page",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

FLAGS = (
    "--headless",
    # root in a container: no user namespaces for Chromium's own sandbox
    "--no-sandbox",
    "--disable-gpu",
    # /dev/shm is small in containers; use the temporary directory instead
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-proxy-server",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--disable-domain-reliability",
    "--disable-breakpad",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
    "--metrics-recording-only",
    "--no-pings",
    "--password-store=basic",
    "--use-mock-keychain",
    "--mute-audio",
    "--hide-scrollbars",
    "--window-size=1024,768",
    "--remote-debugging-pipe",
)

CLOSE_BOUND = 5.0  # seconds for Browser.close before the process tree is killed


class BrowserError(Exception):
    """The browser did not answer in time, went away, or refused a DevTools command."""


def find_chromium() -> Optional[str]:
    """The path of the first Chromium-like browser on ``PATH``, or None."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def artifacts_dir() -> Path:
    """Where failure screenshots go: ``$E2B_PROVIDER_ARTIFACTS`` or ``<repo>/artifacts``."""
    return Path(os.environ.get("E2B_PROVIDER_ARTIFACTS") or REPO_ROOT / "artifacts")


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:120] or "page"


def _browser_pids(sid: int, marker: str) -> List[int]:
    """Live processes of session ``sid`` (the browser's descendants that kept it) or whose
    command line has ``marker`` (the temporary directory: crashpad's handler, which leaves
    the session, has its database there)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        # fields after the command name "(...)": state ppid pgrp session ...; a zombie is
        # dead already (its parent, or init, reaps it)
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) < 4 or fields[0] == "Z":
            continue
        if fields[3] == str(sid) or marker in cmdline:
            pids.append(int(entry))
    return pids


class _Pipe:
    """The DevTools protocol on the browser's pipe: one command at a time, events kept."""

    def __init__(self, to_browser: int, from_browser: int) -> None:
        self._w = to_browser
        self._r = from_browser
        os.set_blocking(self._w, False)
        os.set_blocking(self._r, False)
        self._buf = b""
        self._next_id = 0
        self.events: List[Dict[str, Any]] = []

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, *,
             session: Optional[str] = None, deadline: float) -> Dict[str, Any]:
        self._next_id += 1
        msg: Dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        self._write(json.dumps(msg).encode() + b"\0", method, deadline)
        while True:
            answer = self._read(method, deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                result: Dict[str, Any] = answer.get("result", {})
                return result
            if "method" in answer:
                self.events.append(answer)

    def _write(self, data: bytes, method: str, deadline: float) -> None:
        while data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"timed out sending {method} to the browser")
            _, ready, _ = select.select([], [self._w], [], left)
            if ready:
                try:
                    data = data[os.write(self._w, data):]
                except BrokenPipeError:
                    raise BrowserError(f"the browser went away (sending {method})") from None

    def _read(self, method: str, deadline: float) -> Dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"timed out waiting for the browser's answer to {method}")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise BrowserError(f"the browser went away (waiting for {method})")
                self._buf += chunk
        message, _, self._buf = self._buf.partition(b"\0")
        parsed: Dict[str, Any] = json.loads(message)
        return parsed


class Page:
    """One tab of a running headless browser (made by :func:`open_page`)."""

    def __init__(self, pipe: _Pipe, session: str, url: str, name: str, deadline: float,
                 temp_dir: Path, pid: int) -> None:
        self._pipe = pipe
        self._session = session
        self.url = url
        self.name = name
        self.deadline = deadline
        self.temp_dir = temp_dir
        """The browser's profile, home and stderr; removed when the page is closed."""
        self._stderr_path = temp_dir / "stderr.txt"
        self.pid = pid
        """The browser's process id; its session id too (its descendants share it)."""

    def _call(self, method: str, params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return self._pipe.call(method, params, session=self._session, deadline=self.deadline)

    def evaluate(self, expression: str) -> Any:
        """The value (as JSON) of a JavaScript expression in the page."""
        r = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression!r} raised: {r['exceptionDetails']}")
        return r.get("result", {}).get("value")

    def text(self, selector: str) -> Optional[str]:
        """The ``textContent`` of the first element matching ``selector``, or None."""
        value = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " return e === null ? null : e.textContent; })()")
        return None if value is None else str(value)

    def html(self) -> str:
        """The page's DOM as HTML, as it is now (after its scripts ran)."""
        return str(self.evaluate("document.documentElement.outerHTML"))

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the viewport at ``path`` and return it."""
        data = self._call("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def console(self) -> List[str]:
        """The page's console messages, uncaught exceptions and browser log entries so far."""
        lines = []
        for ev in self._pipe.events:
            p = ev.get("params", {})
            if ev["method"] == "Runtime.consoleAPICalled":
                args = " ".join(str(a.get("value", a.get("description", ""))) for a in
                                p.get("args", []))
                lines.append(f"console.{p.get('type')}: {args}")
            elif ev["method"] == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                lines.append(f"exception: {d.get('exception', {}).get('description') or d}")
            elif ev["method"] == "Log.entryAdded":
                e = p.get("entry", {})
                lines.append(f"log.{e.get('level')}: {e.get('text')} {e.get('url', '')}".strip())
        return lines

    def stderr_tail(self, lines: int = 20) -> str:
        """The browser's last stderr lines (without its complaints about a missing D-Bus)."""
        return _stderr_tail(self._stderr_path, lines)

    def expect_text(self, selector: str, expected: str, timeout: float = 20.0) -> None:
        """Wait until the ``textContent`` of ``selector`` is ``expected``.

        Polls the page (every 50 ms) for at most ``timeout`` seconds (and not past the page's
        deadline).

        Raises:
            AssertionError: the text did not come: the message has what was seen last, the
                path of a screenshot saved in :func:`artifacts_dir` (and of the HTML beside
                it), the page's console and the browser's stderr.
        """
        end = min(time.monotonic() + timeout, self.deadline)
        seen: Optional[str] = None
        problem = ""
        while True:
            try:
                seen = self.text(selector)
                problem = ""
            except BrowserError as exc:
                # a page between documents has no context to evaluate in for a moment
                problem = f" (last poll: {exc})"
            if seen == expected:
                return
            if time.monotonic() >= end:
                break
            time.sleep(0.05)
        self.fail(f"{selector} of {self.url}: expected {expected!r}, saw {seen!r} after "
                  f"{timeout:g} s{problem}")

    def fail(self, what: str) -> NoReturn:
        """Raise ``AssertionError(what)`` with a screenshot's path and the page's diagnostics."""
        base = _unused(
            artifacts_dir() / f"{_safe_name(self.name)}-{time.strftime('%Y%m%d-%H%M%S')}")
        # the screenshot gets its own short bound: the page's deadline may have passed
        self.deadline = max(self.deadline, time.monotonic() + 10.0)
        try:
            base.parent.mkdir(parents=True, exist_ok=True)
            shot = f"screenshot: {self.screenshot(base.with_suffix('.png'))}"
        except (BrowserError, OSError) as exc:
            shot = f"no screenshot ({exc})"
        try:
            base.with_suffix(".html").write_text(self.html())
            shot += f"\nhtml: {base.with_suffix('.html')}"
        except (BrowserError, OSError):
            pass
        console = "\n".join(self.console()) or "(none)"
        raise AssertionError(f"{what}\n{shot}\npage console:\n{console}\n"
                             f"browser stderr (last lines):\n{self.stderr_tail()}")


def _high_fd(fd: int) -> int:
    """``fd`` moved to 10 or above (close-on-exec), clear of the browser's fds 3 and 4."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


OpenPage = Callable[..., ContextManager[Page]]
"""What the ``browser`` fixture is: ``browser(url, timeout=60.0)`` opens a :class:`Page`."""


def _stderr_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if ":ERROR:dbus/" not in line]
    return "\n".join(kept[-lines:])


def _unused(base: Path) -> Path:
    """``base`` with a ``-N`` suffix if needed so that no ``.png`` or ``.html`` of it exists."""
    n, path = 1, base
    while path.with_suffix(".png").exists() or path.with_suffix(".html").exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _kill_tree(proc: subprocess.Popen[bytes], marker: str) -> None:
    """SIGKILL the browser and every process it started (see :func:`_browser_pids`), and
    reap the browser."""
    for _ in range(50):
        pids = _browser_pids(proc.pid, marker)
        if proc.poll() is None and proc.pid not in pids:
            pids.append(proc.pid)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(0.1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5.0)


@contextlib.contextmanager
def open_page(url: str, *, name: str = "page", timeout: float = 60.0,
              binary: Optional[str] = None) -> Iterator[Page]:
    """Start a headless browser, open ``url`` in a new tab, and yield the :class:`Page`.

    ``timeout`` bounds everything done with the page (each DevTools call stops at the
    deadline). On exit the browser is closed (at most 5 s), then its process tree is killed
    and its temporary directory removed, also when the body raised.

    Args:
        url: what to load.
        name: names failure artifacts (a test's name, say).
        timeout: seconds from now that the page may be used.
        binary: the browser (default: :func:`find_chromium`).

    Raises:
        BrowserError: no browser, it did not start, or the navigation failed (a refused
            connection, say).
    """
    exe = binary or find_chromium()
    if exe is None:
        raise BrowserError(f"no browser found on PATH (tried {', '.join(CANDIDATES)})")
    deadline = time.monotonic() + timeout
    tmp = Path(tempfile.mkdtemp(prefix="e2b-provider-chromium-"))
    stderr_path = tmp / "stderr.txt"
    to_browser_r, to_browser_w = map(_high_fd, os.pipe())
    from_browser_r, from_browser_w = map(_high_fd, os.pipe())
    env = dict(os.environ, HOME=str(tmp / "home"), XDG_CONFIG_HOME=str(tmp / "home/.config"),
               XDG_CACHE_HOME=str(tmp / "home/.cache"), TMPDIR=str(tmp))
    proc: Optional[subprocess.Popen[bytes]] = None
    try:
        with open(stderr_path, "wb") as err:
            # The browser takes commands on fd 3 and answers on fd 4; bash puts the pipes
            # there (no preexec_fn: the test process has threads).
            proc = subprocess.Popen(
                ["/bin/bash", "-c",
                 f'exec "$@" 3<&{to_browser_r} 4>&{from_browser_w} '
                 f"{to_browser_r}<&- {from_browser_w}>&-",
                 "bash", exe, *FLAGS, f"--user-data-dir={tmp / 'profile'}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                pass_fds=(to_browser_r, from_browser_w), start_new_session=True,
            )
        os.close(to_browser_r)
        os.close(from_browser_w)
        to_browser_r = from_browser_w = -1
        pipe = _Pipe(to_browser_w, from_browser_r)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"},
                               deadline=deadline)["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                deadline=deadline)["sessionId"]
            page = Page(pipe, session, url, name, deadline, tmp, proc.pid)
            for domain in ("Page", "Runtime", "Log"):
                page._call(f"{domain}.enable")
            nav = page._call("Page.navigate", {"url": url})
        except BrowserError as exc:
            raise BrowserError(f"{exc}\nbrowser stderr (last lines):\n"
                               f"{_stderr_tail(stderr_path)}") from None
        if nav.get("errorText"):
            raise BrowserError(f"loading {url} failed: {nav['errorText']}")
        try:
            yield page
        finally:
            with contextlib.suppress(BrowserError, OSError):
                pipe.call("Browser.close", deadline=time.monotonic() + CLOSE_BOUND)
    finally:
        for fd in (to_browser_r, from_browser_w, to_browser_w, from_browser_r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if proc is not None:
            _kill_tree(proc, str(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
