"""Placement by the project's policy: hosts of 1/2/4/8 GPUs, slices of 64·k GPUs, SU minimums,
fragmentation, clusters and regions, commit and release, unschedulable nodes."""

from __future__ import annotations

import math

import pytest

from slices.topology import Fleet, Placement, Request, Unplaceable
from tests.slices.test_topology import cluster_spec, fleet_spec


def _placed(fleet: Fleet, req: Request) -> Placement:
    got = fleet.allocate(req)
    assert isinstance(got, Placement), got
    return got


def _busy(fleet: Fleet, lease: str, hosts: list[str], ends_at: float | None = None) -> None:
    fleet.occupy(lease, {h: range(8) for h in hosts}, ends_at=ends_at)


# ---- hosts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_a_host_on_an_empty_fleet_takes_the_lowest_block_of_the_first_node(gpus: int) -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [4, 4])))
    p = _placed(fleet, Request("h", gpus, "H800"))
    assert [(s.hostname, s.gpus, s.su) for s in p.shares] == [("c-s1-n0", tuple(range(gpus)), 0)]
    assert (p.su_count, p.switch_level, p.is_slice) == (1, 0, False)
    assert p.hostfile() == [f"c-s1-n0 slots={gpus}"]
    assert fleet.free_gpus() == 64 - gpus


def test_hosts_fill_a_partly_used_node_in_buddy_blocks_before_breaking_another() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [4])))
    got = [_placed(fleet, Request(str(i), g, "H800")).shares[0] for i, g in enumerate([1, 2, 4, 1])]
    assert [(s.hostname, s.gpus) for s in got] == [
        ("c-s1-n0", (0,)),
        ("c-s1-n0", (2, 3)),
        ("c-s1-n0", (4, 5, 6, 7)),
        ("c-s1-n0", (1,)),
    ]
    assert fleet.clusters[0].su_free_counts() == [3]


def test_a_host_goes_to_the_partly_used_node_with_the_smallest_block_that_fits() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [4])))
    fleet.occupy("a", {"c-s1-n0": range(4)})  # free 4-7: a block of 4
    fleet.occupy("b", {"c-s1-n1": range(6)})  # free 6-7: a block of 2
    assert _placed(fleet, Request("h", 2, "H800")).shares[0].gpus == (6, 7)
    assert _placed(fleet, Request("i", 2, "H800")).shares[0].hostname == "c-s1-n0"
    # no partly used node has 4 together any more: a whole node breaks
    assert _placed(fleet, Request("j", 4, "H800")).shares[0].hostname == "c-s1-n2"


def test_breaking_a_whole_node_costs_the_least_slice_capacity() -> None:
    # 64-card slices need 8 nodes of one SU: the 16th node of SU 1 is worth a slice, the 12th of
    # SU 2 is not
    fleet = Fleet(fleet_spec(cluster_spec("c", [16, 12])))
    assert _placed(fleet, Request("h", 8, "H800")).shares[0].hostname == "c-s2-n0"
    # across clusters too: a cluster with 8 free nodes loses its slice, one with 9 does not
    fleet = Fleet(fleet_spec(cluster_spec("a", [8]), cluster_spec("b", [9])))
    assert _placed(fleet, Request("h", 1, "H800")).cluster == "b"


# ---- slices -----------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [64, 128, 192, 256, 512, 1024, 2048])
def test_slices_of_every_size_take_whole_nodes_on_the_structural_minimum(gpus: int) -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [20] * 12 + [16])))
    p = _placed(fleet, Request("s", gpus, "H800"))
    nodes = gpus // 8
    assert len(p.shares) == nodes and all(s.gpus == tuple(range(8)) for s in p.shares)
    assert len({s.hostname for s in p.shares}) == nodes
    assert p.su_count == p.su_min_state == p.su_min_structural == math.ceil(nodes / 20)
    assert p.at_structural_minimum and p.is_slice
    assert p.switch_level == (1 if p.su_count == 1 else 2)
    sus = [s.su for s in p.shares]
    assert sus == sorted(sus) and len(set(sus)) == p.su_count  # ranks SU by SU
    assert fleet.clusters[0].free_nodes == 256 - nodes


