"""Node health and hot migration (README "Storage and resilience").

Node health: agents send heartbeats and health signals (a GPU Xid error, NVML failing, the console
losing SSH). A bad signal not cleared within ``SLICES_NODE_FAIL_GRACE_SECONDS``, or a node whose
heartbeats stop for that long, is marked failed: it leaves the pool (the allocator only takes
ready/allocated nodes with health ok) until an operator returns it.

Hot migration: when a node under a running instance fails, the instance goes ``migrating``. Its
GPU charge closes at that second; a replacement node is taken in the same cluster, in the same
scalable unit when one is free there (so a slice stays one hop apart on every rail); the instance
is provisioned again with the same image, mounts, disks and environment plus
``RESUME_FROM=/pfs/checkpoints/<run>/step-<N>`` (the latest whole checkpoint); the GPU charge
opens again when it is running, so the downtime is not billed. An operator-configured voucher
(``SLICES_MIGRATION_VOUCHER``) compensates the interruption. With no replacement free the owner is
told and the instance waits (the reconciler retries) or is released, as the owner chose.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from billing import services as billing
from billing.choices import CloseReason
from console.notices import services as notices
from console.tenancy import for_row
from slices.choices import (
    SCHEDULABLE_STATES,
    AllocationKind,
    EventKind,
    EventLevel,
    InstanceState,
    NodeHealth,
    NodeSignal,
    NodeState,
    NoReplacement,
)
from slices.drivers import DriverError, NodeDriver, get_driver
from slices.models import GpuRollup, Instance, InstanceNode, Node, NodeFailure, NodeWatch
from slices.services import heartbeats, storage
from slices.services.allocation import claim_replacement, move_part
from slices.services.instances import (
    close_billing,
    enqueue_on_commit,
    record_event,
    release_instance,
    transition,
)
from slices.services.provisioning import node_target

logger = logging.getLogger(__name__)

BAD_SIGNALS = (NodeSignal.XID, NodeSignal.NVML, NodeSignal.SSH_LOST)


# ---------------------------------------------------------------------------------------------
# Node health
# ---------------------------------------------------------------------------------------------


def _watch(node: Node) -> NodeWatch:
    return heartbeats.watch(node)


def record_heartbeat(node: Node, at: datetime | None = None, source: str = "agent") -> None:
    """The node said it is alive (its agent's heartbeat, the driver's probe, a start)."""
    heartbeats.record_heartbeat(node, at, source)


def report_node_signal(
    node: Node, signal: str, detail: str = "", at: datetime | None = None
) -> None:
    """A health signal: a bad one starts the grace (the first one is kept); ``recovered`` clears
    it before the grace ends."""
    signal = NodeSignal(signal)
    at = at or timezone.now()
    watch = _watch(node)
    if signal == NodeSignal.HEARTBEAT:
        record_heartbeat(node, at, "agent")
    elif signal == NodeSignal.RECOVERED:
        NodeWatch.objects.filter(pk=watch.pk, failed_at__isnull=True).update(
            bad_since=None, bad_signal="", bad_detail=""
        )
    else:
        NodeWatch.objects.filter(pk=watch.pk, bad_since__isnull=True).update(
            bad_since=at, bad_signal=signal, bad_detail=detail[:255]
        )
        Node.objects.filter(pk=node.pk, health=NodeHealth.OK).update(health=NodeHealth.DEGRADED)


def ingest_telemetry(now: datetime | None = None, window_minutes: int = 5) -> int:
    """Health signals from the GPU telemetry (the agents' 1-minute rollups): a minute with Xid
    errors is a bad signal, a clean later one clears it. GPU samples are never a heartbeat (an
    idle node or a 无卡模式 run has none): heartbeats come from the node (``probe_nodes``).
    Returns the number of nodes seen."""
    now = now or timezone.now()
    rows = (
        GpuRollup.objects.filter(
            minute__gte=now - timedelta(minutes=window_minutes),
            instance__state=InstanceState.RUNNING,
        )
        .values("hostname", "minute")
        .annotate(xids=Sum("xid_events"))
        .order_by("hostname", "minute")
    )
    latest: dict[str, tuple[datetime, int]] = {}
    for row in rows:
        latest[row["hostname"]] = (row["minute"], int(row["xids"] or 0))
    nodes = {n.hostname: n for n in Node.objects.filter(hostname__in=list(latest))}
    for hostname, (minute, xids) in latest.items():
        node = nodes.get(hostname)
        if node is None:
            continue
        end = minute + timedelta(minutes=1)
        if xids:
            report_node_signal(
                node, NodeSignal.XID, f"{xids} Xid event(s) in the minute {minute:%H:%M}", at=end
            )
        else:
            NodeWatch.objects.filter(
                node=node, bad_signal=NodeSignal.XID, failed_at__isnull=True
            ).update(bad_since=None, bad_signal="", bad_detail="")
    return len(nodes)


def probe_nodes(driver: NodeDriver | None = None, now: datetime | None = None) -> list[str]:
    """The nodes' heartbeats: ask every node under a running instance (GPU-less ones included)
    whether it is alive, through its instance's driver (the ssh driver over the pinned
    connection; the simulated fleet as it plays it). An answer is a heartbeat and clears a lost
    SSH signal; no answer is a miss and starts (or keeps) the ``ssh_lost`` grace. Returns the
    hostnames that did not answer."""
    parts = (
        InstanceNode.objects.filter(instance__state=InstanceState.RUNNING)
        .select_related("node", "instance")
        .order_by("node_id")
    )
    drivers: dict[str, NodeDriver] = {}
    checks: dict[int, tuple[Node, Any]] = {}
    for part in parts:
        if part.node_id in checks:
            continue
        name = part.instance.driver or ""
        drv = driver or drivers.get(name)
        if drv is None:
            drv = drivers[name] = get_driver(name or None)
        if getattr(drv, "probe", None) is None:
            continue  # a driver that cannot ask: no heartbeat, no misses
        checks[part.node_id] = (part.node, drv)
    if not checks:
        return []

    def probe(check: tuple[Node, Any]) -> str:
        node, drv = check
        try:
            drv.probe(node_target(node, 0, 0))
        except DriverError as exc:
            return (exc.detail or exc.code) or "no answer"
        return ""

    lost: list[str] = []
    # When the probes ran: a pass's start (the tests' moved clock), or later when it is later.
    at = max(now, timezone.now()) if now else timezone.now()
    todo = list(checks.values())
    answered: list[int] = []
    with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
        for (node, _drv), error in zip(todo, pool.map(probe, todo), strict=True):
            if error:
                heartbeats.node_missed(node, error, at)
                lost.append(node.hostname)
            else:
                answered.append(node.pk)
    heartbeats.nodes_answered(answered, at, source="probe")
    return lost


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def check_node_health(now: datetime | None = None) -> list[str]:
    """Fail the nodes whose bad signal or silence outlived the grace; hostnames failed.

    Judged on the node's own word only. A bad signal from its agent (a GPU Xid error, NVML
    failing) not cleared within ``SLICES_NODE_FAIL_GRACE_SECONDS``; or silence: the node answered
    none of the console's probes (``PROBE_MISSES_TO_FAIL`` or more in a row) for
    ``SLICES_NODE_HEARTBEAT_GRACE_SECONDS`` since the first it missed. Silence is counted from a
    probe that got no answer, never from the age of the last heartbeat: a node the console did not
    ask (it ran nothing, the reconciler was down) is not silent. Each failure is kept
    (``NodeFailure``) with the evidence it was judged on."""
    now = now or timezone.now()
    fail_grace = int(settings.SLICES_NODE_FAIL_GRACE_SECONDS)
    heartbeat_grace = int(settings.SLICES_NODE_HEARTBEAT_GRACE_SECONDS)
    cutoff = now - timedelta(seconds=fail_grace)
    silent = now - timedelta(seconds=heartbeat_grace)
    failed: list[str] = []
    # A node an operator returned to service starts with a clean watch.
    NodeWatch.objects.filter(failed_at__isnull=False, node__state__in=SCHEDULABLE_STATES).update(
        failed_at=None, bad_since=None, bad_signal="", bad_detail="", last_heartbeat_at=None,
        heartbeat_source="", misses=0, probe_error="",
    )  # fmt: skip
    lost = Q(bad_signal=NodeSignal.SSH_LOST)
    by_signal = Q(bad_since__lte=cutoff) & ~lost
    by_silence = lost & Q(bad_since__lte=silent, misses__gte=heartbeats.PROBE_MISSES_TO_FAIL)
    due = NodeWatch.objects.filter(failed_at__isnull=True).filter(by_signal | by_silence)
    for watch in due.select_related("node"):
        if watch.bad_signal == NodeSignal.SSH_LOST:
            rule, signal = "silence", str(NodeSignal.SSH_LOST)
            detail = (
                f"no answer to {watch.misses} probes since {watch.bad_since:%Y-%m-%d %H:%M:%S}: "
                f"{watch.probe_error}"
            )
        else:
            rule, signal, detail = "signal", watch.bad_signal, watch.bad_detail
        evidence = {
            "rule": rule,
            "bad_since": _iso(watch.bad_since),
            "last_heartbeat_at": _iso(watch.last_heartbeat_at),
            "heartbeat_source": watch.heartbeat_source,
            "last_probe_at": _iso(watch.last_probe_at),
            "probe_error": watch.probe_error,
            "misses": watch.misses,
            "fail_grace_s": fail_grace,
            "heartbeat_grace_s": heartbeat_grace,
            "judged_at": now.isoformat(),
        }
        if fail_node(watch.node, signal, detail, now=now, evidence=evidence):
            failed.append(watch.node.hostname)
    return failed


@transaction.atomic
def fail_node(
    node: Node,
    signal: str,
    detail: str = "",
    *,
    now: datetime | None = None,
    evidence: dict[str, Any] | None = None,
) -> bool:
    """Take a node out of the pool and migrate the running instances on it (compare-and-set);
    the failure is kept with its signal and ``evidence`` (``NodeFailure``, automatic)."""
    now = now or timezone.now()
    won = (
        Node.objects.filter(pk=node.pk)
        .exclude(state=NodeState.FAILED)
        .update(
            state=NodeState.FAILED,
            health=NodeHealth.UNREACHABLE,
            state_changed_at=now,
            note=f"{signal}: {detail}"[:255],
        )
    )
    _watch(node)
    NodeWatch.objects.filter(node=node).update(
        failed_at=now, bad_signal=signal, bad_detail=detail[:255], bad_since=F("bad_since")
    )
    if not won:
        return False
    logger.warning("node %s failed (%s: %s)", node.hostname, signal, detail)
    moved = instances_on(node)
    NodeFailure.objects.create(
        node=node,
        at=now,
        automatic=True,
        signal=signal,
        detail=detail[:255],
        evidence={
            **(evidence or {"rule": "signal"}),
            "instances": [f"{i.name} ({i.short_id})" for i in moved],
        },
    )
    for instance in moved:
        start_migration(instance, node, signal=signal)
    return True


def instances_on(node: Node) -> list[Instance]:
    ids = InstanceNode.objects.filter(node=node).values("instance_id")
    return list(Instance.objects.filter(pk__in=ids, state=InstanceState.RUNNING))


# ---------------------------------------------------------------------------------------------
# Migration
# ---------------------------------------------------------------------------------------------


@transaction.atomic
def start_migration(instance: Instance, node: Node, *, signal: str = "") -> bool:
    """running → migrating: the GPU charge stops now; a worker finds a replacement node."""
    if not transition(
        instance,
        InstanceState.MIGRATING,
        code="migrating",
        level=EventLevel.WARNING,
        params={"node": node.hostname, "signal": signal},
        # A new migration: its checkpoint and its "no replacement" notice are still to be told.
        migration_checkpoint_noted=False,
        migration_wait_told=False,
        restarted_at=timezone.now(),  # the ETA of its provisioning again counts from here
    ):
        return False
    InstanceNode.objects.filter(instance=instance, node=node).update(
        failed=True, message=f"node failed: {signal}"[:255]
    )
    close_billing(instance, CloseReason.MIGRATED, code="billing_paused")
    enqueue_on_commit("slices.tasks.migrate_instance_task", instance.pk)
    # The owner hears of it in the notice centre, by mail and SMS (issue 33), once per move.
    notices.notify_user_id(
        instance.created_by_id,
        "node_failed_migrating",
        {"name": instance.name, "node": node.hostname},
        key=f"migrating:{instance.pk}:{instance.state_changed_at.isoformat()}",
        link=f"/instances/{instance.public_id}/",
    )
    return True


def _claim_replacement(instance: Instance, part: InstanceNode) -> tuple[Node, int] | None:
    """The allocator's replacement for a failed part (`allocation.claim_replacement`): in the
    instance's cluster, a slice's part in the same SU when one is free there (else an SU the slice
    already uses), a host's part an aligned block of the best-fitting node."""
    others = list(
        InstanceNode.objects.filter(instance=instance).exclude(pk=part.pk).select_related("node")
    )
    healthy = [p.node for p in others if not p.failed and p.node.state != NodeState.FAILED]
    return claim_replacement(
        part.node,
        bin(part.gpu_mask).count("1"),
        whole=instance.kind == AllocationKind.SLICE,
        near=healthy,
        avoid=[p.node for p in others],
    )


