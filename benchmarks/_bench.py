"""Shared parts of the benchmark scripts: timing, tables, endpoints and the bare HTTP floor.

Everything here uses only the library's public API (``E2BSandboxProvider``,
``DeploymentConfig``), the official ``e2b`` SDK and plain ``requests`` / sockets, so the
scripts keep working while the library's internals change.

- :func:`interleaved` runs contenders round-robin (the order rotated every round) so machine
  load drifts hit every contender alike; ratios are only ever taken within one run.
- :class:`Endpoint` is where an emulator (or E2B) answers; :func:`provider_config` and
  :func:`sdk_connect` point the library and the SDK at it.
- :class:`RawEnvd` / :class:`RawControl` are the floor: the same E2B requests made with a
  bare ``requests.Session`` (kept connections), and nothing else.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import attrs
import requests

from e2b_provider import DeploymentConfig, E2BSandboxProvider
from e2b_provider.emulator import Emulator
from e2b_provider.protocol.e2b_facts import ENVD_PORT

MiB = 1 << 20

# -- statistics and tables --------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p95(xs: Sequence[float]) -> float:
    if not xs:
        return float("nan")
    return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]


def ratio(a: float, b: float) -> str:
    """``a / b`` as ``0.00x``, or ``-`` when it is undefined."""
    if not b or a != a or b != b:
        return "-"
    return f"{a / b:.2f}x"


def rotated(names: Sequence[str], r: int) -> List[str]:
    """``names`` in round ``r``'s order: rotated by ``r`` so no contender is always first."""
    k = r % len(names)
    return list(names[k:]) + list(names[:k])


def interleaved(
    contenders: Dict[str, Callable[[], Any]], rounds: int, warmup: int = 2
) -> Dict[str, List[float]]:
    """Wall seconds of each call, contenders interleaved (order rotated each round).

    ``warmup`` rounds run first and are not recorded.
    """
    names = list(contenders)
    out: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        for name in rotated(names, r):
            t0 = time.perf_counter()
            contenders[name]()
            dt = time.perf_counter() - t0
            if r >= warmup:
                out[name].append(dt)
    return out


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A compact fixed-width table (first column left-aligned, the rest right-aligned)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [title]
    for n, row in enumerate(cells):
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  " + "  ".join(parts))
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def rss_bytes() -> int:
    """The current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def thread_count() -> int:
    """OS threads of this process (Python and native ones)."""
    return len(os.listdir("/proc/self/task"))


def run_child(script: str, args: Sequence[str], api_key: str, timeout: float) -> Dict[str, Any]:
    """Run ``script args`` in a fresh Python process; the JSON object on its last line.

    The API key travels in ``$BN_API_KEY`` (see :func:`child_endpoint`), not in argv, which
    ``ps`` shows.
    """
    out = subprocess.run(
        [sys.executable, os.path.abspath(script), *args],
        env=dict(os.environ, BN_API_KEY=api_key),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{out.stderr[-3000:]}")
    result: Dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def child_endpoint(url: str) -> Endpoint:
    """In a process started by :func:`run_child`: the emulator at ``url``."""
    return Endpoint(url, url, os.environ["BN_API_KEY"])


# -- endpoints --------------------------------------------------------------------------------


@attrs.frozen
class Endpoint:
    """Where the control plane and envd answer (one emulator: the same URL for both)."""

    api_url: str
    sandbox_url: str
    api_key: str = attrs.field(repr=False)
    domain: str = "e2b.local"

    @classmethod
    def of_emulator(cls, emu: Any) -> Endpoint:
        """The endpoint of a running ``e2b_provider.emulator.Emulator``."""
        return cls(emu.api_url, emu.sandbox_url, emu.api_key, emu.domain)

    def with_host(self, host: str, port: int) -> Endpoint:
        url = f"http://{host}:{port}"
        return attrs.evolve(self, api_url=url, sandbox_url=url)


def provider_config(ep: Endpoint, **overrides: Any) -> DeploymentConfig:
    """A library configuration for ``ep`` (template ``base``)."""
    kwargs: Dict[str, Any] = {
        "api_key": ep.api_key,
        "template": "base",
        "api_url": ep.api_url,
        "sandbox_url": ep.sandbox_url,
        "domain": ep.domain,
    }
    kwargs.update(overrides)
    return DeploymentConfig(**kwargs)


def sdk_opts(ep: Endpoint) -> Dict[str, Any]:
    """Keyword options that point the official SDK at ``ep`` (no environment needed)."""
    return {
        "api_key": ep.api_key,
        "api_url": ep.api_url,
        "sandbox_url": ep.sandbox_url,
        "domain": ep.domain,
    }


def sdk_connect(ep: Endpoint, sandbox_id: str) -> Any:
    """The official SDK's ``Sandbox`` for an existing sandbox (one ``connect``)."""
    from e2b import Sandbox

    return Sandbox.connect(sandbox_id, **sdk_opts(ep))


@contextlib.contextmanager
def on_emulator(
    *names: str, disk_mb: Optional[int] = None
) -> Iterator[Tuple[Endpoint, E2BSandboxProvider, List[Any]]]:
    """A fresh local emulator, a provider on it and one sandbox per name (destroyed after).

    ``disk_mb`` sizes every sandbox's disk (the emulator's default when ``None``).
    """
    with (Emulator() if disk_mb is None else Emulator(disk_mb=disk_mb)) as emu:
        ep = Endpoint.of_emulator(emu)
        with E2BSandboxProvider(provider_config(ep)) as provider:
            handles: List[Any] = []
            try:
                for name in names:
                    handles.append(provider.create(name))
                yield ep, provider, handles
            finally:
                for h in handles:
                    provider.destroy(h)


