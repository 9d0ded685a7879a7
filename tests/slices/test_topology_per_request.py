"""Issue 32: the slice capacity a placement protects counts requests, not nodes. The demand
weights are shares of the requests and the replay scores every request once, whatever its size;
weighing free capacity by nodes made the allocator keep room for large slices at the price of
more rejected small ones (pure: no Django)."""

from __future__ import annotations

import pytest

from slices.topology import Fleet, Placement, Request, spanning_value_table, value_table
from tests.slices.test_topology import cluster_spec, fleet_spec


def test_per_slice_tables_count_the_slices_free_nodes_can_take() -> None:
    # 64 cards = 8 nodes, 512 cards = 64 nodes in chunks of 16 over 20-node SUs; equal shares
    v = value_table({64: 1.0, 512: 1.0}, 20, per_slice=True)
    assert v[7] == 0.0
    assert v[8] == pytest.approx(0.5)  # one 64-card slice
    assert v[16] == pytest.approx(0.5 * 2 + 0.5 * 1)  # two 64s, or one 512 chunk
    by_node = value_table({64: 1.0, 512: 1.0}, 20)
    assert by_node[16] == pytest.approx(0.5 * 8 * 2 + 0.5 * 16 * 1)
    c = spanning_value_table({64: 1.0, 512: 1.0}, 20, 128, per_slice=True)
    assert (c[63], c[64], c[128]) == (0.0, pytest.approx(0.5), pytest.approx(1.0))
    # sizes below a slice are host demand and count for nothing here, either way
    assert value_table({8: 5.0, 64: 1.0}, 20, per_slice=True) == value_table(
        {64: 1.0}, 20, per_slice=True
    )


def _placed(fleet: Fleet, req: Request) -> Placement:
    got = fleet.allocate(req)
    assert isinstance(got, Placement), got
    return got


def test_a_whole_node_is_broken_where_it_costs_the_fewest_requests() -> None:
    """64-card requests 1 : 192-card requests 0.8. SU 1 has 8 free nodes (one 64-card slice),
    SU 2 has 12 (one 192-card slice's 12-node chunk, no more 64s than with 11). By nodes the
    192-card chunk weighed more (0.8 × 12 > 1 × 8) and an 8-card host broke SU 1, ending a
    64-card slice; by requests it breaks SU 2, the rarer size's."""
    fleet = Fleet(fleet_spec(cluster_spec("c", [20, 20]), demand={"H800": {64: 1.0, 192: 0.8}}))
    fleet.occupy("busy", {f"c-s1-n{i}": range(8) for i in range(12)})
    fleet.occupy("busy2", {f"c-s2-n{i}": range(8) for i in range(8)})
    host = _placed(fleet, Request("h", 8, "H800"))
    assert host.shares[0].hostname == "c-s2-n8"
    # the 64-card slice still fits SU 1 at once, on one leaf
    got = _placed(fleet, Request("s", 64, "H800"))
    assert {s.su for s in got.shares} == {0} and got.at_structural_minimum


def test_the_placement_rules_are_unchanged_slices_stay_on_the_fewest_sus() -> None:
    """Only the choice among placements that keep the rules changes: every slice still takes the
    fewest SUs the state allows and whole nodes."""
    fleet = Fleet(fleet_spec(cluster_spec("c", [20, 20, 16]), demand={"H800": {64: 1, 256: 1}}))
    for i, gpus in enumerate([64, 256, 64, 64]):
        got = _placed(fleet, Request(f"r{i}", gpus, "H800"))
        assert got.su_count == got.su_min_state
        assert all(len(s.gpus) == 8 for s in got.shares)