def _claim_gpuless_host(instance: Instance, part: InstanceNode) -> tuple[Node, int] | None:
    """A 无卡模式 instance's new host: it takes no GPU, so any healthy schedulable node of the
    failed node's cluster will do (its own SU first), whether or not it has a free GPU."""
    failed = part.node
    held = InstanceNode.objects.filter(instance=instance).values("node_id")
    candidates = (
        Node.objects.filter(
            cluster_id=failed.cluster_id, state__in=SCHEDULABLE_STATES, health=NodeHealth.OK
        )
        .exclude(pk__in=held)
        .select_related("su")
        .order_by("hostname")
    )
    nodes = list(candidates)
    if not nodes:
        return None
    nodes.sort(key=lambda n: n.su_id != failed.su_id)  # stable: hostname order within each
    return nodes[0], 0


def _voucher(instance: Instance, count: int) -> Decimal:
    try:
        amount = Decimal(str(settings.SLICES_MIGRATION_VOUCHER))
    except InvalidOperation:
        return Decimal("0")
    if amount <= 0:
        return Decimal("0")
    billing.grant_voucher(
        for_row(instance),
        amount,
        reason=f"migration of {instance.name} ({instance.short_id})",
        valid_days=int(settings.SLICES_MIGRATION_VOUCHER_DAYS),
        key=f"slices-migration-{instance.public_id}-{count}",
    )
    return amount


