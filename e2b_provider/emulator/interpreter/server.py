"""The emulator's code-interpreter server: E2B's HTTP API on port 49999 of a sandbox.

``GET /health``; ``POST /execute`` (``{"code", "context_id", "language", "env_vars"}``,
answered with one JSON object a line, ``end_of_execution`` last; a client that goes away
interrupts the kernel); ``POST /contexts`` (``{"language", "cwd"}``), ``GET /contexts``,
``POST /contexts/{id}/restart``, ``DELETE /contexts/{id}``. Errors are plain text with
E2B's statuses (400 bad request, 404 unknown context, 500 a kernel that failed). A default
Python and a default JavaScript context exist from the start, in ``/home/user``.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, Dict, List, Mapping, Optional

from aiohttp import web

from .kernels import KERNEL_NAMES, Context, ContextError

__all__ = ["DEFAULT_CWD", "PORT", "Contexts", "make_app"]

#: The port E2B's code-interpreter server listens on.
PORT = 49999
#: Where contexts run unless told otherwise (E2B's user's home).
DEFAULT_CWD = "/home/user"


class Contexts:
    """Every context by id, and the default one of each language."""

    def __init__(self, env: Mapping[str, str], default_cwd: str) -> None:
        self.by_id: Dict[str, Context] = {}
        self.defaults: Dict[str, str] = {}
        self._env = dict(env)
        self._cwd = default_cwd
        self._making = asyncio.Lock()

    async def create(self, language: str, cwd: Optional[str]) -> Context:
        """Start a new context.

        Raises:
            ContextError: unknown language or a kernel that did not start.
        """
        context = Context(language, cwd or self._cwd, self._env)
        await context.start()
        self.by_id[context.id] = context
        return context

    async def start_defaults(self, languages: List[str]) -> None:
        """Start the default context of each language, all at once, listed in that order.

        Raises:
            ContextError: one did not start (the others are stopped again).
        """
        made = [Context(language, self._cwd, self._env) for language in languages]
        started = await asyncio.gather(*(c.start() for c in made), return_exceptions=True)
        failed = [e for e in started if isinstance(e, BaseException)]
        if failed:
            await asyncio.gather(*(c.shutdown() for c, e in zip(made, started) if e is None),
                                 return_exceptions=True)
            raise failed[0]
        for context in made:
            self.by_id[context.id] = context
            self.defaults[context.language] = context.id

    async def default(self, language: str) -> Context:
        """The language's default context (made on first use)."""
        async with self._making:
            found = self.by_id.get(self.defaults.get(language, ""))
            if found is None:
                found = await self.create(language, None)
                self.defaults[language] = found.id
            return found

    async def close(self) -> None:
        for context in list(self.by_id.values()):
            await context.shutdown()
        self.by_id.clear()


def _normalize(language: Optional[str]) -> str:
    name = (language or "python").strip().lower()
    return {"py": "python", "python3": "python", "sh": "bash", "js": "javascript",
            "ts": "typescript"}.get(name, name)


