from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.db.models.manager import BaseManager
from rest_framework import serializers

from console.api.serializers import FieldsBoundOnce
from slices import lifecycle
from slices.choices import InstanceState
from slices.drivers import driver_capabilities
from slices.messages import failure_text
from slices.models import DiskAttachment, Instance
from slices.services import apps, ports
from slices.services import disks as disk_service
from slices.services.access import ssh_access
from slices.services.eta import instance_eta
from slices.services.instances import instance_cost, instance_costs


class AvailabilitySerializer(serializers.Serializer):
    region = serializers.CharField()
    region_name = serializers.CharField()
    gpu_model = serializers.CharField()
    total_gpus = serializers.IntegerField()
    free_gpus = serializers.IntegerField()
    out_of_service_gpus = serializers.IntegerField(
        help_text="Unleased GPUs on drained, failed or maintenance nodes."
    )
    host_sizes = serializers.ListField(
        child=serializers.IntegerField(), help_text="Host sizes (GPUs) that can be placed now."
    )
    slices = serializers.BooleanField(
        help_text="The region has an InfiniBand cluster of this model."
    )
    largest_slice = serializers.IntegerField(help_text="Largest slice (GPUs) that can start now.")
    slice_performance = serializers.DictField(
        help_text="Expected NCCL all-reduce busbw (GB/s) and small-message latency (µs) of a "
        "64-GPU slice on the fewest SUs possible (α–β model).",
        allow_null=True,
    )
    orderable = serializers.BooleanField(
        help_text="The model has a published price: it can be ordered (false: the fleet has it, "
        "nobody can order it yet)."
    )
    host = serializers.DictField(
        allow_null=True,
        help_text="What each card comes with: vcpus_per_gpu, memory_gib_per_gpu, the NVIDIA "
        "driver and the highest CUDA it runs (slices/hostspec.py); null when not listed.",
    )


class InstanceNodeSerializer(FieldsBoundOnce, serializers.Serializer):
    rank = serializers.IntegerField()
    hostname = serializers.CharField()
    step = serializers.CharField(help_text="The last provisioning step done on this node.")
    progress = serializers.IntegerField(help_text="Percent of this node's provisioning done.")
    failed = serializers.BooleanField()


