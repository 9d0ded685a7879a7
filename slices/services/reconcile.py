"""The reconciler (Celery beat): nothing stuck, nothing leaked, nothing billed that does not run.

- An instance in a transitional state whose worker lease expired (the worker died, the broker lost
  the message) is driven on again, a bounded number of times, then failed cleanly.
- A running instance past its automatic release time is released.
- An active allocation that no live instance holds (older than a grace period) is freed.
- A running instance whose usage session billing closed is released.

Everything it does is derived from the database, so a missed run (beat could not publish during
a broker outage, the worker was down) is harmless: the next run finds the same work. Each pass
retries transient errors itself (console/retries.py). The first pass, taking over instances
whose worker died, also runs alone every ``SLICES_TAKEOVER_INTERVAL`` seconds (``take_over``):
with the lease's heartbeat (``SLICES_LEASE_SECONDS``) a dead worker's instance is driven on by
another worker within lease + interval (15 + 5 s by default).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing import services as billing
from billing.choices import BillingMode
from console.retries import retry_transient
from slices import lifecycle
from slices.choices import AllocationState, EventKind, EventLevel, InstanceState
from slices.models import Allocation, Instance
from slices.services import jobs, migration, power
from slices.services.allocation import release_allocation
from slices.services.instances import (
    INSTANCE_RESOURCE,
    fail_instance,
    record_event,
    release_instance,
)

logger = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    redriven: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    auto_released: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    unbilled: list[str] = field(default_factory=list)
    # Storage and resilience: failed nodes, migrations started or retried, long-stopped instances.
    nodes_failed: list[str] = field(default_factory=list)
    migrations: list[str] = field(default_factory=list)
    stop_warned: list[str] = field(default_factory=list)
    stop_released: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"redriven {len(self.redriven)}, failed {len(self.failed)}, auto-released "
            f"{len(self.auto_released)}, leaked allocations freed {len(self.leaked)}, "
            f"stopped by billing {len(self.unbilled)}"
        )


def reconcile(now: datetime | None = None) -> ReconcileReport:
    now = now or timezone.now()
    report = ReconcileReport()

    def stop_passes() -> None:
        report.stop_warned, report.stop_released = power.release_long_stopped(now)

    def node_health() -> None:
        report.nodes_failed = migration.check_node_health(now)

    def migrations() -> None:
        report.migrations = migration.retry_waiting_migrations(now)

    passes: list[tuple[str, Callable[[], object]]] = [
        ("re-driving stuck instances", lambda: _redrive(now, report)),
        ("automatic releases", lambda: _auto_release(now, report)),
        ("freeing leaked allocations", lambda: _free_leaks(now, report)),
        ("releasing what billing stopped", lambda: _billing_closed(report)),
        ("node heartbeats", lambda: migration.ingest_telemetry(now)),
        ("probing nodes", lambda: migration.probe_nodes(now=now)),
        ("node health", node_health),
        ("migrations", migrations),
        ("long-stopped instances", stop_passes),
    ]
    for what, run in passes:
        # Every pass is idempotent (compare-and-set), so re-running one after an error is safe.
        retry_transient(run, what=f"reconciler: {what}")
    return report


def take_over(now: datetime | None = None) -> ReconcileReport:
    """The reconciler's first pass alone (cheap: one indexed query), run every few seconds."""
    report = ReconcileReport()
    retry_transient(
        lambda: _redrive(now or timezone.now(), report), what="reconciler: taking over instances"
    )
    return report


