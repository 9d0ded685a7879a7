"""Booked windows as the allocator's future occupants (issue 32): read here, held in every plan.

The one function ``booked_windows`` turns the reservations that still wait for their start into
``slices.topology.windows.Window`` values; ``slices.services.allocation`` holds the ones that
overlap an order's lifetime before it plans (`topology.windows.hold`), so an on-demand order
never sits on GPUs a window needs. Reads only; every write of a reservation is in
``slices.services.reservations``.
"""

from __future__ import annotations

from datetime import datetime

from slices.choices import RESERVATION_HOLDING
from slices.models import Reservation
from slices.services.fleet import _ts
from slices.topology.windows import RELEASE_MARGIN_SECONDS, Window


def as_window(row: Reservation) -> Window:
    return Window(
        str(row.public_id),
        row.gpu_model.code,
        row.region.code,
        row.cards,
        # Held from its provisioning time (less the margin a lease's release takes) on.
        row.starts_at.timestamp() - row.provision_lead_seconds - RELEASE_MARGIN_SECONDS,
        row.ends_at.timestamp(),
        tuple((str(h), tuple(int(i) for i in idxs)) for h, idxs in row.pins or ()),
    )


def booked_windows(
    gpu_model: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    *,
    exclude: str | None = None,
) -> list[Window]:
    """Windows not started yet (booked or delayed) of ``gpu_model`` that overlap [start, end)
    (end None: open-ended); ``exclude``: a window's public id (its own start plans without it)."""
    rows = Reservation.objects.filter(state__in=RESERVATION_HOLDING).select_related(
        "gpu_model", "region"
    )
    if gpu_model:
        rows = rows.filter(gpu_model__code=gpu_model)
    if start is not None:
        rows = rows.filter(ends_at__gt=start)
    if exclude:
        rows = rows.exclude(public_id=exclude)
    s, e = _ts(start) or 0.0, _ts(end)
    return [w for w in map(as_window, rows) if w.overlaps(s, e)]
