"""Allocating and releasing GPUs: the only code that writes allocations and nodes' free masks.

Allocation = plan with the pure allocator (`slices.topology`) on a snapshot of the database, then
commit with compare-and-set on every node's free-GPU mask. Two orders can plan the same GPUs; only one
of the conditional UPDATEs matches, the other sees zero rows, rolls back and plans again on the new
state, so a lost race re-plans while capacity remains and never double-books a GPU.

Every claim goes through here, not only orders: a start on the instance's own host
(`claim_on_node`), a start on another host (`allocate`) and a migration's replacement node
(`claim_replacement`, then `move_part`). Each chooses its GPUs with the allocator's rules (buddy
alignment, best fit, the SU rule for a slice's replacement; `slices.topology.policy`) and writes the
mask with the one compare-and-set (`_take`), the same rules the allocator benchmark replays.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext, gettext_noop

from console.errors import DomainError, ErrorCode
from console.ids import parse_uuid
from console.tenancy import team_of, user_of
from slices import topology
from slices.choices import (
    SCHEDULABLE_STATES,
    AllocationKind,
    AllocationState,
    NodeHealth,
    NodeState,
)
from slices.models import (
    GPU,
    Allocation,
    AllocationNode,
    Cluster,
    Node,
    Region,
)
from slices.perf import Performance, expected_performance
from slices.services.fleet import FleetView, _ts, build_fleet, fleet_changed, fleet_view
from slices.services.jobs import enqueue_on_commit
from slices.services.windows import booked_windows
from slices.topology import windows as booked

MAX_PLAN_ATTEMPTS = 12

logger = logging.getLogger(__name__)


PLACEMENT_TEXT = {
    "no_cluster": gettext_noop("No cluster has %(gpu_model)s GPUs%(where)s."),
    "no_slices": gettext_noop(
        "%(gpu_model)s has no InfiniBand cluster%(where)s, so it is offered as hosts of up to "
        "8 cards, not as slices."
    ),
    "invalid_size": gettext_noop(
        "A host has 1, 2, 4 or 8 cards (as many as one node has) and a slice a multiple of 64; "
        "%(cards)s × %(gpu_model)s cannot be placed."
    ),
    "too_large": gettext_noop(
        "The largest %(gpu_model)s cluster%(where)s is smaller than %(cards)s cards."
    ),
    "no_capacity": gettext_noop(
        "%(cards)s × %(gpu_model)s are not free together%(where)s right now."
    ),
    # A booked window (预约) needs these GPUs later: an order ending by then can start now.
    "reserved": gettext_noop(
        "%(cards)s × %(gpu_model)s%(where)s are booked from %(available_until)s; an order "
        "that is released by then (可用至) can start now."
    ),
}


class NoCapacity(DomainError):
    """The request cannot be placed now: the allocator's code and facts, the earliest time, and
    the alternatives that can start now. The message is rendered in the reader's language."""

    code = ErrorCode.NO_CAPACITY
    http_status = 409

    def __init__(
        self,
        unplaceable: topology.Unplaceable,
        earliest: datetime | None,
        *,
        gpu_model: str = "",
        cards: int = 0,
        region: str | None = None,
        available_until: datetime | None = None,
    ) -> None:
        reason = unplaceable.code
        if reason == "no_cluster" and "InfiniBand" in unplaceable.reason:
            reason = "no_slices"
        if available_until is not None:
            reason = "reserved"
        self.available_until = available_until
        names = region_names()
        self.region = region
        self.unplaceable = unplaceable
        self.reason_code = reason
        self.earliest = earliest
        self.alternatives = [
            {
                "kind": a.kind,
                "region": a.region,
                "region_name": names.get(a.region, a.region),
                "gpu_model": a.gpu_model,
                "gpus": a.gpus,
                "cluster": a.cluster,
            }
            for a in unplaceable.alternatives
        ]
        super().__init__(
            PLACEMENT_TEXT.get(reason, PLACEMENT_TEXT["no_capacity"]),
            gpu_model=gpu_model,
            cards=cards,
            reason=reason,
            earliest=earliest.isoformat() if earliest else None,
            alternatives=self.alternatives,
            available_until=available_until.isoformat() if available_until else None,
        )

    def message(self) -> str:
        params = dict(self.params)
        params["where"] = ""
        if self.region:
            name = region_names().get(self.region, self.region)
            params["where"] = " " + gettext("in %(region)s") % {"region": name}
        return gettext(self.template) % params

    @property
    def reason(self) -> str:
        return self.message()


