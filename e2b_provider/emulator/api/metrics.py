"""Sandbox metrics: ``SandboxMetric`` samples made from the runtime's resource readings.

This module owns turning readings of a sandbox's CPU time, memory and disk use
(:class:`~e2b_provider.emulator.runtime.ResourceUsage`) into E2B's ``SandboxMetric``
(``cpuCount``, ``cpuUsedPct``, ``memUsed``, ``memTotal``, ``memCache``, ``diskUsed``,
``diskTotal``, ``timestamp``/``timestampUnix``) and keeping each sandbox's recent samples.
The emulator samples when asked (at most once a second per sandbox), not on a timer;
``cpuUsedPct`` is the CPU used between two samples (the first: since the sandbox started)
over the sandbox's CPUs. A value the host cannot give is reported as 0; ``memTotal`` falls
back to the sandbox's ``memoryMB``. Pure: no I/O.
"""

from __future__ import annotations

import collections
from typing import Any, Deque, Dict, List, Optional

import attrs

from .state import rfc3339

__all__ = ["MIB", "MetricSample", "MetricsHistory"]

MIB = 1024 * 1024
#: Samples kept per sandbox.
HISTORY = 720
#: A sandbox is sampled again only after this many seconds.
MIN_INTERVAL_SECONDS = 1.0


@attrs.frozen
class MetricSample:
    """One ``SandboxMetric``."""

    timestamp: float
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int

    def to_json(self) -> Dict[str, Any]:
        """The ``SandboxMetric`` JSON object."""
        return {
            "timestamp": rfc3339(self.timestamp),
            "timestampUnix": int(self.timestamp),
            "cpuCount": self.cpu_count,
            "cpuUsedPct": self.cpu_used_pct,
            "memUsed": self.mem_used,
            "memTotal": self.mem_total,
            "memCache": self.mem_cache,
            "diskUsed": self.disk_used,
            "diskTotal": self.disk_total,
        }


@attrs.define
class _Series:
    samples: Deque[MetricSample] = attrs.field(factory=lambda: collections.deque(maxlen=HISTORY))
    last_cpu: Optional[int] = None
    last_time: Optional[float] = None
    sources_logged: bool = False


class MetricsHistory:
    """The recent samples of every sandbox, by sandbox id."""

    def __init__(self) -> None:
        self._series: Dict[str, _Series] = {}

    def due(self, sandbox_id: str, now: float) -> bool:
        """True when the sandbox has no sample from the last :data:`MIN_INTERVAL_SECONDS`."""
        series = self._series.get(sandbox_id)
        return series is None or not series.samples or now - series.samples[-1].timestamp >= (
            MIN_INTERVAL_SECONDS
        )

    def first_reading(self, sandbox_id: str) -> bool:
        """True once per sandbox: whether to log where its readings come from."""
        series = self._series.setdefault(sandbox_id, _Series())
        first = not series.sources_logged
        series.sources_logged = True
        return first

    def record(
        self,
        sandbox_id: str,
        usage: Any,
        *,
        now: float,
        started_at: float,
        cpu_count: int,
        memory_mb: int,
        disk_mb: int,
    ) -> MetricSample:
        """Turn a :class:`~e2b_provider.emulator.runtime.ResourceUsage` into a sample."""
        series = self._series.setdefault(sandbox_id, _Series())
        cpu_usec: Optional[int] = usage.cpu_usec
        pct = 0.0
        if cpu_usec is not None:
            if series.last_cpu is not None and series.last_time is not None and (
                cpu_usec >= series.last_cpu
            ):
                used, span = cpu_usec - series.last_cpu, now - series.last_time
            else:
                used, span = cpu_usec, now - started_at
            if span > 0:
                pct = min(100.0, max(0.0, used / 1e6 / span / max(1, cpu_count) * 100))
            series.last_cpu, series.last_time = cpu_usec, now
        sample = MetricSample(
            timestamp=now,
            cpu_count=cpu_count,
            cpu_used_pct=round(pct, 2),
            mem_used=int(usage.mem_used or 0),
            mem_total=int(usage.mem_limit or memory_mb * MIB),
            mem_cache=int(usage.mem_cache or 0),
            disk_used=int(usage.disk_used or 0),
            disk_total=disk_mb * MIB,
        )
        series.samples.append(sample)
        return sample

    def samples(
        self, sandbox_id: str, start: Optional[float] = None, end: Optional[float] = None
    ) -> List[MetricSample]:
        """The kept samples with ``start <= timestamp <= end`` (whole seconds), oldest first."""
        series = self._series.get(sandbox_id)
        if series is None:
            return []
        lo = float("-inf") if start is None else start
        hi = float("inf") if end is None else end
        return [s for s in series.samples if lo <= int(s.timestamp) <= hi]

    def latest(self, sandbox_id: str) -> Optional[MetricSample]:
        """The newest sample of a sandbox, if any."""
        series = self._series.get(sandbox_id)
        return series.samples[-1] if series is not None and series.samples else None

    def forget(self, sandbox_id: str) -> None:
        """Drop a killed sandbox's samples."""
        self._series.pop(sandbox_id, None)
