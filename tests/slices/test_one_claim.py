"""One GPU claim: every placement asks the allocator, which alone writes a node's free mask.

A start on the instance's own host, a start on another host and a migration's replacement node
take their GPUs with the allocator's rules (the buddy-aligned block of a host, best fit, a slice's
replacement in the failed node's SU when one is free there) and its compare-and-set; no other
module writes ``Node.free_mask``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from slices import services
from slices.choices import InstanceState, NodeState
from slices.models import GPU, Instance, Node
from slices.services import migration, power
from slices.services.allocation import (
    NoCapacity,
    allocate,
    claim_on_node,
    release_allocation,
)
from slices.topology import Fleet, Placement, gpu_indexes, gpu_mask
from tests.slices.factories import SMALL_FLEET, load_small_fleet, run_order
from tests.slices.test_topology import cluster_spec, fleet_spec, make_spec

REPO = Path(__file__).resolve().parents[2]

# The A800 cluster with two spare nodes in each SU: a 64-card slice fills 8 of an SU's 10.
SPARE_FLEET = SMALL_FLEET.replace("scalable_units: [8]", "scalable_units: [10, 10]")


@pytest.fixture
def sim(sim_fleet, settings, tmp_path):
    settings.SLICES_SYSTEM_DISK_GB = 50
    settings.SLICES_PFS_CONSOLE_ROOT = str(tmp_path / "pfs")
    settings.SLICES_MIGRATION_VOUCHER = "0"


def _mask(*gpus: int) -> int:
    return gpu_mask(gpus)


def _busy(owner, node: Node, *sizes: int) -> None:
    """Hosts of ``sizes`` cards for ``owner``, placed by the allocator (they land on ``node``:
    the test drains the other hosts first or leaves ``node`` the best fit)."""
    for cards in sizes:
        got = allocate(owner, cards, node.gpu_model.code)
        assert got.nodes.get().node_id == node.pk


def _held(instance: Instance) -> tuple[str, tuple[int, ...]]:
    """Where the instance's cards are: (hostname, GPU indexes), checked against the allocation's
    part and the GPU rows, which must agree."""
    instance.refresh_from_db()
    part = instance.nodes.select_related("node").get()
    assert instance.allocation is not None
    alloc_part = instance.allocation.nodes.get()
    assert (alloc_part.node_id, alloc_part.gpu_mask) == (part.node_id, part.gpu_mask)
    rows = GPU.objects.filter(allocation=instance.allocation).values_list("node_id", "index")
    assert sorted(rows) == [(part.node_id, i) for i in gpu_indexes(part.gpu_mask)]
    return part.node.hostname, gpu_indexes(part.gpu_mask)


def _with_busy_pair_gap(bob, node: Node) -> None:
    """``node`` with GPUs 0 and 2-3 taken by bob: free 1 and 4-7 (the allocator's own choices
    for a 1-card and then a 2-card host on an empty node)."""
    _busy(bob, node, 1, 2)
    node.refresh_from_db()
    assert node.free_mask == _mask(1, 4, 5, 6, 7)


# ---------------------------------------------------------------------------------------------
# Start (开机)
# ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_start_on_the_same_host_takes_an_aligned_pair(
    sim, funded, bob, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    inst = run_order(funded, capture, cards=2)
    host = inst.nodes.get().node
    with capture(execute=True):
        assert power.stop_instance(inst, by="alice")
    _with_busy_pair_gap(bob, host)
    with capture(execute=True):
        result = power.start_instance(inst, by="alice", mode=power.StartMode.SAME_HOST)
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING and result.moved_from == ""
    # the pair 4-5 (one PCIe switch; 6-7 stays a pair, 4-7 was the only free half): not GPUs 1
    # and 4, the first two free ones, which share nothing and break two pairs
    assert _held(inst) == (host.hostname, (4, 5))
    host.refresh_from_db()
    assert host.free_mask == _mask(1, 6, 7)


@pytest.mark.django_db
def test_two_stray_gpus_are_not_a_pair_so_the_start_goes_elsewhere(
    sim, funded, bob, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    inst = run_order(funded, capture, cards=2)
    host = inst.nodes.get().node
    other = Node.objects.filter(cluster=host.cluster).exclude(pk=host.pk).get()
    with capture(execute=True):
        assert power.stop_instance(inst, by="alice")
    # bob: four 1-card hosts (GPUs 0, 1, 2, 3 by best fit) and a 4-card one (4-7), then two of
    # the 1-card ones end: GPUs 1 and 2 are free, two cards that share no PCIe switch
    singles = [allocate(bob, 1, "RTX4090") for _ in range(4)]
    _busy(bob, host, 4)
    for lease in singles[1:3]:
        assert release_allocation(lease)
    host.refresh_from_db()
    assert host.free_mask == _mask(1, 2)
    assert claim_on_node(funded, host, 2) is None  # what free[:2] used to take
    with pytest.raises(NoCapacity):
        power.start_instance(inst, by="alice", mode=power.StartMode.SAME_HOST)
    with capture(execute=True):
        result = power.start_instance(inst, by="alice")
    inst.refresh_from_db()
    assert result.moved_from == host.hostname
    assert _held(inst) == (other.hostname, (0, 1))
    host.refresh_from_db()
    assert host.free_mask == _mask(1, 2)


@pytest.mark.django_db
def test_start_on_another_host_takes_an_aligned_pair(
    sim, funded, bob, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    inst = run_order(funded, capture, cards=2)
    old = inst.nodes.get().node
    other = Node.objects.filter(cluster=old.cluster).exclude(pk=old.pk).get()
    with capture(execute=True):
        assert power.stop_instance(inst, by="alice")
    assert services.change_node_state(old, "drain", "disk swap")
    _with_busy_pair_gap(bob, other)
    with capture(execute=True):
        result = power.start_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING and result.moved_from == old.hostname
    assert _held(inst) == (other.hostname, (4, 5))


# ---------------------------------------------------------------------------------------------
# Migration's replacement node
# ---------------------------------------------------------------------------------------------


def _order_slice(user, capture) -> Instance:
    req = services.OrderRequest(gpu_model="A800", cards=64)
    with capture(execute=True):
        instance, _created = services.order_instance(user, req)
    instance.refresh_from_db()
    assert instance.state == InstanceState.RUNNING
    return instance


def _fail(node: Node, capture) -> None:
    with capture(execute=True):
        assert migration.fail_node(node, "xid", "Xid 79: GPU has fallen off the bus")


@pytest.mark.django_db
def test_slice_replacement_is_a_whole_node_of_the_failed_nodes_su_when_one_is_free(
    sim, funded, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    load_small_fleet(SPARE_FLEET)
    inst = _order_slice(funded, capture)
    victim = inst.nodes.order_by("rank")[3].node
    spares = list(Node.objects.filter(su=victim.su, free_mask=victim.full_mask))
    assert len(spares) == 2
    _fail(victim, capture)
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING
    new = inst.nodes.select_related("node").get(rank=3).node
    assert new.su_id == victim.su_id and new.pk in {n.pk for n in spares}
    assert new.free_mask == 0  # a whole node
    assert inst.allocation.nodes.get(rank=3).gpu_mask == new.full_mask
    [move] = inst.events.get(code="replacement_allocated").params["moves"]
    assert move["same_su"] is True


@pytest.mark.django_db
def test_slice_replacement_goes_to_another_su_when_its_own_has_no_whole_node(
    sim, funded, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    load_small_fleet(SPARE_FLEET)
    inst = _order_slice(funded, capture)
    victim = inst.nodes.order_by("rank")[3].node
    for spare in Node.objects.filter(su=victim.su, free_mask=victim.full_mask):
        assert services.change_node_state(spare, "drain", "held back")
    _fail(victim, capture)
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING
    new = inst.nodes.select_related("node").get(rank=3).node
    assert new.su_id != victim.su_id and new.cluster_id == victim.cluster_id
    assert new.free_mask == 0
    [move] = inst.events.get(code="replacement_allocated").params["moves"]
    assert move["same_su"] is False


@pytest.mark.django_db
def test_host_replacement_takes_an_aligned_block_of_the_best_fitting_node(
    sim, funded, bob, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    inst = run_order(funded, capture, cards=2)
    victim = inst.nodes.get().node
    other = Node.objects.filter(cluster=victim.cluster).exclude(pk=victim.pk).get()
    # bob's hosts go to the other node (the victim is drained meanwhile)
    assert services.change_node_state(victim, "drain", "")
    _with_busy_pair_gap(bob, other)
    _fail(victim, capture)
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code"))
    assert _held(inst) == (other.hostname, (4, 5))
    victim.refresh_from_db()
    assert victim.state == NodeState.FAILED and victim.free_mask == victim.full_mask


# ---------------------------------------------------------------------------------------------
# The allocator's replacement rule, on the pure fleet
# ---------------------------------------------------------------------------------------------


def _slice_on(fleet: Fleet, lease: str, hosts: list[str]) -> None:
    fleet.occupy(lease, {h: range(8) for h in hosts})


def test_a_slice_part_goes_to_an_su_the_slice_uses_before_a_cheaper_one() -> None:
    fleet = Fleet(make_spec([10, 10, 10]))
    su1 = [f"c0-s1-n{i}" for i in range(10)]
    su2 = ["c0-s2-n0", "c0-s2-n1"]
    _slice_on(fleet, "s", su1 + su2)  # 96 cards: all of SU 1, 2 nodes of SU 2
    failed = su1[3]
    fleet.set_schedulable(failed, False)
    near = [h for h in su1 + su2 if h != failed]
    got = fleet.plan_replacement(failed, 8, whole=True, near=near)
    assert isinstance(got, Placement)
    # SU 2 (8 free) holds the slice's other nodes: no new spine crossing for the ring
    assert got.shares[0].hostname == "c0-s2-n2" and got.shares[0].gpus == tuple(range(8))
    # Without that preference the allocator's own scoring breaks SU 3 (10 free: still one
    # 64-card slice after), not SU 2 (8 free: its only one).
    alone = fleet.plan_replacement(failed, 8, whole=True)
    assert isinstance(alone, Placement) and alone.shares[0].hostname == "c0-s3-n0"


def test_a_slice_part_stays_in_its_su_when_it_has_a_whole_node() -> None:
    fleet = Fleet(make_spec([10, 10]))
    su1 = [f"c0-s1-n{i}" for i in range(8)]
    _slice_on(fleet, "s", su1)
    fleet.set_schedulable(su1[0], False)
    got = fleet.plan_replacement(su1[0], 8, whole=True, near=su1[1:])
    assert isinstance(got, Placement) and got.shares[0].hostname == "c0-s1-n8"


def test_a_host_part_takes_the_best_fit_aligned_block_inside_its_cluster() -> None:
    spec = fleet_spec(cluster_spec("c0", [2, 2]), cluster_spec("c1", [1], net=1))
    fleet = Fleet(spec)
    fleet.occupy("h", {"c0-s1-n0": (0, 1)})
    fleet.occupy("x", {"c0-s2-n0": (0, 2, 3)})  # free 1, 4-7: largest free block 4
    fleet.occupy("y", {"c1-s1-n0": range(6)})  # free 6-7: a tighter fit, but another cluster
    fleet.set_schedulable("c0-s1-n0", False)
    got = fleet.plan_replacement("c0-s1-n0", 2, whole=False)
    assert isinstance(got, Placement) and got.cluster == "c0"
    assert (got.shares[0].hostname, got.shares[0].gpus) == ("c0-s2-n0", (4, 5))


def test_no_replacement_when_the_cluster_is_full() -> None:
    fleet = Fleet(make_spec([2]))
    _slice_on(fleet, "s", ["c0-s1-n0", "c0-s1-n1"])
    fleet.set_schedulable("c0-s1-n0", False)
    got = fleet.plan_replacement("c0-s1-n0", 8, whole=True, near=["c0-s1-n1"])
    assert not isinstance(got, Placement) and got.code == "no_capacity"


# ---------------------------------------------------------------------------------------------
# Nothing else writes a node's free mask
# ---------------------------------------------------------------------------------------------

ALLOCATOR = "slices/services/allocation.py"
WRITE_METHODS = {"update", "update_or_create", "get_or_create", "bulk_update", "bulk_create"}


def _mask_writes(tree: ast.AST) -> Iterator[int]:
    """Line numbers that write ``free_mask``: a queryset ``update(free_mask=...)`` (or an upsert
    with it), ``bulk_update(..., ["free_mask"])``, ``obj.free_mask = ...`` (then ``save()``),
    ``setattr(obj, "free_mask", ...)`` and raw SQL naming the column after UPDATE/SET."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            inside = [*node.args, *(k.value for k in node.keywords)]
            words = [k.arg for k in node.keywords] + [
                c.value
                for arg in inside
                for c in ast.walk(arg)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            ]
            if name in WRITE_METHODS and "free_mask" in words and name != "bulk_create":
                yield node.lineno
            if name == "setattr" and "free_mask" in words:
                yield node.lineno
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "free_mask" for t in targets):
                yield node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            sql = " ".join(node.value.lower().split())
            if "free_mask" in sql and ("update " in sql or "set free_mask" in sql):
                yield node.lineno


