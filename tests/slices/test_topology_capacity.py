"""Capacity tables: what free whole nodes are worth to the demanded slice sizes."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slices.topology import (
    leftover_split,
    min_sus,
    slice_chunk,
    spanning_value_table,
    structural_packing,
    value_table,
)


@pytest.mark.parametrize(
    ("nodes", "su", "chunk"),
    [
        (8, 20, 8),
        (20, 20, 20),
        (24, 20, 12),
        (32, 20, 16),
        (64, 20, 16),
        (64, 16, 16),
        (40, 16, 14),
    ],
)
def test_slice_chunk_is_the_per_su_share_of_a_balanced_minimal_placement(
    nodes: int, su: int, chunk: int
) -> None:
    assert slice_chunk(nodes, su) == chunk
    assert math.ceil(nodes / chunk) == math.ceil(nodes / su)  # still the structural minimum


def test_value_counts_whole_slices_only_and_ignores_host_sizes() -> None:
    v = value_table({64: 1.0}, 20)
    assert len(v) == 21
    assert [v[f] for f in (0, 7, 8, 15, 16, 20)] == [0, 0, 8, 8, 16, 16]
    assert value_table({1: 3.0, 8: 5.0, 64: 1.0}, 20) == v


def test_value_weighs_sizes_by_their_share_of_slice_demand() -> None:
    v = value_table({64: 1.0, 128: 1.0}, 20)
    assert v[8] == pytest.approx(4.0)  # only the 64-card slice fits
    assert v[16] == pytest.approx(16.0)  # two 64s or one 128
    assert v[12] == pytest.approx(4.0)
    # the order the value table gives: 12 free nodes are worth less than 16, so a 64-card slice
    # taken from the 12 destroys less (4 - 0) than one taken from the 16 (16 - 4)
    assert v[12] - v[4] < v[16] - v[8]


def test_value_of_a_slice_larger_than_an_su_counts_its_balanced_chunks() -> None:
    v = value_table({512: 1.0}, 20)  # 64 nodes: four chunks of 16
    assert v[15] == 0 and v[16] == 16 and v[20] == 16


def test_spanning_value_counts_slices_larger_than_an_su_over_the_cluster() -> None:
    c = spanning_value_table({64: 0.5, 256: 0.5}, 20, 64)
    assert len(c) == 65
    assert c[31] == 0  # 256 cards = 32 nodes
    assert c[32] == pytest.approx(16.0) and c[64] == pytest.approx(32.0)
    assert spanning_value_table({64: 1.0, 128: 1.0}, 20, 64) == [0.0] * 65


def test_no_slice_demand_still_gives_tables() -> None:
    assert value_table({}, 4) == [0.0] * 5
    assert value_table({8: 1.0}, 4) == [0.0] * 5


@pytest.mark.parametrize(
    ("free", "nodes", "k"),
    [
        ([20, 12, 16], 8, 1),
        ([20, 12, 16], 20, 1),
        ([20, 12, 16], 30, 2),
        ([20, 12, 16], 48, 3),
        ([20, 12, 16], 49, 0),
        ([], 1, 0),
        ([0, 0], 1, 0),
        ([3, 3, 3, 3], 10, 4),
    ],
)
def test_min_sus_is_the_count_of_largest_sus_that_hold_the_nodes(
    free: list[int], nodes: int, k: int
) -> None:
    assert min_sus(free, nodes) == k


def test_structural_packing_counts_slices_on_their_structural_minimum() -> None:
    assert structural_packing([20, 20, 16], 8, 20) == 48  # two per SU
    assert structural_packing([20, 20, 16], 16, 20) == 48  # one per SU
    assert structural_packing([20, 20, 16], 32, 20) == 32  # 20 + 12, then 8 + 16 < 32
    assert structural_packing([7, 7], 8, 20) == 0  # one SU each: 7 < 8
    assert structural_packing([20] * 12 + [16], 64, 20) == 256  # four 512s, 4 SUs each
    assert structural_packing([16] * 4, 40, 20) == 0  # 2 SUs of 16 hold 32 < 40; 3 SUs not minimal


def test_leftover_split_keeps_the_most_valuable_remainder() -> None:
    v = value_table({64: 1.0}, 20)
    # a 28-node slice from SUs with 20 and 16 free keeps 8 nodes: all in one SU, not 4 + 4
    loss, lefts = leftover_split((20, 16), 8, v)
    assert sum(lefts) == 8 and sorted(lefts) == [0, 8]
    assert loss == pytest.approx(v[20] + v[16] - 8)


def test_leftover_split_reports_an_impossible_split_as_infinite_loss() -> None:
    v = value_table({64: 1.0}, 20)
    loss, lefts = leftover_split((1, 1), 1, v)  # each SU must give at least one node
    assert loss == math.inf and lefts == (0, 0)


@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=3).flatmap(
        lambda fs: st.tuples(st.just(tuple(fs)), st.integers(0, sum(f - 1 for f in fs)))
    ),
    st.sampled_from([{64: 1.0}, {64: 1.0, 128: 1.0}, {64: 0.2, 192: 0.8}]),
)
def test_leftover_split_matches_brute_force(
    case: tuple[tuple[int, ...], int], demand: dict[int, float]
) -> None:
    fs, r = case
    v = value_table(demand, 9)
    loss, lefts = leftover_split(fs, r, v)
    best = max(
        sum(v[x] for x in split)
        for split in itertools.product(*(range(f) for f in fs))
        if sum(split) == r
    )
    assert loss == pytest.approx(sum(v[f] for f in fs) - best)
    assert sum(lefts) == r and all(0 <= x < f for x, f in zip(lefts, fs, strict=True))
    assert sum(v[f] - v[x] for f, x in zip(fs, lefts, strict=True)) == pytest.approx(loss)
