"""A capacity curve: an open-loop load at stepped offered rates, and the highest rate that holds.

Each step offers ``rate`` requests a second for ``seconds``: request ``i`` of the step is launched
at ``start + i / rate`` whatever the earlier ones are doing (open loop: a slow server does not slow
the offered load down, as a closed loop of clients waiting for answers would), on a kept-alive
connection taken from a pool that grows as needed. A request's latency runs from its scheduled
launch, so time it spent waiting for the generator itself counts too (no coordinated omission).
The step ends once its last request has answered or timed out. Per step: the offered and the
achieved rate (answers over the step's wall time), p50/p99, errors (an unexpected status, a
transport error, a timeout) and the load generator's own CPU (its process CPU time over the step's
wall time, in cores: it shares the machine with the stack it measures).

The capacity is the highest offered rate whose step had p99 < the target and no errors, every lower
step having held too (``highest_passing``); the steps stop after the first that misses.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

P99_TARGET_MS = 500.0


def step_rates(start: float, stop: float, factor: float) -> list[float]:
    """Offered rates from ``start`` up to ``stop`` (included when reached), each ``factor`` times
    the last, rounded to whole requests a second."""
    if start <= 0 or factor <= 1 or stop < start:
        raise ValueError(f"rates from {start} to {stop} by x{factor}")
    rates: list[float] = []
    rate = start
    while rate <= stop * (1 + 1e-9):
        rounded = float(round(rate))
        if not rates or rounded > rates[-1]:
            rates.append(rounded)
        rate *= factor
    return rates


def launch_offsets(rate: float, seconds: float) -> list[float]:
    """When each request of a step is launched, in seconds from the step's start: evenly spaced,
    ``round(rate * seconds)`` of them (one at least)."""
    if rate <= 0 or seconds <= 0:
        raise ValueError(f"rate {rate}/s for {seconds} s")
    count = max(1, round(rate * seconds))
    return [i / rate for i in range(count)]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (``q`` from 0 to 1): the smallest value with at least
    ``q`` of the values at or below it; NaN for no values."""
    if not 0 <= q <= 1:
        raise ValueError(f"q {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class StepResult:
    offered: float  # requests/s offered
    seconds: float  # the step's wall time, its tail of answers included
    sent: int
    answered: int  # answers with the expected status
    errors: int
    p50_ms: float
    p99_ms: float
    generator_cpu: float  # the load generator's CPU in cores during the step
    late_p99_ms: float = 0.0  # how late the generator launched requests (its own lag), p99

    @property
    def achieved(self) -> float:
        return self.answered / self.seconds if self.seconds > 0 else 0.0

    def passes(self, target_ms: float = P99_TARGET_MS) -> bool:
        return self.sent > 0 and self.errors == 0 and self.p99_ms < target_ms

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "achieved": self.achieved, "passed": self.passes()}


def highest_passing(
    steps: Iterable[StepResult], target_ms: float = P99_TARGET_MS
) -> StepResult | None:
    """The step of the highest offered rate that passed with every lower rate passing too (the
    p99 *stays* under the target up to it); None when the lowest step already missed. A rate run
    more than once (a miss confirmed by a rerun) counts by its last run."""
    last: dict[float, StepResult] = {}
    for step in steps:
        last[step.offered] = step
    best = None
    for step in sorted(last.values(), key=lambda s: s.offered):
        if not step.passes(target_ms):
            break
        best = step
    return best


def summarise(
    offered: float,
    latencies_ms: Sequence[float],
    lateness_ms: Sequence[float],
    sent: int,
    errors: int,
    seconds: float,
    cpu_seconds: float,
) -> StepResult:
    return StepResult(
        offered=offered,
        seconds=seconds,
        sent=sent,
        answered=len(latencies_ms),
        errors=errors,
        p50_ms=percentile(latencies_ms, 0.50),
        p99_ms=percentile(latencies_ms, 0.99),
        generator_cpu=cpu_seconds / seconds if seconds > 0 else math.nan,
        late_p99_ms=percentile(lateness_ms, 0.99) if lateness_ms else 0.0,
    )


