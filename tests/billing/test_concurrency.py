"""Money races on PostgreSQL (SQLite ignores row locks): every race ends with each effect once.

Run: DATABASE_URL=postgres://postgres@127.0.0.1:5432/gc_billing REDIS_URL=redis://127.0.0.1:6379/9 \\
     uv run pytest -m integration tests/billing
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction

from billing import services
from billing.models import Account, LedgerTransaction, Payment, UsageCharge, UsageSession, Wallet
from billing.money import charge_for
from billing.providers.sandbox import SandboxProvider
from console.models import User
from tests.billing.conftest import assert_ledger_consistent
from tests.billing.factories import fund, open_session
from tests.console.factories import UserFactory
from tests.support.concurrency import race

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _open(users: list[User], per_user: int) -> None:
    for user in users:
        fund(user, "10000")
        for i in range(per_user):
            open_session(user, resource_id=f"{user.pk}-{i}", cards=8)


def test_concurrent_settlements_charge_once(prices, billing_clock) -> None:
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
) -> None:
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


@pytest.mark.usefixtures("sandbox_payments")
def test_concurrent_webhook_replays_credit_once(prices) -> None:
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


@pytest.mark.usefixtures("sandbox_payments")
def test_concurrent_top_ups_and_settlements_lose_no_update(prices, billing_clock) -> None:
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


@pytest.mark.usefixtures("sandbox_payments")
def test_mixed_money_movements_across_wallets_never_deadlock(prices, billing_clock) -> None:
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


def _blocked(pid: int) -> bool:
    """Whether backend ``pid`` waits on a lock (live, unlike pg_stat_activity in a transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT cardinality(pg_blocking_pids(%s))", [pid])
        return cursor.fetchone()[0] > 0


def _wait(until: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out waiting for the other connection"
        time.sleep(0.01)


def test_settlement_never_locks_accounts_of_a_wallet_it_did_not_lock(
    prices,
    billing_clock,
) -> None:
    """A wallet whose first session opens while the run waits for its wallet locks is left out.

    Its accounts must not be locked either (that would break the wallet-first lock order): here
    another writer holds them, and the settlement must finish without waiting for it.
    """
    first, late = UserFactory(), UserFactory()
    _open([first], 1)
    late_wallet = services.get_or_create_wallet(late)
    services.grant_voucher(late, Decimal("100"), reason="race", valid_days=30)
    billing_clock.advance(60)
    pid: list[int] = []
    outcome: list[Any] = []

    def settle() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid.append(cursor.fetchone()[0])
            outcome.append(services.settle_usage())
        except Exception as exc:  # asserted below
            outcome.append(exc)
        finally:
            connection.close()

    holding, release = threading.Event(), threading.Event()

    def hold_late_accounts() -> None:
        try:
            with transaction.atomic():
                list(Account.objects.filter(wallet=late_wallet).select_for_update())
                holding.set()
                release.wait(60)
        finally:
            connection.close()

    settler = threading.Thread(target=settle)
    holder = threading.Thread(target=hold_late_accounts)
    try:
        with transaction.atomic():  # hold the first wallet: the run waits in its step 1
            Wallet.objects.select_for_update().get(team__personal_of=first)
            settler.start()
            _wait(lambda: bool(pid) and _blocked(pid[0]))
            # the late wallet's first session opens (committed) while the run waits
            opener = threading.Thread(
                target=lambda: (
                    services.open_usage_session(
                        late,
                        resource_kind="instance",
                        resource_id="late",
                        gpu_model="RTX 4090",
                        cards=1,
                    ),
                    connection.close(),
                )
            )
            opener.start()
            opener.join(60)
            holder.start()
            assert holding.wait(60)
        # the first wallet is free now: the run either finishes or waits for the late accounts
        waited = False
        while settler.is_alive():
            if _blocked(pid[0]):
                waited = True
                break
            time.sleep(0.01)
    finally:
        release.set()
        holder.join(60)
        settler.join(60)
    assert not waited, "the settlement waited for accounts of a wallet it had not locked"
    assert not isinstance(outcome[0], Exception), outcome
    assert outcome[0].sessions == 1 and outcome[0].charged == charge_for(Decimal("1.90"), 8, 60)
    assert UsageSession.objects.get(resource_id="late").charged == 0
    assert_ledger_consistent()
