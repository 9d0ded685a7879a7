"""The pure allocator: buddy hosts, minimal-SU slices, fragmentation, determinism, release."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from slices.fleetfile import SHIPPED_FLEET, load_fleet_file
from slices.topology import (
    ClusterSpec,
    Fleet,
    FleetSpec,
    GpuModelSpec,
    NodeSpec,
    Placement,
    RegionSpec,
    Request,
    ScalableUnitSpec,
    Unplaceable,
    min_sus,
)


def cluster_spec(
    code: str,
    su_sizes: list[int],
    model: str = "H800",
    region: str = "r0",
    fabric: str = "ib-hdr",
    gpn: int = 8,
    net: int = 0,
) -> ClusterSpec:
    """A cluster whose nodes are named <code>-s<SU from 1>-n<node from 0>, at 10.<net>.<SU>.<node>."""
    sus = tuple(
        ScalableUnitSpec(
            si,
            f"su{si}",
            tuple(NodeSpec(f"{code}-s{si}-n{n}", f"10.{net}.{si}.{n}") for n in range(size)),
        )
        for si, size in enumerate(su_sizes, start=1)
    )
    return ClusterSpec(code, code, region, model, fabric, gpn, sus)


def fleet_spec(
    *clusters: ClusterSpec, demand: dict[str, dict[int, float]] | None = None
) -> FleetSpec:
    """A fleet of `clusters`: their regions and GPU models, slice demand {64: 1} unless given."""
    regions = sorted({c.region for c in clusters})
    models = sorted({c.gpu_model for c in clusters})
    return FleetSpec(
        tuple(RegionSpec(r, r.upper()) for r in regions),
        tuple(GpuModelSpec(m, 80) for m in models),
        clusters,
        demand if demand is not None else {m: {64: 1.0} for m in models},
    )


def make_spec(su_sizes: list[int], clusters: int = 1, gpn: int = 8, regions: int = 1) -> FleetSpec:
    """``clusters`` H800 clusters c0, c1... of SUs of ``su_sizes`` nodes, spread over ``regions``."""
    return fleet_spec(
        *(
            cluster_spec(f"c{ci}", su_sizes, region=f"r{ci % regions}", gpn=gpn, net=ci)
            for ci in range(clusters)
        )
    )


def test_shipped_fleet_is_three_regions_of_6000_plus_gpus_with_13_su_clusters() -> None:
    spec = load_fleet_file(SHIPPED_FLEET)
    assert {r.code for r in spec.regions} == {"xiamen", "yinchuan", "ulanqab"}
    assert spec.gpu_count >= 6000
    assert {m.code for m in spec.gpu_models} == {"RTX4090", "A800", "H800"}
    big = [c for c in spec.clusters if c.node_count == 256 and c.fabric == "ib-hdr"]
    assert {c.gpu_model for c in big} == {"A800", "H800"}
    for c in big:
        assert [su.capacity for su in c.sus] == [20] * 12 + [16]


def test_hosts_take_aligned_buddy_blocks_and_fill_partly_used_nodes_first() -> None:
    fleet = Fleet(make_spec([2]))
    a = fleet.allocate(Request("a", 1, "H800"))
    b = fleet.allocate(Request("b", 2, "H800"))
    c = fleet.allocate(Request("c", 4, "H800"))
    d = fleet.allocate(Request("d", 1, "H800"))
    assert all(isinstance(p, Placement) for p in (a, b, c, d))
    # all on the first node: 1 + 2 + 4 + 1 = 8, the second node stays whole
    assert {p.shares[0].hostname for p in (a, b, c, d)} == {"c0-s1-n0"}
    assert b.shares[0].gpus in {(2, 3), (0, 1)} and b.shares[0].gpus[0] % 2 == 0
    assert c.shares[0].gpus == (4, 5, 6, 7)  # a NUMA half
    assert fleet.is_whole_free(fleet.gid_by_hostname["c0-s1-n1"])
    e = fleet.allocate(Request("e", 8, "H800"))
    assert isinstance(e, Placement) and e.shares[0].hostname == "c0-s1-n1"


def test_slice_that_fits_one_su_goes_to_the_tightest_su() -> None:
    fleet = Fleet(make_spec([20, 20, 16]))
    for i in range(4):  # leave SU 2 with 16 free nodes
        fleet.allocate(Request(f"h{i}", 8, "H800"))
    p = fleet.allocate(Request("s", 128, "H800"))
    assert isinstance(p, Placement)
    assert p.su_count == 1 and p.switch_level == 1
    assert len(p.shares) == 16


def test_slice_spans_exactly_the_state_minimum_and_hostfile_goes_su_by_su() -> None:
    fleet = Fleet(make_spec([20] * 12 + [16]))
    p = fleet.allocate(Request("big", 512, "H800"))  # 64 nodes -> ceil(64/20) = 4 SUs
    assert isinstance(p, Placement)
    assert p.su_count == p.su_min_state == p.su_min_structural == 4
    sus = [s.su for s in p.shares]
    assert sus == sorted(sus)  # ranks stay inside an SU before moving on: 3 spine crossings
    assert len(p.hostfile()) == 64 and p.hostfile()[0].endswith("slots=8")


def test_fragmentation_aware_choice_keeps_whole_slices_possible() -> None:
    # SU A has 16 free, SU B 12: a 64-card slice in B leaves A able to take two more.
    fleet = Fleet(make_spec([16, 16]))
    fleet.allocate(Request("x", 8, "H800"))
    for i in range(3):
        fleet.allocate(Request(f"y{i}", 8, "H800"))
    free = [len(x) for x in fleet.clusters[0].su_free]
    assert sorted(free) == [12, 16]
    p = fleet.allocate(Request("s", 64, "H800"))
    assert isinstance(p, Placement)
    su = p.shares[0].su
    assert free[su] == 12
    for i in range(2):
        q = fleet.allocate(Request(f"t{i}", 64, "H800"))
        assert isinstance(q, Placement) and q.su_count == 1


def test_lease_end_alignment_breaks_ties_between_equal_sus() -> None:
    fleet = Fleet(make_spec([16, 16]))
    fleet.occupy("a", {f"c0-s1-n{i}": range(8) for i in range(8)}, ends_at=100)
    fleet.occupy("b", {f"c0-s2-n{i}": range(8) for i in range(8)}, ends_at=1000)
    p = fleet.allocate(Request("c", 64, "H800", now=0, ends_at=990))
    assert isinstance(p, Placement)
    assert p.shares[0].su == 1  # ends with "b": the whole SU frees up at once


def test_cannot_place_now_explains_reason_earliest_time_and_alternatives() -> None:
    fleet = Fleet(make_spec([16, 16], clusters=2, regions=2))
    fleet.allocate(Request("a", 256, "H800", region="r0", now=0, ends_at=500))
    req = Request("b", 128, "H800", region="r0", now=10, ends_at=600)
    assert isinstance(fleet.plan(req), Unplaceable)
    why = fleet.explain(req)
    assert why is not None and why.code == "no_capacity"
    assert "16 free H800 nodes" in why.reason
    assert why.earliest == 500
    assert any(a.kind == "region" and a.region == "r1" for a in why.alternatives)


def test_invalid_sizes_and_unknown_models_are_refused_with_a_reason() -> None:
    fleet = Fleet(make_spec([16]))
    assert fleet.plan(Request("a", 3, "H800")).code == "invalid_size"
    assert fleet.plan(Request("b", 96, "H800")).code == "invalid_size"
    assert fleet.plan(Request("c", 8, "B200")).code == "no_cluster"
    assert fleet.plan(Request("d", 256, "H800")).code == "too_large"


def test_drained_nodes_are_not_allocated() -> None:
    fleet = Fleet(make_spec([2]))
    fleet.set_schedulable("c0-s1-n0", False)
    p = fleet.allocate(Request("a", 8, "H800"))
    assert isinstance(p, Placement) and p.shares[0].hostname == "c0-s1-n1"
    assert isinstance(fleet.plan(Request("b", 1, "H800")), Unplaceable)
    fleet.set_schedulable("c0-s1-n0", True)
    assert isinstance(fleet.plan(Request("b", 1, "H800")), Placement)


SIZES = st.sampled_from([1, 2, 4, 8, 64, 128, 192, 256, 512])
OPS = st.lists(st.tuples(st.booleans(), SIZES, st.integers(0, 10_000)), max_size=60)


def _replay(ops: list[tuple[bool, int, int]]) -> list[tuple]:
    fleet = Fleet(make_spec([20, 20, 20, 16], clusters=2))
    taken: dict[tuple[str, int], str] = {}
    live: list[str] = []
    log: list[tuple] = []
    for i, (release, size, seed) in enumerate(ops):
        if release and live:
            lid = live.pop(seed % len(live))
            before = fleet.free_gpus()
            p = fleet.release(lid)
            # release returns exactly what was taken
            assert fleet.free_gpus() == before + p.gpus
            for key in p.gpu_keys():
                assert taken.pop(key) == lid
            log.append(("release", lid))
            continue
        req = Request(str(i), size, "H800", now=i, ends_at=i + seed)
        free_by_cluster = {c.code: [len(x) for x in c.su_free] for c in fleet.clusters}
        got = fleet.allocate(req)
        if isinstance(got, Unplaceable):
            log.append(("no", got.code))
            continue
        live.append(got.request_id)
        assert sum(len(s.gpus) for s in got.shares) == size
        for key in got.gpu_keys():
            assert key not in taken, f"GPU {key} in two placements"
            taken[key] = got.request_id
        if got.is_slice:
            nodes = size // 8
            best = min(k for f in free_by_cluster.values() if (k := min_sus(f, nodes)))
            assert got.su_count == best == got.su_min_state
            assert got.su_count >= math.ceil(nodes / 20)
        log.append(("yes", got.cluster, tuple((s.hostname, s.gpus) for s in got.shares)))
    assert fleet.free_gpus() == 2 * 76 * 8 - sum(1 for _ in taken)
    return log


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_random_operations_keep_every_invariant(ops: list[tuple[bool, int, int]]) -> None:
    _replay(ops)


@settings(max_examples=25, deadline=None)
@given(OPS)
def test_allocation_is_deterministic(ops: list[tuple[bool, int, int]]) -> None:
    assert _replay(ops) == _replay(ops)
