"""A bucket spent down in steps reaches exactly 0 (SQLite adds NUMERIC in floating point: without
rounding each posting, 100 − 43.20 − 43.20 left 13.599999999999994, and spending the 13.60 the
wallet showed broke the voucher's CHECK balance >= 0 with an IntegrityError)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing import services
from billing.models import Account
from tests.billing.conftest import assert_ledger_consistent

pytestmark = pytest.mark.django_db


def test_a_voucher_spent_in_steps_reaches_zero(prices, alice) -> None:
    voucher = services.grant_voucher(alice, Decimal("100"), reason="steps", valid_days=30)
    payment, _ = services.start_topup(alice, "50")
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="steps", amount=Decimal("50")
    )
    for i in range(3):  # 43.20 each: the third takes the voucher's last 13.60 and 29.60 of cash
        services.purchase_term(
            alice,
            gpu_model="RTX 4090",
            cards=1,
            days=1,
            resource_kind="instance",
            resource_id=f"s{i}",
        )
    voucher.refresh_from_db()
    assert voucher.balance == 0
    cash = Account.objects.get(wallet__team__personal_of=alice, kind="cash")
    assert cash.balance == Decimal("20.40")
    assert_ledger_consistent()
