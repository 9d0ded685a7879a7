"""Instances (what a customer orders and uses), their nodes, their append-only event log, quotas.

An instance holds one allocation (its GPUs) while it lives. Rows are written only by
``slices.services.instances`` and ``slices.services.provisioning``; every state change is a
compare-and-set there and writes an ``InstanceEvent`` in the same transaction.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from billing.choices import BillingMode
from slices.choices import (
    INSTANCE_STATE_BADGES,
    AllocationKind,
    EventKind,
    EventLevel,
    InstanceState,
    NoReplacement,
)
from slices.models.allocations import Allocation
from slices.models.fleet import GpuModel, Node, Region
from slices.querysets import InstanceQuerySet


class Instance(models.Model):
    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    # The team owns it (issue 30); the member who ordered it is recorded for budgets,
    # statements and the audit log, and keeps it attributed after they leave.
    team = models.ForeignKey("console.Team", on_delete=models.PROTECT, related_name="instances")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="instances"
    )
    name = models.CharField(_("name"), max_length=63)
    kind = models.CharField(_("kind"), max_length=8, choices=AllocationKind.choices)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="instances")
    cards = models.PositiveIntegerField(_("cards"))
    region = models.ForeignKey(
        Region, on_delete=models.PROTECT, null=True, blank=True, related_name="instances"
    )
    image = models.CharField(_("image version"), max_length=120, blank=True)
    container = models.CharField(_("container image"), max_length=255, blank=True)
    entrypoint = models.CharField(_("entrypoint"), max_length=500, blank=True)
    mounts = models.JSONField(_("read-only mounts"), default=list, blank=True)
    env = models.JSONField(_("environment"), default=dict, blank=True)
    ssh_key_name = models.CharField(_("SSH key"), max_length=100, blank=True)
    ssh_public_key = models.TextField(_("SSH public key"), blank=True)
    billing_mode = models.CharField(
        _("billing mode"), max_length=10, choices=BillingMode.choices, default=BillingMode.ON_DEMAND
    )
    term_days = models.PositiveIntegerField(_("term (days)"), null=True, blank=True)
    # Decisions read fields, not the event log: written in the transaction of their event.
    term_paid_until = models.DateTimeField(
        _("term paid until"), null=True, blank=True
    )  # set when the term was bought (once): a restart after a migration never pays it again
    disk_move_from = models.CharField(
        _("system disk to move from"), max_length=255, blank=True
    )  # a start placed on another host: the old host, until the disk has moved
    replacements = models.PositiveIntegerField(
        _("replacement nodes taken"), default=0
    )  # migrations that found a replacement (its ``replacement_allocated`` event): the migration
    # voucher's idempotency key counts these, so a re-driven migration never grants twice
    migration_checkpoint_noted = models.BooleanField(
        _("checkpoint noted in this migration"), default=False
    )  # its ``checkpoint_found``/``no_checkpoint`` event is written; a new migration clears it
    migration_wait_told = models.BooleanField(
        _("told no replacement is free in this migration"), default=False
    )  # its ``no_replacement`` (wait) event is written; a new migration clears it
    isolated_at = models.DateTimeField(
        _("isolated on the fabric at"), null=True, blank=True
    )  # its ``isolated`` event: a provisioning again (a retry, a migration) does not isolate again
    app_gave_up_at = models.DateTimeField(
        _("application not answering since"), null=True, blank=True
    )  # its ``app_not_answering`` warning: written once per start (compared with running_at)
    restarted_at = models.DateTimeField(
        _("last started again at"), null=True, blank=True
    )  # its latest ``starting`` (开机) or ``migrating`` event: the ETA counts a provisioning that
    # did not begin at the order from here, and leaves such an instance out of the orders' timelines
    provisioning_noted_at = models.DateTimeField(
        _("provisioning told at"), null=True, blank=True
    )  # its latest ``provisioning`` event: a retried drive tells it only if it never was
    output_read = models.PositiveIntegerField(
        _("workload output lines kept"), default=0
    )  # an app's or a recipe's output lines stored as log events: its follower reads on from here
    quoted_per_hour = models.DecimalField(
        _("quoted price per hour"), max_digits=14, decimal_places=2
    )
    auto_release_at = models.DateTimeField(_("release automatically at"), null=True, blank=True)
    state = models.CharField(
        _("state"), max_length=16, choices=InstanceState.choices, default=InstanceState.PENDING
    )
    allocation = models.OneToOneField(
        Allocation, on_delete=models.PROTECT, null=True, blank=True, related_name="instance"
    )
    driver = models.CharField(_("node driver"), max_length=16, blank=True)
    partition_key = models.PositiveIntegerField(_("fabric partition key"), null=True, blank=True)
    allreduce = models.JSONField(_("measured all-reduce"), default=dict, blank=True)
    failure_code = models.CharField(_("failure"), max_length=64, blank=True)
    failure_params = models.JSONField(default=dict, blank=True)
    ssh_host = models.CharField(_("SSH host"), max_length=255, blank=True)
    ssh_port = models.PositiveIntegerField(_("SSH port"), null=True, blank=True)
    # Its public port on the region's gateway, kept from the first start to the release: the
    # gateway forwards it to whichever node the instance is on now (issue 29).
    gateway_port = models.PositiveIntegerField(_("gateway SSH port"), null=True, blank=True)
    # Its sshd's host key (OpenSSH private key), made once: the same on every node it runs on,
    # so the host key a customer pinned survives a migration (issue 29).
    ssh_host_key = models.TextField(_("SSH host key"), blank=True, editable=False)
    ssh_user = models.CharField(_("SSH user"), max_length=32, blank=True)
    # Web ports the customer declared at order time ([{"port": 7860, "name": "Gradio"}], at most
    # 10), opened through the console's port proxy beside the image's own (issue 19).
    web_ports = models.JSONField(_("web ports"), default=list, blank=True)
    # The instance's own secret: JupyterLab's token and an app's API key (never shown to others).
    access_token = models.CharField(max_length=64, blank=True)
    # An AI application of the catalogue (issue 20; marketplace/apps/<slug>): which one, the model
    # it serves, the key of its API (a secret of its own, so that giving it to a program gives
    # nothing else of the instance), and when its health check first answered since it started.
    app = models.CharField(_("AI application"), max_length=40, blank=True)
    app_model = models.CharField(_("application model"), max_length=200, blank=True)
    app_api_key = models.CharField(max_length=64, blank=True)
    app_ready_at = models.DateTimeField(_("application ready at"), null=True, blank=True)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True)
    # A worker holds the lease while it drives the instance; the reconciler re-drives expired ones.
    lease_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    resources_freed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    running_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Storage and resilience (slices.services.disks / migration): the system disk kept while
    # stopped (billed as storage), 无卡模式, the latest checkpoint seen on the PFS, and what a
    # migrating instance does when no replacement node is free.
    system_disk_gb = models.PositiveIntegerField(_("system disk (GB)"), default=50)
    stopped_at = models.DateTimeField(_("stopped at"), null=True, blank=True)
    stop_warnings = models.PositiveSmallIntegerField(default=0)
    gpuless = models.BooleanField(_("started without GPUs"), default=False)
    checkpoint = models.JSONField(_("latest checkpoint"), default=dict, blank=True)
    on_no_replacement = models.CharField(
        _("without a replacement node"),
        max_length=8,
        choices=NoReplacement.choices,
        default=NoReplacement.WAIT,
    )

    # 排队 (issue 32): when it joined the queue, until when it waits (the customer's maximum
    # wait), how long it runs once started (its automatic release, counted from the start) and
    # the latest start estimate ({"p50", "p90", "position", "updated_at"}: ISO times).
    queued_at = models.DateTimeField(_("queued at"), null=True, blank=True)
    queue_deadline = models.DateTimeField(_("waits until"), null=True, blank=True)
    queue_run_seconds = models.PositiveIntegerField(null=True, blank=True)
    start_estimate = models.JSONField(default=dict, blank=True)

    objects = InstanceQuerySet.as_manager()

    class Meta:
        verbose_name = _("instance")
        verbose_name_plural = _("instances")
        ordering = ("-created_at", "-id")
        indexes = (
            models.Index(fields=("state", "lease_until"), name="slices_inst_state_lease"),
            models.Index(fields=("state", "gpu_model", "queued_at"), name="slices_inst_queue"),
        )
        constraints = (
            models.UniqueConstraint(
                fields=("team", "idempotency_key"), name="slices_instance_idempotency_key"
            ),
            # One instance per public port of a region's gateway (two picking one at once: the
            # second's write fails and it picks again).
            models.UniqueConstraint(
                fields=("region", "gateway_port"),
                condition=models.Q(gateway_port__isnull=False),
                name="slices_instance_gateway_port",
            ),
        )

    def __str__(self) -> str:
        return f"{self.name} ({self.short_id})"

    @property
    def short_id(self) -> str:
        return str(self.public_id)[:8]

    @property
    def slug(self) -> str:
        """The name used on the nodes (directories, containers): never the user's free text."""
        return f"gpc-{self.short_id}"

    @property
    def state_badge(self) -> str:
        return INSTANCE_STATE_BADGES[InstanceState(self.state)]

    @property
    def is_slice(self) -> bool:
        return self.kind == AllocationKind.SLICE

    @property
    def ssh_command(self) -> str:
        if not self.ssh_host:
            return ""
        port = f" -p {self.ssh_port}" if self.ssh_port and self.ssh_port != 22 else ""
        return f"ssh{port} {self.ssh_user or 'root'}@{self.ssh_host}"


