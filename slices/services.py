"""Fleet and allocation services: the only code that writes inventory rows and allocations.

Allocation = plan with the pure allocator (`slices.topology`) on a snapshot of the database, then
commit with compare-and-set on every node's free-GPU mask. Two orders can plan the same GPUs; only one
of the conditional UPDATEs matches, the other sees zero rows, rolls back and plans again on the new
state, so a lost race re-plans while capacity remains and never double-books a GPU.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Model, Q
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext as _

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
    GpuModel,
    Node,
    Region,
    ScalableUnit,
    SpineGroup,
)
from slices.perf import Performance, expected_performance

MAX_PLAN_ATTEMPTS = 12
GPU_UUID_NAMESPACE = uuid.UUID("5b0f7a5e-6c1d-4c59-9a8e-1f0e2b7d3c40")


logger = logging.getLogger(__name__)


class NoCapacity(Exception):
    """The request cannot be placed now; carries the allocator's reason, earliest time, alternatives."""

    def __init__(self, unplaceable: topology.Unplaceable, earliest: datetime | None) -> None:
        super().__init__(unplaceable.reason)
        self.unplaceable = unplaceable
        self.code = unplaceable.code
        self.reason = unplaceable.reason
        self.earliest = earliest
        self.alternatives = [
            {
                "kind": a.kind,
                "region": a.region,
                "gpu_model": a.gpu_model,
                "gpus": a.gpus,
                "cluster": a.cluster,
            }
            for a in unplaceable.alternatives
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "reason": self.reason,
            "earliest": self.earliest.isoformat() if self.earliest else None,
            "alternatives": self.alternatives,
        }


class _LostRace(Exception):
    """Another transaction took one of the planned GPUs first."""


# ---------------------------------------------------------------------------------------------
# Loading the fleet file
# ---------------------------------------------------------------------------------------------


@dataclass
class LoadReport:
    created: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    updated: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    missing_nodes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        c = ", ".join(f"{v} {k}" for k, v in sorted(self.created.items()) if v) or "nothing"
        u = ", ".join(f"{v} {k}" for k, v in sorted(self.updated.items()) if v) or "nothing"
        text = f"created {c}; updated {u}"
        if self.missing_nodes:
            text += (
                f"; {len(self.missing_nodes)} nodes no longer in the file (kept, out of service)"
            )
        return text


