"""bench/support/capacity.py: the stepped schedule, the percentile, the "highest passing rate" rule
and the open-loop step (requests launched on schedule however slowly they are answered)."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.support import capacity  # noqa: E402
from bench.support.capacity import StepResult  # noqa: E402


def _step(offered: float, p99: float, errors: int = 0, sent: int = 10) -> StepResult:
    return StepResult(
        offered=offered,
        seconds=1.0,
        sent=sent,
        answered=sent - errors,
        errors=errors,
        p50_ms=p99 / 2,
        p99_ms=p99,
        generator_cpu=0.1,
    )


def test_step_rates_grow_geometrically_rounded_and_end_at_the_stop() -> None:
    assert capacity.step_rates(20, 100, 1.5) == [20.0, 30.0, 45.0, 68.0]
    assert capacity.step_rates(10, 40, 2) == [10.0, 20.0, 40.0]  # the stop itself is a step
    # Rounding never repeats a rate at small steps.
    rates = capacity.step_rates(1, 10, 1.1)
    assert rates == sorted(set(rates)) and rates[0] == 1.0 and rates[-1] <= 10
    for bad in ((0, 10, 2), (10, 5, 2), (10, 20, 1.0)):
        with pytest.raises(ValueError):
            capacity.step_rates(*bad)


def test_launch_offsets_are_evenly_spaced_over_the_step() -> None:
    offsets = capacity.launch_offsets(4, 2.5)
    assert offsets == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25]
    assert capacity.launch_offsets(0.1, 1) == [0.0]  # one request at least
    with pytest.raises(ValueError):
        capacity.launch_offsets(0, 1)


def test_percentile_is_the_nearest_rank() -> None:
    values = list(range(1, 101))  # 1..100
    assert capacity.percentile(values, 0.99) == 99
    assert capacity.percentile(values, 0.5) == 50
    assert capacity.percentile(values, 1.0) == 100
    assert capacity.percentile([7.0], 0.99) == 7.0
    assert capacity.percentile([3, 1, 2], 0.0) == 1  # order of the input does not matter
    assert math.isnan(capacity.percentile([], 0.5))
    with pytest.raises(ValueError):
        capacity.percentile(values, 1.5)


def test_highest_passing_rate_is_the_last_before_the_first_miss() -> None:
    steps = [_step(20, 30), _step(40, 80), _step(80, 499.9), _step(160, 900), _step(320, 100)]
    best = capacity.highest_passing(steps)
    # 320/s passed by chance after 160/s missed: the p99 did not *stay* under the target.
    assert best is not None and best.offered == 80
    assert capacity.highest_passing(list(reversed(steps))).offered == 80  # order-free
    # An error fails a step whatever its latency; p99 at the target fails it too.
    assert capacity.highest_passing([_step(20, 10), _step(40, 10, errors=1)]).offered == 20
    assert capacity.highest_passing([_step(20, 10), _step(40, 500.0)]).offered == 20
    assert capacity.highest_passing([_step(20, 600)]) is None
    assert capacity.highest_passing([]) is None
    assert capacity.highest_passing([_step(20, 10, sent=0)]) is None  # nothing sent proves nothing
    # Another target moves the answer.
    assert capacity.highest_passing(steps, target_ms=50).offered == 20
    # A rate run again (a miss rerun to confirm it) counts by its last run, whichever way.
    rerun = [_step(20, 30), _step(40, 700), _step(40, 90), _step(80, 900), _step(80, 950)]
    assert capacity.highest_passing(rerun).offered == 40
    assert capacity.highest_passing([_step(20, 30), _step(40, 90), _step(40, 700)]).offered == 20


def test_summarise_rates_and_generator_cpu() -> None:
    step = capacity.summarise(50, [10.0] * 90 + [200.0] * 10, [0.0, 3.0], 100, 0, 2.0, 0.5)
    assert step.achieved == 50.0 and step.generator_cpu == 0.25
    assert step.p50_ms == 10.0 and step.p99_ms == 200.0 and step.late_p99_ms == 3.0
    assert step.as_dict()["passed"] is True


class _Conn:
    def __init__(self, n: int) -> None:
        self.n = n


def test_a_step_launches_on_schedule_while_earlier_requests_are_still_out() -> None:
    """Open loop: answers slower than the launch interval do not hold later launches back, so
    several requests are in flight at once on connections of their own."""
    in_flight = 0
    most = 0
    pool = capacity.ConnectionPool(lambda: _Conn(pool.opened), _aclose)

    async def send(conn: _Conn) -> int:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.1)  # ten launch intervals at 100/s
        in_flight -= 1
        return 503 if conn.n == 1 else 200  # the first connection's answers are unexpected

    step = asyncio.run(capacity.run_step(pool, send, rate=100, seconds=0.3))
    assert step.sent == 30
    assert most > 1 and pool.opened == most  # a connection per request in flight, then reused
    assert step.errors >= 1 and step.answered + step.errors == 30
    assert step.p99_ms >= step.p50_ms >= 100 * 0.9  # latency from the scheduled launch
    assert not step.passes(target_ms=10_000)  # an error fails the step


def test_a_transport_failure_is_an_error_and_drops_the_connection() -> None:
    dropped: list[_Conn] = []

    async def close(conn: _Conn) -> None:
        dropped.append(conn)

    pool = capacity.ConnectionPool(lambda: _Conn(pool.opened), close)

    async def send(conn: _Conn) -> int:
        if conn.n == 1:
            raise ConnectionResetError
        return 200

    steps = asyncio.run(capacity.curve(pool, send, [10, 20], seconds=0.2, pause=0, confirm=0))
    assert len(steps) == 1  # the first step missed: no further steps
    assert steps[0].errors == 1 and steps[0].answered == 1
    assert dropped and dropped[0].n == 1


def test_a_missed_step_is_run_again_and_the_warmup_is_not_counted() -> None:
    sent = 0

    async def send(conn: _Conn) -> int:
        nonlocal sent
        sent += 1
        return 500 if sent == 3 else 200  # the first step's first run (requests 3-4) misses

    pool = capacity.ConnectionPool(lambda: _Conn(pool.opened), _aclose)
    steps = asyncio.run(
        capacity.curve(pool, send, [10, 20], seconds=0.2, pause=0, warmup=0.2, confirm=1)
    )
    # The warm-up's 2 requests are sent but not among the steps.
    assert sent == 10 and [s.sent for s in steps] == [2, 2, 4]
    assert [(s.offered, s.errors) for s in steps] == [(10.0, 1), (10.0, 0), (20.0, 0)]
    assert capacity.highest_passing(steps).offered == 20  # the rerun passed: the curve went on


async def _aclose(conn: _Conn) -> None:
    return None
