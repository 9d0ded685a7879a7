"""Queue benchmark: how truthful the start estimates of queued orders are, against Slurm's.

    uv run python bench/queue.py                      # the shipped synthetic loads
    uv run python bench/queue.py --trace t.jsonl      # replay a recorded trace
    uv run python bench/queue.py --write-trace t.jsonl --load 1.1 --seed 3

Replays a trace on the shipped fleet through production's queue (`slices.topology.queue.schedule`:
FIFO with EASY backfill per GPU model and region, the allocator's placement) and production's
estimator (`slices.topology.estimate.estimate_starts`). Every request is ordered with "排队":
it starts at once when the discipline lets it, else it waits (up to --max-wait) and gets its first
estimate when it joins the queue. The estimator knows what production knows: leases' known ends
(automatic release), queued requests' limits, the rental durations measured so far in the replay
(the prior, hosts ≈ 2 h and slices ≈ 8 h, until 20 have ended), and each lease's elapsed time.

Printed for the queued requests, and for the queued slices alone: `P90 honoured` (real start no
later than the first P90), `P50 within 5 min` (real start within 300 s of the first P50), the mean
absolute error of the P50, a calibration table (share of real starts at or before each predicted
quantile) and the mean P90 − P50 width, beside the Slurm-style baseline in the same run
(`squeue --start`: every rental runs to the largest duration seen, every queued request to its
limit or that duration). On the synthetic loads, on the same requests: the ORACLE (production's
estimator given the exact law the open-ended durations are drawn from, not each rental's own
duration: what any estimator could reach), the clairvoyant plan (every realised duration known:
the plan's own error), and the figures of the requests whose start known ends alone fix. Then
the estimator's cost per event (CPU time) with 1,000 queued orders on a 100,352-GPU fleet.

Trace format (JSONL): the allocator benchmark's (`t`, `id`, `gpus`, `gpu_model`, `duration`,
optional `region`) and an optional `limit` (seconds): a known end (automatic release) after which
it is released; its `duration` is then no longer than the limit.
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
from dataclasses import dataclass, replace
from pathlib import Path

# The checkout on the path and the script's own folder off it (bench/queue.py would shadow
# the standard library's queue for everything imported after).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p).resolve() != _HERE)]

from bench.allocator import latency_fleet, synthetic_trace  # noqa: E402
from slices.fleetfile import SHIPPED_FLEET, load_fleet_file  # noqa: E402
from slices.topology import SLICE_UNIT_GPUS, Fleet, FleetSpec, Placement, Request  # noqa: E402
from slices.topology.estimate import (  # noqa: E402
    LEVELS,
    DurationModel,
    LogNormal,
    estimate_starts,
    futures,
    limits_estimate,
    replay_starts,
)
from slices.topology.queue import Waiting, queue_key, schedule  # noqa: E402

FIVE_MIN = 300.0


@dataclass(frozen=True)
class Item:
    t: float
    id: str
    gpus: int
    gpu_model: str
    duration: float
    region: str | None = None
    limit: float | None = None


def read_trace(path: Path) -> list[Item]:
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            limit = float(d["limit"]) if d.get("limit") is not None else None
            duration = float(d["duration"])
            out.append(
                Item(
                    float(d["t"]),
                    str(d["id"]),
                    int(d["gpus"]),
                    str(d["gpu_model"]),
                    min(duration, limit) if limit else duration,
                    d.get("region"),
                    limit,
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}:{n}: bad trace line: {exc}") from None
    return sorted(out, key=lambda r: (r.t, r.id))


def synthetic(spec: FleetSpec, load: float, count: int, seed: int, known: float) -> list[Item]:
    """The allocator benchmark's synthetic trace; a share ``known`` of the requests set an
    automatic release (their limit, a whole number of hours) and run until it."""
    rng = random.Random(f"limits:{seed}")
    out = []
    for r in synthetic_trace(spec, load, count, seed):
        limit = None
        duration = r.duration
        if rng.random() < known:
            limit = math.ceil(r.duration / 3600) * 3600.0
            duration = limit
        out.append(Item(r.t, r.id, r.gpus, r.gpu_model, duration, r.region, limit))
    return out


def write_trace(items: list[Item], path: Path) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for r in items:
            d: dict = {"t": r.t, "id": r.id, "gpus": r.gpus, "gpu_model": r.gpu_model}
            d["duration"] = r.duration
            if r.region:
                d["region"] = r.region
            if r.limit is not None:
                d["limit"] = r.limit
            fh.write(json.dumps(d) + "\n")


class Replay:
    """Arrivals and departures; every request queues; estimates at the moment it queues."""

    def __init__(
        self,
        spec: FleetSpec,
        max_wait: float,
        samples: int,
        seed: int,
        oracle: DurationModel | None = None,
        clairvoyant: bool = False,
    ) -> None:
        self.fleet = Fleet(spec)
        self.oracle = oracle
        self.clairvoyant = clairvoyant
        self.max_wait = max_wait
        self.samples = samples
        self.seed = seed
        self.started: dict[str, float] = {}
        self.ends: list[tuple[float, str]] = []
        self.queues: dict[tuple[str, str], list[Waiting]] = defaultdict(list)
        self.items: dict[str, Item] = {}
        self.hosts: list[float] = []  # measured durations (rentals that ended)
        self.slices: list[float] = []
        # id -> what each estimator said when it queued: "ours", "slurm" (the baseline),
        # "oracle", "clairvoyant" (StartEstimate or a time), "since", "known_only"
        self.first: dict[str, dict] = {}
        self.real: dict[str, float] = {}
        self.expired = 0
        self.at_once = 0
        self.estimate_ms: list[float] = []

    def durations(self, now: float) -> DurationModel:
        """Ended rentals, and the running ones as censored (they have run at least this long):
        the open-ended ones (no automatic release), the rentals whose end is not known."""
        rh: list[float] = []
        rs: list[float] = []
        for lid, since in self.started.items():
            item = self.items[lid]
            if item.limit is None:
                (rs if item.gpus >= SLICE_UNIT_GPUS else rh).append(now - since)
        return DurationModel(self.hosts, self.slices, rh, rs)

    def _start(self, _fleet: Fleet, w: Waiting, now: float) -> Placement | None:
        item = self.items[w.id]
        got = self.fleet.plan(Request(w.id, w.gpus, w.gpu_model, w.region, now, _end(item, now)))
        if not isinstance(got, Placement):
            return None
        self.fleet.commit(got)
        self.started[w.id] = now
        heapq.heappush(self.ends, (now + item.duration, w.id))
        return got

    def _pass(self, key: tuple[str, str], now: float) -> list[str]:
        done = schedule(self.fleet, self.queues[key], now, start=self._start)
        self.expired += len(done.expired)
        self.queues[key] = done.kept
        return [w.id for w, _p in done.started]

    def run(self, trace: list[Item]) -> None:
        i = 0
        while i < len(trace) or self.ends:
            t_arr = trace[i].t if i < len(trace) else math.inf
            t_dep = self.ends[0][0] if self.ends else math.inf
            if t_dep <= t_arr:
                now, lid = heapq.heappop(self.ends)
                p = self.fleet.release(lid)
                run = now - self.started.pop(lid)
                if self.items[lid].limit is None:  # a measured open-ended rental
                    (self.slices if p.is_slice else self.hosts).append(run)
                for key in [k for k in self.queues if k[0] == p.gpu_model]:
                    for sid in self._pass(key, now):
                        self.real[sid] = now
                continue
            item = trace[i]
            i += 1
            now = item.t
            if self.fleet.validate(Request(item.id, item.gpus, item.gpu_model, item.region)):
                continue  # can never fit this fleet
            self.items[item.id] = item
            key = queue_key(item.gpu_model, item.region)
            w = Waiting(
                item.id, item.gpus, item.gpu_model, item.region, now, item.limit,
                now + self.max_wait,
            )  # fmt: skip
            self.queues[key].append(w)
            started = self._pass(key, now)
            for sid in started:
                self.real[sid] = now
            if item.id in started:
                self.at_once += 1
                continue
            self._estimate(key, item.id, now)
        for q in self.queues.values():
            self.expired += len(q)

    def _estimate(self, key: tuple[str, str], new: str, now: float) -> None:
        queue = self.queues[key]
        model = self.durations(now)
        c0 = time.perf_counter()
        est = estimate_starts(
            self.fleet, queue, now, model, started=self.started, samples=self.samples,
            seed=self.seed,
        )  # fmt: skip
        self.estimate_ms.append((time.perf_counter() - c0) * 1000)
        longest = max(model.hosts.longest, model.slices.longest)
        base = limits_estimate(self.fleet, queue, now, longest, started=self.started)
        got: dict = {"ours": est[new], "slurm": base[new], "since": now}
        # Fixed by known ends alone: the same start whether every open-ended rental (and queued
        # run without a limit) ends at once or never.
        never = limits_estimate(self.fleet, queue, now, 1e12, started=self.started)[new]
        at_once = limits_estimate(self.fleet, queue, now, 0.0, started=self.started)[new]
        got["known_only"] = never is not None and at_once is not None and never - at_once <= 61
        if self.oracle is not None:
            got["oracle"] = estimate_starts(
                self.fleet, queue, now, self.oracle, started=self.started,
                samples=self.samples, seed=self.seed,
            )[new]  # fmt: skip
        if self.clairvoyant:
            got["clairvoyant"] = self._clairvoyant(queue, new, now)
        self.first[new] = got

    def _clairvoyant(self, queue: list[Waiting], new: str, now: float) -> float | None:
        """The plan with every realised duration known (no estimator has them; the discipline
        still backfills on what production knows): what is left is the plan's own error
        (SU-level placement, later arrivals)."""
        ends = {lid: since + self.items[lid].duration for lid, since in self.started.items()}
        runs = [self.items[w.id].duration for w in queue]
        return replay_starts(self.fleet, queue, now, ends, runs, started=self.started)[new]


def _end(item: Item, now: float) -> float | None:
    return now + item.limit if item.limit is not None else None


def _figures(pairs: list[tuple[float | None, float | None, float]]) -> dict:
    """(P50, P90, real start) of each scored request: the headline figures."""
    n = len(pairs)
    p90 = sum(1 for _p50, p90, real in pairs if p90 is not None and real <= p90 + 1)
    p50 = sum(1 for p50, _p90, real in pairs if p50 is not None and abs(real - p50) <= FIVE_MIN)
    err = [abs(real - p50) for p50, _p90, real in pairs if p50 is not None]
    width = [p90 - p50 for p50, p90, _real in pairs if p50 is not None and p90 is not None]
    return {
        "p90_honoured": round(p90 / n, 4) if n else None,
        "p50_within_5min": round(p50 / n, 4) if n else None,
        "mae_s": round(statistics.fmean(err), 1) if err else None,
        "width_p90_p50_s": round(statistics.fmean(width), 1) if width else None,
    }


def _calibration(rows: list[tuple[dict, float, Item]], who: str) -> dict:
    n = len(rows)
    calib = {}
    for j, q in enumerate(LEVELS):
        hit = sum(
            1
            for f, real, _ in rows
            if f[who].quantiles
            and f[who].quantiles[j] is not None
            and real <= f[who].quantiles[j] + 1
        )
        calib[f"q{int(q * 100)}"] = round(hit / n, 3)
    return calib


def score(rep: Replay, slices_only: bool) -> dict:
    rows = [
        (rep.first[i], rep.real[i], rep.items[i])
        for i in rep.first
        if i in rep.real and (not slices_only or rep.items[i].gpus >= SLICE_UNIT_GPUS)
    ]
    n = len(rows)
    if not n:
        return {"queued": 0}

    def est(who: str, subset: list[tuple[dict, float, Item]]) -> dict:
        return _figures([(f[who].p50, f[who].p90, real) for f, real, _ in subset])

    def point(who: str, subset: list[tuple[dict, float, Item]]) -> dict:
        out = _figures([(f[who], f[who], real) for f, real, _ in subset])
        out.pop("width_p90_p50_s")
        return out

    known = [r for r in rows if r[0]["known_only"]]
    out = {
        "queued": n,
        "wait_mean_s": round(statistics.fmean(real - f["since"] for f, real, _ in rows), 1),
        "ours": est("ours", rows) | {"calibration": _calibration(rows, "ours")},
        "slurm_limits": point("slurm", rows),
        "known_ends_only": {
            "queued": len(known),
            "ours": est("ours", known) if known else None,
            "slurm_limits": point("slurm", known) if known else None,
        },
    }
    if "oracle" in rows[0][0]:
        out["oracle"] = est("oracle", rows) | {"calibration": _calibration(rows, "oracle")}
    if "clairvoyant" in rows[0][0]:
        out["clairvoyant"] = point("clairvoyant", rows)
    return out


def cost_check(queued: int, samples: int, seed: int, limited: float = 0.0) -> dict:
    """The estimator's cost per event: one re-estimate of a queue of ``queued`` orders on a
    100,352-GPU fleet at about 90 % use (elapsed times spread, a third with known ends); a share
    ``limited`` of the queued orders with a limit (1–24 h)."""
    rng = random.Random(seed)
    spec = latency_fleet(49, "c")
    fleet = Fleet(spec)
    now = 10 * 86400.0
    started: dict[str, float] = {}
    sizes = [1, 2, 4, 8, 64, 64, 128, 256]
    n = 0
    misses = 0
    while fleet.free_gpus() > 0.10 * spec.gpu_count and misses < 50:
        n += 1
        size = rng.choice(sizes)
        ends = now + rng.uniform(600, 86400) if rng.random() < 0.33 else None
        got = fleet.allocate(Request(f"r{n}", size, "H800", None, now, ends))
        if isinstance(got, Placement):
            started[got.request_id] = now - rng.uniform(0, 3 * 86400)
        else:
            misses += 1
    queue = [
        Waiting(f"q{k}", rng.choice(sizes), "H800", None, now, None, None) for k in range(queued)
    ]
    lrng = random.Random(f"limits:{seed}")
    queue = [
        replace(w, limit=3600.0 * lrng.randint(1, 24)) if lrng.random() < limited else w
        for w in queue
    ]
    history = DurationModel(
        [rng.lognormvariate(math.log(7200) - 0.32, 0.8) for _ in range(2000)],
        [rng.lognormvariate(math.log(28800) - 0.32, 0.8) for _ in range(2000)],
    )
    # CPU time of this thread: the figure is the estimator's work, not the machine's other load.
    times = []
    for _ in range(5):
        c0 = time.thread_time()
        estimate_starts(fleet, queue, now, history, started=started, samples=samples, seed=seed)
        times.append((time.thread_time() - c0) * 1000)
    base = []
    for _ in range(5):
        b0 = time.thread_time()
        limits_estimate(fleet, queue, now, 3 * 86400.0, started=started)
        base.append((time.thread_time() - b0) * 1000)
    base_ms = statistics.median(base)
    return {
        "cost_check": f"{spec.gpu_count} GPUs, {queued} queued"
        + (f" ({limited:.0%} with a limit)" if limited else ""),
        "leases": len(fleet.leases),
        "samples": samples,
        "futures": futures(samples, len(fleet.leases), queued),
        "estimate_cpu_ms_median": round(statistics.median(times), 1),
        "estimate_cpu_ms_max": round(max(times), 1),
        "slurm_limits_cpu_ms": round(base_ms, 1),
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f} %"


def _min(v: float | None) -> str:
    return "-" if v is None else f"{v / 60:.0f} min"


def summary(r: dict) -> str:
    """One readable line per scored run: ours, the baseline, the bounds."""
    o, b, k = r["ours"], r["slurm_limits"], r["known_ends_only"]
    line = (
        f"{r['trace']:<38} {r['which']:<10} n={r['queued']:<4} "
        f"P90 honoured: {_pct(o['p90_honoured'])} (slurm {_pct(b['p90_honoured'])})  "
        f"P50 within 5 min: {_pct(o['p50_within_5min'])} (slurm {_pct(b['p50_within_5min'])})  "
        f"MAE {_min(o['mae_s'])} (slurm {_min(b['mae_s'])})  "
        f"mean P90-P50 width {_min(o['width_p90_p50_s'])}  calibration {o['calibration']}"
    )
    if "oracle" in r:
        a = r["oracle"]
        line += (
            f"\n{'':<49}ORACLE (knows the duration law): P90 honoured {_pct(a['p90_honoured'])}  "
            f"P50 within 5 min {_pct(a['p50_within_5min'])}  MAE {_min(a['mae_s'])}  "
            f"width {_min(a['width_p90_p50_s'])}  calibration {a['calibration']}"
        )
    if "clairvoyant" in r:
        c = r["clairvoyant"]
        line += (
            f"\n{'':<49}clairvoyant plan (knows every realised duration): "
            f"P50 within 5 min {_pct(c['p50_within_5min'])}  MAE {_min(c['mae_s'])}"
        )
    if k["queued"]:
        line += (
            f"\n{'':<49}start fixed by known ends (n={k['queued']}): "
            f"P90 honoured {_pct(k['ours']['p90_honoured'])} "
            f"(slurm {_pct(k['slurm_limits']['p90_honoured'])})  "
            f"P50 within 5 min {_pct(k['ours']['p50_within_5min'])} "
            f"(slurm {_pct(k['slurm_limits']['p50_within_5min'])})  "
            f"MAE {_min(k['ours']['mae_s'])}"
        )
    return line


def synthetic_law() -> DurationModel:
    """The law the synthetic loads draw open-ended rentals from (`bench.allocator`'s
    `synthetic_trace`: log-normal, σ 0.8, hosts mean 2 h, slices 8 h, within 5 min .. 7 days)."""
    return DurationModel.known(
        LogNormal(2 * 3600.0, 0.8, 300.0, 7 * 86400.0),
        LogNormal(8 * 3600.0, 0.8, 300.0, 7 * 86400.0),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fleet", type=Path, default=SHIPPED_FLEET)
    ap.add_argument("--trace", type=Path, help="JSONL trace to replay (default: synthetic)")
    ap.add_argument("--load", type=float, action="append", help="synthetic offered load(s)")
    ap.add_argument("--known", type=float, action="append",
                    help="synthetic: share of requests with an automatic release (default 0.3, 0.6)")  # fmt: skip
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--samples", type=int, default=8, help="futures per estimate")
    ap.add_argument("--max-wait", type=float, default=24 * 3600.0, help="seconds (default 24 h)")
    ap.add_argument("--write-trace", type=Path)
    ap.add_argument("--queued", type=int, default=1000, help="cost check: queued orders")
    ap.add_argument("--no-cost-check", action="store_true")
    ap.add_argument(
        "--no-oracle", action="store_true", help="skip the oracle and clairvoyant bounds"
    )
    args = ap.parse_args(argv)
    spec = load_fleet_file(args.fleet)
    loads = args.load or [0.9, 1.1]
    knowns = args.known or [0.3, 0.6]
    if args.write_trace:
        write_trace(
            synthetic(spec, loads[0], args.requests, args.seed, knowns[0]), args.write_trace
        )
        print(json.dumps({"wrote": str(args.write_trace)}))
        return 0
    runs: list[tuple[str, list[Item]]]
    if args.trace:
        runs = [(str(args.trace), read_trace(args.trace))]
    else:
        runs = [
            (f"synthetic load={load} known={known} seed={args.seed}",
             synthetic(spec, load, args.requests, args.seed, known))
            for load in loads
            for known in knowns
        ]  # fmt: skip
    table = []
    for name, trace in runs:
        # The oracle knows the law a synthetic trace is drawn from; a recorded trace has none.
        oracle = None if args.trace or args.no_oracle else synthetic_law()
        rep = Replay(spec, args.max_wait, args.samples, args.seed, oracle, not args.no_oracle)
        rep.run(trace)
        for slices_only in (False, True):
            out: dict = {"trace": name, "which": "slices" if slices_only else "all queued"}
            out |= score(rep, slices_only)
            out["started_at_once"] = rep.at_once
            out["expired"] = rep.expired
            out["estimate_ms_p50"] = (
                round(statistics.median(rep.estimate_ms), 2) if rep.estimate_ms else 0
            )
            print(json.dumps(out, ensure_ascii=False), flush=True)
            table.append(out)
    for r in table:
        if not r.get("queued"):
            continue
        print(summary(r), file=sys.stderr)
    if not args.no_cost_check:
        checks = [(samples, 0.0) for samples in sorted({8, 16, args.samples})] + [(8, 1 / 3)]
        for samples, limited in checks:
            cost = cost_check(args.queued, samples, args.seed, limited)
            print(json.dumps(cost), flush=True)
            print(
                f"cost per event, {cost['cost_check']}, {cost['leases']} leases, "
                f"{cost['futures']} futures (setting {samples}): "
                f"{cost['estimate_cpu_ms_median']} ms CPU (max {cost['estimate_cpu_ms_max']}; "
                f"slurm-style single replay {cost['slurm_limits_cpu_ms']} ms)",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
