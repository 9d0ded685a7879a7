"""The fleet inventory: loading the fleet file, the allocator's view of the database, the pages'
cached view of it (keyed on the fleet's change token), availability, operator actions on nodes and
the fabric map."""

from __future__ import annotations

import logging
import secrets
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import DEFERRED, F
from django.utils import timezone

from console import loading
from console.audit import services as audit
from console.loading import update_changed, upsert_counted
from slices import topology
from slices.choices import (
    SCHEDULABLE_STATES,
    AllocationState,
    NodeHealth,
    NodeState,
)
from slices.models import (
    GPU,
    Allocation,
    AllocationNode,
    Cluster,
    FleetVersion,
    Gateway,
    GpuModel,
    Instance,
    Node,
    NodeFailure,
    Region,
    ScalableUnit,
    SpineGroup,
)
from slices.services.jobs import enqueue_on_commit

GPU_UUID_NAMESPACE = uuid.UUID("5b0f7a5e-6c1d-4c59-9a8e-1f0e2b7d3c40")

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Loading the fleet file
# ---------------------------------------------------------------------------------------------


@dataclass
class LoadReport(loading.LoadReport):
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
    regions = {
        r.code: upsert_counted(
            report,
            "regions",
            Region,
            {"code": r.code},
            {"name": r.name, "name_zh": r.name_zh, "position": i},
        )
        for i, r in enumerate(spec.regions)
    }
    _load_gateways(spec, regions, report)
    models_ = {
        m.code: upsert_counted(
            report,
            "GPU models",
            GpuModel,
            {"code": m.code},
            {
                "memory_gib": m.memory_gib,
                "nvlink_gbps": m.nvlink_gbps,
                "demand": {str(k): v for k, v in sorted(spec.demand.get(m.code, {}).items())},
            },
        )
        for m in spec.gpu_models
    }
    seen_hosts: set[str] = set()
    existing_nodes = {n.hostname: n for n in Node.objects.all()}
    for position, cs in enumerate(spec.clusters):
        cluster = _load_cluster(cs, position, regions[cs.region], models_[cs.gpu_model], report)
        for su_spec in cs.sus:
            seen_hosts.update(ns.hostname for ns in su_spec.nodes)
        _load_nodes(cs, cluster, models_[cs.gpu_model], existing_nodes, report)
        _load_gpus(cs, cluster, report)
    _flag_missing_nodes([h for h in existing_nodes if h not in seen_hosts], report)
    fleet_changed()  # clusters, nodes or their layout may have changed: a new token on commit
    return report


def _load_gateways(
    spec: topology.FleetSpec, regions: dict[str, Region], report: LoadReport
) -> None:
    """One gateway per region that declares one; a region whose block left the file keeps its
    row, flagged (``in_fleet_file``), as nodes are: its customers' keys are still on it."""
    for r in spec.regions:
        g = r.gateway
        if g is None:
            continue
        upsert_counted(
            report,
            "gateways",
            Gateway,
            {"region": regions[r.code]},
            {
                "host": g.host,
                "port": g.port,
                "user": g.user,
                "address": g.address,
                "ssh_port": g.ssh_port,
                "host_key_fingerprint": g.host_key,
                "keys_file": g.keys_file,
                "ports": g.ports,
                "in_fleet_file": True,
            },
        )
    declared = [regions[r.code].pk for r in spec.regions if r.gateway is not None]
    Gateway.objects.exclude(region_id__in=declared).filter(in_fleet_file=True).update(
        in_fleet_file=False
    )


def _load_cluster(
    cs: topology.ClusterSpec, position: int, region: Region, model: GpuModel, report: LoadReport
) -> Cluster:
    """The cluster's row and one spine group per rail."""
    cluster: Cluster = upsert_counted(
        report,
        "clusters",
        Cluster,
        {"code": cs.code},
        {
            "name": cs.name,
            "region": region,
            "gpu_model": model,
            "fabric": cs.fabric,
            "gpus_per_node": cs.gpus_per_node,
            "numa_nodes": cs.numa_nodes,
            "gpus_per_hca": cs.gpus_per_hca,
            "rails": cs.rails,
            "link_gbps": cs.link_gbps,
            "leaf_ports": cs.leaf_ports,
            "position": position,
        },
    )
    for rail in range(cs.rails):
        upsert_counted(report, "spine groups", SpineGroup, {"cluster": cluster, "rail": rail}, {})
    return cluster


