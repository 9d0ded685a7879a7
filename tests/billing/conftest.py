from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal

import pytest

from billing import clock, services
from billing.models import Account, Entry, LedgerTransaction
from billing.seed import seed_default_prices


@pytest.fixture
def billing_clock() -> Iterator[clock.FrozenClock]:
    """A clock the test moves; every billing service reads time from it."""
    frozen = clock.FrozenClock()
    with clock.use_clock(frozen):
        yield frozen


@pytest.fixture
def stop_requests() -> Iterator[list[tuple[str, str, str]]]:
    """The stop requests billing makes in the test, as (resource kind, resource id, reason): a
    recording stop handler, the previous one put back afterwards."""
    calls: list[tuple[str, str, str]] = []
    previous = services.register_stop_handler(lambda *args: calls.append(args))
    try:
        yield calls
    finally:
        services.register_stop_handler(previous)


@pytest.fixture
def prices(db) -> None:
    """The seed price book (transactional tests flush the migration's copy)."""
    seed_default_prices()


def assert_ledger_consistent() -> None:
    """Every transaction sums to zero; every cached balance equals its entries; all sum to zero.

    Sums are taken in Python: SQLite's SUM() works in floating point.
    """
    by_txn: dict[int, Decimal] = defaultdict(Decimal)
    by_account: dict[int, Decimal] = defaultdict(Decimal)
    for txn_id, account_id, amount in Entry.objects.values_list("transaction", "account", "amount"):
        by_txn[txn_id] += amount
        by_account[account_id] += amount
    assert set(by_txn) == set(LedgerTransaction.objects.values_list("pk", flat=True))
    assert all(total == 0 for total in by_txn.values())
    accounts = list(Account.objects.all())
    for account in accounts:
        assert account.balance == by_account[account.pk], account
    assert sum((a.balance for a in accounts), Decimal("0")) == 0


@pytest.fixture
def sandbox_payments(settings) -> None:
    """Production mode switches the sandbox provider off; tests that pay through it opt in."""
    settings.BILLING_SANDBOX_PAYMENTS = True


@pytest.fixture
def no_sandbox_payments(settings) -> None:
    """The production default: ``BILLING_SANDBOX_PAYMENTS`` off."""
    settings.BILLING_SANDBOX_PAYMENTS = False
