"""The instance state machine and the per-node provisioning steps (pure: no Django).

An instance moves pending → allocating → provisioning → running → releasing → released, or to
failed from any live state. Each node of an instance goes through ``STEPS`` in order; the
instance is running when every node passed the last step. Services apply these rules with
compare-and-set updates; this module only says what is allowed and what comes next.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum


class State(StrEnum):
    PENDING = "pending"
    ALLOCATING = "allocating"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    RELEASING = "releasing"
    RELEASED = "released"
    FAILED = "failed"
    # Storage and resilience (README "Storage and resilience"): 关机/开机 and hot migration.
    STOPPING = "stopping"
    STOPPED = "stopped"
    STARTING = "starting"
    MIGRATING = "migrating"
    # 排队 (issue 32): waits for capacity, holding no GPUs; starts (allocating) or leaves
    # (released: cancelled, past its maximum wait, or its funds failed at the start).
    QUEUED = "queued"


class Step(StrEnum):
    """One node's provisioning steps, in order (``reserve`` is done when the GPUs are allocated)."""

    RESERVE = "reserve"
    ISOLATE = "isolate"
    CONNECT = "connect"
    PREPARE = "prepare"
    MOUNT = "mount"
    START = "start"
    HEALTH = "health"
    READY = "ready"


STEPS: tuple[Step, ...] = tuple(Step)

# Relative weight of each step in a node's progress bar (the slow ones count more).
STEP_WEIGHTS: dict[Step, int] = {
    Step.RESERVE: 2,
    Step.ISOLATE: 5,
    Step.CONNECT: 5,
    Step.PREPARE: 10,
    Step.MOUNT: 18,
    Step.START: 45,
    Step.HEALTH: 15,
    Step.READY: 0,
}

TRANSITIONS: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.ALLOCATING, State.FAILED, State.RELEASING, State.QUEUED}),
    State.QUEUED: frozenset({State.ALLOCATING, State.RELEASED}),
    State.ALLOCATING: frozenset({State.PROVISIONING, State.FAILED, State.RELEASING}),
    State.PROVISIONING: frozenset({State.RUNNING, State.FAILED, State.RELEASING}),
    State.RUNNING: frozenset({State.RELEASING, State.FAILED, State.STOPPING, State.MIGRATING}),
    State.RELEASING: frozenset({State.RELEASED}),
    # Stop frees the GPUs and keeps the system disk; start allocates again and provisions.
    State.STOPPING: frozenset({State.STOPPED, State.FAILED}),
    State.STOPPED: frozenset({State.STARTING, State.RELEASING}),
    State.STARTING: frozenset({State.PROVISIONING, State.STOPPED, State.FAILED}),
    # A node failed under a running instance: a replacement is provisioned (or the user releases).
    State.MIGRATING: frozenset({State.PROVISIONING, State.RELEASING, State.FAILED}),
    State.FAILED: frozenset({State.RELEASED}),
    State.RELEASED: frozenset(),
}

# States a worker is expected to move on by itself; the reconciler watches them.
TRANSITIONAL: frozenset[State] = frozenset(
    {State.PENDING, State.ALLOCATING, State.PROVISIONING, State.RELEASING, State.STOPPING}
)
# States that hold (or may hold) GPUs, i.e. an allocation that must not be reaped.
LIVE: frozenset[State] = frozenset(
    {
        State.PENDING,
        State.ALLOCATING,
        State.PROVISIONING,
        State.RUNNING,
        State.RELEASING,
        State.STOPPING,
        State.STARTING,
        State.MIGRATING,
    }
)
# The user may release from these (a failed one is archived, its resources already freed).
RELEASABLE: frozenset[State] = frozenset(
    {
        State.PENDING,
        State.ALLOCATING,
        State.PROVISIONING,
        State.RUNNING,
        State.FAILED,
        State.STOPPED,
        State.MIGRATING,
        State.QUEUED,
    }
)
# 关机: only a running instance stops; 开机: only a stopped one starts.
STOPPABLE: frozenset[State] = frozenset({State.RUNNING})
STARTABLE: frozenset[State] = frozenset({State.STOPPED})
FINAL: frozenset[State] = frozenset({State.RELEASED})


def can_transition(src: str, dst: str) -> bool:
    return State(dst) in TRANSITIONS[State(src)]


def sources_of(dst: str) -> tuple[str, ...]:
    """Every state that may move to ``dst`` (for a compare-and-set ``state__in``)."""
    return tuple(s.value for s, targets in TRANSITIONS.items() if State(dst) in targets)


def next_step(done: str | None) -> Step | None:
    """The step after ``done`` (None = nothing done yet: the first); None after the last."""
    if not done:
        return STEPS[0]
    i = STEPS.index(Step(done))
    return STEPS[i + 1] if i + 1 < len(STEPS) else None


def remaining_steps(done: str | None) -> list[Step]:
    out: list[Step] = []
    step = next_step(done)
    while step is not None:
        out.append(step)
        step = next_step(step)
    return out


def node_progress(done: str | None, fraction_of_current: float = 0.0) -> int:
    """Percent of one node's provisioning done after step ``done`` (0–100)."""
    total = sum(STEP_WEIGHTS.values())
    if not done:
        return 0
    i = STEPS.index(Step(done))
    finished = sum(STEP_WEIGHTS[s] for s in STEPS[: i + 1])
    if i + 1 < len(STEPS):
        finished += int(STEP_WEIGHTS[STEPS[i + 1]] * max(0.0, min(1.0, fraction_of_current)))
    return min(100, round(100 * finished / total))


def instance_progress(done_per_node: Sequence[str | None]) -> int:
    """Percent of the whole instance (the mean of its nodes)."""
    if not done_per_node:
        return 0
    return round(sum(node_progress(d) for d in done_per_node) / len(done_per_node))


def eta_seconds(done_per_node: Iterable[str | None], step_seconds: dict[str, float]) -> float:
    """Seconds until the slowest node is done, from each step's expected duration (nodes run in
    parallel, so the instance waits for the node with the most left)."""
    left = [sum(step_seconds.get(s.value, 0.0) for s in remaining_steps(d)) for d in done_per_node]
    return max(left, default=0.0)
