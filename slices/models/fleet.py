"""Fleet inventory: Region → Cluster → SpineGroup / ScalableUnit → Node → GPU.

The fleet file is the source of truth for the inventory (`manage.py load_fleet`); node state, health
and the free-GPU bitmask are live.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils.translation import get_language
from django.utils.translation import gettext_lazy as _

from slices.choices import (
    NODE_HEALTH_BADGES,
    NODE_STATE_BADGES,
    Fabric,
    NodeHealth,
    NodeState,
    gpu_product_name,
)
from slices.querysets import NodeQuerySet


class Region(models.Model):
    code = models.SlugField(_("code"), max_length=63, unique=True)
    name = models.CharField(_("name"), max_length=100)
    name_zh = models.CharField(_("Chinese name"), max_length=100, blank=True)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name = _("region")
        verbose_name_plural = _("regions")
        ordering = ("position", "code")

    def __str__(self) -> str:
        return self.display_name

    @property
    def display_name(self) -> str:
        """The region's name in the current language (Chinese names for zh-hans)."""
        if self.name_zh and (get_language() or "").startswith("zh"):
            return self.name_zh
        return self.name


class Gateway(models.Model):
    """A region's SSH gateway (jump host): the one SSH door from the internet to its instances.

    Customers reach ``user@host:port`` (public); the console manages it over ``address:ssh_port``
    with the pinned host key, and writes ``keys_file``: each customer key restricted to
    forwarding to the node ports of that customer's instances (issue 19)."""

    region = models.OneToOneField(Region, on_delete=models.CASCADE, related_name="gateway")
    host = models.CharField(_("public host name"), max_length=255)
    port = models.PositiveIntegerField(_("public SSH port"), default=22)
    user = models.CharField(_("jump user"), max_length=32, default="gpc")
    address = models.CharField(_("management address"), max_length=255)
    ssh_port = models.PositiveIntegerField(_("management SSH port"), default=22)
    host_key_fingerprint = models.CharField(
        _("pinned host key"),
        max_length=1000,
        blank=True,
        help_text=_("The gateway's SSH host public key line, or its SHA256:… fingerprint"),
    )
    keys_file = models.CharField(
        _("authorized keys file"), max_length=255, default="/etc/gpc-gateway/authorized_keys"
    )
    synced_at = models.DateTimeField(_("keys last written"), null=True, blank=True)
    # "<low>-<high>": public ports the gateway forwards, one per instance for its whole life, to
    # wherever the instance runs now (its forwarder reads the routes file the console writes
    # beside keys_file); blank: no forwarder, customers jump with ssh -J (issue 29).
    ports = models.CharField(_("forwarded SSH ports"), max_length=11, blank=True)
    in_fleet_file = models.BooleanField(default=True)

    class Meta:
        verbose_name = _("SSH gateway")
        verbose_name_plural = _("SSH gateways")
        ordering = ("region",)

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def port_range(self) -> tuple[int, int] | None:
        if not self.ports:
            return None
        low, _, high = self.ports.partition("-")
        return int(low), int(high)

    @property
    def routes_file(self) -> str:
        """The forwarder's routes, beside the keys file (one directory for the operator)."""
        directory = self.keys_file.rsplit("/", 1)[0] or "/"
        return f"{directory}/routes"


class GpuModel(models.Model):
    code = models.CharField(_("code"), max_length=32, unique=True)
    memory_gib = models.PositiveIntegerField(_("memory (GiB)"))
    nvlink_gbps = models.PositiveIntegerField(_("NVLink GB/s per GPU"), default=0)
    # What customers order, GPUs -> weight (from the fleet file); guides fragmentation-aware placement.
    demand = models.JSONField(_("order mix"), default=dict, blank=True)

    class Meta:
        verbose_name = _("GPU model")
        verbose_name_plural = _("GPU models")
        ordering = ("code",)

    def __str__(self) -> str:
        return self.code

    @property
    def product_name(self) -> str:
        return gpu_product_name(self.code)


class Cluster(models.Model):
    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="clusters")
    code = models.SlugField(_("code"), max_length=63, unique=True)
    name = models.CharField(_("name"), max_length=200)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="clusters")
    fabric = models.CharField(_("fabric"), max_length=16, choices=Fabric.choices)
    gpus_per_node = models.PositiveSmallIntegerField(_("GPUs per node"))
    numa_nodes = models.PositiveSmallIntegerField(_("NUMA nodes per node"), default=2)
    gpus_per_hca = models.PositiveSmallIntegerField(_("GPUs per HCA"), default=1)
    rails = models.PositiveSmallIntegerField(_("rails"), default=8)
    link_gbps = models.PositiveIntegerField(_("link Gb/s"), default=200)
    leaf_ports = models.PositiveSmallIntegerField(_("leaf switch ports"), default=40)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name = _("cluster")
        verbose_name_plural = _("clusters")
        ordering = ("position", "code")

    def __str__(self) -> str:
        return self.code

    @property
    def display_name(self) -> str:
        """The fleet file's name (the operators' English) on English pages; on Chinese pages a
        name made of the region, the product and the fabric, in Chinese."""
        if (get_language() or "").startswith("zh"):
            return _("%(region)s %(gpu)s · %(fabric)s") % {
                "region": self.region.display_name,
                "gpu": self.gpu_model.product_name,
                "fabric": self.get_fabric_display(),
            }
        return self.name

    @property
    def slices_allowed(self) -> bool:
        return self.fabric != Fabric.ETHERNET and self.gpus_per_node == 8


