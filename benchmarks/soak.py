"""Soak: ≥ 10,000 mixed operations under periodic faults, then leaks and a timeout burst.

One local emulator, one provider, ``--workers`` threads. Each worker owns a sandbox (the only
one it suspends, resumes, destroys and re-creates) and also works on ``--shared`` sandboxes
every worker uses at once. Operations, drawn at random: exec (plain, failing, large capped
output, with a timeout that fires, cancelled from another thread, with processes that call
``setsid`` and must die with it), write/read/stat (small inline writes and streamed large
ones, read back and compared), suspend + resume, destroy + create, kill_all. Meanwhile a
fault thread arms one of the emulator's faults every ``--fault-every`` seconds (cut, stalled
or malformed streams, the edge's 502, control-plane 5xx and 409 storms, a token missing, an
unresponsive envd) and clears what is left every 30 s.

Printed at the end:

* operations by kind, outcomes, and errors by type (an error counts as *explained* when a
  fault or a reboot touched that sandbox, or the control plane, during the operation);
* the most time past each bound: exec ``timeout + kill bound + 1 s + grace`` (plus the
  reboot bound when wedged), a cancel's ``kill bound + 1 s + grace`` from the cancel, file
  operations' 120 s (+ kill bound + grace); lifecycle calls have no total bound yet (their
  longest time is shown);
* leaks once the provider is closed: threads, file descriptors, sockets (before and after a
  garbage collection), processes left in the sandboxes (after the in-sandbox timeouts had
  time to act), staged upload files and stale exec pid files, and RSS growth;
* ``timeout_burst.py``'s figures for 1,000 timeouts over 10 sandboxes and 320 over 4.

    python benchmarks/soak.py [--ops 10000] [--workers 16] [--shared 3] [--fault-every 2]
"""

from __future__ import annotations

import argparse
import collections
import gc
import glob
import logging
import math
import os
import random
import re
import sys
import threading
import time
from typing import Any, Callable, Counter, Dict, List, Optional, Tuple

import _bench as b
import attrs
from timeout_burst import run_burst

from e2b_provider import (
    Cancelled,
    CancelToken,
    E2BProviderError,
    E2BSandboxProvider,
    ExecResult,
    SandboxHandle,
)
from e2b_provider.emulator import Emulator

KILL_BOUND_SECONDS = 10.0
GRACE = 3.0
REBOOT_BOUND_SECONDS = 60.0
FILE_BOUND = 120.0
ESCAPING = (
    "setsid sleep 81{m} & ( (setsid sleep 82{m} &) ); (env -i /bin/sleep 83{m} &); sleep 84{m}"
)


@attrs.define
class Op:
    """One finished operation."""

    kind: str
    sid: str
    start: float
    end: float
    outcome: str
    #: Seconds the operation may take (None: no total bound is documented).
    bound: Optional[float]
    #: Where the bound counts from, if not the start (a cancel counts from the cancel).
    bound_from: float = 0.0

    @property
    def overrun(self) -> Optional[float]:
        if self.bound is None:
            return None
        return self.end - (self.bound_from or self.start) - self.bound


class Journal:
    """Operations, disturbance windows (faults armed, reboots) and fault counts."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: List[Op] = []
        #: [sandbox id, or "" for every sandbox and the control plane; from; to]
        self.windows: List[List[Any]] = []
        self.faults: Counter[str] = collections.Counter()

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)

    def open(self, sid: str) -> List[Any]:
        """A disturbance of ``sid`` starts now; close it with :meth:`close`."""
        window = [sid, time.monotonic(), math.inf]
        with self.lock:
            self.windows.append(window)
        return window

    def close(self, window: List[Any], after: float = 1.0) -> None:
        with self.lock:
            window[2] = min(window[2], time.monotonic() + after)

    def explained(self, op: Op) -> bool:
        """Whether a fault or a reboot touched the operation's sandbox while it ran."""
        with self.lock:
            return any(
                sid in ("", op.sid) and start <= op.end and op.start <= end
                for sid, start, end in self.windows
            )


_REBOOT_SID = re.compile(r"sandbox (?:reboot failed for )?(\w+)")


