"""Property tests of the allocator state: random allocate/occupy/release/drain sequences keep every
index consistent, never book a GPU twice, and the earliest start is exact."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from slices.topology import Fleet, Placement, Request, Unplaceable, buddy_tables, min_sus
from tests.slices.test_topology import cluster_spec, fleet_spec

SIZES = st.sampled_from([1, 2, 4, 8, 64, 128])
REGIONS = st.sampled_from([None, "r0", "r1"])
ENDS = st.one_of(st.none(), st.integers(1, 50))
OP = st.one_of(
    st.tuples(st.just("allocate"), SIZES, REGIONS, ENDS),
    st.tuples(st.just("occupy"), st.integers(0, 10**6), st.integers(1, 255), ENDS),
    st.tuples(st.just("release"), st.integers(0, 10**6), st.none(), st.none()),
    st.tuples(st.just("drain"), st.integers(0, 10**6), st.booleans(), st.none()),
)
OPS = st.lists(OP, max_size=60)
# mostly hosts with known ends, so that nodes are shared by several ending leases
HOST = st.tuples(st.just("allocate"), st.sampled_from([1, 2, 4, 8]), REGIONS, st.integers(1, 50))
BUSY_OPS = st.lists(st.one_of(HOST, HOST, HOST, OP), min_size=10, max_size=80)


def _fleet() -> Fleet:
    return Fleet(
        fleet_spec(
            cluster_spec("a", [6, 6, 4]),
            cluster_spec("b", [4, 4, 2], region="r1"),
            cluster_spec("e", [3], model="RTX4090", fabric="ethernet"),
        )
    )


def _apply(fleet: Fleet, i: int, op: tuple) -> None:
    kind, a, b, ends = op
    if kind == "allocate":
        fleet.allocate(Request(f"r{i}", a, "H800", b, now=0, ends_at=ends))
    elif kind == "occupy":  # an allocation loaded from the database: any free GPUs of one node
        gid = a % len(fleet.hostnames)
        take = fleet.free_mask(gid) & b
        if take and fleet.node_ok[gid]:
            gpus = [g for g in range(8) if take >> g & 1]
            fleet.occupy(f"o{i}", {fleet.hostnames[gid]: gpus}, ends_at=ends)
    elif kind == "release" and fleet.leases:
        fleet.release(sorted(fleet.leases)[a % len(fleet.leases)])
    elif kind == "drain":
        fleet.set_schedulable(fleet.hostnames[a % len(fleet.hostnames)], b)


def _check(fleet: Fleet) -> None:
    leased = 0
    for gid, host in enumerate(fleet.hostnames):
        cl = fleet.cluster_of(gid)
        taken = 0
        for lid in fleet.node_leases[gid]:
            m = fleet.leases[lid].masks[gid]
            assert taken & m == 0, f"a GPU of {host} is in two leases"
            taken |= m
        assert taken & fleet.free_mask(gid) == 0, f"a leased GPU of {host} is free"
        assert taken | fleet.free_mask(gid) == cl.full_mask, f"a GPU of {host} went missing"
        leased += bin(taken).count("1")
    for lid, lease in fleet.leases.items():
        assert all(lid in fleet.node_leases[gid] for gid in lease.masks)
        assert sum(bin(m).count("1") for m in lease.masks.values()) == lease.placement.gpus
    total = sum(c.spec.gpu_count for c in fleet.clusters)
    assert fleet.free_gpus() + fleet.out_of_service_gpus() + leased == total
    for cl in fleet.clusters:
        for su, nodes in enumerate(cl.su_nodes):
            whole = [g for g in nodes if fleet.node_ok[g] and fleet.free_mask(g) == cl.full_mask]
            assert cl.su_free[su] == whole
            for lid in cl.su_ends[su]:
                assert any(s.su == su for s in fleet.leases[lid].placement.shares)
        assert cl.free_nodes == sum(cl.su_free_counts())


def _check_partial_index(fleet: Fleet) -> None:
    t = buddy_tables(8)
    for region, model in {(c.region, c.model) for c in fleet.clusters}:
        for lfb in (1, 2, 4):
            expected = min(
                (
                    (t.pop[fleet.free_mask(g)], g)
                    for c in fleet.candidates(model, region)
                    for g in c.gids
                    if fleet.node_ok[g]
                    and 0 < fleet.free_mask(g) < t.full
                    and t.lfb[fleet.free_mask(g)] == lfb
                ),
                default=None,
            )
            assert fleet.best_partial_node(region, model, lfb) == expected


@settings(max_examples=80, deadline=None)
@given(OPS)
def test_indexes_stay_consistent_and_no_gpu_is_booked_twice(ops: list[tuple]) -> None:
    fleet = _fleet()
    for i, op in enumerate(ops):
        _apply(fleet, i, op)
        _check(fleet)
    _check_partial_index(fleet)
    for lid in list(fleet.leases):
        fleet.release(lid)
    for gid in range(len(fleet.hostnames)):
        fleet.set_schedulable(fleet.hostnames[gid], True)
    _check(fleet)
    assert fleet.free_gpus() == (16 + 10) * 8 + 3 * 8
    assert all(not ends for c in fleet.clusters for ends in c.su_ends)


@settings(max_examples=60, deadline=None)
@given(OPS, SIZES, REGIONS)
def test_planning_changes_nothing(ops: list[tuple], size: int, region: str | None) -> None:
    fleet = _fleet()
    for i, op in enumerate(ops):
        _apply(fleet, i, op)
    before = (
        list(fleet.node_mask),
        [c.su_free_counts() for c in fleet.clusters],
        set(fleet.leases),
    )
    fleet.plan(Request("p", size, "H800", region))
    fleet.explain(Request("q", size, "H800", region))
    assert before == (
        list(fleet.node_mask),
        [c.su_free_counts() for c in fleet.clusters],
        set(fleet.leases),
    )


def _fits_structurally(fleet: Fleet, req: Request) -> bool:
    nodes = req.gpus // 8
    return any(
        0 < min_sus(c.su_free_counts(), nodes) <= math.ceil(nodes / c.su_cap_max)
        for c in fleet.candidates(req.gpu_model, req.region)
        if c.slices_ok
    )


@settings(max_examples=150, deadline=None)
@given(BUSY_OPS, st.sampled_from([1, 2, 4, 8, 64, 64, 128]), REGIONS, st.booleans())
def test_the_earliest_start_is_the_first_lease_end_after_which_the_request_fits(
    ops: list[tuple], size: int, region: str | None, structural: bool
) -> None:
    fleet = _fleet()
    for i, op in enumerate(ops):
        _apply(fleet, i, op)
    req = Request("x", size, "H800", region)
    structural = structural and req.is_slice

    def fits() -> bool:
        if structural:
            return _fits_structurally(fleet, req)
        return isinstance(fleet.plan(req), Placement)

    if fits():
        return
    t = fleet.earliest_start(req, structural=structural)
    ends = sorted(
        (lease.placement.ends_at, lid)
        for lid, lease in fleet.leases.items()
        if lease.placement.ends_at is not None
    )
    for end, lid in ends:
        if t is not None and end >= t:
            break
        fleet.release(lid)
        assert not fits(), f"fits after {end}, before the earliest start {t}"
    if t is None:
        assert isinstance(fleet.plan(req), Unplaceable) or structural
        return
    for end, lid in ends:
        if end == t:
            fleet.release(lid)
    assert fits(), f"does not fit at the earliest start {t}"
