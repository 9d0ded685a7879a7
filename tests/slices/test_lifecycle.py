"""The pure instance state machine and provisioning steps (slices/lifecycle.py), without Django's
database: what may follow what, and how progress and the ETA are computed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slices import lifecycle
from slices.choices import InstanceState
from slices.lifecycle import STEP_WEIGHTS, STEPS, TRANSITIONS, State, Step


def test_the_pure_states_are_exactly_the_stored_choices() -> None:
    """lifecycle.State (no Django) and choices.InstanceState (the model field) name the same
    states: a state added to one and not the other would be stored but never moved on, or the
    reverse."""
    assert {s.value for s in State} == set(InstanceState.values)


def test_every_state_has_its_transitions_and_only_known_targets() -> None:
    assert set(TRANSITIONS) == set(State)
    for targets in TRANSITIONS.values():
        assert targets <= set(State)


def _reachable(start: State) -> set[State]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("state", list(State))
def test_every_state_can_end_released_and_released_is_final(state: State) -> None:
    """No dead end: whatever happens, an instance can still be released (and its GPUs freed)."""
    assert State.RELEASED in _reachable(state)
    assert lifecycle.FINAL == {State.RELEASED}
    assert TRANSITIONS[State.RELEASED] == frozenset()


def test_the_action_sets_match_the_transitions() -> None:
    # The user's release: straight to releasing, or (a failed one) to released.
    for state in lifecycle.RELEASABLE:
        assert lifecycle.can_transition(state, State.RELEASING) or lifecycle.can_transition(
            state, State.RELEASED
        )
    for state in lifecycle.STOPPABLE:
        assert lifecycle.can_transition(state, State.STOPPING)
    for state in lifecycle.STARTABLE:
        assert lifecycle.can_transition(state, State.STARTING)
    # The reconciler watches states a worker moves on; all of them may hold GPUs.
    assert lifecycle.TRANSITIONAL <= lifecycle.LIVE
    assert not lifecycle.LIVE & {State.RELEASED, State.FAILED, State.STOPPED}


@pytest.mark.parametrize("dst", list(State))
def test_sources_of_is_the_inverse_of_can_transition(dst: State) -> None:
    expected = {s.value for s in State if lifecycle.can_transition(s, dst)}
    assert set(lifecycle.sources_of(dst)) == expected


def test_forbidden_moves_are_refused() -> None:
    assert not lifecycle.can_transition("released", "running")
    assert not lifecycle.can_transition("running", "pending")
    assert not lifecycle.can_transition("stopped", "running")  # start provisions first
    with pytest.raises(ValueError):
        lifecycle.can_transition("running", "exploded")


def test_steps_run_in_order_from_reserve_to_ready() -> None:
    assert lifecycle.next_step(None) == Step.RESERVE
    assert lifecycle.next_step("") == Step.RESERVE
    for before, after in zip(STEPS, STEPS[1:], strict=False):
        assert lifecycle.next_step(before) == after
    assert lifecycle.next_step(Step.READY) is None
    assert lifecycle.remaining_steps(None) == list(STEPS)
    assert lifecycle.remaining_steps(Step.MOUNT) == [Step.START, Step.HEALTH, Step.READY]
    assert lifecycle.remaining_steps(Step.READY) == []


def test_node_progress_climbs_with_each_step_from_0_to_100() -> None:
    assert set(STEP_WEIGHTS) == set(STEPS)
    figures = [lifecycle.node_progress(None)] + [lifecycle.node_progress(s) for s in STEPS]
    assert figures[0] == 0
    assert figures[-1] == 100
    assert figures == sorted(figures)
    # The slow step (start) moves the bar more than the quick ones.
    assert lifecycle.node_progress(Step.START) - lifecycle.node_progress(Step.MOUNT) > 40


@given(
    done=st.sampled_from([None, *STEPS]),
    fraction=st.floats(min_value=-5, max_value=5, allow_nan=False),
)
def test_a_fraction_of_the_current_step_stays_within_that_step(
    done: Step | None, fraction: float
) -> None:
    """Partial progress never goes past the next step's figure, nor below the last one's."""
    here = lifecycle.node_progress(done, fraction)
    assert lifecycle.node_progress(done) <= here <= 100
    nxt = lifecycle.next_step(done)
    if done and nxt is not None:
        assert here <= lifecycle.node_progress(nxt)


def test_instance_progress_is_the_mean_of_its_nodes() -> None:
    assert lifecycle.instance_progress([]) == 0
    assert lifecycle.instance_progress([Step.READY, None]) == 50
    assert lifecycle.instance_progress([Step.READY] * 8) == 100


def test_the_eta_waits_for_the_slowest_node() -> None:
    seconds = {step.value: 10.0 for step in STEPS}
    assert lifecycle.eta_seconds([], seconds) == 0.0
    assert lifecycle.eta_seconds([Step.READY], seconds) == 0.0
    # One node done, one at the start: the instance waits for all eight steps of the second.
    assert lifecycle.eta_seconds([Step.READY, None], seconds) == 80.0
    assert lifecycle.eta_seconds([Step.MOUNT, Step.HEALTH], seconds) == 30.0
    # Steps without an expected duration count as instant.
    assert lifecycle.eta_seconds([None], {"start": 45.0}) == 45.0
