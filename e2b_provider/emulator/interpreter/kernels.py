"""The emulator's code-interpreter contexts: one Jupyter kernel each, driven over its own
channels, one execution at a time, answered as E2B's server answers (JSON objects).

A :class:`Context` starts a real kernel (``ipykernel`` for Python, ``bash_kernel`` for Bash,
Deno's for JavaScript and TypeScript)
with :mod:`jupyter_client`, turns the kernel's messages for one execution into the lines
``POST /execute`` streams (``stdout``/``stderr``, ``result``, ``error``,
``number_of_executions``), sets and restores per-execution environment variables the way
E2B's server does (code run silently before and after), and interrupts, restarts and shuts
the kernel down; a kernel that dies is restarted, as Jupyter's restarter restarts those of
E2B's server. Runs inside a sandbox, in the code interpreter's own Python environment.
"""

from __future__ import annotations

import asyncio
import json
import queue
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Mapping, Optional

from jupyter_client.manager import AsyncKernelManager

__all__ = ["KERNEL_NAMES", "Context", "ContextError", "result_line"]

#: The Jupyter kernel of each language the template has (JavaScript and TypeScript share
#: Deno's, as they share one kernel on E2B).
KERNEL_NAMES = {"python": "python3", "bash": "bash", "javascript": "javascript",
                "typescript": "javascript"}
#: How long a kernel may take to start and answer.
READY_SECONDS = 60.0
#: How often a quiet execution yields a keepalive (so a lost client is noticed).
KEEPALIVE_SECONDS = 5.0

#: How often an execution's wait looks at its kernel (alive? restarted?).
POLL_SECONDS = 0.25

#: How long an interrupted execution may take to end before its kernel is restarted.
SETTLE_SECONDS = 10.0

#: How long a JavaScript execution's messages are still read after its kernel said it is
#: idle, while its value has not come: Deno's kernel now and then publishes the value
#: (``execute_result``) after ``idle`` (seen once in 30 runs of one cell), which Jupyter's
#: protocol puts last.
LATE_RESULT_SECONDS = 0.1
#: The languages Deno's kernel runs.
_JS_LANGUAGES = ("javascript", "typescript")
#: Run silently in each JavaScript kernel as it starts: Node's ``require`` (E2B's kernel is
#: Node's, where code may ``require('fs')``; Deno has only ``import``).
_JS_PRELUDE = ('import { createRequire as _e2bCreateRequire } from "node:module"; '
               'globalThis.require = _e2bCreateRequire(process.cwd() + "/");')

#: Where an execution's lines go (the server writes each to its client).
Emit = Callable[[Dict[str, Any]], Awaitable[None]]

#: A result's MIME types and the names E2B's server gives them.
_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}


class ContextError(Exception):
    """A context could not be made or used (the message says why)."""


def result_line(data: Mapping[str, Any], is_main: bool) -> Dict[str, Any]:
    """A kernel's display data as E2B's ``result`` line: None fields left out, the MIME types
    it has no field for in ``extra`` (always there, ``{}`` when none, as E2B's server sends)."""
    line: Dict[str, Any] = {"type": "result", "is_main_result": is_main}
    extra: Dict[str, Any] = {}
    for mime, value in data.items():
        name = _FIELDS.get(mime)
        if name is None:
            extra[mime] = value
            continue
        if name == "text" and isinstance(value, str) and value:
            if value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]  # as E2B's server: a string's quotes are dropped
        line[name] = value
    line["extra"] = extra
    return line


#: The error line of an execution whose kernel was restarted under it (by a client, or after
#: it died), in E2B's words.
_RESTARTING: Dict[str, Any] = {
    "type": "error",
    "name": "ContextRestarting",
    "value": "Context was restarted",
    "traceback": "",
}


def _env_code(language: str, values: Mapping[str, Optional[str]]) -> str:
    """Code that sets (a value) or unsets (None) variables in the kernel's process."""
    sets = {k: v for k, v in values.items() if v is not None}
    gone = [k for k, v in values.items() if v is None]
    if language == "python":
        return (
            "import os as _e2b_os\n"
            f"_e2b_os.environ.update({json.dumps(sets)})\n"
            f"[_e2b_os.environ.pop(_k, None) for _k in {json.dumps(gone)}]\n"
            "del _e2b_os"
        )
    if language in _JS_LANGUAGES:
        return (f"Object.assign(process.env, {json.dumps(sets)}); "
                f"for (const k of {json.dumps(gone)}) delete process.env[k];")
    lines = []
    for key, value in values.items():
        if value is None:
            lines.append(f"unset {key}")
        else:
            quoted = "'" + value.replace("'", "'\\''") + "'"
            lines.append(f"export {key}={quoted}")
    return "\n".join(lines)


