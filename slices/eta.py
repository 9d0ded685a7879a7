"""How long until an instance runs, learnt from recent orders (pure: no Django).

The driver's expected step times (``NodeDriver.step_seconds``) say how long each step takes on
one node when nothing waits. What an order really takes also holds the queue before a worker
picks it up, the allocation, the waves of nodes when there are more nodes than provisioning
threads, the slowest node of a slice (a slice waits for it) and the all-reduce check. So the
estimate comes from measured timelines of recent orders like this one (same driver, GPU model
and node count, else the nearest node count), each a set of *milestones*: seconds from the order
until the slowest node had finished a step, and until running.

    history = [Timeline(nodes=16, at={"ordered": 0, "connect": 31.0, ..., "running": 112.5}), ...]
    estimate(history, nodes=16, milestone="connect", since_s=4.0, fallback_s=60.0)

History from another regime does not count: an order whose node steps (from the slowest node's
``connect`` to its ``health``) took more than ``REGIME_FACTOR`` times as long as the most recent
orders' (any size), or less than 1/``REGIME_FACTOR`` of it, ran when the steps took another time
(a changed driver or image cache, another ``SIM_TIME_SCALE``): a 16-node order's median would
otherwise mix 0.3-s orders of an instant simulation with 2.4-s ones (issue 32: three of four
128-card estimates 0.29-1.32 s against 2.36 s real). The nodes' parallelism, the slowest node of a
slice, the Slurm start and the all-reduce check need no model of their own: they are in the
comparable orders' totals, per node count.

An instance that has reached milestone ``m`` (its slowest node finished step ``m``) ``since_s``
seconds ago is estimated to run in ``median(running - at[m]) - since_s`` over the comparable
orders; between events the estimate counts down, and it never goes below zero ("any moment").
Without enough history it falls back to the driver's step model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ORDERED = "ordered"
RUNNING = "running"
# A node's provisioning steps as they are recorded (``lifecycle.Step``), then running.
MILESTONES: tuple[str, ...] = (
    ORDERED, "isolate", "connect", "prepare", "mount", "start", "health", RUNNING,
)  # fmt: skip
MIN_SAMPLES = 3  # fewer comparable orders than this: the driver's step model decides
MAX_SAMPLES = 20  # the most recent orders of a kind that count
REGIME_RECENT = 5  # the most recent orders (any size) whose node steps say how long they take now
REGIME_FACTOR = 2.0  # node steps this many times longer or shorter: another regime, left out
NODE_STEPS = ("connect", "health")  # node steps: from the slowest node's connect to its health


@dataclass(frozen=True)
class Timeline:
    """One past order: its node count and the seconds from the order to each milestone."""

    nodes: int
    at: dict[str, float]

    @property
    def total(self) -> float | None:
        return self.at.get(RUNNING)


@dataclass(frozen=True)
class Estimate:
    exact: float  # seconds, unrounded (what the benchmark scores)
    source: str  # "history" (n comparable orders) or "model" (the driver's step times)
    samples: int = 0

    @property
    def seconds(self) -> int:
        """Whole seconds, as the page and the API show them (never negative)."""
        return max(0, round(self.exact))


def node_bucket(nodes: int) -> int:
    """Orders are comparable within a power-of-two node count (1, 2, 4, 8, 16 ...)."""
    return 1 if nodes <= 1 else 2 ** math.ceil(math.log2(nodes))


def node_steps(t: Timeline) -> float | None:
    """Seconds of the node steps after ``connect`` (prepare, mount, start, health) on the slowest
    node: the part of an order that the driver's step times make (None when not recorded)."""
    first, last = (t.at.get(m) for m in NODE_STEPS)
    if first is None or last is None or last < first:
        return None
    return last - first


def same_regime(history: Sequence[Timeline]) -> list[Timeline]:
    """The timelines (most recent first) whose node steps took about as long as the most recent
    ``REGIME_RECENT`` orders' median: within a factor ``REGIME_FACTOR`` either way. Timelines
    without the steps recorded are kept (nothing to compare)."""
    spans = [s for s in (node_steps(t) for t in history if t.total is not None) if s is not None]
    recent = spans[:REGIME_RECENT]
    if not recent:
        return list(history)
    now = statistics.median(recent)
    out = []
    for t in history:
        span = node_steps(t)
        if span is None or now <= 0 or now / REGIME_FACTOR <= span <= now * REGIME_FACTOR:
            out.append(t)
    return out


def comparable(history: Iterable[Timeline], nodes: int, *, regime: bool = True) -> list[Timeline]:
    """The timelines of the same regime (``same_regime``; every one with ``regime=False``, as
    before issue 32, for the benchmark's comparison) and node count, else of the same bucket,
    most recent first (the caller's order), at most ``MAX_SAMPLES``."""
    timelines = [t for t in history if t.total is not None]
    if regime:
        timelines = same_regime(timelines)
    same = [t for t in timelines if t.nodes == nodes]
    if len(same) >= MIN_SAMPLES:
        return same[:MAX_SAMPLES]
    bucket = [t for t in timelines if node_bucket(t.nodes) == node_bucket(nodes)]
    return bucket[:MAX_SAMPLES]


def milestone_of(done_per_node: Sequence[str | None]) -> str:
    """How far the whole instance got: the step its slowest node finished (or "ordered")."""
    # "reserve" is done by the order itself (the allocation): no event of its own.
    if not done_per_node or any(not d or d == "reserve" for d in done_per_node):
        return ORDERED
    steps = [d for d in done_per_node if d in MILESTONES]
    if len(steps) != len(done_per_node):
        return ORDERED
    return min(steps, key=MILESTONES.index)


def remaining_after(history: Sequence[Timeline], milestone: str) -> list[float]:
    """For each timeline that recorded ``milestone``: the seconds from it to running."""
    out = []
    for t in history:
        total, at = t.total, t.at.get(milestone)
        if total is not None and at is not None and total >= at:
            out.append(total - at)
    return out


def estimate(
    history: Sequence[Timeline],
    *,
    nodes: int,
    milestone: str,
    since_s: float,
    fallback_s: float,
    regime: bool = True,
) -> Estimate:
    """Seconds until running for an instance of ``nodes`` nodes that reached ``milestone``
    ``since_s`` seconds ago; ``fallback_s`` is the driver model's answer for the same moment."""
    rows = comparable(history, nodes, regime=regime)
    left = remaining_after(rows, milestone)
    if len(left) >= MIN_SAMPLES:
        return Estimate(max(0.0, statistics.median(left) - since_s), "history", len(left))
    return Estimate(max(0.0, fallback_s), "model", len(left))


def absolute_error(estimated: float, actual: float) -> float:
    """|estimate − actual| / actual (0 when both are 0)."""
    if actual <= 0:
        return 0.0 if estimated <= 0 else 1.0
    return abs(estimated - actual) / actual
