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

Events besides arrivals and departures, replayed with the code production runs for them:
  stop/start  --stop-rate of the hosts stop once, at a random point of their run, for an exponential
              --stop-hours (their GPUs go back); a start first takes `topology.aligned_block` of its
              own node, as `claim_on_node` does, else is placed anew with `Fleet.plan` in its region,
              else waits (retried when GPUs free, given up after --patience).
  failures    nodes fail at --failure-rate per node-hour (seeded; the same nodes and times for every
              policy) and return after --repair-hours (0: never). Every instance on a failed node
              migrates as production's `drive_migration` does: each failed part takes a replacement
              (ours: `Fleet.plan_replacement`; a baseline: its one-node order in the cluster), all
              or none; with none it waits (retried when GPUs free or a node returns) or, with
              --on-no-replacement release, is released. Time without GPUs does not count as run.
--failure-rate 0 --stop-rate 0 replays arrivals and departures only (the figures as before).
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
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

# The checkout on the path and the script's own folder off it (bench/queue.py would shadow
# the standard library's queue for everything imported after).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p).resolve() != _HERE)]

from bench.allocation.baselines import POLICIES, one_node_replacement  # noqa: E402
from bench.allocation.metrics import placeable_gpus, stranded_gpus  # noqa: E402
from slices.fleetfile import SHIPPED_FLEET, load_fleet_file  # noqa: E402
from slices.topology import (  # noqa: E402
    OURS,
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
    aligned_block,
    gpu_indexes,
    gpu_mask,
    structural_packing,
)
from slices.topology.queue import Waiting  # noqa: E402
from slices.topology.queue import schedule as schedule_queue  # noqa: E402


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


@dataclass(frozen=True)
class Events:
    """What happens to running instances besides their departure (all off by default)."""

    stop_rate: float = 0.0  # share of hosts that stop once mid-run
    stop_hours: float = 2.0  # mean time stopped (exponential)
    failure_rate: float = 0.0  # node failures per node-hour
    repair_hours: float = 24.0  # a failed node returns after this (0: never)
    on_no_replacement: str = "wait"  # or "release": production's NoReplacement choice
    seed: int = 1  # the stops and failures are the same for every policy


@dataclass
class Instance:
    """An accepted request from its first start to its departure."""

    item: TraceItem
    state: str = "running"  # running | stopped | migrating
    remaining: float = 0.0  # run time left while it does not run
    since: float = 0.0  # when it stopped running (a stop or a failure)
    home: int = -1  # stopped: the node (gid) it ran on
    broken: set[int] = field(default_factory=set)  # migrating: its failed nodes
    off: float = 0.0  # how long it stays stopped


# observer(kind, simulation, facts): "start" and "replace" just before the GPUs are taken,
# "event" after each event of the replay (tests check the invariants there)
Observer = Callable[[str, "Simulation", dict], None]