class InstanceView:
    """An instance as ``InstanceSerializer`` reads it: the model's own fields, and the values
    derived from it and its rows (cost, access, progress, nodes, disks, ports, the app).

    ``cost`` and ``disks`` come from the caller when it looked them up for a whole page at once
    (``InstanceListSerializer``); the nodes from the queryset's prefetch when there is one.
    """

    def __init__(
        self,
        instance: Instance,
        *,
        cost: Decimal | None = None,
        disks: list[DiskAttachment] | None = None,
        request: Any = None,
    ) -> None:
        self.instance = instance
        self._request = request  # the app hosts' URLs take its scheme and port
        self._cost = cost
        self._disks = disks
        self._nodes = sorted(instance.nodes.all(), key=lambda n: n.rank)
        self._ssh = ssh_access(instance)
        self._estimate = instance_eta(instance, self._nodes)

    def __getattr__(self, name: str) -> Any:  # the model's fields (name, state, gpu_model...)
        if name in _DERIVED:  # one of ours raised AttributeError: not the model's same name
            raise TypeError(f"InstanceView.{name} raised AttributeError")
        if name.startswith("_") or name == "instance":
            raise AttributeError(name)  # not set yet (or a copy probing): never the model's
        return getattr(self.instance, name)

    @property
    def cost_so_far(self) -> Decimal:
        return instance_cost(self.instance) if self._cost is None else self._cost

    @property
    def ssh(self) -> dict[str, object] | None:
        if not self._ssh:
            return None
        # On the simulated fleet the command has the real form but reaches nothing (issue 29).
        simulated = driver_capabilities(self.instance.driver or None).simulated
        return {**self._ssh.as_dict(), "simulated": simulated}

    @property
    def ssh_config(self) -> str:
        return self._ssh.ssh_config if self._ssh else ""

    @property
    def progress(self) -> int:
        return lifecycle.instance_progress([n.step or None for n in self._nodes])

    @property
    def eta_seconds(self) -> int | None:
        return self._estimate.seconds if self._estimate else None

    @property
    def current_step(self) -> str:
        return self._estimate.current_step if self._estimate else ""

    @property
    def nodes(self) -> list[dict[str, Any]]:
        return [
            {
                "rank": n.rank,
                "hostname": n.hostname,
                "step": n.step,
                "progress": lifecycle.node_progress(n.step or None),
                "failed": n.failed,
            }
            for n in self._nodes
        ]

    @property
    def expected_performance(self) -> dict[str, Any]:
        allocation = self.instance.allocation
        return allocation.performance if allocation else {}

    @property
    def start_estimate(self) -> dict[str, Any] | None:
        """排队: the latest start estimate while queued (p50, p90, position, updated_at)."""
        if self.instance.state != InstanceState.QUEUED:
            return None
        e = self.instance.start_estimate or {}
        return {
            "p50": e.get("p50"),
            "p90": e.get("p90"),
            "position": e.get("position"),
            "updated_at": e.get("updated_at"),
            "max_wait_until": (
                self.instance.queue_deadline.isoformat() if self.instance.queue_deadline else None
            ),
        }

    @property
    def failure(self) -> dict[str, str] | None:
        code = self.instance.failure_code
        if not code:
            return None
        return {"code": code, "detail": failure_text(code, self.instance.failure_params)}

    @property
    def simulated(self) -> bool:
        return driver_capabilities(self.instance.driver or None).simulated

    @property
    def checkpoint(self) -> dict[str, Any]:
        return self.instance.checkpoint or {}

    @property
    def disks(self) -> list[dict[str, Any]]:
        attached = (
            disk_service.instance_disks(self.instance) if self._disks is None else self._disks
        )
        return [
            {"id": a.disk.public_id, "name": a.disk.name, "path": a.disk.mount_path, "mode": a.mode}
            for a in attached
        ]

    @property
    def ports(self) -> list[dict[str, Any]]:
        return ports.ports_data(self.instance, owner_view=True, request=self._request)

    @property
    def app(self) -> dict[str, Any] | None:
        status = apps.app_status(self.instance)
        if status is None:
            return None
        return {
            "slug": status.app.slug,
            "model": status.model,
            "state": status.state,
            "open_url": status.open_url if status.state == "ready" else None,
            "api_base_path": status.api_path or None,
            "api_key": status.api_key if self._operates() else None,
        }

    def _operates(self) -> bool:
        """The app's key is for its maker and the team's admins (issue 30), not every member."""
        if self._request is None:
            return True
        from console.tenancy import acting

        try:
            return bool(acting(self._request).may_operate(self.instance))
        except Exception:  # no acting team for this request: no key
            return False


_DERIVED = frozenset(n for n, v in vars(InstanceView).items() if isinstance(v, property))


class InstanceListSerializer(serializers.ListSerializer):
    """A page of instances: their costs and disks looked up for the whole page, one query each,
    so a list costs the same few queries however long it is."""

    def to_representation(self, data: Iterable[Instance]) -> list[dict[str, Any]]:
        instances = list(data.all() if isinstance(data, BaseManager) else data)
        costs = instance_costs(instances)
        disks = disk_service.instances_disks(instances)
        return [
            self.child.to_representation(
                InstanceView(
                    i, cost=costs[i.pk], disks=disks[i.pk], request=self.context.get("request")
                )
            )
            for i in instances
        ]