class InstanceNode(models.Model):
    """One node of an instance and how far its provisioning got (the last step done)."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="nodes")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="instance_parts")
    rank = models.PositiveIntegerField(_("node rank"))
    hostname = models.CharField(_("hostname"), max_length=63)
    gpu_mask = models.PositiveIntegerField(_("GPU mask"))
    step = models.CharField(_("last step done"), max_length=16, blank=True)
    step_started_at = models.DateTimeField(null=True, blank=True)
    failed = models.BooleanField(default=False)
    message = models.CharField(max_length=255, blank=True)
    # The instance's own sshd on this node (allocated per instance; cleared when the instance
    # leaves the node: release, stop, migration), and the host ports docker published for the
    # instance's ports on a shared node ({"8888": 32768}).
    ssh_port = models.PositiveIntegerField(_("instance SSH port"), null=True, blank=True)
    published_ports = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ("instance", "rank")
        constraints = (
            models.UniqueConstraint(fields=("instance", "rank"), name="slices_instnode_rank"),
            models.UniqueConstraint(
                fields=("node", "ssh_port"),
                condition=models.Q(ssh_port__isnull=False),
                name="slices_instnode_ssh_port",
            ),
        )

    def __str__(self) -> str:
        return f"{self.instance_id}#{self.rank} {self.hostname}"


class InstanceEvent(models.Model):
    """Append-only: one row per state change, step, log line or error, never updated."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_index=True)
    kind = models.CharField(max_length=8, choices=EventKind.choices)
    level = models.CharField(max_length=8, choices=EventLevel.choices, default=EventLevel.INFO)
    step = models.CharField(max_length=16, blank=True)
    node = models.CharField(max_length=63, blank=True)
    # State changes and errors carry a code and parameters, rendered in the reader's language;
    # log lines carry the node's own text.
    code = models.CharField(max_length=64, blank=True)
    params = models.JSONField(default=dict, blank=True)
    text = models.TextField(blank=True)

    class Meta:
        ordering = ("instance", "id")
        indexes = (models.Index(fields=("instance", "kind", "id"), name="slices_event_inst_kind"),)

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.kind} {self.code or self.text[:40]}"


