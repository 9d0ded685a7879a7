"""Ledger memos are a code and parameters, rendered in the reader's language; old text still shows."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone, translation

from billing import clock, services
from billing.choices import MemoCode, TransactionKind
from billing.models import LedgerTransaction, TopUpBonusRule
from console.models import User
from tests.billing.factories import open_session

pytestmark = pytest.mark.django_db


def _open_and_settle(user: User, billing_clock: clock.FrozenClock) -> None:
    services.grant_trial_credit(user)
    open_session(user)
    billing_clock.advance(120)
    services.settle_usage()


def test_memos_are_stored_as_codes_with_parameters(alice: User, prices, billing_clock) -> None:
    _open_and_settle(alice, billing_clock)
    trial = LedgerTransaction.objects.get(kind=TransactionKind.TRIAL_GRANT)
    usage = LedgerTransaction.objects.get(kind=TransactionKind.USAGE)
    assert (trial.memo_code, trial.memo_params, trial.memo) == (MemoCode.TRIAL_CREDIT, {}, "")
    at = billing_clock.now().strftime("%Y-%m-%d %H:%M:%S UTC")
    assert (usage.memo_code, usage.memo_params, usage.memo) == (MemoCode.USAGE, {"at": at}, "")
    # Stored in UTC, shown in the reader's time zone (the page's: Asia/Shanghai by default).
    local = timezone.localtime(billing_clock.now()).strftime("%Y-%m-%d %H:%M:%S")
    assert local != at.removesuffix(" UTC")
    with translation.override("en"):
        assert usage.description == f"Usage up to {local}"
    with translation.override("zh-hans"):
        assert usage.description == f"截至 {local} 的用量"


def test_pages_and_csv_render_memos_in_the_readers_language(
    alice: User, alice_client: Client, prices, billing_clock
) -> None:
    _open_and_settle(alice, billing_clock)
    page = alice_client.get(reverse("billing:overview"), HTTP_ACCEPT_LANGUAGE="en")
    assert "Trial credit for a new verified account" in page.content.decode()
    page = alice_client.get(reverse("billing:overview"), HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert "新用户验证邮箱赠送体验金" in page.content.decode()
    month = billing_clock.now().strftime("%Y-%m")
    for language, expected in (("en", "Usage up to "), ("zh-hans", "的用量")):
        response = alice_client.get(
            reverse("billing:statement-csv"), {"month": month}, HTTP_ACCEPT_LANGUAGE=language
        )
        rows = list(csv.reader(io.StringIO(response.content.decode("utf-8-sig"))))
        descriptions = [row[3] for row in rows[2:-1]]
        assert any(expected in d for d in descriptions), descriptions


def test_the_api_sends_the_code_its_parameters_and_the_rendered_memo(
    alice: User, alice_client: Client, prices, billing_clock
) -> None:
    services.grant_trial_credit(alice)
    services.start_topup(alice, "100")  # pending: no ledger transaction yet
    response = alice_client.get("/api/v1/billing/transactions/", HTTP_ACCEPT_LANGUAGE="en")
    (row,) = response.json()["results"]
    assert row["memo_code"] == "trial_credit" and row["memo_params"] == {}
    assert row["memo"] == "Trial credit for a new verified account"


def test_free_text_and_memos_written_before_codes_still_display(
    alice: User, operator: User, alice_client: Client, prices, billing_clock
) -> None:
    services.grant_voucher(alice, Decimal("5"), reason="sorry for the outage", by=operator)
    wallet = services.get_or_create_wallet(alice)
    old = LedgerTransaction.objects.create(
        kind=TransactionKind.TOPUP,
        wallet=wallet,
        memo="Top-up via sandbox",  # a row from before memo codes: text only
        created_at=clock.now(),
    )
    assert old.description == "Top-up via sandbox"
    html = alice_client.get(reverse("billing:overview"), HTTP_ACCEPT_LANGUAGE="zh-hans").content
    assert "sorry for the outage" in html.decode() and "Top-up via sandbox" in html.decode()


def test_a_bonus_top_up_memo_names_provider_percent_and_amount(
    alice: User, prices, sandbox_payments
) -> None:
    TopUpBonusRule.objects.update(active=False)
    TopUpBonusRule.objects.create(threshold=Decimal("100"), percent=Decimal("10"), active=True)
    payment, _created = services.start_topup(alice, "200", provider="sandbox")
    services.confirm_payment(
        payment.public_id, provider="sandbox", provider_txn_id="memo-bonus", amount=Decimal("200")
    )
    txn = LedgerTransaction.objects.get(kind=TransactionKind.TOPUP)
    assert txn.memo_code == MemoCode.TOPUP_BONUS
    assert txn.memo_params == {"provider": "sandbox", "percent": "10", "amount": "200.00"}
    with translation.override("en"):
        assert txn.description == (
            "Top-up via sandbox (test payments); 10 % voucher for a top-up of 200.00 元"
        )
