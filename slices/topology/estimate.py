"""When a queued request will start, as a range (pure): the plan the allocator would make, run
forward over possible futures.

What is known is taken as known: a lease with a known end (an automatic release, the end of a paid
term) ends then; a queued request with a known limit runs that long. What is not known, how long an
on-demand rental still runs, is drawn from measured durations of open-ended rentals conditioned
on how long it has run already (`Survival`: the remaining time after e has P(D > e + t | D > e) =
S(e + t) / S(e)), never from worst cases. Each future (at least ``samples``, more while the replay
is small: `futures`) draws every occupant's end on its own and replays the ends in time order, so
a start that needs k occupants gone is the k-th of their ends (an order statistic); the queue
starts in FIFO order as capacity frees (a slice needs that many whole free nodes in one cluster, a
host that many free GPUs in one cluster), with the discipline's EASY backfill of requests with a
limit behind a waiting head. A request's P50 and P90 are the quantiles of its start over the
futures at the rank a new draw honours (`quantile`).

`limits_estimate` is the Slurm-style baseline (`squeue --start`): one future in which every
rental runs to the largest duration seen and every queued request to its limit (or that largest
duration). `LogNormal` is a known law (the queue benchmark's oracle) and `replay_starts` one given
future (its clairvoyant bound).
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from slices.topology.buddy import buddy_tables
from slices.topology.fleet import Fleet
from slices.topology.queue import SCAN_LIMIT, Waiting
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
        """The ``u``-quantile (0 ≤ u < 1) of the remaining time after ``elapsed`` seconds: the
        least t with P(D > elapsed + t | D > elapsed) = S(elapsed + t) / S(elapsed) ≤ 1 − u."""
        return self.sampler(elapsed)(u)

    def sampler(self, elapsed: float) -> Callable[[float], float]:
        """``remaining(elapsed, ·)`` with what depends on ``elapsed`` alone worked out once (a
        future draws each rental's remaining time with one bisection)."""
        k0 = bisect.bisect_right(self.times, elapsed)  # first event after ``elapsed``
        s_e = 1.0 if k0 == 0 else -self.neg_s[k0 - 1]
        times, neg_s = self.times, self.neg_s
        base = max(elapsed, times[-1] if times else 0.0)
        tail = max(600.0, 0.5 * base)

        def draw(u: float) -> float:
            if s_e > 0:
                target = s_e * (1.0 - u)
                k = bisect.bisect_left(neg_s, -target, k0)  # first event with S ≤ target
                if k < len(times):
                    return times[k] - elapsed
            # Past what the measurements say: an exponential tail whose mean is half the time
            # run so far (it has shown it runs long), from the later of now and the last
            # measurement.
            return base - elapsed - math.log(1.0 - u) * tail

        return draw

    def table(self, elapsed: float = 0.0, n: int = 256) -> list[float]:
        """``n`` evenly spaced quantiles of the remaining time (drawing from it is O(1))."""
        return [self.remaining(elapsed, (i + 0.5) / n) for i in range(n)]

    def survival_at(self, elapsed: float, t: float) -> float:
        """P(D > elapsed + t | D > elapsed)."""
        s_e = self._s(elapsed)
        return self._s(elapsed + t) / s_e if s_e > 0 else 1.0


class LogNormal:
    """A known duration law (the interface of `Survival`): log-normal with mean ``mean`` and
    shape ``sigma``, clipped to [``lo``, ``hi``] seconds, as the synthetic loads draw it. No
    measurement knows it; the queue benchmark's oracle does (what an ideal estimator, knowing
    the law but not each rental's own duration, could say)."""

    def __init__(self, mean: float, sigma: float, lo: float = 0.0, hi: float = math.inf) -> None:
        self.mu = math.log(mean) - sigma * sigma / 2
        self.sigma = sigma
        self.lo = lo
        self.hi = hi
        self._nq = _NormalQuantile()

    def __len__(self) -> int:
        return 0  # measured from nothing

    @property
    def longest(self) -> float:
        return self.hi if not math.isinf(self.hi) else math.exp(self.mu + 4 * self.sigma)

    def _s(self, t: float) -> float:
        """S(t) = P(D > t)."""
        if t < self.lo:
            return 1.0
        if t >= self.hi:
            return 0.0
        if t <= 0:
            return 1.0
        z = (math.log(t) - self.mu) / self.sigma
        return 0.5 * math.erfc(z / math.sqrt(2.0))

    def survival_at(self, elapsed: float, t: float) -> float:
        """P(D > elapsed + t | D > elapsed)."""
        s_e = self._s(elapsed)
        return self._s(elapsed + t) / s_e if s_e > 0 else 0.0

    def remaining(self, elapsed: float, u: float) -> float:
        return self.sampler(elapsed)(u)

    def sampler(self, elapsed: float) -> Callable[[float], float]:
        s_e = self._s(elapsed)
        s_lo = self._s(self.lo)

        def draw(u: float) -> float:
            if s_e <= 0:
                return 0.0  # past the longest it can run: it ends now
            target = s_e * (1.0 - u)
            if elapsed < self.lo and s_lo <= target:
                return self.lo - elapsed  # the clipped mass at ``lo``
            p = min(max(1.0 - target, 1e-12), 1.0 - 1e-12)
            t = math.exp(self.mu + self.sigma * self._nq(p))
            return max(0.0, min(t, self.hi) - elapsed)

        return draw

    def table(self, elapsed: float = 0.0, n: int = 256) -> list[float]:
        draw = self.sampler(elapsed)
        return [draw((i + 0.5) / n) for i in range(n)]


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

    @classmethod
    def known(cls, hosts: Survival | LogNormal, slices: Survival | LogNormal) -> DurationModel:
        """A model of given curves (the benchmark's oracle: the law the trace is drawn from)."""
        out = cls.__new__(cls)
        out.prior = False
        out.hosts, out.slices = hosts, slices  # type: ignore[assignment]
        return out

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


class _Lease(NamedTuple):
    cluster: int  # index into the model's clusters
    gpus: int  # GPUs it frees on schedulable nodes
    solo: int  # its schedulable nodes that hold no other lease: whole again when it ends
    shared: tuple[int, ...]  # its schedulable nodes shared with other leases (`_Pools.counts`)
    end: float | None  # known end
    elapsed: float
    size: int
    lid: str


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
        node_ok, node_mask, node_leases = fleet.node_ok, fleet.node_mask, fleet.node_leases
        held = self.node_leases
        for cl in self.clusters:
            pop = buddy_tables(cl.gpn).pop
            total = 0
            for gid in cl.gids:
                if node_ok[gid]:
                    total += pop[node_mask[gid]]
                    on = node_leases[gid]
                    if on:
                        held[gid] = len(on)
            self.free.append(total)


def _leases(fleet: Fleet, pools: _Pools, now: float, started: Mapping[str, float]) -> list[_Lease]:
    out = []
    node_ok, node_leases = fleet.node_ok, pools.node_leases
    shared_at, counts = pools.shared, pools.counts
    pops = [buddy_tables(cl.gpn).pop for cl in pools.clusters]
    index = pools.index
    for lid, lease in fleet.leases.items():
        p = lease.placement
        ci = index.get(p.cluster)
        if ci is None or lid.startswith("stray:"):
            continue  # another model's; or GPUs no lease explains: they stay taken
        pop = pops[ci]
        gpus = solo = 0
        shared = []
        for g, mask in lease.masks.items():
            if not node_ok[g]:
                continue
            gpus += pop[mask]
            if node_leases[g] == 1:
                solo += 1
            else:
                k = shared_at.get(g)
                if k is None:
                    k = shared_at[g] = len(counts)
                    counts.append(node_leases[g])
                shared.append(k)
        since = started.get(lid)
        elapsed = 0.0 if since is None or since > now else now - since
        out.append(_Lease(ci, gpus, solo, tuple(shared), p.ends_at, elapsed, p.gpus, lid))
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


def _fit(
    gpus: int, clusters: Sequence[int], whole: list[int], free: list[int], gpns: list[int]
) -> int:
    """The cluster a request of ``gpus`` takes now (the fullest it fits in), or −1."""
    best = -1
    if gpus >= SLICE_UNIT_GPUS:
        n = gpus // 8  # a slice is whole 8-GPU nodes
        for ci in clusters:
            if whole[ci] >= n and (best < 0 or whole[ci] < whole[best]):
                best = ci
    else:
        for ci in clusters:
            fits = free[ci] >= gpus and (gpus < gpns[ci] or whole[ci] >= 1)
            if fits and (best < 0 or free[ci] < free[best]):
                best = ci
    return best


def _replay(
    pools: _Pools,
    leases: list[_Lease],
    lease_ends: list[float],
    queue: Sequence[Waiting],
    eligible: list[tuple[list[int], frozenset[int]]],
    runs: list[float],
    now: float,
    deadlines: bool = True,
    backfill: bool = True,
) -> list[float]:
    """One future: lease ends in time order, the queue started in FIFO order as it fits, with
    the discipline's EASY backfill (``backfill``): while the head waits, a request behind it
    with a limit starts when it fits and its limit ends by the head's shadow, the earliest time
    the known ends (leases' known ends, started requests' limits) let the head start; none
    while that shadow is unknown. The start time of each queued request (inf: never in this
    future; NaN: it left the queue at its maximum wait first, unless ``deadlines`` is off: then
    it waits on).

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
    done = bytearray(len(queue))  # started (or left) out of FIFO order
    limited = [j for j, w in enumerate(queue) if w.limit is not None] if backfill else []
    seen = [-1] * len(queue) if limited else []  # the head behind which each was looked at
    limit_ends: dict[int, float] = {}  # started requests with a limit -> their known end
    edge_head, edge = -1, math.inf  # the last shadow computed, and for which head
    head = 0
    total_whole = sum(whole)  # no cluster can have more than all of them: a quick "no"
    total_free = sum(free)
    checked = -1  # the head already found blocked in every cluster
    changed = -1  # the cluster the last event changed
    t = now

    def take(j: int, ci: int) -> None:
        nonlocal total_whole, total_free
        gpus = queue[j].gpus
        if gpus >= SLICE_UNIT_GPUS:
            took = gpus // 8
            free[ci] -= gpus
        else:
            free[ci] -= gpus
            took = 1 if (gpus == gpns[ci] or free[ci] < whole[ci] * gpns[ci]) else 0
        whole[ci] -= took
        total_whole -= took
        total_free -= gpus
        held[j] = (ci, gpus, took)
        starts[j] = t
        heapq.heappush(events, (t + runs[j], 1, j))
        if queue[j].limit is not None:
            limit_ends[j] = t + runs[j]

    # the leases' known ends in time order (what the discipline knows of them)
    known_ends = sorted(
        (lease_ends[i], i) for i, lease in enumerate(leases) if lease.end is not None
    )
    known_at = [te for te, _i in known_ends]

    def shadow() -> float:
        """The earliest time the known ends alone let the head start (inf: they never do)."""
        w = queue[head]
        where = eligible[head][1]
        wh, fr = list(whole), list(free)
        cnt: dict[int, int] = {}
        runs_known = sorted((te, j) for j, te in limit_ends.items())
        pending = heapq.merge(
            ((te, 0, i) for te, i in known_ends[bisect.bisect_right(known_at, t) :]),
            ((te, 1, j) for te, j in runs_known),
        )
        for te, kind, i in pending:
            if kind == 0:
                lease = leases[i]
                ci = lease.cluster
                fr[ci] += lease.gpus
                wh[ci] += lease.solo
                for k in lease.shared:
                    left = cnt.get(k, nl[k]) - 1
                    cnt[k] = left
                    if left == 0:
                        wh[ci] += 1
            else:
                ci, gpus, took = held[i]
                fr[ci] += gpus
                wh[ci] += took
            if ci in where and _fit(w.gpus, (ci,), wh, fr, gpns) >= 0:
                return te
        return math.inf

    while head < len(queue):
        # start the head, then the next, while they fit
        while head < len(queue):
            if done[head]:
                head += 1
                continue
            w = queue[head]
            if deadlines and w.deadline is not None and t > w.deadline:
                # Still waiting past its maximum wait in this future: it leaves the queue, as
                # admission would make it (those behind it move up); no start (NaN).
                starts[head] = math.nan
                head += 1
                continue
            clusters, where = eligible[head]
            if checked == head:
                clusters = [changed] if changed in where else []
            if w.gpus >= SLICE_UNIT_GPUS:
                if total_whole < w.gpus // 8:
                    clusters = []
            elif total_free < w.gpus:
                clusters = []
            best = _fit(w.gpus, clusters, whole, free, gpns)
            if best < 0:
                checked = head
                break
            take(head, best)
            head += 1
        if head >= len(queue):
            break
        if limited and total_free > 0:
            # EASY backfill behind the blocked head (as `slices.topology.queue.schedule`)
            memo: dict[tuple[int, int, int], int] = {}
            for j in limited[bisect.bisect_right(limited, head) :]:
                if j - head > SCAN_LIMIT:
                    break
                if done[j]:
                    continue
                wj = queue[j]
                if deadlines and wj.deadline is not None and t > wj.deadline:
                    starts[j] = math.nan
                    done[j] = 1
                    continue
                if total_free < wj.gpus:
                    continue
                # Looked at already behind this head: since then only the last event's
                # cluster gained capacity (and a refusal for its shadow stands: the shadow
                # only comes earlier, the time later).
                if seen[j] == head:
                    if changed not in eligible[j][1] or free[changed] < wj.gpus:
                        continue
                    key = (wj.gpus, changed, id(eligible[j][0]))
                    look: Sequence[int] = (changed,)
                else:
                    seen[j] = head
                    key = (wj.gpus, -1, id(eligible[j][0]))
                    look = eligible[j][0]
                # requests of one size and region ask the same question of the same state
                best = memo.get(key, -2)
                if best == -2:
                    best = memo[key] = _fit(wj.gpus, look, whole, free, gpns)
                if best < 0:
                    continue
                # The shadow only comes earlier while the head waits: a request that ends
                # after the last one computed for this head ends after the current one too.
                if edge_head == head and t + runs[j] > edge:
                    continue
                edge_head, edge = head, shadow()
                if math.isinf(edge) or t + runs[j] > edge:
                    continue
                take(j, best)
                done[j] = 1
                memo.clear()
        if not events:
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
            limit_ends.pop(i, None)
            free[changed] += gpus
            whole[changed] += took
            total_free += gpus
            total_whole += took
    return starts


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile of a start from futures drawn alike (NaN, a future in which it left
    at its maximum wait, is left out: the range is that of its start, should it start): the
    order statistic at rank h = q·(n + 1), interpolated between neighbours (Hyndman–Fan type 6).
    A real start drawn like the futures falls at or below the k-th smallest of n with
    probability k / (n + 1), so this rank makes P(real ≤ estimate) = q; the plain ⌈q·n⌉-th is
    honoured ⌈q·n⌉ / (n + 1) of the time (the 8th of 8 futures: 89 %, short of a P90). A rank
    past the largest extends the last gap (8 futures: P90 = the largest + 0.1 × the last gap);
    one before the least takes the least (a start is never before now). None: not within the
    futures' horizon, or no future in which it starts."""
    return quantiles(values, (q,))[0]


def quantiles(values: Sequence[float], levels: Sequence[float]) -> tuple[float | None, ...]:
    """`quantile` at each of ``levels`` (one sort)."""
    v = sorted(x for x in values if not math.isnan(x))
    n = len(v)
    out: list[float | None] = []
    for q in levels:
        if not n:
            out.append(None)
            continue
        h = q * (n + 1)
        if h <= 1:
            x = v[0]
        elif h >= n:
            x = v[-1]
            if n >= 2 and h > n and x != v[-2]:
                x += (h - n) * (x - v[-2])
        else:
            k = int(h)
            lo, hi = v[k - 1], v[k]
            x = lo if lo == hi else lo + (h - k) * (hi - lo)
        out.append(None if math.isinf(x) or math.isnan(x) else x)
    return tuple(out)


# Futures per estimate: at least ``samples`` (the setting), and more while the replay is small,
# within this many replayed events (leases + queued requests, per future) and at most
# `MAX_SAMPLES`: a short queue on a small fleet gets a finer range at no noticeable cost, and
# 1,000 queued on a 100,000-GPU fleet stays within its time.
EVENT_BUDGET = 20_000
MAX_SAMPLES = 64
# The futures replay the EASY backfill while leases + queued requests are at most this many
# (the shipped fleet's queues; a region of thousands of nodes with hundreds queued); past it
# they replay FIFO alone (each order behind the head errs late, not early): measured, 1,000
# queued on a 100,000-GPU fleet, a third with limits, cost 200 ms per event with it, 48 without.
BACKFILL_EVENTS = 1_000


def futures(samples: int, leases: int, queued: int) -> int:
    """How many futures an estimate replays (see `EVENT_BUDGET`)."""
    return max(samples, min(MAX_SAMPLES, EVENT_BUDGET // max(1, leases + queued)))


def estimate_starts(
    fleet: Fleet,
    queue: Sequence[Waiting],
    now: float,
    durations: DurationModel,
    *,
    started: Mapping[str, float] | None = None,
    samples: int = 8,
    seed: int = 0,
    adaptive: bool = True,
    deadlines: bool = False,
) -> dict[str, StartEstimate]:
    """P50/P90 of the start of each request of ``queue`` (one GPU model's FIFO order, oldest
    first) over at least ``samples`` futures (more while the replay is small, see `futures`;
    ``adaptive=False``: exactly ``samples``); ``started``: each lease's start (its elapsed time
    conditions its remaining time; missing: it just started).

    ``deadlines``: requests ahead leave at their maximum wait in the futures, as admission makes
    them. Off by default: measured (`bench/queue.py`), it makes the estimate more accurate but
    early at its top (P90 honoured 80 % instead of 87 % at load 1.1 with 30 % known ends),
    because what the futures cannot know errs the same way: orders that arrive later and
    backfill ahead of the waiting ones. Counted as waiting on, they err late instead."""
    if not queue:
        return {}
    model = queue[0].gpu_model
    pools = _Pools(fleet, model)
    leases = _leases(fleet, pools, now, started or {})
    eligible = _eligible(pools, queue)
    rng = random.Random(seed)
    n = futures(samples, len(leases), len(queue)) if adaptive else samples
    per: list[list[float]] = [[] for _ in queue]
    # A known end ends then (an overdue automatic release: about now); an unknown one is drawn
    # from the remaining time of its class given how long it has run.
    draws = [
        None if lease.end is not None else durations.of(lease.size).sampler(lease.elapsed)
        for lease in leases
    ]
    known = [0.0 if lease.end is None else max(lease.end, now + 1.0) for lease in leases]
    # A queued request's run, when its limit is unknown: a whole rental, drawn from a table.
    whole_run = {"hosts": durations.hosts.table(), "slices": durations.slices.table()}
    tables = [
        [w.limit]
        if w.limit is not None
        else whole_run["slices" if w.gpus >= SLICE_UNIT_GPUS else "hosts"]
        for w in queue
    ]
    rand = rng.random
    backfill = len(leases) + len(queue) <= BACKFILL_EVENTS
    for _k in range(n):
        ends = [kn if dr is None else now + dr(rand()) for kn, dr in zip(known, draws, strict=True)]
        runs = [tb[int(rand() * len(tb))] for tb in tables]
        for i, t in enumerate(
            _replay(pools, leases, ends, queue, eligible, runs, now, deadlines, backfill)
        ):
            per[i].append(t)
    out = {}
    for i, w in enumerate(queue):
        qs = quantiles(per[i], LEVELS)
        out[w.id] = StartEstimate(qs[LEVELS.index(0.5)], qs[LEVELS.index(0.9)], i + 1, qs)
    return out


def limits_estimate(
    fleet: Fleet,
    queue: Sequence[Waiting],
    now: float,
    longest: float,
    *,
    started: Mapping[str, float] | None = None,
    deadlines: bool = False,
) -> dict[str, float | None]:
    """The Slurm-style start of each queued request: every lease runs to its known end or to the
    ``longest`` duration seen, every queued request to its limit or that longest duration; as
    Slurm's, nobody leaves at a maximum wait (``deadlines``: they do)."""
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
    starts = _replay(pools, leases, ends, queue, eligible, runs, now, deadlines)
    return {
        w.id: (None if math.isinf(s) or math.isnan(s) else s)
        for w, s in zip(queue, starts, strict=True)
    }


def replay_starts(
    fleet: Fleet,
    queue: Sequence[Waiting],
    now: float,
    ends: Mapping[str, float],
    runs: Sequence[float],
    *,
    started: Mapping[str, float] | None = None,
) -> dict[str, float | None]:
    """One given future: each lease ends at ``ends[lease id]`` (its known end where not given),
    each queued request runs ``runs[i]``; the discipline still knows only what production knows
    (known ends and limits decide the backfill). The queue benchmark's clairvoyant bound."""
    if not queue:
        return {}
    pools = _Pools(fleet, queue[0].gpu_model)
    leases = _leases(fleet, pools, now, started or {})
    at = [
        max(ends.get(lease.lid, lease.end if lease.end is not None else math.inf), now + 1.0)
        for lease in leases
    ]
    starts = _replay(pools, leases, at, queue, _eligible(pools, queue), list(runs), now)
    return {
        w.id: (None if math.isinf(s) or math.isnan(s) else s)
        for w, s in zip(queue, starts, strict=True)
    }
