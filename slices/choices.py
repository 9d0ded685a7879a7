from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Fabric(models.TextChoices):
    IB_HDR = "ib-hdr", _("InfiniBand HDR 200 Gb/s fat tree")
    IB_NDR = "ib-ndr", _("InfiniBand NDR 400 Gb/s fat tree")
    ETHERNET = "ethernet", _("Ethernet (single-node hosts)")


class NodeState(models.TextChoices):
    READY = "ready", _("Ready")
    ALLOCATED = "allocated", _("Allocated")
    DRAINING = "draining", _("Draining")
    FAILED = "failed", _("Failed")
    MAINTENANCE = "maintenance", _("Maintenance")


NODE_STATE_BADGES = {
    NodeState.READY: "success",
    NodeState.ALLOCATED: "primary",
    NodeState.DRAINING: "warning",
    NodeState.FAILED: "danger",
    NodeState.MAINTENANCE: "secondary",
}
# New GPUs are only given out on these states (and healthy nodes).
SCHEDULABLE_STATES = (NodeState.READY, NodeState.ALLOCATED)


class NodeHealth(models.TextChoices):
    OK = "ok", _("Healthy")
    DEGRADED = "degraded", _("Degraded")
    UNREACHABLE = "unreachable", _("Unreachable")


NODE_HEALTH_BADGES = {
    NodeHealth.OK: "success",
    NodeHealth.DEGRADED: "warning",
    NodeHealth.UNREACHABLE: "danger",
}


class AllocationKind(models.TextChoices):
    HOST = "host", _("GPU cloud host")
    SLICE = "slice", _("Cluster slice")


class AllocationState(models.TextChoices):
    ACTIVE = "active", _("Active")
    RELEASED = "released", _("Released")


ALLOCATION_STATE_BADGES = {
    AllocationState.ACTIVE: "primary",
    AllocationState.RELEASED: "secondary",
}