def _load_nodes(
    cs: topology.ClusterSpec,
    cluster: Cluster,
    model: GpuModel,
    existing_nodes: dict[str, Node],
    report: LoadReport,
) -> None:
    """The cluster's scalable units and nodes: existing nodes updated, new ones made in bulk."""
    full = (1 << cs.gpus_per_node) - 1
    new_nodes: list[Node] = []
    for su_spec in cs.sus:
        su = upsert_counted(
            report,
            "scalable units",
            ScalableUnit,
            {"cluster": cluster, "index": su_spec.index},
            {"name": su_spec.name, "capacity": su_spec.capacity},
        )
        for i, ns in enumerate(su_spec.nodes):
            values = {
                "cluster": cluster,
                "su": su,
                "index": i,
                "address": ns.address,
                "ssh_port": ns.ssh_port,
                "host_key_fingerprint": ns.host_key,
                "gpu_model": model,
                "gpus_per_node": cs.gpus_per_node,
                "layout": {
                    "numa_nodes": cs.numa_nodes,
                    "gpus_per_hca": cs.gpus_per_hca,
                    "rails": cs.rails,
                    "nvlink": bool(model.nvlink_gbps),
                    **({"runtime": cs.runtime} if cs.runtime else {}),
                    **({"single_tenant": True} if cs.single_tenant else {}),
                },
                "in_fleet_file": True,
            }
            node = existing_nodes.get(ns.hostname)
            if node is None:
                new_nodes.append(Node(hostname=ns.hostname, free_mask=full, **values))
            elif update_changed(node, values):
                report.add("nodes", "updated")
    if new_nodes:
        Node.objects.bulk_create(new_nodes, batch_size=500)
        report.add("nodes", "created", len(new_nodes))


def _load_gpus(cs: topology.ClusterSpec, cluster: Cluster, report: LoadReport) -> None:
    """One GPU row per node and index, created once (the UUID is derived from hostname and
    index)."""
    layout = _gpu_layout(cs)
    have = set(GPU.objects.filter(node__cluster=cluster).values_list("node_id", "index"))
    new_gpus = [
        GPU(
            node_id=node_id,
            index=i,
            uuid=uuid.uuid5(GPU_UUID_NAMESPACE, f"{hostname}:{i}"),
            numa_node=layout[i][0],
            hca=layout[i][1],
        )
        for node_id, hostname in Node.objects.filter(cluster=cluster).values_list("id", "hostname")
        for i in range(cs.gpus_per_node)
        if (node_id, i) not in have
    ]
    if new_gpus:
        GPU.objects.bulk_create(new_gpus, batch_size=1000)
        report.add("GPUs", "created", len(new_gpus))


def _flag_missing_nodes(gone: list[str], report: LoadReport) -> None:
    """Nodes no longer in the file: kept (they may hold GPUs), flagged and put in maintenance."""
    if gone:
        Node.objects.filter(hostname__in=gone).update(
            in_fleet_file=False, state=NodeState.MAINTENANCE
        )
        report.missing_nodes = sorted(gone)


# ---------------------------------------------------------------------------------------------
# The allocator's view of the database
# ---------------------------------------------------------------------------------------------


def _ts(dt: datetime | None) -> float | None:
    return dt.timestamp() if dt else None


# The node columns `build_fleet` reads: what the allocator plans on and a claim's compare-and-set
# compares (a node's layout, keys and timestamps cost more to load than the rest of the view).
NODE_COLUMNS = (
    "id",
    "hostname",
    "address",
    "cluster_id",
    "gpus_per_node",
    "state",
    "health",
    "free_mask",
)