class Simulation:
    def __init__(
        self,
        spec: FleetSpec,
        policy_name: str,
        discipline: str,
        patience: float,
        strict: bool = False,
        events: Events | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.spec = spec
        self.strict = strict
        self.fleet = Fleet(spec)
        self.policy = POLICIES[policy_name]
        self.discipline = discipline
        self.patience = patience
        self.events = events or Events()
        self.observer = observer
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
        # running instances leave at ends[id]; a departure whose time differs is stale
        self.departures: list[tuple[float, str]] = []
        self.ends: dict[str, float] = {}
        self.live: dict[str, Instance] = {}
        self.agenda: list[tuple[float, int, str, str | int]] = []  # (t, seq, kind, id or gid)
        self._seq = 0
        self.pending_starts: dict[str, dict[str, float]] = defaultdict(dict)  # model: id: since
        self.waiting: dict[str, dict[str, float]] = defaultdict(dict)  # model: id: since
        self.starts: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.start_waits: list[float] = []
        self.migration_waits: list[float] = []
        self.lost_start_gpu_hours = 0.0
        self.lost_failure_gpu_hours = 0.0

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

    def _start(self, item: TraceItem, now: float) -> None:
        self.accepted += 1
        self.gpu_hours += item.gpus * item.duration / 3600
        self.waits[str(item.gpus)].append(now - item.t)
        end = now + item.duration
        heapq.heappush(self.departures, (end, item.id))
        self.ends[item.id] = end
        inst = self.live[item.id] = Instance(item)
        ev = self.events
        if ev.stop_rate and item.gpus < SLICE_UNIT_GPUS:
            rng = random.Random(f"stop:{ev.seed}:{item.id}")  # the same hosts for every policy
            if rng.random() < ev.stop_rate:
                inst.off = rng.expovariate(1 / (ev.stop_hours * 3600))
                self._at(now + rng.uniform(0.1, 0.9) * item.duration, "stop", item.id)

    def _at(self, t: float, kind: str, key: str | int) -> None:
        heapq.heappush(self.agenda, (t, self._seq, kind, key))
        self._seq += 1

    def _notify(self, kind: str, facts: dict) -> None:
        if self.observer is not None:
            self.observer(kind, self, facts)

    def _resume(self, inst: Instance, now: float) -> None:
        inst.state = "running"
        end = now + inst.remaining
        self.ends[inst.item.id] = end
        heapq.heappush(self.departures, (end, inst.item.id))

    # ---- stop / start ---------------------------------------------------------------------------

    def _stop(self, lid: str, now: float) -> set[str]:
        """关机: the GPUs go back; the instance starts again after its time off."""
        inst = self.live.get(lid)
        if inst is None or inst.state != "running":
            return set()  # it left, or it is migrating
        p = self.fleet.release(lid)
        inst.state = "stopped"
        inst.home = p.shares[0].node_id
        inst.remaining = self.ends.pop(lid) - now
        inst.since = now
        self.starts["stops"] += 1
        self._at(now + inst.off, "start", lid)
        return {p.gpu_model}

    def _try_start(self, inst: Instance, now: float) -> bool:
        """开机 as production's `start_instance` places it: `claim_on_node` (the buddy rule's
        aligned block of the instance's own node, when that node is in service), else a placement
        anew (`Fleet.plan`, the policy under test) in the instance's region. As production's
        `moved_from`, a start is on the same host when it ends up on its node (a baseline's own
        host rule can pick that node with GPUs the buddy rule would not)."""
        fleet = self.fleet
        item = inst.item
        home = inst.home
        cl = fleet.cluster_of(home)
        ends_at = now + inst.remaining
        block = (
            aligned_block(fleet.free_mask(home), cl.gpn, item.gpus) if fleet.node_ok[home] else None
        )
        if block is not None:
            node = home
            self._notify("start", self._start_facts(inst, node, block, "claim_on_node"))
            fleet.occupy(item.id, {fleet.hostnames[home]: gpu_indexes(block)}, ends_at)
        else:
            req = Request(item.id, item.gpus, item.gpu_model, cl.region, now, ends_at)
            got = fleet.plan(req, self.policy)
            if not isinstance(got, Placement):
                return False
            [share] = got.shares
            node = share.node_id
            self._notify("start", self._start_facts(inst, node, gpu_mask(share.gpus), "plan"))
            fleet.commit(got)
            if node == home:
                self.starts["same_host_replanned"] += 1
        self.starts["same_host" if node == home else "moved"] += 1
        self._resume(inst, now)
        return True

    @staticmethod
    def _start_facts(inst: Instance, node: int, mask: int, path: str) -> dict:
        return {"id": inst.item.id, "home": inst.home, "node": node, "mask": mask, "path": path}

    def _start_again(self, lid: str, now: float) -> set[str]:
        inst = self.live[lid]
        if not self._try_start(inst, now):
            self.starts["waited"] += 1  # retried whenever GPUs of its model free
            self.pending_starts[inst.item.gpu_model][lid] = now
        return set()

    # ---- node failures ----------------------------------------------------------------------------

    def _schedule_failures(self, trace: list[TraceItem]) -> None:
        """Poisson node failures over the arrivals' span, uniform over the fleet's nodes."""
        ev = self.events
        if not ev.failure_rate or not trace:
            return
        rng = random.Random(f"failures:{ev.seed}")
        nodes = len(self.fleet.hostnames)
        rate = ev.failure_rate * nodes / 3600  # per second
        t = rng.expovariate(rate)
        while t <= trace[-1].t:
            self._at(t, "fail", rng.randrange(nodes))
            t += rng.expovariate(rate)

    def _fail(self, gid: int, now: float) -> set[str]:
        """The node leaves the pool; every instance on it migrates (`fail_node`)."""
        fleet = self.fleet
        if not fleet.node_ok[gid]:
            return set()  # out of service already
        fleet.set_schedulable(fleet.hostnames[gid], False)
        self.failures["nodes_failed"] += 1
        if self.events.repair_hours > 0:
            self._at(now + self.events.repair_hours * 3600, "repair", gid)
        freed: set[str] = set()
        for lid in sorted(fleet.node_leases[gid]):
            inst = self.live[lid]
            model = inst.item.gpu_model
            if inst.state == "migrating":
                inst.broken.add(gid)  # waiting already: its next try replaces this part too
                continue
            inst.state = "migrating"
            inst.broken = {gid}
            inst.remaining = self.ends.pop(lid) - now
            inst.since = now
            self.failures["instances_hit"] += 1
            if self._migrate(inst, now):
                self.failures["replaced_at_once"] += 1
            elif self.events.on_no_replacement == "release":
                self.failures["released_no_replacement"] += 1
                self.lost_failure_gpu_hours += inst.item.gpus * inst.remaining / 3600
                fleet.release(lid)
                del self.live[lid]
                freed.add(model)
            else:
                self.failures["waited"] += 1
                self.waiting[model][lid] = now
        return freed

    def _repair(self, gid: int, now: float) -> set[str]:
        self.fleet.set_schedulable(self.fleet.hostnames[gid], True)
        self.failures["node_repairs"] += 1
        return {self.fleet.cluster_of(gid).model}

    def _replacement(
        self, inst: Instance, failed: int, gpus: int, whole: bool, near: list[str], now: float
    ) -> tuple[int, int] | None:
        """(gid, GPU mask) for the part of `failed`: ours is production's
        `Fleet.plan_replacement`; a baseline places a one-node order in the cluster."""
        fleet = self.fleet
        if self.policy is OURS:
            got = fleet.plan_replacement(fleet.hostnames[failed], gpus, whole=whole, near=near)
            if not isinstance(got, Placement):
                return None
            [share] = got.shares
            return share.node_id, gpu_mask(share.gpus)
        cl = fleet.cluster_of(failed)
        item = inst.item
        req = Request(
            f"{item.id}~{failed}",
            cl.gpn if whole else gpus,
            item.gpu_model,
            cl.region,
            now,
            now + inst.remaining,
        )
        return one_node_replacement(self.policy, fleet, failed, gpus, whole=whole, req=req)

    def _migrate(self, inst: Instance, now: float) -> str:
        """Production's `drive_migration`: every failed part takes a replacement in the cluster
        (a part whose node returned meanwhile keeps its cards), all or none. "replaced",
        "repaired" (no part needed a new node) or "" (none: nothing taken)."""
        fleet = self.fleet
        lid = inst.item.id
        p = fleet.leases[lid].placement
        whole = p.is_slice
        moved: dict[int, tuple[int, int]] = {}  # failed gid -> (gid, mask)
        facts: list[dict] = []
        taken: list[str] = []
        for s in p.shares:
            if s.node_id not in inst.broken or fleet.node_ok[s.node_id]:
                continue  # healthy, or returned meanwhile: it still holds the part's cards
            near = [
                x.hostname
                for x in p.shares
                if x.node_id not in inst.broken and fleet.node_ok[x.node_id]
            ]
            cl = fleet.cluster_of(s.node_id)
            su = fleet.node_su[s.node_id]
            su_had_free = bool(cl.su_free[su])  # before this part takes anything
            got = self._replacement(inst, s.node_id, len(s.gpus), whole, near, now)
            if got is None:
                break
            gid, mask = got
            self._notify(
                "replace",
                {"id": lid, "failed": s.node_id, "node": gid, "mask": mask, "whole": whole,
                 "near": near},
            )  # fmt: skip
            tmp = f"{lid}~{s.node_id}"
            fleet.occupy(tmp, {fleet.hostnames[gid]: gpu_indexes(mask)})
            taken.append(tmp)
            moved[s.node_id] = (gid, mask)
            near_sus = {fleet.node_su[fleet.gid_by_hostname[h]] for h in near}
            facts.append({"su": su, "new_su": fleet.node_su[gid], "had_free": su_had_free,
                          "near_sus": near_sus})  # fmt: skip
        else:
            for tmp in taken:
                fleet.release(tmp)
            shares: dict[str, tuple[int, ...]] = {}
            for s in p.shares:
                if s.node_id in moved:
                    gid, mask = moved[s.node_id]
                    shares[fleet.hostnames[gid]] = gpu_indexes(mask)
                else:
                    shares[s.hostname] = s.gpus
            fleet.release(lid)  # the failed nodes' GPUs leave it (the nodes stay out of service)
            fleet.occupy(lid, shares, now + inst.remaining)
            for f in facts:
                if not whole:
                    self.failures["host_parts"] += 1
                elif f["new_su"] == f["su"]:
                    self.failures["slice_parts_same_su"] += 1
                elif f["new_su"] in f["near_sus"]:
                    self.failures["slice_parts_slice_su"] += 1
                else:
                    self.failures["slice_parts_other_su"] += 1
                if whole and f["had_free"] and f["new_su"] != f["su"]:
                    self.failures["slice_parts_same_su_missed"] += 1
            inst.broken = set()
            self._resume(inst, now)
            return "replaced" if moved else "repaired"
        for tmp in taken:  # no replacement for some part: keep none of the others
            fleet.release(tmp)
        return ""

    def _retry(self, model: str, now: float) -> None:
        """GPUs of `model` freed or a node returned: waiting migrations first (the reconciler),
        then waiting starts (their owners try again)."""
        waiting = self.waiting.get(model)
        if waiting:
            for lid, since in list(waiting.items()):
                outcome = self._migrate(self.live[lid], now)
                if outcome:
                    del waiting[lid]
                    self.failures[
                        "replaced_after_wait"
                        if outcome == "replaced"
                        else "resumed_on_repaired_node"
                    ] += 1
                    self.migration_waits.append(now - since)
        pending = self.pending_starts.get(model)
        if pending:
            for lid, since in list(pending.items()):
                inst = self.live[lid]
                if now - since > self.patience:
                    del pending[lid]  # its owner gave up: released while stopped
                    del self.live[lid]
                    self.starts["gave_up"] += 1
                    self.lost_start_gpu_hours += inst.item.gpus * inst.remaining / 3600
                elif self._try_start(inst, now):
                    del pending[lid]
                    self.start_waits.append(now - since)

    def _event(self, kind: str, key: str | int, now: float) -> set[str]:
        """One stop, start, failure or repair; the GPU models whose free GPUs grew."""
        if kind == "stop":
            return self._stop(str(key), now)
        if kind == "start":
            return self._start_again(str(key), now)
        if kind == "fail":
            return self._fail(int(key), now)
        return self._repair(int(key), now)

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
        departures = self.departures
        queues: dict[str, list[TraceItem]] = defaultdict(list)
        self._schedule_failures(trace)
        i = 0
        next_sample = 0.0
        now = 0.0
        while i < len(trace) or departures or self.agenda or any(queues.values()):
            while departures and self.ends.get(departures[0][1]) != departures[0][0]:
                heapq.heappop(departures)  # stale: the instance stopped or lost a node
            t_arr = trace[i].t if i < len(trace) else math.inf
            t_dep = departures[0][0] if departures else math.inf
            t_evt = self.agenda[0][0] if self.agenda else math.inf
            if t_arr == math.inf and t_dep == math.inf and t_evt == math.inf:
                # only queued requests that can never start remain
                for q in queues.values():
                    self.rejected += len(q)
                    q.clear()
                break
            now = min(t_arr, t_dep, t_evt)
            while next_sample <= now and (i < len(trace) or departures):
                self.sample()
                next_sample += sample_every
            touched: set[str] = set()
            if t_dep <= t_arr and t_dep <= t_evt:
                _, lid = heapq.heappop(departures)
                del self.ends[lid]
                del self.live[lid]
                p = self.fleet.release(lid)
                touched.add(p.gpu_model)
            elif t_evt <= t_arr:
                _, _, kind, key = heapq.heappop(self.agenda)
                touched = self._event(kind, key, now)
            else:
                item = trace[i]
                i += 1
                if self.discipline == "loss":
                    if self._try(item, now):
                        self._start(item, now)
                    else:
                        self.rejected += 1
                elif self.fleet.validate(Request(item.id, item.gpus, item.gpu_model, item.region)):
                    self.rejected += 1  # can never fit this fleet
                else:
                    queues[item.gpu_model].append(item)
                    touched.add(item.gpu_model)
            for model in sorted(touched):
                self._retry(model, now)
                if self.discipline != "loss":
                    self._schedule(queues[model], now)
            self._notify("event", {"now": now})
        self.starts["still_waiting_at_end"] += sum(len(p) for p in self.pending_starts.values())
        self.failures["still_waiting_at_end"] += sum(len(w) for w in self.waiting.values())
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
        } | self._event_figures()

    def _event_figures(self) -> dict:
        """The stops/starts and failures of the replay (only those that were on)."""
        out: dict = {}
        if self.events.stop_rate:
            st = self.starts
            placed = st["same_host"] + st["moved"]
            out["starts"] = {
                "stops": st["stops"],
                "same_host": st["same_host"],
                "same_host_replanned": st["same_host_replanned"],
                "moved": st["moved"],
                "same_host_share": round(st["same_host"] / placed, 4) if placed else 0.0,
                "waited": st["waited"],
                "gave_up": st["gave_up"],
                "still_waiting_at_end": st["still_waiting_at_end"],
                "wait_mean_s": round(statistics.fmean(self.start_waits), 1)
                if self.start_waits
                else 0.0,
                "wait_p95_s": round(pct(self.start_waits, 0.95), 1),
                "lost_gpu_hours": round(self.lost_start_gpu_hours, 1),
            }
        if self.events.failure_rate:
            f = self.failures
            out["failures"] = {
                "replacement": "plan_replacement" if self.policy is OURS else "one-node order",
                "nodes_failed": f["nodes_failed"],
                "node_repairs": f["node_repairs"],
                "instances_hit": f["instances_hit"],
                "replaced_at_once": f["replaced_at_once"],
                "waited": f["waited"],
                "replaced_after_wait": f["replaced_after_wait"],
                "resumed_on_repaired_node": f["resumed_on_repaired_node"],
                "released_no_replacement": f["released_no_replacement"],
                "still_waiting_at_end": f["still_waiting_at_end"],
                "slice_parts": {
                    "same_su": f["slice_parts_same_su"],
                    "slice_su": f["slice_parts_slice_su"],
                    "other_su": f["slice_parts_other_su"],
                    "same_su_missed": f["slice_parts_same_su_missed"],
                },
                "host_parts": f["host_parts"],
                "wait_mean_s": round(statistics.fmean(self.migration_waits), 1)
                if self.migration_waits
                else 0.0,
                "wait_p95_s": round(pct(self.migration_waits, 0.95), 1),
                "lost_gpu_hours": round(self.lost_failure_gpu_hours, 1),
            }
        return out

    def _schedule(self, queue: list[TraceItem], now: float) -> None:
        """FIFO with EASY backfill over one GPU model's queue: production's discipline
        (`slices.topology.queue.schedule`); the trace's durations are the requests' limits."""
        by_id = {item.id: item for item in queue}
        waiting = [
            Waiting(i.id, i.gpus, i.gpu_model, i.region, i.t, i.duration, i.t + self.patience)
            for i in queue
        ]

        def start(_fleet: Fleet, w: Waiting, now: float) -> Placement | None:
            item = by_id[w.id]
            if not self._try(item, now):
                return None
            self._start(item, now)
            return self.fleet.leases[item.id].placement

        done = schedule_queue(
            self.fleet, waiting, now, start=start, strict=self.strict, blind_backfill=True
        )
        self.rejected += len(done.expired)  # gave up waiting
        queue[:] = [by_id[w.id] for w in done.kept]


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
    for key in ("starts", "failures"):
        if key in results[0]:
            out[key] = _merge_counts([r[key] for r in results])
    return out


