"""排队 (issue 32): admitting queued orders when capacity changes, and their start estimates.

A queued order is an ``Instance`` in state ``queued``: no allocation, no usage session, nothing
charged. The queue is the allocator's own discipline (`slices.topology.queue.schedule`: FIFO with
EASY backfill per GPU model and region, the placement rules of every order), run here on a
snapshot of the fleet; the GPUs are then taken through `slices.services.allocation` (the only
writer of claims), exactly as an order that starts at once takes them.

Admission runs whenever capacity may have grown (an allocation released, a node returned, an
order cancelled; the beat as a safety net) through ``admit_queue_task``. One admission per GPU
model at a time: the model's row is locked (``select_for_update``) for the whole pass, so two
workers never start the same queued order, and each start is a compare-and-set on its state.
At the start the order passes again the checks of an order (the team's card quota, billing's
``ensure_affordable``, the member's limits); failing them it leaves the queue with a notice
(``queued_skipped``), never silently; starting, its owner is told (``queued_started``), once.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing import services as billing
from console.errors import DomainError
from console.notices import services as notices
from console.tenancy import for_row
from slices import events, topology
from slices.choices import AllocationState, EventLevel, InstanceState
from slices.errors import quota_exceeded
from slices.models import Allocation, GpuModel, Instance
from slices.services.allocation import NoCapacity
from slices.services.fleet import build_fleet
from slices.services.instances import (
    OrderRequest,
    _CheckedOrder,
    _lock_quota,
    _reserve,
    cards_in_use,
    check_funds,
    check_member_limits,
    price_name,
    transition,
)
from slices.services.jobs import enqueue_on_commit
from slices.topology.estimate import DurationModel, estimate_starts
from slices.topology.queue import Waiting, queue_key, schedule

logger = logging.getLogger(__name__)

# Rentals that ended, read for the duration model (the newest first).
DURATION_HISTORY = 5000


def _ts(dt: datetime | None) -> float | None:
    return dt.timestamp() if dt is not None else None


def _waiting(i: Instance) -> Waiting:
    return Waiting(
        str(i.public_id),
        i.cards,
        i.gpu_model.code,
        i.region.code if i.region is not None else None,
        _ts(i.queued_at) or 0.0,
        float(i.queue_run_seconds) if i.queue_run_seconds else None,
        _ts(i.queue_deadline),
    )


def queued(gpu_model: str) -> list[Instance]:
    """The model's queued orders, oldest first (the FIFO order)."""
    return list(
        Instance.objects.filter(state=InstanceState.QUEUED, gpu_model__code=gpu_model)
        .select_related("gpu_model", "region", "team", "created_by")
        .order_by("queued_at", "id")
    )


def admit(gpu_model: str) -> dict[str, int]:
    """Start what the queue discipline lets start now, let go of what waited past its maximum
    wait, then re-estimate the rest. Safe to run twice and concurrently (see the module)."""
    counts = {"started": 0, "skipped": 0, "expired": 0}
    with transaction.atomic():
        # One admission per GPU model at a time: the others wait here, then see the new state.
        if GpuModel.objects.select_for_update().filter(code=gpu_model).first() is None:
            return counts
        rows = queued(gpu_model)
        if rows:
            now = timezone.now()
            fleet, _nodes = build_fleet(gpu_model)
            by_id = {str(i.public_id): i for i in rows}
            groups: dict[tuple[str, str], list[Waiting]] = {}
            for i in rows:
                w = _waiting(i)
                groups.setdefault(queue_key(w.gpu_model, w.region), []).append(w)
            for queue in groups.values():
                done = schedule(fleet, queue, now.timestamp())
                for w in done.expired:
                    if skip(by_id[w.id], "queue_expired"):
                        counts["expired"] += 1
                for w, _placement in done.started:
                    outcome = _start(by_id[w.id])
                    if outcome == "raced":
                        break  # an order placed meanwhile took the GPUs: the rest keep waiting
                    counts[outcome] += 1
        refresh_estimates(gpu_model)
    return counts


