"""关机 / 开机: stopping a GPU host keeps its system disk and frees its GPUs; starting takes cards
again (README "Storage and resilience").

- Stop: the GPU charge closes at once; the node stops the container and keeps the instance's
  directory (its system disk), which is billed as storage from that second (the account's storage
  session, ``slices.services.disks``); the GPUs go back to the pool.
- Start: free cards on the same host when there are enough; otherwise another host in the region
  (the system disk is copied there first); or, on request, without GPUs (无卡模式: the same host,
  no cards, no GPU charge, the disk still billed as storage) to fetch or tidy data.
- A stopped instance stays stopped for at most ``SLICES_STOPPED_RELEASE_DAYS``; its owner is
  warned ``SLICES_STOPPED_WARN_DAYS`` before, then the reconciler releases it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any, cast

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext_noop

from billing.choices import BillingMode, CloseReason
from console.audit import services as audit
from console.notices import services as notices
from console.tenancy import for_row
from slices import lifecycle
from slices.choices import (
    AllocationKind,
    EventKind,
    EventLevel,
    InstanceState,
)
from slices.drivers import DriverError, NodeDriver, capabilities, get_driver
from slices.errors import InstanceConflict, quota_exceeded
from slices.models import Allocation, Instance, InstanceNode, Node
from slices.services import access
from slices.services import disks as disk_service
from slices.services.allocation import (
    NoCapacity,
    allocate,
    claim_on_node,
    release_allocation,
)
from slices.services.instances import (
    OrderRequest,
    _lock_quota,
    cards_in_use,
    check_funds,
    check_member_limits,
    close_billing,
    enqueue_on_commit,
    fail_instance,
    price_name,
    record_event,
    record_logs,
    release_instance,
    transition,
)
from slices.services.provisioning import (
    _Logs,
    acquire_lease,
    build_spec,
    drop_lease,
    node_target,
    provision_instance,
    record_node_warning,
)

logger = logging.getLogger(__name__)


class StartMode(StrEnum):
    AUTO = "auto"  # same host if it has the cards, else another host in the region
    SAME_HOST = "same"  # only the same host
    GPULESS = "gpuless"  # 无卡模式


# ---------------------------------------------------------------------------------------------
# Stop
# ---------------------------------------------------------------------------------------------


def _check_stoppable(instance: Instance) -> None:
    if instance.kind == AllocationKind.SLICE:
        raise InstanceConflict(
            gettext_noop(
                "A cluster slice cannot be stopped (its nodes are placed together); release it "
                "and keep your data on the PFS or a cloud disk."
            )
        )
    if instance.billing_mode == BillingMode.TERM:
        raise InstanceConflict(
            gettext_noop("A locked-price term runs to its end; it cannot be stopped.")
        )
    if instance.state not in lifecycle.STOPPABLE:
        raise InstanceConflict(
            gettext_noop("Only a running instance can be stopped; this one is %(state)s."),
            state=instance.get_state_display(),
        )


@transaction.atomic
def stop_instance(instance: Instance, *, by: str, who: Any = None, request: Any = None) -> bool:
    """关机: the GPU charge stops now and the system disk is billed as storage; a worker stops
    the node and frees the GPUs. True for the call that stopped it."""
    instance.refresh_from_db()
    _check_stoppable(instance)
    per_day = disk_service.kept_disk_per_day(instance)
    if not transition(
        instance,
        InstanceState.STOPPING,
        code="stopping",
        params={"by": by, "disk_gb": instance.system_disk_gb, "per_day": str(per_day)},
    ):
        return False
    audit.record(who, "instance.stop", instance, before={"state": "running"}, after={"state": "stopping", "by": by}, request=request)  # fmt: skip
    close_billing(instance, CloseReason.RELEASED)
    disk_service.sync_storage_billing(instance.team)
    enqueue_on_commit("slices.tasks.stop_instance_task", instance.pk)
    return True


def drive_stop(instance_id: int, driver: NodeDriver | None = None) -> str:
    """The worker's half of a stop: stop the container on the node, free the GPUs, → stopped."""
    instance = Instance.objects.filter(pk=instance_id).select_related("team", "created_by").first()
    if instance is None or instance.state != InstanceState.STOPPING:
        return "nothing to do"
    if not acquire_lease(instance):
        return "busy"
    driver = driver or get_driver(instance.driver or None)
    try:
        spec = build_spec(instance)
        logs = _Logs()
        for target in spec.nodes:
            try:
                if not capabilities(driver.name).stop:  # no 关机 support: nothing kept there
                    raise DriverError("unsupported", f"the {driver.name} driver cannot stop")
                cast(Any, driver).stop(spec, target, logs.sink(target.hostname, "stop"))
            except DriverError as exc:
                record_node_warning(instance, "stop_failed", target.hostname, exc)
        record_logs(instance, logs.drain())
        with transaction.atomic():
            if instance.allocation_id:
                release_allocation(Allocation.objects.get(pk=instance.allocation_id))
            if not transition(
                instance,
                InstanceState.STOPPED,
                code="stopped",
                params={"disk_gb": instance.system_disk_gb},
                stopped_at=timezone.now(),
                stop_warnings=0,
                allocation=None,
                gpuless=False,
            ):
                return "cancelled"
            access.clear_ssh_ports(instance)  # its sshd stopped with it; the next start gets one
            disk_service.sync_storage_billing(instance.team)
        return "stopped"
    finally:
        drop_lease(instance)


