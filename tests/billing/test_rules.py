"""Vouchers, price versions, long-term rental, low-balance notices, corrections."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import translation

from billing import services
from billing.choices import CloseReason, UsageState
from billing.models import (
    Account,
    BillingNotice,
    Entry,
    GpuPrice,
    ImmutableError,
    LedgerTransaction,
    PriceBook,
    UsageSession,
)
from tests.billing.conftest import assert_ledger_consistent

pytestmark = pytest.mark.django_db


def test_expired_vouchers_are_never_spent_and_are_written_off(alice, prices, billing_clock) -> None:
    services.grant_voucher(alice, Decimal("50"), reason="short", valid_days=1)
    services.grant_trial_credit(alice)
    billing_clock.advance(days=1, seconds=1)
    assert services.get_wallet_summary(alice).vouchers == Decimal("0.00")
    services.open_usage_session(
        alice, resource_kind="instance", resource_id="i", gpu_model="RTX 4090", cards=1
    )
    billing_clock.advance(3600)
    services.settle_usage()
    voucher = Account.objects.get(kind="voucher")
    assert voucher.balance == Decimal("50.00")  # untouched: the trial credit paid
    assert services.get_wallet_summary(alice).trial == Decimal("8.10")
    assert services.expire_vouchers() == 1
    assert services.expire_vouchers() == 0
    voucher.refresh_from_db()
    assert voucher.balance == 0
    assert_ledger_consistent()


def test_vouchers_need_a_reason_and_a_future_expiry(alice) -> None:
    with pytest.raises(services.BillingError):
        services.grant_voucher(alice, Decimal("5"), reason=" ")
    with pytest.raises(services.BillingError):
        services.grant_voucher(alice, Decimal("0"), reason="x")


def test_a_new_price_version_does_not_change_a_running_session(
    alice, prices, billing_clock
) -> None:
    services.grant_voucher(alice, Decimal("1000"), reason="t", valid_days=30)
    old = services.open_usage_session(
        alice, resource_kind="instance", resource_id="old", gpu_model="RTX 4090", cards=1
    )
    book = PriceBook.objects.get(version=1)
    new_book = services.copy_price_book(
        book, effective_at=billing_clock.now() + timedelta(minutes=30)
    )
    GpuPrice.objects.filter(price_book=new_book, gpu_model="RTX 4090").update(
        on_demand_per_card_hour=Decimal("2.50")
    )
    billing_clock.advance(3600)
    new = services.open_usage_session(
        alice, resource_kind="instance", resource_id="new", gpu_model="RTX 4090", cards=1
    )
    billing_clock.advance(3600)
    services.settle_usage()
    old.refresh_from_db()
    new.refresh_from_db()
    assert (old.rate, old.price_book.version, old.charged) == (Decimal("1.90"), 1, Decimal("3.80"))
    assert (new.rate, new.price_book.version, new.charged) == (Decimal("2.50"), 2, Decimal("2.50"))


def test_long_term_rental_is_paid_up_front_at_the_locked_price(alice, prices) -> None:
    with pytest.raises(services.InsufficientFunds):
        services.purchase_term(
            alice,
            gpu_model="RTX 4090",
            cards=8,
            days=30,
            resource_kind="instance",
            resource_id="lt",
        )
    assert not LedgerTransaction.objects.filter(kind="term_purchase").exists()
    payment, _ = services.start_topup(alice, "10000.00")
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="p", amount=Decimal("10000.00")
    )
    rental = services.purchase_term(
        alice, gpu_model="RTX 4090", cards=8, days=30, resource_kind="instance", resource_id="lt"
    )
    assert rental.total == Decimal("6912.00") and rental.rate == Decimal("1.20")
    assert services.get_wallet_summary(alice).cash == Decimal("3088.00")
    with pytest.raises(services.PriceNotSet):
        services.purchase_term(
            alice, gpu_model="A800", cards=8, days=30, resource_kind="instance", resource_id="x"
        )
    assert_ledger_consistent()


def test_exactly_one_warning_per_threshold_and_rearmed_by_a_top_up(
    alice,
    prices,
    billing_clock,
    settings,
) -> None:
    settings.BILLING_LOW_BALANCE_THRESHOLDS = (3600, 600)
    services.grant_voucher(alice, Decimal("20"), reason="t", valid_days=30)  # 20 元 at 15.20 元/h
    services.open_usage_session(
        alice, resource_kind="instance", resource_id="w", gpu_model="RTX 4090", cards=8
    )
    for _ in range(30):
        billing_clock.advance(60)
        services.settle_usage()
    notices = list(BillingNotice.objects.order_by("id").values_list("kind", "threshold_seconds"))
    assert notices == [("low_balance", 3600)]
    small, _ = services.start_topup(alice, "1.00")  # still under an hour: no second warning
    services.confirm_payment(
        str(small.public_id), provider="sandbox", provider_txn_id="s", amount=Decimal("1.00")
    )
    billing_clock.advance(60)
    services.settle_usage()
    assert BillingNotice.objects.count() == 1
    payment, _ = services.start_topup(alice, "1000.00")
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="p", amount=Decimal("1000.00")
    )
    billing_clock.advance(60)
    services.settle_usage()
    assert BillingNotice.objects.count() == 1
    assert (
        alice.personal_team.wallet.__class__.objects.get(
            pk=alice.personal_team.wallet.pk
        ).warned_thresholds
        == []
    )


def test_a_stop_for_lack_of_funds_keeps_disks_and_a_top_up_restarts_nothing(
    alice,
    prices,
    billing_clock,
    stop_requests: list[tuple[str, str, str]],
    django_capture_on_commit_callbacks,
) -> None:
    services.grant_trial_credit(alice)
    services.open_usage_session(
        alice, resource_kind="disk", resource_id="d", cards=100, meter="disk"
    )
    services.open_usage_session(
        alice, resource_kind="instance", resource_id="old", gpu_model="RTX 4090", cards=8
    )
    billing_clock.advance(5)
    services.open_usage_session(
        alice, resource_kind="instance", resource_id="new", gpu_model="RTX 4090", cards=4
    )
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(30):
            billing_clock.advance(60)
            services.settle_usage()
    # one stop request per GPU session; the newest stops first (or with the older one)
    assert sorted(stop_requests) == [
        ("instance", "new", "insufficient_funds"),
        ("instance", "old", "insufficient_funds"),
    ]
    ended = dict(UsageSession.objects.values_list("resource_id", "ended_at"))
    assert ended["new"] <= ended["old"]
    states = dict(UsageSession.objects.values_list("resource_id", "state"))
    assert states == {"d": "open", "old": "closed", "new": "closed"}
    payment, _ = services.start_topup(alice, "100.00")
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="p", amount=Decimal("100.00")
    )
    billing_clock.advance(60)
    services.settle_usage()
    assert UsageSession.objects.filter(state=UsageState.OPEN).count() == 1
    assert (
        UsageSession.objects.get(resource_id="old").close_reason == CloseReason.INSUFFICIENT_FUNDS
    )
    assert_ledger_consistent()


def test_ledger_rows_are_append_only_and_corrections_reverse(alice, prices) -> None:
    services.grant_voucher(alice, Decimal("5"), reason="oops", valid_days=3)
    txn = LedgerTransaction.objects.get(kind="voucher_grant")
    entry = Entry.objects.filter(transaction=txn).first()
    entry.amount = Decimal("500")
    with pytest.raises(ImmutableError):
        entry.save()
    with pytest.raises(ImmutableError):
        txn.delete()
    services.reverse_transaction(txn, reason="granted to the wrong account")
    assert services.get_wallet_summary(alice).vouchers == Decimal("0.00")
    with pytest.raises(services.BillingError):
        services.reverse_transaction(txn, reason="twice")
    assert_ledger_consistent()


def test_refunds_only_from_cash(alice, prices) -> None:
    services.grant_trial_credit(alice)
    with pytest.raises(services.InsufficientFunds):
        services.refund_cash(alice, Decimal("1"), reason="trial is not refundable")
    payment, _ = services.start_topup(alice, "30.00")
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="p", amount=Decimal("30.00")
    )
    services.refund_cash(alice, Decimal("30"), reason="customer request")
    summary = services.get_wallet_summary(alice)
    assert summary.cash == 0 and summary.trial == Decimal("10.00")
    assert_ledger_consistent()


def test_a_reversed_expiry_expires_again(alice, prices, billing_clock) -> None:
    voucher = services.grant_voucher(alice, Decimal("20"), reason="short", valid_days=1)
    billing_clock.advance(days=1, seconds=1)
    assert services.expire_vouchers() == 1
    expiry = LedgerTransaction.objects.get(kind="voucher_expiry")
    services.reverse_transaction(expiry, reason="expired by mistake")
    voucher.refresh_from_db()
    assert voucher.balance == Decimal("20.00")
    billing_clock.advance(3600)
    assert services.expire_vouchers() == 1  # the first expiry's key must not block this one
    voucher.refresh_from_db()
    assert voucher.balance == 0
    assert LedgerTransaction.objects.filter(kind="voucher_expiry").count() == 2
    assert services.expire_vouchers() == 0
    assert_ledger_consistent()


def test_rentals_need_at_least_one_card_and_one_day(alice, prices) -> None:
    services.grant_voucher(alice, Decimal("100"), reason="t", valid_days=30)
    for cards, days in ((-8, 30), (0, 30), (8, 0), (8, -30)):
        with (
            translation.override("en"),
            pytest.raises(services.BillingError, match="at least one card and one day"),
        ):
            services.purchase_term(
                alice,
                gpu_model="RTX 4090",
                cards=cards,
                days=days,
                resource_kind="instance",
                resource_id="lt",
            )
    assert services.get_wallet_summary(alice).vouchers == Decimal("100.00")
    assert not LedgerTransaction.objects.filter(kind="term_purchase").exists()
    assert_ledger_consistent()


def test_usage_sessions_need_at_least_one_card(alice, bob, prices, billing_clock) -> None:
    for cards in (0, -8):
        with translation.override("en"), pytest.raises(services.BillingError, match="one card"):
            services.open_usage_session(
                alice, resource_kind="instance", resource_id="neg", gpu_model="A800", cards=cards
            )
    assert not UsageSession.objects.exists()
    services.grant_voucher(bob, Decimal("100"), reason="t", valid_days=30)
    services.open_usage_session(
        bob, resource_kind="instance", resource_id="ok", gpu_model="A800", cards=1
    )
    billing_clock.advance(3600)
    assert services.settle_usage().charged == Decimal("3.50")