def _gpu_layout(spec: topology.ClusterSpec) -> list[tuple[int, str]]:
    """(NUMA node, paired HCA) per GPU index."""
    g = spec.gpus_per_node
    per_numa = g // spec.numa_nodes
    out = []
    for i in range(g):
        hca = "" if spec.fabric == "ethernet" else f"mlx5_{i // spec.gpus_per_hca}"
        out.append((i // per_numa, hca))
    return out


@transaction.atomic
def load_fleet(spec: topology.FleetSpec) -> LoadReport:
    """Create or update the inventory from a parsed fleet file; running twice changes nothing.

    Nodes that left the file are kept (they may hold GPUs) but flagged and put in maintenance.
    """
    report = LoadReport()

    def upsert(
        model: type[Model], lookup: dict[str, Any], values: dict[str, Any], label: str
    ) -> Any:
        obj = model._default_manager.filter(**lookup).first()
        if obj is None:
            report.created[label] += 1
            return model._default_manager.create(**lookup, **values)
        changed = [k for k, v in values.items() if getattr(obj, k) != v]
        if changed:
            for k in changed:
                setattr(obj, k, values[k])
            obj.save(update_fields=changed)
            report.updated[label] += 1
        return obj

    regions = {
        r.code: upsert(
            Region,
            {"code": r.code},
            {"name": r.name, "name_zh": r.name_zh, "position": i},
            "regions",
        )
        for i, r in enumerate(spec.regions)
    }
    models_ = {
        m.code: upsert(
            GpuModel,
            {"code": m.code},
            {
                "memory_gib": m.memory_gib,
                "nvlink_gbps": m.nvlink_gbps,
                "demand": {str(k): v for k, v in sorted(spec.demand.get(m.code, {}).items())},
            },
            "GPU models",
        )
        for m in spec.gpu_models
    }
    seen_hosts: set[str] = set()
    existing_nodes = {n.hostname: n for n in Node.objects.all()}
    for position, cs in enumerate(spec.clusters):
        cluster = upsert(
            Cluster,
            {"code": cs.code},
            {
                "name": cs.name,
                "region": regions[cs.region],
                "gpu_model": models_[cs.gpu_model],
                "fabric": cs.fabric,
                "gpus_per_node": cs.gpus_per_node,
                "numa_nodes": cs.numa_nodes,
                "gpus_per_hca": cs.gpus_per_hca,
                "rails": cs.rails,
                "link_gbps": cs.link_gbps,
                "leaf_ports": cs.leaf_ports,
                "position": position,
            },
            "clusters",
        )
        for rail in range(cs.rails):
            upsert(SpineGroup, {"cluster": cluster, "rail": rail}, {}, "spine groups")
        layout = _gpu_layout(cs)
        full = (1 << cs.gpus_per_node) - 1
        new_nodes: list[Node] = []
        for su_spec in cs.sus:
            su = upsert(
                ScalableUnit,
                {"cluster": cluster, "index": su_spec.index},
                {"name": su_spec.name, "capacity": su_spec.capacity},
                "scalable units",
            )
            for i, ns in enumerate(su_spec.nodes):
                seen_hosts.add(ns.hostname)
                values = {
                    "cluster": cluster,
                    "su": su,
                    "index": i,
                    "address": ns.address,
                    "ssh_port": ns.ssh_port,
                    "host_key_fingerprint": ns.host_key,
                    "gpu_model": models_[cs.gpu_model],
                    "gpus_per_node": cs.gpus_per_node,
                    "layout": {
                        "numa_nodes": cs.numa_nodes,
                        "gpus_per_hca": cs.gpus_per_hca,
                        "rails": cs.rails,
                        "nvlink": bool(models_[cs.gpu_model].nvlink_gbps),
                    },
                    "in_fleet_file": True,
                }
                node = existing_nodes.get(ns.hostname)
                if node is None:
                    new_nodes.append(Node(hostname=ns.hostname, free_mask=full, **values))
                    continue
                changed = [k for k, v in values.items() if getattr(node, k) != v]
                if changed:
                    for k in changed:
                        setattr(node, k, values[k])
                    node.save(update_fields=changed)
                    report.updated["nodes"] += 1
        if new_nodes:
            Node.objects.bulk_create(new_nodes, batch_size=500)
            report.created["nodes"] += len(new_nodes)
        # GPUs: one row per index, created once (the UUID is derived from hostname and index).
        have = set(GPU.objects.filter(node__cluster=cluster).values_list("node_id", "index"))
        new_gpus = [
            GPU(
                node_id=node_id,
                index=i,
                uuid=uuid.uuid5(GPU_UUID_NAMESPACE, f"{hostname}:{i}"),
                numa_node=layout[i][0],
                hca=layout[i][1],
            )
            for node_id, hostname in Node.objects.filter(cluster=cluster).values_list(
                "id", "hostname"
            )
            for i in range(cs.gpus_per_node)
            if (node_id, i) not in have
        ]
        if new_gpus:
            GPU.objects.bulk_create(new_gpus, batch_size=1000)
            report.created["GPUs"] += len(new_gpus)
    gone = [h for h in existing_nodes if h not in seen_hosts]
    if gone:
        Node.objects.filter(hostname__in=gone).update(
            in_fleet_file=False, state=NodeState.MAINTENANCE
        )
        report.missing_nodes = sorted(gone)
    return report


# ---------------------------------------------------------------------------------------------
# The allocator's view of the database
# ---------------------------------------------------------------------------------------------


def _ts(dt: datetime | None) -> float | None:
    return dt.timestamp() if dt else None


def build_fleet(gpu_model: str | None = None) -> tuple[topology.Fleet, dict[str, Node]]:
    """A `topology.Fleet` mirroring the database now (optionally one GPU model only)."""
    clusters = Cluster.objects.select_related("region", "gpu_model").order_by("position", "code")
    nodes_qs = Node.objects.select_related("su").order_by("cluster__position", "su__index", "index")
    if gpu_model:
        clusters = clusters.filter(gpu_model__code=gpu_model)
        nodes_qs = nodes_qs.filter(gpu_model__code=gpu_model)
    nodes_by_cluster: dict[int, dict[int, list[Node]]] = defaultdict(lambda: defaultdict(list))
    by_host: dict[str, Node] = {}
    for n in nodes_qs:
        nodes_by_cluster[n.cluster_id][n.su.index].append(n)
        by_host[n.hostname] = n
    cluster_specs = []
    region_specs: dict[str, topology.RegionSpec] = {}
    model_specs: dict[str, topology.GpuModelSpec] = {}
    for c in clusters:
        region_specs[c.region.code] = topology.RegionSpec(c.region.code, c.region.name)
        model_specs[c.gpu_model.code] = topology.GpuModelSpec(
            c.gpu_model.code, c.gpu_model.memory_gib, c.gpu_model.nvlink_gbps
        )
        sus = tuple(
            topology.ScalableUnitSpec(
                idx,
                f"su{idx:02d}",
                tuple(topology.NodeSpec(n.hostname, n.address) for n in nodes),
            )
            for idx, nodes in sorted(nodes_by_cluster[c.id].items())
            if nodes
        )
        if not sus:
            continue
        cluster_specs.append(
            topology.ClusterSpec(
                c.code,
                c.name,
                c.region.code,
                c.gpu_model.code,
                c.fabric,
                c.gpus_per_node,
                sus,
                c.numa_nodes,
                c.gpus_per_hca,
                c.rails,
                c.link_gbps,
                c.leaf_ports,
            )
        )
    spec = topology.FleetSpec(
        tuple(region_specs.values()), tuple(model_specs.values()), tuple(cluster_specs)
    )
    fleet = topology.Fleet(spec, demand=_demand({c.gpu_model for c in clusters}))
    # Current leases, with their ends for lease-end alignment and "earliest" answers.
    parts = (
        AllocationNode.objects.filter(allocation__state=AllocationState.ACTIVE)
        .select_related("node")
        .values_list("allocation__public_id", "allocation__ends_at", "node__hostname", "gpu_mask")
    )
    if gpu_model:
        parts = parts.filter(allocation__gpu_model__code=gpu_model)
    leases: dict[str, tuple[float | None, dict[str, list[int]]]] = {}
    for pid, ends_at, hostname, mask in parts:
        entry = leases.setdefault(str(pid), (_ts(ends_at), {}))
        entry[1][hostname] = list(topology.gpu_indexes(mask))
    accounted: dict[str, int] = defaultdict(int)
    for lid, (ends, gpus) in leases.items():
        if all(h in fleet.gid_by_hostname for h in gpus):
            fleet.occupy(lid, gpus, ends)
            for h, idxs in gpus.items():
                for i in idxs:
                    accounted[h] |= 1 << i
    for n in by_host.values():
        # GPUs the mask says are taken but no lease explains (e.g. a half-written row elsewhere)
        # are held back too: the mask in the database is what the commit compares against.
        stray = n.full_mask & ~n.free_mask & ~accounted[n.hostname]
        if stray:
            fleet.occupy(f"stray:{n.hostname}", {n.hostname: topology.gpu_indexes(stray)})
        if n.state not in SCHEDULABLE_STATES or n.health != NodeHealth.OK:
            fleet.set_schedulable(n.hostname, False)
    return fleet, by_host


def _demand(models: Iterable[GpuModel]) -> dict[str, dict[int, float]]:
    """Order mix per GPU model (from the fleet file) for fragmentation-aware placement."""
    return {m.code: {int(k): float(v) for k, v in (m.demand or {}).items()} for m in models}


# ---------------------------------------------------------------------------------------------
# Allocating and releasing
# ---------------------------------------------------------------------------------------------


def allocate(
    owner: Any,
    gpus: int,
    gpu_model: str,
    region: str | None = None,
    *,
    ends_at: datetime | None = None,
    label: str = "",
) -> Allocation:
    """Reserve `gpus` GPUs of `gpu_model` (a host of 1/2/4/8 or a slice of 64·k) for `owner`.

    Raises NoCapacity (reason, earliest time, alternatives) when it cannot be placed now.
    Safe under concurrency: see the module docstring.
    """
    now = timezone.now()
    for _attempt in range(MAX_PLAN_ATTEMPTS):
        fleet, nodes = build_fleet(gpu_model)
        req = topology.Request(
            str(uuid.uuid4()), gpus, gpu_model, region, now.timestamp(), _ts(ends_at)
        )
        planned = fleet.plan(req)
        if isinstance(planned, topology.Unplaceable):
            # Alternatives may be other GPU models: ask a snapshot of the whole fleet.
            whole, _nodes = build_fleet(None)
            why = whole.explain(req) or planned
            earliest = datetime.fromtimestamp(why.earliest, tz=now.tzinfo) if why.earliest else None
            raise NoCapacity(why, earliest)
        try:
            return _commit(owner, planned, nodes, ends_at, label)
        except _LostRace:
            continue  # another order took some of these GPUs: plan again on the new state
    raise NoCapacity(
        topology.Unplaceable(
            "", "no_capacity", _("The fleet is too busy right now; please try again.")
        ),
        None,
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
    """Plan without reserving; raises NoCapacity like `allocate` when nothing fits now."""
    now = timezone.now()
    fleet, _nodes = build_fleet(gpu_model)
    req = topology.Request("preview", gpus, gpu_model, region, now.timestamp(), _ts(ends_at))
    planned = fleet.plan(req)
    if isinstance(planned, topology.Unplaceable):
        whole, _nodes = build_fleet(None)
        why = whole.explain(req) or planned
        earliest = datetime.fromtimestamp(why.earliest, tz=now.tzinfo) if why.earliest else None
        raise NoCapacity(why, earliest)
    structural = None
    if not planned.at_structural_minimum:
        t = fleet.earliest_start(req, structural=True)
        structural = datetime.fromtimestamp(t, tz=now.tzinfo) if t else None
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


@transaction.atomic
def _commit(
    owner: Any,
    p: topology.Placement,
    nodes: dict[str, Node],
    ends_at: datetime | None,
    label: str,
) -> Allocation:
    # Lock order = node primary key order, so two committers never wait on each other in a cycle.
    shares = sorted(p.shares, key=lambda s: nodes[s.hostname].pk)
    for s in shares:
        node = nodes[s.hostname]
        mask = 0
        for g in s.gpus:
            mask |= 1 << g
        # Compare-and-set: only if the node still has exactly the free GPUs we planned with.
        won = (
            Node.objects.filter(
                pk=node.pk,
                free_mask=node.free_mask,
                state__in=SCHEDULABLE_STATES,
                health=NodeHealth.OK,
            ).update(free_mask=node.free_mask & ~mask, state=NodeState.ALLOCATED)
            == 1
        )
        if not won:
            raise _LostRace(s.hostname)
    cluster, perf = _placement_performance(p)
    allocation = Allocation.objects.create(
        owner=owner,
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
    allocation.refresh_from_db()
    return True


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
    try:
        public_id = uuid.UUID(str(resource_id))
    except ValueError:
        logger.warning("billing stop with a malformed allocation id %r", resource_id)
        return
    allocation = Allocation.objects.filter(public_id=public_id).first()
    if allocation is not None and release_allocation(allocation):
        logger.info("released allocation %s: %s", public_id, reason)


# ---------------------------------------------------------------------------------------------
# Operator actions on nodes
# ---------------------------------------------------------------------------------------------

NODE_ACTIONS = ("drain", "maintenance", "fail", "return")


def change_node_state(node: Node, action: str, note: str = "") -> bool:
    """Drain, put in maintenance, mark failed or return a node to service (compare-and-set).

    Draining keeps running leases and takes no new ones; maintenance needs an empty node.
    """
    qs = Node.objects.filter(pk=node.pk)
    now = timezone.now()
    if action == "drain":
        won = qs.filter(state__in=SCHEDULABLE_STATES).update(
            state=NodeState.DRAINING, state_changed_at=now, note=note
        )
    elif action == "maintenance":
        won = (
            qs.filter(free_mask=node.full_mask)
            .exclude(state=NodeState.MAINTENANCE)
            .update(state=NodeState.MAINTENANCE, state_changed_at=now, note=note)
        )
    elif action == "fail":
        won = qs.exclude(state=NodeState.FAILED).update(
            state=NodeState.FAILED, state_changed_at=now, note=note
        )
    elif action == "return":
        won = qs.exclude(state__in=SCHEDULABLE_STATES).update(
            state=NodeState.READY, state_changed_at=now, note=note, health=NodeHealth.OK
        )
        if won:
            qs.exclude(free_mask=node.full_mask).update(state=NodeState.ALLOCATED)
    else:
        raise ValueError(f"unknown node action {action!r}")
    node.refresh_from_db()
    return won == 1


# ---------------------------------------------------------------------------------------------
# Availability
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Availability:
    region: str
    region_name: str
    gpu_model: str
    total_gpus: int
    free_gpus: int
    out_of_service_gpus: int  # not leased, but on drained/failed/maintenance nodes
    host_sizes: tuple[int, ...]  # host sizes that can be placed now
    largest_slice: int  # GPUs, 0 if none
    slices: bool  # the region has a slice cluster of this model

    @property
    def used_gpus(self) -> int:
        return self.total_gpus - self.free_gpus - self.out_of_service_gpus

    @property
    def utilisation(self) -> float:
        return self.used_gpus / self.total_gpus if self.total_gpus else 0.0


def availability() -> list[Availability]:
    """What can be ordered now, per region and GPU model."""
    fleet, _nodes = build_fleet()
    regions = {r.code: r for r in Region.objects.all()}
    out = []
    seen = sorted({(c.region, c.model) for c in fleet.clusters})
    order = {code: i for i, code in enumerate(regions)}
    for region, model in sorted(seen, key=lambda rm: (order.get(rm[0], 99), rm[1])):
        cls = fleet.candidates(model, region)
        total = sum(c.spec.gpu_count for c in cls)
        free = fleet.free_gpus(model, region)
        out_of_service = fleet.out_of_service_gpus(model, region)
        hosts = tuple(
            s
            for s in topology.HOST_SIZES
            if isinstance(fleet.plan(topology.Request("a", s, model, region)), topology.Placement)
        )
        has_slices = any(c.slices_ok for c in cls)
        # Slices may span SUs (always on the fewest the free state allows), so the largest slice
        # is bounded only by the free whole nodes of one cluster.
        largest = (
            max(
                (c.free_nodes * c.gpn // topology.SLICE_UNIT_GPUS * topology.SLICE_UNIT_GPUS)
                for c in cls
                if c.slices_ok
            )
            if has_slices
            else 0
        )
        r = regions.get(region)
        out.append(
            Availability(
                region,
                r.display_name if r else region,
                model,
                total,
                free,
                out_of_service,
                hosts,
                largest,
                has_slices,
            )
        )
    return out


def cluster_map(cluster: Cluster) -> list[dict[str, Any]]:
    """Rows of the fabric map: one per SU, nodes with their state and holders (3 queries)."""
    holders: dict[int, list[Allocation]] = defaultdict(list)
    parts = (
        AllocationNode.objects.filter(
            node__cluster=cluster, allocation__state=AllocationState.ACTIVE
        )
        .select_related("allocation", "allocation__owner")
        .order_by("allocation__created_at")
    )
    for part in parts:
        holders[part.node_id].append(part.allocation)
    rows: dict[int, dict[str, Any]] = {}
    for su in cluster.sus.all():
        rows[su.pk] = {"su": su, "nodes": []}
    for node in Node.objects.filter(cluster=cluster).order_by("su__index", "index"):
        node.holders = holders.get(node.pk, [])  # type: ignore[attr-defined]
        rows[node.su_id]["nodes"].append(node)
    return list(rows.values())


# ---------------------------------------------------------------------------------------------
# Order preview: what an order would get and cost now, before anything is reserved
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrderPreview:
    """Everything the order form shows before the customer confirms. Nothing is reserved."""

    gpu_model: str
    cards: int
    placement: Preview | None
    no_capacity: NoCapacity | None
    quote: Any  # billing.pricing.Quote, or None when no price is set
    price_error: str
    insufficient_funds: str
    image: Any  # marketplace ImageVersion or None
    image_warning: str
    mounts: list[Any]  # marketplace MountSpec
    mount_error: Any  # marketplace MountRefused or None

    @property
    def orderable(self) -> bool:
        return (
            self.placement is not None
            and self.quote is not None
            and not self.insufficient_funds
            and self.mount_error is None
            and not self.image_warning
        )


# One-click presets of the order form (``?template=``): the LLaMA-7B demo runs on one 8-card
# RTX 4090 host with PyTorch 2.1, the model and a dataset mounted.
ORDER_TEMPLATES: dict[str, dict[str, Any]] = {
    "llama-7b-demo": {
        "fields": {"gpu_model": "RTX4090", "cards": "8", "image": "pytorch-2.1.2-cuda12.1-py3.10"},
        "assets": (("model", "meta-llama/Llama-2-7b-hf"), ("dataset", "wikitext")),
    },
}


def resolve_order_template(name: str) -> tuple[dict[str, str], list[str]]:
    """A preset's form defaults and the public ids of its assets (unknown name: nothing)."""
    from marketplace import services as marketplace

    preset = ORDER_TEMPLATES.get(name)
    if preset is None:
        return {}, []
    asset_ids = []
    for kind, hub_id in preset["assets"]:
        try:
            asset_ids.append(str(marketplace.get_asset_by_hub_id(kind, hub_id).public_id))
        except Http404:
            continue  # an operator unlisted it; the demo still runs without it
    return dict(preset["fields"]), asset_ids


@dataclass(frozen=True)
class OrderChoices:
    """What the order form offers now: regions and GPU models with capacity, listed images."""

    availability: list[Availability]
    regions: list[tuple[str, str]]  # (code, display name)
    gpu_models: list[str]
    images: list[tuple[str, str]]  # (version slug, label)


def order_choices() -> OrderChoices:
    from marketplace import services as marketplace

    rows = availability()
    return OrderChoices(
        availability=rows,
        regions=list(dict.fromkeys((r.region, r.region_name) for r in rows)),
        gpu_models=list(dict.fromkeys(r.gpu_model for r in rows)),
        images=[
            (v.slug, str(v))
            for i in marketplace.list_images()
            for v in i.shown_versions  # type: ignore[attr-defined]  # set by list_images()
        ],
    )


def preview_order(
    user: Any,
    *,
    gpu_model: str,
    cards: int,
    region: str | None = None,
    image: str = "",
    asset_ids: Iterable[str] = (),
    disk_gb: int = 0,
) -> OrderPreview:
    """Place (without reserving), price and check the mounts of an order, through each app's
    services: the allocator here, billing's quote and affordability check, marketplace mounts.
    ``image`` is an image version's slug or public id ("" for none)."""
    from billing import services as billing
    from marketplace import services as marketplace

    placement: Preview | None = None
    no_capacity: NoCapacity | None = None
    try:
        placement = preview_allocation(cards, gpu_model, region or None)
    except NoCapacity as exc:
        no_capacity = exc

    # The price book names models by product name ("RTX 4090"), the fleet by code ("RTX4090").
    names = {topology.gpu_model_key(p.gpu_model): p.gpu_model for p, _t in billing.price_list()}
    price_name = names.get(topology.gpu_model_key(gpu_model))
    quote, price_error, insufficient = None, "", ""
    if price_name is None:
        price_error = _("No price is set for %(model)s yet.") % {"model": gpu_model}
    else:
        quote = billing.quote_for(user, price_name, cards, disk_gb)
        try:
            billing.ensure_affordable(user, price_name, cards, disk_gb)
        except billing.InsufficientFunds as exc:
            insufficient = str(exc)

    version = marketplace.get_image_version(image) if image else None
    image_warning = ""
    if version is not None and not version.supports(gpu_model):
        image_warning = _("This image is not built for %(model)s.") % {"model": gpu_model}

    mounts: list[Any] = []
    mount_error = None
    try:
        mounts = marketplace.build_mount_specs(user, list(asset_ids))
    except marketplace.MountRefused as exc:
        mount_error = exc
    return OrderPreview(
        gpu_model,
        cards,
        placement,
        no_capacity,
        quote,
        price_error,
        insufficient,
        version,
        image_warning,
        mounts,
        mount_error,
    )