def _start(instance: Instance) -> str:
    """queued → allocating → provisioning, checked as an order is: "started", "skipped" (its
    funds, quota or limits failed: it leaves with a notice) or "raced" (no longer fits)."""
    who = for_row(instance)
    req = OrderRequest(
        gpu_model=instance.gpu_model.code,
        cards=instance.cards,
        billing_mode=instance.billing_mode,
        term_days=instance.term_days,
        auto_release_at=(
            timezone.now() + timedelta(seconds=instance.queue_run_seconds)
            if instance.queue_run_seconds and not instance.term_days
            else None
        ),
    )
    try:
        with transaction.atomic():  # a savepoint: a refusal keeps nothing of the attempt
            limit = _lock_quota(who)
            used = cards_in_use(who)
            if used + instance.cards > limit:
                raise quota_exceeded(limit, used, instance.cards)
            price = price_name(instance.gpu_model.code) or instance.gpu_model.code
            check_funds(who, price, req)
            check_member_limits(who, price, req)
            if req.auto_release_at is not None:
                Instance.objects.filter(pk=instance.pk).update(auto_release_at=req.auto_release_at)
            _reserve(instance, who, _checked(instance, req))
    except NoCapacity:
        return "raced"
    except (DomainError, billing.InsufficientFunds) as exc:
        code = "queue_funds" if isinstance(exc, billing.InsufficientFunds) else "queue_limits"
        return "skipped" if skip(instance, code) else "raced"
    enqueue_on_commit("slices.tasks.provision_instance_task", instance.pk)
    waited = int((timezone.now() - (instance.queued_at or timezone.now())).total_seconds())
    notices.notify_user_id(
        instance.created_by_id,
        "queued_started",
        {"name": instance.name, "minutes": waited // 60},
        key=f"queued_started:{instance.pk}",
        link=f"/instances/{instance.public_id}/",
    )
    return "started"


def _checked(instance: Instance, req: OrderRequest) -> _CheckedOrder:
    """What ``_reserve`` reads of a checked order, from the queued row."""
    return _CheckedOrder(
        model=instance.gpu_model,
        region=instance.region,
        name=instance.name,
        env=instance.env,
        per_hour=instance.quoted_per_hour,
        image=instance.image,
        container=instance.container,
        entrypoint=instance.entrypoint,
        mounts=instance.mounts,
        ssh=(instance.ssh_key_name, instance.ssh_public_key),
        auto_release_at=req.auto_release_at,
        disks=(),
    )


def skip(instance: Instance, code: str) -> bool:
    """The queued order leaves the queue (past its maximum wait, or its funds or limits failed
    at the start): released, nothing was charged, and its owner is told once."""
    won = transition(
        instance,
        InstanceState.RELEASED,
        code=code,
        level=EventLevel.WARNING,
        failure_code=code,
        ended_at=timezone.now(),
        start_estimate={},
    )
    if won:
        notices.notify_user_id(
            instance.created_by_id,
            "queued_skipped",
            {"name": instance.name, "reason": code},
            key=f"queued_skipped:{instance.pk}",
            link=f"/instances/{instance.public_id}/",
        )
    return won


# ---------------------------------------------------------------------------------------------
# Start estimates
# ---------------------------------------------------------------------------------------------


def duration_model() -> DurationModel:
    """Measured rental durations (run start to end) of ended instances, and the running ones as
    censored observations; the prior until there are enough. Open-ended rentals only (no
    automatic release): the law is that of the rentals whose end is not known (one with a
    known end ends then, and its length says nothing of the others')."""
    now = timezone.now()
    ended = (
        Instance.objects.filter(
            running_at__isnull=False, ended_at__isnull=False, auto_release_at__isnull=True
        )
        .order_by("-ended_at")
        .values_list("cards", "running_at", "ended_at")[:DURATION_HISTORY]
    )
    running = Instance.objects.filter(
        state=InstanceState.RUNNING, running_at__isnull=False, auto_release_at__isnull=True
    ).values_list("cards", "running_at")
    hosts: list[float] = []
    slices: list[float] = []
    rh: list[float] = []
    rs: list[float] = []
    for cards, start, end in ended:
        if start is not None and end is not None:
            (slices if cards >= topology.SLICE_UNIT_GPUS else hosts).append(
                (end - start).total_seconds()
            )
    for cards, start in running:
        if start is not None:
            (rs if cards >= topology.SLICE_UNIT_GPUS else rh).append((now - start).total_seconds())
    return DurationModel(hosts, slices, rh, rs)


def refresh_estimates(gpu_model: str) -> int:
    """Estimate the start of every queued order of the model, store it on the row and push it to
    the pages that show it (on commit). The number of orders estimated."""
    rows = queued(gpu_model)
    if not rows:
        return 0
    now = timezone.now()
    fleet, _nodes = build_fleet(gpu_model, with_nodes=False)
    started = {
        str(pid): created.timestamp()
        for pid, created in Allocation.objects.filter(
            state=AllocationState.ACTIVE, gpu_model__code=gpu_model
        ).values_list("public_id", "created_at")
    }
    model = duration_model()
    groups: dict[tuple[str, str], list[Instance]] = {}
    for i in rows:
        region = i.region.code if i.region is not None else None
        groups.setdefault(queue_key(gpu_model, region), []).append(i)
    stamp = now.isoformat()
    for group in groups.values():
        got = estimate_starts(
            fleet,
            [_waiting(i) for i in group],
            now.timestamp(),
            model,
            started=started,
            samples=int(settings.SLICES_QUEUE_ESTIMATE_SAMPLES),
            seed=0,  # the same futures for the same state: a page never flickers between events
        )
        for i in group:
            e = got[str(i.public_id)]
            value = {
                "p50": _iso(e.p50),
                "p90": _iso(e.p90),
                "position": e.position,
                "updated_at": stamp,
                "measured": model.measured,
            }
            if _same(i.start_estimate, value):
                continue  # nothing a reader would see changed: no write, no push
            Instance.objects.filter(pk=i.pk, state=InstanceState.QUEUED).update(
                start_estimate=value
            )
            events.broadcast_progress_on_commit(i)
    return len(rows)


def _iso(t: float | None) -> str | None:
    return datetime.fromtimestamp(t, tz=UTC).isoformat() if t is not None else None


def _same(old: dict[str, Any], new: dict[str, Any]) -> bool:
    keys = ("p50", "p90", "position")

    def minute(v: Any) -> Any:
        return v[:16] if isinstance(v, str) else v

    return all(minute(old.get(k)) == minute(new.get(k)) for k in keys)


def admit_all() -> int:
    """Every GPU model with queued orders (the beat's safety net)."""
    models = (
        Instance.objects.filter(state=InstanceState.QUEUED)
        .values_list("gpu_model__code", flat=True)
        .distinct()
    )
    for code in sorted(set(models)):
        admit(code)
    return len(set(models))