class RebootLog(logging.Handler):
    """Counts the provider's warnings; a reboot is a disturbance of its sandbox."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(logging.WARNING)
        self.journal = journal
        self.reboots = 0
        self.unconfirmed = 0
        self.open: Dict[str, List[Any]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "not confirmed stopped" in msg:
            self.unconfirmed += 1
        if "rebooting sandbox" in msg:
            self.reboots += 1
            sid = msg.rsplit(" ", 1)[-1]
            self.open[sid] = self.journal.open(sid)
        elif "rebooted" in msg or "reboot failed" in msg:
            m = _REBOOT_SID.search(msg.replace("e2b_provider: ", ""))
            window = self.open.pop(m.group(1), None) if m else None
            if window is not None:
                self.journal.close(window)


class Soak:
    def __init__(self, emu: Emulator, p: E2BSandboxProvider, args: argparse.Namespace) -> None:
        self.emu = emu
        self.p = p
        self.args = args
        self.journal = Journal()
        self.count = 0
        self.count_lock = threading.Lock()
        self.stop = threading.Event()
        self.shared: List[SandboxHandle] = []
        self.own: Dict[int, SandboxHandle] = {}
        self.own_lock = threading.Lock()
        self.local = threading.local()
        self.lost: set[int] = set()

    # -- the operations ------------------------------------------------------------------

    def sandboxes(self) -> List[SandboxHandle]:
        with self.own_lock:
            return self.shared + list(self.own.values())

    def plan_exec(
        self, h: SandboxHandle, rnd: random.Random
    ) -> Tuple[str, float, Callable[[], str]]:
        """One exec, chosen at random: (kind, its timeout, run) where ``run()`` gives the
        outcome (a cancelled exec sets ``self.local.bound_from``)."""
        p = self.p
        r = rnd.random()
        if r < 0.40:

            def plain() -> str:
                res = p.exec(h, "echo $((6*7))", timeout=30.0)
                return _expect(res, res.exit_code == 0 and res.stdout == "42\n")

            return "exec", 30.0, plain
        if r < 0.50:

            def failing() -> str:
                res = p.exec(h, "echo oops >&2; exit 3", timeout=30.0)
                return _expect(res, res.exit_code == 3 and res.stderr == "oops\n")

            return "exec", 30.0, failing
        if r < 0.58:

            def capped() -> str:
                res = p.exec(
                    h, "head -c 3000000 /dev/zero | base64", timeout=30.0, max_output_bytes=20000
                )
                return _expect(
                    res, res.exit_code == 0 and res.truncated and len(res.stdout) == 20000
                )

            return "exec_capped", 30.0, capped
        if r < 0.78:
            t = rnd.uniform(0.2, 1.5)
            cmd = ESCAPING.format(m=rnd.randrange(10**6)) if r < 0.63 else "sleep 30"

            def timing_out() -> str:
                res = p.exec(h, cmd, timeout=t)
                return _expect(res, res.timed_out and res.exit_code is None)

            return "exec_timeout", t, timing_out
        return "exec_cancel", 0.0, lambda: self.cancelled_exec(h, rnd)

    def cancelled_exec(self, h: SandboxHandle, rnd: random.Random) -> str:
        tok = CancelToken()
        at = [0.0]

        def fire() -> None:
            at[0] = time.monotonic()
            tok.cancel("soak")

        timer = threading.Timer(rnd.uniform(0.05, 1.0), fire)
        timer.start()
        try:
            res = self.p.exec(h, "sleep 30", timeout=60.0, cancel=tok)
        finally:
            timer.cancel()
            self.local.bound_from = at[0]  # the bound counts from the cancel
        return _expect(res, res.cancelled and res.exit_code is None)

    def plan_file(
        self, h: SandboxHandle, rnd: random.Random, me: int
    ) -> Tuple[str, Callable[[], str]]:
        p = self.p
        path = f"/workspace/soak/{me}-{rnd.randrange(8)}.bin"
        r = rnd.random()
        if r < 0.45:
            size = rnd.choice([0, 10, 1000, 60000]) if r < 0.35 else 300000

            def write_read() -> str:
                data = os.urandom(size)
                p.write_file(h, path, data)
                got = p.read_file(h, path, max_bytes=1 << 20)
                return "ok" if got is not None and got.data == data else "wrong content"

            return ("write_read" if size <= 60000 else "write_read_large"), write_read
        if r < 0.75:
            return "read", lambda: (p.read_file(h, path), "ok")[1]

        def stat() -> str:
            st = p.stat(h, path)
            return "ok" if st is None or not st.is_dir else "wrong stat"

        return "stat", stat

    def plan_lifecycle(self, me: int, rnd: random.Random) -> Tuple[str, Callable[[], str]]:
        p = self.p
        with self.own_lock:
            h = self.own[me]
        r = rnd.random()
        if r < 0.5:

            def suspend_resume() -> str:
                p.suspend(h)
                back = p.resume(h)
                res = p.exec(h, "echo back", timeout=30.0)
                return "ok" if back == "resumed" and res.stdout == "back\n" else f"wrong {back}"

            return "suspend_resume", suspend_resume
        if r < 0.8:

            def recreate() -> str:
                self.recreate(me, h)
                return "ok"

            return "recreate", recreate
        return "kill_all", lambda: (p.kill_all(h), "ok")[1]

    def recreate(self, me: int, h: SandboxHandle) -> None:
        """Create the worker's sandbox again (create destroys the older one of its name first:
        if the create then fails, the old sandbox is gone, which explains later errors)."""
        try:
            new = self.p.create(h.name or f"soak-own-{me}")
        except E2BProviderError:
            self.journal.open(h.id)  # never closed: that sandbox may be gone for good
            self.lost.add(me)
            raise
        self.lost.discard(me)
        with self.own_lock:
            self.own[me] = new

    def worker(self, me: int) -> None:
        rnd = random.Random(me * 7919)
        while not self.stop.is_set():
            if me in self.lost:  # its sandbox was lost by a failed re-create: make a new one
                try:
                    self.recreate(me, self.own[me])
                except E2BProviderError:
                    self.stop.wait(0.5)
                    continue
            with self.count_lock:
                if self.count >= self.args.ops:
                    return
                self.count += 1
            with self.own_lock:
                own = self.own[me]
            h = own if rnd.random() < 0.4 else rnd.choice(self.shared)
            r = rnd.random()
            bound: Optional[float]
            if r < 0.55:
                kind, timeout, run = self.plan_exec(h, rnd)
                bound = timeout + KILL_BOUND_SECONDS + 1.0 + GRACE
            elif r < 0.93:
                kind, run = self.plan_file(h, rnd, me)
                bound = FILE_BOUND + KILL_BOUND_SECONDS + GRACE
            else:
                h = own
                kind, run = self.plan_lifecycle(me, rnd)
                bound = None  # no total bound documented yet
            self.local.bound_from = 0.0
            start = time.monotonic()
            try:
                outcome = run()
            except Cancelled:
                # the token fired before the command started (it waited for its sandbox)
                outcome = "ok" if kind == "exec_cancel" else "error Cancelled"
            except E2BProviderError as exc:
                outcome = "error " + type(exc).__name__
            except Exception as exc:  # not from the library's error tree: a defect
                outcome = "UNEXPECTED " + type(exc).__name__
            if outcome == "wedged" and bound is not None:
                bound += REBOOT_BOUND_SECONDS
            self.journal.add(
                Op(kind, h.id, start, time.monotonic(), outcome, bound, self.local.bound_from)
            )

    # -- faults ------------------------------------------------------------------------

    def faults(self) -> None:
        """Arm a fault every ``--fault-every`` s; a fault's window closes once it was hit."""
        rnd = random.Random(4242)
        emu = self.emu
        armed: Dict[int, List[Any]] = {}
        next_arm = time.monotonic() + self.args.fault_every
        next_clear = time.monotonic() + 30.0
        while not self.stop.wait(0.25):
            live = {f["id"] for f in emu.faults()}
            for fid in [f for f in armed if f not in live]:
                self.journal.close(armed.pop(fid))
            now = time.monotonic()
            if now >= next_clear:
                emu.clear_faults()
                for window in armed.values():
                    self.journal.close(window)
                armed.clear()
                next_clear = now + 30.0
            if now < next_arm:
                continue
            next_arm = now + self.args.fault_every
            kind, target, arm = self.pick_fault(rnd)
            window = self.journal.open(target)
            try:
                armed[arm()["id"]] = window
            except Exception as exc:  # the emulator refused: note it, go on
                kind = f"arm failed {type(exc).__name__}"
                self.journal.close(window)
            self.journal.faults[kind] += 1
        emu.clear_faults()
        for window in armed.values():
            self.journal.close(window)

    def pick_fault(self, rnd: random.Random) -> Tuple[str, str, Callable[[], Dict[str, Any]]]:
        """(kind, the sandbox it targets or "" for all, a call that arms it)."""
        emu = self.emu
        sid = rnd.choice(self.sandboxes()).id
        r = rnd.random()
        if r < 0.2:
            return "edge_not_found", sid, lambda: emu.edge_not_found(sandbox_id=sid)
        if r < 0.35:
            n = rnd.randrange(0, 300)
            return "stream_cut", sid, lambda: emu.stream_cut(after_bytes=n, sandbox_id=sid)
        if r < 0.45:
            mode = rnd.choice(["oversized", "malformed", "compressed"])
            return f"bad_envelope {mode}", sid, lambda: emu.bad_envelope(mode, sandbox_id=sid)
        if r < 0.60:
            route = rnd.choice(["connect", "pause", "create", "delete", "list"])
            status = rnd.choice([503, 503, 500, 502])
            return (
                f"control_error {route} {status}",
                "",
                lambda: emu.control_error(route, status, count=1, retry_after=0.2),
            )
        if r < 0.72:
            n = rnd.choice([1, 2, 3])
            return "connect_conflict", "", lambda: emu.connect_conflict(count=n)
        if r < 0.80:
            return "no_token", "", lambda: emu.no_token(count=1)
        if r < 0.92:
            n = rnd.randrange(0, 200)
            return "stream_stall", sid, lambda: emu.stream_stall(sandbox_id=sid, after_bytes=n)
        shared = rnd.choice(self.shared).id  # execs with timeouts run there: it gets rebooted
        return "envd_unresponsive", shared, lambda: emu.envd_unresponsive(shared)