# -- the bare floor -----------------------------------------------------------------------------


def envelope(message: Dict[str, Any]) -> bytes:
    """One Connect envelope (flags 0, big-endian length, JSON payload)."""
    payload = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


def frames(body: bytes) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """The ``(flags, message)`` frames of a complete Connect stream body."""
    pos = 0
    while pos + 5 <= len(body):
        flags, n = struct.unpack_from(">BI", body, pos)
        yield flags, json.loads(body[pos + 5 : pos + 5 + n])
        pos += 5 + n


class RawControl:
    """The control-plane calls the floor needs, as bare requests."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.headers["X-API-KEY"] = ep.api_key

    def create(self, template: str = "base", timeout: int = 3600) -> Dict[str, Any]:
        r = self.session.post(
            f"{self.ep.api_url}/v2/sandboxes",
            json={"templateID": template, "timeout": timeout},
            timeout=60,
        )
        r.raise_for_status()
        out: Dict[str, Any] = r.json()
        return out

    def connect(self, sandbox_id: str, timeout: int = 3600) -> Dict[str, Any]:
        r = self.session.post(
            f"{self.ep.api_url}/v2/sandboxes/{sandbox_id}/connect",
            json={"timeout": timeout},
            timeout=60,
        )
        r.raise_for_status()
        out: Dict[str, Any] = r.json()
        return out

    def delete(self, sandbox_id: str) -> None:
        r = self.session.delete(f"{self.ep.api_url}/sandboxes/{sandbox_id}", timeout=60)
        if r.status_code not in (204, 404):
            r.raise_for_status()

    def close(self) -> None:
        self.session.close()


class RawEnvd:
    """The floor: envd requests with a bare ``requests.Session`` over kept connections.

    One ``connect`` at construction gives the access token; every call afterwards is exactly
    one HTTP request, read to its end so the connection goes back to the pool.
    """

    def __init__(self, ep: Endpoint, sandbox_id: str, user: str = "sandbox") -> None:
        self.ep = ep
        self.sandbox_id = sandbox_id
        self.user = user
        control = RawControl(ep)
        try:
            token = control.connect(sandbox_id).get("envdAccessToken")
        finally:
            control.close()
        self.session = requests.Session()
        self.session.trust_env = False
        # identity: requests asks for gzip by default, and compressing is not the floor
        self.session.headers.update(
            {
                "E2b-Sandbox-Id": sandbox_id,
                "E2b-Sandbox-Port": str(ENVD_PORT),
                "Accept-Encoding": "identity",
            }
        )
        if token:
            self.session.headers["X-Access-Token"] = token
        self.basic = "Basic " + base64.b64encode(f"{user}:".encode()).decode()

    def start_body(self, cmd: str, args: Sequence[str]) -> bytes:
        return envelope({"process": {"cmd": cmd, "args": list(args)}, "stdin": False})

    def rpc_headers(self, content_type: str = "application/connect+json") -> Dict[str, str]:
        """Headers of a Connect call as user :attr:`user` (plus the session's own)."""
        return {
            "Content-Type": content_type,
            "Connect-Protocol-Version": "1",
            "Authorization": self.basic,
        }

    def post_start(
        self, cmd: str, args: Sequence[str] = (), *, stream: bool = False
    ) -> requests.Response:
        """The ``process.Process/Start`` request of ``cmd args`` (the body not read yet when
        ``stream``)."""
        r = self.session.post(
            f"{self.ep.sandbox_url}/process.Process/Start",
            data=self.start_body(cmd, args),
            headers=self.rpc_headers(),
            stream=stream,
            timeout=(10, 600),
        )
        r.raise_for_status()
        return r

    def start(self, cmd: str, args: Sequence[str] = ()) -> int:
        """Run a command via ``process.Process/Start``; its exit code (stream read whole)."""
        code: Optional[int] = None
        for flags, msg in frames(self.post_start(cmd, args).content):
            end = msg.get("event", {}).get("end")
            if end is not None:
                code = int(end.get("exitCode", 0))
            if flags & 0x02 and msg.get("error"):
                raise RuntimeError(f"Start failed: {msg['error']}")
        if code is None:
            raise RuntimeError("Start stream ended without an end event")
        return code

    def read_file(self, path: str) -> bytes:
        """``GET /files`` (one request)."""
        r = self.session.get(
            f"{self.ep.sandbox_url}/files",
            params={"path": path, "username": self.user},
            timeout=(10, 300),
        )
        r.raise_for_status()
        return r.content

    def write_file(self, path: str, data: bytes) -> None:
        """``POST /files`` with an octet-stream body (one request)."""
        r = self.session.post(
            f"{self.ep.sandbox_url}/files",
            params={"path": path, "username": self.user},
            data=data,
            headers={"Content-Type": "application/octet-stream"},
            timeout=(10, 300),
        )
        r.raise_for_status()

    def stat(self, path: str) -> Dict[str, Any]:
        """``filesystem.Filesystem/Stat`` (one unary Connect request)."""
        r = self.session.post(
            f"{self.ep.sandbox_url}/filesystem.Filesystem/Stat",
            data=json.dumps({"path": path}),
            headers=self.rpc_headers("application/json"),
            timeout=(10, 60),
        )
        r.raise_for_status()
        out: Dict[str, Any] = r.json()
        return out

    def close(self) -> None:
        self.session.close()
