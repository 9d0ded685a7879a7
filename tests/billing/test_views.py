from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest
from django.urls import reverse

from billing import services
from billing.models import Payment, Wallet
from billing.providers.sandbox import SIGNATURE_HEADER, SandboxProvider, sign
from tests.billing.conftest import assert_ledger_consistent

pytestmark = pytest.mark.django_db


def _pay(client, amount: str) -> Payment:
    response = client.post(reverse("billing:topup"), {"amount": amount})
    assert response.status_code == 302
    payment = Payment.objects.get()
    assert response.url == reverse("billing:sandbox-checkout", args=[payment.public_id])
    assert client.get(response.url).status_code == 200
    assert client.post(response.url, {"outcome": "pay"}).status_code == 302
    payment.refresh_from_db()
    return payment


def test_top_up_through_the_sandbox_checkout(alice, alice_client, prices) -> None:
    payment = _pay(alice_client, "250.00")
    assert payment.state == "succeeded"
    assert services.get_wallet_summary(alice).cash == Decimal("250.00")
    # a second click on "pay" credits nothing more
    alice_client.post(
        reverse("billing:sandbox-checkout", args=[payment.public_id]), {"outcome": "pay"}
    )
    assert services.get_wallet_summary(alice).cash == Decimal("250.00")
    page = alice_client.get(reverse("billing:overview"))
    assert "250.00 元" in page.content.decode()
    assert_ledger_consistent()


def test_a_large_top_up_earns_the_five_percent_voucher_in_the_same_transaction(
    alice,
    alice_client,
    prices,
) -> None:
    payment = _pay(alice_client, "100000.00")
    summary = services.get_wallet_summary(alice)
    assert summary.cash == Decimal("100000.00")
    assert summary.vouchers == Decimal("5000.00")
    kinds = sorted(e.account.kind for e in payment.transaction.entries.select_related("account"))
    assert kinds == ["cash", "payments", "promotions", "voucher"]
    assert_ledger_consistent()


def test_below_the_threshold_no_voucher(alice, alice_client, prices) -> None:
    _pay(alice_client, "99999.99")
    assert services.get_wallet_summary(alice).vouchers == Decimal("0.00")


def _webhook(client, body: bytes, signature: str):
    return client.post(
        reverse("billing:sandbox-webhook"),
        data=body,
        content_type="application/json",
        headers={SIGNATURE_HEADER: signature},
    )


def test_webhook_rejects_bad_signatures_and_credits_replays_once(alice, client, prices) -> None:
    payment, _ = services.start_topup(alice, "80.00")
    body, headers = SandboxProvider().build_callback(payment)
    forged = json.dumps({**json.loads(body), "amount": "80.00", "txn": "x"}).encode()
    assert _webhook(client, forged, headers[SIGNATURE_HEADER]).status_code == 400
    assert _webhook(client, body, sign(body, secret=b"wrong")).status_code == 400
    assert _webhook(client, body, "").status_code == 400
    stale = sign(body, int(time.time()) - 3600)
    assert _webhook(client, body, stale).status_code == 400
    assert services.get_wallet_summary(alice).cash == Decimal("0.00")
    first = _webhook(client, body, headers[SIGNATURE_HEADER])
    again = _webhook(client, body, sign(body))
    assert first.json() == {"ok": True, "credited": True}
    assert again.json() == {"ok": True, "credited": False}
    assert services.get_wallet_summary(alice).cash == Decimal("80.00")
    assert Payment.objects.get().provider_txn_id == f"sbx_{payment.public_id.hex}"


def test_webhook_with_a_wrong_amount_is_refused(alice, client, prices) -> None:
    payment, _ = services.start_topup(alice, "80.00")
    body = json.dumps(
        {"payment": str(payment.public_id), "txn": "t", "amount": "8000.00", "status": "succeeded"}
    ).encode()
    assert _webhook(client, body, sign(body)).status_code == 400
    assert services.get_wallet_summary(alice).cash == Decimal("0.00")


def test_another_customers_checkout_is_404(alice, bob_client, prices) -> None:
    payment, _ = services.start_topup(alice, "10.00")
    url = reverse("billing:sandbox-checkout", args=[payment.public_id])
    assert bob_client.get(url).status_code == 404
    assert bob_client.post(url, {"outcome": "pay"}).status_code == 404
    payment.refresh_from_db()
    assert payment.state == "pending"


