"""Expected NCCL all-reduce performance of a placement: an α–β model (pure Python, no Django).

Bandwidth (large messages). A ring all-reduce of S bytes over n ranks moves 2(n−1)/n·S bytes through
every rank, so nccl-tests reports busbw = algbw·2(n−1)/n with algbw = S/t, and busbw is the bandwidth
of the slowest link class the ring crosses:
  * inside a node: NVLink (or PCIe for cards without NVLink);
  * between nodes: NCCL runs one channel per rail, every channel enters and leaves each node once
    through its own HCA, so a node sustains rails × ~24 GB/s (HDR 200 Gb/s after encoding and
    headers). In a non-blocking fat tree this does not depend on how many SUs the slice spans.

Latency (small messages). NCCL's tuning model for the tree algorithm with the LL protocol
(src/graph/tuning.cc): base + 2·((g−1)·intra + ⌈log2 N⌉·inter), where `inter` grows with switch hops
(one leaf inside an SU, leaf–spine–leaf across SUs). Fabric one-way latency is reported separately:
HCA + switch hops.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# Effective per-rail bandwidth in GB/s by fabric (HDR 200 Gb/s ≈ 24 GB/s measured by nccl-tests).
RAIL_GBPS = {"ib-hdr": 24.0, "ib-ndr": 48.0, "ethernet": 10.0}
NVLINK_EFFICIENCY = 0.8  # share of NVLink's unidirectional bandwidth a ring sustains
PCIE_BUSBW = 12.0  # GB/s, PCIe 4.0 x16 cards without NVLink (peer traffic through the host)
SWITCH_HOP_US = 0.13  # HDR/NDR switch port-to-port
HCA_US = 0.6  # send + receive HCA/PCIe/GPUDirect path, one side
# NCCL tuning model constants (tree algorithm, LL protocol), microseconds.
NCCL_BASE_LAT_US = 6.8
NCCL_INTRA_LAT_US = 0.6
NCCL_NET_LAT_US = 5.0


@dataclass(frozen=True)
class Performance:
    nodes: int
    gpus: int
    su_count: int
    busbw_gbps: float  # GB/s, large-message all-reduce bus bandwidth
    algbw_gbps: float
    allreduce_small_us: float  # 8-byte all-reduce latency (NCCL tree/LL model)
    fabric_latency_us: float  # one-way GPU-to-GPU across the fabric (0 inside one node)
    efficiency: float  # busbw relative to one node of the same model

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def intra_node_busbw(nvlink_gbps: float) -> float:
    return nvlink_gbps * NVLINK_EFFICIENCY if nvlink_gbps else PCIE_BUSBW


def expected_performance(
    nodes: int,
    gpus_per_node: int,
    su_count: int,
    *,
    fabric: str = "ib-hdr",
    rails: int = 8,
    nvlink_gbps: float = 200.0,
) -> Performance:
    """α–β estimate for an all-reduce over `nodes` × `gpus_per_node` ranks spanning `su_count` SUs."""
    n = nodes * gpus_per_node
    intra = intra_node_busbw(nvlink_gbps) if gpus_per_node > 1 else 0.0
    if nodes <= 1:
        busbw = intra
        fabric_us = 0.0
        inter_lat = 0.0
    else:
        inter = rails * RAIL_GBPS.get(fabric, 10.0)
        busbw = min(intra, inter) if intra else inter
        hops = 1 if su_count <= 1 else 3
        fabric_us = 2 * HCA_US + hops * SWITCH_HOP_US
        inter_lat = NCCL_NET_LAT_US + (hops - 1) * SWITCH_HOP_US
    factor = 2 * (n - 1) / n if n > 1 else 1.0
    algbw = busbw / factor if busbw else 0.0
    small = NCCL_BASE_LAT_US + 2 * (
        (gpus_per_node - 1) * NCCL_INTRA_LAT_US + math.ceil(math.log2(max(nodes, 1))) * inter_lat
    )
    return Performance(
        nodes=nodes,
        gpus=n,
        su_count=su_count,
        busbw_gbps=round(busbw, 1),
        algbw_gbps=round(algbw, 1),
        allreduce_small_us=round(small, 1),
        fabric_latency_us=round(fabric_us, 2),
        efficiency=round(busbw / intra, 3) if intra else 1.0,
    )


def allreduce_time_us(perf: Performance, message_bytes: int) -> float:
    """T(S) = α + S·2(n−1)/n / busbw — the α–β curve between the two regimes."""
    if perf.gpus <= 1 or not perf.busbw_gbps:
        return 0.0
    factor = 2 * (perf.gpus - 1) / perf.gpus
    return perf.allreduce_small_us + message_bytes * factor / (perf.busbw_gbps * 1e3)
