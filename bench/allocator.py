"""Allocator benchmark: replay a request trace against a fleet under every placement policy.

    uv run python bench/allocator.py                       # shipped fleet, synthetic loads 0.7/0.9/1.1
    uv run python bench/allocator.py --trace my.jsonl      # replay a recorded trace
    uv run python bench/allocator.py --write-trace t.jsonl --load 0.9 --seed 7   # write one

Trace format (JSONL, one request per line; `region` optional):
    {"t": <arrival seconds>, "id": "<str>", "gpus": <int>, "gpu_model": "<str>", "duration": <seconds>}

Queue disciplines: `fifo-backfill` (per GPU model FIFO; the head reserves the earliest time it fits,
later requests start now if they fit and end before that; a request waiting longer than --patience
leaves) and `loss` (a request that cannot start at once is rejected). One JSON object per policy and
discipline is printed, then the allocation-latency check on a 2,048-GPU cluster and a 100,000-GPU fleet.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.allocation.baselines import POLICIES  # noqa: E402
from bench.allocation.metrics import placeable_gpus, stranded_gpus  # noqa: E402
from slices.fleetfile import SHIPPED_FLEET, load_fleet_file  # noqa: E402
from slices.topology import (  # noqa: E402
    SLICE_UNIT_GPUS,
    ClusterSpec,
    Fleet,
    FleetSpec,
    GpuModelSpec,
    NodeSpec,
    Placement,
    RegionSpec,
    Request,
    ScalableUnitSpec,
    structural_packing,
)


@dataclass(frozen=True)
class TraceItem:
    t: float
    id: str
    gpus: int
    gpu_model: str
    duration: float
    region: str | None = None


def read_trace(path: Path) -> list[TraceItem]:
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            items.append(
                TraceItem(
                    float(d["t"]),
                    str(d["id"]),
                    int(d["gpus"]),
                    str(d["gpu_model"]),
                    float(d["duration"]),
                    d.get("region"),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}:{n}: bad trace line: {exc}") from None
    return sorted(items, key=lambda r: (r.t, r.id))


def synthetic_trace(spec: FleetSpec, load: float, count: int, seed: int) -> list[TraceItem]:
    """Poisson arrivals per GPU model sized by the fleet's demand mix; offered load `load` is the
    requested GPU-time over the model's GPU capacity. Durations log-normal (hosts ~2 h, slices ~8 h)."""
    rng = random.Random(seed)
    capacity: dict[str, int] = defaultdict(int)
    for c in spec.clusters:
        capacity[c.gpu_model] += c.gpu_count
    total_cap = sum(capacity.values())
    items: list[TraceItem] = []
    for model, cap in sorted(capacity.items()):
        mix = dict(spec.demand.get(model) or {64: 0.5, 128: 0.3, 256: 0.2})
        sizes = sorted(mix)
        weights = [mix[s] for s in sizes]

        def mean_duration(size: int) -> float:
            return 8 * 3600.0 if size >= SLICE_UNIT_GPUS else 2 * 3600.0

        mean_work = sum(w * s * mean_duration(s) for s, w in mix.items()) / sum(weights)
        rate = load * cap / mean_work  # arrivals per second
        n = max(1, round(count * cap / total_cap))
        t = 0.0
        for i in range(n):
            t += rng.expovariate(rate)
            size = rng.choices(sizes, weights)[0]
            sigma = 0.8
            mu = math.log(mean_duration(size)) - sigma * sigma / 2
            duration = max(300.0, min(rng.lognormvariate(mu, sigma), 7 * 86400.0))
            items.append(TraceItem(round(t, 1), f"{model}-{i}", size, model, round(duration)))
    return sorted(items, key=lambda r: (r.t, r.id))


def write_trace(items: Iterable[TraceItem], path: Path) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for r in items:
            d = {"t": r.t, "id": r.id, "gpus": r.gpus, "gpu_model": r.gpu_model}
            d["duration"] = r.duration
            if r.region:
                d["region"] = r.region
            fh.write(json.dumps(d) + "\n")


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(math.ceil(q * len(values))) - 1)]


