"""Fragmentation metrics the allocator benchmark samples, read from a `topology.Fleet`."""

from __future__ import annotations

from collections.abc import Sequence

from slices.topology import SLICE_UNIT_GPUS, Fleet, buddy_tables, structural_packing
from slices.topology.buddy import free_blocks


def stranded_gpus(
    fleet: Fleet, model: str, slice_nodes: int | None, host_sizes: Sequence[int]
) -> int:
    """Free GPUs of `model` no demanded request size can use at its structural minimum: slices of
    `slice_nodes` nodes (None: no slice demand) and hosts of `host_sizes` GPUs."""
    stranded = 0
    min_host = min(host_sizes) if host_sizes else None
    for cl in fleet.by_model.get(model, ()):
        t = buddy_tables(cl.gpn)
        for su, nodes in enumerate(cl.su_nodes):
            whole = len(cl.su_free[su])
            usable_whole = min_host is not None or (
                slice_nodes is not None
                and cl.slices_ok
                and whole >= min(slice_nodes, cl.su_cap_max)
            )
            if not usable_whole:
                stranded += whole * cl.gpn
            for gid in nodes:
                m = fleet.free_mask(gid)
                if not fleet.node_ok[gid] or m == t.full or m == 0:
                    continue
                if min_host is None or t.lfb[m] < min_host:
                    stranded += t.pop[m]
    return stranded


def placeable_gpus(fleet: Fleet, model: str, gpus: int) -> int:
    """GPUs that requests of one size could still get, each at its structural SU minimum."""
    total = 0
    for cl in fleet.by_model.get(model, ()):
        if gpus < SLICE_UNIT_GPUS:
            if gpus <= cl.gpn:
                total += sum(
                    gpus * len(free_blocks(fleet.free_mask(gid), cl.gpn, gpus))
                    for gid in cl.gids
                    if fleet.node_ok[gid]
                )
        elif cl.slices_ok:
            nodes = gpus // cl.gpn
            total += structural_packing(cl.su_free_counts(), nodes, cl.su_cap_max) * cl.gpn
    return total