def _usage(user, n: int, clock) -> None:
    services.grant_voucher(user, Decimal("1000"), reason="test", valid_days=30)
    for i in range(n):
        services.open_usage_session(
            user,
            resource_kind="instance",
            resource_id=f"{user.username}-{i}",
            gpu_model="A800",
            cards=8,
            label=f"job {i}",
        )
        clock.advance(61)
        services.settle_usage()


def test_overview_query_count_does_not_grow_with_rows(
    alice,
    alice_client,
    prices,
    billing_clock,
    django_assert_max_num_queries,
) -> None:
    _usage(alice, 3, billing_clock)
    with django_assert_max_num_queries(20) as few:
        alice_client.get(reverse("billing:overview"))
    _usage(alice, 30, billing_clock)
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = alice_client.get(reverse("billing:overview"))
    assert response.status_code == 200


def test_htmx_pagination_returns_only_the_partial(
    alice, alice_client, prices, billing_clock
) -> None:
    _usage(alice, 25, billing_clock)
    response = alice_client.get(
        reverse("billing:overview") + "?tx_page=2", headers={"HX-Request": "true"}
    )
    text = response.content.decode()
    assert 'id="billing-transactions"' in text and "<html" not in text
    usage = alice_client.get(
        reverse("billing:overview") + "?usage_page=2", headers={"HX-Request": "true"}
    )
    assert 'id="billing-usage"' in usage.content.decode()


def test_other_customers_never_see_my_rows(alice, bob_client, prices, billing_clock) -> None:
    _usage(alice, 2, billing_clock)
    for name in (
        "billing:overview",
        "billing:usage-csv",
        "billing:statement",
        "billing:statement-csv",
    ):
        text = bob_client.get(reverse(name)).content.decode()
        assert "alice-0" not in text and "job 0" not in text


def test_statement_reconciles_and_exports_csv(alice, alice_client, prices, billing_clock) -> None:
    _usage(alice, 2, billing_clock)
    month = billing_clock.now().strftime("%Y-%m")
    page = alice_client.get(reverse("billing:statement"), {"month": month})
    assert page.status_code == 200
    statement = page.context["statement"]
    assert statement.opening + sum(line.amount for line in statement.lines) == statement.closing
    assert statement.closing == services.get_wallet_summary(alice).spendable
    assert statement.usage_total == sum(u.amount for u in statement.usage) > 0
    csv_text = alice_client.get(reverse("billing:statement-csv"), {"month": month}).content.decode()
    assert csv_text.count("\n") == len(statement.lines) + 3
    usage_csv = alice_client.get(reverse("billing:usage-csv")).content.decode()
    assert "alice-1" in usage_csv
    assert alice_client.get(reverse("billing:statement"), {"month": "2026-13"}).status_code == 400


def test_quote_page(alice_client, prices) -> None:
    response = alice_client.get(
        reverse("billing:quote"), {"gpu_model": "RTX 4090", "cards": 8, "disk_gb": 0}
    )
    assert "15.20 元" in response.content.decode()
    assert "6,912.00 元" in response.content.decode()


def test_no_wallet_yet_renders_empty_page(bob_client, prices) -> None:
    response = bob_client.get(reverse("billing:overview"))
    assert response.status_code == 200
    assert not Wallet.objects.exists()


def test_cancelled_checkout_credits_nothing(alice, alice_client, prices) -> None:
    alice_client.post(reverse("billing:topup"), {"amount": "42.00"})
    payment = Payment.objects.get()
    alice_client.post(
        reverse("billing:sandbox-checkout", args=[payment.public_id]), {"outcome": "fail"}
    )
    payment.refresh_from_db()
    assert payment.state == "failed"
    assert services.get_wallet_summary(alice).cash == Decimal("0.00")
    # paying a failed payment afterwards does nothing either
    alice_client.post(
        reverse("billing:sandbox-checkout", args=[payment.public_id]), {"outcome": "pay"}
    )
    assert services.get_wallet_summary(alice).cash == Decimal("0.00")


