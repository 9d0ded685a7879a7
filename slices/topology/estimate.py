"""When a queued request will start, as a range (pure): the plan the allocator would make, run
forward over possible futures.

What is known is taken as known: a lease with a known end (an automatic release, the end of a paid
term) ends then; a queued request with a known limit runs that long. What is not known, how long an
on-demand rental still runs, is drawn from measured rental durations conditioned on how long it
has run already (`Survival`: the empirical distribution of D − e given D > e), never from worst
cases. Each of ``samples`` futures replays lease ends in time order and starts the queue in FIFO
order as capacity frees (a slice needs that many whole free nodes in one cluster, a host that many
free GPUs in one cluster); a request's P50 and P90 are the quantiles of its start over the futures.

`limits_estimate` is the Slurm-style baseline (`squeue --start`): one future in which every
rental runs to the largest duration seen and every queued request to its limit (or that largest
duration), so it only errs late.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slices.topology.buddy import buddy_tables
from slices.topology.fleet import Fleet
from slices.topology.queue import Waiting
from slices.topology.specs import SLICE_UNIT_GPUS

# Fewer measured rentals than this in a class (hosts, slices): the class borrows all of them.
MIN_CLASS_SAMPLES = 20
# Without any measurement: hosts about 2 h and slices about 8 h (log-normal, σ 0.8), the
# durations the synthetic loads assume, as 200 quantiles.
_PRIOR_POINTS = 200


def _lognormal_quantiles(mean: float, sigma: float, n: int) -> list[float]:
    mu = math.log(mean) - sigma * sigma / 2
    nd = _NormalQuantile()
    return [math.exp(mu + sigma * nd((i + 0.5) / n)) for i in range(n)]


class _NormalQuantile:
    """The standard normal's quantile function (Acklam's rational approximation, |ε| < 1.2e-9)."""

    a = (-39.6968302866538, 220.946098424521, -275.928510446969, 138.357751867269,
         -30.6647980661472, 2.50662827745924)  # fmt: skip
    b = (-54.4760987982241, 161.585836858041, -155.698979859887, 66.8013118877197,
         -13.2806815528857)  # fmt: skip
    c = (-0.00778489400243029, -0.322396458041136, -2.40075827716184, -2.54973253934373,
         4.37466414146497, 2.93816398269878)  # fmt: skip
    d = (0.00778469570904146, 0.32246712907004, 2.445134137143, 3.75440866190742)

    def __call__(self, p: float) -> float:
        a, b, c, d = self.a, self.b, self.c, self.d
        if p < 0.02425:
            q = math.sqrt(-2 * math.log(p))
            return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
                (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
            )
        if p > 1 - 0.02425:
            return -self(1 - p)
        q = p - 0.5
        r = q * q
        return (
            (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
            * q
            / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
        )


class Survival:
    """Rental durations (seconds) as a Kaplan–Meier survival curve: ``durations`` ended,
    ``censored`` still running after that long (counting them keeps the long rentals that have
    not ended yet from being forgotten). The remaining time of a rental that has run ``elapsed``
    seconds is drawn from D − elapsed given D > elapsed."""

    def __init__(self, durations: Sequence[float], censored: Sequence[float] = ()) -> None:
        ended = sorted(float(d) for d in durations if d > 0)
        running = sorted(float(d) for d in censored if d > 0)
        self.durations = ended
        self.count = len(ended)
        self.times: list[float] = []  # event times, ascending
        self.neg_s: list[float] = []  # −S(t) just after each event time (ascending for bisect)
        at_risk = len(ended) + len(running)
        s = 1.0
        i = j = 0
        while i < len(ended):
            t = ended[i]
            while j < len(running) and running[j] < t:
                j += 1
                at_risk -= 1  # censored before t: no longer at risk
            d = 0
            while i < len(ended) and ended[i] == t:
                d += 1
                i += 1
            s *= 1.0 - d / at_risk
            at_risk -= d
            self.times.append(t)
            self.neg_s.append(-s)
        self.last = max(ended[-1] if ended else 0.0, running[-1] if running else 0.0)

    def __len__(self) -> int:
        return self.count

    @property
    def longest(self) -> float:
        return self.last

    def _s(self, t: float) -> float:
        """S(t) = P(D > t)."""
        k = bisect.bisect_right(self.times, t)
        return 1.0 if k == 0 else -self.neg_s[k - 1]

    def remaining(self, elapsed: float, u: float) -> float:
        """The ``u``-quantile (0 ≤ u < 1) of the remaining time after ``elapsed`` seconds."""
        s_e = self._s(elapsed)
        if s_e > 0:
            target = s_e * (1.0 - u)
            k = bisect.bisect_left(self.neg_s, -target)  # first event time with S ≤ target
            k = max(k, bisect.bisect_right(self.times, elapsed))
            if k < len(self.times) and -self.neg_s[k] <= target:
                return self.times[k] - elapsed
        # Past what the measurements say: an exponential tail whose mean is half the time run
        # so far (it has shown it runs long), from the later of now and the last measurement.
        base = max(elapsed, self.times[-1] if self.times else 0.0)
        return base - elapsed - math.log(1.0 - u) * max(600.0, 0.5 * base)

    def table(self, elapsed: float = 0.0, n: int = 256) -> list[float]:
        """``n`` evenly spaced quantiles of the remaining time (drawing from it is O(1))."""
        return [self.remaining(elapsed, (i + 0.5) / n) for i in range(n)]

    def survival_at(self, elapsed: float, t: float) -> float:
        """P(D > elapsed + t | D > elapsed)."""
        s_e = self._s(elapsed)
        return self._s(elapsed + t) / s_e if s_e > 0 else 1.0


class DurationModel:
    """Rental durations by class: hosts (1–8 cards) and slices (64·k cards); a class with too
    few measurements borrows them all; none at all: the prior (hosts ≈ 2 h, slices ≈ 8 h)."""

    def __init__(
        self,
        hosts: Sequence[float],
        slices: Sequence[float],
        running_hosts: Sequence[float] = (),
        running_slices: Sequence[float] = (),
    ) -> None:
        every, running = list(hosts) + list(slices), list(running_hosts) + list(running_slices)
        self.prior = len(every) < MIN_CLASS_SAMPLES
        if self.prior:
            hosts = _lognormal_quantiles(2 * 3600.0, 0.8, _PRIOR_POINTS)
            slices = _lognormal_quantiles(8 * 3600.0, 0.8, _PRIOR_POINTS)
            every, running_hosts, running_slices, running = list(hosts) + list(slices), (), (), []
        if len(hosts) >= MIN_CLASS_SAMPLES:
            self.hosts = Survival(hosts, running_hosts)
        else:
            self.hosts = Survival(every, running)
        if len(slices) >= MIN_CLASS_SAMPLES:
            self.slices = Survival(slices, running_slices)
        else:
            self.slices = Survival(every, running)

    def of(self, gpus: int) -> Survival:
        return self.slices if gpus >= SLICE_UNIT_GPUS else self.hosts

    @property
    def measured(self) -> int:
        """How many ended rentals the curves are made of (0: the prior)."""
        return 0 if self.prior else max(len(self.hosts), len(self.slices))


# The quantiles an estimate carries (the calibration table reads them all; people see P50, P90).
LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9)


@dataclass(frozen=True)
class StartEstimate:
    """A queued request's start as a range (seconds on the caller's clock; None: not within the
    futures' horizon), its place in its queue (1 = next) and its start at each of `LEVELS`."""

    p50: float | None
    p90: float | None
    position: int
    quantiles: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class _Lease:
    cluster: int  # index into the model's clusters
    gpus: int  # GPUs it frees on schedulable nodes
    solo: int  # its schedulable nodes that hold no other lease: whole again when it ends
    shared: tuple[int, ...]  # its schedulable nodes shared with other leases (`_Pools.counts`)
    end: float | None  # known end
    elapsed: float
    size: int


