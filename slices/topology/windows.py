"""Booked windows (预约) as future occupants of the allocator's plan. Pure, no Django.

A booked window holds GPUs from its start to its end: at booking, the allocator chose them on the
fleet as it will be at the window's start (`pin`: leases known to end before then are gone, the
other windows of that time are held), and those GPUs (its *pins*) are the proof that the window
fits. Every later plan that would overlap the window holds its pins first (`hold`), so an
on-demand order that would sit on them goes elsewhere, or ends before the window, or waits.

The pins are not a promise of those very GPUs: at the start the window is placed by the same
allocator wherever it fits best; a failed pinned node is replaced by planning the pins again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slices.topology.buddy import buddy_tables, gpu_mask
from slices.topology.fleet import Fleet
from slices.topology.placement import Placement, Request, Unplaceable

WINDOW_LEASE_PREFIX = "window:"
# A lease known to end is counted gone this long after its end: the reconciler releases it on its
# next pass and the node is cleaned before another start can claim it. Windows are held from
# their provisioning time minus this margin, so an order offered "可用至" is gone by then.
RELEASE_MARGIN_SECONDS = 600.0
CALENDAR_EDGE_SECONDS = 3600.0


@dataclass(frozen=True)
class Window:
    """A booked window: ``gpus`` of ``gpu_model`` in ``region`` from ``starts_at`` to ``ends_at``
    (epoch seconds), held on ``pins`` ((hostname, GPU indexes), ...)."""

    id: str
    gpu_model: str
    region: str
    gpus: int
    starts_at: float
    ends_at: float
    pins: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def overlaps(self, start: float, end: float | None) -> bool:
        """Whether the window shares any second with [start, end) (end None: open-ended)."""
        return self.starts_at < (math.inf if end is None else end) and self.ends_at > start


def overlapping(windows: Iterable[Window], start: float, end: float | None) -> list[Window]:
    return [w for w in windows if w.overlaps(start, end)]


def hold(fleet: Fleet, windows: Iterable[Window], start: float, end: float | None) -> list[str]:
    """Take the pins of every window overlapping [start, end) on ``fleet`` (a plan's snapshot),
    as leases ending at the window's end; the lease ids, for `unhold`. GPUs already taken (a
    lease ending before the window) and nodes out of service are skipped: they hold nothing."""
    held = []
    for w in overlapping(windows, start, end):
        gpus: dict[str, tuple[int, ...]] = {}
        for hostname, idxs in w.pins:
            gid = fleet.gid_by_hostname.get(hostname)
            if gid is None or not fleet.node_ok[gid]:
                continue
            free = gpu_mask(idxs) & fleet.free_mask(gid)
            if free:
                gpus[hostname] = tuple(i for i in idxs if free >> i & 1)
        if gpus:
            lease = WINDOW_LEASE_PREFIX + w.id
            fleet.occupy(lease, gpus, w.ends_at)
            held.append(lease)
    return held


def unhold(fleet: Fleet, leases: Iterable[str]) -> None:
    for lease in leases:
        fleet.release(lease)


def free_before(fleet: Fleet, until: float) -> None:
    """Release on ``fleet`` every lease known to end by ``until`` (the fleet as it will be)."""
    for lid, lease in list(fleet.leases.items()):
        ends = lease.placement.ends_at
        if ends is not None and ends <= until and not lid.startswith(WINDOW_LEASE_PREFIX):
            fleet.release(lid)


def pin(
    fleet: Fleet,
    req: Request,
    windows: Sequence[Window],
    *,
    starts_at: float,
    ends_at: float,
    lead: float,
) -> Placement | Unplaceable:
    """Plan a window on the fleet as it will be at its start: leases ending ``lead`` seconds
    before the start are gone, the other windows overlapping it are held. Changes ``fleet``
    (pass a fresh snapshot)."""
    free_before(fleet, starts_at - lead - RELEASE_MARGIN_SECONDS)
    hold(fleet, windows, starts_at - lead - RELEASE_MARGIN_SECONDS, ends_at)
    return fleet.plan(req)


def conflicts(placement: Placement, windows: Iterable[Window]) -> list[Window]:
    """The windows whose pins share a GPU with ``placement``."""
    taken = {s.hostname: gpu_mask(s.gpus) for s in placement.shares}
    return [w for w in windows if any(taken.get(h, 0) & gpu_mask(idxs) for h, idxs in w.pins)]


@dataclass(frozen=True)
class DayCapacity:
    """What can be booked in one region and model on one day: free GPUs, the largest host and
    the largest slice that fit beside what is known (leases without an end, other windows)."""

    day: int  # days from the first day
    free_gpus: int
    largest_host: int
    largest_slice: int
    total_gpus: int


def calendar(
    fleet: Fleet,
    windows: Sequence[Window],
    *,
    gpu_model: str,
    region: str,
    first_day: float,
    days: int,
    lead: float,
) -> list[DayCapacity]:
    """Per day from ``first_day`` (epoch seconds of its midnight) for ``days`` days: what a
    window of the whole day could book. Leases end as known (``free_before``), other windows are
    held for the day and given back. Changes ``fleet`` (pass a fresh snapshot)."""
    clusters = fleet.candidates(gpu_model, region)
    total = sum(c.spec.node_count * c.gpn for c in clusters)
    out = []
    for d in range(days):
        start = first_day + d * 86400
        free_before(fleet, start - lead)
        # The day's core: a window touching it only within an hour at either edge (ending just
        # after midnight, prepared just before the next) leaves the day shown free.
        held = hold(
            fleet, windows, start + CALENDAR_EDGE_SECONDS, start + 86400 - CALENDAR_EDGE_SECONDS
        )
        free = host = slice_nodes = 0
        for cl in clusters:
            t = buddy_tables(cl.gpn)
            for gid in cl.gids:
                if fleet.node_ok[gid]:
                    m = fleet.node_mask[gid]
                    free += t.pop[m]
                    host = max(host, t.lfb[m])
            if cl.slices_ok:
                slice_nodes = max(slice_nodes, cl.free_nodes)
        out.append(DayCapacity(d, free, host, slice_nodes * 8 // 64 * 64, total))
        unhold(fleet, held)
    return out