def test_a_slice_spans_more_sus_than_the_structural_minimum_only_when_the_state_forces_it() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [16, 16, 16])))
    for su in (1, 2, 3):
        _busy(fleet, f"b{su}", [f"c-s{su}-n{n}" for n in range(8)])
    p = _placed(fleet, Request("s", 128, "H800"))
    assert (p.su_count, p.su_min_state, p.su_min_structural) == (2, 2, 1)
    assert not p.at_structural_minimum and p.switch_level == 2


def test_equal_losses_go_to_the_tightest_su() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [16, 12])))
    assert _placed(fleet, Request("s", 64, "H800")).shares[0].su == 1


def test_the_demand_mix_can_prefer_the_larger_su_over_the_tighter_one() -> None:
    # With 128-card demand, an SU of 20 keeps one 128 after a 64 (12 left: no), an SU of 24 does
    # (16 left): best fit alone would break the 20.
    demand = {"H800": {64: 0.5, 128: 0.5}}
    fleet = Fleet(fleet_spec(cluster_spec("c", [24, 20]), demand=demand))
    assert _placed(fleet, Request("s", 64, "H800")).shares[0].su == 0
    assert _placed(fleet, Request("t", 128, "H800")).su_count == 1
    assert _placed(fleet, Request("u", 128, "H800")).su_count == 1


def test_a_slice_over_several_sus_leaves_the_most_valuable_remainder() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [20, 20, 16])))
    p = _placed(fleet, Request("s", 192, "H800"))  # 24 nodes: two SUs
    assert {s.su for s in p.shares} == {0, 1}  # 20 + 20 keep 16 usable nodes, 20 + 16 only 8
    free = fleet.clusters[0].su_free_counts()
    assert free[2] == 16 and free[0] + free[1] == 16
    for i in range(4):
        assert _placed(fleet, Request(f"t{i}", 64, "H800")).su_count == 1


def test_the_cluster_with_the_fewest_sus_wins() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("a", [10, 10]), cluster_spec("b", [16])))
    assert _placed(fleet, Request("s", 128, "H800")).cluster == "b"


def test_open_ended_slices_break_ties_by_the_lowest_su() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [8, 8, 8])))
    assert [_placed(fleet, Request(str(i), 64, "H800")).shares[0].su for i in range(3)] == [0, 1, 2]


def test_a_lease_that_ends_with_the_new_one_beats_an_empty_su() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [16, 16, 16])))
    _busy(fleet, "b", [f"c-s3-n{n}" for n in range(8)], ends_at=500)
    _busy(fleet, "a", [f"c-s1-n{n}" for n in range(8)], ends_at=100)
    p = _placed(fleet, Request("s", 64, "H800", now=0, ends_at=480))
    assert p.shares[0].su == 2


# ---- clusters, regions, validation ------------------------------------------------------------


def test_ethernet_and_4_gpu_clusters_take_hosts_but_no_slices() -> None:
    fleet = Fleet(
        fleet_spec(
            cluster_spec("e", [8], model="RTX4090", fabric="ethernet"),
            cluster_spec("q", [8], model="L40", gpn=4),
        )
    )
    assert fleet.plan(Request("a", 64, "RTX4090")).code == "no_cluster"
    assert isinstance(fleet.plan(Request("b", 8, "RTX4090")), Placement)
    assert fleet.plan(Request("c", 64, "L40")).code == "no_cluster"
    assert fleet.plan(Request("d", 8, "L40")).code == "invalid_size"
    assert _placed(fleet, Request("e", 4, "L40")).shares[0].gpus == (0, 1, 2, 3)
    assert fleet.free_gpus("L40") == 28 and fleet.free_gpus("RTX4090") == 64


def test_a_region_restricts_the_clusters() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("a", [8]), cluster_spec("b", [8], region="r1")))
    assert _placed(fleet, Request("s", 64, "H800", region="r1")).cluster == "b"
    assert fleet.plan(Request("t", 64, "H800", region="r1")).code == "no_capacity"
    assert fleet.plan(Request("u", 8, "H800", region="r9")).code == "no_cluster"
    assert fleet.free_gpus(region="r0") == 64 and fleet.free_gpus(region="r1") == 0