def build_fleet(
    gpu_model: str | None = None, *, with_nodes: bool = True
) -> tuple[topology.Fleet, dict[str, Node]]:
    """A `topology.Fleet` mirroring the database now (optionally one GPU model only), and the
    nodes by hostname as read (`NODE_COLUMNS`; other fields load when read) for a claim's
    compare-and-set; ``with_nodes=False``: no nodes (the pages' view plans, never claims)."""
    clusters = Cluster.objects.select_related("region", "gpu_model").order_by("position", "code")
    nodes_qs = Node.objects.order_by("cluster__position", "su__index", "index")
    if gpu_model:
        clusters = clusters.filter(gpu_model__code=gpu_model)
        nodes_qs = nodes_qs.filter(gpu_model__code=gpu_model)
    nodes_by_cluster: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    rows = []
    for *values, su_index in nodes_qs.values_list(*NODE_COLUMNS, "su__index"):
        n = dict(zip(NODE_COLUMNS, values, strict=True))
        nodes_by_cluster[n["cluster_id"]][su_index].append(n)
        rows.append(n)
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
                tuple(topology.NodeSpec(n["hostname"], n["address"]) for n in nodes),
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
    for n in rows:
        # GPUs the mask says are taken but no lease explains (e.g. a half-written row elsewhere)
        # are held back too: the mask in the database is what the commit compares against.
        hostname, full = n["hostname"], (1 << n["gpus_per_node"]) - 1
        stray = full & ~n["free_mask"] & ~accounted[hostname]
        if stray:
            fleet.occupy(f"stray:{hostname}", {hostname: topology.gpu_indexes(stray)})
        if n["state"] not in SCHEDULABLE_STATES or n["health"] != NodeHealth.OK:
            fleet.set_schedulable(hostname, False)
    if not with_nodes:
        return fleet, {}
    # Model instances made from the same rows (the snapshot the plan saw), the rest deferred.
    fields = [f.attname for f in Node._meta.concrete_fields]
    by_host = {
        n["hostname"]: Node.from_db(nodes_qs.db, fields, [n.get(f, DEFERRED) for f in fields])
        for n in rows
    }
    return fleet, by_host


def _demand(models: Iterable[GpuModel]) -> dict[str, dict[int, float]]:
    """Order mix per GPU model (from the fleet file) for fragmentation-aware placement."""
    return {m.code: {int(k): float(v) for k, v in (m.demand or {}).items()} for m in models}


# ---------------------------------------------------------------------------------------------
# Operator actions on nodes
# ---------------------------------------------------------------------------------------------

NODE_ACTIONS = ("drain", "maintenance", "fail", "return")


@transaction.atomic
def change_node_state(
    node: Node, action: str, note: str = "", *, who: Any = None, request: Any = None
) -> bool:
    """Drain, put in maintenance, mark failed or return a node to service (compare-and-set).

    Draining keeps running leases and takes no new ones; maintenance needs an empty node. Every
    team with an instance on the node gets an operator entry in its audit log.
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
    if won:
        fleet_changed()  # the node takes no new leases (or takes them again)
        if action == "fail":  # the history beside the console's own judgements
            NodeFailure.objects.create(
                node=node, at=now, automatic=False, signal="operator", detail=note[:255]
            )
        elif action == "return":
            NodeFailure.objects.filter(node=node, returned_at__isnull=True).update(returned_at=now)
            # 排队 (issue 32): the node is back, the model's queue may start.
            gpu_model = GpuModel.objects.filter(pk=node.gpu_model_id).values_list("code", flat=True)
            for code in gpu_model:
                enqueue_on_commit("slices.tasks.admit_queue_task", code)
        _audit_node_action(node, action, note, who, request)
    node.refresh_from_db()
    return won == 1


def _audit_node_action(node: Node, action: str, note: str, who: Any, request: Any) -> None:
    """An operator's node action is an operator action on every team with an instance there."""
    live = Instance.objects.filter(nodes__node=node, resources_freed_at__isnull=True)
    for instance in live.select_related("team").distinct():
        audit.record(
            who,
            "ops.node",
            instance,
            team=instance.team,
            operator=True,
            before={"node": node.hostname},
            after={"action": action, "note": note},
            request=request,
        )


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


