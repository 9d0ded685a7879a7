"""A slice's own Slurm (issue 31): decided at the order, started as a provisioning step.

- ``clean_order``: the order's ``scheduler`` ("slurm" by default for a slice, "none" for a host
  unless asked) and its job (job mode), checked before anything is reserved.
- ``create_for_order``: in the order's transaction, the slice's ``SlurmCluster``: a munge key
  and a JWT key (secrets, 1 KiB and 64 bytes from ``secrets``), a block of ports.
- ``start_slurm``: the step "启动 Slurm" once every node is up (``provisioning``), on every drive
  (idempotent on the nodes): the driver writes the files and starts what is not running with
  the current config inside the instance; ``started_at`` says when it last did.

The jobs themselves are ``slices.services.slurm_jobs`` (above provisioning: it builds specs).
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext_noop

from slices import slurmconf, topology
from slices.choices import EventKind, Scheduler
from slices.drivers import DriverError, InstanceSpec, capabilities
from slices.drivers.base import LogFn
from slices.drivers.slurm import SlurmSetup
from slices.errors import OrderRefused
from slices.models import Instance, SlurmCluster
from slices.services.history import record_event
from slices.services.jobs import enqueue_on_commit

logger = logging.getLogger(__name__)

PORT_TRIES = 8
MUNGE_KEY_BYTES = 1024
JWT_KEY_BYTES = 64


@dataclass(frozen=True)
class SlurmOrder:
    """What an order asks of Slurm, checked."""

    scheduler: str
    job: dict[str, Any] | None = None
    release_on_job_end: bool = False


def clean_job(raw: Any, *, nodes: int) -> dict[str, Any]:
    """A job as data (the API's and the order's): script, name, nodes, gpus_per_node,
    time_limit (minutes), environment. Raises ``OrderRefused`` naming the field."""
    if not isinstance(raw, dict):
        raise OrderRefused(gettext_noop("The job must be an object."), field="job")
    script = str(raw.get("script") or "")
    if not script.startswith("#!"):
        script = "#!/bin/bash\n" + script
    if not script.strip() or not slurmconf.script_ok(script):
        raise OrderRefused(
            gettext_noop("The job's script must be text of at most 64 KB."), field="script"
        )
    name = str(raw.get("name") or "job")
    if not slurmconf.JOB_NAME.fullmatch(name):
        raise OrderRefused(
            gettext_noop("A job's name has letters, digits, dots, dashes and underscores only."),
            field="name",
        )
    try:
        want = int(raw.get("nodes") or 1)
        gpus = int(raw.get("gpus_per_node") or 0)
        minutes = int(raw.get("time_limit") or 60)
    except (TypeError, ValueError):
        raise OrderRefused(
            gettext_noop("nodes, gpus_per_node and time_limit are numbers.")
        ) from None
    if not 1 <= want <= max(1, nodes):
        raise OrderRefused(
            gettext_noop("The job asks for %(want)s node(s); the slice has %(nodes)s."),
            field="nodes",
            want=want,
            nodes=nodes,
        )
    if not 0 <= gpus <= 8:
        raise OrderRefused(gettext_noop("gpus_per_node is 0 to 8."), field="gpus_per_node")
    if not 1 <= minutes <= slurmconf.MAX_TIME_LIMIT_MIN:
        raise OrderRefused(
            gettext_noop("The time limit is 1 minute to 30 days."), field="time_limit"
        )
    env = raw.get("environment") or {}
    if not isinstance(env, dict):
        raise OrderRefused(gettext_noop("The environment must be an object."), field="environment")
    try:
        environment = slurmconf.check_environment(env)
    except ValueError as exc:
        raise OrderRefused(
            gettext_noop("The environment variable %(name)s cannot be set by a job."),
            field="environment",
            name=str(exc),
        ) from None
    return {
        "script": script,
        "name": name,
        "nodes": want,
        "gpus_per_node": gpus,
        "time_limit": minutes,
        "environment": environment,
    }


def clean_order(
    cards: int, scheduler: str, job: Any, release_on_job_end: bool | None
) -> SlurmOrder:
    """The order's scheduler and job, checked (``OrderRefused`` naming the field)."""
    slice_ = cards not in topology.HOST_SIZES
    chosen = scheduler or (Scheduler.SLURM if slice_ else Scheduler.NONE)
    if chosen not in Scheduler.values:
        raise OrderRefused(
            gettext_noop("Unknown scheduler %(scheduler)s."), field="scheduler", scheduler=chosen
        )
    if chosen == Scheduler.SLURM and not capabilities(settings.SLICES_DRIVER).slurm:
        raise OrderRefused(gettext_noop("This fleet cannot run Slurm."), field="scheduler")
    if job is None:
        return SlurmOrder(chosen)
    if chosen != Scheduler.SLURM:
        raise OrderRefused(
            gettext_noop("A job runs on Slurm: order it with the Slurm scheduler."), field="job"
        )
    nodes = max(1, cards // 8) if slice_ else 1
    cleaned = clean_job(job, nodes=nodes)
    return SlurmOrder(chosen, cleaned, True if release_on_job_end is None else release_on_job_end)


def create_for_order(instance: Instance, order: SlurmOrder) -> SlurmCluster | None:
    """The instance's Slurm (in the order's transaction): keys and a block of ports."""
    if order.scheduler != Scheduler.SLURM:
        return None
    for _attempt in range(PORT_TRIES):
        base = _free_base_port()
        try:
            with transaction.atomic():
                return SlurmCluster.objects.create(
                    instance=instance,
                    base_port=base,
                    munge_key=secrets.token_bytes(MUNGE_KEY_BYTES),
                    jwt_key=secrets.token_bytes(JWT_KEY_BYTES),
                    job_request=order.job or {},
                    release_on_job_end=bool(order.job) and order.release_on_job_end,
                )
        except IntegrityError:
            continue  # another order took the block meanwhile: look again
    raise OrderRefused(gettext_noop("No Slurm ports are free in this fleet; try again later."))


def _free_base_port() -> int:
    start = int(settings.SLICES_SLURM_PORT_BASE)
    blocks = int(settings.SLICES_SLURM_PORT_BLOCKS)
    used = set(SlurmCluster.objects.filter(active=True).values_list("base_port", flat=True))
    free = [start + i * slurmconf.PORTS_PER_SLICE for i in range(blocks)]
    free = [p for p in free if p not in used]
    if not free:
        raise OrderRefused(gettext_noop("No Slurm ports are free in this fleet; try again later."))
    return secrets.choice(free)


def cluster_of(instance: Instance) -> SlurmCluster | None:
    return SlurmCluster.objects.filter(instance=instance).first()


def run_dir(instance: Instance) -> str:
    """The slice's node-local Slurm directory ("" without Slurm): ``InstanceSpec.slurm_run``."""
    if not SlurmCluster.objects.filter(instance=instance).exists():
        return ""
    return f"{str(settings.SLICES_SLURM_RUN_DIR).rstrip('/')}/{instance.slug}"


def _leaf(node: Any) -> str:
    name = re.sub(r"[^A-Za-z0-9-]", "-", f"{node.cluster.code}-su{node.su.index}")
    return name.strip("-")[:63] or "leaf"


def setup_for(instance: Instance, cluster: SlurmCluster) -> SlurmSetup:
    """What the driver needs to run (or reach) the instance's Slurm."""
    parts = list(instance.nodes.select_related("node__su", "node__cluster").order_by("rank"))
    offsets = _node_offsets(cluster, [p.hostname for p in parts])
    return SlurmSetup(
        cluster=slurmconf.cluster_name(instance.short_id),
        base_port=cluster.base_port,
        gres_type=slurmconf.gres_type(instance.gpu_model.code),
        leaves=tuple(_leaf(p.node) for p in parts),
        user=str(settings.SLICES_INSTANCE_SSH_USER),
        run_root=str(settings.SLICES_SLURM_RUN_DIR).rstrip("/"),
        api_version=cluster.api_version,
        munge_key=bytes(cluster.munge_key),
        jwt_key=bytes(cluster.jwt_key),
        node_offsets=tuple(sorted(offsets.items())),
    )


def _node_offsets(cluster: SlurmCluster, hostnames: list[str]) -> dict[str, int]:
    """Each node's slurmd port offset, a new node (a replacement) taking the next one unused."""
    offsets = {str(k): int(v) for k, v in (cluster.node_ports or {}).items()}
    missing = [h for h in hostnames if h not in offsets]
    if missing:
        taken = set(offsets.values())
        free = (i for i in range(slurmconf.MAX_NODES) if i not in taken)
        for hostname in missing:
            offsets[hostname] = next(free)
        SlurmCluster.objects.filter(pk=cluster.pk).update(node_ports=offsets)
        cluster.node_ports = offsets
    return offsets


def start_slurm(
    instance: Instance, driver: Any, spec: InstanceSpec, log: LogFn
) -> tuple[str, dict[str, Any]] | None:
    """The step "启动 Slurm", after every node is up, on every drive: the first one, a re-drive,
    开机 after 关机 (the daemons ended with the instance; the queue is kept on /pfs), a node
    replaced (the daemons whose config changed restart). The driver's start is idempotent.
    Returns the failure (code, params) or None."""
    cluster = cluster_of(instance)
    if cluster is None:
        return None
    try:
        result = driver.start_slurm(spec, setup_for(instance, cluster), log)
    except DriverError as exc:
        code = exc.code if exc.code in ("slurm_failed", "slurm_unsupported") else "slurm_failed"
        return code, {"error": exc.detail or exc.code}
    version = str(result.data.get("api_version") or slurmconf.DEFAULT_API)
    with transaction.atomic():
        SlurmCluster.objects.filter(pk=cluster.pk).update(
            started_at=timezone.now(), api_version=version
        )
        record_event(
            instance,
            EventKind.STEP,
            code="slurm_started",
            step="slurm",
            params={"nodes": len(spec.nodes), "api": version},
        )
    return None


def release_ports(instance: Instance) -> None:
    """The instance's nodes were cleaned: its Slurm's ports are free for the next slice."""
    SlurmCluster.objects.filter(instance=instance, active=True).update(active=False)


def after_running(instance: Instance) -> None:
    """Job mode: the order's job goes to Slurm once the slice runs (a task of its own)."""
    cluster = cluster_of(instance)
    if cluster is not None and cluster.job_request:
        enqueue_on_commit("slices.tasks.submit_order_job_task", instance.pk)
