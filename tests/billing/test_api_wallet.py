"""The wallet endpoint every API client polls (issue 22) reads the accounts once: its balances,
burn and runway are ``get_wallet_summary``'s to the cent, its voucher list the spendable vouchers
soonest-expiring first (not an expired or spent one, not another customer's), in three queries."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from billing import services
from billing.models import Account

pytestmark = pytest.mark.django_db
URL = "/api/v1/billing/wallet/"


def _api(user) -> APIClient:  # noqa: ANN001
    api = APIClient()
    api.force_authenticate(user)
    return api


def _expected(user) -> dict:  # noqa: ANN001
    summary = services.get_wallet_summary(user)
    money = {
        "cash": summary.cash,
        "trial": summary.trial,
        "vouchers": summary.vouchers,
        "spendable": summary.spendable,
    }
    return {
        **{k: f"{v:.2f}" for k, v in money.items()},
        "burn_per_hour": f"{summary.burn_per_hour:.4f}",
        "runway_seconds": summary.runway_seconds,
        "open_sessions": summary.open_sessions,
    }


def test_the_wallet_is_the_summary_and_its_spendable_vouchers(
    alice, bob, prices, billing_clock
) -> None:
    api = _api(alice)
    empty = api.get(URL).json()
    assert empty == {**_expected(alice), "voucher_list": []} and empty["spendable"] == "0.00"

    services.grant_trial_credit(alice)
    late = services.grant_voucher(alice, Decimal("30"), reason="late", valid_days=30)
    soon = services.grant_voucher(alice, Decimal("5.5"), reason="soon", valid_days=2)
    lapsing = services.grant_voucher(alice, Decimal("7"), reason="lapsing", valid_days=1)
    services.grant_voucher(bob, Decimal("99"), reason="bob's", valid_days=1)
    payment, _ = services.start_topup(alice, Decimal("100"), provider="sandbox")
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="t1", amount=payment.amount
    )
    Account.objects.filter(pk=soon.pk).update(balance=Decimal("0"))  # spent
    for resource, cards in (("i-1", 2), ("i-2", 1)):
        services.open_usage_session(
            alice, resource_kind="instance", resource_id=resource, gpu_model="RTX4090", cards=cards
        )
    billing_clock.advance(hours=25)  # the one-day voucher has expired

    with CaptureQueriesContext(connection) as ctx:
        body = api.get(URL).json()
    assert len(ctx.captured_queries) == 2  # the accounts, the open sessions (no token here)
    vouchers = body.pop("voucher_list")
    assert body == _expected(alice)
    assert body["cash"] == "100.00" and body["trial"] == "10.00" and body["vouchers"] == "30.00"
    assert body["open_sessions"] == 2 and Decimal(body["burn_per_hour"]) > 0
    assert [v["id"] for v in vouchers] == [str(late.public_id)]
    assert vouchers[0] == {
        "id": str(late.public_id),
        "balance": "30.00",
        "granted": "30.00",
        "expires_at": vouchers[0]["expires_at"],
        "reason": "late",
    }
    assert str(lapsing.public_id) not in str(vouchers)

    billing_clock.advance(hours=-25)  # before the expiry: both unspent vouchers, soonest first
    vouchers = api.get(URL).json()["voucher_list"]
    assert [v["reason"] for v in vouchers] == ["lapsing", "late"]