class _Pools:
    """The model's clusters as the estimator counts them: free whole nodes and free GPUs."""

    def __init__(self, fleet: Fleet, model: str) -> None:
        self.clusters = list(fleet.by_model.get(model, ()))
        self.index = {cl.code: i for i, cl in enumerate(self.clusters)}
        self.whole = [cl.free_nodes for cl in self.clusters]
        self.free: list[int] = []
        self.node_leases: dict[int, int] = {}
        # nodes that several leases share: their index and how many leases each holds
        self.shared: dict[int, int] = {}
        self.counts: list[int] = []
        for cl in self.clusters:
            pop = buddy_tables(cl.gpn).pop
            total = 0
            for gid in cl.gids:
                if fleet.node_ok[gid]:
                    total += pop[fleet.node_mask[gid]]
                    if fleet.node_leases[gid]:
                        self.node_leases[gid] = len(fleet.node_leases[gid])
            self.free.append(total)


def _leases(fleet: Fleet, pools: _Pools, now: float, started: Mapping[str, float]) -> list[_Lease]:
    out = []
    for lid, lease in fleet.leases.items():
        p = lease.placement
        ci = pools.index.get(p.cluster)
        if ci is None:
            continue
        pop = buddy_tables(pools.clusters[ci].gpn).pop
        if lid.startswith("stray:"):
            continue  # GPUs no lease explains: they stay taken
        ok = [g for g in lease.masks if fleet.node_ok[g]]
        gpus = sum(pop[lease.masks[g]] for g in ok)
        solo = 0
        shared = []
        for g in ok:
            if pools.node_leases[g] == 1:
                solo += 1
            else:
                k = pools.shared.get(g)
                if k is None:
                    k = pools.shared[g] = len(pools.counts)
                    pools.counts.append(pools.node_leases[g])
                shared.append(k)
        elapsed = max(0.0, now - started.get(lid, now))
        out.append(_Lease(ci, gpus, solo, tuple(shared), p.ends_at, elapsed, p.gpus))
    return out


