"""Buddy tables: per free-GPU mask of one node, the largest free aligned block and the block a
host of each size takes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slices.topology import buddy_tables, gpu_indexes, gpu_mask
from slices.topology.buddy import free_blocks

NODE_SIZES = (1, 2, 4, 8)


def _aligned_free(mask: int, start: int, size: int) -> bool:
    return start % size == 0 and all(mask >> i & 1 for i in range(start, start + size))


@pytest.mark.parametrize("g", NODE_SIZES)
def test_every_mask_has_its_free_count_largest_block_and_a_free_aligned_block_per_size(
    g: int,
) -> None:
    t = buddy_tables(g)
    assert t.full == (1 << g) - 1
    for mask in range(1 << g):
        assert t.pop[mask] == len(gpu_indexes(mask))
        fitting = [
            s for s in NODE_SIZES if s <= g and any(_aligned_free(mask, i, s) for i in range(g))
        ]
        assert t.lfb[mask] == max(fitting, default=0)
        assert set(t.best[mask]) == set(fitting)
        for size, block in t.best[mask].items():
            taken = gpu_indexes(block)
            assert len(taken) == size
            assert _aligned_free(mask, taken[0], size)


@pytest.mark.parametrize("g", NODE_SIZES)
def test_the_chosen_block_keeps_the_largest_free_block_any_choice_could_keep(g: int) -> None:
    t = buddy_tables(g)
    for mask in range(1 << g):
        for size, block in t.best[mask].items():
            options = [mask & ~(((1 << size) - 1) << s) for s in free_blocks(mask, g, size)]
            assert t.lfb[mask & ~block] == max(t.lfb[m] for m in options), (bin(mask), size)


def test_a_whole_node_gives_its_lowest_block_of_each_size() -> None:
    t = buddy_tables(8)
    assert [gpu_indexes(t.best[t.full][s]) for s in (1, 2, 4, 8)] == [
        (0,),
        (0, 1),
        (0, 1, 2, 3),
        tuple(range(8)),
    ]


def test_a_single_gpu_comes_from_a_broken_pair_before_a_whole_numa_half() -> None:
    t = buddy_tables(8)
    # GPUs 0-3 (a whole NUMA half) and 6-7 free: take GPU 6, keep the half for a 4-GPU host
    assert gpu_indexes(t.best[0b11001111][1]) == (6,)
    # GPUs 1, 4-7 free: GPU 1 has a taken buddy
    assert gpu_indexes(t.best[0b11110010][1]) == (1,)
    # GPUs 0-1 and 4-7 free: the pair 0-1, not a pair out of the whole half
    assert gpu_indexes(t.best[0b11110011][2]) == (0, 1)
    assert t.lfb[0b01010101] == 1 and t.lfb[0b00111100] == 2 and t.lfb[0] == 0


def test_free_blocks_lists_aligned_starts_only() -> None:
    assert free_blocks(0b00111100, 8, 2) == [2, 4]
    assert free_blocks(0b00111100, 8, 4) == []
    assert free_blocks(0b11110000, 8, 4) == [4]


@pytest.mark.parametrize("g", [0, 3, 6, 16])
def test_node_sizes_other_than_powers_of_two_up_to_8_are_refused(g: int) -> None:
    with pytest.raises(ValueError, match="1, 2, 4 or 8"):
        buddy_tables(g)


def test_tables_are_built_once_per_node_size() -> None:
    assert buddy_tables(8) is buddy_tables(8)


@given(st.sets(st.integers(0, 7)))
def test_gpu_mask_and_gpu_indexes_are_inverse(indexes: set[int]) -> None:
    assert gpu_indexes(gpu_mask(sorted(indexes))) == tuple(sorted(indexes))
