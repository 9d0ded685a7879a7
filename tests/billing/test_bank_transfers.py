"""对公转账: a top-up by bank transfer with a remittance code; an operator matches it by hand or
from a bank statement CSV; it credits exactly once (also when matched twice at once)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from billing import services
from billing.models import Account, Payment
from billing.transfers import services as transfers
from billing.transfers.models import BankTransfer
from tests.billing.conftest import assert_ledger_consistent
from tests.console.factories import UserFactory

API = "/api/v1/billing/top-ups/"


def _cash(user) -> Decimal:
    row = Account.objects.filter(wallet__team__personal_of=user, kind="cash").first()
    return row.balance if row else Decimal(0)


def _start(user, amount="2000.00") -> BankTransfer:
    payment, _ = services.start_topup(user, amount, provider="bank_transfer")
    return payment.bank_transfer


@pytest.mark.django_db
def test_the_customer_gets_a_remittance_code_by_api_and_form(alice, alice_client) -> None:
    api = APIClient()
    api.force_authenticate(alice)
    r = api.post(API, {"amount": "5000.00", "provider": "bank_transfer"}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["provider"] == "bank_transfer" and body["state"] == "pending"
    assert body["checkout_url"].endswith(f"/billing/transfers/{body['id']}/")
    code = BankTransfer.objects.get(payment__public_id=body["id"]).remittance_code
    assert transfers.CODE.fullmatch(code)
    page = alice_client.get(f"/billing/transfers/{body['id']}/").content.decode()
    assert code in page and ("5,000.00" in page or "5000.00" in page)
    overview = alice_client.get("/billing/").content.decode()
    assert 'id="bank-transfer-form"' in overview and 'action="/billing/transfers/"' in overview
    r = alice_client.post("/billing/transfers/", {"amount": "300"})
    assert r.status_code == 302 and "/billing/transfers/" in r["Location"]
    assert BankTransfer.objects.count() == 2
    # Nobody else reads it.
    other = UserFactory()
    api.force_authenticate(other)
    client = alice_client.__class__()
    client.force_login(other)
    assert client.get(f"/billing/transfers/{body['id']}/").status_code == 404


@pytest.mark.django_db
def test_an_unverified_account_is_refused_at_both_doors(client) -> None:
    user = UserFactory(verified=False)
    api = APIClient()
    api.force_authenticate(user)
    r = api.post(API, {"amount": "100", "provider": "bank_transfer"}, format="json")
    assert r.status_code == 403 and r.json()["error"] == "verification_required"
    client.force_login(user)
    assert client.post("/billing/transfers/", {"amount": "100"}).status_code == 403
    assert not Payment.objects.exists()


@pytest.mark.django_db
def test_an_operator_matches_by_hand_once(alice, operator_client) -> None:
    transfer = _start(alice)
    r = operator_client.post(
        "/ops/transfers/",
        {"code": transfer.remittance_code, "bank_reference": "B1", "amount": "1999"},
    )
    assert r.status_code == 302 and _cash(alice) == 0  # the wrong amount credits nothing
    operator_client.post(
        "/ops/transfers/",
        {"code": transfer.remittance_code.lower(), "bank_reference": "B1", "amount": "2,000.00"},
    )
    assert _cash(alice) == Decimal("2000.00")
    transfer.refresh_from_db()
    assert transfer.bank_reference == "B1" and transfer.matched_by is not None
    assert transfers.match(transfer.remittance_code, bank_reference="B1", amount="2000") is False
    assert _cash(alice) == Decimal("2000.00")
    with pytest.raises(services.BillingError):
        transfers.match("GC00000000", bank_reference="B9", amount="1")
    assert_ledger_consistent()


@pytest.mark.django_db
def test_a_statement_csv_credits_each_transfer_once(alice, bob, operator_client) -> None:
    a, b = _start(alice, "2000.00"), _start(bob, "750.50")
    statement = (
        "交易日期,流水号,金额,摘要\n"
        f"2026-03-02,R-1001,2000.00,货款 {a.remittance_code}\n"
        f"2026-03-02,R-1002,750.50,{b.remittance_code.lower()} 充值\n"
        "2026-03-02,R-1003,88.00,no code here\n"
    ).encode()
    r = operator_client.post(
        "/ops/transfers/", {"statement": SimpleUploadedFile("s.csv", statement, "text/csv")}
    )
    assert r.status_code == 200
    page = r.content.decode()
    assert page.count('data-outcome="credited"') == 2 and 'data-outcome="no_code"' in page
    assert _cash(alice) == Decimal("2000.00") and _cash(bob) == Decimal("750.50")
    again = transfers.import_statement(statement)
    assert [row.outcome for row in again] == ["already", "already", "no_code"]
    assert _cash(alice) == Decimal("2000.00") and _cash(bob) == Decimal("750.50")
    assert_ledger_consistent()


@pytest.mark.django_db
def test_a_statement_needs_its_columns() -> None:
    with pytest.raises(services.BillingError):
        transfers.import_statement(b"date,value\n2026-03-01,1\n")


@pytest.mark.django_db
def test_matching_needs_the_permission(alice) -> None:
    from django.test import Client

    staff = UserFactory(is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get("/ops/transfers/").status_code == 403


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_racing_matches_credit_once(sandbox_payments) -> None:
    """Hand matches and statement imports of one transfer, released together: one credit."""
    from tests.support.concurrency import race

    user = UserFactory()
    transfer = _start(user, "1234.56")
    statement = f"reference,amount,memo\nR-77,1234.56,{transfer.remittance_code}\n".encode()

    def work(i: int):
        if i % 2:
            return transfers.import_statement(statement)[0].outcome
        return transfers.match(transfer.remittance_code, bank_reference="R-77", amount="1234.56")

    results = race(8, work)
    credited = [r for r in results if r is True or r == "credited"]
    assert len(credited) == 1, results
    assert not [r for r in results if isinstance(r, Exception)], results
    assert _cash(user) == Decimal("1234.56")
    assert services.reconcile() == []


@pytest.mark.django_db
def test_an_unknown_code_names_itself() -> None:
    with pytest.raises(services.BillingError) as refused:
        transfers.match("gc00000000", bank_reference="B9", amount="1")
    assert refused.value.code == "invalid" and "GC00000000" in refused.value.message()
