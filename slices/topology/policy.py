"""Placement policies: the interface every policy implements, and the project's own.

A policy only chooses; the fleet validates the request, turns the choice into a `Placement` and
commits it. Policies read the fleet through its public state (`ClusterState.su_free`, `free_nodes`,
`Fleet.free_mask`) and its query methods (`state_min_sus`, `best_partial_node`, `best_leftover`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from slices.topology.buddy import aligned_block, buddy_tables
from slices.topology.cluster import ClusterState
from slices.topology.placement import Request

if TYPE_CHECKING:  # the fleet imports the default policy at run time
    from slices.topology.fleet import Fleet

SliceChoice = tuple[ClusterState, dict[int, int]]  # (cluster, {SU index: nodes to take})
HostChoice = tuple[int, int]  # (gid, GPU mask to take)


class SlicePolicy(Protocol):
    name: str

    def choose_slice(
        self, fleet: Fleet, clusters: Sequence[ClusterState], nodes: int, req: Request
    ) -> SliceChoice | None:
        """Return (cluster, {su index: nodes to take}) or None."""

    def choose_host(
        self, fleet: Fleet, clusters: Sequence[ClusterState], gpus: int, req: Request
    ) -> HostChoice | None:
        """Return (gid, GPU mask) or None."""


def lease_end_distance(cl: ClusterState, su: int, req: Request) -> float:
    """Distance between the SU's latest lease end and the new lease's end (smaller is better)."""
    if req.ends_at is None:
        return 0.0
    ends = cl.su_ends[su]
    if not ends:
        return float(max(req.ends_at - req.now, 0.0)) + 1e12  # an empty SU aligns with nothing
    return abs(max(ends.values()) - req.ends_at)


def multisets(
    values: Sequence[int], avail: Sequence[int], k: int, need: int
) -> Iterator[list[int]]:
    """Multisets of k free counts (values descending, at most avail[i] of values[i]) summing ≥ need."""
    out: list[int] = []

    def rec(i: int, slots: int, acc: int) -> Iterator[list[int]]:
        if slots == 0:
            if acc >= need:
                yield list(out)
            return
        if i >= len(values) or acc + slots * values[i] < need:
            return
        for c in range(min(slots, avail[i]), -1, -1):
            out.extend([values[i]] * c)
            yield from rec(i + 1, slots - c, acc + c * values[i])
            del out[len(out) - c :]

    yield from rec(0, k, 0)


class TopologyAwarePolicy:
    """Minimal SUs, least demand-weighted loss, best fit, lease-end alignment, lowest index."""

    name = "ours"

    def choose_slice(
        self, fleet: Fleet, clusters: Sequence[ClusterState], nodes: int, req: Request
    ) -> SliceChoice | None:
        best_key: tuple[Any, ...] | None = None
        best: SliceChoice | None = None
        ks = [(fleet.state_min_sus(cl, nodes), cl) for cl in clusters]
        kmin = min((k for k, _ in ks if k), default=0)
        if not kmin:
            return None
        for k, cl in ks:
            if k != kmin:
                continue
            (loss, fit, align), take = self._in_cluster(fleet, cl, nodes, k, req)
            # Across clusters the SU-spanning sizes count too: 8 nodes taken from a cluster with
            # 64 free destroy its only 512-card slice, from one with 200 free they destroy none.
            spanning = cl.cvalue[cl.free_nodes] - cl.cvalue[cl.free_nodes - nodes]
            key = (round(loss + spanning, 9), fit, align, cl.idx)
            if best_key is None or key < best_key:
                best_key, best = key, (cl, take)
        return best

    def _in_cluster(
        self, fleet: Fleet, cl: ClusterState, nodes: int, k: int, req: Request
    ) -> tuple[tuple[float, int, float], dict[int, int]]:
        """The best `k`-SU choice inside `cl`: ((loss, nodes touched, alignment), take)."""
        if k == 1:
            return self._one_su(cl, nodes, req)
        V = cl.value
        # group SUs by free count; inside a group the best aligned (then lowest index) come first
        groups: dict[int, list[tuple[float, int]]] = {}
        for su, f in enumerate(cl.su_free_counts()):
            if f:
                groups.setdefault(f, []).append((lease_end_distance(cl, su, req), su))
        for g in groups.values():
            g.sort()
        values = sorted(groups, reverse=True)
        best_key: tuple[float, int, float, tuple[int, ...]] | None = None
        best_take: dict[int, int] = {}
        for combo in multisets(values, [len(groups[v]) for v in values], k, nodes):
            fs = tuple(sorted(combo, reverse=True))
            total = sum(fs)
            loss, lefts = fleet.best_leftover(fs, total - nodes, V)
            sus: list[int] = []
            align = 0.0
            used: dict[int, int] = {}
            for f in fs:
                a, su = groups[f][used.get(f, 0)]
                used[f] = used.get(f, 0) + 1
                sus.append(su)
                align += a
            combo_key = (round(loss, 9), total, align, tuple(sorted(sus)))
            if best_key is None or combo_key < best_key:
                best_key = combo_key
                best_take = {su: f - left for su, f, left in zip(sus, fs, lefts, strict=True)}
        assert best_key is not None
        return best_key[:3], best_take

    @staticmethod
    def _one_su(
        cl: ClusterState, nodes: int, req: Request
    ) -> tuple[tuple[float, int, float], dict[int, int]]:
        V = cl.value
        best_key: tuple[float, int, float, int] | None = None
        for su, f in enumerate(cl.su_free_counts()):
            if f < nodes:
                continue
            key = (round(V[f] - V[f - nodes], 9), f, lease_end_distance(cl, su, req), su)
            if best_key is None or key < best_key:
                best_key = key
        assert best_key is not None
        return best_key[:3], {best_key[3]: nodes}

    def choose_host(
        self, fleet: Fleet, clusters: Sequence[ClusterState], gpus: int, req: Request
    ) -> HostChoice | None:
        gpn = max(c.gpn for c in clusters)
        t = buddy_tables(gpn)
        gid = self._best_partial(fleet, clusters, gpus, req.gpu_model, gpn)
        if gid is None:
            gid = self._whole_node(clusters)
        if gid is None:
            return None
        return gid, t.best[fleet.free_mask(gid)][gpus]

    @staticmethod
    def _best_partial(
        fleet: Fleet, clusters: Sequence[ClusterState], gpus: int, model: str, gpn: int
    ) -> int | None:
        """Best fit among partly used nodes: smallest largest-free-block, then fewest free GPUs."""
        regions = sorted({c.region for c in clusters})
        size = gpus
        while size < gpn:
            best = None
            for region in regions:
                got = fleet.best_partial_node(region, model, size)
                if got is not None and (best is None or got < best):
                    best = got
            if best is not None:
                return best[1]
            size *= 2
        return None

    @staticmethod
    def _whole_node(
        clusters: Sequence[ClusterState], prefer: Collection[tuple[int, int]] = ()
    ) -> int | None:
        """Break a whole node where it costs the least slice capacity, tightest SU first.

        `prefer`: (cluster index, SU) pairs taken before any other (a slice's replacement goes to
        an SU the slice already uses: no new spine crossing); empty for an order."""
        best_key = None
        best_gid = None
        for cl in clusters:
            if not cl.free_nodes:
                continue
            for su, free in enumerate(cl.su_free):
                f = len(free)
                if not f:
                    continue
                loss = cl.value[f] - cl.value[f - 1] if cl.value else 0.0
                if cl.cvalue:
                    loss += cl.cvalue[cl.free_nodes] - cl.cvalue[cl.free_nodes - 1]
                key = ((cl.idx, su) not in prefer, round(loss, 9), f, cl.idx, su)
                if best_key is None or key < best_key:
                    best_key, best_gid = key, free[0]
        return best_gid

    # ---- claims that are not orders: a part of a failed node ----------------------------------

    def choose_replacement(
        self, fleet: Fleet, failed: int, gpus: int, *, whole: bool, near: Collection[int] = ()
    ) -> HostChoice | None:
        """Where the part of failed node `failed` goes: inside its cluster (the allocation's).

        A slice's part (`whole`) takes a whole free node: of the failed node's SU when that SU
        has one (the slice stays one switch hop apart on every rail), else of an SU the slice
        already uses (`near`: its other nodes; the ring crosses the spine no more often), else
        where breaking a whole node costs the least slice capacity, as for an order. A host's
        part is placed as an order for `gpus` GPUs is, within the cluster: the aligned block of
        the best-fitting partly used node, else of a whole node.
        """
        cl = fleet.cluster_of(failed)
        if whole:
            same_su = cl.su_free[fleet.node_su[failed]]
            if same_su:
                return same_su[0], cl.full_mask
            prefer = {(cl.idx, fleet.node_su[g]) for g in near if fleet.cluster_of(g) is cl}
            gid = self._whole_node([cl], prefer)
            return None if gid is None else (gid, cl.full_mask)
        gid = self._best_partial_in(fleet, cl, gpus)
        if gid is None:
            gid = self._whole_node([cl])
        if gid is None:
            return None
        block = aligned_block(fleet.free_mask(gid), cl.gpn, gpus)
        return None if block is None else (gid, block)

    @staticmethod
    def _best_partial_in(fleet: Fleet, cl: ClusterState, gpus: int) -> int | None:
        """`_best_partial` inside one cluster (the fleet's index is per region): the partly used
        node whose largest free aligned block is the smallest that holds `gpus`, then the one
        with the fewest free GPUs, then the lowest id. A scan: replacements are rare."""
        t = buddy_tables(cl.gpn)
        best: tuple[int, int, int] | None = None
        for gid in cl.gids:
            m = fleet.free_mask(gid)
            if not fleet.node_ok[gid] or m in (0, t.full) or t.lfb[m] < gpus:
                continue
            key = (t.lfb[m], t.pop[m], gid)
            if best is None or key < best:
                best = key
        return None if best is None else best[2]


OURS = TopologyAwarePolicy()