# A request: given a connection from the pool, send one and return the status (raise on a
# transport failure: the connection is then dropped).
Send = Callable[[Any], Awaitable[int]]


class ConnectionPool:
    """Idle connections kept alive for the next request; a new one when none is idle."""

    def __init__(self, connect: Callable[[], Any], close: Callable[[Any], Awaitable[None]]) -> None:
        self._connect = connect
        self._close = close
        self._idle: list[Any] = []
        self.opened = 0

    def take(self) -> Any:
        if self._idle:
            return self._idle.pop()
        self.opened += 1
        return self._connect()

    def give(self, conn: Any) -> None:
        self._idle.append(conn)

    async def drop(self, conn: Any) -> None:
        await self._close(conn)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._close(conn)


async def run_step(
    pool: ConnectionPool,
    send: Send,
    rate: float,
    seconds: float,
    expected: tuple[int, ...] = (200,),
    timeout: float = 10.0,
) -> StepResult:
    """One step of the curve: ``rate`` requests a second for ``seconds``, launched on schedule."""
    latencies: list[float] = []
    lateness: list[float] = []
    errors = 0
    loop = asyncio.get_running_loop()

    async def one(due: float) -> None:
        nonlocal errors
        lateness.append(max(0.0, loop.time() - due) * 1000)
        conn = pool.take()
        try:
            async with asyncio.timeout(timeout):
                status = await send(conn)
        except Exception:  # a transport error or the timeout (TimeoutError): an error
            errors += 1
            await pool.drop(conn)
            return
        pool.give(conn)
        if status in expected:
            latencies.append((loop.time() - due) * 1000)
        else:
            errors += 1

    offsets = launch_offsets(rate, seconds)
    cpu0, start = time.process_time(), loop.time()
    tasks = []
    for offset in offsets:
        due = start + offset
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)
    # The step's time: its schedule, or longer when the last answers came after it.
    wall = max(loop.time() - start, seconds)
    return summarise(
        rate, latencies, lateness, len(offsets), errors, wall, time.process_time() - cpu0
    )


async def curve(
    pool: ConnectionPool,
    send: Send,
    rates: Sequence[float],
    seconds: float,
    expected: tuple[int, ...] = (200,),
    target_ms: float = P99_TARGET_MS,
    pause: float = 0.5,
    on_step: Callable[[StepResult], None] | None = None,
    warmup: float = 0.0,
    confirm: int = 1,
) -> list[StepResult]:
    """The steps in order of rate, stopping after the first that misses the target.

    ``warmup`` seconds at the first rate come first, not counted (a process's first requests
    prepare its statements and open its pool's connections). A step that misses is run again up
    to ``confirm`` times before the curve stops there (a machine shared with other work has
    stalls of its own); every run is returned, and ``highest_passing`` counts a rate's last."""
    steps: list[StepResult] = []
    try:
        if warmup > 0 and rates:
            await run_step(pool, send, rates[0], warmup, expected)
            await asyncio.sleep(pause)
        for rate in rates:
            for _attempt in range(confirm + 1):
                step = await run_step(pool, send, rate, seconds, expected)
                steps.append(step)
                if on_step is not None:
                    on_step(step)
                await asyncio.sleep(pause)  # the server's queues drain between steps
                if step.passes(target_ms):
                    break
            if not step.passes(target_ms):
                break
    finally:
        await pool.aclose()
    return steps


def format_step(name: str, step: StepResult, target_ms: float = P99_TARGET_MS) -> str:
    return (
        f"  {name:<22} offered {step.offered:>6.0f}/s achieved {step.achieved:>6.1f}/s "
        f"p50 {step.p50_ms:>7.1f} ms p99 {step.p99_ms:>7.1f} ms errors {step.errors:>4} "
        f"generator CPU {step.generator_cpu:.2f} cores (launch lag p99 {step.late_p99_ms:.0f} ms) "
        f"{'ok' if step.passes(target_ms) else 'MISSED'}"
    )