def region_names() -> dict[str, str]:
    """Region codes → names in the current language (银川, not yinchuan)."""
    return {r.code: r.display_name for r in Region.objects.all()}


class _LostRace(Exception):
    """Another transaction took one of the planned GPUs first."""


# ---------------------------------------------------------------------------------------------
# Allocating and releasing
# ---------------------------------------------------------------------------------------------


def _plan(
    req: topology.Request, now: datetime, window: str | None = None
) -> tuple[topology.Fleet, dict[str, Node], topology.Placement]:
    """Plan ``req`` on a snapshot of its GPU model's fleet (and the nodes by hostname), the
    booked windows overlapping its lifetime held first (``window``: the booked window this
    claim starts, planned without its own hold); raises NoCapacity (reason, earliest time,
    alternatives, the end before a window that would let it start) when it cannot be placed."""
    fleet, nodes = build_fleet(req.gpu_model)
    windows = _windows(req, now, window)
    held = booked.hold(fleet, windows, req.now, req.ends_at)
    planned = fleet.plan(req)
    if isinstance(planned, topology.Unplaceable):
        _refuse(req, planned, now, available_until=_available_until(fleet, req, held, windows))
    return fleet, nodes, planned


def _windows(req: topology.Request, now: datetime, exclude: str | None) -> list[booked.Window]:
    """The booked windows overlapping ``req``'s lifetime (the allocator's future occupants)."""
    end = datetime.fromtimestamp(req.ends_at, tz=now.tzinfo) if req.ends_at else None
    return booked_windows(req.gpu_model, now, end, exclude=exclude)


def _available_until(
    fleet: topology.Fleet, req: topology.Request, held: list[str], windows: list[booked.Window]
) -> datetime | None:
    """When ``req`` fits only on GPUs booked windows hold later: the first such window's
    provisioning time (an order released by then can start now, 可用至); else None. Gives the
    windows' GPUs back on ``fleet``."""
    if not held:
        return None
    booked.unhold(fleet, held)
    planned = fleet.plan(req)
    if isinstance(planned, topology.Unplaceable):
        return None
    hit = booked.conflicts(planned, windows)
    if not hit:
        return None
    first = min(w.starts_at for w in hit)
    return datetime.fromtimestamp(first, tz=timezone.get_current_timezone())


def _refuse(
    req: topology.Request,
    planned: topology.Unplaceable,
    now: datetime,
    view: FleetView | None = None,
    *,
    available_until: datetime | None = None,
) -> NoReturn:
    """Raise NoCapacity for ``req``: why, when it could start, what fits instead (alternatives
    may be other GPU models, so the whole fleet is asked: the pages' shared view of it)."""
    with (view or fleet_view()).planning() as whole:
        why = whole.explain(req) or planned
    earliest = datetime.fromtimestamp(why.earliest, tz=now.tzinfo) if why.earliest else None
    raise NoCapacity(
        why,
        earliest,
        gpu_model=req.gpu_model,
        cards=req.gpus,
        region=req.region,
        available_until=available_until,
    )


def allocate(
    owner: Any,
    gpus: int,
    gpu_model: str,
    region: str | None = None,
    *,
    ends_at: datetime | None = None,
    label: str = "",
    window: str | None = None,
) -> Allocation:
    """Reserve `gpus` GPUs of `gpu_model` (a host of 1/2/4/8 or a slice of 64·k) for `owner`,
    beside the booked windows its lifetime overlaps (``window``: the one it starts, if any).

    Raises NoCapacity (reason, earliest time, alternatives) when it cannot be placed now.
    Safe under concurrency: see the module docstring.
    """
    now = timezone.now()
    for _attempt in range(MAX_PLAN_ATTEMPTS):
        req = topology.Request(
            str(uuid.uuid4()), gpus, gpu_model, region, now.timestamp(), _ts(ends_at)
        )
        _fleet, nodes, planned = _plan(req, now, window)
        try:
            return _commit(owner, planned, nodes, ends_at, label)
        except _LostRace:
            continue  # another order took some of these GPUs: plan again on the new state
    raise NoCapacity(
        topology.Unplaceable(
            "", "no_capacity", "The fleet is too busy right now; please try again."
        ),
        None,
        gpu_model=gpu_model,
        cards=gpus,
        region=region,
    )


