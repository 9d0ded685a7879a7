"""Fleet model and the topology-aware allocator (pure Python, no Django).

Vocabulary
    Cluster        one fabric: an InfiniBand rail-optimised fat-tree (HDR/NDR) or plain Ethernet.
    Scalable unit  (SU) the nodes whose rail-r HCAs share one rail-r leaf switch; two nodes of one SU
                   are one switch hop apart on every rail, nodes of two SUs three (leaf-spine-leaf).
    Host           1, 2, 4 or 8 GPUs of one node (GPU cloud host).
    Slice          a multiple of 64 GPUs made of whole 8-GPU nodes of one cluster (cluster slice).

Single-node hosts use a buddy scheme: a request for k GPUs takes an aligned block of k GPUs
(k = 2 is a GPU pair sharing a PCIe switch and HCA, k = 4 a NUMA half), from the node whose largest
free aligned block is the smallest that fits (best fit), so partly used nodes fill up first and whole
nodes stay whole for slices. When a whole node has to be broken, it is taken where that destroys the
least slice capacity.

Slices are placed on exactly the minimum number of SUs the current free state allows (the k largest
free counts decide it); among those placements the allocator picks the one that destroys the least
demand-weighted placeable capacity, then the tightest fit, then the SUs whose leases end nearest to
the new lease's end, then the lowest SU indexes (deterministic). Ranks in the hostfile follow SUs, so
NCCL's ring crosses the spine as few times as possible.

All indexes are incremental: free whole nodes per SU (sorted lists), partly used nodes per
(region, model, largest free block) in heaps with lazy invalidation. Nothing rescans the fleet.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

SLICE_UNIT_GPUS = 64
HOST_SIZES = (1, 2, 4, 8)
FABRIC_ETHERNET = "ethernet"
# Default slice demand (GPUs -> weight) when the fleet file gives none for a model.
DEFAULT_SLICE_DEMAND: Mapping[int, float] = {64: 0.5, 128: 0.3, 256: 0.2}


# --------------------------------------------------------------------------------------------
# Fleet description (what the fleet file says)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    hostname: str
    address: str
    ssh_port: int = 22
    host_key: str = ""


@dataclass(frozen=True)
class ScalableUnitSpec:
    index: int
    name: str
    nodes: tuple[NodeSpec, ...]

    @property
    def capacity(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class ClusterSpec:
    code: str
    name: str
    region: str
    gpu_model: str
    fabric: str  # "ib-hdr", "ib-ndr" or "ethernet"
    gpus_per_node: int
    sus: tuple[ScalableUnitSpec, ...]
    numa_nodes: int = 2
    gpus_per_hca: int = 1
    rails: int = 8
    link_gbps: int = 200
    leaf_ports: int = 40
    line: int = 0  # where the cluster is declared in its fleet file, for messages

    @property
    def slices_allowed(self) -> bool:
        return self.fabric != FABRIC_ETHERNET and self.gpus_per_node == 8

    @property
    def node_count(self) -> int:
        return sum(su.capacity for su in self.sus)

    @property
    def gpu_count(self) -> int:
        return self.node_count * self.gpus_per_node

    @property
    def su_capacity(self) -> int:
        return max(su.capacity for su in self.sus)


@dataclass(frozen=True)
class RegionSpec:
    code: str
    name: str
    name_zh: str = ""


@dataclass(frozen=True)
class GpuModelSpec:
    code: str
    memory_gib: int
    nvlink_gbps: int = 0  # per GPU, unidirectional; 0 = PCIe only
    price_hint: str = ""


@dataclass(frozen=True)
class FleetSpec:
    regions: tuple[RegionSpec, ...]
    gpu_models: tuple[GpuModelSpec, ...]
    clusters: tuple[ClusterSpec, ...]
    demand: Mapping[str, Mapping[int, float]] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return sum(c.gpu_count for c in self.clusters)

    def model(self, code: str) -> GpuModelSpec | None:
        return next((m for m in self.gpu_models if m.code == code), None)


# --------------------------------------------------------------------------------------------
# Requests and answers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    id: str
    gpus: int
    gpu_model: str
    region: str | None = None
    now: float = 0.0
    ends_at: float | None = None  # known lease end (seconds, same clock as `now`), None = open

    @property
    def is_slice(self) -> bool:
        return self.gpus >= SLICE_UNIT_GPUS


@dataclass(frozen=True)
class NodeShare:
    hostname: str
    gpus: tuple[int, ...]  # GPU indexes on the node
    su: int  # SU index inside the cluster
    node_id: int  # allocator-internal id


@dataclass(frozen=True)
class Placement:
    request_id: str
    cluster: str
    region: str
    gpu_model: str
    gpus: int
    shares: tuple[NodeShare, ...]  # in rank order
    su_count: int
    su_min_structural: int  # ceil(n / SU capacity): what an empty cluster would give
    su_min_state: int  # fewest SUs the free state allowed at allocation time
    ends_at: float | None = None

    @property
    def is_slice(self) -> bool:
        return self.gpus >= SLICE_UNIT_GPUS

    @property
    def at_structural_minimum(self) -> bool:
        return self.su_count <= self.su_min_structural

    @property
    def switch_level(self) -> int:
        """Lowest common switch level: 0 = one node, 1 = one leaf (SU), 2 = spine."""
        if len(self.shares) <= 1:
            return 0
        return 1 if self.su_count == 1 else 2

    def hostfile(self) -> list[str]:
        """MPI/NCCL hostfile lines in rank order (SU by SU)."""
        return [f"{s.hostname} slots={len(s.gpus)}" for s in self.shares]

    def gpu_keys(self) -> set[tuple[str, int]]:
        return {(s.hostname, g) for s in self.shares for g in s.gpus}


@dataclass(frozen=True)
class Alternative:
    kind: str  # "region", "gpu_model" or "size"
    region: str
    gpu_model: str
    gpus: int
    cluster: str


@dataclass(frozen=True)
class Unplaceable:
    request_id: str
    code: str  # "invalid_size", "no_cluster", "too_large", "no_capacity"
    reason: str
    earliest: float | None = None  # when it could be placed, from known lease ends
    alternatives: tuple[Alternative, ...] = ()

    def explain(self) -> str:
        return self.reason


# --------------------------------------------------------------------------------------------
# Buddy tables for the GPUs of one node
# --------------------------------------------------------------------------------------------


def _popcount(x: int) -> int:
    return bin(x).count("1")


class _BuddyTables:
    """Precomputed per free-mask answers for a node of `g` GPUs (g a power of two)."""

    def __init__(self, g: int) -> None:
        self.g = g
        self.full = (1 << g) - 1
        sizes = [s for s in HOST_SIZES if s <= g]
        self.sizes = sizes
        self.lfb = [0] * (1 << g)  # largest free aligned block
        self.pop = [_popcount(m) for m in range(1 << g)]
        # best[mask][size] = bitmask of the block to take, or 0
        self.best: list[dict[int, int]] = [{} for _ in range(1 << g)]
        for mask in range(1 << g):
            lfb = 0
            for s in sizes:
                block = (1 << s) - 1
                if any((mask >> st) & block == block for st in range(0, g, s)):
                    lfb = s
            self.lfb[mask] = lfb
            for s in sizes:
                block = (1 << s) - 1
                candidates = []
                for st in range(0, g, s):
                    if (mask >> st) & block != block:
                        continue
                    # the largest free aligned block containing this one: break the smallest buddy
                    container = s
                    for big in sizes:
                        if big <= s:
                            continue
                        bst = (st // big) * big
                        bblock = ((1 << big) - 1) << bst
                        if mask & bblock == bblock:
                            container = big
                            break
                    candidates.append((container, st))
                if candidates:
                    _, st = min(candidates)
                    self.best[mask][s] = block << st


_TABLES: dict[int, _BuddyTables] = {}


def buddy_tables(g: int) -> _BuddyTables:
    if g not in _TABLES:
        if g < 1 or g > 8 or g & (g - 1):
            raise ValueError(f"GPUs per node must be 1, 2, 4 or 8, not {g}")
        _TABLES[g] = _BuddyTables(g)
    return _TABLES[g]


def gpu_indexes(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


# --------------------------------------------------------------------------------------------
# Demand-weighted value of an SU's free nodes
# --------------------------------------------------------------------------------------------


def slice_chunk(nodes: int, su_capacity: int) -> int:
    """Nodes a slice of `nodes` needs from each SU of a balanced, structurally minimal placement."""
    if nodes <= su_capacity:
        return nodes
    q = math.ceil(nodes / su_capacity)
    return math.ceil(nodes / q)


def value_table(demand: Mapping[int, float], su_capacity: int, gpn: int = 8) -> list[float]:
    """V[f]: demand-weighted slice capacity (in nodes) that `f` free whole nodes of an SU offer.

    A 4-node remainder is worth nothing to a 64-card slice (8 nodes); host demand is linear in free
    nodes, equal for every placement of the same size, so it cancels and is left out.
    """
    total = sum(w for s, w in demand.items() if s >= SLICE_UNIT_GPUS) or 1.0
    table = [0.0] * (su_capacity + 1)
    for size, weight in demand.items():
        if size < SLICE_UNIT_GPUS:
            continue
        u = slice_chunk(size // gpn, su_capacity)
        for f in range(su_capacity + 1):
            table[f] += weight / total * u * (f // u)
    return table


def spanning_value_table(
    demand: Mapping[int, float], su_capacity: int, cluster_nodes: int, gpn: int = 8
) -> list[float]:
    """C[F]: demand-weighted capacity (nodes) that F free nodes of a cluster offer to slices larger
    than an SU (those may span SUs, so only the cluster's free total bounds them)."""
    total = sum(w for s, w in demand.items() if s >= SLICE_UNIT_GPUS) or 1.0
    table = [0.0] * (cluster_nodes + 1)
    for size, weight in demand.items():
        nodes = size // gpn
        if size < SLICE_UNIT_GPUS or nodes <= su_capacity:
            continue
        for f in range(cluster_nodes + 1):
            table[f] += weight / total * nodes * (f // nodes)
    return table


# --------------------------------------------------------------------------------------------
# The allocator state
# --------------------------------------------------------------------------------------------


class _Cluster:
    __slots__ = (
        "idx",
        "spec",
        "code",
        "region",
        "model",
        "gpn",
        "slices_ok",
        "su_cap",
        "su_cap_max",
        "su_nodes",
        "su_free",
        "su_ends",
        "free_nodes",
        "value",
        "cvalue",
        "first_gid",
    )

    def __init__(self, idx: int, spec: ClusterSpec, first_gid: int) -> None:
        self.idx = idx
        self.spec = spec
        self.code = spec.code
        self.region = spec.region
        self.model = spec.gpu_model
        self.gpn = spec.gpus_per_node
        self.slices_ok = spec.slices_allowed
        self.su_cap = [su.capacity for su in spec.sus]
        self.su_cap_max = max(self.su_cap)
        self.first_gid = first_gid
        self.su_nodes: list[list[int]] = []
        gid = first_gid
        for su in spec.sus:
            self.su_nodes.append(list(range(gid, gid + su.capacity)))
            gid += su.capacity
        self.su_free: list[list[int]] = [list(ns) for ns in self.su_nodes]
        # lease id -> end time, per SU (for lease-end alignment)
        self.su_ends: list[dict[str, float]] = [{} for _ in spec.sus]
        self.free_nodes = self.spec.node_count
        self.value: list[float] = []
        self.cvalue: list[float] = []


@dataclass
class _Lease:
    placement: Placement
    masks: dict[int, int]  # gid -> GPU mask taken


class SlicePolicy(Protocol):
    name: str

    def choose_slice(
        self, fleet: Fleet, clusters: Sequence[_Cluster], nodes: int, req: Request
    ) -> tuple[_Cluster, dict[int, int]] | None:
        """Return (cluster, {su index: nodes to take}) or None."""

    def choose_host(
        self, fleet: Fleet, clusters: Sequence[_Cluster], gpus: int, req: Request
    ) -> tuple[int, int] | None:
        """Return (gid, GPU mask) or None."""


class Fleet:
    """The allocator's view of the fleet: free GPUs per node, free whole nodes per SU, leases."""

    def __init__(
        self, spec: FleetSpec, demand: Mapping[str, Mapping[int, float]] | None = None
    ) -> None:
        self.spec = spec
        self.clusters: list[_Cluster] = []
        self.node_cluster: list[int] = []
        self.node_su: list[int] = []
        self.node_mask: list[int] = []  # free GPUs
        self.node_ok: list[bool] = []  # schedulable (ready and healthy)
        self.hostnames: list[str] = []
        self.gid_by_hostname: dict[str, int] = {}
        self.leases: dict[str, _Lease] = {}
        self.node_leases: list[set[str]] = []
        gid = 0
        for ci, cspec in enumerate(spec.clusters):
            cl = _Cluster(ci, cspec, gid)
            self.clusters.append(cl)
            full = (1 << cspec.gpus_per_node) - 1
            for si, su in enumerate(cspec.sus):
                for node in su.nodes:
                    self.node_cluster.append(ci)
                    self.node_su.append(si)
                    self.node_mask.append(full)
                    self.node_ok.append(True)
                    self.hostnames.append(node.hostname)
                    if node.hostname in self.gid_by_hostname:
                        raise ValueError(f"duplicate hostname {node.hostname}")
                    self.gid_by_hostname[node.hostname] = gid
                    self.node_leases.append(set())
                    gid += 1
        self.by_model: dict[str, list[_Cluster]] = {}
        for cl in self.clusters:
            self.by_model.setdefault(cl.model, []).append(cl)
        # partly used nodes: (region, model, largest free block) -> heap of (free GPUs, gid)
        self._partial: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
        self._plan_cache: dict[tuple[tuple[int, ...], int, int], tuple[float, tuple[int, ...]]] = {}
        self.set_demand(demand if demand is not None else spec.demand)

    # ---- configuration ------------------------------------------------------------------------

    def set_demand(self, demand: Mapping[str, Mapping[int, float]]) -> None:
        """Demand weights per GPU model and size (GPUs); sizes below 64 are host sizes."""
        self.demand = {m: dict(d) for m, d in demand.items()}
        self._plan_cache.clear()
        for cl in self.clusters:
            d = self.demand.get(cl.model) or DEFAULT_SLICE_DEMAND
            if not any(s >= SLICE_UNIT_GPUS for s in d):
                d = DEFAULT_SLICE_DEMAND
            cl.value = value_table(d, cl.su_cap_max, cl.gpn) if cl.slices_ok else []
            cl.cvalue = (
                spanning_value_table(d, cl.su_cap_max, cl.spec.node_count, cl.gpn)
                if cl.slices_ok
                else []
            )

    # ---- small accessors ------------------------------------------------------------------------

    def cluster_of(self, gid: int) -> _Cluster:
        return self.clusters[self.node_cluster[gid]]

    def candidates(self, model: str, region: str | None) -> list[_Cluster]:
        return [c for c in self.by_model.get(model, ()) if region is None or c.region == region]

    def free_gpus(self, model: str | None = None, region: str | None = None) -> int:
        total = 0
        tables_pop = buddy_tables(8).pop
        for cl in self.clusters:
            if (model and cl.model != model) or (region and cl.region != region):
                continue
            for gid in range(cl.first_gid, cl.first_gid + cl.spec.node_count):
                if self.node_ok[gid]:
                    m = self.node_mask[gid]
                    total += tables_pop[m] if cl.gpn == 8 else _popcount(m)
        return total

    def out_of_service_gpus(self, model: str | None = None, region: str | None = None) -> int:
        """Unleased GPUs on drained, failed or maintenance nodes."""
        total = 0
        for cl in self.clusters:
            if (model and cl.model != model) or (region and cl.region != region):
                continue
            for gid in range(cl.first_gid, cl.first_gid + cl.spec.node_count):
                if not self.node_ok[gid]:
                    total += _popcount(self.node_mask[gid])
        return total

    def is_whole_free(self, gid: int) -> bool:
        cl = self.cluster_of(gid)
        return self.node_ok[gid] and self.node_mask[gid] == (1 << cl.gpn) - 1

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

    def _set_mask(self, gid: int, new: int) -> None:
        cl = self.cluster_of(gid)
        full = (1 << cl.gpn) - 1
        old = self.node_mask[gid]
        if old == new:
            return
        self.node_mask[gid] = new
        if self.node_ok[gid]:
            su_free = cl.su_free[self.node_su[gid]]
            if old == full:
                su_free.pop(bisect.bisect_left(su_free, gid))
                cl.free_nodes -= 1
            elif new == full:
                bisect.insort(su_free, gid)
                cl.free_nodes += 1
        self._push_partial(gid)

    def set_schedulable(self, hostname: str, ok: bool) -> None:
        """Drain (False) or return (True) a node; GPUs already leased stay leased."""
        gid = self.gid_by_hostname[hostname]
        if self.node_ok[gid] == ok:
            return
        cl = self.cluster_of(gid)
        full = (1 << cl.gpn) - 1
        su_free = cl.su_free[self.node_su[gid]]
        if self.node_mask[gid] == full:
            if ok:
                bisect.insort(su_free, gid)
                cl.free_nodes += 1
            else:
                su_free.pop(bisect.bisect_left(su_free, gid))
                cl.free_nodes -= 1
        self.node_ok[gid] = ok
        self._push_partial(gid)

    def _peek_partial(self, region: str, model: str, lfb: int) -> tuple[int, int] | None:
        heap = self._partial.get((region, model, lfb))
        if not heap:
            return None
        t = buddy_tables(self.clusters[self.by_model[model][0].idx].gpn)
        while heap:
            pop, gid = heap[0]
            m = self.node_mask[gid]
            if self.node_ok[gid] and m != t.full and m and t.lfb[m] == lfb and t.pop[m] == pop:
                return pop, gid
            heapq.heappop(heap)
        return None

    # ---- planning ---------------------------------------------------------------------------------

    def validate(self, req: Request) -> Unplaceable | None:
        clusters = self.by_model.get(req.gpu_model)
        if not clusters:
            return Unplaceable(req.id, "no_cluster", f"no cluster has {req.gpu_model} GPUs")
        if req.region is not None and not self.candidates(req.gpu_model, req.region):
            return Unplaceable(
                req.id,
                "no_cluster",
                f"region {req.region} has no {req.gpu_model} GPUs",
            )
        if req.gpus in HOST_SIZES:
            if all(req.gpus > c.gpn for c in self.candidates(req.gpu_model, req.region)):
                return Unplaceable(req.id, "invalid_size", f"{req.gpu_model} nodes have fewer GPUs")
            return None
        if req.gpus % SLICE_UNIT_GPUS or req.gpus <= 0:
            return Unplaceable(
                req.id,
                "invalid_size",
                f"a host has 1, 2, 4 or 8 GPUs and a slice a multiple of {SLICE_UNIT_GPUS}, "
                f"not {req.gpus}",
            )
        fabric = [c for c in self.candidates(req.gpu_model, req.region) if c.slices_ok]
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
                req.id,
                "too_large",
                f"the largest {req.gpu_model} cluster has {biggest} GPUs",
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
            nodes = req.gpus // 8
            clusters = [c for c in clusters if c.slices_ok]
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
            shares: list[NodeShare] = []
            # Rank order: SU by SU (ascending), nodes ascending inside an SU, so NCCL's ring
            # leaves each SU once.
            for su in sorted(take):
                for gid in cl.su_free[su][: take[su]]:
                    shares.append(NodeShare(self.hostnames[gid], tuple(range(cl.gpn)), su, gid))
            return Placement(
                req.id,
                cl.code,
                cl.region,
                cl.model,
                req.gpus,
                tuple(shares),
                su_count=len(take),
                su_min_structural=math.ceil(nodes / cl.su_cap_max),
                su_min_state=state_min,
                ends_at=req.ends_at,
            )
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

    def state_min_sus(self, cl: _Cluster, nodes: int) -> int:
        """Fewest SUs of `cl` that can hold `nodes` now (0 = cannot): the k largest free counts."""
        if cl.free_nodes < nodes:
            return 0
        acc = 0
        for k, f in enumerate(sorted((len(x) for x in cl.su_free), reverse=True), start=1):
            acc += f
            if acc >= nodes:
                return k
        return 0

    def _best_leftover(
        self, fs: tuple[int, ...], r: int, V: Sequence[float]
    ) -> tuple[float, tuple[int, ...]]:
        """Memoised `_leftover_dp`: the same free-count shapes recur all the time."""
        key = (fs, r, id(V))
        got = self._plan_cache.get(key)
        if got is None:
            got = _leftover_dp(fs, r, V)
            if len(self._plan_cache) > 50_000:
                self._plan_cache.clear()
            self._plan_cache[key] = got
        return got

    # ---- commit / release ------------------------------------------------------------------------

    def commit(self, p: Placement) -> None:
        """Take the GPUs of a planned placement (must still be free)."""
        if p.request_id in self.leases:
            raise ValueError(f"lease {p.request_id} already exists")
        masks: dict[int, int] = {}
        for s in p.shares:
            m = 0
            for g in s.gpus:
                m |= 1 << g
            if self.node_mask[s.node_id] & m != m or not self.node_ok[s.node_id]:
                raise ValueError(f"GPUs {s.gpus} of {s.hostname} are not free")
            masks[s.node_id] = m
        for gid, m in masks.items():
            self._set_mask(gid, self.node_mask[gid] & ~m)
            self.node_leases[gid].add(p.request_id)
        if p.ends_at is not None:
            cl = self.clusters[self._cluster_index(p.cluster)]
            for su in {s.su for s in p.shares}:
                cl.su_ends[su][p.request_id] = p.ends_at
        self.leases[p.request_id] = _Lease(p, masks)

    def allocate(self, req: Request, policy: SlicePolicy | None = None) -> Placement | Unplaceable:
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
        cl = self.clusters[self._cluster_index(lease.placement.cluster)]
        for ends in cl.su_ends:
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
        n = sum(len(s.gpus) for s in shares)
        p = Placement(
            lease_id,
            cl.code,
            cl.region,
            cl.model,
            n,
            tuple(shares),
            len({s.su for s in shares}),
            math.ceil(len(shares) / cl.su_cap_max),
            0,
            ends_at,
        )
        self.commit(p)
        return p

    def _cluster_index(self, code: str) -> int:
        for cl in self.clusters:
            if cl.code == code:
                return cl.idx
        raise KeyError(code)

    # ---- explanations --------------------------------------------------------------------------

    def explain(self, req: Request, policy: SlicePolicy | None = None) -> Unplaceable | None:
        """Why `req` cannot be placed now, when it could be (from lease ends) and what else fits."""
        got = self.plan(req, policy)
        if isinstance(got, Placement):
            return None
        if got.code == "invalid_size":
            return got
        return Unplaceable(
            req.id,
            got.code,
            got.reason,
            earliest=self.earliest_start(req) if got.code == "no_capacity" else None,
            alternatives=self._alternatives(req),
        )

    def earliest_start(self, req: Request, structural: bool = False) -> float | None:
        """First known lease end after which `req` fits (at its structural SU minimum if asked)."""
        clusters = self.candidates(req.gpu_model, req.region)
        if req.is_slice:
            clusters = [c for c in clusters if c.slices_ok]
        codes = {c.code for c in clusters}
        ends = sorted(
            (lease.placement.ends_at, lid)
            for lid, lease in self.leases.items()
            if lease.placement.cluster in codes and lease.placement.ends_at is not None
        )
        if not ends:
            return None
        if req.is_slice:
            nodes = req.gpus // 8
            free = {c.code: [len(x) for x in c.su_free] for c in clusters}
            for t, lid in ends:
                lease = self.leases[lid]
                cl = self.clusters[self._cluster_index(lease.placement.cluster)]
                for gid, m in lease.masks.items():
                    if self.node_ok[gid] and (self.node_mask[gid] | m) == (1 << cl.gpn) - 1:
                        free[cl.code][self.node_su[gid]] += 1
                counts = sorted(free[cl.code], reverse=True)
                need = math.ceil(nodes / cl.su_cap_max) if structural else len(counts)
                if sum(counts[:need]) >= nodes:
                    return t
            return None
        masks: dict[int, int] = {}
        for t, lid in ends:
            lease = self.leases[lid]
            for gid, m in lease.masks.items():
                cl = self.cluster_of(gid)
                cur = masks.get(gid, self.node_mask[gid]) | m
                masks[gid] = cur
                if self.node_ok[gid] and buddy_tables(cl.gpn).lfb[cur] >= req.gpus:
                    return t
        return None

    def _alternatives(self, req: Request, limit: int = 6) -> tuple[Alternative, ...]:
        out: list[Alternative] = []

        def fits(gpus: int, model: str, region: str | None) -> Placement | None:
            r = Request(req.id, gpus, model, region, req.now, req.ends_at)
            if self.validate(r) is not None:
                return None
            got = self.plan(r)
            return got if isinstance(got, Placement) else None

        if req.region is not None:
            for region in sorted({c.region for c in self.by_model.get(req.gpu_model, ())}):
                if region != req.region and (p := fits(req.gpus, req.gpu_model, region)):
                    out.append(Alternative("region", region, req.gpu_model, req.gpus, p.cluster))
        for model in sorted(self.by_model):
            if model != req.gpu_model and (p := fits(req.gpus, model, req.region)):
                out.append(Alternative("gpu_model", p.region, model, req.gpus, p.cluster))
        smaller = (
            range(req.gpus - SLICE_UNIT_GPUS, 0, -SLICE_UNIT_GPUS)
            if req.is_slice
            else [s for s in reversed(HOST_SIZES) if s < req.gpus]
        )
        for size in smaller:
            if p := fits(size, req.gpu_model, req.region):
                out.append(Alternative("size", p.region, req.gpu_model, size, p.cluster))
                break
        return tuple(out[:limit])

    # ---- metrics ----------------------------------------------------------------------------------

    def stranded_gpus(self, model: str, slice_nodes: int | None, host_sizes: Sequence[int]) -> int:
        """Free GPUs of `model` no demanded request size can use at its structural minimum."""
        stranded = 0
        min_host = min(host_sizes) if host_sizes else None
        for cl in self.by_model.get(model, ()):
            t = buddy_tables(cl.gpn)
            for su, nodes in enumerate(cl.su_nodes):
                whole = len(cl.su_free[su])
                usable_whole = min_host is not None or (
                    slice_nodes is not None
                    and cl.slices_ok
                    and whole >= min(slice_nodes, cl.su_cap_max)
                )
                if not usable_whole:
                    stranded += whole * cl.gpn
                for gid in nodes:
                    m = self.node_mask[gid]
                    if not self.node_ok[gid] or m == t.full or m == 0:
                        continue
                    if min_host is None or t.lfb[m] < min_host:
                        stranded += t.pop[m]
        return stranded

    def placeable_gpus(self, model: str, gpus: int) -> int:
        """GPUs that requests of one size could still get, each at its structural SU minimum."""
        total = 0
        for cl in self.by_model.get(model, ()):
            if gpus < SLICE_UNIT_GPUS:
                t = buddy_tables(cl.gpn)
                for gid in range(cl.first_gid, cl.first_gid + cl.spec.node_count):
                    if self.node_ok[gid] and gpus <= cl.gpn:
                        m = self.node_mask[gid]
                        # free aligned blocks of the size
                        total += gpus * sum(
                            1
                            for st in range(0, cl.gpn, gpus)
                            if (m >> st) & ((1 << gpus) - 1) == (1 << gpus) - 1
                        )
                del t
                continue
            if not cl.slices_ok:
                continue
            total += (
                structural_packing([len(x) for x in cl.su_free], gpus // cl.gpn, cl.su_cap_max)
                * cl.gpn
            )
        return total


def structural_packing(free: Sequence[int], nodes: int, su_capacity: int) -> int:
    """Nodes that slices of `nodes` can take from SUs with `free` nodes, each slice on
    ceil(nodes / su_capacity) SUs (greedy: largest SUs first, tightest last)."""
    q = math.ceil(nodes / su_capacity)
    counts = sorted(free, reverse=True)
    placed = 0
    while True:
        counts.sort(reverse=True)
        if sum(counts[:q]) < nodes:
            return placed
        need = nodes
        for i in range(q):
            take = min(counts[i], need)
            # the last SU: take the tightest that fits the remainder
            counts[i] -= take
            need -= take
            if need == 0:
                break
        placed += nodes


# --------------------------------------------------------------------------------------------
# The project's policy
# --------------------------------------------------------------------------------------------


def _align(cl: _Cluster, su: int, req: Request) -> float:
    """Distance between the SU's latest lease end and the new lease's end (smaller is better)."""
    if req.ends_at is None:
        return 0.0
    ends = cl.su_ends[su]
    if not ends:
        return float(max(req.ends_at - req.now, 0.0)) + 1e12  # an empty SU aligns with nothing
    return abs(max(ends.values()) - req.ends_at)


class TopologyAwarePolicy:
    """Minimal SUs, least demand-weighted loss, best fit, lease-end alignment, lowest index."""

    name = "ours"

    def choose_slice(
        self, fleet: Fleet, clusters: Sequence[_Cluster], nodes: int, req: Request
    ) -> tuple[_Cluster, dict[int, int]] | None:
        best_key: tuple[Any, ...] | None = None
        best: tuple[_Cluster, dict[int, int]] | None = None
        ks = [(fleet.state_min_sus(cl, nodes), cl) for cl in clusters]
        kmin = min((k for k, _ in ks if k), default=0)
        if not kmin:
            return None
        for k, cl in ks:
            if k != kmin:
                continue
            got = self._in_cluster(fleet, cl, nodes, k, req)
            # Across clusters the SU-spanning sizes count too: 8 nodes taken from a cluster with
            # 64 free destroy its only 512-card slice, from one with 200 free they destroy none.
            spanning = cl.cvalue[cl.free_nodes] - cl.cvalue[cl.free_nodes - nodes]
            loss, fit, align = got[0]
            key = (round(loss + spanning, 9), fit, align, cl.idx)
            if best_key is None or key < best_key:
                best_key, best = key, (cl, got[1])
        return best

    def _in_cluster(
        self, fleet: Fleet, cl: _Cluster, nodes: int, k: int, req: Request
    ) -> tuple[tuple[Any, ...], dict[int, int]]:
        V = cl.value
        free = [len(x) for x in cl.su_free]
        best_key: tuple[Any, ...] | None
        if k == 1:
            best_key = None
            best_su = -1
            for su, f in enumerate(free):
                if f < nodes:
                    continue
                key = (round(V[f] - V[f - nodes], 9), f, _align(cl, su, req), su)
                if best_key is None or key < best_key:
                    best_key, best_su = key, su
            assert best_key is not None
            return best_key[:3], {best_su: nodes}
        # group SUs by free count; inside a group the best aligned (then lowest index) come first
        groups: dict[int, list[tuple[float, int]]] = {}
        for su, f in enumerate(free):
            if f:
                groups.setdefault(f, []).append((_align(cl, su, req), su))
        for g in groups.values():
            g.sort()
        values = sorted(groups, reverse=True)
        best_key = None
        best_take: dict[int, int] = {}
        for combo in _multisets(values, [len(groups[v]) for v in values], k, nodes):
            fs = tuple(sorted(combo, reverse=True))
            total = sum(fs)
            loss, lefts = fleet._best_leftover(fs, total - nodes, V)
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

    def choose_host(
        self, fleet: Fleet, clusters: Sequence[_Cluster], gpus: int, req: Request
    ) -> tuple[int, int] | None:
        regions = sorted({c.region for c in clusters})
        model = req.gpu_model
        gpn = max(c.gpn for c in clusters)
        t = buddy_tables(gpn)
        # 1. best fit among partly used nodes: smallest largest-free-block, then fewest free GPUs
        size = gpus
        while size < gpn:
            best = None
            for region in regions:
                got = fleet._peek_partial(region, model, size)
                if got is not None and (best is None or got < best):
                    best = got
            if best is not None:
                gid = best[1]
                return gid, t.best[fleet.node_mask[gid]][gpus]
            size *= 2
        # 2. break a whole node where it costs the least slice capacity, tightest SU first
        best_key = None
        best_gid = -1
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
                key = (round(loss, 9), f, cl.idx, su)
                if best_key is None or key < best_key:
                    best_key, best_gid = key, free[0]
        if best_key is None:
            return None
        return best_gid, t.best[fleet.node_mask[best_gid]][gpus]


def _multisets(
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


def _leftover_dp(fs: tuple[int, ...], r: int, V: Sequence[float]) -> tuple[float, tuple[int, ...]]:
    """Split `r` free nodes to keep among SUs with free counts `fs` (each gives ≥ 1 node) so the
    kept value is largest; returns (loss, nodes kept per SU)."""
    n = len(fs)
    neg = float("-inf")
    # best[i][x] = max value keeping x nodes among the first i SUs
    best = [[neg] * (r + 1) for _ in range(n + 1)]
    choice = [[0] * (r + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for i, f in enumerate(fs):
        row, nxt, ch = best[i], best[i + 1], choice[i + 1]
        for x in range(r + 1):
            if row[x] == neg:
                continue
            for left in range(min(f - 1, r - x) + 1):
                v = row[x] + V[left]
                if v > nxt[x + left] + 1e-12:
                    nxt[x + left] = v
                    ch[x + left] = left
    if best[n][r] == neg:
        return float("inf"), tuple(0 for _ in fs)
    lefts = []
    x = r
    for i in range(n, 0, -1):
        left = choice[i][x]
        lefts.append(left)
        x -= left
    lefts.reverse()
    loss = sum(V[f] for f in fs) - best[n][r]
    return loss, tuple(lefts)


OURS = TopologyAwarePolicy()


def gpu_model_key(name: str) -> str:
    """One key for a GPU model however it is written: the fleet's code ("RTX4090") and the price
    book's product name ("RTX 4090") both reduce to "RTX4090"."""
    return "".join(name.split()).upper()
