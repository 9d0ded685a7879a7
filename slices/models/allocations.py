"""GPU allocations: what a customer holds, written only by `slices.services`."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from slices.choices import (
    ALLOCATION_STATE_BADGES,
    AllocationKind,
    AllocationState,
)
from slices.models.fleet import Cluster, GpuModel, Node
from slices.querysets import AllocationQuerySet


class Allocation(models.Model):
    """GPUs held for one customer: a single-node host or a multi-node cluster slice."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    team = models.ForeignKey(
        "console.Team", on_delete=models.PROTECT, related_name="gpu_allocations"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="gpu_allocations"
    )
    kind = models.CharField(_("kind"), max_length=8, choices=AllocationKind.choices)
    state = models.CharField(
        _("state"), max_length=10, choices=AllocationState.choices, default=AllocationState.ACTIVE
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="allocations")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="allocations")
    gpu_count = models.PositiveIntegerField(_("GPUs"))
    node_count = models.PositiveIntegerField(_("nodes"))
    su_count = models.PositiveSmallIntegerField(_("SUs"))
    su_min_structural = models.PositiveSmallIntegerField(_("fewest SUs possible"))
    su_min_state = models.PositiveSmallIntegerField(_("fewest SUs free at allocation"))
    hostfile = models.TextField(_("hostfile"), blank=True)
    performance = models.JSONField(_("expected NCCL performance"), default=dict, blank=True)
    label = models.CharField(_("label"), max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    ends_at = models.DateTimeField(_("lease ends"), null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    objects = AllocationQuerySet.as_manager()

    class Meta:
        verbose_name = _("GPU allocation")
        verbose_name_plural = _("GPU allocations")
        ordering = ("-created_at", "-id")
        indexes = (models.Index(fields=("state", "cluster"), name="slices_alloc_state_cluster"),)

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.gpu_count}× {self.gpu_model_id} ({self.public_id})"

    @property
    def state_badge(self) -> str:
        return ALLOCATION_STATE_BADGES[AllocationState(self.state)]

    @property
    def short_id(self) -> str:
        return str(self.public_id)[:8]


class AllocationNode(models.Model):
    """The GPUs an allocation holds on one node, in hostfile (rank) order."""

    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, related_name="nodes")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocation_parts")
    rank = models.PositiveIntegerField(_("node rank"))
    gpu_mask = models.PositiveIntegerField(_("GPU mask"))

    class Meta:
        ordering = ("allocation", "rank")
        constraints = (
            models.UniqueConstraint(fields=("allocation", "node"), name="slices_allocnode_unique"),
        )

    def __str__(self) -> str:
        return f"{self.allocation_id}#{self.rank}"
