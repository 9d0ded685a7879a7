"""The allocator's per-cluster state: free whole nodes per SU, lease ends per SU, value tables."""

from __future__ import annotations

from dataclasses import dataclass

from slices.topology.placement import Placement
from slices.topology.specs import ClusterSpec


class ClusterState:
    """One cluster as the allocator sees it. Nodes have fleet-wide ids (gids), consecutive per
    cluster and SU by SU; `su_free[su]` is the sorted list of free whole nodes of the SU."""

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
        # demand-weighted capacity of f free nodes of an SU (value) and of the cluster (cvalue);
        # empty where slices are not allowed
        self.value: list[float] = []
        self.cvalue: list[float] = []

    @property
    def gids(self) -> range:
        """The cluster's node ids."""
        return range(self.first_gid, self.first_gid + self.spec.node_count)

    @property
    def full_mask(self) -> int:
        return (1 << self.gpn) - 1

    def su_free_counts(self) -> list[int]:
        return [len(x) for x in self.su_free]


@dataclass
class Lease:
    placement: Placement
    masks: dict[int, int]  # gid -> GPU mask taken