def test_bad_top_up_amounts_change_nothing(alice_client, prices) -> None:
    for amount in ("0", "-5", "abc", "1.001", "99999999999"):
        response = alice_client.post(reverse("billing:topup"), {"amount": amount})
        assert response.status_code == 302 and response.url == reverse("billing:overview")
    assert not Payment.objects.exists()


def test_one_provider_transaction_cannot_pay_two_payments(alice, client, prices) -> None:
    first, _ = services.start_topup(alice, "10.00")
    second, _ = services.start_topup(alice, "10.00")
    for payment, expected in ((first, 200), (second, 400)):
        body = json.dumps(
            {
                "payment": str(payment.public_id),
                "txn": "same-txn",
                "amount": "10.00",
                "status": "succeeded",
            }
        ).encode()
        assert _webhook(client, body, sign(body)).status_code == expected
    assert services.get_wallet_summary(alice).cash == Decimal("10.00")
    second.refresh_from_db()
    assert second.state == "pending"
    assert_ledger_consistent()


def test_garbage_signatures_are_400_not_500(alice, client, prices) -> None:
    payment, _ = services.start_topup(alice, "80.00")
    body, _headers = SandboxProvider().build_callback(payment)
    now = int(time.time())
    for signature in (
        f"t={now},v1=\u00e9\u00e9\u00e9",  # non-ASCII (latin-1 in the WSGI environ)
        f"t={now},v1={'ä' * 64}",
        f"t={now},v1={'A' * 64}",
        f"t={now},v1=xyz",
        f"t={'9' * 400},v1={'a' * 64}",
        "garbage",
    ):
        response = _webhook(client, body, signature)
        assert response.status_code == 400, signature
        assert response.json()["error"] == "bad_signature"
    assert services.get_wallet_summary(alice).cash == Decimal("0.00")


def test_a_signed_body_with_garbage_fields_is_400_not_500(alice, client, prices) -> None:
    payment, _ = services.start_topup(alice, "80.00")
    good = {"payment": str(payment.public_id), "txn": "t", "amount": "80.00", "status": "succeeded"}
    for changes in (
        {"payment": "not-a-uuid"},
        {"payment": 12},
        {"amount": "Infinity"},
        {"amount": "1e999999"},
    ):
        body = json.dumps({**good, **changes}).encode()
        response = _webhook(client, body, sign(body))
        assert response.status_code == 400, changes
        assert response.json() == {"error": "malformed_body", "detail": "malformed body"}
    for body in (b"[]", b'"x"', b"not json"):
        assert _webhook(client, body, sign(body)).status_code == 400
    assert services.get_wallet_summary(alice).cash == Decimal("0.00")


@pytest.mark.parametrize("month", ["0000-01", "9999-12", "1999-12", "2100-01"])
def test_statement_months_out_of_range_are_400(alice_client, month: str) -> None:
    assert alice_client.get(reverse("billing:statement"), {"month": month}).status_code == 400
    assert alice_client.get(reverse("billing:statement-csv"), {"month": month}).status_code == 400


def test_statement_months_at_the_edges_of_the_range(alice_client) -> None:
    for month in ("2000-01", "2099-12"):
        assert alice_client.get(reverse("billing:statement"), {"month": month}).status_code == 200


def test_a_success_after_a_recorded_failure_is_credited_once(alice, client, prices) -> None:
    payment, _ = services.start_topup(alice, "80.00")
    provider = SandboxProvider()
    failed, failed_headers = provider.build_callback(payment, "failed")
    assert _webhook(client, failed, failed_headers[SIGNATURE_HEADER]).json()["credited"] is False
    payment.refresh_from_db()
    assert payment.state == "failed"
    body, headers = provider.build_callback(payment)  # the provider captured the money after all
    assert _webhook(client, body, headers[SIGNATURE_HEADER]).json() == {
        "ok": True,
        "credited": True,
    }
    assert _webhook(client, body, sign(body)).json() == {"ok": True, "credited": False}
    assert _webhook(client, failed, sign(failed)).json() == {"ok": True, "credited": False}
    payment.refresh_from_db()
    assert payment.state == "succeeded" and payment.transaction is not None
    assert services.get_wallet_summary(alice).cash == Decimal("80.00")
    assert services.reconcile() == []
    assert_ledger_consistent()