async def _json_body(request: web.Request) -> Dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise web.HTTPBadRequest(text="the body is not JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="the body is not a JSON object")
    return body


def _optional_str(body: Mapping[str, Any], key: str) -> Optional[str]:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise web.HTTPUnprocessableEntity(text=f"{key} must be a string")
    return value


async def health(request: web.Request) -> web.Response:
    return web.json_response("OK")


async def execute(request: web.Request) -> web.StreamResponse:
    body = await _json_body(request)
    code = body.get("code")
    if not isinstance(code, str):
        raise web.HTTPUnprocessableEntity(text="code must be a string")
    context_id = _optional_str(body, "context_id")
    language = _optional_str(body, "language")
    env = body.get("env_vars")
    if env is not None and (
        not isinstance(env, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise web.HTTPUnprocessableEntity(text="env_vars must map strings to strings")
    if context_id and language:
        return web.Response(status=400, text="Only one of context_id or language can be provided")
    contexts: Contexts = request.app["contexts"]
    if context_id:
        context = contexts.by_id.get(context_id)
        if context is None:
            return web.Response(status=404, text=f"Context {context_id} not found")
    else:
        try:
            context = await contexts.default(_normalize(language))
        except ContextError as exc:
            return web.Response(status=500, text=str(exc))
    answer = web.StreamResponse(headers={"Content-Type": "application/json"})
    await answer.prepare(request)

    async def emit(line: Dict[str, Any]) -> None:
        await answer.write((json.dumps(line) + "\n").encode())

    async with context.lock:
        # A client that goes away cancels this (or fails a write): the context then stops
        # the code and settles before the lock is let go.
        await context.execute(code, env, emit)
    await answer.write_eof()
    return answer


async def create_context(request: web.Request) -> web.Response:
    body = await _json_body(request)
    language = _normalize(_optional_str(body, "language"))
    cwd = _optional_str(body, "cwd")
    try:
        context = await request.app["contexts"].create(language, cwd)
    except ContextError as exc:
        return web.Response(status=500, text=str(exc))
    return web.json_response(context.describe())


async def list_contexts(request: web.Request) -> web.Response:
    contexts: Contexts = request.app["contexts"]
    listed: List[Dict[str, str]] = [c.describe() for c in contexts.by_id.values()]
    return web.json_response(listed)


def _context(request: web.Request) -> Context:
    context_id = request.match_info["context_id"]
    context = request.app["contexts"].by_id.get(context_id)
    if context is None:
        raise web.HTTPNotFound(text=f"Context {context_id} not found")
    return context  # type: ignore[no-any-return]


async def restart_context(request: web.Request) -> web.Response:
    context = _context(request)
    try:
        await context.restart()
    except Exception as exc:  # jupyter_client raises many kinds
        return web.Response(status=500, text=f"Failed to restart context {context.id}: {exc}")
    return web.json_response(None)


async def remove_context(request: web.Request) -> web.Response:
    context = _context(request)
    contexts: Contexts = request.app["contexts"]
    contexts.by_id.pop(context.id, None)
    for language, default_id in list(contexts.defaults.items()):
        if default_id == context.id:
            del contexts.defaults[language]
    await context.shutdown()
    return web.json_response(None)


def make_app(
    default_cwd: str = DEFAULT_CWD, env: Optional[Mapping[str, str]] = None
) -> web.Application:
    """The server's app; the default Python and JavaScript contexts start with it."""
    app = web.Application()
    app["contexts"] = Contexts(os.environ if env is None else env, default_cwd)

    async def lifespan(app: web.Application) -> Any:
        # as E2B's server: a Python and a JavaScript context from the start (JavaScript when
        # the environment has its kernel: a server run outside the template may not)
        from jupyter_client.kernelspec import KernelSpecManager

        have = KernelSpecManager().find_kernel_specs()
        await app["contexts"].start_defaults(
            ["python"] + (["javascript"] if KERNEL_NAMES["javascript"] in have else [])
        )
        yield
        await app["contexts"].close()

    app.cleanup_ctx.append(lifespan)
    app.router.add_get("/health", health)
    app.router.add_post("/execute", execute)
    app.router.add_post("/contexts", create_context)
    app.router.add_get("/contexts", list_contexts)
    app.router.add_post("/contexts/{context_id}/restart", restart_context)
    app.router.add_delete("/contexts/{context_id}", remove_context)
    return app


#: The kernels' IPython configuration: no colors in tracebacks, sequences shown whole.
KERNEL_CONFIG = (
    "c = get_config()  # noqa: F821\n"
    'c.InteractiveShell.colors = "NoColor"\n'
    "c.PlainTextFormatter.max_seq_length = 0\n"
)


def prepare_profile(ipython_dir: Optional[str] = None) -> str:
    """Write the kernels' IPython profile (``profile_default``): the configuration, unless
    one is there, and the display formatters (:mod:`.kernel_display`) as a startup file.
    Returns the profile's directory."""
    base = ipython_dir or os.environ.get("IPYTHONDIR") or os.path.expanduser("~/.ipython")
    profile = os.path.join(base, "profile_default")
    os.makedirs(os.path.join(profile, "startup"), exist_ok=True)
    config = os.path.join(profile, "ipython_kernel_config.py")
    if not os.path.exists(config):
        with open(config, "w", encoding="utf-8") as f:
            f.write(KERNEL_CONFIG)
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_display.py")
    with open(source, encoding="utf-8") as f:
        text = f.read()
    with open(os.path.join(profile, "startup", "00-e2b-display.py"), "w", encoding="utf-8") as f:
        f.write(text)
    return profile


def main(argv: Optional[List[str]] = None) -> None:
    """Serve on ``--port`` (49999) until stopped."""
    import argparse

    parser = argparse.ArgumentParser(prog="code-interpreter")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--cwd", default=DEFAULT_CWD)
    args = parser.parse_args(argv)
    prepare_profile()
    web.run_app(
        make_app(args.cwd),
        host=args.host,
        port=args.port,
        print=None,
        handler_cancellation=True,
    )


if __name__ == "__main__":
    main()
