"""The allocator's state: free GPUs per node, free whole nodes per SU, leases; plan and commit.

All indexes are incremental: free whole nodes per SU (sorted lists), partly used nodes per
(region, model, largest free block) in heaps with lazy invalidation. Nothing rescans the fleet.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence

from slices.topology import explain as _explain
from slices.topology.buddy import buddy_tables, gpu_indexes, gpu_mask
from slices.topology.capacity import leftover_split, min_sus, spanning_value_table, value_table
from slices.topology.cluster import ClusterState, Lease
from slices.topology.placement import NodeShare, Placement, Request, Unplaceable
from slices.topology.policy import OURS, SlicePolicy
from slices.topology.specs import DEFAULT_SLICE_DEMAND, HOST_SIZES, SLICE_UNIT_GPUS, FleetSpec

_LEFTOVER_CACHE_SIZE = 50_000


class Fleet:
    """The allocator's view of the fleet: free GPUs per node, free whole nodes per SU, leases."""

    def __init__(
        self, spec: FleetSpec, demand: Mapping[str, Mapping[int, float]] | None = None
    ) -> None:
        self.spec = spec
        self.clusters: list[ClusterState] = []
        self.cluster_by_code: dict[str, ClusterState] = {}
        self.node_cluster: list[int] = []
        self.node_su: list[int] = []
        self.node_mask: list[int] = []  # free GPUs
        self.node_ok: list[bool] = []  # schedulable (ready and healthy)
        self.hostnames: list[str] = []
        self.gid_by_hostname: dict[str, int] = {}
        self.leases: dict[str, Lease] = {}
        self.node_leases: list[set[str]] = []
        self.by_model: dict[str, list[ClusterState]] = {}
        gid = 0
        for ci, cspec in enumerate(spec.clusters):
            cl = ClusterState(ci, cspec, gid)
            self.clusters.append(cl)
            self.cluster_by_code[cl.code] = cl
            self.by_model.setdefault(cl.model, []).append(cl)
            for si, su in enumerate(cspec.sus):
                for node in su.nodes:
                    if node.hostname in self.gid_by_hostname:
                        raise ValueError(f"duplicate hostname {node.hostname}")
                    self.gid_by_hostname[node.hostname] = gid
                    self.node_cluster.append(ci)
                    self.node_su.append(si)
                    self.node_mask.append(cl.full_mask)
                    self.node_ok.append(True)
                    self.hostnames.append(node.hostname)
                    self.node_leases.append(set())
                    gid += 1
        # partly used nodes: (region, model, largest free block) -> heap of (free GPUs, gid)
        self._partial: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
        self._leftover_cache: dict[
            tuple[tuple[int, ...], int, int], tuple[float, tuple[int, ...]]
        ] = {}
        self.set_demand(demand if demand is not None else spec.demand)

    # ---- configuration ------------------------------------------------------------------------

    def set_demand(self, demand: Mapping[str, Mapping[int, float]]) -> None:
        """Demand weights per GPU model and size (GPUs); sizes below 64 are host sizes."""
        self.demand = {m: dict(d) for m, d in demand.items()}
        self._leftover_cache.clear()
        for cl in self.clusters:
            d = self.demand.get(cl.model) or DEFAULT_SLICE_DEMAND
            if not any(s >= SLICE_UNIT_GPUS for s in d):
                d = DEFAULT_SLICE_DEMAND
            if cl.slices_ok:
                # Per slice, not per node (issue 32): the demand weights are shares of the
                # requests, and every request counts once, whatever its size; weighing by nodes
                # protected large slices at the cost of more rejected small ones.
                cl.value = value_table(d, cl.su_cap_max, cl.gpn, per_slice=True)
                cl.cvalue = spanning_value_table(
                    d, cl.su_cap_max, cl.spec.node_count, cl.gpn, per_slice=True
                )
            else:
                cl.value, cl.cvalue = [], []

    # ---- small accessors ------------------------------------------------------------------------

    def cluster_of(self, gid: int) -> ClusterState:
        return self.clusters[self.node_cluster[gid]]

    def candidates(self, model: str, region: str | None) -> list[ClusterState]:
        return [c for c in self.by_model.get(model, ()) if region is None or c.region == region]

    def _count_free(self, model: str | None, region: str | None, in_service: bool) -> int:
        total = 0
        for cl in self.clusters:
            if (model and cl.model != model) or (region and cl.region != region):
                continue
            pop = buddy_tables(cl.gpn).pop
            for gid in cl.gids:
                if self.node_ok[gid] == in_service:
                    total += pop[self.node_mask[gid]]
        return total

    def free_gpus(self, model: str | None = None, region: str | None = None) -> int:
        """Free GPUs on schedulable nodes."""
        return self._count_free(model, region, in_service=True)

    def out_of_service_gpus(self, model: str | None = None, region: str | None = None) -> int:
        """Unleased GPUs on drained, failed or maintenance nodes."""
        return self._count_free(model, region, in_service=False)

    def free_mask(self, gid: int) -> int:
        """The node's free GPUs as a bit mask (bit i = GPU i)."""
        return self.node_mask[gid]

    def is_whole_free(self, gid: int) -> bool:
        return self.node_ok[gid] and self.node_mask[gid] == self.cluster_of(gid).full_mask

    # ---- index maintenance ----------------------------------------------------------------------

    def _push_partial(self, gid: int) -> None:
        cl = self.cluster_of(gid)
        t = buddy_tables(cl.gpn)
        m = self.node_mask[gid]
        if not self.node_ok[gid] or m == 0 or m == t.full:
            return
        heapq.heappush(
            self._partial.setdefault((cl.region, cl.model, t.lfb[m]), []), (t.pop[m], gid)
        )

    def _whole_node_changed(self, gid: int, free: bool) -> None:
        """A node became (free=True) or stopped being a schedulable free whole node."""
        cl = self.cluster_of(gid)
        su_free = cl.su_free[self.node_su[gid]]
        if free:
            bisect.insort(su_free, gid)
            cl.free_nodes += 1
        else:
            su_free.pop(bisect.bisect_left(su_free, gid))
            cl.free_nodes -= 1

    def _set_mask(self, gid: int, new: int) -> None:
        full = self.cluster_of(gid).full_mask
        old = self.node_mask[gid]
        if old == new:
            return
        self.node_mask[gid] = new
        if self.node_ok[gid] and full in (old, new):
            self._whole_node_changed(gid, free=new == full)
        self._push_partial(gid)

    def set_schedulable(self, hostname: str, ok: bool) -> None:
        """Drain (False) or return (True) a node; GPUs already leased stay leased."""
        gid = self.gid_by_hostname[hostname]
        if self.node_ok[gid] == ok:
            return
        if self.node_mask[gid] == self.cluster_of(gid).full_mask:
            self._whole_node_changed(gid, free=ok)
        self.node_ok[gid] = ok
        self._push_partial(gid)

    # ---- what policies ask ----------------------------------------------------------------------

    def best_partial_node(self, region: str, model: str, lfb: int) -> tuple[int, int] | None:
        """The partly used schedulable node of `model` in `region` whose largest free aligned block
        is `lfb` GPUs and that has the fewest free GPUs (then the lowest id): (free GPUs, gid)."""
        heap = self._partial.get((region, model, lfb))
        if not heap:
            return None
        t = buddy_tables(self.by_model[model][0].gpn)
        while heap:
            pop, gid = heap[0]
            m = self.node_mask[gid]
            if self.node_ok[gid] and m != t.full and m and t.lfb[m] == lfb and t.pop[m] == pop:
                return pop, gid
            heapq.heappop(heap)  # stale: the node changed since it was pushed
        return None

    def state_min_sus(self, cl: ClusterState, nodes: int) -> int:
        """Fewest SUs of `cl` that can hold `nodes` now (0 = cannot): the k largest free counts."""
        if cl.free_nodes < nodes:
            return 0
        return min_sus(cl.su_free_counts(), nodes)

    def best_leftover(
        self, fs: tuple[int, ...], r: int, V: Sequence[float]
    ) -> tuple[float, tuple[int, ...]]:
        """Memoised `capacity.leftover_split`: the same free-count shapes recur all the time.
        `V` must be one of this fleet's value tables (the cache keys on its identity)."""
        key = (fs, r, id(V))
        got = self._leftover_cache.get(key)
        if got is None:
            got = leftover_split(fs, r, V)
            if len(self._leftover_cache) > _LEFTOVER_CACHE_SIZE:
                self._leftover_cache.clear()
            self._leftover_cache[key] = got
        return got

    # ---- planning ---------------------------------------------------------------------------------

    def validate(self, req: Request) -> Unplaceable | None:
        """Why `req` can never be placed on this fleet (None when it could be)."""
        if not self.by_model.get(req.gpu_model):
            return Unplaceable(req.id, "no_cluster", f"no cluster has {req.gpu_model} GPUs")
        candidates = self.candidates(req.gpu_model, req.region)
        if not candidates:
            return Unplaceable(
                req.id, "no_cluster", f"region {req.region} has no {req.gpu_model} GPUs"
            )
        if req.gpus in HOST_SIZES:
            if all(req.gpus > c.gpn for c in candidates):
                return Unplaceable(req.id, "invalid_size", f"{req.gpu_model} nodes have fewer GPUs")
            return None
        if req.gpus % SLICE_UNIT_GPUS or req.gpus <= 0:
            return Unplaceable(
                req.id,
                "invalid_size",
                f"a host has 1, 2, 4 or 8 GPUs and a slice a multiple of {SLICE_UNIT_GPUS}, "
                f"not {req.gpus}",
            )
        fabric = [c for c in candidates if c.slices_ok]
        if not fabric:
            return Unplaceable(
                req.id,
                "no_cluster",
                f"no InfiniBand cluster of {req.gpu_model} in "
                f"{req.region or 'any region'} for slices",
            )
        biggest = max(c.spec.node_count * c.gpn for c in fabric)
        if req.gpus > biggest:
            return Unplaceable(
                req.id, "too_large", f"the largest {req.gpu_model} cluster has {biggest} GPUs"
            )
        return None

    def plan(self, req: Request, policy: SlicePolicy | None = None) -> Placement | Unplaceable:
        """Choose GPUs for `req` without taking them."""
        bad = self.validate(req)
        if bad is not None:
            return bad
        policy = policy or OURS
        clusters = self.candidates(req.gpu_model, req.region)
        if req.is_slice:
            return self._plan_slice(req, [c for c in clusters if c.slices_ok], policy)
        return self._plan_host(req, clusters, policy)

    def _plan_slice(
        self, req: Request, clusters: list[ClusterState], policy: SlicePolicy
    ) -> Placement | Unplaceable:
        nodes = req.gpus // 8
        state_min = min((k for c in clusters if (k := self.state_min_sus(c, nodes))), default=0)
        chosen = policy.choose_slice(self, clusters, nodes, req)
        if chosen is None:
            return Unplaceable(
                req.id,
                "no_capacity",
                f"{nodes} free {req.gpu_model} nodes are not available together in one "
                f"cluster{' in ' + req.region if req.region else ''}",
            )
        cl, take = chosen
        # Rank order: SU by SU (ascending), nodes ascending inside an SU, so NCCL's ring leaves
        # each SU once.
        shares = tuple(
            NodeShare(self.hostnames[gid], tuple(range(cl.gpn)), su, gid)
            for su in sorted(take)
            for gid in cl.su_free[su][: take[su]]
        )
        return Placement(
            req.id,
            cl.code,
            cl.region,
            cl.model,
            req.gpus,
            shares,
            su_count=len(take),
            su_min_structural=math.ceil(nodes / cl.su_cap_max),
            su_min_state=state_min,
            ends_at=req.ends_at,
        )

    def _plan_host(
        self, req: Request, clusters: list[ClusterState], policy: SlicePolicy
    ) -> Placement | Unplaceable:
        got = policy.choose_host(self, clusters, req.gpus, req)
        if got is None:
            return Unplaceable(
                req.id,
                "no_capacity",
                f"no {req.gpu_model} node has {req.gpus} free GPUs together"
                f"{' in ' + req.region if req.region else ''}",
            )
        gid, mask = got
        cl = self.cluster_of(gid)
        share = NodeShare(self.hostnames[gid], gpu_indexes(mask), self.node_su[gid], gid)
        return Placement(
            req.id, cl.code, cl.region, cl.model, req.gpus, (share,), 1, 1, 1, req.ends_at
        )

    def plan_replacement(
        self, failed: str, gpus: int, *, whole: bool, near: Iterable[str] = ()
    ) -> Placement | Unplaceable:
        """Choose where the part of failed node `failed` goes (`gpus` GPUs; a whole node for a
        slice's part), without taking it: the project's policy (`choose_replacement`), inside
        the failed node's cluster. `near`: the hostnames of the slice's other nodes."""
        gid = self.gid_by_hostname[failed]
        cl = self.cluster_of(gid)
        near_ids = [self.gid_by_hostname[h] for h in near if h in self.gid_by_hostname]
        got = OURS.choose_replacement(self, gid, gpus, whole=whole, near=near_ids)
        if got is None:
            return Unplaceable(
                failed, "no_capacity", f"no node of {cl.code} can take the part of {failed}"
            )
        new, mask = got
        share = NodeShare(self.hostnames[new], gpu_indexes(mask), self.node_su[new], new)
        return Placement(failed, cl.code, cl.region, cl.model, len(share.gpus), (share,), 1, 1, 1)

    # ---- commit / release ------------------------------------------------------------------------

    def commit(self, p: Placement) -> None:
        """Take the GPUs of a planned placement (must still be free)."""
        if p.request_id in self.leases:
            raise ValueError(f"lease {p.request_id} already exists")
        masks: dict[int, int] = {}
        for s in p.shares:
            m = gpu_mask(s.gpus)
            if self.node_mask[s.node_id] & m != m or not self.node_ok[s.node_id]:
                raise ValueError(f"GPUs {s.gpus} of {s.hostname} are not free")
            masks[s.node_id] = m
        for gid, m in masks.items():
            self._set_mask(gid, self.node_mask[gid] & ~m)
            self.node_leases[gid].add(p.request_id)
        if p.ends_at is not None:
            cl = self.cluster_by_code[p.cluster]
            for su in {s.su for s in p.shares}:
                cl.su_ends[su][p.request_id] = p.ends_at
        self.leases[p.request_id] = Lease(p, masks)

    def allocate(self, req: Request, policy: SlicePolicy | None = None) -> Placement | Unplaceable:
        """Plan and commit."""
        got = self.plan(req, policy)
        if isinstance(got, Placement):
            self.commit(got)
        return got

    def release(self, lease_id: str) -> Placement:
        """Give back exactly the GPUs of a lease."""
        lease = self.leases.pop(lease_id)
        for gid, m in lease.masks.items():
            self._set_mask(gid, self.node_mask[gid] | m)
            self.node_leases[gid].discard(lease_id)
        for ends in self.cluster_by_code[lease.placement.cluster].su_ends:
            ends.pop(lease_id, None)
        return lease.placement

    def occupy(
        self, lease_id: str, gpus: Mapping[str, Iterable[int]], ends_at: float | None = None
    ) -> Placement:
        """Record an existing allocation (e.g. loaded from the database) as a lease."""
        shares = []
        for hostname, idxs in gpus.items():
            gid = self.gid_by_hostname[hostname]
            shares.append(NodeShare(hostname, tuple(sorted(idxs)), self.node_su[gid], gid))
        cl = self.cluster_of(shares[0].node_id)
        p = Placement(
            lease_id,
            cl.code,
            cl.region,
            cl.model,
            sum(len(s.gpus) for s in shares),
            tuple(shares),
            su_count=len({s.su for s in shares}),
            su_min_structural=math.ceil(len(shares) / cl.su_cap_max),
            su_min_state=0,
            ends_at=ends_at,
        )
        self.commit(p)
        return p

    # ---- explanations --------------------------------------------------------------------------

    def explain(self, req: Request, policy: SlicePolicy | None = None) -> Unplaceable | None:
        """Why `req` cannot be placed now, when it could be (from lease ends) and what else fits."""
        return _explain.explain(self, req, policy)

    def earliest_start(self, req: Request, structural: bool = False) -> float | None:
        """First known lease end after which `req` fits (at its structural SU minimum if asked)."""
        return _explain.earliest_start(self, req, structural)