def _merge_counts(parts: list[dict]) -> dict:
    """Event figures over seeds: counts summed, shares and times averaged."""
    out: dict = {}
    for key, first in parts[0].items():
        values = [p[key] for p in parts]
        if isinstance(first, dict):
            out[key] = _merge_counts(values)
        elif isinstance(first, str):
            out[key] = first
        elif isinstance(first, int):
            out[key] = sum(values)
        else:
            out[key] = round(statistics.fmean(values), 4)
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
    if any("starts" in r or "failures" in r for r in rows):
        print(
            f"\n{'trace':<28} {'topology':<9} {'discipline':<13} {'policy':<12} "
            f"{'stops':>5} {'same':>5} {'moved':>5} {'wait':>5} {'gaveup':>6} | "
            f"{'fails':>5} {'hit':>4} {'sameSU':>6} {'sliceSU':>7} {'other':>5} {'missed':>6} "
            f"{'host':>4} {'waited':>6} {'releas':>6} {'wait s':>7}",
            file=sys.stderr,
        )
        for r in rows:
            st = r.get("starts") or {}
            f = r.get("failures") or {}
            sp = f.get("slice_parts") or {}
            print(
                f"{r['trace'][:28]:<28} {r['topology']:<9} {r['discipline']:<13} "
                f"{r['policy']:<12} {st.get('stops', 0):>5} {st.get('same_host', 0):>5} "
                f"{st.get('moved', 0):>5} {st.get('waited', 0):>5} {st.get('gave_up', 0):>6} | "
                f"{f.get('nodes_failed', 0):>5} {f.get('instances_hit', 0):>4} "
                f"{sp.get('same_su', 0):>6} {sp.get('slice_su', 0):>7} {sp.get('other_su', 0):>5} "
                f"{sp.get('same_su_missed', 0):>6} {f.get('host_parts', 0):>4} "
                f"{f.get('waited', 0):>6} {f.get('released_no_replacement', 0):>6} "
                f"{f.get('wait_mean_s', 0.0):>7.0f}",
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
    ap.add_argument(
        "--stop-rate",
        type=float,
        default=0.2,
        help="share of hosts that stop once mid-run and start again (0: none)",
    )
    ap.add_argument("--stop-hours", type=float, default=2.0, help="mean time a host stays stopped")
    ap.add_argument(
        "--failure-rate",
        type=float,
        default=2e-4,
        help="node failures per node-hour (0: none); 2e-4 is about the rate reported for large "
        "H100 training fleets",
    )
    ap.add_argument(
        "--repair-hours", type=float, default=24.0, help="a failed node returns after (0: never)"
    )
    ap.add_argument(
        "--on-no-replacement",
        choices=["wait", "release"],
        default="wait",
        help="an instance whose failed node has no replacement waits for one or is released",
    )
    ap.add_argument("--no-latency-check", action="store_true")
    return ap.parse_args(argv)


def _events(args: argparse.Namespace, seed: int) -> Events:
    return Events(
        stop_rate=args.stop_rate,
        stop_hours=args.stop_hours,
        failure_rate=args.failure_rate,
        repair_hours=args.repair_hours,
        on_no_replacement=args.on_no_replacement,
        seed=seed,
    )


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
    trace_seeds = seeds  # each trace's stops and failures are drawn from its seed
    if args.trace:
        groups = [(str(args.trace), [read_trace(args.trace)])]
        trace_seeds = [args.seed]
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
                        Simulation(
                            spec, policy, discipline, args.patience, strict, _events(args, seed)
                        ).run(trace, args.sample_every)
                        for trace, seed in zip(traces, trace_seeds, strict=True)
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
