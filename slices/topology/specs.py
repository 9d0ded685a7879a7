"""The fleet description: what the fleet file (or the database) says the fleet is made of."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

SLICE_UNIT_GPUS = 64
HOST_SIZES = (1, 2, 4, 8)
FABRIC_ETHERNET = "ethernet"
# Default slice demand (GPUs -> weight) when the fleet file gives none for a model.
DEFAULT_SLICE_DEMAND: Mapping[int, float] = {64: 0.5, 128: 0.3, 256: 0.2}


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
    runtime: str = ""  # docker | enroot | process; "" = SLICES_NODE_RUNTIME (the nodes' layout)
    single_tenant: bool = False  # one tenant at a time (test hosts): a bare process may run

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
class GatewaySpec:
    """A region's SSH gateway (jump host) from the fleet file (``slices.models.Gateway``)."""

    host: str  # public name customers reach
    port: int
    user: str  # the jump user
    address: str  # the console's management address
    ssh_port: int
    host_key: str  # pinned: SHA256:<base64> or the host key line
    keys_file: str  # the jump user's authorized_keys, written by the console
    # "<low>-<high>": the gateway forwards these public ports, one per instance for its life,
    # to wherever the instance runs now (slices/agent/gateway_forward.py); "" = none (issue 29).
    ports: str = ""


@dataclass(frozen=True)
class RegionSpec:
    code: str
    name: str
    name_zh: str = ""
    gateway: GatewaySpec | None = None


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