def drive_migration(instance_id: int) -> str:
    """The worker's half: find the checkpoint, take a replacement node, provision again."""
    instance = Instance.objects.filter(pk=instance_id).select_related("team", "created_by").first()
    if instance is None or instance.state != InstanceState.MIGRATING:
        return "nothing to do"
    checkpoint = storage.refresh_checkpoint(instance)
    with transaction.atomic():
        # Once per migration (a re-driven worker does not say it again): the field, set with
        # its event, is the record; start_migration clears it.
        first = Instance.objects.filter(pk=instance.pk, migration_checkpoint_noted=False).update(
            migration_checkpoint_noted=True
        )
        if first and checkpoint:
            record_event(
                instance,
                EventKind.STATE,
                code="checkpoint_found",
                params={"step": checkpoint["step"], "path": checkpoint["path"]},
            )
        elif first:
            record_event(
                instance,
                EventKind.STATE,
                code="no_checkpoint",
                level=EventLevel.WARNING,
                params={"dir": storage.checkpoint_env(instance)["CHECKPOINT_DIR"]},
            )
    with transaction.atomic():
        locked = Instance.objects.select_for_update().filter(pk=instance.pk).first()
        if locked is None or locked.state != InstanceState.MIGRATING:
            return "nothing to do"
        broken = list(
            instance.nodes.select_related("node", "node__su").filter(
                Q(failed=True) | Q(node__state=NodeState.FAILED)
            )
        )
        replaced: list[tuple[InstanceNode, Node, int]] = []
        for part in broken:
            if part.node.state in SCHEDULABLE_STATES and part.node.health == NodeHealth.OK:
                # An operator returned the node meanwhile: it still holds this part's cards.
                replaced.append((part, part.node, part.gpu_mask))
                continue
            claimed = (
                _claim_gpuless_host(instance, part)
                if instance.gpuless
                else _claim_replacement(instance, part)
            )
            if claimed is None:
                transaction.set_rollback(True)  # keep no half-taken replacement
                break
            replaced.append((part, *claimed))
        else:
            return _swap_in(instance, replaced)
    return _no_replacement(instance)


