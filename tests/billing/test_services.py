from __future__ import annotations

from decimal import Decimal

import pytest

from billing import services
from billing.choices import AccountKind, CloseReason, UsageState
from billing.models import Account, LedgerTransaction, UsageCharge, UsageSession
from tests.billing.conftest import assert_ledger_consistent

pytestmark = pytest.mark.django_db


def test_trial_credit_is_granted_once(alice) -> None:
    assert services.grant_trial_credit(alice) is True
    assert services.grant_trial_credit(alice) is False
    summary = services.get_wallet_summary(alice)
    assert summary.trial == Decimal("10.00")
    assert summary.cash == Decimal("0.00")
    assert summary.spendable == Decimal("10.00")
    assert_ledger_consistent()


def test_summary_of_a_user_without_wallet_is_zero(bob) -> None:
    assert services.get_wallet_summary(bob) == services.WalletSummary()


def test_per_second_session_spends_vouchers_then_trial_then_cash(
    alice,
    prices,
    billing_clock,
) -> None:
    services.grant_trial_credit(alice)
    services.grant_voucher(alice, Decimal("5.00"), reason="compensation", valid_days=30)
    services.grant_voucher(alice, Decimal("3.00"), reason="soon", valid_days=1)
    payment, _ = services.start_topup(alice, "100.00")
    assert services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="t1", amount=Decimal("100.00")
    )
    session = services.open_usage_session(
        alice, resource_kind="instance", resource_id="i-1", gpu_model="RTX 4090", cards=8
    )
    assert (
        services.open_usage_session(
            alice, resource_kind="instance", resource_id="i-1", gpu_model="RTX 4090", cards=8
        )
        == session
    )
    billing_clock.advance(3600)
    services.settle_usage()  # 15.20 元: 3 (soon voucher) + 5 (voucher) + 7.20 trial
    summary = services.get_wallet_summary(alice)
    assert summary.vouchers == Decimal("0.00")
    assert summary.trial == Decimal("2.80")
    assert summary.cash == Decimal("100.00")
    billing_clock.advance(1800)
    closed = services.close_usage_session("instance", "i-1")
    assert closed.state == UsageState.CLOSED and closed.close_reason == CloseReason.RELEASED
    assert closed.settled_seconds == 5400 and closed.charged == Decimal("22.80")
    summary = services.get_wallet_summary(alice)
    assert summary.trial == Decimal("0.00") and summary.cash == Decimal("95.20")
    assert services.close_usage_session("instance", "i-1") is None
    assert_ledger_consistent()


def test_settling_twice_at_the_same_second_charges_once(alice, prices, billing_clock) -> None:
    services.grant_trial_credit(alice)
    services.open_usage_session(
        alice, resource_kind="instance", resource_id="i-2", gpu_model="A800", cards=1
    )
    billing_clock.advance(60)
    first = services.settle_usage()
    second = services.settle_usage()
    assert first.charged == Decimal("0.06") and second.charged == 0
    assert UsageCharge.objects.count() == 1
    assert_ledger_consistent()


def test_cumulative_settlement_equals_one_shot(alice, prices, billing_clock) -> None:
    services.grant_voucher(alice, Decimal("1000"), reason="test", valid_days=30)
    services.open_usage_session(
        alice, resource_kind="instance", resource_id="i-3", gpu_model="RTX 4090", cards=8
    )
    for _ in range(180):
        billing_clock.advance(60)
        services.settle_usage()
    session = UsageSession.objects.get()
    assert session.charged == Decimal("45.60")


def test_running_out_stops_the_session_and_calls_the_hook(
    alice,
    prices,
    billing_clock,
    stop_requests: list[tuple[str, str, str]],
    django_capture_on_commit_callbacks,
) -> None:
    services.grant_trial_credit(alice)  # 10 元 at 15.20 元/h: 39 minutes
    services.open_usage_session(
        alice, resource_kind="instance", resource_id="i-4", gpu_model="RTX 4090", cards=8
    )
    for _ in range(45):
        billing_clock.advance(60)
        with django_capture_on_commit_callbacks(execute=True):
            services.settle_usage()
    assert stop_requests == [("instance", "i-4", "insufficient_funds")]
    session = UsageSession.objects.get()
    assert session.state == UsageState.CLOSED
    assert session.close_reason == CloseReason.INSUFFICIENT_FUNDS
    trial = Account.objects.get(kind=AccountKind.TRIAL)
    cash = Account.objects.get(kind=AccountKind.CASH)
    assert trial.balance + cash.balance >= -Decimal("0.26")  # one minute of 15.20 元/h
    assert LedgerTransaction.objects.filter(kind="usage").count() >= 38
    assert alice.personal_team.wallet.notices.filter(kind="low_balance").count() == 1
    assert_ledger_consistent()


def test_an_order_the_balance_cannot_run_for_the_minimum_runway_is_refused(
    alice, prices, settings
) -> None:
    with pytest.raises(services.InsufficientFunds):
        services.ensure_affordable(alice, "A800", 8)
    services.grant_trial_credit(alice)  # 10 元 runs 8 × A800 (28 元/h) for 21 minutes
    with pytest.raises(services.InsufficientFunds) as refused:  # not the hour an order needs
        services.ensure_affordable(alice, "A800", 8)
    assert refused.value.params["needed"] == Decimal("28.00")
    assert refused.value.params["shortfall"] == Decimal("18.00")
    settings.ORDER_MIN_RUNWAY_SECONDS = 1200
    assert services.ensure_affordable(alice, "A800", 8).runway_seconds == 1285
    with pytest.raises(services.PriceNotSet):
        services.ensure_affordable(alice, "V100", 1)


def test_get_open_session_finds_only_what_bills_now(alice, prices, billing_clock) -> None:
    session = services.open_usage_session(
        alice, resource_kind="disk", resource_id="d-1", meter="disk", cards=500
    )
    assert services.get_open_session("disk", "d-1") == session
    assert services.get_open_session("disk", "d-2") is None
    services.close_usage_session("disk", "d-1")
    assert services.get_open_session("disk", "d-1") is None