def _sources() -> Iterator[tuple[str, ast.AST]]:
    for package in ("slices", "console", "billing", "marketplace", "bench"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if "/migrations/" not in rel:
                yield rel, ast.parse(path.read_text(encoding="utf-8"), rel)


def test_only_the_allocator_writes_a_nodes_free_mask() -> None:
    writes = {rel: sorted(set(_mask_writes(tree))) for rel, tree in _sources()}
    # the scan sees the allocator's own writes (the claim's compare-and-set and the releases)
    assert len(writes[ALLOCATOR]) >= 3, writes[ALLOCATOR]
    elsewhere = {rel: lines for rel, lines in writes.items() if lines and rel != ALLOCATOR}
    assert elsewhere == {}, f"only {ALLOCATOR} may write Node.free_mask: {elsewhere}"


def test_the_scan_catches_each_way_of_writing_the_mask() -> None:
    for source in (
        "Node.objects.filter(pk=1).update(free_mask=0)",
        "node.free_mask = node.free_mask & ~3\nnode.save()",
        "node.free_mask &= ~3",
        "Node.objects.bulk_update(nodes, ['free_mask'])",
        "setattr(node, 'free_mask', 0)",
        "cursor.execute('UPDATE slices_node SET free_mask = 0')",
    ):
        assert list(_mask_writes(ast.parse(source))), source
    for source in (
        "Node.objects.filter(free_mask=node.full_mask).update(state='ready')",
        "Node(hostname='n', free_mask=255)",  # a new node from the fleet file: all GPUs free
        "free = node.free_mask >> 1",
    ):
        assert not list(_mask_writes(ast.parse(source))), source
