"""Why a request cannot be placed: the earliest start from known lease ends, and alternatives."""

from __future__ import annotations

from slices.topology import Alternative, Fleet, Request, Unplaceable
from slices.topology.explain import alternatives
from tests.slices.test_topology import cluster_spec, fleet_spec


def _nodes(cluster: str, su: int, count: int, first: int = 0) -> list[str]:
    return [f"{cluster}-s{su}-n{n}" for n in range(first, first + count)]


def test_a_host_can_start_when_one_node_has_enough_gpus_together() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [1])))
    fleet.occupy("a", {"c-s1-n0": range(4)}, ends_at=100)
    fleet.occupy("b", {"c-s1-n0": range(4, 8)}, ends_at=200)
    assert fleet.earliest_start(Request("h", 1, "H800")) == 100
    assert fleet.earliest_start(Request("h", 4, "H800")) == 100
    assert fleet.earliest_start(Request("h", 8, "H800")) == 200


def test_a_node_shared_by_several_ending_leases_counts_for_a_slice_once_all_end() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [8])))
    for n, host in enumerate(_nodes("c", 1, 8)):
        fleet.occupy(f"lo{n}", {host: range(4)}, ends_at=100 + n)
        fleet.occupy(f"hi{n}", {host: range(4, 8)}, ends_at=200 + n)
    assert fleet.earliest_start(Request("s", 64, "H800")) == 207


def test_leases_without_a_known_end_free_nothing() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [8]), cluster_spec("d", [8], region="r1")))
    fleet.occupy("open", {h: range(8) for h in _nodes("c", 1, 8)})
    fleet.occupy("other-region", {h: range(8) for h in _nodes("d", 1, 8)}, ends_at=10)
    assert fleet.earliest_start(Request("s", 64, "H800", region="r0")) is None
    assert fleet.earliest_start(Request("h", 1, "H800", region="r0")) is None
    assert fleet.earliest_start(Request("s", 64, "H800")) == 10


def test_the_structural_earliest_start_waits_for_few_enough_sus() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [16, 16, 16])))
    fleet.occupy("a", {h: range(8) for h in _nodes("c", 1, 4)}, ends_at=10)
    fleet.occupy("b", {h: range(8) for h in _nodes("c", 1, 8, first=4)}, ends_at=30)
    fleet.occupy("c", {h: range(8) for h in _nodes("c", 2, 8)}, ends_at=20)
    fleet.occupy("d", {h: range(8) for h in _nodes("c", 3, 16)})
    req = Request("s", 128, "H800")  # 16 nodes; free now 4 + 8
    assert fleet.earliest_start(req) == 10  # 8 + 8 on two SUs
    assert fleet.earliest_start(req, structural=True) == 20  # 16 on one SU


def test_drained_nodes_do_not_come_back_when_their_leases_end() -> None:
    fleet = Fleet(fleet_spec(cluster_spec("c", [8])))
    fleet.occupy("all", {h: range(8) for h in _nodes("c", 1, 8)}, ends_at=100)
    fleet.set_schedulable("c-s1-n0", False)
    assert fleet.earliest_start(Request("s", 64, "H800")) is None
    assert fleet.earliest_start(Request("h", 8, "H800")) == 100


def _three_clusters() -> Fleet:
    return Fleet(
        fleet_spec(
            cluster_spec("a", [8]),
            cluster_spec("b", [8], region="r1"),
            cluster_spec("c", [8], model="A800"),
        )
    )


def test_explain_gives_the_reason_the_earliest_start_and_what_fits_instead() -> None:
    fleet = _three_clusters()
    fleet.occupy("full", {h: range(8) for h in _nodes("a", 1, 8)}, ends_at=100)
    why = fleet.explain(Request("s", 64, "H800", region="r0"))
    assert why is not None and why.code == "no_capacity"
    assert why.earliest == 100
    assert why.alternatives == (
        Alternative("region", "r1", "H800", 64, "b"),
        Alternative("gpu_model", "r0", "A800", 64, "c"),
    )


def test_a_host_that_does_not_fit_is_offered_the_largest_smaller_size_too() -> None:
    fleet = _three_clusters()
    for n, host in enumerate(_nodes("a", 1, 8)):
        fleet.occupy(f"h{n}", {host: [0]})  # 7 free GPUs per node: 4 together, not 8
    req = Request("h", 8, "H800", region="r0")
    why = fleet.explain(req)
    assert why is not None and why.earliest is None
    assert [(a.kind, a.region, a.gpu_model, a.gpus) for a in why.alternatives] == [
        ("region", "r1", "H800", 8),
        ("gpu_model", "r0", "A800", 8),
        ("size", "r0", "H800", 4),
    ]
    assert alternatives(fleet, req, limit=1) == why.alternatives[:1]


def test_explain_is_none_for_what_fits_and_plain_for_invalid_sizes() -> None:
    fleet = _three_clusters()
    assert fleet.explain(Request("s", 64, "H800")) is None
    assert fleet.explain(Request("x", 3, "H800")) == Unplaceable(
        "x", "invalid_size", ("a host has 1, 2, 4 or 8 GPUs and a slice a multiple of 64, not 3")
    )


def test_too_large_and_unknown_models_get_no_earliest_start_but_alternatives() -> None:
    fleet = _three_clusters()
    big = fleet.explain(Request("s", 128, "H800", region="r0"))
    assert big is not None and big.code == "too_large" and big.earliest is None
    assert big.alternatives == (Alternative("size", "r0", "H800", 64, "a"),)
    other = fleet.explain(Request("s", 8, "B200"))
    assert other is not None and other.code == "no_cluster" and other.earliest is None
    assert [(a.kind, a.gpu_model) for a in other.alternatives] == [
        ("gpu_model", "A800"),
        ("gpu_model", "H800"),
    ]
