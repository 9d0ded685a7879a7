"""1-minute rollups (min / mean / max per GPU) built from the 1 Hz stream, and the idle judgement
made from them. Pure: no Django (the service writes the records and acts on the verdict).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slices.telemetry.samples import GpuSample

METRICS = ("util", "mem_used", "temp", "power")


@dataclass
class _Stat:
    lo: float = math.inf
    hi: float = -math.inf
    total: float = 0.0
    n: int = 0

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.lo = min(self.lo, value)
        self.hi = max(self.hi, value)
        self.total += value
        self.n += 1

    def triple(self) -> tuple[float, float, float]:
        if not self.n:
            return (0.0, 0.0, 0.0)
        return (self.lo, round(self.total / self.n, 2), self.hi)


@dataclass
class _Minute:
    samples: int = 0
    stats: dict[str, _Stat] = field(default_factory=lambda: {m: _Stat() for m in METRICS})
    mem_total: float = 0.0
    xid: int = 0
    simulated: bool = False


@dataclass(frozen=True)
class RollupRecord:
    instance_id: str
    host: str
    gpu: int
    minute: int  # epoch seconds at the start of the minute (UTC)
    samples: int
    util: tuple[float, float, float]
    mem_used: tuple[float, float, float]
    temp: tuple[float, float, float]
    power: tuple[float, float, float]
    mem_total: float
    xid_events: int
    simulated: bool


class MinuteAccumulator:
    """Folds samples into per-GPU minute buckets; ``flush`` hands back the finished minutes."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str, int, int], _Minute] = {}

    def add(self, instance_id: str, host: str, gpu: GpuSample, ts: float, simulated: bool) -> None:
        if gpu.lost:
            return  # a lost GPU has no values; its loss is an event, not a statistic
        minute = int(ts // 60 * 60)
        key = (instance_id, host, gpu.index, minute)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Minute(simulated=simulated)
        bucket.samples += 1
        bucket.stats["util"].add(gpu.util_gpu)
        bucket.stats["mem_used"].add(gpu.mem_used_mib)
        bucket.stats["temp"].add(gpu.temp_c)
        bucket.stats["power"].add(gpu.power_w)
        if gpu.mem_total_mib is not None:
            bucket.mem_total = gpu.mem_total_mib
        bucket.xid += len(gpu.xid)

    def flush(self, now: float | None = None) -> list[RollupRecord]:
        """Minutes that ended before ``now`` (every minute when None), removed from the buffer."""
        current = None if now is None else int(now // 60 * 60)
        done = [k for k in self._buckets if current is None or k[3] < current]
        records = []
        for key in sorted(done, key=lambda k: (k[3], k[0], k[1], k[2])):
            b = self._buckets.pop(key)
            records.append(
                RollupRecord(
                    instance_id=key[0],
                    host=key[1],
                    gpu=key[2],
                    minute=key[3],
                    samples=b.samples,
                    util=b.stats["util"].triple(),
                    mem_used=b.stats["mem_used"].triple(),
                    temp=b.stats["temp"].triple(),
                    power=b.stats["power"].triple(),
                    mem_total=b.mem_total,
                    xid_events=b.xid,
                    simulated=b.simulated,
                )
            )
        return records

    def __len__(self) -> int:
        return len(self._buckets)


# ---------------------------------------------------------------------------------------------
# Idle
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MinuteOfGpu:
    """What the idle judgement reads of one rollup row."""

    host: str
    gpu: int
    minute: int
    util_max: float
    util_mean: float
    mem_used_max: float


@dataclass(frozen=True)
class IdleVerdict:
    idle: bool
    since: int | None  # epoch seconds of the first idle minute of the window
    evidence: dict[str, Any]


def judge_idle(
    rows: Iterable[MinuteOfGpu],
    *,
    gpus: Sequence[tuple[str, int]],
    now: float,
    threshold: float,
    window_minutes: int,
    min_coverage: float = 0.8,
) -> IdleVerdict:
    """Idle when every GPU's *peak* utilisation stayed below ``threshold`` in every sampled minute
    of the last ``window_minutes`` full minutes, and enough of the window was sampled.

    Based on the GPU samples only: a notebook that holds GPU memory but runs no kernels is idle
    (the evidence says how much memory it holds); one busy second in a minute keeps it busy, so a
    job with sparse bursts is never released. Missing minutes (a relay restart) do not count as
    idle: under ``min_coverage`` of the window sampled, the verdict is "not idle".
    """
    end = int(now // 60 * 60)  # the current, unfinished minute is not judged
    start = end - window_minutes * 60
    expected = {(h, g) for h, g in gpus}
    per_gpu: dict[tuple[str, int], list[MinuteOfGpu]] = {k: [] for k in expected}
    for row in rows:
        key = (row.host, row.gpu)
        if start <= row.minute < end and key in per_gpu:
            per_gpu[key].append(row)
    minutes_seen = {r.minute for rs in per_gpu.values() for r in rs}
    coverage = len(minutes_seen) / window_minutes if window_minutes else 0.0
    busiest: list[dict[str, Any]] = []
    idle = bool(expected) and coverage >= min_coverage
    for (host, gpu), rs in sorted(per_gpu.items()):
        if not rs:
            idle = False
            continue
        peak = max(r.util_max for r in rs)
        mean = sum(r.util_mean for r in rs) / len(rs)
        mem = max(r.mem_used_max for r in rs)
        busiest.append(
            {"host": host, "gpu": gpu, "peak": peak, "mean": round(mean, 1), "mem_mib": mem}
        )
        if peak >= threshold:
            idle = False
    busiest.sort(key=lambda b: (-b["peak"], b["host"], b["gpu"]))
    evidence = {
        "threshold": threshold,
        "window_minutes": window_minutes,
        "minutes_sampled": len(minutes_seen),
        "gpus": len(expected),
        "peak": busiest[0]["peak"] if busiest else None,
        "peak_gpu": f"{busiest[0]['host']}/{busiest[0]['gpu']}" if busiest else "",
        "mem_held_mib": round(sum(b["mem_mib"] for b in busiest), 1),
        "top": busiest[:8],
    }
    return IdleVerdict(idle=idle, since=start if idle else None, evidence=evidence)
