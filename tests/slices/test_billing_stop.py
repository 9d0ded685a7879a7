"""Billing stops what the balance cannot pay for; slices gives the GPUs back (and only them)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing import clock
from billing.seed import seed_default_prices
from billing.services import grant_trial_credit, open_usage_session, settle_usage
from console.models import User
from slices import services
from slices.choices import AllocationState
from slices.models import Allocation
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def on_trial(alice: User) -> User:
    """The price book, the small fleet, and alice with the 10.00 元 trial credit only."""
    seed_default_prices()
    load_small_fleet()
    grant_trial_credit(alice)
    return alice


def meter(allocation: Allocation) -> None:
    """Open the usage session billing settles ``allocation`` (8 × RTX 4090) by."""
    open_usage_session(
        allocation.team,
        resource_kind=services.ALLOCATION_RESOURCE,
        resource_id=str(allocation.public_id),
        gpu_model="RTX 4090",
        cards=8,
    )


def test_running_out_of_money_releases_the_allocation_once(
    on_trial: User, django_capture_on_commit_callbacks
) -> None:
    # 10.00 元: 8 × RTX 4090 at 1.90 元/card-h runs about 39 minutes
    free_before = sum(r.free_gpus for r in services.availability())
    allocation = services.allocate(on_trial, 8, "RTX4090")
    frozen = clock.FrozenClock()
    with clock.use_clock(frozen):
        meter(allocation)
        frozen.advance(30 * 60)
        with django_capture_on_commit_callbacks(execute=True):
            settle_usage()
        allocation.refresh_from_db()
        assert allocation.state == AllocationState.ACTIVE  # 7.60 元 spent, enough left

        frozen.advance(9 * 60)
        with django_capture_on_commit_callbacks(execute=True):
            result = settle_usage()
    assert len(result.stopped) == 1
    allocation.refresh_from_db()
    assert allocation.state == AllocationState.RELEASED
    assert sum(r.free_gpus for r in services.availability()) == free_before
    # A second stop request (a replayed hook) changes nothing.
    services.stop_for_billing(services.ALLOCATION_RESOURCE, str(allocation.public_id), "again")
    assert sum(r.free_gpus for r in services.availability()) == free_before


def test_the_hook_ignores_other_kinds_and_malformed_ids(alice) -> None:
    load_small_fleet()
    allocation = services.allocate(alice, 2, "RTX4090")
    services.stop_for_billing("disk", str(allocation.public_id), "insufficient_funds")
    services.stop_for_billing(services.ALLOCATION_RESOURCE, "not-a-uuid", "insufficient_funds")
    allocation.refresh_from_db()
    assert allocation.state == AllocationState.ACTIVE


def test_the_spendable_balance_never_goes_below_one_window_of_burn(on_trial: User) -> None:
    from billing.services import get_wallet_summary

    allocation = services.allocate(on_trial, 8, "RTX4090")
    frozen = clock.FrozenClock()
    with clock.use_clock(frozen):
        meter(allocation)
        for _ in range(60):
            frozen.advance(60)
            settle_usage()
    one_window = Decimal("15.20") / 60
    assert get_wallet_summary(on_trial).spendable >= -one_window