def _swap_in(instance: Instance, replaced: list[tuple[InstanceNode, Node, int]]) -> str:
    """Point the failed ranks at their replacements (allocation, GPU rows, instance nodes),
    redo every node's steps after ``connect`` (the job restarts from the checkpoint), provision."""
    allocation = instance.allocation
    moves: list[dict[str, Any]] = []
    for part, new, mask in replaced:
        old = part.node
        if allocation is not None and new.pk != old.pk:
            # The failed node's cards leave this allocation (the node stays failed).
            move_part(allocation, old, new, mask)
        # A new node: the instance's sshd gets a port there (its old one stays with the failed
        # node); the region gateway's keys follow when it runs again (issue 19).
        moved = {"ssh_port": None} if new.pk != old.pk else {}
        InstanceNode.objects.filter(pk=part.pk).update(
            node=new, hostname=new.hostname, gpu_mask=mask, step="reserve", failed=False,
            message="", **moved,
        )  # fmt: skip
        moves.append(
            {
                "from": old.hostname,
                "to": new.hostname,
                "same_su": new.su_id == old.su_id,
                "su": new.su.name,
                "rank": part.rank,
            }
        )
    # The surviving nodes restart the job too (a distributed job restarts on every rank).
    InstanceNode.objects.filter(instance=instance, step="ready").update(step="connect")
    # The voucher's idempotency key counts the replacements (a field written with the event,
    # read under the row lock drive_migration holds): one voucher per replacement, however often
    # the worker is re-driven.
    count = Instance.objects.values_list("replacements", flat=True).get(pk=instance.pk) + 1
    voucher = _voucher(instance, count)
    transition(
        instance,
        InstanceState.PROVISIONING,
        code="replacement_allocated",
        replacements=count,
        params={
            "moves": moves,
            "summary": ", ".join(f"#{m['rank']} {m['from']} → {m['to']}" for m in moves) or "—",
            "resume_step": (instance.checkpoint or {}).get("step"),
            "voucher": str(voucher) if voucher else "",
        },
    )
    enqueue_on_commit("slices.tasks.provision_instance_task", instance.pk)
    return "replaced"


