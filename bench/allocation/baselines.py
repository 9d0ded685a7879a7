"""Baseline placement policies the benchmark compares the project's allocator with (pure Python).

All of them work on the same `topology.Fleet` state (the same incremental indexes), so the benchmark
compares decisions, not data structures.

* first-fit        topology-oblivious: the first free nodes in fleet order, whatever their SU; hosts
                   take the lowest free GPUs of the first node with enough (a bound, not a contender).
* first-su-fit     the first SU (index order) that holds the whole slice, else SUs in index order.
* slurm-tree       Slurm topology/tree best fit: the tightest leaf (SU) that fits the remainder, else
                   the largest, repeated; among clusters the tightest top switch that fits.
* kueue-tas        Kueue TAS BestFit: the first flavor (cluster) that fits; inside it, one domain (SU)
                   with the least free capacity that fits, else domains sorted by free capacity
                   descending with the last one chosen as the tightest fit for the remainder.
Hosts of the SU-aware baselines take the first aligned block on the first node that has one.

None of them has a rule for a failed node's part (the project's is `Fleet.plan_replacement`). In the
replay a baseline replaces a part as it would place a one-node order (a slice's part) or a host of
the part's GPUs (a host's part) inside the failed node's cluster: `one_node_replacement`, what a
scheduler without a replacement rule does when it reschedules the failed node's share of a job.
"""

from __future__ import annotations

from collections.abc import Sequence

from slices.topology import (
    OURS,
    ClusterState,
    Fleet,
    HostChoice,
    Request,
    SlicePolicy,
    buddy_tables,
)


def _first_fit_host(
    fleet: Fleet, clusters: Sequence[ClusterState], gpus: int, aligned: bool
) -> tuple[int, int] | None:
    for cl in clusters:
        t = buddy_tables(cl.gpn)
        for gid in range(cl.first_gid, cl.first_gid + cl.spec.node_count):
            if not fleet.node_ok[gid]:
                continue
            m = fleet.free_mask(gid)
            if aligned:
                block = (1 << gpus) - 1
                for st in range(0, cl.gpn, gpus):
                    if (m >> st) & block == block:
                        return gid, block << st
                continue
            if t.pop[m] >= gpus:
                take = 0
                for i in range(cl.gpn):
                    if m >> i & 1 and t.pop[take] < gpus:
                        take |= 1 << i
                return gid, take
    return None


class FirstFit:
    name = "first-fit"

    def choose_slice(
        self, fleet: Fleet, clusters: Sequence[ClusterState], nodes: int, req: Request
    ) -> tuple[ClusterState, dict[int, int]] | None:
        for cl in clusters:
            if cl.free_nodes < nodes:
                continue
            take: dict[int, int] = {}
            need = nodes
            for su, free in enumerate(cl.su_free):
                if free and need:
                    take[su] = min(len(free), need)
                    need -= take[su]
            return cl, take
        return None

    def choose_host(
        self, fleet: Fleet, clusters: Sequence[ClusterState], gpus: int, req: Request
    ) -> tuple[int, int] | None:
        return _first_fit_host(fleet, clusters, gpus, aligned=False)


class FirstSuFit(FirstFit):
    name = "first-su-fit"

    def choose_slice(
        self, fleet: Fleet, clusters: Sequence[ClusterState], nodes: int, req: Request
    ) -> tuple[ClusterState, dict[int, int]] | None:
        for cl in clusters:
            for su, free in enumerate(cl.su_free):
                if len(free) >= nodes:
                    return cl, {su: nodes}
        return super().choose_slice(fleet, clusters, nodes, req)

    def choose_host(
        self, fleet: Fleet, clusters: Sequence[ClusterState], gpus: int, req: Request
    ) -> tuple[int, int] | None:
        return _first_fit_host(fleet, clusters, gpus, aligned=True)


class SlurmTree(FirstSuFit):
    name = "slurm-tree"

    def choose_slice(
        self, fleet: Fleet, clusters: Sequence[ClusterState], nodes: int, req: Request
    ) -> tuple[ClusterState, dict[int, int]] | None:
        # lowest level first: the tightest single leaf anywhere
        best = None
        for cl in clusters:
            for su, free in enumerate(cl.su_free):
                f = len(free)
                if f >= nodes and (best is None or (f, cl.idx, su) < best[0]):
                    best = ((f, cl.idx, su), cl, su)
        if best is not None:
            return best[1], {best[2]: nodes}
        fitting = [cl for cl in clusters if cl.free_nodes >= nodes]
        if not fitting:
            return None
        cl = min(fitting, key=lambda c: (c.free_nodes, c.idx))  # tightest top switch
        free = {su: len(f) for su, f in enumerate(cl.su_free) if f}
        take: dict[int, int] = {}
        need = nodes
        while need:
            fits = [(f, su) for su, f in free.items() if f >= need]
            if fits:
                _, su = min(fits)
                take[su] = need
                need = 0
            else:
                su = min(free, key=lambda s: (-free[s], s))
                take[su] = free.pop(su)
                need -= take[su]
        return cl, take


class KueueTas(FirstSuFit):
    name = "kueue-tas"

    def choose_slice(
        self, fleet: Fleet, clusters: Sequence[ClusterState], nodes: int, req: Request
    ) -> tuple[ClusterState, dict[int, int]] | None:
        for cl in clusters:  # flavors in order: the first that fits
            if cl.free_nodes < nodes:
                continue
            names = {su: f"{cl.code}/su{su + 1:02d}" for su in range(len(cl.su_free))}
            domains = [(len(f), names[su], su) for su, f in enumerate(cl.su_free) if f]
            single = [d for d in domains if d[0] >= nodes]
            if single:
                f, _, su = min(single)
                return cl, {su: nodes}
            domains.sort(key=lambda d: (-d[0], d[1]))
            take: dict[int, int] = {}
            need = nodes
            rest = list(domains)
            while need:
                fits = [d for d in rest if d[0] >= need]
                if fits:
                    d = min(fits, key=lambda d: (d[0], d[1]))
                    take[d[2]] = need
                    need = 0
                else:
                    d = rest.pop(0)
                    take[d[2]] = d[0]
                    need -= d[0]
            return cl, take
        return None


def one_node_replacement(
    policy: SlicePolicy, fleet: Fleet, failed: int, gpus: int, *, whole: bool, req: Request
) -> HostChoice | None:
    """A baseline's replacement for the part of failed node `failed` (node id), inside its
    cluster: the node `policy` picks for a one-node order when `whole` (a slice's part), else the
    GPUs it picks for a host of `gpus` GPUs. (gid, GPU mask), or None when nothing fits."""
    cl = fleet.cluster_of(failed)
    if not whole:
        return policy.choose_host(fleet, [cl], gpus, req)
    got = policy.choose_slice(fleet, [cl], 1, req)
    if got is None:
        return None
    chosen, take = got
    [su] = take
    return chosen.su_free[su][0], chosen.full_mask


POLICIES = {p.name: p for p in (OURS, FirstFit(), FirstSuFit(), SlurmTree(), KueueTas())}