# The API's view of an instance: the one list of its fields, read from the model through
# ``InstanceView`` (no docstring: the schema would print it).
class InstanceSerializer(FieldsBoundOnce, serializers.Serializer):
    id = serializers.UUIDField(source="public_id")
    name = serializers.CharField()
    team = serializers.UUIDField(source="team.public_id", help_text="The team that owns it.")
    created_by = serializers.EmailField(
        source="created_by.email", help_text="The member who ordered it (kept after they leave)."
    )
    kind = serializers.CharField(help_text="host (one node) or slice (64 cards and up).")
    state = serializers.CharField(
        help_text="pending → allocating → provisioning → running → releasing → released; failed. "
        "queued (排队): waiting for cards, holding none, charged nothing (see start_estimate)."
    )
    gpu_model = serializers.CharField(
        source="gpu_model.code", help_text='The fleet code, e.g. "RTX4090".'
    )
    gpu_model_name = serializers.CharField(
        source="gpu_model.product_name", help_text='The product name, e.g. "RTX 4090".'
    )
    cards = serializers.IntegerField()
    region = serializers.CharField(source="region.code", allow_null=True, default=None)
    image = serializers.CharField(
        help_text='The image version\'s slug (also when the order named its family); "" for none.'
    )
    mounts = serializers.ListField(child=serializers.DictField())
    billing_mode = serializers.CharField()
    term_days = serializers.IntegerField(allow_null=True)
    quoted_per_hour = serializers.DecimalField(max_digits=14, decimal_places=2)
    cost_so_far = serializers.DecimalField(max_digits=14, decimal_places=2)
    auto_release_at = serializers.DateTimeField(allow_null=True)
    ssh = serializers.DictField(
        allow_null=True,
        help_text="Once running: host and port to reach (where the region's gateway forwards "
        "ports, the gateway's host and the instance's own port on it, the same from its first "
        "start to its release: command ssh -p <port> root@<gateway>; otherwise the node "
        "address of its sshd, reached through the gateway: ssh -J <jump> root@<host> -p <port>), "
        "user, command (works verbatim), gateway (host, port, user of the jump; null without "
        "one), jump (ProxyJump's user@host[:port]), alias (the ssh_config Host) and simulated "
        "(true on the simulated fleet: the command has the real form but reaches nothing).",
    )
    ssh_config = serializers.CharField(
        allow_blank=True,
        help_text="A ~/.ssh/config block for the instance (Host gpc-<id>, HostName, Port, User, "
        'ProxyJump), as VS Code Remote-SSH takes it; "" unless running.',
    )
    progress = serializers.IntegerField()
    eta_seconds = serializers.IntegerField(
        allow_null=True,
        help_text="Estimated seconds until running, from recent comparable orders (null unless "
        "the instance is on its way to running; 0 = any moment).",
    )
    current_step = serializers.CharField(
        allow_blank=True,
        help_text="The provisioning step under way on the slowest node (connect, prepare, "
        'mount, start, health), "" before provisioning.',
    )
    nodes = InstanceNodeSerializer(many=True)
    partition_key = serializers.IntegerField(allow_null=True)
    allreduce = serializers.DictField(help_text="Measured all-reduce of a slice (vs. expected).")
    expected_performance = serializers.DictField()
    failure = serializers.DictField(allow_null=True, help_text="code and detail when failed")
    simulated = serializers.BooleanField(help_text="Runs on the simulated fleet (digital twin).")
    created_at = serializers.DateTimeField()
    running_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    system_disk_gb = serializers.IntegerField(
        help_text="Kept while stopped and billed as storage then."
    )
    gpuless = serializers.BooleanField(help_text="Started without GPUs (no-GPU mode).")
    checkpoint = serializers.DictField(
        help_text="The latest whole checkpoint on /pfs: run, step, path, at ({} when none)."
    )
    disks = serializers.ListField(
        child=serializers.DictField(), help_text="Attached cloud disks: id, name, path, mode."
    )
    ports = serializers.ListField(
        child=serializers.DictField(),
        help_text="Web ports through the console (JupyterLab 8888 first, TensorBoard, the "
        "declared ones): port, name, kind, url (the port's own host, "
        "https://<id>-<port>.<APPS_DOMAIN>/, never the console's origin; opened through the "
        "console's hand-off), and the live share links (id, created_at, expires_at, "
        "last_used_at; their secret is shown only when made). Empty unless running.",
    )
    start_estimate = serializers.DictField(
        allow_null=True,
        help_text="排队 (queued orders only; null otherwise): when it is expected to start, as a "
        "range: p50 (as likely before as after) and p90 (9 in 10 start by then), ISO times, null "
        "when no future within the estimate's horizon frees enough; position in its queue "
        "(1 = next), updated_at (when the estimate last changed) and max_wait_until (it leaves "
        "the queue then, unstarted and uncharged).",
    )
    app = serializers.DictField(
        allow_null=True,
        help_text="An AI application's instance (null otherwise): slug, model, state (waiting, "
        "starting, ready, not_answering), open_url (the app's page through the console), "
        "api_base_path (/apps/<id>/v1 on this console; null without an API) and api_key (send "
        "it as Authorization: Bearer <key>).",
    )

    class Meta:
        list_serializer_class = InstanceListSerializer

    def to_representation(self, instance: Instance | InstanceView) -> dict[str, Any]:
        view = (
            instance
            if isinstance(instance, InstanceView)
            else InstanceView(instance, request=self.context.get("request"))
        )
        return super().to_representation(view)


