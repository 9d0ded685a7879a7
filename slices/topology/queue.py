"""The allocator's queue discipline (pure): FIFO with EASY backfill over one queue of waiting
requests, as production's queue admission (`slices.services.queue`) and the benchmarks
(`bench/allocator.py`, `bench/queue.py`) run it: one implementation for all three.

A queue holds the requests of one GPU model (and region, when the order named one), oldest first.
At every capacity change the head starts if the allocator can place it now; if it cannot, it
reserves the earliest time the known lease ends let it start (its *shadow*) and a later request
may start now only when it fits now and its known run limit ends before that shadow, so it never
delays the head (EASY backfill). A request whose limit is unknown never backfills: it could hold
the GPUs the head is waiting for past the shadow. A request past its deadline (the customer's
maximum wait) leaves. Placement is the allocator's own (`Fleet.plan`): the placement rules are
the same for a queued order as for one that starts at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slices.topology.fleet import Fleet
from slices.topology.placement import Placement, Request

# Bound of one pass's backfill scan: the rest keep their place (a pass stays cheap).
SCAN_LIMIT = 200


@dataclass(frozen=True)
class Waiting:
    """A queued request: what it needs, since when it waits, how long it runs at most (None:
    unknown, so it never backfills), and until when it waits (None: for ever)."""

    id: str
    gpus: int
    gpu_model: str
    region: str | None = None
    since: float = 0.0
    limit: float | None = None
    deadline: float | None = None

    def request(self, now: float) -> Request:
        ends = now + self.limit if self.limit is not None else None
        return Request(self.id, self.gpus, self.gpu_model, self.region, now, ends)


@dataclass
class Pass:
    """What one scheduling pass decided: started (with their placements, in start order),
    expired (past their deadline), the queue as it is now, and the head's shadow."""

    started: list[tuple[Waiting, Placement]] = field(default_factory=list)
    expired: list[Waiting] = field(default_factory=list)
    kept: list[Waiting] = field(default_factory=list)
    shadow: float | None = None


# start(fleet, waiting, now) -> the placement it took, or None (it does not fit, or the caller's
# own rule refused it); the default plans with the allocator's policy and commits on `fleet`.
Starter = Callable[[Fleet, Waiting, float], Placement | None]


def plan_and_commit(fleet: Fleet, w: Waiting, now: float) -> Placement | None:
    got = fleet.plan(w.request(now))
    if isinstance(got, Placement):
        fleet.commit(got)
        return got
    return None


def queue_key(gpu_model: str, region: str | None) -> tuple[str, str]:
    """The queue a request waits in: its GPU model and region ("" = any region)."""
    return gpu_model, region or ""


def schedule(
    fleet: Fleet,
    queue: Sequence[Waiting],
    now: float,
    *,
    start: Starter = plan_and_commit,
    strict: bool = False,
    scan_limit: int = SCAN_LIMIT,
    blind_backfill: bool = False,
) -> Pass:
    """One FIFO + EASY backfill pass over ``queue`` (oldest first) at time ``now``: each request
    that may start is handed to ``start``, which takes its GPUs on ``fleet`` (so the next request
    sees them taken). ``strict``: the head's shadow counts only starts on ⌈n / SU size⌉ SUs.
    When no known lease end lets the head start (its shadow is unknown), nothing backfills: a
    request that runs on could hold what the head waits for. ``blind_backfill``: backfill then
    anyway (the allocator benchmark's discipline, where every lease's end is known)."""
    out = Pass()
    scanned = 0
    for w in queue:
        if w.deadline is not None and now > w.deadline:
            out.expired.append(w)
            continue
        scanned += 1
        if scanned > scan_limit:
            out.kept.append(w)
            continue
        if out.shadow is None:
            got = start(fleet, w, now)
            if got is not None:
                out.started.append((w, got))
                continue
            req = Request(w.id, w.gpus, w.gpu_model, w.region, now)
            out.shadow = fleet.earliest_start(req, structural=strict) or math.inf
            out.kept.append(w)
            continue
        if (
            w.limit is not None
            and now + w.limit <= out.shadow
            and (blind_backfill or not math.isinf(out.shadow))
        ):
            got = start(fleet, w, now)
            if got is not None:
                out.started.append((w, got))
                continue
        out.kept.append(w)
    return out