def _eligible(pools: _Pools, queue: Sequence[Waiting]) -> list[tuple[list[int], frozenset[int]]]:
    """Per request, the clusters it may start in (a list and a set: one per region and kind)."""
    memo: dict[tuple[str | None, bool], tuple[list[int], frozenset[int]]] = {}
    out = []
    for w in queue:
        key = (w.region, w.gpus >= SLICE_UNIT_GPUS)
        got = memo.get(key)
        if got is None:
            ids = [
                i
                for i, cl in enumerate(pools.clusters)
                if (w.region is None or cl.region == w.region) and (cl.slices_ok or not key[1])
            ]
            got = memo[key] = (ids, frozenset(ids))
        out.append(got)
    return out


def _replay(
    pools: _Pools,
    leases: list[_Lease],
    lease_ends: list[float],
    queue: Sequence[Waiting],
    eligible: list[tuple[list[int], frozenset[int]]],
    runs: list[float],
    now: float,
) -> list[float]:
    """One future: lease ends in time order, the queue started in FIFO order as it fits.
    The start time of each queued request (inf: never in this future).

    A head that did not fit anywhere is asked again only about the one cluster the next event
    changed (the others are as they were): a blocked queue costs O(1) per event, not one look
    at every cluster."""
    whole = list(pools.whole)
    free = list(pools.free)
    gpns = [cl.gpn for cl in pools.clusters]
    nl = list(pools.counts)
    events: list[tuple[float, int, int]] = [(t, 0, i) for i, t in enumerate(lease_ends)]
    heapq.heapify(events)
    held: dict[int, tuple[int, int, int]] = {}  # queued request index -> (cluster, gpus, whole)
    starts = [math.inf] * len(queue)
    head = 0
    total_whole = sum(whole)  # no cluster can have more than all of them: a quick "no"
    total_free = sum(free)
    checked = -1  # the head already found blocked in every cluster
    changed = -1  # the cluster the last event changed
    t = now
    while head < len(queue):
        # start the head, then the next, while they fit
        while head < len(queue):
            # Deadlines are not applied: a request that would leave at its maximum wait is
            # counted as waiting on (the estimate of those behind it errs late, not early).
            w = queue[head]
            clusters, where = eligible[head]
            if checked == head:
                clusters = [changed] if changed in where else []
            best = -1
            if w.gpus >= SLICE_UNIT_GPUS:
                n = w.gpus // 8  # a slice is whole 8-GPU nodes
                if total_whole < n:
                    clusters = []
                for ci in clusters:
                    if whole[ci] >= n and (best < 0 or whole[ci] < whole[best]):
                        best = ci
                if best < 0:
                    checked = head
                    break
                whole[best] -= n
                free[best] -= w.gpus
                total_whole -= n
                total_free -= w.gpus
                held[head] = (best, w.gpus, n)
            else:
                if total_free < w.gpus:
                    clusters = []
                for ci in clusters:
                    fits = free[ci] >= w.gpus and (w.gpus < gpns[ci] or whole[ci] >= 1)
                    if fits and (best < 0 or free[ci] < free[best]):
                        best = ci
                if best < 0:
                    checked = head
                    break
                gpn = gpns[best]
                free[best] -= w.gpus
                took = 1 if (w.gpus == gpn or free[best] < whole[best] * gpn) else 0
                whole[best] -= took
                total_whole -= took
                total_free -= w.gpus
                held[head] = (best, w.gpus, took)
            starts[head] = t
            heapq.heappush(events, (t + runs[head], 1, head))
            head += 1
        if head >= len(queue) or not events:
            break
        t, kind, i = heapq.heappop(events)
        if kind == 0:
            lease = leases[i]
            changed = lease.cluster
            free[changed] += lease.gpus
            whole[changed] += lease.solo
            total_free += lease.gpus
            total_whole += lease.solo
            for k in lease.shared:
                nl[k] -= 1
                if nl[k] == 0:
                    whole[changed] += 1
                    total_whole += 1
        else:
            changed, gpus, took = held.pop(i)
            free[changed] += gpus
            whole[changed] += took
            total_free += gpus
            total_whole += took
    return starts