class GpuQuota(models.Model):
    """How many cards a team may hold at once (operators raise it; default in settings)."""

    team = models.OneToOneField("console.Team", on_delete=models.CASCADE, related_name="gpu_quota")
    max_gpus = models.PositiveIntegerField(_("cards at once"))
    note = models.CharField(_("operator note"), max_length=255, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("GPU quota")
        verbose_name_plural = _("GPU quotas")

    def __str__(self) -> str:
        return f"{self.team}: {self.max_gpus}"


class ShareLink(models.Model):
    """A link the owner made to one web port of an instance: whoever holds it opens that port
    through the proxy without a console session, until the owner revokes it (issue 19)."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="share_links")
    port = models.PositiveIntegerField(_("port"))
    token_hash = models.CharField(max_length=64, unique=True)  # sha256 of the secret in the URL
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # A link ends at the lifetime its owner picked (24 h unless they chose otherwise), when the
    # owner revokes it, or when the instance stops or is released, whichever comes first.
    expires_at = models.DateTimeField(_("expires at"))
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("share link")
        verbose_name_plural = _("share links")
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"{self.instance_id}:{self.port}"


class PortGrant(models.Model):
    """One browser's access to one web port on its app host (issue 29): made by the console when
    the owner clicks Open or a visitor follows a share link, claimed once by the app host (the
    signed hand-off in the URL), then named by the app host's own cookie. The owner's grants end
    when they log out; every grant ends when its share link does, when the instance stops, and
    after ``APP_COOKIE_SECONDS``."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="port_grants")
    port = models.PositiveIntegerField(_("port"))
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    share_link = models.ForeignKey(
        ShareLink, on_delete=models.CASCADE, null=True, blank=True, related_name="grants"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("web port grant")
        verbose_name_plural = _("web port grants")
        indexes = (models.Index(fields=("user", "revoked_at"), name="slices_grant_user_live"),)
        constraints = (
            models.CheckConstraint(
                condition=models.Q(user__isnull=False) ^ models.Q(share_link__isnull=False),
                name="slices_grant_owner_xor_link",
            ),
        )

    def __str__(self) -> str:
        return f"{self.instance_id}:{self.port}"
