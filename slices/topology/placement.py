"""Requests and the allocator's answers: a placement, or why there is none."""

from __future__ import annotations

from dataclasses import dataclass

from slices.topology.specs import SLICE_UNIT_GPUS


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
