"""A slice's own Slurm and its jobs (issue 31).

``SlurmCluster`` exists for an instance ordered with ``scheduler: slurm``: its keys (secrets,
written to the nodes as data), its ports, when the provisioning step last started it
(``started_at``; jobs are taken once it is set) and the order's job in job mode. ``SlurmJob`` rows are the console's
cached queue: the pages and the API read them; ``slices.services.slurm`` refreshes them from
slurmrestd on events (a submit, a cancel, the follower while jobs are live), never per view.
Rows are written only by ``slices.services.slurm``.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from slices.choices import JOB_GROUP_BADGES, JobGroup
from slices.models.instances import Instance


class SlurmCluster(models.Model):
    instance = models.OneToOneField(Instance, on_delete=models.CASCADE, related_name="slurm")
    # slurmctld on base_port, slurmrestd on +1, the slurmd of rank r on +2+r (unique among the
    # live clusters: the test hosts run several slices on one machine).
    base_port = models.PositiveIntegerField(_("base port"))
    active = models.BooleanField(default=True)
    munge_key = models.BinaryField(editable=False)
    jwt_key = models.BinaryField(editable=False)
    # Each node's slurmd port offset by hostname (``SlurmSetup.node_offsets``).
    node_ports = models.JSONField(default=dict, blank=True)
    api_version = models.CharField(_("REST version"), max_length=16, blank=True)
    started_at = models.DateTimeField(_("Slurm started at"), null=True, blank=True)
    # Job mode: the order's job (submitted once Slurm runs) and whether its end releases the slice.
    job_request = models.JSONField(default=dict, blank=True)
    release_on_job_end = models.BooleanField(default=False)
    queue_refreshed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("Slurm cluster")
        verbose_name_plural = _("Slurm clusters")
        constraints = (
            models.UniqueConstraint(
                fields=("base_port",), condition=Q(active=True), name="slices_slurm_live_port"
            ),
        )

    def __str__(self) -> str:
        return f"slurm of {self.instance}"


class SlurmJob(models.Model):
    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="slurm_jobs")
    slurm_id = models.PositiveIntegerField(_("Slurm job id"), null=True, blank=True)
    name = models.CharField(_("name"), max_length=64)
    script = models.TextField(_("script"))
    nodes = models.PositiveIntegerField(_("nodes"), default=1)
    gpus_per_node = models.PositiveIntegerField(_("GPUs per node"), default=0)
    time_limit_min = models.PositiveIntegerField(_("time limit (minutes)"), default=60)
    environment = models.JSONField(_("environment"), default=dict, blank=True)
    group = models.CharField(
        _("state"), max_length=8, choices=JobGroup.choices, default=JobGroup.QUEUED
    )
    slurm_state = models.CharField(_("Slurm state"), max_length=24, default="PENDING")
    reason = models.CharField(_("pending reason"), max_length=64, blank=True)
    node_list = models.CharField(_("nodes"), max_length=1000, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    # The output's tail as the console last read it, and where the next read starts (bytes).
    output = models.TextField(blank=True)
    output_offset = models.BigIntegerField(default=0)
    output_complete = models.BooleanField(default=False)  # read to its end after the job ended
    from_order = models.BooleanField(default=False)  # job mode: the order's own job
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("Slurm job")
        verbose_name_plural = _("Slurm jobs")
        ordering = ("-created_at", "-id")
        constraints = (
            models.UniqueConstraint(
                fields=("instance", "slurm_id"), name="slices_slurmjob_unique_id"
            ),
        )
        indexes = (models.Index(fields=("instance", "group"), name="slices_slurmjob_group"),)

    def __str__(self) -> str:
        return f"{self.instance} job {self.slurm_id or '-'}"

    @property
    def group_badge(self) -> str:
        return JOB_GROUP_BADGES[JobGroup(self.group)]

    @property
    def live(self) -> bool:
        return self.group != JobGroup.DONE