# ---------------------------------------------------------------------------------------------
# Start
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartResult:
    node: str
    moved_from: str  # "" when it starts on the same host
    gpuless: bool


@transaction.atomic
def start_instance(
    instance: Instance,
    *,
    by: str,
    mode: str = StartMode.AUTO,
    who: Any = None,
    request: Any = None,
) -> StartResult:
    """开机: take cards again (same host first), or start without GPUs; a worker provisions.

    Raises ``InstanceConflict`` (not stopped), ``NoCapacity`` (no cards free in the region: the
    page offers 无卡模式), ``QuotaExceeded`` or billing's ``InsufficientFunds``; nothing changes then.
    """
    mode = StartMode(mode)
    instance.refresh_from_db()
    if instance.state not in lifecycle.STARTABLE:
        raise InstanceConflict(
            gettext_noop("Only a stopped instance can be started; this one is %(state)s."),
            state=instance.get_state_display(),
        )
    part = instance.nodes.select_related("node", "node__cluster").order_by("rank").first()
    if part is None:
        raise InstanceConflict(gettext_noop("This instance has no system disk to start from."))
    old = part.node
    if not transition(
        instance,
        InstanceState.STARTING,
        code="starting",
        params={"by": by, "mode": mode},
        restarted_at=timezone.now(),  # written with its event (the ETA counts from it)
    ):
        raise InstanceConflict(gettext_noop("The instance is already starting."))
    allocation: Allocation | None = None
    node = old
    gpuless = mode == StartMode.GPULESS
    if not gpuless:
        # The account's order lock, as an order takes it: a start and an order (or two starts)
        # never pass the quota and the funds check on the same cards and the same balance.
        limit = _lock_quota(for_row(instance))
        used = cards_in_use(for_row(instance)) - instance.cards
        if used + instance.cards > limit:
            raise quota_exceeded(limit, used, instance.cards)
        price = price_name(instance.gpu_model.code) or instance.gpu_model.code
        again = OrderRequest(gpu_model=instance.gpu_model.code, cards=instance.cards)
        # billing's rule: the balance carries the account's whole burn with it
        check_funds(for_row(instance), price, again, starting=instance)
        # the maker's card quota and monthly budget in the team (their usage, issue 30)
        check_member_limits(for_row(instance), price, again, starting=instance)
        # The allocator claims, with its rules (an aligned block of the host's GPUs).
        allocation = claim_on_node(
            for_row(instance), old, instance.cards, label=f"instance {instance.public_id}"
        )
        if allocation is None and mode == StartMode.SAME_HOST:
            raise NoCapacity(
                _unplaceable(old.hostname),
                None,
                gpu_model=instance.gpu_model.code,
                cards=instance.cards,
                region=instance.region.code if instance.region else None,
            )
        if allocation is None:
            allocation = allocate(
                for_row(instance),
                instance.cards,
                instance.gpu_model.code,
                instance.region.code if instance.region else None,
                label=f"instance {instance.public_id}",
            )
            node = allocation.nodes.select_related("node").get().node
    mask = allocation.nodes.get().gpu_mask if allocation else 0
    InstanceNode.objects.filter(pk=part.pk).update(
        node=node, hostname=node.hostname, gpu_mask=mask, step="reserve", failed=False, message=""
    )
    moved_from = old.hostname if node.pk != old.pk else ""
    transition(
        instance,
        InstanceState.PROVISIONING,
        code="start_placed",
        params={
            "node": node.hostname,
            "moved_from": moved_from,
            "gpuless": gpuless,
            "cards": 0 if gpuless else instance.cards,
        },
        allocation=allocation,
        gpuless=gpuless,
        disk_move_from=moved_from,
        stopped_at=None,
        stop_warnings=0,
    )
    disk_service.sync_storage_billing(instance.team)
    audit.record(who, "instance.start", instance, before={"state": "stopped"}, after={"state": "provisioning", "by": by, "mode": mode, "node": node.hostname, "gpuless": gpuless}, request=request)  # fmt: skip
    enqueue_on_commit("slices.tasks.start_instance_task", instance.pk)
    return StartResult(node.hostname, moved_from, gpuless)