def _quantile(values: list[float], q: float) -> float | None:
    v = sorted(values)
    x = v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]
    return None if math.isinf(x) else x


def estimate_starts(
    fleet: Fleet,
    queue: Sequence[Waiting],
    now: float,
    durations: DurationModel,
    *,
    started: Mapping[str, float] | None = None,
    samples: int = 8,
    seed: int = 0,
) -> dict[str, StartEstimate]:
    """P50/P90 of the start of each request of ``queue`` (one GPU model's FIFO order, oldest
    first) over ``samples`` futures; ``started``: each lease's start (its elapsed time conditions
    its remaining time; missing: it just started)."""
    if not queue:
        return {}
    model = queue[0].gpu_model
    pools = _Pools(fleet, model)
    leases = _leases(fleet, pools, now, started or {})
    eligible = _eligible(pools, queue)
    rng = random.Random(seed)
    per: list[list[float]] = [[] for _ in queue]
    known = [
        None if lease.end is None else max(lease.end, now + 1.0) for lease in leases
    ]  # an overdue automatic release happens about now
    survivals = [durations.of(lease.size) for lease in leases]
    # A queued request's run, when its limit is unknown: a whole rental, drawn from a table.
    whole_run = {"hosts": durations.hosts.table(), "slices": durations.slices.table()}
    tables = [
        [w.limit]
        if w.limit is not None
        else whole_run["slices" if w.gpus >= SLICE_UNIT_GPUS else "hosts"]
        for w in queue
    ]
    for _k in range(samples):
        ends = [
            kn if kn is not None else now + s.remaining(lease.elapsed, rng.random())
            for lease, kn, s in zip(leases, known, survivals, strict=True)
        ]
        runs = [tb[int(rng.random() * len(tb))] for tb in tables]
        for i, t in enumerate(_replay(pools, leases, ends, queue, eligible, runs, now)):
            per[i].append(t)
    return {
        w.id: StartEstimate(
            _quantile(per[i], 0.5),
            _quantile(per[i], 0.9),
            i + 1,
            tuple(_quantile(per[i], q) for q in LEVELS),
        )
        for i, w in enumerate(queue)
    }


def limits_estimate(
    fleet: Fleet,
    queue: Sequence[Waiting],
    now: float,
    longest: float,
    *,
    started: Mapping[str, float] | None = None,
) -> dict[str, float | None]:
    """The Slurm-style start of each queued request: every lease runs to its known end or to the
    ``longest`` duration seen, every queued request to its limit or that longest duration."""
    if not queue:
        return {}
    pools = _Pools(fleet, queue[0].gpu_model)
    leases = _leases(fleet, pools, now, started or {})
    ends = [
        max(lease.end, now + 1.0)
        if lease.end is not None
        else now + max(60.0, longest - lease.elapsed)
        for lease in leases
    ]
    runs = [w.limit if w.limit is not None else longest for w in queue]
    eligible = _eligible(pools, queue)
    starts = _replay(pools, leases, ends, queue, eligible, runs, now)
    return {w.id: (None if math.isinf(s) else s) for w, s in zip(queue, starts, strict=True)}