class SpineGroup(models.Model):
    """The spine switches of one rail plane: rail-r leaves of every SU meet here."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="spine_groups")
    rail = models.PositiveSmallIntegerField(_("rail"))

    class Meta:
        verbose_name = _("spine group")
        verbose_name_plural = _("spine groups")
        ordering = ("cluster", "rail")
        constraints = (
            models.UniqueConstraint(fields=("cluster", "rail"), name="slices_spine_unique_rail"),
        )

    def __str__(self) -> str:
        return f"{self.cluster.code}/rail{self.rail}"


class ScalableUnit(models.Model):
    """Nodes whose rail-r HCAs share one rail-r leaf switch: one hop apart on every rail."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="sus")
    index = models.PositiveSmallIntegerField(_("index"))
    name = models.CharField(_("name"), max_length=32)
    capacity = models.PositiveSmallIntegerField(_("nodes"))

    class Meta:
        verbose_name = _("scalable unit")
        verbose_name_plural = _("scalable units")
        ordering = ("cluster", "index")
        constraints = (
            models.UniqueConstraint(fields=("cluster", "index"), name="slices_su_unique_index"),
        )

    def __str__(self) -> str:
        return f"{self.cluster.code}/{self.name}"


class Node(models.Model):
    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="nodes")
    su = models.ForeignKey(ScalableUnit, on_delete=models.PROTECT, related_name="nodes")
    index = models.PositiveSmallIntegerField(_("index in SU"))
    hostname = models.CharField(_("hostname"), max_length=63, unique=True)
    address = models.CharField(_("SSH address"), max_length=255)
    ssh_port = models.PositiveIntegerField(_("SSH port"), default=22)
    host_key_fingerprint = models.CharField(
        _("pinned host key"),
        max_length=1000,
        blank=True,
        help_text=_("The node's SSH host public key line, or its SHA256:… fingerprint"),
    )
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="nodes")
    gpus_per_node = models.PositiveSmallIntegerField(_("GPUs"))
    layout = models.JSONField(_("NUMA/PCIe/NVLink layout"), default=dict, blank=True)
    state = models.CharField(
        _("state"), max_length=16, choices=NodeState.choices, default=NodeState.READY
    )
    health = models.CharField(
        _("health"), max_length=16, choices=NodeHealth.choices, default=NodeHealth.OK
    )
    # Bit i set = GPU i free. Allocation commits compare-and-set this column (see services).
    free_mask = models.PositiveIntegerField(_("free GPU mask"))
    in_fleet_file = models.BooleanField(default=True)
    note = models.CharField(_("operator note"), max_length=255, blank=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    objects = NodeQuerySet.as_manager()

    class Meta:
        verbose_name = _("node")
        verbose_name_plural = _("nodes")
        ordering = ("cluster", "su__index", "index")
        indexes = (models.Index(fields=("cluster", "state"), name="slices_node_cluster_state"),)

    def __str__(self) -> str:
        return self.hostname

    @property
    def full_mask(self) -> int:
        return (1 << self.gpus_per_node) - 1

    @property
    def free_gpus(self) -> int:
        return bin(self.free_mask).count("1")

    @property
    def used_gpus(self) -> int:
        return self.gpus_per_node - self.free_gpus

    @property
    def state_badge(self) -> str:
        return NODE_STATE_BADGES[NodeState(self.state)]

    @property
    def health_badge(self) -> str:
        return NODE_HEALTH_BADGES[NodeHealth(self.health)]


class GPU(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField(_("index"))
    uuid = models.UUIDField(_("GPU UUID"), unique=True)
    numa_node = models.PositiveSmallIntegerField(_("NUMA node"))
    hca = models.CharField(_("paired HCA"), max_length=16, blank=True)
    allocation = models.ForeignKey(
        "slices.Allocation", on_delete=models.SET_NULL, null=True, blank=True, related_name="gpus"
    )

    class Meta:
        verbose_name = _("GPU")
        verbose_name_plural = _("GPUs")
        ordering = ("node", "index")
        constraints = (
            models.UniqueConstraint(fields=("node", "index"), name="slices_gpu_unique_index"),
        )

    def __str__(self) -> str:
        return f"{self.node.hostname}:{self.index}"


class FleetVersion(models.Model):
    """One row (pk 1): the fleet's change token. Every committed change of what the fleet can place
    (a claim or release of GPUs, a node's state, the fleet file) gives it a new random ``token``;
    the pages' cached view of the fleet is keyed on it (``slices.services.fleet.fleet_view``).
    Random, not a counter, so a change that was rolled back (a test's transaction) can never
    reuse a token a cache already holds."""

    token = models.BigIntegerField(default=0)
    changes = models.PositiveBigIntegerField(_("committed changes"), default=0)
    changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("fleet version")
        verbose_name_plural = _("fleet versions")

    def __str__(self) -> str:
        return f"fleet version {self.changes}"