@dataclass(frozen=True)
class Preview:
    """What an order would get now (nothing is reserved): for the order form and the API."""

    gpus: int
    gpu_model: str
    region: str
    cluster: str
    node_count: int
    su_count: int
    su_min_structural: int
    at_structural_minimum: bool
    # when the slice could start on ceil(n / SU size) SUs, if it cannot now (from lease ends)
    structural_earliest: datetime | None
    performance: dict[str, Any]


def _placement_performance(placement: topology.Placement) -> tuple[Cluster, Performance]:
    """The placement's cluster and the α–β estimate of its all-reduce (slices/perf.py)."""
    cluster = Cluster.objects.select_related("gpu_model").get(code=placement.cluster)
    perf = expected_performance(
        len(placement.shares),
        len(placement.shares[0].gpus),
        placement.su_count,
        fabric=cluster.fabric,
        rails=cluster.rails,
        nvlink_gbps=cluster.gpu_model.nvlink_gbps,
    )
    return cluster, perf


def preview_allocation(
    gpus: int, gpu_model: str, region: str | None = None, *, ends_at: datetime | None = None
) -> Preview:
    """Plan without reserving; raises NoCapacity like `allocate` when nothing fits now.

    On the pages' shared view of the fleet (`fleet_view`: rebuilt only when the fleet changed),
    which answers as a fresh read would: nothing is taken here, and an order plans afresh."""
    now = timezone.now()
    req = topology.Request("preview", gpus, gpu_model, region, now.timestamp(), _ts(ends_at))
    structural = until = None
    view = fleet_view()
    windows = _windows(req, now, None)
    with view.planning() as fleet:
        held = booked.hold(fleet, windows, req.now, req.ends_at)  # given back below: shared
        try:
            planned = fleet.plan(req)
            if isinstance(planned, topology.Placement) and not planned.at_structural_minimum:
                t = fleet.earliest_start(req, structural=True)
                structural = datetime.fromtimestamp(t, tz=now.tzinfo) if t else None
            if isinstance(planned, topology.Unplaceable):
                until = _available_until(fleet, req, held, windows)
                held = []  # _available_until gave them back
        finally:
            booked.unhold(fleet, held)
    if isinstance(planned, topology.Unplaceable):
        _refuse(req, planned, now, view, available_until=until)
    _cluster, perf = _placement_performance(planned)
    return Preview(
        gpus,
        gpu_model,
        planned.region,
        planned.cluster,
        len(planned.shares),
        planned.su_count,
        planned.su_min_structural,
        planned.at_structural_minimum,
        structural,
        perf.as_dict(),
    )


def _take(claims: list[tuple[Node, int]]) -> None:
    """Take GPUs (node, mask) planned on a snapshot: the one write of a node's free mask on a claim.

    Compare-and-set: a node is written only if it still has exactly the free GPUs of the snapshot
    and is still schedulable; otherwise ``_LostRace`` (the caller's transaction or savepoint undoes
    the nodes already taken, and it plans again). Nodes in primary-key order, so two claims never
    wait on each other in a cycle. Call it inside a transaction.
    """
    for node, mask in sorted(claims, key=lambda c: c[0].pk):
        if not mask or mask & ~node.free_mask:
            raise IntegrityError(f"planned GPUs {mask:#x} of {node.hostname} are not free")
        won = Node.objects.filter(
            pk=node.pk,
            free_mask=node.free_mask,
            state__in=SCHEDULABLE_STATES,
            health=NodeHealth.OK,
        ).update(free_mask=node.free_mask & ~mask, state=NodeState.ALLOCATED)
        if won != 1:
            raise _LostRace(node.hostname)
    fleet_changed()  # the pages' cached view of the fleet is out of date once this commits


