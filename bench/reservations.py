"""Replay booked windows (预约) amid an on-demand trace with node failures; print the share of
windows that started on time, against a baseline in the same run.

    .venv/bin/python bench/reservations.py [--seeds 3] [--hours 72] [--windows 24]

Production code throughout, on a throw-away test database: windows are booked with
``reservations.book_reservation`` (the locked price, paid through the ledger), on-demand orders
take GPUs through ``allocation.allocate`` (the one writer of GPU claims, which holds the windows
as future occupants), and every 5 simulated minutes ``reservations.run_reservations`` (what beat
runs every minute) sends notices, covers failed pinned nodes and starts due windows. An on-demand
order refused because windows need its GPUs later takes the offer "可用至 …" (it is released by
then) when that leaves it at least 30 minutes. Nodes fail at random and come back 4 h later.

A window starts **on time** when its GPUs were claimed early enough for the provisioning ETA
(``slices.eta``'s first estimate) to finish by its start. The **baseline** replays the same trace
with the allocator blind to windows (a calendar that only counted capacity at booking, as a
booking system beside a scheduler would): on-demand orders then sit on booked GPUs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

# The checkout on the path and the script's own folder off it (bench/queue.py would shadow
# the standard library's queue for everything imported after).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p).resolve() != _HERE)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

STEP = timedelta(minutes=5)
BENCH_FLEET = """\
version: 1
gpu_models:
  - {code: A800, memory_gib: 80, nvlink_gbps: 200}
demand:
  A800: {8: 4, 64: 2, 128: 1}
regions:
  - code: bench
    name: Bench
    name_zh: 基准
    clusters:
      - code: bench-a800
        gpu_model: A800
        fabric: ib-hdr
        gpus_per_node: 8
        scalable_units: [8, 8, 8, 8]
        hostname: "b-a8-su{su:02d}-n{node:02d}"
        address: "10.99.{su}.{node}"