def availability(view: FleetView | None = None) -> list[Availability]:
    """What can be ordered now, per region and GPU model (from the shared view: `fleet_view`)."""
    view = view or fleet_view()
    return [
        Availability(
            o.region,
            view.regions[o.region].display_name if o.region in view.regions else o.region,
            o.gpu_model,
            o.total_gpus,
            o.free_gpus,
            o.out_of_service_gpus,
            o.host_sizes,
            o.largest_slice,
            o.slices,
        )
        for o in view.offers
    ]


@dataclass(frozen=True)
class ClusterSize:
    """A cluster as the order form sizes its card choices."""

    code: str
    region: str
    gpu_model: str
    gpus_per_node: int
    gpus: int
    slices: bool  # an InfiniBand cluster of 8-GPU nodes: it takes slices


@dataclass(frozen=True)
class _Offer:
    """An `Availability` without the region's name (which is in the reader's language)."""

    region: str
    gpu_model: str
    total_gpus: int
    free_gpus: int
    out_of_service_gpus: int
    host_sizes: tuple[int, ...]
    largest_slice: int
    slices: bool


def _offers(fleet: topology.Fleet, region_order: list[str]) -> tuple[_Offer, ...]:
    out = []
    seen = sorted({(c.region, c.model) for c in fleet.clusters})
    order = {code: i for i, code in enumerate(region_order)}
    for region, model in sorted(seen, key=lambda rm: (order.get(rm[0], 99), rm[1])):
        cls = fleet.candidates(model, region)
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
        out.append(
            _Offer(
                region,
                model,
                sum(c.spec.gpu_count for c in cls),
                fleet.free_gpus(model, region),
                fleet.out_of_service_gpus(model, region),
                hosts,
                largest,
                has_slices,
            )
        )
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# The fleet's change token and the pages' shared view of the fleet
# ---------------------------------------------------------------------------------------------

# A view is rebuilt after this long even when its key still matches: the bound on how long a
# change that reached neither the token nor the node aggregate of the key (a token lost to a
# crash between a commit and its callback; a region renamed in the admin) can go unseen.
FLEET_VIEW_MAX_AGE_SECONDS = 30.0


class _NewTokenOnCommit:
    """The on-commit callback of a transaction that changed the fleet (one per transaction)."""

    def __init__(self) -> None:
        self.done = False

    def __call__(self) -> None:
        self.done = True
        new_fleet_token()


def fleet_changed() -> None:
    """This transaction changed what the fleet can place: a node's free mask, state or health, a
    lease, the fleet file. The fleet's token changes when it commits (at once outside a
    transaction), so no process's cached view (`fleet_view`) is used past that moment.

    On commit rather than inside the transaction: a row every claim updated would stay locked
    from the claim to the order's commit, queueing every order of the fleet behind it on
    PostgreSQL and taking locks in an order (node, token, wallet) that other transactions take
    the other way round. Until the commit this connection reads the fleet afresh
    (`_changed_here`), so a transaction sees its own claims; other connections see the fleet
    as it was, as they would without a cache, and the new token before the writer's caller
    gets its answer (Django runs on-commit callbacks before ``atomic`` returns).
    """
    if not _changed_here():
        transaction.on_commit(_NewTokenOnCommit(), robust=True)


def _changed_here() -> bool:
    """Whether this connection's open transaction changed the fleet (its new token is due)."""
    pending = transaction.get_connection().run_on_commit
    return any(isinstance(f, _NewTokenOnCommit) and not f.done for _sids, f, _robust in pending)


def new_fleet_token() -> None:
    """Give the fleet a new random token (the row is made again if a test's flush removed it)."""
    now = timezone.now()
    if not FleetVersion.objects.filter(pk=1).update(
        token=secrets.randbits(62), changes=F("changes") + 1, changed_at=now
    ):
        FleetVersion.objects.get_or_create(
            pk=1, defaults={"token": secrets.randbits(62), "changes": 1, "changed_at": now}
        )