def _no_replacement(instance: Instance) -> str:
    instance.refresh_from_db()
    if instance.on_no_replacement == NoReplacement.RELEASE:
        record_event(
            instance,
            EventKind.STATE,
            code="no_replacement",
            level=EventLevel.WARNING,
            params={"then": "release"},
        )
        release_instance(instance, by="migration", code="released_no_replacement")
        return "released"
    with transaction.atomic():
        # Told once per migration: the field is written with its event; start_migration clears it.
        if Instance.objects.filter(pk=instance.pk, migration_wait_told=False).update(
            migration_wait_told=True
        ):
            record_event(
                instance,
                EventKind.STATE,
                code="no_replacement",
                level=EventLevel.WARNING,
                params={"then": "wait"},
            )
    return "waiting"


@transaction.atomic
def set_no_replacement_choice(instance: Instance, choice: str) -> None:
    """The owner's choice while no node is free: wait, or release now (and from then on)."""
    choice = NoReplacement(choice)
    Instance.objects.filter(pk=instance.pk).update(on_no_replacement=choice)
    instance.on_no_replacement = choice
    if choice == NoReplacement.RELEASE and instance.state == InstanceState.MIGRATING:
        release_instance(instance, by="owner", code="released_no_replacement")


def retry_waiting_migrations(now: datetime | None = None) -> list[str]:
    """The reconciler: migrate running instances on nodes failed by an operator, and retry the
    ones waiting for a node."""
    started: list[str] = []
    failed_parts = InstanceNode.objects.filter(
        instance__state=InstanceState.RUNNING, node__state=NodeState.FAILED
    ).select_related("instance", "node")
    for part in failed_parts:
        if start_migration(part.instance, part.node, signal="operator"):
            started.append(str(part.instance.public_id))
    for instance in Instance.objects.filter(state=InstanceState.MIGRATING):
        enqueue_on_commit("slices.tasks.migrate_instance_task", instance.pk)
        started.append(str(instance.public_id))
    return started