class DiskRefSerializer(serializers.Serializer):
    id = serializers.UUIDField(help_text="A cloud disk's id.")
    mode = serializers.ChoiceField(choices=["rw", "ro"], default="rw")


class InstanceCreateSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(help_text='A fleet code ("RTX4090") or the product name.')
    cards = serializers.IntegerField(min_value=1, max_value=2048)
    name = serializers.CharField(max_length=63, required=False, allow_blank=True, default="")
    region = serializers.CharField(max_length=63, required=False, allow_blank=True, default="")
    image = serializers.CharField(
        max_length=120,
        required=False,
        allow_blank=True,
        default="",
        help_text="An image version's slug or id, or an image's slug (\"pytorch\", from "
        "GET /api/v1/images/): its newest version for the GPU model. The response's image "
        "is the version chosen. Unknown: 400 naming the field.",
    )
    assets = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, default=list, max_length=32
    )
    ssh_key = serializers.CharField(
        max_length=64,
        required=False,
        allow_blank=True,
        default="",
        help_text="An SSH key id; empty = the account's default key. Unknown: 400 naming the field.",
    )
    billing_mode = serializers.ChoiceField(choices=["on_demand", "term"], default="on_demand")
    term_days = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1)
    auto_release_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    when_unavailable = serializers.ChoiceField(
        choices=["refuse", "queue"],
        required=False,
        default="refuse",
        help_text='When it cannot start now: "refuse" (409 no_capacity, the default) or "queue" '
        "(排队: it waits, holding no GPUs and charged nothing, and starts when the queue lets "
        "it; the answer carries its start_estimate). An automatic release then counts from the "
        "start.",
    )
    max_wait_hours = serializers.FloatField(
        required=False,
        allow_null=True,
        default=None,
        min_value=0.01,
        help_text="排队: how long it may wait before it leaves the queue (default 24).",
    )
    env = serializers.DictField(
        child=serializers.CharField(max_length=4096, allow_blank=True), required=False, default=dict
    )
    disks = DiskRefSerializer(
        many=True,
        required=False,
        default=list,
        help_text="Cloud disks to attach (same region; they pin the order to it).",
    )
    web_ports = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        default=list,
        help_text='Up to 10 web ports to open through the console: [{"port": 7860, "name": '
        '"Gradio"}], ports 1024-65535 outside the instances\' SSH range. A bad one: 400 naming '
        "the field.",
    )
    scheduler = serializers.ChoiceField(
        choices=["slurm", "none"],
        required=False,
        allow_blank=True,
        default="",
        help_text='The slice\'s own Slurm ("slurm", the default for a slice) or plain nodes '
        '("none", the default for a host).',
    )
    job = serializers.DictField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Job mode: a Slurm job submitted once the slice runs (script, name, nodes, "
        "gpus_per_node, time_limit in minutes, environment); its end releases the slice unless "
        "release_on_job_end is false.",
    )
    release_on_job_end = serializers.BooleanField(required=False, allow_null=True, default=None)


class InstanceEventSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    kind = serializers.CharField()
    level = serializers.CharField()
    step = serializers.CharField()
    node = serializers.CharField()
    code = serializers.CharField()
    params = serializers.DictField()
    message = serializers.CharField()