@pytest.mark.parametrize(
    ("gpus", "code"),
    [(0, "invalid_size"), (-64, "invalid_size"), (16, "invalid_size"), (640, "too_large")],
)
def test_sizes_that_can_never_fit_are_refused_before_planning(gpus: int, code: str) -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [8, 8, 8, 8, 8, 8, 8, 8, 8])))
    got = fleet.plan(Request("r", gpus, "H800"))
    assert isinstance(got, Unplaceable) and got.code == code and got.reason


# ---- commit, occupy, release --------------------------------------------------------------------


def test_planning_takes_nothing_and_commit_refuses_gpus_already_taken() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [8])))
    p = fleet.plan(Request("a", 64, "H800"))
    q = fleet.plan(Request("b", 64, "H800"))
    assert isinstance(p, Placement) and isinstance(q, Placement)
    assert fleet.free_gpus() == 64 and not fleet.leases
    fleet.commit(p)
    with pytest.raises(ValueError, match="already exists"):
        fleet.commit(p)
    with pytest.raises(ValueError, match="not free"):
        fleet.commit(q)
    assert fleet.free_gpus() == 0 and set(fleet.leases) == {"a"}


def test_occupy_records_an_allocation_and_release_gives_exactly_it_back() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [4, 4])))
    p = fleet.occupy("x", {"c-s1-n0": [2, 1], "c-s2-n0": range(8)}, ends_at=50)
    assert p.gpus == 10 and p.su_count == 2 and p.shares[0].gpus == (1, 2)
    assert fleet.clusters[0].su_ends == [{"x": 50}, {"x": 50}]
    assert fleet.node_leases[fleet.gid_by_hostname["c-s1-n0"]] == {"x"}
    assert fleet.free_gpus() == 64 - 10 and fleet.clusters[0].su_free_counts() == [3, 3]
    assert fleet.release("x") == p
    assert fleet.free_gpus() == 64 and fleet.clusters[0].su_free_counts() == [4, 4]
    assert fleet.clusters[0].su_ends == [{}, {}] and not fleet.node_leases[0]
    with pytest.raises(KeyError):
        fleet.release("x")


def test_duplicate_hostnames_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate hostname"):
        Fleet(fleet_spec(cluster_spec("c", [2]), cluster_spec("c", [2], region="r1")))


# ---- unschedulable nodes --------------------------------------------------------------------------


def test_a_drained_node_counts_out_of_service_and_takes_no_slice() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [8, 8])))
    fleet.set_schedulable("c-s1-n3", False)
    fleet.set_schedulable("c-s1-n3", False)  # twice changes nothing
    assert fleet.free_gpus() == 120 and fleet.out_of_service_gpus() == 8
    assert fleet.clusters[0].su_free_counts() == [7, 8]
    assert _placed(fleet, Request("s", 64, "H800")).shares[0].su == 1
    assert isinstance(fleet.plan(Request("t", 64, "H800")), Unplaceable)
    fleet.set_schedulable("c-s1-n3", True)
    assert _placed(fleet, Request("t", 64, "H800")).shares[0].su == 0


def test_gpus_leased_on_a_drained_node_stay_leased_and_come_back_out_of_service() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [2])))
    p = _placed(fleet, Request("h", 2, "H800"))
    host = p.shares[0].hostname
    fleet.set_schedulable(host, False)
    assert fleet.leases["h"] and fleet.out_of_service_gpus() == 6
    # the drained node's free GPUs are not offered, even to the best fit
    assert _placed(fleet, Request("i", 1, "H800")).shares[0].hostname != host
    fleet.release("h")
    assert fleet.out_of_service_gpus() == 8 and fleet.free_gpus() == 7
    assert not fleet.is_whole_free(fleet.gid_by_hostname[host])
    fleet.set_schedulable(host, True)
    assert fleet.is_whole_free(fleet.gid_by_hostname[host])
    assert fleet.clusters[0].su_free_counts() == [1]


def test_a_returned_partly_used_node_is_offered_to_hosts_again() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [2])))
    fleet.occupy("a", {"c-s1-n0": [0]})
    fleet.set_schedulable("c-s1-n0", False)
    assert fleet.best_partial_node("r0", "H800", 4) is None
    fleet.set_schedulable("c-s1-n0", True)
    assert fleet.best_partial_node("r0", "H800", 4) == (7, 0)
    assert _placed(fleet, Request("b", 1, "H800")).shares[0].hostname == "c-s1-n0"
