"""WAN mode: round trips, requests and new connections per call over a fixed-delay link.

Set-up (made here, removed in every case, also on Ctrl-C or SIGTERM):

- two network namespaces ``bn-<pid>-cli`` and ``bn-<pid>-srv`` joined by one veth pair
  (``bn`` is the default prefix; ``--netns-prefix`` or ``$WAN_NETNS_PREFIX`` pick another,
  e.g. on a machine shared by several people);
  each end has two addresses: ``10.213.0.x`` (the WAN path) and ``10.213.1.x`` (the local
  path, no delay);
- in each namespace an iptables rule ``-t raw -A PREROUTING -i <veth> (-d|-s) 10.213.0.2
  -j NFQUEUE`` sends every packet of the WAN path that *arrives* there to
  ``benchmarks/nfq_delay.py``, which holds it for half the RTT and then accepts it (held on
  arrival: delaying on send would hold packets inside the sender's TCP small queues and add
  a false extra delay). The same program counts, per direction, SYNs and HTTP request and
  status lines;
- the emulator (``python -m e2b_provider.emulator --host 0.0.0.0``) runs in the server
  namespace; this process moves itself into the client namespace (``setns``) before it
  starts any thread, so the library, the official SDK and the floor all run there.

The delay is checked before measuring: ``ping -U`` (user-to-user time; plain ``ping``
timestamps the reply before the client side's queue and would show half the RTT) and the
TCP connect time, WAN minus local. Round trips are divided by the measured connect RTT.

Per call and contender it prints the local and WAN medians, **round trips per call** =
``(WAN median - local median) / RTT``, and **requests / new TCP connections per call** as
counted at the queue (client to server). Contenders: ``provider`` (E2BSandboxProvider),
``sdk`` (the official e2b SDK), ``floor`` (one bare request with ``requests`` over a kept
connection). Calls and contenders are interleaved round by round, the local and WAN
measurement of a call back to back.

Besides the calls on one warm sandbox, the **first file call on a fresh sandbox** (``first
write 1K``: ``write_file`` vs the SDK's ``files.write``; ``first write 50``: ``write_files``
of 50 files of 1 KiB vs ``files.write_files``): each sandbox is created off the clock by the
same client over the same path as the timed call, and deleted after it (goal: 1.5x the SDK's
wall time). On E2B a fresh sandbox has a host name of its own, so its first call opens a new
connection, which starts from the initial congestion window (about 14 KiB on the wire before
the first answer); the emulator serves every sandbox on one address, where each client would
carry on over a kept connection with whatever window the calls before it left. So before each
first call every connection of this namespace to the emulator is closed (``ss -K``), for both
clients alike; ``--first-reuse`` keeps them instead.

Needs root, ``ip`` (iproute2), ``nsenter`` (util-linux), ``iptables`` with the NFQUEUE
target (Debian: ``apt-get install iptables``), the kernel's nfnetlink_queue, and optionally
``ping`` (``apt-get install iputils-ping``). Nothing is installed here.

    python benchmarks/wan.py [--rtt-ms 20] [--runs 20] [--create-runs 4] [--first-runs 7]
                             [--first-reuse] [--netns-prefix bn]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple

import _bench as b

HERE = os.path.dirname(os.path.abspath(__file__))
WAN_CLI, WAN_SRV = "10.213.0.1", "10.213.0.2"
LOCAL_CLI, LOCAL_SRV = "10.213.1.1", "10.213.1.2"
CLONE_NEWNET = 0x40000000
#: exit status when this machine lacks something the WAN mode needs (printed, not installed)
EXIT_UNAVAILABLE = 3
#: the namespaces' and interfaces' name prefix unless told otherwise
DEFAULT_PREFIX = os.environ.get("WAN_NETNS_PREFIX") or "bn"
#: issue 7's goals, in round trips per call on a warm sandbox (provider only)
GOALS = {"exec": 1.2, "read 1K": 1.2, "stat": 1.2, "write 1K": 1.2, "write 1M": 2.2}
#: issue 15's goals: the provider's WAN wall time at most this times the SDK's
WALL_GOALS = {"read 1K": 1.15, "stat": 1.15, "write 1K": 1.15,
              "first write 1K": 1.5, "first write 50": 1.5}
#: calls whose latency is dominated by a variable server-side cost (booting a sandbox takes
#: hundreds of ms give or take a hundred): only their requests and connections are reported
COUNT_ONLY = {"create"}


def run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=60)


def missing_prerequisites() -> List[str]:
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root (network namespaces, iptables and NFQUEUE need it)")
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` not found: apt-get install {package}")
    return problems


def readline(stream: IO[bytes], timeout: float, what: str) -> str:
    """One line from a subprocess pipe, waiting at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise RuntimeError(f"{what}: no answer within {timeout:g} s")
            chunk = os.read(stream.fileno(), 1)
            if not chunk:
                raise RuntimeError(f"{what}: exited")
            buf += chunk
    return buf.decode().strip()