@transaction.atomic
def _commit(
    owner: Any,
    p: topology.Placement,
    nodes: dict[str, Node],
    ends_at: datetime | None,
    label: str,
) -> Allocation:
    _take([(nodes[s.hostname], topology.gpu_mask(s.gpus)) for s in p.shares])
    cluster, perf = _placement_performance(p)
    allocation = Allocation.objects.create(
        team=team_of(owner),
        created_by=user_of(owner),
        kind=AllocationKind.SLICE if p.is_slice else AllocationKind.HOST,
        cluster=cluster,
        gpu_model=cluster.gpu_model,
        gpu_count=p.gpus,
        node_count=len(p.shares),
        su_count=p.su_count,
        su_min_structural=p.su_min_structural,
        su_min_state=p.su_min_state,
        hostfile="\n".join(p.hostfile()) + "\n",
        performance=perf.as_dict(),
        label=label,
        ends_at=ends_at,
    )
    parts = []
    gpu_filter = Q()
    for rank, s in enumerate(p.shares):
        node = nodes[s.hostname]
        mask = sum(1 << g for g in s.gpus)
        parts.append(AllocationNode(allocation=allocation, node=node, rank=rank, gpu_mask=mask))
        gpu_filter |= Q(node_id=node.pk, index__in=s.gpus)
    AllocationNode.objects.bulk_create(parts)
    taken = GPU.objects.filter(gpu_filter, allocation__isnull=True).update(allocation=allocation)
    if taken != p.gpus:
        raise IntegrityError(f"GPU rows out of step with node masks ({taken} != {p.gpus})")
    return allocation


@transaction.atomic
def release_allocation(allocation: Allocation) -> bool:
    """Give back exactly the GPUs of an allocation; True if this call released it (idempotent)."""
    won = (
        Allocation.objects.filter(pk=allocation.pk, state=AllocationState.ACTIVE).update(
            state=AllocationState.RELEASED, released_at=timezone.now()
        )
        == 1
    )
    if not won:
        return False  # already released by someone else
    parts = list(allocation.nodes.order_by("node_id").values_list("node_id", "gpu_mask"))
    for node_id, mask in parts:
        Node.objects.filter(pk=node_id).update(free_mask=F("free_mask").bitor(mask))
    # Fully free nodes go back to "ready" (drained or failed nodes keep their state).
    for node in Node.objects.filter(pk__in=[p[0] for p in parts], state=NodeState.ALLOCATED):
        Node.objects.filter(pk=node.pk, state=NodeState.ALLOCATED, free_mask=node.full_mask).update(
            state=NodeState.READY
        )
    GPU.objects.filter(allocation=allocation).update(allocation=None)
    fleet_changed()
    allocation.refresh_from_db()
    # 排队 (issue 32): capacity grew, the model's queue may start (slices.services.queue).
    enqueue_on_commit("slices.tasks.admit_queue_task", allocation.gpu_model.code)
    return True


# ---------------------------------------------------------------------------------------------
# Claims that are not orders: a start on the same host, a migration's replacement
# ---------------------------------------------------------------------------------------------


def _pinned_mask(node: Node, now: datetime) -> int:
    """The GPUs of ``node`` that booked windows from ``now`` on hold (their pins)."""
    mask = 0
    for window in booked_windows(node.gpu_model.code, now, None):
        for hostname, idxs in window.pins:
            if hostname == node.hostname:
                mask |= topology.gpu_mask(idxs)
    return mask


def claim_on_node(owner: Any, node: Node, cards: int, *, label: str = "") -> Allocation | None:
    """A host of ``cards`` GPUs on ``node`` itself (开机 on the instance's own host), or None when
    the node is out of service or has no aligned block of that size free beside the GPUs booked
    windows ahead hold (their pins: a start has no known end).

    The GPUs are the buddy rule's block (``topology.aligned_block``), as an order on this node
    would get: a 2-card host takes a free pair that shares its PCIe switch, never two stray GPUs,
    and the node's biggest free block stays whole when a smaller one fits. Committed as an order
    is (`_commit`); a lost race reads the node again and retries.
    """
    for _attempt in range(MAX_PLAN_ATTEMPTS):
        node = Node.objects.select_related("cluster__region", "gpu_model", "su").get(pk=node.pk)
        if node.state not in SCHEDULABLE_STATES or node.health != NodeHealth.OK:
            return None
        # A start has no known end: every booked window ahead keeps its pins on this node.
        pinned = _pinned_mask(node, timezone.now())
        block = topology.aligned_block(node.free_mask & ~pinned, node.gpus_per_node, cards)
        if block is None:
            return None
        share = topology.NodeShare(node.hostname, topology.gpu_indexes(block), node.su.index, 0)
        placement = topology.Placement(
            f"node:{node.hostname}",
            node.cluster.code,
            node.cluster.region.code,
            node.gpu_model.code,
            cards,
            (share,),
            su_count=1,
            su_min_structural=1,
            su_min_state=1,
        )
        try:
            return _commit(owner, placement, {node.hostname: node}, None, label)
        except _LostRace:
            continue  # the node changed since it was read: read it again
    return None


