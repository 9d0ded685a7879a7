"""Money races on PostgreSQL (SQLite ignores row locks): every race ends with each effect once.

Run: DATABASE_URL=postgres://postgres@127.0.0.1:5432/gc_billing REDIS_URL=redis://127.0.0.1:6379/9 \\
     uv run pytest -m integration tests/billing
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from billing import services
from billing.models import LedgerTransaction, Payment, UsageCharge, UsageSession
from billing.money import charge_for
from billing.providers.sandbox import SandboxProvider
from tests.billing.conftest import assert_ledger_consistent
from tests.billing.factories import UserFactory
from tests.support.concurrency import race

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _open(users: list[Any], per_user: int) -> None:
    for user in users:
        services.grant_voucher(user, Decimal("10000"), reason="race", valid_days=30)
        for i in range(per_user):
            services.open_usage_session(
                user,
                resource_kind="instance",
                resource_id=f"{user.pk}-{i}",
                gpu_model="RTX 4090",
                cards=8,
            )


def test_concurrent_settlements_charge_once(prices, billing_clock) -> None:  # noqa: ANN001
    users = [UserFactory() for _ in range(4)]
    _open(users, 5)
    billing_clock.advance(600)
    results = race(8, lambda i: services.settle_usage())
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sum(r.charged for r in results) == charge_for(Decimal("1.90"), 8, 600) * 20
    assert UsageCharge.objects.count() == 20
    for session in UsageSession.objects.all():
        assert session.settled_seconds == 600 and session.charged == Decimal("2.53")
    assert_ledger_consistent()


def test_concurrent_settlements_at_different_seconds_sum_to_the_one_shot(
    prices, billing_clock
) -> None:  # noqa: ANN001
    users = [UserFactory() for _ in range(3)]
    _open(users, 3)
    start = billing_clock.now()
    from datetime import timedelta

    results = race(10, lambda i: services.settle_usage(start + timedelta(seconds=60 * (i + 1))))
    assert not [r for r in results if isinstance(r, Exception)], results
    services.settle_usage(start + timedelta(seconds=600))
    for session in UsageSession.objects.all():
        assert session.charged == charge_for(Decimal("1.90"), 8, 600)
    assert_ledger_consistent()


def test_concurrent_webhook_replays_credit_once(prices) -> None:  # noqa: ANN001
    user = UserFactory()
    payment, _ = services.start_topup(user, "100000.00")
    body, headers = SandboxProvider().build_callback(payment)
    results = race(8, lambda i: services.handle_webhook("sandbox", body, headers))
    assert sorted(results) == [False] * 7 + [True]
    summary = services.get_wallet_summary(user)
    assert summary.cash == Decimal("100000.00") and summary.vouchers == Decimal("5000.00")
    assert Payment.objects.get().provider_txn_id == f"sbx_{payment.public_id.hex}"
    assert LedgerTransaction.objects.filter(kind="topup").count() == 1
    assert_ledger_consistent()


def test_concurrent_trial_grants_grant_once() -> None:
    user = UserFactory()
    results = race(6, lambda i: services.grant_trial_credit(user))
    assert sorted(results) == [False] * 5 + [True]
    assert services.get_wallet_summary(user).trial == Decimal("10.00")


def test_concurrent_top_ups_and_settlements_lose_no_update(prices, billing_clock) -> None:  # noqa: ANN001
    users = [UserFactory() for _ in range(3)]
    for user in users:
        services.grant_trial_credit(user)
        for i in range(2):
            services.open_usage_session(
                user,
                resource_kind="instance",
                resource_id=f"{user.pk}-{i}",
                gpu_model="A800",
                cards=8,
            )
    payments = [services.start_topup(users[i % 3], "50.00")[0] for i in range(9)]
    billing_clock.advance(300)

    def work(i: int) -> Any:
        if i < 9:
            body, headers = SandboxProvider().build_callback(payments[i])
            return services.handle_webhook("sandbox", body, headers)
        return services.settle_usage()

    results = race(14, work)
    assert not [r for r in results if isinstance(r, Exception)], results
    charged = charge_for(Decimal("3.50"), 8, 300) * 2
    for user in users:
        summary = services.get_wallet_summary(user)
        assert summary.cash + summary.trial == Decimal("150.00") + Decimal("10.00") - charged
    assert_ledger_consistent()


def test_mixed_money_movements_across_wallets_never_deadlock(prices, billing_clock) -> None:  # noqa: ANN001
    users = [UserFactory() for _ in range(5)]
    _open(users, 2)
    payments = [services.start_topup(users[i % 5], "20.00")[0] for i in range(10)]
    billing_clock.advance(120)

    def work(i: int) -> Any:
        kind = i % 4
        if kind == 0:
            return services.settle_usage()
        if kind == 1:
            body, headers = SandboxProvider().build_callback(payments[i % 10])
            return services.handle_webhook("sandbox", body, headers)
        if kind == 2:
            return services.grant_voucher(
                users[i % 5], Decimal("1.00"), reason="race", valid_days=3
            )
        return services.close_usage_session("instance", f"{users[i % 5].pk}-{i % 2}")

    results = race(24, work)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert_ledger_consistent()
