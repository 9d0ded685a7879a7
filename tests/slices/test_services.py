"""Allocation through the service the order flow calls (SQLite here; races on PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from slices import services
from slices.choices import AllocationState, NodeState
from slices.models import GPU, Allocation, Node
from slices.services import allocation as allocation_services
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet() -> None:
    load_small_fleet()


def test_slice_is_placed_on_one_su_with_hostfile_and_expected_performance(fleet, alice) -> None:
    a = services.allocate(alice, 64, "H800", "xiamen", label="llama")
    assert a.kind == "slice" and a.su_count == 1 and a.node_count == 8
    hosts = a.hostfile.split()
    assert hosts[0].startswith("xm-h8-su") and a.hostfile.count("slots=8") == 8
    assert a.performance["busbw_gbps"] > 0 and a.performance["gpus"] == 64
    assert GPU.objects.filter(allocation=a).count() == 64
    assert Node.objects.filter(state=NodeState.ALLOCATED).count() == 8


def test_hosts_share_a_node_before_opening_another(fleet, alice, bob) -> None:
    a = services.allocate(alice, 4, "RTX4090")
    b = services.allocate(bob, 2, "RTX4090")
    assert a.nodes.get().node_id == b.nodes.get().node_id
    assert a.nodes.get().gpu_mask & b.nodes.get().gpu_mask == 0


def test_release_returns_exactly_what_was_taken_and_is_idempotent(fleet, alice) -> None:
    before = dict(Node.objects.values_list("hostname", "free_mask"))
    a = services.allocate(alice, 128, "H800")
    h = services.allocate(alice, 1, "H800")
    assert services.release_allocation(a) is True
    assert services.release_allocation(a) is False
    assert services.release_allocation(h) is True
    assert dict(Node.objects.values_list("hostname", "free_mask")) == before
    assert not GPU.objects.filter(allocation__isnull=False).exists()
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.READY}
    a.refresh_from_db()
    assert a.state == AllocationState.RELEASED and a.released_at is not None


def test_no_capacity_answers_reason_earliest_time_and_alternatives(fleet, alice) -> None:
    ends = timezone.now() + timedelta(hours=3)
    services.allocate(alice, 128, "H800", ends_at=ends)
    services.allocate(alice, 64, "H800", ends_at=ends + timedelta(hours=1))
    with pytest.raises(services.NoCapacity) as err:
        services.allocate(alice, 64, "H800")
    assert err.value.code == "no_capacity"
    assert "H800" in err.value.reason
    assert err.value.earliest is not None and abs((err.value.earliest - ends).total_seconds()) < 1
    assert {"kind": "gpu_model", "region": "yinchuan", "region_name": "银川", "gpu_model": "A800", "gpus": 64,
            "cluster": "yc-a800"} in err.value.alternatives  # fmt: skip
    assert Allocation.objects.count() == 2


def test_drained_and_failed_nodes_get_no_new_gpus(fleet, alice, bob) -> None:
    held = services.allocate(alice, 8, "RTX4090")
    node = held.nodes.get().node
    assert services.change_node_state(node, "drain") is True
    assert node.state == NodeState.DRAINING
    other = Node.objects.get(cluster__code="xm-4090", state=NodeState.READY)
    assert services.change_node_state(other, "fail", "fan") is True
    with pytest.raises(services.NoCapacity):
        services.allocate(bob, 1, "RTX4090")
    assert services.change_node_state(node, "maintenance") is False  # still holds GPUs
    services.release_allocation(held)
    node.refresh_from_db()
    assert node.state == NodeState.DRAINING  # release does not undo a drain
    assert services.change_node_state(node, "maintenance") is True
    assert services.change_node_state(node, "return") is True
    assert services.allocate(bob, 8, "RTX4090").nodes.get().node_id == node.pk


def test_a_commit_planned_on_stale_state_loses_and_the_next_plan_succeeds(
    fleet, alice, bob
) -> None:
    fleet_view, nodes = services.build_fleet("A800")
    from slices.topology import Request

    planned = fleet_view.plan(Request("x", 8, "A800"))
    # Another order takes GPUs on the same node first.
    winner = services.allocate(bob, 4, "A800")
    assert winner.nodes.get().node.hostname == planned.shares[0].hostname
    with pytest.raises(allocation_services._LostRace):
        allocation_services._commit(alice, planned, nodes, None, "")
    assert Allocation.objects.count() == 1
    again = services.allocate(alice, 8, "A800")  # re-plans on the new state
    assert again.nodes.get().node.hostname != planned.shares[0].hostname


def test_availability_reports_free_gpus_hosts_and_largest_slice(fleet, alice) -> None:
    services.allocate(alice, 64, "H800")
    rows = {(a.region, a.gpu_model): a for a in services.availability()}
    h800 = rows[("xiamen", "H800")]
    assert (h800.total_gpus, h800.free_gpus, h800.largest_slice) == (192, 128, 128)
    assert rows[("xiamen", "RTX4090")].slices is False
    assert rows[("xiamen", "RTX4090")].host_sizes == (1, 2, 4, 8)


def test_preview_shows_placement_and_performance_without_reserving(fleet, alice) -> None:
    p = services.preview_allocation(128, "H800")
    assert (p.su_count, p.su_min_structural, p.at_structural_minimum) == (2, 2, True)
    assert p.performance["gpus"] == 128 and p.performance["busbw_gbps"] > 0
    assert Allocation.objects.count() == 0
    for hostname in ("xm-h8-su02-n01", "xm-h8-su03-n01"):
        services.change_node_state(Node.objects.get(hostname=hostname), "fail")
    ends = timezone.now() + timedelta(hours=2)
    held = services.allocate(alice, 64, "H800", ends_at=ends)
    assert held.hostfile.startswith("xm-h8-su01-")
    # 0 + 7 + 7 free: a 64-GPU slice now needs two SUs; on one SU once `held` ends.
    p = services.preview_allocation(64, "H800")
    assert (p.su_count, p.su_min_structural, p.at_structural_minimum) == (2, 1, False)
    assert p.structural_earliest is not None
    assert abs((p.structural_earliest - ends).total_seconds()) < 1