def stop_process(proc: Optional[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class Link:
    """The two namespaces, the veth pair, the NFQUEUE rules and the two delay programs."""

    def __init__(self, rtt_ms: float, prefix: str = "bn") -> None:
        pid = os.getpid()
        self.prefix = prefix
        self.cli, self.srv = f"{prefix}-{pid}-cli", f"{prefix}-{pid}-srv"
        self.cli_if, self.srv_if = f"{prefix}{pid}c", f"{prefix}{pid}s"
        self.delay_ms = rtt_ms / 2
        self.delayers: Dict[str, subprocess.Popen[bytes]] = {}

    def remove_stale(self) -> None:
        """Remove namespaces left by an earlier run of this script that was SIGKILLed."""
        stale = re.compile(rf"^{re.escape(self.prefix)}-(\d+)-(cli|srv)\b")
        for line in run(["ip", "netns", "list"], check=False).stdout.splitlines():
            m = stale.match(line)
            if m and not os.path.exists(f"/proc/{m.group(1)}"):
                run(["ip", "netns", "del", line.split()[0]], check=False)

    def ns_path(self, ns: str) -> str:
        return f"/run/netns/{ns}"

    def up(self) -> None:
        self.remove_stale()
        run(["ip", "netns", "add", self.cli])
        run(["ip", "netns", "add", self.srv])
        run(
            [
                "ip",
                "link",
                "add",
                self.cli_if,
                "netns",
                self.cli,
                "type",
                "veth",
                "peer",
                "name",
                self.srv_if,
                "netns",
                self.srv,
            ]
        )
        for ns, dev, addrs in (
            (self.cli, self.cli_if, (WAN_CLI, LOCAL_CLI)),
            (self.srv, self.srv_if, (WAN_SRV, LOCAL_SRV)),
        ):
            for addr in addrs:
                run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            run(["ip", "-n", ns, "link", "set", dev, "up"])
        # the delay programs first: with the rules in place and nobody bound, packets drop
        for ns in (self.srv, self.cli):
            proc = subprocess.Popen(
                [
                    "nsenter",
                    f"--net={self.ns_path(ns)}",
                    sys.executable,
                    os.path.join(HERE, "nfq_delay.py"),
                    "--queue",
                    "0",
                    "--delay-ms",
                    str(self.delay_ms),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            self.delayers[ns] = proc
            assert proc.stdout is not None
            line = readline(proc.stdout, 10, f"nfq_delay in {ns}")
            if line != "ready":
                raise RuntimeError(f"nfq_delay in {ns}: {line}")
        self.iptables(self.srv, "-A", "-i", self.srv_if, "-d", WAN_SRV)
        self.iptables(self.cli, "-A", "-i", self.cli_if, "-s", WAN_SRV)

    def iptables(self, ns: str, op: str, *match: str) -> None:
        cmd = ["ip", "netns", "exec", ns, "iptables", "-t", "raw", op, "PREROUTING", *match]
        cmd += ["-j", "NFQUEUE", "--queue-num", "0"]
        r = run(cmd, check=False)
        if r.returncode != 0 and op == "-A":
            raise RuntimeError(
                f"iptables NFQUEUE rule failed in {ns}: {r.stderr.strip()} (needs the kernel's "
                "nf_tables/xt NFQUEUE support and Debian's iptables package)"
            )

    def stats(self) -> Dict[str, Dict[str, int]]:
        """Counters of both queues: ``c2s`` (arrived at the server), ``s2c``."""
        for proc in self.delayers.values():
            assert proc.stdin is not None
            proc.stdin.write(b"stats\n")
            proc.stdin.flush()
        out = {}
        for key, ns in (("c2s", self.srv), ("s2c", self.cli)):
            stdout = self.delayers[ns].stdout
            assert stdout is not None
            out[key] = json.loads(readline(stdout, 5, f"nfq_delay in {ns}"))
        return out

    def down(self) -> None:
        """Remove everything made by :meth:`up`; safe to call more than once."""
        for ns in (self.srv, self.cli):
            if os.path.exists(self.ns_path(ns)):
                self.iptables(
                    ns,
                    "-D",
                    *(
                        ("-i", self.srv_if, "-d", WAN_SRV)
                        if ns == self.srv
                        else ("-i", self.cli_if, "-s", WAN_SRV)
                    ),
                )
        for proc in self.delayers.values():
            if proc.stdin is not None and proc.poll() is None:
                try:
                    proc.stdin.write(b"quit\n")
                    proc.stdin.close()
                except OSError:
                    pass
            stop_process(proc, timeout=5)
        self.delayers.clear()
        for ns in (self.cli, self.srv):
            if os.path.exists(self.ns_path(ns)):
                run(["ip", "netns", "del", ns], check=False)

    def enter_client(self) -> None:
        """Move this process into the client namespace (only while it has one thread)."""
        if b.thread_count() != 1:
            raise RuntimeError("setns needs a single-threaded process")
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(self.ns_path(self.cli), os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns: {os.strerror(err)}")
        finally:
            os.close(fd)

    def ping_ms(self) -> Optional[float]:
        if shutil.which("ping") is None:
            return None
        r = run(
            [
                "nsenter",
                f"--net={self.ns_path(self.cli)}",
                "ping",
                "-U",
                "-q",
                "-c",
                "10",
                "-i",
                "0.05",
                WAN_SRV,
            ],
            check=False,
        )
        m = re.search(r"= [\d.]+/([\d.]+)/", r.stdout)
        return float(m.group(1)) if m else None


class EmulatorInNetns:
    """``python -m e2b_provider.emulator`` started inside a namespace; its export lines."""

    def __init__(self, ns_path: str) -> None:
        self.ns_path = ns_path
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.stderr = tempfile.TemporaryFile()
        self.port = 0
        self.api_key = ""

    def start(self, timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [
                "nsenter",
                f"--net={self.ns_path}",
                sys.executable,
                "-m",
                "e2b_provider.emulator",
                "--host",
                "0.0.0.0",
                "--port",
                "0",
                "--exit-with-parent",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        assert self.proc.stdout is not None
        # once it serves, stdout has the export lines alone, E2B_TEMPLATE last
        fields: Dict[str, str] = {}
        deadline = time.monotonic() + timeout
        try:
            while "E2B_TEMPLATE" not in fields:
                left = max(0.1, deadline - time.monotonic())
                line = readline(self.proc.stdout, left, "the emulator")
                key, _, value = line.removeprefix("export ").partition("=")
                fields[key] = value
        except RuntimeError:
            self.stderr.seek(0)
            raise RuntimeError(
                "the emulator did not start: " + self.stderr.read().decode()[-2000:]
            ) from None
        self.port = int(fields["E2B_API_URL"].rsplit(":", 1)[1])
        self.api_key = fields["E2B_API_KEY"]

    def stop(self) -> None:
        stop_process(self.proc)
        self.stderr.close()


def connect_ms(host: str, port: int) -> float:
    t0 = time.perf_counter()
    with socket.create_connection((host, port), timeout=5):
        pass
    return time.perf_counter() - t0


def measure_rtt(port: int, samples: int = 15) -> float:
    """Median TCP connect time over the WAN path minus over the local path, in seconds."""
    wan, local = [], []
    for _ in range(samples):
        wan.append(connect_ms(WAN_SRV, port))
        local.append(connect_ms(LOCAL_SRV, port))
    return b.median(wan) - b.median(local)


Call = Callable[[], Any]


class Recorder:
    """Per (call, contender): local and WAN latencies, and what the queue counted on WAN."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.local: Dict[Tuple[str, str], List[float]] = {}
        self.wan: Dict[Tuple[str, str], List[float]] = {}
        self.counts: Dict[Tuple[str, str], List[Dict[str, int]]] = {}

    def once(self, key: Tuple[str, str], wan: bool, fn: Call, record: bool) -> Any:
        before = self.link.stats() if wan else None
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        if before is not None:
            after = self.link.stats()
            diff = {
                f"{d}.{k}": after[d][k] - before[d][k]
                for d in ("c2s", "s2c")
                for k in ("syn", "requests", "responses", "packets")
            }
            if record:
                self.counts.setdefault(key, []).append(diff)
        if record:
            (self.wan if wan else self.local).setdefault(key, []).append(dt)
        return result

    def run(
        self,
        call: str,
        contenders: Dict[str, Tuple[Call, Call]],
        rounds: int,
        warmup: int,
        after: Optional[Callable[[str, Any], None]] = None,
        fresh: bool = False,
    ) -> None:
        """Interleave contenders (order rotated per round), local and WAN back to back.
        ``fresh``: each contender's function makes a fresh sandbox off the clock and
        returns its id and the call to time; ``after`` then gets that id."""
        names = list(contenders)
        for r in range(warmup + rounds):
            for name in b.rotated(names, r):
                local_fn, wan_fn = contenders[name]
                paths = [(False, local_fn), (True, wan_fn)]
                for wan, fn in paths if r % 2 == 0 else paths[::-1]:
                    made = None
                    if fresh:
                        made, fn = fn()
                    result = self.once((call, name), wan, fn, r >= warmup)
                    if after is not None:
                        after(name, made if fresh else result)

    def rows(self, rtt: float) -> List[List[object]]:
        rows: List[List[object]] = []
        rts = {
            key: (b.median(wan) - b.median(self.local[key])) / rtt for key, wan in self.wan.items()
        }
        calls = list(dict.fromkeys(call for call, _ in self.wan))
        order = ("provider", "sdk", "floor")
        keys = sorted(self.wan, key=lambda k: (calls.index(k[0]), order.index(k[1])))
        for call, name in keys:
            wan = self.wan[(call, name)]
            local = b.median(self.local[(call, name)])
            rt = rts[(call, name)]
            sdk_rt = rts.get((call, "sdk"))
            timed = call not in COUNT_ONLY
            counts = self.counts[(call, name)]
            n = len(counts)
            reqs = sum(c["c2s.requests"] for c in counts) / n
            resps = sum(c["s2c.responses"] for c in counts) / n
            conns = sum(c["c2s.syn"] for c in counts) / n
            goal = GOALS.get(call) if name == "provider" else None
            sdk_wan = self.wan.get((call, "sdk"))
            wall = b.median(wan) / b.median(sdk_wan) if sdk_wan and timed else None
            wall_goal = WALL_GOALS.get(call) if name == "provider" else None
            rows.append(
                [
                    call,
                    name,
                    b.ms(local),
                    b.ms(b.median(wan)),
                    f"{rt:.2f}" if timed else "-",
                    f"{reqs:.2f}",
                    f"{resps:.2f}",
                    f"{conns:.2f}",
                    "-" if sdk_rt is None or not timed else f"{rt - sdk_rt:+.2f}",
                    "-" if goal is None else ("ok" if rt <= goal else f"> {goal}"),
                    "-" if wall is None else f"{wall:.2f}x",
                    "-" if wall_goal is None or wall is None
                    else ("ok" if wall <= wall_goal else f"> {wall_goal}"),
                ]
            )
        return rows


def benchmark(link: Link, emu: EmulatorInNetns, args: argparse.Namespace) -> None:
    from e2b import Sandbox

    from e2b_provider import E2BSandboxProvider

    base = b.Endpoint("http://x", "http://x", emu.api_key)
    local_ep = base.with_host(LOCAL_SRV, emu.port)
    wan_ep = base.with_host(WAN_SRV, emu.port)

    ping = link.ping_ms()
    rtt = measure_rtt(emu.port)
    print(
        f"delay check: configured RTT {args.rtt_ms:.1f} ms; ping -U "
        f"{'n/a' if ping is None else f'{ping:.2f} ms'}; TCP connect WAN - local "
        f"{rtt * 1000:.2f} ms (round trips below are divided by this)"
    )
    if abs(rtt * 1000 - args.rtt_ms) > max(2.0, 0.25 * args.rtt_ms):
        raise SystemExit(f"the measured RTT {rtt * 1000:.2f} ms is off; not measuring")

    providers = {ep: E2BSandboxProvider(b.provider_config(ep)) for ep in (local_ep, wan_ep)}
    control = b.RawControl(local_ep)
    h = providers[local_ep].create("bn-wan")
    try:
        sdk = {ep: b.sdk_connect(ep, h.id) for ep in (local_ep, wan_ep)}
        floor = {ep: b.RawEnvd(ep, h.id) for ep in (local_ep, wan_ep)}
        small, large = os.urandom(1024), os.urandom(b.MiB)
        src = "/workspace/bn-read-1k"
        floor[local_ep].write_file(src, small)
        rec = Recorder(link)

        def both(make: Callable[[b.Endpoint], Call]) -> Tuple[Call, Call]:
            return make(local_ep), make(wan_ep)

        def write(name: str, data: bytes) -> Dict[str, Tuple[Call, Call]]:
            path = f"/workspace/bn-write-{name}-{len(data)}"
            return {
                "provider": both(lambda ep: lambda: providers[ep].write_file(h, path, data)),
                "sdk": both(lambda ep: lambda: sdk[ep].files.write(path, data, user="sandbox")),
                "floor": both(lambda ep: lambda: floor[ep].write_file(path, data)),
            }

        calls: List[Tuple[str, Dict[str, Tuple[Call, Call]]]] = [
            (
                "exec",
                {
                    "provider": both(lambda ep: lambda: providers[ep].exec(h, "true")),
                    "sdk": both(lambda ep: lambda: sdk[ep].commands.run("true")),
                    "floor": both(lambda ep: lambda: floor[ep].start("/bin/true")),
                },
            ),
            (
                "read 1K",
                {
                    "provider": both(lambda ep: lambda: providers[ep].read_file(h, src)),
                    "sdk": both(
                        lambda ep: lambda: sdk[ep].files.read(src, format="bytes", user="sandbox")
                    ),
                    "floor": both(lambda ep: lambda: floor[ep].read_file(src)),
                },
            ),
            (
                "stat",
                {
                    "provider": both(lambda ep: lambda: providers[ep].stat(h, src)),
                    "sdk": both(lambda ep: lambda: sdk[ep].files.get_info(src, user="sandbox")),
                    "floor": both(lambda ep: lambda: floor[ep].stat(src)),
                },
            ),
            ("write 1K", write("1k", small)),
            ("write 1M", write("1m", large)),
        ]
        for call, contenders in calls:
            rec.run(call, contenders, args.runs, args.warmup)

        counter = iter(range(1 << 30))
        # the first file call on a fresh sandbox: made off the clock by the same client over
        # the same path as the call, deleted after it
        batch = {f"/workspace/d{i % 5}/f{i}.txt": os.urandom(1024) for i in range(50)}

        def new_connections() -> None:
            """Close every TCP connection to the emulator (this process's namespace): the
            next call of each client opens a new one, as a fresh sandbox's does on E2B."""
            if args.first_reuse:
                return
            for addr in (WAN_SRV, LOCAL_SRV):
                run(["ss", "-K", "dst", addr])

        def first(
            ours: Callable[[Any, Any], object], theirs: Callable[[Any], object],
        ) -> Dict[str, Tuple[Call, Call]]:
            def provider_at(ep: b.Endpoint) -> Call:
                def make() -> Tuple[str, Call]:
                    fresh = providers[ep].create(f"bn-first-{next(counter)}")
                    new_connections()
                    return fresh.id, lambda: ours(providers[ep], fresh)
                return make

            def sdk_at(ep: b.Endpoint) -> Call:
                def make() -> Tuple[str, Call]:
                    fresh = Sandbox.create("base", **b.sdk_opts(ep))
                    new_connections()
                    return fresh.sandbox_id, lambda: theirs(fresh)
                return make

            return {"provider": both(provider_at), "sdk": both(sdk_at)}

        for call, contenders in (
            ("first write 1K", first(
                lambda p, fresh: p.write_file(fresh, "/workspace/one.txt", small),
                lambda fresh: fresh.files.write("/workspace/one.txt", small, user="sandbox"))),
            ("first write 50", first(
                lambda p, fresh: p.write_files(fresh, batch),
                lambda fresh: fresh.files.write_files(
                    [{"path": k, "data": v} for k, v in batch.items()], user="sandbox"))),
        ):
            rec.run(call, contenders, args.first_runs, 1,
                    after=lambda _name, sid: control.delete(sid), fresh=True)

        created: List[str] = []

        def made(name: str, result: Any) -> None:
            sid = (
                result.id
                if name == "provider"
                else (result.sandbox_id if name == "sdk" else result["sandboxID"])
            )
            control.delete(sid)  # off the clock, over the local path
            created.append(sid)

        raw_control = {ep: b.RawControl(ep) for ep in (local_ep, wan_ep)}
        rec.run(
            "create",
            {
                "provider": both(
                    lambda ep: lambda: providers[ep].create(f"bn-new-{next(counter)}")
                ),
                "sdk": both(lambda ep: lambda: Sandbox.create("base", **b.sdk_opts(ep))),
                "floor": both(lambda ep: lambda: raw_control[ep].create()),
            },
            args.create_runs,
            1,
            after=made,
        )
    finally:
        providers[local_ep].destroy(h)
        for p in providers.values():
            p.close()

    print()
    print(
        b.table(
            f"warm sandbox over a {rtt * 1000:.1f} ms RTT link, {args.runs} runs per cell "
            f"(create: {args.create_runs}); medians",
            [
                "call",
                "contender",
                "local ms",
                "WAN ms",
                "round trips",
                "requests",
                "responses",
                "new conns",
                "RT - sdk",
                "goal",
                "WAN / sdk",
                "goal",
            ],
            rec.rows(rtt),
        )
    )
    print(
        "round trips = (WAN median - local median) / RTT. Counted at the queues, per call: "
        "requests = HTTP request lines client->server, responses = status lines "
        "server->client, new conns = SYNs client->server. WAN / sdk = the WAN median "
        "wall time over the SDK's (issue 15's goal for reads, stats and small writes)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description="WAN mode: round trips, requests and new TCP connections per call "
        "(provider vs official SDK vs bare floor) over a fixed-delay veth link.",
        epilog="Needs root, iproute2, util-linux and Debian's iptables; see the module doc.",
    )
    ap.add_argument("--rtt-ms", type=float, default=20.0, help="round-trip delay (default 20)")
    ap.add_argument("--runs", type=int, default=20, help="measured runs per cell (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="unrecorded rounds first (default 3)")
    ap.add_argument(
        "--create-runs", type=int, default=4, help="measured creates per cell (default 4)"
    )
    ap.add_argument(
        "--first-runs", type=int, default=7,
        help="measured first file calls on fresh sandboxes per cell (default 7)",
    )
    ap.add_argument(
        "--first-reuse", action="store_true",
        help="keep the clients' connections for the first calls on fresh sandboxes (by "
        "default they are closed before each, as a fresh sandbox's own host name on E2B "
        "means a new connection)",
    )
    ap.add_argument(
        "--netns-prefix", default=DEFAULT_PREFIX,
        help="prefix of the namespaces and interfaces made (default $WAN_NETNS_PREFIX or bn)",
    )
    args = ap.parse_args()
    if re.fullmatch(r"[a-z]{1,4}", args.netns_prefix) is None:
        ap.error("--netns-prefix: 1-4 lower-case letters (interface names are short)")
    problems = missing_prerequisites()
    if problems:
        print("wan.py cannot run here:\n  " + "\n  ".join(problems), file=sys.stderr)
        return EXIT_UNAVAILABLE

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    link = Link(args.rtt_ms, args.netns_prefix)
    emu: Optional[EmulatorInNetns] = None
    try:
        link.up()
        emu = EmulatorInNetns(link.ns_path(link.srv))
        emu.start()
        link.enter_client()
        benchmark(link, emu, args)
    finally:
        if emu is not None:
            emu.stop()
        link.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
