"""Capacity tables: the demand-weighted slice capacity that free whole nodes offer.

The slice policy compares placements by how much of this capacity they destroy. Everything here is
a function of free-node counts, so it is computed once per cluster (tables) or memoised by the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from slices.topology.specs import SLICE_UNIT_GPUS


def _slice_weights(demand: Mapping[int, float]) -> float:
    return sum(w for s, w in demand.items() if s >= SLICE_UNIT_GPUS) or 1.0


def slice_chunk(nodes: int, su_capacity: int) -> int:
    """Nodes a slice of `nodes` needs from each SU of a balanced, structurally minimal placement."""
    if nodes <= su_capacity:
        return nodes
    q = math.ceil(nodes / su_capacity)
    return math.ceil(nodes / q)


def value_table(
    demand: Mapping[int, float], su_capacity: int, gpn: int = 8, *, per_slice: bool = False
) -> list[float]:
    """V[f]: demand-weighted slice capacity (in nodes) that `f` free whole nodes of an SU offer.

    A 4-node remainder is worth nothing to a 64-card slice (8 nodes); host demand is linear in free
    nodes, equal for every placement of the same size, so it cancels and is left out.
    `per_slice`: count the slices (chunks) the nodes can take instead of their nodes, so a size
    weighs by its share of the requests alone (what the fleet uses: see `Fleet.set_demand`).
    """
    total = _slice_weights(demand)
    table = [0.0] * (su_capacity + 1)
    for size, weight in demand.items():
        if size < SLICE_UNIT_GPUS:
            continue
        u = slice_chunk(size // gpn, su_capacity)
        unit = 1 if per_slice else u
        for f in range(su_capacity + 1):
            table[f] += weight / total * unit * (f // u)
    return table


def spanning_value_table(
    demand: Mapping[int, float],
    su_capacity: int,
    cluster_nodes: int,
    gpn: int = 8,
    *,
    per_slice: bool = False,
) -> list[float]:
    """C[F]: demand-weighted capacity (nodes) that F free nodes of a cluster offer to slices larger
    than an SU (those may span SUs, so only the cluster's free total bounds them). `per_slice`:
    the slices, not their nodes (as `value_table`)."""
    total = _slice_weights(demand)
    table = [0.0] * (cluster_nodes + 1)
    for size, weight in demand.items():
        nodes = size // gpn
        if size < SLICE_UNIT_GPUS or nodes <= su_capacity:
            continue
        unit = 1 if per_slice else nodes
        for f in range(cluster_nodes + 1):
            table[f] += weight / total * unit * (f // nodes)
    return table


def min_sus(free: Sequence[int], nodes: int) -> int:
    """Fewest SUs with `free` whole nodes that can hold `nodes` (0 = cannot): the k largest."""
    acc = 0
    for k, f in enumerate(sorted(free, reverse=True), start=1):
        acc += f
        if acc >= nodes:
            return k
    return 0


def structural_packing(free: Sequence[int], nodes: int, su_capacity: int) -> int:
    """Nodes that slices of `nodes` can take from SUs with `free` nodes, each slice on
    ceil(nodes / su_capacity) SUs (greedy: largest SUs first)."""
    q = math.ceil(nodes / su_capacity)
    counts = sorted(free, reverse=True)
    placed = 0
    while True:
        counts.sort(reverse=True)
        if sum(counts[:q]) < nodes:
            return placed
        need = nodes
        for i in range(q):
            take = min(counts[i], need)
            counts[i] -= take
            need -= take
            if need == 0:
                break
        placed += nodes


def leftover_split(
    fs: tuple[int, ...], r: int, V: Sequence[float]
) -> tuple[float, tuple[int, ...]]:
    """Split `r` free nodes to keep among SUs with free counts `fs` (each gives ≥ 1 node) so the
    kept value (V per SU) is largest; returns (loss, nodes kept per SU), loss inf when impossible."""
    n = len(fs)
    neg = float("-inf")
    # best[i][x] = max value keeping x nodes among the first i SUs
    best = [[neg] * (r + 1) for _ in range(n + 1)]
    choice = [[0] * (r + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for i, f in enumerate(fs):
        row, nxt, ch = best[i], best[i + 1], choice[i + 1]
        for x in range(r + 1):
            if row[x] == neg:
                continue
            for left in range(min(f - 1, r - x) + 1):
                v = row[x] + V[left]
                if v > nxt[x + left] + 1e-12:
                    nxt[x + left] = v
                    ch[x + left] = left
    if best[n][r] == neg:
        return float("inf"), tuple(0 for _ in fs)
    lefts = []
    x = r
    for i in range(n, 0, -1):
        left = choice[i][x]
        lefts.append(left)
        x -= left
    lefts.reverse()
    loss = sum(V[f] for f in fs) - best[n][r]
    return loss, tuple(lefts)
