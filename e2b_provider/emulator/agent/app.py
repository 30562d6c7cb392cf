"""Routes and lifetime of the envd look-alike agent (``python -m e2b_provider.emulator.agent``).

The runtime starts the agent inside each sandbox, as root, serving HTTP/1.1 (aiohttp) on a unix
socket (``--socket /run/e2b/envd.sock``; the socket is inherited as fd 3 when ``LISTEN_FDS`` is
set and ``LISTEN_PID`` is the agent's pid, systemd's convention); it also runs directly on a host
(as root) for its own tests. With ``LISTEN_FDS=2`` (or ``--ports-socket``) it also serves the
ports socket (fd 4): connections to the sandbox's TCP ports handed to the host, see
:mod:`.ports`. It owns the routes and the process lifetime of the agent:

* ``GET /health`` (204), ``POST /init`` and ``GET /envs`` (internal, like envd's: default
  env vars, default user and workdir; the host server must not forward ``/init`` from clients);
* ``POST /process.Process/{Start,Connect}`` (Connect JSON server streams), ``StreamInput``
  (a client stream) and ``{List,SendSignal,SendInput,CloseStdin,Update}`` (unary JSON) — see
  :mod:`.process`;
* ``POST /filesystem.Filesystem/{Stat,ListDir,MakeDir,Remove,Move}`` — see :mod:`.filesystem`;
  ``WatchDir`` (server stream) and ``{Create,Remove}Watcher``/``GetWatcherEvents`` — see
  :mod:`.watch`;
* ``GET /files`` and ``POST /files`` — see :mod:`.files` (request bodies are decoded there,
  not by aiohttp, so ``Content-Encoding`` is handled as envd does).

It does not check ``X-Access-Token`` (the host server does). RPCs run as the user of
``Authorization: Basic base64("<user>:")``, else ``--default-user``; ``/files`` take
``?username=``. On SIGTERM/SIGINT it SIGKILLs the processes it started, removes its
watchers and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import signal
import socket
import stat
import sys
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, TypeVar

import attrs
from aiohttp import web

from . import files as agent_files
from . import filesystem as agent_fs
from . import journal
from .ports import PortsServer
from .process import ManagedProcess, ProcessManager
from .process_exit import ExitRecord
from .process_output import Subscriber
from .process_requests import (
    decode_input,
    parse_pty_size,
    parse_selector,
    parse_signal,
    parse_start_request,
)
from .rpc import (
    RpcError,
    ServerStream,
    UnsupportedMediaType,
    UserInfo,
    error_response,
    expand_and_resolve,
    json_response,
    parse_timeout_ms,
    read_stream_request,
    read_unary_request,
    request_user,
    stream_messages,
    unsupported_response,
)
from .watch import WatchEnded, WatcherRegistry, check_watch_path
from .watch import readable as watch_readable

__all__ = ["DEFAULT_KEEPALIVE_SECONDS", "Agent", "AgentConfig", "main", "serve"]

log = logging.getLogger("e2b_provider.emulator.agent")
fs_log = logging.getLogger("e2b_provider.emulator.agent.filesystem")

#: Seconds between keepalive events when the client sends no valid Keepalive-Ping-Interval.
DEFAULT_KEEPALIVE_SECONDS = 90.0
_WANTED_NOFILE = 8192

T = TypeVar("T")
Unary = Callable[[web.Request, Dict[str, Any]], Awaitable[Dict[str, Any]]]


@attrs.define
class AgentConfig:
    """Settings of one agent.

    Attributes:
        socket_path: where to listen (a unix socket path; a stale socket there is replaced).
        ports_socket_path: where to serve the ports socket when it is not inherited (None: only
            an inherited one is served).
        default_user: user for requests without Basic auth / ``?username=``.
        default_workdir: cwd for processes started without one (else the user's home).
        env: default env vars of every process (after PATH/HOME/USER/LOGNAME, before the
            request's own ``envs``).
    """

    socket_path: str
    ports_socket_path: Optional[str] = None
    default_user: str = "user"
    default_workdir: Optional[str] = None
    env: Dict[str, str] = attrs.field(factory=dict)


def _keepalive_interval(request: web.BaseRequest) -> float:
    raw = request.headers.get("Keepalive-Ping-Interval")
    if raw is None:
        return DEFAULT_KEEPALIVE_SECONDS
    try:
        value = int(raw.strip())
    except ValueError:
        return DEFAULT_KEEPALIVE_SECONDS
    if value <= 0:
        # envd would panic (Go's time.NewTicker) on this; we fall back to the default.
        log.warning(
            "Keepalive-Ping-Interval %r is not positive; using %ss", raw, DEFAULT_KEEPALIVE_SECONDS
        )
        return DEFAULT_KEEPALIVE_SECONDS
    return float(value)


def _str_field(body: Dict[str, Any], name: str, alias: Optional[str] = None) -> str:
    value = body.get(name, body.get(alias, "") if alias else "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RpcError("invalid_argument", f"unmarshal message: {name} is not a string")
    return value


def _bool_field(body: Dict[str, Any], name: str, alias: Optional[str] = None) -> bool:
    value = body.get(name, body.get(alias, False) if alias else False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RpcError("invalid_argument", f"unmarshal message: {name} is not a bool")
    return value


class Agent:
    """The agent's state (processes, defaults) and its aiohttp application."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        env = {"E2B_SANDBOX": "true"}
        env.update(config.env)
        self.processes = ProcessManager(default_env=env, default_workdir=config.default_workdir)
        self.watchers = WatcherRegistry()

    @property
    def default_user(self) -> str:
        """The user of requests that name none."""
        return self.config.default_user

    def build_app(self) -> web.Application:
        """The aiohttp application with every envd route."""
        app = web.Application()
        r = app.router
        r.add_get("/health", self.health)
        r.add_post("/init", self.init)
        r.add_get("/envs", self.envs)
        r.add_post("/process.Process/Start", self.start)
        r.add_post("/process.Process/Connect", self.connect)
        r.add_post("/process.Process/List", self._unary(self.list_processes))
        r.add_post("/process.Process/SendSignal", self._unary(self.send_signal))
        r.add_post("/process.Process/SendInput", self._unary(self.send_input))
        r.add_post("/process.Process/CloseStdin", self._unary(self.close_stdin))
        r.add_post("/process.Process/Update", self._unary(self.update))
        r.add_post("/process.Process/StreamInput", self.stream_input)
        r.add_post("/filesystem.Filesystem/Stat", self._unary(self.fs_stat))
        r.add_post("/filesystem.Filesystem/ListDir", self._unary(self.fs_list_dir))
        r.add_post("/filesystem.Filesystem/MakeDir", self._unary(self.fs_make_dir))
        r.add_post("/filesystem.Filesystem/Remove", self._unary(self.fs_remove))
        r.add_post("/filesystem.Filesystem/Move", self._unary(self.fs_move))
        r.add_post("/filesystem.Filesystem/WatchDir", self.fs_watch_dir)
        r.add_post("/filesystem.Filesystem/CreateWatcher", self._unary(self.fs_create_watcher))
        r.add_post(
            "/filesystem.Filesystem/GetWatcherEvents", self._unary(self.fs_get_watcher_events)
        )
        r.add_post("/filesystem.Filesystem/RemoveWatcher", self._unary(self.fs_remove_watcher))
        r.add_get("/files", self.files_get, allow_head=False)
        r.add_post("/files", self.files_post)
        return app

    # ---- plumbing --------------------------------------------------------------------

    def _unary(self, fn: Unary) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                body = await read_unary_request(request)
                return json_response(await fn(request, body))
            except UnsupportedMediaType as exc:
                return unsupported_response(exc)
            except RpcError as err:
                return error_response(err)

        return handler

    def _user(self, request: web.BaseRequest) -> UserInfo:
        return request_user(request, self.default_user)

    @staticmethod
    async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    # ---- misc routes -----------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health`` → 204."""
        return web.Response(status=204)

    async def init(self, request: web.Request) -> web.Response:
        """``POST /init`` ``{"envVars"?, "defaultUser"?, "defaultWorkdir"?}`` → 204."""
        try:
            body = json.loads((await request.read()) or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return json_response(
                {"code": 400, "message": "body is not a JSON object"}, 400, charset=True
            )
        env_vars = body.get("envVars") or {}
        if isinstance(env_vars, dict):
            for key, value in env_vars.items():
                if isinstance(key, str) and isinstance(value, str):
                    self.processes.default_env[key] = value
        user = body.get("defaultUser")
        if isinstance(user, str) and user:
            self.config.default_user = user
        workdir = body.get("defaultWorkdir")
        if isinstance(workdir, str) and workdir:
            self.config.default_workdir = workdir
            self.processes.default_workdir = workdir
        return web.Response(status=204)

    async def envs(self, request: web.Request) -> web.Response:
        """``GET /envs`` → the default env vars of new processes."""
        return json_response(dict(self.processes.default_env))

    # ---- process streams -------------------------------------------------------------

    async def start(self, request: web.Request) -> web.StreamResponse:
        """``process.Process/Start``: launch, then stream start/data/keepalive/end events."""
        loop = asyncio.get_running_loop()
        stream = ServerStream(request)
        try:
            user = self._user(request)
            timeout = parse_timeout_ms(request)
            deadline = None if timeout is None else loop.time() + timeout
            spec = parse_start_request(await read_stream_request(request))
            proc, sub = self.processes.start(spec, user, timeout)
        except UnsupportedMediaType as exc:
            return unsupported_response(exc)
        except RpcError as err:
            return await stream.finish(err)
        return await self._follow(stream, proc, sub, _keepalive_interval(request), deadline)

    async def connect(self, request: web.Request) -> web.StreamResponse:
        """``process.Process/Connect``: re-attach to a live process (or a recent exit)."""
        loop = asyncio.get_running_loop()
        stream = ServerStream(request)
        try:
            self._user(request)
            timeout = parse_timeout_ms(request)
            deadline = None if timeout is None else loop.time() + timeout
            selector = parse_selector(await read_stream_request(request))
            target = self.processes.get_any(selector)
        except UnsupportedMediaType as exc:
            return unsupported_response(exc)
        except RpcError as err:
            return await stream.finish(err)
        if isinstance(target, ExitRecord) or target.exit is not None:
            pid = target.pid
            info = target.info if isinstance(target, ExitRecord) else target.exit
            assert info is not None
            try:
                await stream.send({"event": {"start": {"pid": pid}}})
                await stream.send({"event": info.end_event()})
            except ConnectionError:
                return stream.response
            return await stream.finish()
        sub = target.subscribe()
        return await self._follow(stream, target, sub, _keepalive_interval(request), deadline)

    async def _follow(
        self,
        stream: ServerStream,
        proc: ManagedProcess,
        sub: Subscriber,
        keepalive: float,
        deadline: Optional[float],
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        error: Optional[RpcError] = None
        expired = RpcError("deadline_exceeded", "context deadline exceeded")
        try:
            await stream.send({"event": {"start": {"pid": proc.pid}}})
            while True:
                wait = keepalive
                if deadline is not None:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        error = expired
                        break
                    wait = min(wait, remaining)
                item = await sub.get(wait)
                if item is None:
                    if deadline is not None and loop.time() >= deadline:
                        error = expired
                        break
                    await stream.send({"event": {"keepalive": {}}})
                    continue
                kind, event = item
                if kind == "closed":
                    if proc.exit is not None:
                        await stream.send({"event": proc.exit.end_event()})
                    else:
                        error = RpcError("unavailable", "the agent stopped following the process")
                    break
                await stream.send({"event": event})
                if kind == "end":
                    break
        except ConnectionError as exc:
            log.debug("process %d: stream client went away (%s)", proc.pid, exc.__class__.__name__)
            return stream.response
        finally:
            proc.unsubscribe(sub)
        return await stream.finish(error)

    # ---- process unary RPCs ----------------------------------------------------------

    async def list_processes(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``List`` → ``{"processes": [ProcessInfo…]}`` (omitted when empty)."""
        self._user(request)
        infos = [p.info_json() for p in self.processes.live()]
        return {"processes": infos} if infos else {}

    async def send_signal(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``SendSignal`` (SIGKILL/SIGTERM) to one pid or tag."""
        self._user(request)
        proc = self.processes.get_live(parse_selector(body))  # envd: the lookup comes first
        proc.send_signal(parse_signal(body.get("signal")))
        return {}

    async def send_input(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``SendInput``: bytes to a process's stdin (or PTY). As envd's, the write blocks
        while the pipe is full for as long as it takes, whatever the request's deadline or
        the client's going away, and later inputs and ``CloseStdin`` wait behind it."""
        self._user(request)
        proc = self.processes.get_live(parse_selector(body))
        data, pty = decode_input(body)
        await asyncio.shield(proc.write_input(data, pty=pty))
        return {}

    async def close_stdin(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``CloseStdin``: EOF on a process's stdin."""
        self._user(request)
        await self.processes.get_live(parse_selector(body)).close_stdin()
        return {}

    async def update(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``Update``: resize a PTY (``{"pty": {"size": {"cols", "rows"}}}``)."""
        self._user(request)
        size = parse_pty_size(body.get("pty"))  # envd: unmarshalled before the lookup
        proc = self.processes.get_live(parse_selector(body))
        if size is not None:
            proc.resize(*size)
        return {}

    async def stream_input(self, request: web.Request) -> web.StreamResponse:
        """``StreamInput`` (client stream): a ``start`` selecting the process, then ``data``
        and ``keepalive`` messages in order; answers ``{}`` when the client ends the stream."""
        stream = ServerStream(request)
        proc: Optional[ManagedProcess] = None
        try:
            self._user(request)
            async for message in stream_messages(request):
                if isinstance(message.get("start"), dict):
                    proc = self.processes.get_live(parse_selector(message["start"]))
                elif isinstance(message.get("data"), dict):
                    data, pty = decode_input(message["data"])
                    if proc is None:
                        # envd dereferences a nil process here (a crash); answer instead
                        raise RpcError(
                            "failed_precondition", "no process selected: send start first"
                        )
                    await asyncio.shield(proc.write_input(data, pty=pty))
                elif "keepalive" not in message:
                    raise RpcError("unimplemented", "invalid event type <nil>")
        except UnsupportedMediaType as exc:
            return unsupported_response(exc)
        except RpcError as err:
            return await stream.finish(err)
        try:
            await stream.send({})
        except ConnectionError:
            return stream.response
        return await stream.finish()

    # ---- filesystem RPCs -------------------------------------------------------------

    def _resolve(self, user: UserInfo, body: Dict[str, Any], name: str = "path") -> str:
        try:
            return expand_and_resolve(_str_field(body, name), user, self.config.default_workdir)
        except RpcError as err:
            raise RpcError("invalid_argument", err.message) from None

    def _path(self, request: web.BaseRequest, body: Dict[str, Any], name: str = "path") -> str:
        return self._resolve(self._user(request), body, name)

    async def fs_stat(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``Stat`` → ``{"entry": EntryInfo}``."""
        return await self._in_thread(agent_fs.stat_path, self._path(request, body))

    async def fs_list_dir(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``ListDir`` → ``{"entries": [EntryInfo…]}`` (omitted when empty)."""
        path = self._path(request, body)
        depth = body.get("depth", 0) or 0
        if isinstance(depth, str) and depth.isdigit():
            depth = int(depth)
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise RpcError("invalid_argument", "unmarshal message: depth is not an unsigned int")
        result = await self._in_thread(agent_fs.list_dir, path, depth)
        return result if result.get("entries") else {}

    async def fs_make_dir(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``MakeDir`` → ``{"entry": …}``; ``already_exists`` when it is there."""
        user = self._user(request)
        path = self._resolve(user, body)
        return await self._in_thread(agent_fs.make_dir, path, user)

    async def fs_remove(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``Remove`` (recursive; a missing path is not an error)."""
        return await self._in_thread(agent_fs.remove, self._path(request, body))

    async def fs_move(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``Move`` → ``{"entry": EntryInfo of the destination}``."""
        user = self._user(request)
        source = self._resolve(user, body, "source")
        destination = self._resolve(user, body, "destination")
        return await self._in_thread(agent_fs.move, source, destination, user)

    # ---- watchers --------------------------------------------------------------------

    def _watch_target(self, request: web.BaseRequest, body: Dict[str, Any]) -> str:
        path = self._path(request, body)
        check_watch_path(path, _bool_field(body, "allowNetworkMounts", "allow_network_mounts"))
        return path

    async def fs_watch_dir(self, request: web.Request) -> web.StreamResponse:
        """``WatchDir``: ``{"start": {}}``, then ``{"filesystem": event}`` and keepalives.

        As envd's: no queue of its own. The watcher's inotify instance is read only once the
        events read before were written to the client, so a slow client leaves events in
        the kernel's queue, whose overflow ends the stream (``watcher error: fsnotify: queue
        or buffer overflow``) after every event queued before it.
        """
        loop = asyncio.get_running_loop()
        stream = ServerStream(request)
        try:
            timeout = parse_timeout_ms(request)
            deadline = None if timeout is None else loop.time() + timeout
            body = await read_stream_request(request)
            path = self._watch_target(request, body)
            watcher = self.watchers.watcher(
                path,
                _bool_field(body, "recursive"),
                _bool_field(body, "includeEntry", "include_entry"),
            )
            journal.event(fs_log, "watcher_created", f"Watch of {path} started", path=path)
        except UnsupportedMediaType as exc:
            return unsupported_response(exc)
        except RpcError as err:
            return await stream.finish(err)
        keepalive = _keepalive_interval(request)
        error: Optional[RpcError] = None
        try:
            await stream.send({"start": {}})
            while True:
                wait = keepalive
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0:
                        error = RpcError("deadline_exceeded", "context deadline exceeded")
                        break
                if not await watch_readable(watcher.fd, wait):
                    if deadline is None or loop.time() < deadline:
                        await stream.send({"keepalive": {}})
                    continue
                try:
                    for event in watcher.read():
                        await stream.send({"filesystem": event})
                except WatchEnded as ended:
                    error = RpcError("internal", f"watcher error: {ended}")
                    break
        except ConnectionError:
            return stream.response
        finally:
            watcher.close()
        return await stream.finish(error)

    async def fs_create_watcher(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``CreateWatcher`` → ``{"watcherId"}`` (events kept until ``GetWatcherEvents``)."""
        path = self._watch_target(request, body)
        recursive = _bool_field(body, "recursive")
        watcher_id = self.watchers.create(
            path, recursive, _bool_field(body, "includeEntry", "include_entry")
        )
        journal.event(
            fs_log,
            "watcher_created",
            f"Watcher {watcher_id} created",
            watcher_id=watcher_id,
            path=path,
            recursive=recursive,
        )
        return {"watcherId": watcher_id}

    async def fs_get_watcher_events(
        self, request: web.Request, body: Dict[str, Any]
    ) -> Dict[str, Any]:
        """``GetWatcherEvents`` → ``{"events": […]}`` since the last call (omitted when none)."""
        events = self.watchers.events(_str_field(body, "watcherId", "watcher_id"))
        return {"events": events} if events else {}

    async def fs_remove_watcher(self, request: web.Request, body: Dict[str, Any]) -> Dict[str, Any]:
        """``RemoveWatcher`` → ``{}``."""
        self.watchers.remove(_str_field(body, "watcherId", "watcher_id"))
        return {}

    # ---- /files ----------------------------------------------------------------------

    async def files_get(self, request: web.Request) -> web.StreamResponse:
        """``GET /files``."""
        return await agent_files.download(request, self.default_user, self.config.default_workdir)

    async def files_post(self, request: web.Request) -> web.StreamResponse:
        """``POST /files``."""
        return await agent_files.upload(request, self.default_user, self.config.default_workdir)


def _raise_nofile_limit() -> None:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return
    wanted = _WANTED_NOFILE if hard == resource.RLIM_INFINITY else min(_WANTED_NOFILE, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (OSError, ValueError):
            pass


def _prepare_socket_path(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SystemExit(f"agent: {path} exists and is not a socket; refusing to replace it")
    os.unlink(path)


def _inherited_sockets() -> List[socket.socket]:
    """The listening sockets passed as fds 3 and up (``LISTEN_FDS``/``LISTEN_PID``): envd's,
    then the ports socket's. Empty when none were passed.

    The variables are removed from the environment so that no child sees them.
    """
    fds = os.environ.pop("LISTEN_FDS", None)
    pid = os.environ.pop("LISTEN_PID", None)
    if fds not in ("1", "2") or pid != str(os.getpid()):
        return []
    socks = []
    for fd in range(3, 3 + int(fds)):
        sock = socket.socket(fileno=fd)
        sock.set_inheritable(False)
        socks.append(sock)
    return socks


def _listen_unix(path: str) -> socket.socket:
    _prepare_socket_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(1024)
    return sock


async def serve(config: AgentConfig, stop: Optional[asyncio.Event] = None) -> None:
    """Serve until ``stop`` is set (or SIGTERM/SIGINT), then kill the processes and exit.

    Args:
        config: where to listen and the defaults.
        stop: an event that ends the server; SIGTERM/SIGINT set it too.
    """
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    agent = Agent(config)
    runner = web.AppRunner(
        agent.build_app(),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=1.0,
        auto_decompress=False,  # /files decodes Content-Encoding itself, as envd does
    )
    await runner.setup()
    inherited_socks = _inherited_sockets()
    inherited = inherited_socks[0] if inherited_socks else None
    site: web.BaseSite
    if inherited is not None:
        site = web.SockSite(runner, inherited, backlog=1024)
    else:
        _prepare_socket_path(config.socket_path)
        site = web.UnixSite(runner, config.socket_path, backlog=1024)
    await site.start()
    ports_listener: Optional[socket.socket] = None
    own_ports_socket = False
    if len(inherited_socks) > 1:
        ports_listener = inherited_socks[1]
    elif inherited is None and config.ports_socket_path:
        ports_listener = _listen_unix(config.ports_socket_path)
        own_ports_socket = True
    ports = PortsServer(ports_listener) if ports_listener is not None else None
    if ports is not None:
        ports.start()
    log.info("envd agent on %s (default user %s)", config.socket_path, config.default_user)
    try:
        await stop.wait()
    finally:
        log.info("envd agent stopping")
        if ports is not None:
            await ports.close()
        agent.watchers.close()
        await agent.processes.shutdown()
        await runner.cleanup()
        # an inherited socket outlives this agent (the next one uses it)
        removed = [config.socket_path] if inherited is None else []
        if own_ports_socket and ports_listener is not None and config.ports_socket_path:
            ports_listener.close()
            removed.append(config.ports_socket_path)
        for path in removed:
            try:
                os.unlink(path)
            except OSError:
                pass


def _read_env_file(path: str) -> Dict[str, str]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise SystemExit(f"agent: {path} must hold a JSON object of strings")
    return data


def _read_sandbox_info(path: str) -> Dict[str, str]:
    """``E2B_SANDBOX_ID`` and the sandbox's ``env_vars`` from the runtime's ``sandbox.json``."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    env: Dict[str, str] = {}
    if not isinstance(data, dict):
        return env
    if isinstance(data.get("sandbox_id"), str):
        env["E2B_SANDBOX_ID"] = data["sandbox_id"]
    env_vars = data.get("env_vars")
    if isinstance(env_vars, dict):
        env.update({k: v for k, v in env_vars.items() if isinstance(k, str) and isinstance(v, str)})
    return env


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m e2b_provider.emulator.agent",
        description="envd look-alike agent of the local E2B emulator (HTTP on a unix socket).",
    )
    parser.add_argument("--socket", required=True, help="unix socket path to listen on")
    parser.add_argument(
        "--ports-socket",
        default=None,
        help="unix socket path of the ports socket, when it is not inherited (LISTEN_FDS=2)",
    )
    parser.add_argument("--default-user", default="user", help="user when a request names none")
    parser.add_argument("--default-workdir", default=None, help="cwd of processes given none")
    parser.add_argument(
        "--env-file", default=None, help="JSON object of env vars every process gets"
    )
    parser.add_argument("--sandbox-id", default=None, help="sets E2B_SANDBOX_ID for processes")
    parser.add_argument("--template-id", default=None, help="sets E2B_TEMPLATE_ID for processes")
    parser.add_argument(
        "--sandbox-info",
        default=None,
        help="the runtime's sandbox.json (sandbox_id, env_vars); default: sandbox.json next to "
        "the socket, when present",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = _parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(journal.JsonFormatter())
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO), handlers=[handler]
    )
    env: Dict[str, str] = {}
    if args.sandbox_id:
        env["E2B_SANDBOX_ID"] = args.sandbox_id
    if args.template_id:
        env["E2B_TEMPLATE_ID"] = args.template_id
    info_path = args.sandbox_info or os.path.join(
        os.path.dirname(os.path.abspath(args.socket)), "sandbox.json"
    )
    if args.sandbox_info or os.path.exists(info_path):
        env.update(_read_sandbox_info(info_path))
    if args.env_file:
        env.update(_read_env_file(args.env_file))
    os.umask(0o022)
    _raise_nofile_limit()
    config = AgentConfig(
        socket_path=args.socket,
        ports_socket_path=args.ports_socket,
        default_user=args.default_user,
        default_workdir=args.default_workdir,
        env=env,
    )
    asyncio.run(serve(config))
    return 0
