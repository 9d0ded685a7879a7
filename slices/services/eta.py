"""The provisioning ETA an instance page and the API show: measured timelines of recent orders
(``slices.eta``), read from the step events, the driver's step model as the fallback."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.core.cache import cache
from django.db.models import Count, Max
from django.utils import timezone

from slices import eta, lifecycle
from slices.choices import EventKind, InstanceState
from slices.drivers import get_driver
from slices.models import Instance, InstanceEvent, InstanceNode

# A provisioning that did not start at the order (开机, a migration's replacement): its timeline
# is not an order's, and a live one counts from its ``starting``/``migrating`` event, whose time
# the instance keeps (``Instance.restarted_at``, written with the event).
HISTORY_CACHE_SECONDS = 30
HISTORY_ORDERS = 60  # recent orders read per driver and GPU model (all node counts)
ESTIMATED_STATES = frozenset(
    {InstanceState.PENDING, InstanceState.ALLOCATING, InstanceState.PROVISIONING}
)


@dataclass(frozen=True)
class Eta:
    seconds: int
    current_step: str  # the step the slowest node is in ("" before any node started)
    source: str  # "history" or "model"
    samples: int


def history(driver: str, gpu_model_id: int) -> list[eta.Timeline]:
    """Timelines of the recent orders of this driver and GPU model that reached running, most
    recent first (cached briefly: every page and API poll asks)."""
    key = f"slices:eta-history:{driver}:{gpu_model_id}"
    cached = cache.get(key)
    if cached is not None:
        return list(cached)
    rows = list(
        Instance.objects.filter(
            driver=driver,
            gpu_model_id=gpu_model_id,
            running_at__isnull=False,
            restarted_at__isnull=True,
        )
        .annotate(node_count=Count("nodes"))
        .order_by("-running_at")
        .values_list("pk", "created_at", "running_at", "node_count")[:HISTORY_ORDERS]
    )
    marks: dict[int, dict[str, datetime]] = {}
    for instance_id, step, last in (
        InstanceEvent.objects.filter(
            instance_id__in=[r[0] for r in rows], kind=EventKind.STEP, code="step_done"
        )
        .order_by()
        .values_list("instance_id", "step")
        .annotate(last=Max("at"))
    ):
        marks.setdefault(instance_id, {})[step] = last
    out = []
    for pk, created, running, nodes in rows:
        if running is None:  # filtered out above; for the type checker
            continue
        at = {eta.ORDERED: 0.0, eta.RUNNING: (running - created).total_seconds()}
        for step, when in marks.get(pk, {}).items():
            if when <= running:
                at[step] = (when - created).total_seconds()
        out.append(eta.Timeline(nodes=max(1, nodes), at=at))
    cache.set(key, out, HISTORY_CACHE_SECONDS)
    return out


def _started_at(instance: Instance) -> datetime:
    """When this provisioning began: the order, or the latest start or migration."""
    return instance.restarted_at or instance.created_at


def _model_seconds(driver: str, steps: list[str | None], nodes: int, slice_: bool) -> float:
    try:
        expected = get_driver(driver or None).step_seconds()
    except ValueError:
        return 0.0
    left = lifecycle.eta_seconds(steps or [None] * max(1, nodes), expected)
    return left + (expected.get("allreduce", 0.0) if slice_ else 0.0)


def first_estimate(driver: str, gpu_model_id: int, nodes: int, *, slice_: bool) -> eta.Estimate:
    """What an instance page shows right after the order (``bench/provisioning.py`` scores it)."""
    return eta.estimate(
        history(driver, gpu_model_id),
        nodes=nodes,
        milestone=eta.ORDERED,
        since_s=0.0,
        fallback_s=_model_seconds(driver, [], nodes, slice_),
    )


def instance_eta(instance: Instance, nodes: list[InstanceNode] | None = None) -> Eta | None:
    """The estimate for an instance being ordered or provisioned (None in any other state)."""
    if instance.state not in ESTIMATED_STATES:
        return None
    if nodes is None:
        nodes = list(instance.nodes.all())
    nodes = sorted(nodes, key=lambda n: n.rank)
    done = [n.step or None for n in nodes]
    provisioning = instance.state == InstanceState.PROVISIONING
    milestone = eta.milestone_of(done) if provisioning else eta.ORDERED
    now = timezone.now()
    if milestone == eta.ORDERED:
        reached = _started_at(instance)
    else:
        reached = max(
            (n.step_started_at for n in nodes if n.step == milestone and n.step_started_at),
            default=now,
        )
    since = max(0.0, (now - reached).total_seconds())
    count = len(nodes) or (max(1, instance.cards // 8) if instance.is_slice else 1)
    est = eta.estimate(
        history(instance.driver, instance.gpu_model_id),
        nodes=count,
        milestone=milestone,
        since_s=since,
        fallback_s=_model_seconds(instance.driver, done, count, instance.is_slice)
        - (since if milestone == eta.ORDERED else 0.0),
    )
    return Eta(est.seconds, current_step(done), est.source, est.samples)


def current_step(done_per_node: list[str | None]) -> str:
    """The step under way on the slowest node (the one the instance waits for)."""
    if not done_per_node:
        return ""
    known = [lifecycle.Step(d) for d in done_per_node if d in lifecycle.STEPS]
    slowest = None if len(known) < len(done_per_node) else min(known, key=lifecycle.STEPS.index)
    step = lifecycle.next_step(slowest)
    return step.value if step is not None else lifecycle.Step.READY.value
