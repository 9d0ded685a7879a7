"""Buddy tables for the GPUs of one node: per free-GPU mask, precomputed answers.

A host of k GPUs takes an aligned block of k GPUs (k = 2 is a GPU pair sharing a PCIe switch and HCA,
k = 4 a NUMA half). Among the free aligned blocks of the size, the one whose largest free aligned
container is the smallest is taken (then the lowest), so the node's biggest free block stays whole
whenever another block of the size exists outside it (the buddy scheme).
"""

from __future__ import annotations

from collections.abc import Sequence

from slices.topology.specs import HOST_SIZES


def popcount(x: int) -> int:
    return bin(x).count("1")


def gpu_indexes(mask: int) -> tuple[int, ...]:
    """The GPU indexes set in `mask`, ascending."""
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def gpu_mask(indexes: Sequence[int]) -> int:
    """The mask of GPU indexes (the inverse of `gpu_indexes`)."""
    m = 0
    for g in indexes:
        m |= 1 << g
    return m


def _is_free(mask: int, start: int, size: int) -> bool:
    block = (1 << size) - 1
    return (mask >> start) & block == block


def free_blocks(mask: int, g: int, size: int) -> list[int]:
    """Start indexes of the free aligned blocks of `size` GPUs in a node of `g` GPUs."""
    return [st for st in range(0, g, size) if _is_free(mask, st, size)]


def _container(mask: int, start: int, size: int, sizes: Sequence[int]) -> int:
    """Size of the largest free aligned block that holds the block at `start` (`size` itself when
    its buddy is taken): taking this block breaks that one."""
    container = size
    for big in sizes:
        if big > size:
            if not _is_free(mask, (start // big) * big, big):
                break  # a bigger aligned block around it is not free either
            container = big
    return container


class BuddyTables:
    """Precomputed per free-mask answers for a node of `g` GPUs (g a power of two)."""

    def __init__(self, g: int) -> None:
        self.g = g
        self.full = (1 << g) - 1
        self.sizes = [s for s in HOST_SIZES if s <= g]
        self.pop = [popcount(m) for m in range(1 << g)]
        # largest free aligned block per mask
        self.lfb = [
            max((s for s in self.sizes if free_blocks(m, g, s)), default=0) for m in range(1 << g)
        ]
        # best[mask][size] = bitmask of the block to take; sizes that do not fit are absent
        self.best: list[dict[int, int]] = [self._best_blocks(m) for m in range(1 << g)]

    def _best_blocks(self, mask: int) -> dict[int, int]:
        out = {}
        for s in self.sizes:
            starts = free_blocks(mask, self.g, s)
            if starts:
                _, st = min((_container(mask, st, s, self.sizes), st) for st in starts)
                out[s] = ((1 << s) - 1) << st
        return out


_TABLES: dict[int, BuddyTables] = {}


def buddy_tables(g: int) -> BuddyTables:
    """The (shared, cached) tables for nodes of `g` GPUs: 1, 2, 4 or 8."""
    if g not in _TABLES:
        if g < 1 or g > 8 or g & (g - 1):
            raise ValueError(f"GPUs per node must be 1, 2, 4 or 8, not {g}")
        _TABLES[g] = BuddyTables(g)
    return _TABLES[g]


def aligned_block(free_mask: int, g: int, size: int) -> int | None:
    """The GPUs (a mask) a host of `size` GPUs takes on a node of `g` GPUs whose free GPUs are
    `free_mask`: the buddy rule's block, or None when no aligned block of the size is free.

    Every claim of a host's GPUs goes through this one table (an order, a start on the same host,
    a migration's replacement), so a host's GPUs always share their PCIe switch / NUMA half and a
    claim never breaks a bigger free block when a smaller one fits.
    """
    return buddy_tables(g).best[free_mask].get(size)