def _expect(res: ExecResult, ok: bool) -> str:
    if res.wedged:
        return "wedged"
    return "ok" if ok else f"wrong {res}"


def _open_fds() -> Dict[str, str]:
    """This process's open file descriptors and what each points to."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return out


def _fds() -> Tuple[int, int]:
    """(open file descriptors, of which sockets) of this process."""
    targets = list(_open_fds().values())
    return len(targets), sum(t.startswith("socket:") for t in targets)


def _leftovers(p: E2BSandboxProvider, h: SandboxHandle) -> int:
    """Processes in the sandbox besides its init, its envd and this very check."""
    r = p.exec(
        h,
        "s=$(ps -o sid= -p $$); ps -e -o pid=,sid=,args= | awk -v s=$s '$1 > 2 && $2 != s'",
        timeout=30.0,
    )
    return len([line for line in r.stdout.splitlines() if line.strip()])


def _settle(p: E2BSandboxProvider, h: SandboxHandle, seconds: float = 45.0) -> int:
    end = time.monotonic() + seconds
    while True:
        n = _leftovers(p, h)
        if n == 0 or time.monotonic() > end:
            return n
        time.sleep(1.0)


def _staged(emu: Emulator, sid: str) -> Tuple[int, int]:
    """(staged upload files, pid files of execs) left in a sandbox, read on the host."""
    root = os.path.join(emu.state_dir or "", sid)
    staged = [
        f
        for f in glob.glob(os.path.join(root, "upper/opt/capybara/upload/*"))
        if not os.path.isdir(f)
    ]
    pids = glob.glob(os.path.join(root, "root/tmp/.capybara-exec-*.pid"))
    return len(staged), len(pids)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=10000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--shared", type=int, default=3)
    ap.add_argument("--fault-every", type=float, default=2.0)
    ap.add_argument("--no-burst", action="store_true", help="skip the timeout bursts")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with Emulator(startup_timeout=60.0) as emu:
        out = soak(emu, args)
        if not args.no_burst:
            for n, s in ((1000, 10), (320, 4)):
                print(f"\n=== timeout burst: {n} execs over {s} sandboxes", flush=True)
                for key, value in run_burst(emu, n, s).items():
                    print(f"  {key:>22}: {value}")
    return out


def soak(emu: Emulator, args: argparse.Namespace) -> int:
    gc.collect()
    threads0 = b.thread_count()
    fds0, socks0 = _fds()
    before = _open_fds()
    p = E2BSandboxProvider(
        emu.config(template="base"),
        kill_bound=KILL_BOUND_SECONDS,
        kill_grace=GRACE,
        reboot_bound=REBOOT_BOUND_SECONDS,
    )
    s = Soak(emu, p, args)
    reboot_log = RebootLog(s.journal)
    logger = logging.getLogger("e2b_provider")
    logger.setLevel(logging.WARNING)
    logger.propagate = False  # counted here, not printed
    logger.addHandler(reboot_log)
    s.shared = [p.create(f"soak-shared-{i}") for i in range(args.shared)]
    s.own = {i: p.create(f"soak-own-{i}") for i in range(args.workers)}
    for h in s.sandboxes():
        p.exec(h, "mkdir -p /workspace/soak")
    rss0 = b.rss_bytes()
    t0 = time.monotonic()
    workers = [threading.Thread(target=s.worker, args=(i,)) for i in range(args.workers)]
    fault_thread = threading.Thread(target=s.faults)
    for t in [*workers, fault_thread]:
        t.start()
    last = 0
    while any(t.is_alive() for t in workers):
        time.sleep(5.0)
        done = len(s.journal.ops)
        if done - last >= 1000 or not any(t.is_alive() for t in workers):
            print(f"  {done} operations after {time.monotonic() - t0:.0f} s", flush=True)
            last = done
    s.stop.set()
    fault_thread.join(60)
    wall = time.monotonic() - t0
    emu.clear_faults()
    rss1 = b.rss_bytes()

    # leftovers in the sandboxes (the in-sandbox timeouts get their time first)
    leftovers = {h.id: _settle(p, h) for h in s.sandboxes()}
    staged = {h.id: _staged(emu, h.id) for h in s.sandboxes()}
    for h in s.sandboxes():
        p.destroy(h)
    p.close()
    logging.getLogger("e2b_provider").removeHandler(reboot_log)
    time.sleep(1.0)  # let daemon helpers notice (library threads are kept: constant)
    fds1, socks1 = _fds()
    new_fds = {fd: t for fd, t in _open_fds().items() if before.get(fd) != t}
    lib_threads = sum(1 for t in threading.enumerate() if t.name.startswith("e2b-provider"))
    threads1 = b.thread_count()
    gc.collect()
    fds2, socks2 = _fds()

    report(s, wall, reboot_log.reboots, reboot_log.unconfirmed)
    print("\nleaks (provider closed, sandboxes destroyed)")
    print(
        f"  threads: {threads1 - threads0 - lib_threads} "
        f"(+ the library's own, constant: {lib_threads} = 1 watchdog + at most 8 workers)"
    )
    print(f"  file descriptors: {fds1 - fds0} (after gc: {fds2 - fds0}) {new_fds or ''}")
    print(f"  sockets: {socks1 - socks0} (after gc: {socks2 - socks0})")
    where = {sid: n for sid, n in leftovers.items() if n}
    print(f"  sandbox processes left: {sum(leftovers.values())} {where or ''}")
    print(f"  staged upload files left: {sum(a for a, _ in staged.values())}")
    print(
        f"  exec pid files left: {sum(c for _, c in staged.values())} (a reboot leaves those "
        "of the commands it stopped; harmless: a kill acts on a pid only while its command "
        "line is still that exec's)"
    )
    print(f"  RSS growth: {(rss1 - rss0) / b.MiB:.1f} MiB (from {rss0 / b.MiB:.0f} MiB)")
    return 0


def report(s: Soak, wall: float, reboots: int, unconfirmed: int) -> None:
    ops = s.journal.ops
    print(
        f"\n{len(ops)} operations in {wall:.0f} s by {s.args.workers} threads "
        f"({len(ops) / wall:.0f}/s); {sum(s.journal.faults.values())} faults armed; "
        f"{reboots} reboots; {unconfirmed} kills not confirmed in time"
    )
    kinds: Counter[str] = collections.Counter(o.kind for o in ops)
    outcomes: Dict[str, Counter[str]] = collections.defaultdict(collections.Counter)
    for o in ops:
        outcomes[o.kind][o.outcome] += 1
    print(
        b.table(
            "\noperations",
            ["kind", "count", "outcomes"],
            [
                (k, n, ", ".join(f"{v} {c}" for c, v in outcomes[k].most_common()))
                for k, n in kinds.most_common()
            ],
        )
    )
    errors: Counter[str] = collections.Counter()
    unexplained: Counter[str] = collections.Counter()
    for o in ops:
        if o.outcome != "ok":
            errors[o.outcome] += 1
            if not s.journal.explained(o):
                unexplained[o.outcome] += 1
    print(
        b.table(
            "\nerrors and other outcomes by type",
            ["type", "count", "unexplained"],
            [(k, n, unexplained[k]) for k, n in errors.most_common()] or [("none", 0, 0)],
        )
    )
    print(b.table("\nfaults armed", ["fault", "count"], s.journal.faults.most_common()))
    rows = []
    by_kind: Dict[str, List[Op]] = collections.defaultdict(list)
    for o in ops:
        by_kind[o.kind].append(o)
    for k, group in sorted(by_kind.items()):
        bounded = [o for o in group if o.overrun is not None]
        longest = max(o.end - o.start for o in group)
        worst: Any = "-" if not bounded else f"{max(o.overrun for o in bounded):+.2f}"  # type: ignore[type-var]
        rows.append((k, len(group), f"{longest:.2f}", worst))
    print(
        b.table(
            "\ntime past each bound (negative: within it)",
            ["kind", "count", "longest s", "max past bound s"],
            rows,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
