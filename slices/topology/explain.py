"""Why a request cannot be placed now: the earliest time it could be (from known lease ends) and
what else would fit now (another region, another GPU model, a smaller size)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from slices.topology.buddy import buddy_tables
from slices.topology.cluster import ClusterState, Lease
from slices.topology.placement import Alternative, Placement, Request, Unplaceable
from slices.topology.specs import HOST_SIZES, SLICE_UNIT_GPUS

if TYPE_CHECKING:  # the fleet imports this module at run time
    from slices.topology.fleet import Fleet
    from slices.topology.policy import SlicePolicy


def explain(fleet: Fleet, req: Request, policy: SlicePolicy | None = None) -> Unplaceable | None:
    """Why `req` cannot be placed now, when it could be (from lease ends) and what else fits."""
    got = fleet.plan(req, policy)
    if isinstance(got, Placement):
        return None
    if got.code == "invalid_size":
        return got
    return Unplaceable(
        req.id,
        got.code,
        got.reason,
        earliest=earliest_start(fleet, req) if got.code == "no_capacity" else None,
        alternatives=alternatives(fleet, req),
    )


def _ending_leases(fleet: Fleet, clusters: list[ClusterState]) -> list[tuple[float, Lease]]:
    """Leases on `clusters` with a known end, soonest first (ties by lease id)."""
    codes = {c.code for c in clusters}
    ends = sorted(
        (lease.placement.ends_at, lid)
        for lid, lease in fleet.leases.items()
        if lease.placement.cluster in codes and lease.placement.ends_at is not None
    )
    return [(t, fleet.leases[lid]) for t, lid in ends]


def earliest_start(fleet: Fleet, req: Request, structural: bool = False) -> float | None:
    """First known lease end after which `req` fits (at its structural SU minimum if asked).
    Leases without a known end are assumed to stay; None when no known end frees enough."""
    clusters = fleet.candidates(req.gpu_model, req.region)
    if req.is_slice:
        clusters = [c for c in clusters if c.slices_ok]
    ends = _ending_leases(fleet, clusters)
    # masks as they will be once the leases so far have ended
    masks: dict[int, int] = {}
    free = {c.code: c.su_free_counts() for c in clusters}
    for t, lease in ends:
        for gid, m in lease.masks.items():
            cl = fleet.cluster_of(gid)
            before = masks.get(gid, fleet.node_mask[gid])
            masks[gid] = after = before | m
            if not fleet.node_ok[gid]:
                continue
            if not req.is_slice:
                if buddy_tables(cl.gpn).lfb[after] >= req.gpus:
                    return t
            elif after == cl.full_mask and before != cl.full_mask:
                free[cl.code][fleet.node_su[gid]] += 1
        if req.is_slice and _slice_fits(fleet, lease, free, req.gpus // 8, structural):
            return t
    return None


def _slice_fits(
    fleet: Fleet, lease: Lease, free: dict[str, list[int]], nodes: int, structural: bool
) -> bool:
    """Whether the cluster of the lease just ended holds `nodes` free nodes together now."""
    cl = fleet.cluster_by_code[lease.placement.cluster]
    counts = sorted(free[cl.code], reverse=True)
    need = math.ceil(nodes / cl.su_cap_max) if structural else len(counts)
    return sum(counts[:need]) >= nodes


def alternatives(fleet: Fleet, req: Request, limit: int = 6) -> tuple[Alternative, ...]:
    """What fits now instead: the same request in another region, on another GPU model, or the
    largest smaller size (at most `limit`, in that order)."""
    out: list[Alternative] = []

    def fits(gpus: int, model: str, region: str | None) -> Placement | None:
        r = Request(req.id, gpus, model, region, req.now, req.ends_at)
        if fleet.validate(r) is not None:
            return None
        got = fleet.plan(r)
        return got if isinstance(got, Placement) else None

    if req.region is not None:
        for region in sorted({c.region for c in fleet.by_model.get(req.gpu_model, ())}):
            if region != req.region and (p := fits(req.gpus, req.gpu_model, region)):
                out.append(Alternative("region", region, req.gpu_model, req.gpus, p.cluster))
    for model in sorted(fleet.by_model):
        if model != req.gpu_model and (p := fits(req.gpus, model, req.region)):
            out.append(Alternative("gpu_model", p.region, model, req.gpus, p.cluster))
    smaller = (
        range(req.gpus - SLICE_UNIT_GPUS, 0, -SLICE_UNIT_GPUS)
        if req.is_slice
        else [s for s in reversed(HOST_SIZES) if s < req.gpus]
    )
    for size in smaller:
        if p := fits(size, req.gpu_model, req.region):
            out.append(Alternative("size", p.region, req.gpu_model, size, p.cluster))
            break
    return tuple(out[:limit])