def _fleet_key() -> tuple[Any, ...] | None:
    """What the shared view is keyed on, read in one statement: the token, and an aggregate of
    the node rows (count, the free masks plain and weighted by id, the out-of-service nodes'
    count and ids) that moves when a node is changed by a writer outside this module and the
    allocator (a health check marking a node degraded, an operator in the admin). None: the
    view must not be shared now (this transaction changed the fleet, or there is no token)."""
    if _changed_here():
        return None
    connection = transaction.get_connection()
    with connection.cursor() as cursor:
        in_service = [*(str(s) for s in SCHEDULABLE_STATES), str(NodeHealth.OK)]
        cursor.execute(_key_sql(connection), in_service * 3)  # one set per CASE
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    return tuple(row)


def _key_sql(connection: Any) -> str:
    """The key's statement (plain SQL: the ORM took ten times as long to build it as the
    database to run it; pages read it on every request). Identifiers come from the models'
    metadata and every value is a parameter (hence the S608 waiver)."""
    q = connection.ops.quote_name
    node, version = q(Node._meta.db_table), q(FleetVersion._meta.db_table)
    column = {f.name: q(f.column) for f in Node._meta.concrete_fields}
    nid, free, state, health = (column[f] for f in ("id", "free_mask", "state", "health"))
    states = ", ".join(["%s"] * len(SCHEDULABLE_STATES))
    ok = f"{state} IN ({states}) AND {health} = %s"
    return (
        f"SELECT (SELECT {q('token')} FROM {version} WHERE {q('id')} = 1), COUNT(*), "  # noqa: S608
        f"SUM({free}), SUM({free} * {nid}), "
        f"SUM(CASE WHEN {ok} THEN 0 ELSE 1 END), "
        f"SUM(CASE WHEN {ok} THEN 0 ELSE {nid} END), "
        f"SUM(CASE WHEN {ok} THEN 0 ELSE {nid} * {nid} END) "
        f"FROM {node}"
    )


class FleetView:
    """The allocator's view of the whole fleet at one key, shared by this process's requests:
    what the pages show (availability, the order form's preview) without rebuilding 6,080 GPUs
    each time. Orders never plan on it: `allocation.allocate` reads the database afresh and
    commits with compare-and-set."""

    def __init__(self, key: tuple[Any, ...] | None) -> None:
        # The key is read before the rows: rows newer than their key only cost a rebuild.
        self.key = key
        self.made_at = time.monotonic()
        self._fleet, _nodes = build_fleet(with_nodes=False)
        self.regions = {r.code: r for r in Region.objects.all()}
        self._lock = threading.Lock()
        with self.planning() as fleet:
            self.offers = _offers(fleet, list(self.regions))
            self.clusters = tuple(
                ClusterSize(c.code, c.region, c.model, c.gpn, c.spec.gpu_count, c.slices_ok)
                for c in fleet.clusters
            )

    def matches(self, key: tuple[Any, ...]) -> bool:
        return key == self.key and time.monotonic() - self.made_at < FLEET_VIEW_MAX_AGE_SECONDS

    @contextmanager
    def planning(self) -> Iterator[topology.Fleet]:
        """The fleet, to plan on without taking (``plan``, ``explain``, ``earliest_start``), one
        thread at a time: reading, the allocator tidies its heaps and memos."""
        with self._lock:
            yield self._fleet


_shared: FleetView | None = None
_building = threading.Lock()


def fleet_view() -> FleetView:
    """The fleet as the database has it now: the shared view while its key is the database's,
    else a new one (shared from then on, unless this transaction changed the fleet)."""
    global _shared
    key = _fleet_key()
    if key is None:
        return FleetView(None)
    view = _shared
    if view is not None and view.matches(key):
        return view
    with _building:  # one build for the requests that all found it out of date
        view = _shared
        if view is None or not view.matches(key):
            view = _shared = FleetView(key)
        return view


def cluster_map(cluster: Cluster) -> list[dict[str, Any]]:
    """Rows of the fabric map: one per SU, nodes with their state and holders (3 queries)."""
    holders: dict[int, list[Allocation]] = defaultdict(list)
    parts = (
        AllocationNode.objects.filter(
            node__cluster=cluster, allocation__state=AllocationState.ACTIVE
        )
        .select_related("allocation", "allocation__team", "allocation__instance")
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
