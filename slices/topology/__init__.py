"""The topology-aware allocator (pure Python, no Django).

Vocabulary
    Cluster        one fabric: an InfiniBand rail-optimised fat-tree (HDR/NDR) or plain Ethernet.
    Scalable unit  (SU) the nodes whose rail-r HCAs share one rail-r leaf switch; two nodes of one SU
                   are one switch hop apart on every rail, nodes of two SUs three (leaf-spine-leaf).
    Host           1, 2, 4 or 8 GPUs of one node (GPU cloud host).
    Slice          a multiple of 64 GPUs made of whole 8-GPU nodes of one cluster (cluster slice).

Single-node hosts use a buddy scheme (`buddy`): a request for k GPUs takes an aligned block of k
GPUs from the node whose largest free aligned block is the smallest that fits (best fit), so partly
used nodes fill up first and whole nodes stay whole for slices. When a whole node has to be broken,
it is taken where that destroys the least slice capacity (`capacity`).

Slices are placed on exactly the minimum number of SUs the current free state allows (the k largest
free counts decide it); among those placements the allocator picks the one that destroys the least
demand-weighted placeable capacity, then the tightest fit, then the SUs whose leases end nearest to
the new lease's end, then the lowest SU indexes (deterministic). Ranks in the hostfile follow SUs, so
NCCL's ring crosses the spine as few times as possible (`policy`).

Modules: `specs` (the fleet description), `placement` (requests and answers), `buddy` (per-node
tables), `capacity` (demand-weighted capacity tables), `cluster` and `fleet` (the state, planning,
commit and release), `policy` (the policy interface and the project's policy), `explain` (why not,
when, what else).
"""

from __future__ import annotations

from slices.topology.buddy import (
    BuddyTables,
    aligned_block,
    buddy_tables,
    gpu_indexes,
    gpu_mask,
    popcount,
)
from slices.topology.capacity import (
    leftover_split,
    min_sus,
    slice_chunk,
    spanning_value_table,
    structural_packing,
    value_table,
)
from slices.topology.cluster import ClusterState, Lease
from slices.topology.fleet import Fleet
from slices.topology.placement import Alternative, NodeShare, Placement, Request, Unplaceable
from slices.topology.policy import (
    OURS,
    HostChoice,
    SliceChoice,
    SlicePolicy,
    TopologyAwarePolicy,
    lease_end_distance,
)
from slices.topology.specs import (
    DEFAULT_SLICE_DEMAND,
    FABRIC_ETHERNET,
    HOST_SIZES,
    SLICE_UNIT_GPUS,
    ClusterSpec,
    FleetSpec,
    GatewaySpec,
    GpuModelSpec,
    NodeSpec,
    RegionSpec,
    ScalableUnitSpec,
)

__all__ = [
    "DEFAULT_SLICE_DEMAND",
    "FABRIC_ETHERNET",
    "HOST_SIZES",
    "OURS",
    "SLICE_UNIT_GPUS",
    "Alternative",
    "BuddyTables",
    "ClusterSpec",
    "ClusterState",
    "Fleet",
    "FleetSpec",
    "GatewaySpec",
    "GpuModelSpec",
    "HostChoice",
    "Lease",
    "NodeShare",
    "NodeSpec",
    "Placement",
    "RegionSpec",
    "Request",
    "ScalableUnitSpec",
    "SliceChoice",
    "SlicePolicy",
    "TopologyAwarePolicy",
    "Unplaceable",
    "aligned_block",
    "buddy_tables",
    "gpu_indexes",
    "gpu_mask",
    "lease_end_distance",
    "leftover_split",
    "min_sus",
    "popcount",
    "slice_chunk",
    "spanning_value_table",
    "structural_packing",
    "value_table",
]
