"""The slices app's models, one module per noun (re-exported here for `from slices.models import X`)."""

from __future__ import annotations

from slices.models.allocations import Allocation, AllocationNode
from slices.models.disks import Disk, DiskAttachment, NodeFailure, NodeWatch, PfsUsage
from slices.models.fleet import (
    GPU,
    Cluster,
    FleetVersion,
    Gateway,
    GpuModel,
    Node,
    Region,
    ScalableUnit,
    SpineGroup,
)
from slices.models.instances import (
    GpuQuota,
    Instance,
    InstanceEvent,
    InstanceNode,
    PortGrant,
    ShareLink,
)
from slices.models.reservation import Reservation
from slices.models.slurm import SlurmCluster, SlurmJob
from slices.models.telemetry import GpuRollup, IdleWatch

__all__ = [
    "SlurmCluster",
    "SlurmJob",
    "GPU",
    "Allocation",
    "AllocationNode",
    "Cluster",
    "Disk",
    "DiskAttachment",
    "FleetVersion",
    "Gateway",
    "GpuModel",
    "GpuQuota",
    "GpuRollup",
    "IdleWatch",
    "Instance",
    "InstanceEvent",
    "InstanceNode",
    "Node",
    "NodeFailure",
    "NodeWatch",
    "PfsUsage",
    "Region",
    "Reservation",
    "ScalableUnit",
    "PortGrant",
    "ShareLink",
    "SpineGroup",
]
