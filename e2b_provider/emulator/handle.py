"""The :class:`Emulator` handle: run the local E2B emulator as a subprocess from Python.

This module owns starting ``python -m e2b_provider.emulator`` (bounded wait for the export
lines it writes on stdout once it serves), the URLs and key clients need, configuration
helpers for this library and for the official SDK, the fault-injection and inspection calls of
the admin API, and stopping the subprocess (SIGTERM, bounded wait, then SIGKILL) — on every
exit path, including exceptions and KeyboardInterrupt. The subprocess runs in a session of its
own, so an interrupt sent to the caller's process group (Ctrl-C in a terminal, a notebook
kernel interrupt) does not reach it; it exits when the caller's process does. It uses only the
standard library (``subprocess``, ``urllib``) and the emulator's :mod:`.runtime` helpers, so
importing it needs neither aiohttp nor requests.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import IO, TYPE_CHECKING, Any, Dict, List, Optional

from .runtime import SandboxRuntimeError, remove_tree
from .runtime.linux import mounts_under

if TYPE_CHECKING:
    from ..config import DeploymentConfig

__all__ = ["Emulator", "EmulatorError", "EmulatorUnavailable", "remove_state_dir"]

#: Exit status of the CLI when sandbox isolation is unavailable on this machine.
EXIT_UNAVAILABLE = 2
#: The domain the emulator reports (matches ``state.DEFAULT_DOMAIN``).
DOMAIN = "e2b.localhost"
_ADMIN_TIMEOUT_SECONDS = 30.0
_KEY_FIELD = re.compile(r"(api_key=|E2B_API_KEY=)\S*")
#: The emulator's last line on stdout once it serves (see ``python -m e2b_provider.emulator``).
_LAST_EXPORT = b"export E2B_TEMPLATE="


def _hide_key(line: str) -> str:
    """``line`` with the value of an ``api_key=``/``E2B_API_KEY=`` field masked (for error
    messages)."""
    return _KEY_FIELD.sub(r"\1***", line)


class EmulatorError(RuntimeError):
    """The emulator could not be started or an admin call failed."""


class EmulatorUnavailable(EmulatorError):
    """Sandbox isolation is not available here (the CLI exited with status 2).

    The message says what is missing and how to fix it.
    """


class Emulator:
    """A local E2B emulator running in a subprocess.

    Use it as a context manager::

        with Emulator() as emu:
            provider = E2BSandboxProvider(emu.config())

    or, in a notebook, ``emu = Emulator().start()`` … ``emu.close()``. The emulator runs in a
    session of its own: a kernel interrupt or a terminal's Ctrl-C (SIGINT to this process's
    group) does not stop it; it stops on :meth:`stop`/:meth:`close`, at the end of the
    ``with`` block, and when this process exits.

    Args:
        api_key: the key clients must send; default: a random one chosen by the emulator.
        host: address to bind (loopback by default).
        port: port to bind; 0 picks a free one.
        state_dir: where sandboxes keep their files; default: a temporary directory created
            here and removed by :meth:`stop`.
        startup_timeout: seconds to wait until it serves (its export lines).
        log_level: the emulator's stderr log level (``debug``/``info``/``warning``/``error``).
        cpu_count: CPUs of every sandbox (the template's; default 2).
        memory_mb: memory limit of every sandbox in MiB (default 512).
        disk_mb: disk size of every sandbox in MiB (default 1024).
        max_processes: processes and threads a sandbox may have at once (default 1024).
        boot_timeout: seconds a sandbox's boot may go without progress before its create
            fails (default 30; a boot that progresses may take four times that).
        max_boots: sandboxes booting at once, the other creates waiting their turn
            (default: the host's CPUs, at least 2).

    Raises (from :meth:`start` / ``__enter__``):
        EmulatorUnavailable: isolation is unavailable on this machine (message included).
        EmulatorError: the emulator exited or did not become ready in time.
    """

    def __init__(
        self,
        api_key: Optional[str] = None,
        host: str = "127.0.0.1",
        port: int = 0,
        state_dir: Optional[str] = None,
        startup_timeout: float = 30.0,
        *,
        log_level: str = "warning",
        cpu_count: Optional[int] = None,
        memory_mb: Optional[int] = None,
        disk_mb: Optional[int] = None,
        max_processes: Optional[int] = None,
        boot_timeout: Optional[float] = None,
        max_boots: Optional[int] = None,
    ) -> None:
        self._requested_key = api_key
        self._host = host
        self._port = port
        self._state_dir = state_dir
        self._own_state_dir: Optional[str] = None
        self._startup_timeout = startup_timeout
        self._log_level = log_level
        self._resources = {
            "--cpu-count": cpu_count,
            "--memory-mb": memory_mb,
            "--disk-mb": disk_mb,
            "--max-processes": max_processes,
            "--boot-timeout": boot_timeout,
            "--max-boots": max_boots,
        }
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._stderr: Optional[IO[bytes]] = None
        self._api_url: Optional[str] = None
        self._sandbox_url: Optional[str] = None
        self._api_key: Optional[str] = None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<Emulator {state} api_url={self._api_url!r} pid={self.pid}>"

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> Emulator:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> Emulator:
        """Start the subprocess and wait (bounded) until it serves. Idempotent."""
        if self._proc is not None:
            return self
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        state_dir = self._state_dir
        extra: List[str] = []
        if state_dir is None:
            # made here so it can be removed even if the emulator is SIGKILLed; the emulator
            # removes it too when it stops (also when this process dies without stopping it)
            state_dir = self._own_state_dir = tempfile.mkdtemp(prefix="e2b-emulator-")
            extra.append("--remove-state-dir")
        for flag, value in self._resources.items():
            if value is not None:
                extra += [flag, str(value)]
        cmd = [
            sys.executable,
            "-m",
            "e2b_provider.emulator",
            "--host",
            self._host,
            "--port",
            str(self._port),
            "--state-dir",
            state_dir,
            "--log-level",
            self._log_level,
            "--exit-with-parent",
            "--parent-pid",
            str(os.getpid()),
            *extra,
        ]
        env = dict(os.environ)
        env.pop("E2B_EMULATOR_API_KEY", None)
        if self._requested_key is not None:
            # passed through the environment, not argv, so it does not show up in ps
            env["E2B_EMULATOR_API_KEY"] = self._requested_key
        self._stderr = tempfile.TemporaryFile(prefix="e2b-emulator-stderr-")
        # A session of its own: an interrupt of this process's group (Ctrl-C in a terminal, a
        # notebook kernel interrupt) must not stop the emulator; it still exits with this
        # process (--exit-with-parent) and on stop().
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            close_fds=True,
            start_new_session=True,
        )
        exports = self._read_exports(self._proc, self._startup_timeout)
        try:
            self._api_url = exports["E2B_API_URL"]
            self._sandbox_url = exports["E2B_SANDBOX_URL"]
            self._api_key = exports["E2B_API_KEY"]
        except KeyError as exc:
            raise EmulatorError(f"the emulator did not export {exc.args[0]}") from None

    def _read_exports(self, proc: subprocess.Popen[bytes], timeout: float) -> Dict[str, str]:
        """The ``export NAME=VALUE`` lines the emulator writes on stdout once it serves (up
        to ``export E2B_TEMPLATE=...``, its last), as a dict."""
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while not any(
                line.startswith(_LAST_EXPORT) for line in buf.split(b"\n")[:-1]
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EmulatorError(
                        f"the emulator did not become ready within {timeout:g} s"
                        + self._stderr_tail()
                    )
                if sel.select(timeout=min(left, 0.5)):
                    chunk = os.read(proc.stdout.fileno(), 4096)
                    if not chunk:
                        self._raise_exited(proc, deadline)
                    buf += chunk
                elif proc.poll() is not None:
                    self._raise_exited(proc, deadline)
        exports: Dict[str, str] = {}
        for raw in buf.split(b"\n")[:-1]:
            line = raw.decode("utf-8", "replace").strip()
            try:
                words = shlex.split(line)
            except ValueError:
                words = []
            if len(words) != 2 or words[0] != "export" or "=" not in words[1]:
                raise EmulatorError(f"unexpected output from the emulator: {_hide_key(line)!r}")
            key, _, value = words[1].partition("=")
            exports[key] = value
            if raw.startswith(_LAST_EXPORT):
                break
        return exports

    def _raise_exited(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        tail = self._stderr_tail()
        if code == EXIT_UNAVAILABLE:
            raise EmulatorUnavailable(tail.strip() or "sandbox isolation is unavailable")
        raise EmulatorError(f"the emulator exited with status {code} before it was ready{tail}")

    def _stderr_tail(self, limit: int = 4000) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0)
            text = self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        text = text[-limit:].strip()
        return f"\n{text}" if text else ""

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the emulator: SIGTERM (it destroys every sandbox), wait up to ``timeout``
        seconds, then SIGKILL. Idempotent; also removes a state directory created here."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(timeout=timeout)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(timeout=10)
            except BaseException:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
                raise
            finally:
                if proc.stdout is not None:
                    proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._own_state_dir is not None:
            remove_state_dir(self._own_state_dir)
            self._own_state_dir = None

    def close(self) -> None:
        """Same as :meth:`stop` with its default bound."""
        self.stop()

    def kill(self) -> None:
        """SIGKILL the emulator (no cleanup by it; for tests of crash behaviour)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    # -- properties -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the subprocess is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> Optional[int]:
        """The emulator process id (None when not started)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def api_url(self) -> str:
        """The control-plane base URL (``http://127.0.0.1:PORT``)."""
        return self._need(self._api_url)

    @property
    def sandbox_url(self) -> str:
        """The envd base URL (same server; routed by ``E2b-Sandbox-Id``)."""
        return self._need(self._sandbox_url)

    @property
    def api_key(self) -> str:
        """The API key the emulator accepts (a local throwaway key)."""
        return self._need(self._api_key)

    @property
    def state_dir(self) -> Optional[str]:
        """The directory where the sandboxes keep their files (None when not started)."""
        return self._own_state_dir or (self._state_dir if self._proc is not None else None)

    @property
    def domain(self) -> str:
        """The sandbox domain the emulator reports."""
        return DOMAIN

    @staticmethod
    def _need(value: Optional[str]) -> str:
        if value is None:
            raise EmulatorError("the emulator is not started")
        return value

    def config(self, template: str = "base", **overrides: Any) -> DeploymentConfig:
        """A :class:`~e2b_provider.config.DeploymentConfig` pointing at this emulator.

        ``overrides`` are passed on (e.g. ``timeout_seconds=600``, ``allow_open_egress=True``).
        """
        from ..config import DeploymentConfig

        kwargs: Dict[str, Any] = {
            "api_key": self.api_key,
            "template": template,
            "api_url": self.api_url,
            "sandbox_url": self.sandbox_url,
            "domain": self.domain,
        }
        kwargs.update(overrides)
        return DeploymentConfig(**kwargs)

    def sdk_env(self) -> Dict[str, str]:
        """Environment variables that point the official ``e2b`` SDK at this emulator."""
        return {
            "E2B_API_KEY": self.api_key,
            "E2B_API_URL": self.api_url,
            "E2B_SANDBOX_URL": self.sandbox_url,
            "E2B_DOMAIN": self.domain,
            "E2B_VOLUME_API_URL": self.api_url,
        }

    # -- admin API --------------------------------------------------------------------------

    def _admin(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.api_url + path,
            data=data,
            method=method,
            headers={"X-API-KEY": self.api_key, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=_ADMIN_TIMEOUT_SECONDS) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            exc.close()
            raise EmulatorError(f"{method} {path} failed: {exc.code} {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise EmulatorError(f"{method} {path} failed: {exc}") from None
        return json.loads(raw) if raw else None

    def _arm(self, kind: str, **params: Any) -> Dict[str, Any]:
        body = {"kind": kind, **{k: v for k, v in params.items() if v is not None}}
        result: Dict[str, Any] = self._admin("POST", "/_emulator/faults", body)
        return result

    def connect_conflict(self, count: int = 1, error_code: Optional[str] = None) -> Dict[str, Any]:
        """The next ``count`` connects answer 409 (``-1``: until cleared), with
        ``error_code`` in the body when given."""
        return self._arm("connect_conflict", count=count, error_code=error_code)

    def control_error(
        self,
        route: str,
        status: int,
        count: int = 1,
        error_code: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> Dict[str, Any]:
        """The next ``count`` requests of ``route`` (``create``, ``connect``, ``pause``,
        ``delete``, ``list``, ``get`` or ``any``) answer ``status`` with an E2B error body,
        ``error_code`` and a ``Retry-After`` header (seconds, may be fractional) when given;
        nothing else happens."""
        return self._arm(
            "control_error",
            route=route,
            status=status,
            count=count,
            error_code=error_code,
            retry_after=retry_after,
        )

    def control_redirect(self, route: str, count: int = 1) -> Dict[str, Any]:
        """The next ``count`` requests of ``route`` answer 307 to
        ``/_emulator/redirect-target`` (which records a followed redirect)."""
        return self._arm("control_redirect", route=route, count=count)

    def no_token(self, count: int = 1) -> Dict[str, Any]:
        """The next ``count`` create/connect answers omit ``envdAccessToken``."""
        return self._arm("no_token", count=count)

    def edge_not_found(self, sandbox_id: Optional[str] = None, count: int = 1) -> Dict[str, Any]:
        """The next ``count`` envd requests (of ``sandbox_id``, or any) answer 502 "The sandbox
        was not found" without reaching envd (a sandbox paused between connect and request)."""
        return self._arm("edge_not_found", sandbox_id=sandbox_id, count=count)

    def envd_error(
        self, status: int, sandbox_id: Optional[str] = None, count: int = 1
    ) -> Dict[str, Any]:
        """The next ``count`` envd requests (of ``sandbox_id``, or any) answer ``status`` with
        a generic error body (``"Bad gateway"``) without reaching envd."""
        return self._arm("envd_error", status=status, sandbox_id=sandbox_id, count=count)

    def stream_cut(
        self, after_bytes: int, sandbox_id: Optional[str] = None, count: int = 1
    ) -> Dict[str, Any]:
        """The next Start stream (of ``sandbox_id``, or any) is cut — connection closed, no
        end of stream — after ``after_bytes`` bytes of body; the process keeps running."""
        return self._arm("stream_cut", after_bytes=after_bytes, sandbox_id=sandbox_id, count=count)

    def stream_cut_at_end(
        self, sandbox_id: Optional[str] = None, count: int = 1
    ) -> Dict[str, Any]:
        """The next Start stream (of ``sandbox_id``, or any) is forwarded up to its Connect
        end-of-stream message — the process's end event arrives — then cut without it."""
        return self._arm("stream_cut_at_end", sandbox_id=sandbox_id, count=count)

    def stream_stall(
        self, sandbox_id: Optional[str] = None, after_bytes: int = 0, count: int = 1
    ) -> Dict[str, Any]:
        """The next Start stream sends ``after_bytes`` bytes, then nothing and never ends; the
        connection stays open until the client goes away, its own sandbox is paused, rebooted
        or killed, or :meth:`clear_faults` (other sandboxes never release it)."""
        return self._arm(
            "stream_stall", after_bytes=after_bytes, sandbox_id=sandbox_id, count=count
        )

    def stream_stall_at_end(
        self, sandbox_id: Optional[str] = None, count: int = 1
    ) -> Dict[str, Any]:
        """The next Start stream is forwarded up to its Connect end-of-stream message — the
        process's end event arrives — then sends nothing more and never ends (released as
        :meth:`stream_stall`)."""
        return self._arm("stream_stall_at_end", sandbox_id=sandbox_id, count=count)

    def envd_unresponsive(self, sandbox_id: str) -> Dict[str, Any]:
        """Every new envd request to that sandbox hangs until it is rebooted (filesystem-only
        pause, or connect with ``memory: false``) or :meth:`clear_faults`. Open streams keep
        flowing; a filesystem-only pause answers 503; a full pause marks
        ``envdUnresponsiveAtPause``."""
        return self._arm("envd_unresponsive", sandbox_id=sandbox_id)

    def bad_envelope(
        self, mode: str, sandbox_id: Optional[str] = None, count: int = 1
    ) -> Dict[str, Any]:
        """The next Start stream's first frame is ``oversized`` (claims 1 GiB), ``malformed``
        (not JSON) or ``compressed`` (flag 0x01); the real stream follows."""
        return self._arm("bad_envelope", mode=mode, sandbox_id=sandbox_id, count=count)

    def clear_faults(self) -> None:
        """Disarm every fault (stalled and hanging requests are released/closed)."""
        self._admin("DELETE", "/_emulator/faults")

    def faults(self) -> List[Dict[str, Any]]:
        """The faults still armed."""
        result: List[Dict[str, Any]] = self._admin("GET", "/_emulator/faults")
        return result

    def requests(
        self, sandbox_id: Optional[str] = None, path: Optional[str] = None
    ) -> List[Dict[str, Any]]:
        """Recent requests the emulator received, oldest first (bounded log): ``method``,
        ``path``, ``query``, ``kind`` (control/envd), ``sandbox_id``, ``status``, selected
        ``headers``, ``user`` (from Basic auth), ``token``/``api_key`` (present, missing or
        invalid — never the value), ``fault`` and, for small unary envd calls, ``body``.
        Filter by sandbox and/or a substring of the path."""
        query = urllib.parse.urlencode(
            {k: v for k, v in (("sandbox_id", sandbox_id), ("path", path)) if v}
        )
        result: List[Dict[str, Any]] = self._admin(
            "GET", "/_emulator/requests" + (f"?{query}" if query else "")
        )
        return result

    def clear_requests(self) -> None:
        """Empty the request log."""
        self._admin("DELETE", "/_emulator/requests")

    def sandbox_pids(self, sandbox_id: str) -> List[int]:
        """Host pids still alive in that sandbox (also for recently killed ones: ``[]`` then)."""
        result = self._admin("GET", f"/_emulator/sandboxes/{sandbox_id}/pids")
        return [int(p) for p in result["pids"]]

    def get_sandbox(self, sandbox_id: str) -> Dict[str, Any]:
        """The control plane's ``SandboxDetail`` of a sandbox (``GET /sandboxes/{id}``)."""
        result: Dict[str, Any] = self._admin("GET", f"/sandboxes/{sandbox_id}")
        return result

    def list_sandboxes(self) -> List[Dict[str, Any]]:
        """Every sandbox the emulator knows (running and paused), with internal details.

        Besides the ``ListedSandbox`` fields: ``pauseMode``, ``egress``, ``autoPause``,
        ``envdUnresponsive``, ``maxProcesses`` and ``enforcedLimits`` (which of ``cpu``,
        ``memory``, ``pids`` and ``disk`` the host enforces for it, and how).
        """
        result: List[Dict[str, Any]] = self._admin("GET", "/_emulator/sandboxes")
        return result


def remove_state_dir(path: str) -> None:
    """Remove a temporary state directory, unless something is still mounted inside it."""
    try:
        left = mounts_under(path)
    except OSError:  # mountinfo unreadable: no mount is known to be left inside
        left = []
    if left:
        print(
            f"e2b-emulator: not removing {path}: still mounted inside: {', '.join(left)}",
            file=sys.stderr,
        )
        return
    if os.geteuid() == 0:
        shutil.rmtree(path, ignore_errors=True)
        return
    # Rootless: files written inside sandboxes belong to the user's subuids.
    try:
        remove_tree(path)
    except SandboxRuntimeError as exc:
        print(f"e2b-emulator: not removing {path}: {exc}", file=sys.stderr)
