"""Storage and node health: persistent cloud disks and where they are attached, each account's
measured parallel-file-system usage, and the health watch of each node.

Rows are written only by ``slices.services.disks``, ``slices.services.storage`` and
``slices.services.migration``.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from console.querysets import TeamOwnedQuerySet
from slices.choices import DiskMode, DiskState, NodeSignal
from slices.models.fleet import Node, Region
from slices.models.instances import Instance


class DiskQuerySet(TeamOwnedQuerySet):
    def live(self) -> DiskQuerySet:
        return self.filter(state=DiskState.AVAILABLE)


class Disk(models.Model):
    """A persistent cloud disk in one region: outlives instances, attachable to several at once."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    team = models.ForeignKey("console.Team", on_delete=models.PROTECT, related_name="disks")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="disks"
    )
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="disks")
    name = models.CharField(_("name"), max_length=63)
    size_gb = models.PositiveIntegerField(_("size (GB)"))
    state = models.CharField(
        _("state"), max_length=10, choices=DiskState.choices, default=DiskState.AVAILABLE
    )
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    objects = DiskQuerySet.as_manager()

    class Meta:
        verbose_name = _("cloud disk")
        verbose_name_plural = _("cloud disks")
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"{self.name} ({self.size_gb} GB)"

    @property
    def short_id(self) -> str:
        return str(self.public_id)[:8]

    @property
    def mount_path(self) -> str:
        """Where the disk appears in an instance: /data/<short id> (never the user's free text)."""
        return f"/data/disk-{self.short_id}"


class DiskAttachment(models.Model):
    """One disk attached to one instance (read-write or read-only) until ``detached_at``."""

    disk = models.ForeignKey(Disk, on_delete=models.PROTECT, related_name="attachments")
    instance = models.ForeignKey(
        Instance, on_delete=models.CASCADE, related_name="disk_attachments"
    )
    mode = models.CharField(
        _("mode"), max_length=2, choices=DiskMode.choices, default=DiskMode.READ_WRITE
    )
    attached_at = models.DateTimeField(auto_now_add=True)
    detached_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("disk", "attached_at", "id")
        constraints = (
            models.UniqueConstraint(
                fields=("disk", "instance"),
                condition=Q(detached_at__isnull=True),
                name="slices_disk_attached_once",
            ),
        )

    def __str__(self) -> str:
        return f"{self.disk_id}→{self.instance_id} ({self.mode})"


class PfsUsage(models.Model):
    """One team's directory on the parallel file system: last measured size and its quota."""

    team = models.OneToOneField("console.Team", on_delete=models.CASCADE, related_name="pfs_usage")
    used_bytes = models.BigIntegerField(_("used (bytes)"), default=0)
    files = models.PositiveIntegerField(_("files"), default=0)
    quota_gb = models.PositiveIntegerField(_("quota (GB)"), null=True, blank=True)
    measured_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("parallel file system usage")
        verbose_name_plural = _("parallel file system usage")

    def __str__(self) -> str:
        return f"{self.team}: {self.used_bytes} B"


class NodeWatch(models.Model):
    """A node's health as its agent and the console see it: the last heartbeat and the first bad
    signal not yet cleared. After the grace the node is marked failed (it leaves the pool).

    A heartbeat comes from the node only (SECURITY.md "Node health"): the driver's probe answered
    (``probe``), its agent reported one (``agent``) or a start's steps on it just succeeded
    (``start``); never an instance's GPU samples. ``last_probe_at``/``probe_error``/``misses``: the
    console's last probe of it, its error ("" when it answered) and the failed probes in a row."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="watch")
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    heartbeat_source = models.CharField(max_length=10, blank=True)
    last_probe_at = models.DateTimeField(null=True, blank=True)
    probe_error = models.CharField(max_length=255, blank=True)
    misses = models.PositiveIntegerField(default=0)
    bad_since = models.DateTimeField(null=True, blank=True)
    bad_signal = models.CharField(max_length=10, choices=NodeSignal.choices, blank=True)
    bad_detail = models.CharField(max_length=255, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("node health watch")
        verbose_name_plural = _("node health watches")

    def __str__(self) -> str:
        return f"{self.node_id}: {self.bad_signal or 'ok'}"


class NodeFailure(models.Model):
    """One time a node was marked failed, and why: the signal, the evidence the console judged on
    (``evidence``: the heartbeat, the probes, the graces, the instances moved), whether the console
    did it (``automatic``) or an operator, and when the node was returned to service."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="failures")
    at = models.DateTimeField()
    automatic = models.BooleanField(default=True)
    signal = models.CharField(max_length=10, blank=True)
    detail = models.CharField(max_length=255, blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    returned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("node failure")
        verbose_name_plural = _("node failures")
        ordering = ("-at", "-id")

    def __str__(self) -> str:
        return f"{self.node_id} {self.at:%Y-%m-%d %H:%M}: {self.signal}"