def packing_bound(spec: FleetSpec) -> float:
    """Share of the slice clusters' GPUs that the demanded slice sizes could ever occupy, each slice
    on its structural minimum of SUs (per size, weighted by the demand mix)."""
    total_w = 0.0
    acc = 0.0
    for model in {c.gpu_model for c in spec.clusters if c.slices_allowed}:
        cls = [c for c in spec.clusters if c.slices_allowed and c.gpu_model == model]
        mix = {s: w for s, w in (spec.demand.get(model) or {64: 1.0}).items() if s >= 64}
        gpus = sum(c.gpu_count for c in cls)
        for size, w in mix.items():
            placed = sum(
                structural_packing([su.capacity for su in c.sus], size // 8, c.su_capacity) * 8
                for c in cls
            )
            acc += w * gpus * placed / gpus
            total_w += w * gpus
    return round(acc / total_w, 4) if total_w else 1.0


class Simulation:
    def __init__(
        self,
        spec: FleetSpec,
        policy_name: str,
        discipline: str,
        patience: float,
        strict: bool = False,
    ) -> None:
        self.spec = spec
        self.strict = strict
        self.fleet = Fleet(spec)
        self.policy = POLICIES[policy_name]
        self.discipline = discipline
        self.patience = patience
        self.latencies: list[float] = []  # wall clock, includes being preempted
        self.cpu_latencies: list[float] = []  # CPU time of the allocating thread
        self.slices: list[Placement] = []
        self.waits: dict[str, list[float]] = defaultdict(list)
        self.accepted = 0
        self.rejected = 0
        self.gpu_hours = 0.0
        self.frag_samples: list[float] = []
        self.stranded_samples: list[float] = []
        self.slice_models = {c.gpu_model for c in spec.clusters if c.slices_allowed}
        self.host_sizes = {
            m: sorted(s for s in (spec.demand.get(m) or {}) if s < SLICE_UNIT_GPUS)
            for m in {c.gpu_model for c in spec.clusters}
        }
        self.slice_sizes = {
            m: {s: w for s, w in (spec.demand.get(m) or {64: 1.0}).items() if s >= SLICE_UNIT_GPUS}
            for m in self.slice_models
        }

    def _try(self, item: TraceItem, now: float) -> bool:
        req = Request(item.id, item.gpus, item.gpu_model, item.region, now, now + item.duration)
        t0 = time.perf_counter_ns()
        c0 = time.thread_time_ns()
        got = self.fleet.plan(req, self.policy)
        if self.strict and isinstance(got, Placement) and not got.at_structural_minimum:
            return False  # strict topology: a slice only starts on ceil(n / SU size) SUs
        if isinstance(got, Placement):
            self.fleet.commit(got)
            self.latencies.append((time.perf_counter_ns() - t0) / 1000)
            self.cpu_latencies.append((time.thread_time_ns() - c0) / 1000)
            if got.is_slice:
                self.slices.append(got)
            return True
        return False

    def _start(self, item: TraceItem, now: float, departures: list) -> None:
        self.accepted += 1
        self.gpu_hours += item.gpus * item.duration / 3600
        self.waits[str(item.gpus)].append(now - item.t)
        heapq.heappush(departures, (now + item.duration, item.id))

    def sample(self) -> None:
        free_whole = 0
        placeable = 0.0
        for model in self.slice_models:
            sizes = self.slice_sizes[model]
            total_w = sum(sizes.values())
            for cl in self.fleet.by_model[model]:
                if cl.slices_ok:
                    free_whole += cl.free_nodes * cl.gpn
            for size, w in sizes.items():
                placeable += w / total_w * placeable_gpus(self.fleet, model, size)
        self.frag_samples.append(1 - placeable / free_whole if free_whole else 0.0)
        # Slice-stranded: free GPUs of slice clusters that the smallest demanded slice cannot use
        # at its structural SU minimum (hosts could still use some of them).
        stranded = 0
        for model in self.slice_models:
            smallest = min(self.slice_sizes[model]) // 8
            stranded += stranded_gpus(self.fleet, model, smallest, ())
        self.stranded_samples.append(stranded)

    def run(self, trace: list[TraceItem], sample_every: float) -> dict:
        departures: list[tuple[float, str]] = []
        queues: dict[str, list[TraceItem]] = defaultdict(list)
        i = 0
        next_sample = 0.0
        now = 0.0
        while i < len(trace) or departures or any(queues.values()):
            t_arr = trace[i].t if i < len(trace) else math.inf
            t_dep = departures[0][0] if departures else math.inf
            if t_arr == math.inf and t_dep == math.inf:
                # only queued requests that can never start remain
                for q in queues.values():
                    self.rejected += len(q)
                    q.clear()
                break
            now = min(t_arr, t_dep)
            while next_sample <= now and (i < len(trace) or departures):
                self.sample()
                next_sample += sample_every
            touched: set[str] = set()
            if t_dep <= t_arr:
                _, lid = heapq.heappop(departures)
                p = self.fleet.release(lid)
                touched.add(p.gpu_model)
            else:
                item = trace[i]
                i += 1
                if self.discipline == "loss":
                    if self._try(item, now):
                        self._start(item, now, departures)
                    else:
                        self.rejected += 1
                    continue
                if self.fleet.validate(Request(item.id, item.gpus, item.gpu_model, item.region)):
                    self.rejected += 1  # can never fit this fleet
                    continue
                queues[item.gpu_model].append(item)
                touched.add(item.gpu_model)
            if self.discipline != "loss":
                for model in touched:
                    self._schedule(queues[model], now, departures)
        return self.result()

    def result(self) -> dict:
        """The figures of the replay so far."""
        waits_by_class = {
            size: {
                "n": len(w),
                "mean_s": round(statistics.fmean(w), 1) if w else 0.0,
                "p95_s": round(pct(w, 0.95), 1),
                "p99_s": round(pct(w, 0.99), 1),
            }
            for size, w in sorted(self.waits.items(), key=lambda kv: int(kv[0]))
        }
        slices = self.slices
        all_waits = [w for ws in self.waits.values() for w in ws]
        total = self.accepted + self.rejected
        return {
            "policy": self.policy.name,
            "discipline": self.discipline,
            "topology": "strict" if self.strict else "state-min",
            "requests": total,
            "acceptance_ratio": round(self.accepted / total, 4) if total else 0.0,
            "accepted_gpu_hours": round(self.gpu_hours, 1),
            "slices": len(slices),
            "slices_at_structural_min": round(
                sum(p.su_count <= p.su_min_structural for p in slices) / len(slices), 4
            )
            if slices
            else 1.0,
            "slices_at_state_min": round(
                sum(p.su_count <= p.su_min_state for p in slices) / len(slices), 4
            )
            if slices
            else 1.0,
            "mean_sus_per_slice": round(statistics.fmean(p.su_count for p in slices), 3)
            if slices
            else 0.0,
            "fragmentation_mean": round(statistics.fmean(self.frag_samples), 4)
            if self.frag_samples
            else 0.0,
            "stranded_gpus_mean": round(statistics.fmean(self.stranded_samples), 1)
            if self.stranded_samples
            else 0.0,
            "wait_mean_s": round(statistics.fmean(all_waits), 1) if all_waits else 0.0,
            "wait_p95_s": round(pct(all_waits, 0.95), 1),
            "wait_by_size": waits_by_class,
            "alloc_latency_us": {
                "p50": round(pct(self.latencies, 0.5), 1),
                "p99": round(pct(self.latencies, 0.99), 1),
            },
            "alloc_cpu_us": {
                "p50": round(pct(self.cpu_latencies, 0.5), 1),
                "p99": round(pct(self.cpu_latencies, 0.99), 1),
            },
        }

    def _schedule(self, queue: list[TraceItem], now: float, departures: list) -> None:
        """FIFO with EASY backfill over one GPU model's queue."""
        shadow: float | None = None
        kept: list[TraceItem] = []
        scanned = 0
        for item in queue:
            if now - item.t > self.patience:
                self.rejected += 1  # gave up waiting
                continue
            scanned += 1
            if scanned > 200:  # bound the backfill scan; the rest keep their place
                kept.append(item)
                continue
            if shadow is None:
                if self._try(item, now):
                    self._start(item, now, departures)
                    continue
                req = Request(item.id, item.gpus, item.gpu_model, item.region, now)
                shadow = self.fleet.earliest_start(req, structural=self.strict) or math.inf
                kept.append(item)
                continue
            if now + item.duration <= shadow and self._try(item, now):
                self._start(item, now, departures)
                continue
            kept.append(item)
        queue[:] = kept


def latency_fleet(clusters: int, prefix: str) -> FleetSpec:
    specs = []
    for ci in range(clusters):
        sus = []
        sizes = [20] * 12 + [16]
        for si, size in enumerate(sizes, start=1):
            nodes = tuple(
                NodeSpec(f"{prefix}{ci}-s{si}-n{n}", f"10.{ci}.{si}.{n}") for n in range(size)
            )
            sus.append(ScalableUnitSpec(si, f"su{si:02d}", nodes))
        specs.append(
            ClusterSpec(f"{prefix}{ci}", f"{prefix}{ci}", "r", "H800", "ib-hdr", 8, tuple(sus))
        )
    demand = {"H800": {8: 2, 64: 4, 128: 3, 256: 2, 512: 1}}
    return FleetSpec((RegionSpec("r", "r"),), (GpuModelSpec("H800", 80),), tuple(specs), demand)


def latency_check(spec: FleetSpec, ops: int, seed: int) -> dict:
    """Allocation latency of the project's policy under churn at ~85 % utilisation."""
    rng = random.Random(seed)
    fleet = Fleet(spec)
    total = spec.gpu_count
    live: list[str] = []
    lat: list[float] = []
    cpu: list[float] = []
    used = 0
    sizes = [1, 2, 4, 8, 64, 64, 128, 256]
    n = 0
    while len(lat) < ops:
        n += 1
        if used > 0.85 * total and live:
            p = fleet.release(live.pop(rng.randrange(len(live))))
            used -= p.gpus
            continue
        size = rng.choice(sizes)
        req = Request(str(n), size, "H800", None, n, n + rng.randint(100, 100_000))
        t0 = time.perf_counter_ns()
        c0 = time.thread_time_ns()
        got = fleet.allocate(req)
        dt = (time.perf_counter_ns() - t0) / 1000
        dc = (time.thread_time_ns() - c0) / 1000
        if isinstance(got, Placement):
            lat.append(dt)
            cpu.append(dc)
            live.append(got.request_id)
            used += got.gpus
        elif live:
            p = fleet.release(live.pop(rng.randrange(len(live))))
            used -= p.gpus
    return {
        "latency_check": f"{total} GPUs",
        "gpus": total,
        "allocations": len(lat),
        "p50_us": round(pct(lat, 0.5), 1),
        "p99_us": round(pct(lat, 0.99), 1),
        "cpu_p50_us": round(pct(cpu, 0.5), 1),
        "cpu_p99_us": round(pct(cpu, 0.99), 1),
    }


_AVERAGED = (
    "acceptance_ratio",
    "accepted_gpu_hours",
    "slices_at_structural_min",
    "slices_at_state_min",
    "mean_sus_per_slice",
    "fragmentation_mean",
    "stranded_gpus_mean",
    "wait_mean_s",
    "wait_p95_s",
)


def _average(results: list[dict]) -> dict:
    """Mean of every scalar metric over seeds (latency: mean of the per-seed percentiles)."""
    out = {k: results[0][k] for k in ("policy", "discipline", "topology")}
    out["seeds"] = len(results)
    out["requests"] = sum(r["requests"] for r in results)
    for key in _AVERAGED:
        out[key] = round(statistics.fmean(r[key] for r in results), 4)
    sizes = sorted({s for r in results for s in r["wait_by_size"]}, key=int)
    out["wait_by_size"] = {
        size: {
            q: round(
                statistics.fmean(
                    r["wait_by_size"][size][q] for r in results if size in r["wait_by_size"]
                ),
                1,
            )
            for q in ("mean_s", "p95_s", "p99_s")
        }
        for size in sizes
    }
    for key in ("alloc_latency_us", "alloc_cpu_us"):
        out[key] = {
            q: round(statistics.fmean(r[key][q] for r in results), 1) for q in ("p50", "p99")
        }
    return out


def _paired(ours: list[dict], other: list[dict]) -> dict:
    """ours − this policy on the same traces: mean and standard error over seeds."""
    out = {}
    for key in ("acceptance_ratio", "accepted_gpu_hours", "wait_mean_s"):
        diffs = [a[key] - b[key] for a, b in zip(ours, other, strict=True)]
        se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
        out[key] = {"mean": round(statistics.fmean(diffs), 4), "se": round(se, 4)}
    return out


def _print_summary(rows: list[dict]) -> None:
    """A compact table on stderr for people; stdout stays one JSON object per line."""
    head = (
        f"{'trace':<28} {'topology':<9} {'discipline':<13} {'policy':<12} {'accept':>7} "
        f"{'GPU-h':>10} {'@state':>7} {'@ceil':>6} {'SUs':>5} {'frag':>6} {'strand':>7} "
        f"{'wait s':>7} {'p95 s':>8} {'p50 µs':>7} {'p99 µs':>7} {'cpu p99':>7}"
    )
    print(head, file=sys.stderr)
    for r in rows:
        print(
            f"{r['trace'][:28]:<28} {r['topology']:<9} {r['discipline']:<13} {r['policy']:<12} "
            f"{r['acceptance_ratio']:>7.4f} {r['accepted_gpu_hours']:>10.0f} "
            f"{r['slices_at_state_min']:>7.3f} {r['slices_at_structural_min']:>6.3f} "
            f"{r['mean_sus_per_slice']:>5.2f} {r['fragmentation_mean']:>6.3f} "
            f"{r['stranded_gpus_mean']:>7.1f} {r['wait_mean_s']:>7.0f} {r['wait_p95_s']:>8.0f} "
            f"{r['alloc_latency_us']['p50']:>7.1f} {r['alloc_latency_us']['p99']:>7.1f} "
            f"{r['alloc_cpu_us']['p99']:>7.1f}",
            file=sys.stderr,
        )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fleet", type=Path, default=SHIPPED_FLEET)
    ap.add_argument("--trace", type=Path, help="JSONL trace to replay (default: synthetic)")
    ap.add_argument("--load", type=float, action="append", help="synthetic offered load(s)")
    ap.add_argument("--requests", type=int, default=2000, help="synthetic requests per load")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="synthetic: repeat with seeds seed..seed+N-1 and print one averaged object per "
        "policy with the paired difference to ours (mean ± standard error)",
    )
    ap.add_argument("--write-trace", type=Path, help="write the synthetic trace and exit")
    ap.add_argument("--discipline", choices=["fifo-backfill", "loss", "both"], default="both")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument(
        "--topology",
        choices=["state-min", "strict", "both"],
        default="both",
        help="state-min: a slice may span the fewest SUs the free state allows; strict: a slice "
        "starts only on ceil(n / SU size) SUs (the empty-cluster optimum)",
    )
    ap.add_argument(
        "--patience", type=float, default=4 * 3600.0, help="FIFO: seconds before leaving"
    )
    ap.add_argument("--sample-every", type=float, default=600.0, help="metric sampling period (s)")
    ap.add_argument("--no-latency-check", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)

    spec = load_fleet_file(args.fleet)
    loads = args.load or [0.7, 0.9, 1.1]
    if args.write_trace:
        write_trace(synthetic_trace(spec, loads[0], args.requests, args.seed), args.write_trace)
        print(json.dumps({"wrote": str(args.write_trace), "load": loads[0], "seed": args.seed}))
        return 0
    disciplines = ["fifo-backfill", "loss"] if args.discipline == "both" else [args.discipline]
    bound = packing_bound(spec)
    modes = [False, True] if args.topology == "both" else [args.topology == "strict"]
    policies = args.policies.split(",")
    for name in policies:
        if name not in POLICIES:
            raise SystemExit(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    seeds = list(range(args.seed, args.seed + max(args.seeds, 1)))
    groups: list[tuple[str, list[list[TraceItem]]]]
    if args.trace:
        groups = [(str(args.trace), [read_trace(args.trace)])]
    else:
        groups = [
            (
                f"synthetic load={load} seed={seeds[0]}"
                + (f"..{seeds[-1]}" if len(seeds) > 1 else ""),
                [synthetic_trace(spec, load, args.requests, seed) for seed in seeds],
            )
            for load in loads
        ]
    summary = []
    for name, traces in groups:
        for strict in modes:
            for discipline in disciplines:
                per_policy: dict[str, list[dict]] = {}
                for policy in policies:
                    per_policy[policy] = [
                        Simulation(spec, policy, discipline, args.patience, strict).run(
                            trace, args.sample_every
                        )
                        for trace in traces
                    ]
                for policy in policies:
                    results = per_policy[policy]
                    out = {"trace": name, "fleet": args.fleet.name, "fleet_gpus": spec.gpu_count}
                    out.update(results[0] if len(results) == 1 else _average(results))
                    if len(results) > 1 and "ours" in per_policy and policy != "ours":
                        out["ours_minus_this"] = _paired(per_policy["ours"], results)
                    out["structural_packing_bound"] = bound
                    print(json.dumps(out, ensure_ascii=False), flush=True)
                    summary.append(out)
    _print_summary(summary)
    if not args.no_latency_check:
        print(json.dumps(latency_check(latency_fleet(1, "c"), 3000, args.seed)), flush=True)
        print(json.dumps(latency_check(latency_fleet(49, "c"), 3000, args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