def claim_replacement(
    failed: Node,
    cards: int,
    *,
    whole: bool,
    near: list[Node] | None = None,
    avoid: list[Node] | None = None,
) -> tuple[Node, int] | None:
    """Take a node for the part of ``failed`` (its ``cards`` GPUs; a whole node for a slice's
    part) in the failed node's cluster: (node, GPU mask taken), or None when none is free.

    The allocator chooses on a snapshot (`topology.Fleet.plan_replacement`): a slice's part goes
    to a whole free node of the failed node's SU when there is one, else of an SU the slice
    already uses (``near``: its healthy nodes), else where breaking a whole node costs the least
    slice capacity; a host's part takes the aligned block of the best-fitting node. ``avoid``:
    nodes the instance holds, never chosen. The mask is written here (`_take`); the caller moves
    the allocation's part with `move_part` in the same transaction.
    """
    near_hosts = [n.hostname for n in near or ()]
    avoid_hosts = [n.hostname for n in avoid or ()]
    model = failed.gpu_model.code
    for _attempt in range(MAX_PLAN_ATTEMPTS):
        fleet, nodes = build_fleet(model)
        if failed.hostname not in fleet.gid_by_hostname:
            return None
        for hostname in avoid_hosts:
            if hostname in fleet.gid_by_hostname:
                fleet.set_schedulable(hostname, False)
        # The booked windows ahead hold their pins, as for an order with no known end: a
        # replacement waits (the instance stays migrating) rather than take a window's GPUs.
        now = timezone.now()
        booked.hold(fleet, booked_windows(model, now, None), now.timestamp(), None)
        planned = fleet.plan_replacement(failed.hostname, cards, whole=whole, near=near_hosts)
        if isinstance(planned, topology.Unplaceable):
            return None
        [share] = planned.shares
        node, mask = nodes[share.hostname], topology.gpu_mask(share.gpus)
        try:
            with transaction.atomic():
                _take([(node, mask)])
        except _LostRace:
            continue  # another claim took this node first: plan again on the new state
        # The whole row as it is now (the plan read only what placing needs).
        return Node.objects.select_related("su").get(pk=node.pk), mask
    return None


def move_part(allocation: Allocation, old: Node, new: Node, mask: int) -> None:
    """Point ``allocation``'s part on failed node ``old`` at ``new`` (GPUs ``mask``, taken by
    `claim_replacement`): the failed node's GPUs leave the allocation (the node stays failed, out
    of the pool, until an operator returns it) and the new node's GPU rows join it."""
    old_part = AllocationNode.objects.filter(allocation=allocation, node=old).first()
    if old_part is not None:
        Node.objects.filter(pk=old.pk).update(free_mask=F("free_mask").bitor(old_part.gpu_mask))
        GPU.objects.filter(node=old, allocation=allocation).update(allocation=None)
        AllocationNode.objects.filter(pk=old_part.pk).update(node=new, gpu_mask=mask)
    taken = topology.gpu_indexes(mask)
    GPU.objects.filter(node=new, index__in=taken, allocation__isnull=True).update(
        allocation=allocation
    )
    fleet_changed()  # the lease moved (its GPUs on the failed node are back in its mask)


# Usage sessions that bill an allocation carry this kind and the allocation's public id.
ALLOCATION_RESOURCE = "allocation"


def stop_for_billing(resource_kind: str, resource_id: str, reason: str) -> None:
    """Billing's stop hook (``BILLING_STOP_HANDLER``): release what billing stopped.

    Called once per stopped usage session, after billing committed the stop (its billing already
    ended at that second). Only the GPUs go back; disks and files are separate resources and are
    kept, and nothing restarts by itself after a top-up. Kinds this app does not hold are left to
    their owners; an allocation already released (by its owner, or an earlier call) is a no-op.
    """
    if resource_kind != ALLOCATION_RESOURCE:
        logger.info("billing stop for %s %s is not a slices resource", resource_kind, resource_id)
        return
    public_id = parse_uuid(resource_id)
    if public_id is None:
        logger.warning("billing stop with a malformed allocation id %r", resource_id)
        return
    allocation = Allocation.objects.filter(public_id=public_id).first()
    if allocation is not None and release_allocation(allocation):
        logger.info("released allocation %s: %s", public_id, reason)