"""


@dataclass
class Result:
    booked: int = 0
    refused_bookings: int = 0
    on_time: int = 0
    late: int = 0
    missed: int = 0
    on_demand: int = 0
    on_demand_until: int = 0  # placed with an end before a window (可用至)
    on_demand_refused: int = 0
    failures: int = 0
    lateness_s: list[float] = field(default_factory=list)
    book_ms: list[float] = field(default_factory=list)  # each booking's answer, priced and paid
    calendar_ms: float = 0.0  # the 90-day capacity calendar at the end of the trace

    @property
    def share(self) -> float:
        return self.on_time / self.booked if self.booked else 1.0


def _trace(
    seed: int, hours: int, windows: int, t0: datetime, gap: float
) -> list[tuple[datetime, str, Any]]:
    """(time, kind, params) events: bookings, on-demand arrivals, node failures."""
    rng = random.Random(seed)
    events: list[tuple[datetime, str, Any]] = []
    for _ in range(windows):
        booked_at = t0 + timedelta(minutes=rng.randrange(0, hours * 60 // 2, 5))
        start = (booked_at + timedelta(hours=rng.uniform(2, hours / 2))).replace(
            minute=0, second=0, microsecond=0
        ) + timedelta(hours=1)
        cards = rng.choice([8, 8, 8, 4, 64])
        events.append((booked_at, "book", (cards, start, rng.randint(2, 12))))
    t = t0
    while t < t0 + timedelta(hours=hours):
        t += timedelta(minutes=rng.expovariate(1 / gap))
        cards = rng.choice([1, 2, 4, 8, 8, 8, 64])
        duration = timedelta(hours=rng.expovariate(1 / 5) + 0.25)
        known_end = rng.random() < 0.5
        events.append((t, "order", (cards, duration, known_end)))
    for _ in range(max(1, hours // 12)):
        at = t0 + timedelta(minutes=rng.randrange(0, hours * 60, 5))
        events.append((at, "fail", rng.randrange(32)))
    events.sort(key=lambda e: (e[0], e[1]))
    return events


def replay(seed: int, hours: int, windows: int, honour: bool, gap: float = 8.0) -> Result:
    from django.db import transaction
    from django.utils import timezone

    from billing import services as billing
    from console.models import User
    from slices.choices import AllocationState, NodeHealth, NodeState, ReservationState
    from slices.models import Allocation, Node, Reservation
    from slices.services import allocation, reservations
    from slices.services.eta import first_estimate

    real_windows = allocation.booked_windows
    if not honour:  # the baseline: the allocator blind to booked windows
        allocation.booked_windows = lambda *a, **k: []  # type: ignore[assignment]
    result = Result()
    try:
        with transaction.atomic():
            user = User.objects.create_user(f"bench-{seed}-{honour}", f"b{seed}{honour}@x.test")
            billing.grant_voucher(user, Decimal("10000000"), reason="bench", valid_days=30)
            # On the hour: the same trace in both modes (and every run of a seed).
            t0 = (timezone.now() + timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
            events = _trace(seed, hours, windows, t0, gap)
            running: list[tuple[datetime, Allocation]] = []
            failed: list[tuple[datetime, int]] = []
            nodes = list(Node.objects.order_by("pk").values_list("pk", flat=True))
            model_id = Node.objects.values_list("gpu_model_id", flat=True).first()
            i, now = 0, t0
            end = t0 + timedelta(hours=hours * 2)
            while now <= end:
                for ends, alloc in [r for r in running if r[0] <= now]:
                    allocation.release_allocation(alloc)
                    running.remove((ends, alloc))
                for back, pk in [f for f in failed if f[0] <= now]:
                    Node.objects.filter(pk=pk).update(state=NodeState.READY, health=NodeHealth.OK)
                    failed.remove((back, pk))
                while i < len(events) and events[i][0] <= now:
                    _at, kind, p = events[i]
                    i += 1
                    if kind == "book":
                        cards, start, length = p
                        began = time.perf_counter()
                        try:
                            reservations.book_reservation(
                                user,
                                reservations.BookingRequest("A800", cards, "bench", start, length),
                            )
                            result.booked += 1
                            result.book_ms.append((time.perf_counter() - began) * 1000)
                        except reservations.ReservationRefused:
                            result.refused_bookings += 1
                    elif kind == "order":
                        cards, duration, known = p
                        _order(allocation, user, cards, now, duration, known, running, result)
                    elif kind == "fail":
                        pk = nodes[p]
                        Node.objects.filter(pk=pk).update(
                            state=NodeState.FAILED, health=NodeHealth.UNREACHABLE
                        )
                        failed.append((now + timedelta(hours=4), pk))
                        result.failures += 1
                reservations.run_reservations(now=now)
                # A window's instance is released at its end (auto_release_at; the reconciler).
                for row in Reservation.objects.filter(
                    state__in=(ReservationState.STARTED, ReservationState.ENDED),
                    ends_at__lte=now,
                    instance__allocation__state=AllocationState.ACTIVE,
                ).select_related("instance__allocation"):
                    alloc = row.instance.allocation if row.instance else None
                    if alloc is not None and alloc.state == AllocationState.ACTIVE:
                        allocation.release_allocation(alloc)
                now += STEP
            began = time.perf_counter()
            reservations.capacity_calendar("A800", "bench", 90)
            result.calendar_ms = (time.perf_counter() - began) * 1000
            for row in Reservation.objects.all():
                nodes_n = max(1, row.cards // 8) if row.cards >= 64 else 1
                eta = first_estimate("sim", model_id, nodes_n, slice_=row.cards >= 64).exact
                if row.started_at is None:
                    result.missed += 1
                    continue
                ready = row.started_at + timedelta(seconds=eta)
                if ready <= row.starts_at:
                    result.on_time += 1
                else:
                    result.late += 1
                    result.lateness_s.append((ready - row.starts_at).total_seconds())
            transaction.set_rollback(True)
    finally:
        allocation.booked_windows = real_windows  # type: ignore[assignment]
    return result


def _order(allocation: Any, user: Any, cards: int, now: datetime, duration: timedelta,
           known: bool, running: list, result: Result) -> None:  # fmt: skip
    end = now + duration
    try:
        got = allocation.allocate(user, cards, "A800", "bench", ends_at=end if known else None)
    except allocation.NoCapacity as exc:
        until = exc.available_until
        if until is None or until - now < timedelta(minutes=30):
            result.on_demand_refused += 1
            return
        end = min(end, until - timedelta(minutes=1))
        try:  # the customer takes the offer "可用至 …"
            got = allocation.allocate(user, cards, "A800", "bench", ends_at=end)
        except allocation.NoCapacity:
            result.on_demand_refused += 1
            return
        result.on_demand_until += 1
    result.on_demand += 1
    running.append((end, got))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--hours", type=int, default=72, help="hours of trace (bookings in the first half)"
    )
    parser.add_argument("--windows", type=int, default=24, help="bookings tried per replay")
    parser.add_argument("--gap", type=float, default=8.0, help="mean minutes between orders")
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment

    settings.SIM_TIME_SCALE = 0
    # The verification gate (实名认证 for 64 cards and more) is not what this replays.
    settings.VERIFICATION_LARGE_ORDER_CARDS = 1_000_000
    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        from slices.fleetfile import parse_fleet
        from slices.services import load_fleet

        load_fleet(parse_fleet(BENCH_FLEET))
        print(f"fleet: 32 × 8 A800 (256 GPUs), {args.hours} h trace, {args.windows} bookings tried, an order every {args.gap:g} min on average, "
              f"node failures 4 h each; on time = GPUs claimed by start − provisioning ETA")  # fmt: skip
        print(f"{'seed':>4} {'mode':<10} {'booked':>6} {'on time':>8} {'late':>5} {'missed':>6} "
              f"{'on-demand':>9} {'可用至':>5} {'refused':>7} {'fails':>5} {'s':>5}")  # fmt: skip
        totals: dict[str, list[int]] = {"windows": [0, 0], "baseline": [0, 0]}
        book_ms: list[float] = []
        calendar_ms: list[float] = []
        for seed in range(1, args.seeds + 1):
            for honour in (True, False):
                t = time.perf_counter()
                r = replay(seed, args.hours, args.windows, honour, args.gap)
                mode = "windows" if honour else "baseline"
                book_ms.extend(r.book_ms)
                calendar_ms.append(r.calendar_ms)
                totals[mode][0] += r.on_time
                totals[mode][1] += r.booked
                print(f"{seed:>4} {mode:<10} {r.booked:>6} {r.share:>8.1%} {r.late:>5} "
                      f"{r.missed:>6} {r.on_demand:>9} {r.on_demand_until:>5} "
                      f"{r.on_demand_refused:>7} {r.failures:>5} {time.perf_counter() - t:>5.1f}")  # fmt: skip
        print(f"booking answered (priced, planned, paid) in {statistics.median(book_ms):.0f} ms "
              f"median, {max(book_ms):.0f} ms at most; the 90-day calendar in "
              f"{statistics.median(calendar_ms):.0f} ms median (SQLite, this machine)")  # fmt: skip
        for mode, (ok, n) in totals.items():
            print(f"{mode}: {ok}/{n} windows started on time: {ok / n if n else 1:.1%}")
        ok, n = totals["windows"]
        return 0 if ok == n else 1
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    sys.exit(main())
