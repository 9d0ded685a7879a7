"""Concurrent bookings of one window on PostgreSQL (row locks are real there): the last capacity
goes to exactly as many windows as fit, and a cancel raced against itself refunds once."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import services as billing
from billing.choices import MemoCode
from billing.models import LedgerTransaction
from billing.seed import seed_default_prices
from slices.models import Reservation
from slices.services import reservations
from tests.slices.factories import load_small_fleet
from tests.support.concurrency import race

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def world(settings, alice, bob):
    settings.SIM_TIME_SCALE = 0
    load_small_fleet()
    seed_default_prices()  # transactional tests flush the migration-seeded price book
    for user in (alice, bob):
        billing.grant_voucher(user, Decimal("100000"), reason="test", valid_days=30)


def _book(user, start):
    try:
        return reservations.book_reservation(
            user,
            reservations.BookingRequest("RTX4090", 8, "xiamen", start, 24),
        )[0]
    except reservations.ReservationRefused as exc:
        return exc


def test_concurrent_bookings_never_oversubscribe_a_window(world, alice, bob):
    """Xiamen has 2 × 8 RTX 4090: of eight bookings of one 8-card window, exactly two win."""
    start = timezone.now() + timedelta(days=4)
    users = [alice, bob]
    results = race(8, lambda i: _book(users[i % 2], start))
    won = [r for r in results if isinstance(r, Reservation)]
    lost = [r for r in results if isinstance(r, reservations.ReservationRefused)]
    assert len(won) == 2 and len(lost) == 6, results
    assert Reservation.objects.count() == 2
    assert billing.reconcile() == []


def test_a_cancel_raced_against_itself_refunds_once(world, alice):
    row = _book(alice, timezone.now() + timedelta(days=4))
    results = race(6, lambda _i: reservations.cancel_reservation(alice, row.public_id)[1])
    assert sorted(results) == [Decimal("0.00")] * 5 + [row.total], results
    assert LedgerTransaction.objects.filter(memo_code=MemoCode.RESERVATION_REFUND).count() == 1
    assert billing.reconcile() == []