class InstanceEventPageSerializer(serializers.Serializer):
    """A page of events or log lines: the shape of every list (``count``, ``next``, ``previous``,
    ``results``); ``next`` is a cursor (``?after=<last id>``)."""

    count = serializers.IntegerField(help_text="Rows from ?after= on, this page included.")
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True, help_text="Always null: follow next.")
    results = InstanceEventSerializer(many=True)


class DiskSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="public_id")
    name = serializers.CharField()
    size_gb = serializers.IntegerField()
    region = serializers.CharField(source="region.code")
    state = serializers.CharField()
    path = serializers.CharField(source="mount_path", help_text="Where instances see it.")
    attachments = serializers.ListField(
        child=serializers.DictField(), help_text="instance (id), name, mode (rw/ro), attached_at"
    )
    created_at = serializers.DateTimeField()


class DiskCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    size_gb = serializers.IntegerField(min_value=1)
    region = serializers.CharField(max_length=63)


class DiskResizeSerializer(serializers.Serializer):
    size_gb = serializers.IntegerField(min_value=1, help_text="Larger than now: disks only grow.")


class DiskAttachSerializer(serializers.Serializer):
    instance = serializers.UUIDField(help_text="One of your instances in the disk's region.")
    mode = serializers.ChoiceField(choices=["rw", "ro"], default="rw")


class InstanceStartSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(
        choices=["auto", "same", "gpuless"],
        default="auto",
        help_text="auto: the same host, else another in the region (the disk moves); same: only "
        "the same host; gpuless: no GPUs (no-GPU mode).",
    )


class StorageSerializer(serializers.Serializer):
    pfs_used_bytes = serializers.IntegerField()
    pfs_files = serializers.IntegerField()
    pfs_quota_gb = serializers.IntegerField()
    disks_gb = serializers.IntegerField()
    stopped_system_disks_gb = serializers.IntegerField()
    free_gb = serializers.IntegerField()
    per_gb_day = serializers.DecimalField(max_digits=12, decimal_places=4)
    per_day = serializers.DecimalField(max_digits=14, decimal_places=2)


class AppGpuSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    gpu_model_name = serializers.CharField()
    min_cards = serializers.IntegerField()
    recommended_cards = serializers.IntegerField()
    max_cards = serializers.IntegerField()
    price_per_hour = serializers.DecimalField(
        max_digits=14, decimal_places=2, help_text="元 per hour at the recommended cards."
    )
    available = serializers.BooleanField(
        allow_null=True,
        help_text="The cards are free now (asked on one app's detail; null on the list).",
    )
    trial_hours = serializers.DecimalField(
        max_digits=8,
        decimal_places=1,
        allow_null=True,
        help_text="How long the trial credit lasts at this price.",
    )


class AppSerializer(serializers.Serializer):
    slug = serializers.CharField()
    category = serializers.CharField(help_text="chat, image, finetune or workbench")
    name = serializers.CharField(help_text="In the request's language.")
    name_en = serializers.CharField()
    name_zh = serializers.CharField()
    summary = serializers.CharField()
    image = serializers.CharField(help_text="The image version it runs.")
    models = serializers.ListField(child=serializers.CharField(), help_text="Default first.")
    datasets = serializers.ListField(child=serializers.CharField())
    gpus = AppGpuSerializer(many=True)
    ports = serializers.ListField(child=serializers.DictField())
    health = serializers.DictField(help_text="port, path, status")
    ready_seconds = serializers.IntegerField()
    api = serializers.DictField(allow_null=True, help_text="kind (openai), port, base_path")


class AppLaunchSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(required=False, allow_blank=True, default="")
    cards = serializers.IntegerField(required=False, allow_null=True, default=None)
    model = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="One of the app's models."
    )
    name = serializers.CharField(max_length=63, required=False, allow_blank=True, default="")
    accept_license = serializers.BooleanField(
        default=False, help_text="Accept the chosen model's licence (needed once per licence)."
    )