def _redrive(now: datetime, report: ReconcileReport) -> None:
    max_attempts = int(settings.SLICES_MAX_DRIVE_ATTEMPTS)
    stuck = Instance.objects.filter(
        state__in=[s.value for s in lifecycle.TRANSITIONAL],
    ).filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
    grace = timedelta(seconds=int(settings.SLICES_LEASE_SECONDS))
    for instance in stuck.filter(state_changed_at__lt=now - grace):
        with transaction.atomic():
            # Compare-and-set on the attempt counter: two reconcilers re-drive once. The task is
            # sent inside the transaction: a broker that cannot take it rolls the attempt back
            # (an outage must not use up the attempts and fail the order); a worker that picks
            # it up at once waits on this row's lock for the commit.
            won = (
                Instance.objects.filter(pk=instance.pk, attempts=instance.attempts)
                .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
                .update(attempts=instance.attempts + 1, state_changed_at=now)
            )
            if won:
                _redrive_one(instance, instance.attempts + 1, max_attempts, report)
    # Failed instances whose teardown never ran (worker died after the failure).
    for instance in Instance.objects.filter(
        state=InstanceState.FAILED,
        resources_freed_at__isnull=True,
        state_changed_at__lt=now - grace,
    ).filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now)):
        _send("teardown_instance_task", instance.pk)
        report.redriven.append(str(instance.public_id))


def _redrive_one(
    instance: Instance, attempt: int, max_attempts: int, report: ReconcileReport
) -> None:
    if instance.state in (InstanceState.PENDING, InstanceState.ALLOCATING):
        # Orders allocate in the ordering transaction, so these cannot outlive a crash
        # holding GPUs; fail them cleanly.
        fail_instance(instance, "stuck", {})
        report.failed.append(str(instance.public_id))
    elif instance.state == InstanceState.STOPPING:
        _send("stop_instance_task", instance.pk)
        report.redriven.append(str(instance.public_id))
    elif attempt > max_attempts and instance.state != InstanceState.RELEASING:
        record_event(
            instance,
            EventKind.STATE,
            code="gave_up",
            params={"attempts": attempt - 1},
            level=EventLevel.ERROR,
        )
        fail_instance(instance, "interrupted", {})
        report.failed.append(str(instance.public_id))
    else:
        record_event(
            instance,
            EventKind.STATE,
            code="redriven",
            params={"attempt": attempt},
            level=EventLevel.WARNING,
        )
        # A release is re-driven however often it takes (its GPUs must be freed).
        task = (
            "teardown_instance_task"
            if instance.state == InstanceState.RELEASING
            else "provision_instance_task"
        )
        _send(task, instance.pk)
        report.redriven.append(str(instance.public_id))


def _send(task_name: str, instance_id: int) -> None:
    """Queue a lifecycle task now (a broker error goes up: the pass is retried)."""
    jobs.enqueue(f"slices.tasks.{task_name}", instance_id)


def _auto_release(now: datetime, report: ReconcileReport) -> None:
    due = Instance.objects.filter(
        state__in=[InstanceState.RUNNING, InstanceState.PROVISIONING], auto_release_at__lte=now
    )
    for instance in due:
        if release_instance(instance, by="auto", code="auto_release"):
            report.auto_released.append(str(instance.public_id))


def _free_leaks(now: datetime, report: ReconcileReport) -> None:
    grace = timedelta(seconds=int(settings.SLICES_LEAK_GRACE_SECONDS))
    live = Instance.objects.filter(
        state__in=[s.value for s in lifecycle.LIVE], allocation__isnull=False
    ).values("allocation_id")
    leaked = Allocation.objects.filter(
        state=AllocationState.ACTIVE, created_at__lt=now - grace
    ).exclude(pk__in=live)
    for allocation in leaked:
        if release_allocation(allocation):
            logger.warning("freed allocation %s held by no live instance", allocation.public_id)
            report.leaked.append(str(allocation.public_id))


def _billing_closed(report: ReconcileReport) -> None:
    """Running on-demand instances with no open usage session (billing stopped them): release."""
    running = Instance.objects.filter(
        state=InstanceState.RUNNING, billing_mode=BillingMode.ON_DEMAND, gpuless=False
    )
    ids = [str(i.public_id) for i in running]
    if not ids:
        return
    open_ids = billing.open_resource_ids(INSTANCE_RESOURCE, ids)
    for instance in running:
        if str(instance.public_id) not in open_ids and release_instance(
            instance, by="billing", code="billing_stopped"
        ):
            report.unbilled.append(str(instance.public_id))
