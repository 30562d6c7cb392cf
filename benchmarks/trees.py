"""Whole trees on loopback: 2,000 files / 50 MiB up and down, and 1 GiB with flat memory.

Contenders (interleaved round by round, the order rotated; each writes its own directory):

- provider: ``upload(h, local_dir, remote_dir)`` / ``download(h, remote_dir, local_dir)``;
- tar floor: the same bytes as one tar over one process with bare ``requests``: up, one
  ``POST /files`` of the archive (built in memory beforehand, off the clock) and one
  ``Start`` of ``tar -xf`` as ``sandbox``; down, one ``Start`` of ``tar -cf -`` as
  ``sandbox`` whose output is decoded as it comes and piped into a local ``tar -xf -``
  (GNU tar; no checks);
- SDK loop: the official SDK file by file (``files.write`` for each file; ``files.list``
  with the tree's depth, then ``files.read`` for each file).

Goals (issue 15): up and down >= 0.8x the tar floor's speed (time <= 1.25x) and >= 5x
faster than the SDK's loop. Then, in a child process each, a 1 GiB tree is uploaded and
downloaded and the child's peak RSS growth is printed (goal <= 32 MiB).

    python benchmarks/trees.py [--rounds 3] [--files 2000] [--mib 50] [--big-mib 1024]
                               [--scratch /var/tmp]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from typing import Callable, Dict, List

import _bench as b

GOAL_FLOOR = 0.8
GOAL_SDK = 5.0


def make_tree(top: str, files: int, total: int, seed: int = 7) -> List[str]:
    """``files`` files adding up to about ``total`` bytes, in nested directories."""
    rng = random.Random(seed)
    weights = [rng.lognormvariate(0, 1.6) for _ in range(files)]
    scale = total / sum(weights)
    rels = []
    for i, w in enumerate(weights):
        rel = f"d{i % 17}/e{i % 5}/f{i}.bin"
        path = os.path.join(top, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(os.urandom(max(0, int(w * scale))))
        rels.append(rel)
    return rels


def tar_bytes(top: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.add(top, arcname=".")
    return buf.getvalue()


def floor_download(raw: b.RawEnvd, remote: str, local: str) -> None:
    """``tar -cf -`` in the sandbox, its output decoded as it comes and piped into a local
    ``tar -xf -`` (GNU tar: the extraction in C, as ``... | tar x`` in a shell), nothing
    checked."""
    os.makedirs(local)
    untar = subprocess.Popen(["tar", "-xf", "-", "-C", local], stdin=subprocess.PIPE)
    assert untar.stdin is not None
    try:
        resp = raw.post_start("tar", ["-cf", "-", "-C", remote, "."], stream=True)
        pending = bytearray()
        pos = 0
        for chunk in resp.iter_content(1 << 20):
            pending += chunk
            while len(pending) - pos >= 5:
                n = int.from_bytes(pending[pos + 1 : pos + 5], "big")
                if len(pending) - pos < 5 + n:
                    break
                msg = json.loads(pending[pos + 5 : pos + 5 + n])
                pos += 5 + n
                data = msg.get("event", {}).get("data", {}).get("stdout")
                if data:
                    untar.stdin.write(base64.b64decode(data))
            del pending[:pos]
            pos = 0
    finally:
        untar.stdin.close()
        if untar.wait(600) != 0:
            raise RuntimeError(f"local tar exited {untar.returncode}")


class _RssSampler:
    """The growth of this process's resident set while the block runs: the current RSS
    before it, and the peak sampled every 5 ms during it (``ru_maxrss`` would keep the
    peak of anything done before)."""

    def __init__(self) -> None:
        self.growth = 0
        self._stop = threading.Event()

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self, base: int) -> None:
        while not self._stop.wait(0.005):
            self.growth = max(self.growth, self._rss() - base)

    def __enter__(self) -> _RssSampler:
        self._thread = threading.Thread(target=self._run, args=(self._rss(),), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def rss_child(mode: str, mib: int) -> None:
    """Child process: make a ``mib`` MiB tree, move it one way, print peak RSS growth."""
    from e2b_provider.emulator import Emulator

    with Emulator(disk_mb=2 * mib + 1024) as emu:  # the tree, twice over, fits its disk
        ep = b.Endpoint.of_emulator(emu)
        from e2b_provider import E2BSandboxProvider

        with E2BSandboxProvider(b.provider_config(ep)) as p:
            h = p.create("bn-big")
            tmp = tempfile.mkdtemp(prefix="bn-big-")
            try:
                src = os.path.join(tmp, "src")
                for i in range(mib // 16):
                    d = os.path.join(src, f"d{i % 4}")
                    os.makedirs(d, exist_ok=True)
                    with open(os.path.join(d, f"f{i}"), "wb") as f:
                        for _ in range(16):
                            f.write(os.urandom(1 << 20))
                p.upload(h, src, "/workspace/warm-up-only", exclude=["d1", "d2", "d3"])
                if mode == "down":
                    p.upload(h, src, "/workspace/big")
                sampler = _RssSampler()
                t0 = time.perf_counter()
                with sampler:
                    if mode == "up":
                        p.upload(h, src, "/workspace/big")
                    else:
                        p.download(h, "/workspace/big", os.path.join(tmp, "back"))
                took = time.perf_counter() - t0
                print(json.dumps({"growth_mib": sampler.growth / (1 << 20), "seconds": took}))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
                p.destroy(h)


def main() -> None:
    ap = argparse.ArgumentParser(description="trees up and down: provider vs tar floor vs SDK")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    ap.add_argument("--files", type=int, default=2000, help="files in the tree (default 2000)")
    ap.add_argument("--mib", type=int, default=50, help="MiB in the tree (default 50)")
    ap.add_argument("--scratch", default="/var/tmp",
                    help="where the local trees are written, by every contender alike "
                         "(default /var/tmp: on a busy machine a file made in a shared /tmp "
                         "can cost 30x more, whoever makes it, which hides the contenders' "
                         "own costs)")
    ap.add_argument("--big-mib", type=int, default=1024,
                    help="MiB of the memory check's tree (default 1024; 0 skips it)")
    ap.add_argument("--child", choices=("up", "down"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        rss_child(args.child, args.big_mib)
        return

    tmp = tempfile.mkdtemp(prefix="bn-trees-", dir=args.scratch)
    try:
        src = os.path.join(tmp, "src")
        rels = make_tree(src, args.files, args.mib << 20)
        archive = tar_bytes(src)
        # every round leaves three copies of the tree (provider, floor, SDK loop) on the disk
        disk = (args.rounds + 2) * 3 * args.mib + 1024
        with b.on_emulator("bn-trees", disk_mb=disk) as (ep, provider, (h,)):
            sdk = b.sdk_connect(ep, h.id)
            raw = b.RawEnvd(ep, h.id)
            provider.upload(h, src, "/workspace/down-src")  # what the downloads read
            counter = iter(range(1 << 30))

            def fresh(local: bool = False) -> str:
                n = next(counter)
                return os.path.join(tmp, f"out{n}") if local else f"/workspace/up{n}"

            def sdk_up() -> None:
                dest = fresh()
                for rel in rels:
                    with open(os.path.join(src, rel), "rb") as f:
                        sdk.files.write(f"{dest}/{rel}", f.read(), user="sandbox")

            def sdk_down() -> None:
                dest = fresh(local=True)
                for e in sdk.files.list("/workspace/down-src", depth=4, user="sandbox"):
                    if e.type.value == "file":
                        data = sdk.files.read(e.path, format="bytes", user="sandbox")
                        rel = os.path.relpath(e.path, "/workspace/down-src")
                        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                        with open(os.path.join(dest, rel), "wb") as f:
                            f.write(data)

            def floor_up() -> None:
                dest = fresh()
                raw.write_file("/tmp/bn.tar", archive)
                raw.start("/bin/sh", ["-c", f"mkdir -p {dest} && tar -xf /tmp/bn.tar -C {dest}"])

            up: Dict[str, Callable[[], object]] = {
                "provider up": lambda: provider.upload(h, src, fresh()),
                "tar floor up": floor_up,
                "sdk loop up": sdk_up,
            }
            down: Dict[str, Callable[[], object]] = {
                "provider down": lambda: provider.download(h, "/workspace/down-src",
                                                           fresh(local=True)),
                "tar floor down": lambda: floor_download(raw, "/workspace/down-src",
                                                         fresh(local=True)),
                "sdk loop down": sdk_down,
            }
            res = b.interleaved(up, args.rounds, warmup=1)
            res.update(b.interleaved(down, args.rounds, warmup=1))
            for n in range(next(counter)):  # local copies
                shutil.rmtree(os.path.join(tmp, f"out{n}"), ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: b.median(v) for k, v in res.items()}
    mib = args.mib
    rows = [[k, f"{med[k]:.3f}", f"{mib / med[k]:.1f}"] for k in res]
    print(b.table(f"{args.files} files / {mib} MiB on loopback, {args.rounds} rounds",
                  ["contender", "median s", "MiB/s"], rows))
    for way in ("up", "down"):
        vs_floor = med[f"tar floor {way}"] / med[f"provider {way}"]
        vs_sdk = med[f"sdk loop {way}"] / med[f"provider {way}"]
        print(f"{way}: {vs_floor:.2f}x the tar floor's speed (goal >= {GOAL_FLOOR}: "
              f"{'met' if vs_floor >= GOAL_FLOOR else 'NOT met'}); {vs_sdk:.1f}x faster than "
              f"the SDK's loop (goal >= {GOAL_SDK}: {'met' if vs_sdk >= GOAL_SDK else 'NOT met'})")
    if args.big_mib:
        for way in ("up", "down"):
            out = b.run_child(__file__, ["--child", way, "--big-mib", str(args.big_mib)],
                              api_key="", timeout=1800)
            print(f"{args.big_mib} MiB tree {way}: client peak RSS +{out['growth_mib']:.1f} MiB "
                  f"(goal <= 32: {'met' if out['growth_mib'] <= 32 else 'NOT met'}), "
                  f"{args.big_mib / out['seconds']:.0f} MiB/s")


if __name__ == "__main__":
    sys.exit(main())