def _unplaceable(hostname: str) -> Any:
    # The allocator's own "no capacity" record (a dataclass of the pure topology package).
    from slices import topology

    return topology.Unplaceable("", "no_capacity", f"{hostname} has no free cards")


def drive_start(instance_id: int, driver: NodeDriver | None = None) -> str:
    """The worker's half of a start: copy the system disk when the host changed, then provision."""
    instance = Instance.objects.filter(pk=instance_id).select_related("team", "created_by").first()
    if instance is None or instance.state != InstanceState.PROVISIONING:
        return "nothing to do"
    src_host = instance.disk_move_from  # cleared with the disk_moved event
    if src_host:
        driver = driver or get_driver(instance.driver or None)
        spec = build_spec(instance)
        src = Node.objects.filter(hostname=src_host).first()
        dst = spec.nodes[0]
        logs = _Logs()
        try:
            if src is not None and capabilities(driver.name).migration:
                cast(Any, driver).move_disk(
                    spec, node_target(src, 0, 0), dst, logs.sink(dst.hostname, "prepare")
                )
        except DriverError as exc:
            record_logs(instance, logs.drain())
            fail_instance(instance, "disk_move_failed", {"error": exc.detail or exc.code})
            return "failed"
        record_logs(instance, logs.drain())
        with transaction.atomic():
            Instance.objects.filter(pk=instance.pk).update(disk_move_from="")
            record_event(
                instance,
                EventKind.STATE,
                code="disk_moved",
                params={"from": src_host, "to": dst.hostname, "gb": instance.system_disk_gb},
            )
    return provision_instance(instance_id, driver)


# ---------------------------------------------------------------------------------------------
# Long-stopped instances (the reconciler)
# ---------------------------------------------------------------------------------------------


def release_at(instance: Instance) -> datetime | None:
    if instance.stopped_at is None:
        return None
    return instance.stopped_at + timedelta(days=int(settings.SLICES_STOPPED_RELEASE_DAYS))


def release_long_stopped(now: datetime) -> tuple[list[str], list[str]]:
    """Warn owners of instances stopped for long, then release them: (warned, released)."""
    days = int(settings.SLICES_STOPPED_RELEASE_DAYS)
    warn_days = sorted(
        {int(d) for d in settings.SLICES_STOPPED_WARN_DAYS if 0 < int(d) < days}, reverse=True
    )
    warned: list[str] = []
    released: list[str] = []
    for instance in Instance.objects.filter(state=InstanceState.STOPPED, stopped_at__isnull=False):
        stopped_at: datetime = instance.stopped_at  # type: ignore[assignment]  # filtered not null
        due = stopped_at + timedelta(days=days)
        if now >= due:
            if release_instance(instance, by="auto", code="stopped_too_long"):
                released.append(str(instance.public_id))
            continue
        # Warnings due by now that were not sent yet (one per configured day, in order).
        sent = instance.stop_warnings
        owed = len([d for d in warn_days if now >= due - timedelta(days=d)])
        if owed > sent:
            won = Instance.objects.filter(pk=instance.pk, stop_warnings=sent).update(
                stop_warnings=F("stop_warnings") + (owed - sent)
            )
            if won:
                left = max(0, int((due - now).total_seconds() // 3600))
                record_event(
                    instance,
                    EventKind.STATE,
                    code="stopped_release_warning",
                    level=EventLevel.WARNING,
                    params={"hours": left, "release_at": due.isoformat()},
                )
                # D-7 / D-3 / D-1 before the automatic release (issue 33), each sent once.
                notices.notify_user_id(
                    instance.created_by_id,
                    "release_warning",
                    {
                        "name": instance.name,
                        "days": max(1, -(-left // 24)),
                        "release_at": timezone.localtime(due).strftime("%Y-%m-%d %H:%M"),
                    },
                    key=f"stopped_release:{instance.pk}:{stopped_at.isoformat()}:{owed}",
                    link=f"/instances/{instance.public_id}/",
                )
                warned.append(str(instance.public_id))
    return warned, released


def stopped_cost_per_day(instance: Instance) -> Decimal:
    """The daily storage amount a stop adds (shown on the page before and while stopped)."""
    return disk_service.kept_disk_per_day(instance)


__all__ = [
    "StartMode",
    "StartResult",
    "drive_start",
    "drive_stop",
    "release_at",
    "release_long_stopped",
    "start_instance",
    "stop_instance",
    "stopped_cost_per_day",
]
