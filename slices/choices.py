from __future__ import annotations

import re

from django.db import models
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy


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


class InstanceState(models.TextChoices):
    PENDING = "pending", _("Pending")
    ALLOCATING = "allocating", _("Allocating")
    PROVISIONING = "provisioning", _("Provisioning")
    RUNNING = "running", _("Running")
    RELEASING = "releasing", _("Releasing")
    RELEASED = "released", _("Released")
    FAILED = "failed", _("Failed")
    STOPPING = "stopping", _("Stopping")
    STOPPED = "stopped", _("Stopped")
    STARTING = "starting", _("Starting")
    MIGRATING = "migrating", _("Migrating")
    # 排队: ordered with "when unavailable: queue"; holds no GPUs and costs nothing until it starts.
    QUEUED = "queued", _("Queued")


INSTANCE_STATE_BADGES = {
    InstanceState.PENDING: "secondary",
    InstanceState.ALLOCATING: "info",
    InstanceState.PROVISIONING: "info",
    InstanceState.RUNNING: "success",
    InstanceState.RELEASING: "warning",
    InstanceState.RELEASED: "secondary",
    InstanceState.FAILED: "danger",
    InstanceState.STOPPING: "warning",
    InstanceState.STOPPED: "secondary",
    InstanceState.STARTING: "info",
    InstanceState.MIGRATING: "warning",
    InstanceState.QUEUED: "info",
}


class ReservationState(models.TextChoices):
    """A booked window (预约): paid and held, then started as an instance at its time."""

    BOOKED = "booked", pgettext_lazy("reservation state", "Booked")
    DELAYED = "delayed", pgettext_lazy("reservation state", "Delayed")
    STARTED = "started", pgettext_lazy("reservation state", "Started")
    ENDED = "ended", pgettext_lazy("reservation state", "Ended")
    CANCELLED = "cancelled", pgettext_lazy("reservation state", "Cancelled")
    MISSED = "missed", pgettext_lazy("reservation state", "Not started (refunded)")


# Windows that still hold their pins in the allocator's plan (not yet an instance).
RESERVATION_HOLDING = (ReservationState.BOOKED, ReservationState.DELAYED)

RESERVATION_STATE_BADGES = {
    ReservationState.BOOKED: "primary",
    ReservationState.DELAYED: "warning",
    ReservationState.STARTED: "success",
    ReservationState.ENDED: "secondary",
    ReservationState.CANCELLED: "secondary",
    ReservationState.MISSED: "danger",
}


class DiskState(models.TextChoices):
    AVAILABLE = "available", _("Available")
    DELETED = "deleted", _("Deleted")


class DiskMode(models.TextChoices):
    READ_WRITE = "rw", _("Read-write")
    READ_ONLY = "ro", _("Read-only")


class NodeSignal(models.TextChoices):
    """What a node's agent or the console noticed (node health; README "Storage and resilience")."""

    HEARTBEAT = "heartbeat", _("Heartbeat")
    XID = "xid", _("GPU Xid error")
    NVML = "nvml", _("NVML failure")
    SSH_LOST = "ssh_lost", _("SSH lost")
    RECOVERED = "recovered", _("Recovered")


class NoReplacement(models.TextChoices):
    """What a migrating instance does when no replacement node is free (the user's choice)."""

    WAIT = "wait", _("Wait for a node")
    RELEASE = "release", _("Release the instance")


class EventKind(models.TextChoices):
    STATE = "state", _("State change")
    STEP = "step", _("Provisioning step")
    LOG = "log", _("Log")
    ERROR = "error", _("Error")


class EventLevel(models.TextChoices):
    INFO = "info", _("Info")
    WARNING = "warning", _("Warning")
    ERROR = "error", _("Error")


_PRODUCT_NAME = re.compile(r"^([A-Za-z]{2,})(\d{3,}\w*)$")


def gpu_product_name(code: str) -> str:
    """How people write a GPU model ("RTX 4090") from its fleet code ("RTX4090"); others as is."""
    m = _PRODUCT_NAME.match(code or "")
    return f"{m.group(1)} {m.group(2)}" if m else code


class Scheduler(models.TextChoices):
    """What runs a slice's jobs (issue 31): its own Slurm, or nothing (plain nodes)."""

    NONE = "none", _("None (plain nodes)")
    SLURM = "slurm", _("Slurm")


class JobGroup(models.TextChoices):
    """A Slurm job as the console groups Slurm's states (``slices.slurmconf.STATE_GROUPS``)."""

    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")


JOB_GROUP_BADGES: dict[JobGroup, str] = {
    JobGroup.QUEUED: "secondary",
    JobGroup.RUNNING: "primary",
    JobGroup.DONE: "success",
}