class Context:
    """One kernel and what the server knows of it.

    Args:
        language: ``"python"``, ``"bash"``, ``"javascript"`` or ``"typescript"``.
        cwd: the kernel's working directory.
        env: the kernel process's environment.
    """

    def __init__(self, language: str, cwd: str, env: Mapping[str, str]) -> None:
        if language not in KERNEL_NAMES:
            raise ContextError(f"no kernel for language {language!r}")
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self._env = dict(env)
        self._km = AsyncKernelManager(kernel_name=KERNEL_NAMES[language])
        self._kc: Any = None
        self.lock = asyncio.Lock()
        #: How many times the kernel was restarted: an execution of an older kernel is over.
        self.generation = 0
        #: Set while the kernel answers (cleared during a restart).
        self._ready = asyncio.Event()
        self._ready.set()
        #: Restarts begun and not finished (the kernel answers again when none is left).
        self._restarts = 0
        self._restart_lock = asyncio.Lock()
        #: The restart of a kernel that died, running in the background.
        self._revival: Optional[asyncio.Future[None]] = None

    def describe(self) -> Dict[str, str]:
        """The context as the server lists it."""
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def start(self) -> None:
        """Start the kernel and wait until it answers.

        Raises:
            ContextError: it did not start or answer in time.
        """
        try:
            await self._km.start_kernel(cwd=self.cwd, env=self._env)
            await self._connect()
        except ContextError:
            raise
        except Exception as exc:  # jupyter_client raises many kinds
            raise ContextError(f"the {self.language} kernel did not start: {exc}") from exc

    async def _connect(self) -> None:
        if self._kc is not None:
            self._kc.stop_channels()
        self._kc = self._km.client()
        self._kc.start_channels()
        try:
            await self._kc.wait_for_ready(timeout=READY_SECONDS)
        except RuntimeError as exc:
            raise ContextError(f"the {self.language} kernel did not answer: {exc}") from exc
        if self.language in _JS_LANGUAGES:
            await self._silent(_JS_PRELUDE)

    async def alive(self) -> bool:
        """True while the kernel process runs."""
        return bool(await self._km.is_alive())

    async def interrupt(self) -> None:
        """Interrupt what the kernel runs (SIGINT; its state is kept)."""
        await self._km.interrupt_kernel()

    async def restart(self) -> None:
        """Restart the kernel (its state is lost) and wait until it answers."""
        self._begin_restart()
        await self._finish_restart()

    def _begin_restart(self) -> None:
        """From now on, executions of the current kernel are over and new ones wait."""
        self.generation += 1
        self._restarts += 1
        self._ready.clear()

    async def _finish_restart(self) -> None:
        try:
            async with self._restart_lock:
                await self._km.restart_kernel(now=True)
                await self._connect()
        finally:
            self._restarts -= 1
            if not self._restarts:
                self._ready.set()

    def _revive(self) -> None:
        """Restart a kernel that died, in the background, as Jupyter's restarter restarts
        the kernels of E2B's server (a restart that fails is tried again by the next
        execution, which finds the kernel dead)."""
        self._begin_restart()
        self._revival = asyncio.ensure_future(self._finish_restart())
        self._revival.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def shutdown(self) -> None:
        """Stop the kernel for good."""
        if self._revival is not None:
            # a kernel that did not come back is stopped all the same
            await asyncio.wait([self._revival])
        if self._kc is not None:
            self._kc.stop_channels()
        await self._km.shutdown_kernel(now=True)

    async def _silent(self, code: str) -> None:
        """Run ``code`` with nothing recorded (no count, no output kept)."""
        msg_id = self._kc.execute(code, silent=True, store_history=False)
        async for _ in self._lines(msg_id):
            pass

    async def execute(self, code: str, env: Optional[Mapping[str, str]], emit: Emit) -> None:
        """Run ``code``, handing each line to ``emit`` (keepalives while it is quiet), the
        end line last.

        The caller holds :attr:`lock`. Variables in ``env`` hold for this execution only:
        set before it, put back after it (as E2B's server does). When this is cancelled (the
        client went away), the kernel is interrupted and the execution drained before this
        returns, so the next one starts on an idle kernel; a kernel that does not stop
        within ``SETTLE_SECONDS`` is restarted.

        A kernel that dies is restarted (its state is lost), as Jupyter restarts E2B's: an
        execution it ran ends with E2B's ``ContextRestarting`` error, and one that finds it
        dead runs on the restarted kernel.
        """
        await self._ready.wait()  # not on a kernel being restarted
        if not await self.alive():
            self._revive()
            await self._ready.wait()
        generation = self.generation
        if env:
            await self._silent(_env_code(self.language, dict(env)))
        if self.generation != generation:  # it died while the variables were set
            await emit(dict(_RESTARTING))
            await emit({"type": "end_of_execution"})
            return
        msg_id = self._kc.execute(code, store_history=True, allow_stdin=False)
        try:
            async for line in self._lines(msg_id):
                await emit(line)
        except BaseException:
            if self.generation == generation:  # this kernel still runs it: stop it
                await asyncio.shield(self._settle(msg_id, env))
            raise
        if self.generation == generation:  # else a new kernel, with the variables it had
            await self._restore_env(env)
        await emit({"type": "end_of_execution"})

    async def _settle(self, msg_id: str, env: Optional[Mapping[str, str]]) -> None:
        """Interrupt the execution ``msg_id`` and read it to its end (restart the kernel if
        it does not end in time), then put ``env`` back."""
        generation = self.generation
        try:
            await self.interrupt()
            await asyncio.wait_for(self._drain(msg_id), SETTLE_SECONDS)
        except (asyncio.TimeoutError, RuntimeError):
            if self.generation == generation:  # not restarted meanwhile (by a client)
                await self.restart()
            return
        if self.generation != generation:
            return
        await self._restore_env(env)

    async def _restore_env(self, env: Optional[Mapping[str, str]]) -> None:
        """Put the variables an execution set back as the kernel started with them."""
        if env:
            await self._silent(_env_code(self.language, {k: self._env.get(k) for k in env}))

    async def _drain(self, msg_id: str) -> None:
        async for _ in self._lines(msg_id):
            pass

    async def _lines(self, msg_id: str) -> AsyncIterator[Dict[str, Any]]:
        errored = valued = False
        generation = self.generation
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        idle_at: Optional[float] = None  # the kernel said idle (a value may still come)
        while True:
            if self.generation != generation:  # restarted under it: this execution is over
                yield dict(_RESTARTING)
                return
            wait = POLL_SECONDS
            if idle_at is not None:
                wait = idle_at + LATE_RESULT_SECONDS - loop.time()
                if wait <= 0:
                    return
            try:
                msg = await self._kc.get_iopub_msg(timeout=wait)
            except queue.Empty:
                if idle_at is not None:
                    continue
                if not await self.alive():
                    self._revive()
                    yield dict(_RESTARTING)
                    return
                if loop.time() - quiet_since >= KEEPALIVE_SECONDS:
                    quiet_since = loop.time()
                    yield {"type": "keepalive"}
                continue
            quiet_since = loop.time()
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            content = msg["content"]
            date = msg.get("header", {}).get("date")
            stamp = date.isoformat() if hasattr(date, "isoformat") else date
            if kind == "stream":
                yield {"type": content["name"], "text": content["text"], "timestamp": stamp}
            elif kind == "execute_input":
                count = content["execution_count"]
                yield {"type": "number_of_executions", "execution_count": count}
            elif kind in ("display_data", "execute_result"):
                valued = valued or kind == "execute_result"
                yield result_line(content.get("data", {}), kind == "execute_result")
                if valued and idle_at is not None:
                    return
            elif kind == "error" and not errored:
                errored = True
                yield {
                    "type": "error",
                    "name": content.get("ename", ""),
                    "value": content.get("evalue", ""),
                    "traceback": "".join(content.get("traceback", [])),  # as E2B joins them
                }
            elif kind == "status" and content.get("execution_state") == "idle":
                if valued or errored or self.language not in _JS_LANGUAGES:
                    return
                idle_at = loop.time()
