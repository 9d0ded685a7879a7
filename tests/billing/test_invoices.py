"""发票: what can be invoiced (consumed cash only, to the cent, under random sequences), the
requests (普票 / 专票), the operator's issue with a real PDF, red-letter reversal, the refund rule
and the gate (403 ``verification_required`` at every door)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from decimal import Decimal

import pypdf
import pytest
from django.core import mail
from django.db import transaction
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from billing import clock, services
from billing.choices import AccountKind
from billing.invoicing import services as invoicing
from billing.invoicing.models import Invoice
from billing.invoicing.pdf import amount_in_words
from billing.models import Account
from console.verification.models import Verification
from tests.billing.conftest import assert_ledger_consistent
from tests.console.factories import UserFactory

API = "/api/v1/billing/invoices/"
CREDIT_CODE = "91350100M000100Y43"
TERM_PER_CARD_DAY = Decimal("43.20")  # RTX 4090, 1 day at 1.80 元/card-h (the seed)


@pytest.fixture(autouse=True)
def _private_dir(settings, tmp_path):
    settings.PRIVATE_FILES_DIR = tmp_path / "private"


def _topup(user, amount) -> None:
    payment, _ = services.start_topup(user, amount)
    services.confirm_payment(
        str(payment.public_id),
        provider="sandbox",
        provider_txn_id=f"t-{payment.pk}",
        amount=Decimal(amount),
    )


_rid = iter(range(10**6))


def _consume(user, cards: int = 1):
    """Spend cash (after vouchers and the trial credit): a 1-day rental paid up front."""
    return services.purchase_term(
        user,
        gpu_model="RTX 4090",
        cards=cards,
        days=1,
        resource_kind="instance",
        resource_id=f"r-{next(_rid)}",
    )


def _organisation(user) -> Verification:
    Verification.objects.filter(owner=user).delete()
    return Verification.objects.create(
        owner=user,
        kind="enterprise",
        state="approved",
        organisation_name="北京某某科技有限公司",
        credit_code=CREDIT_CODE,
        contact_name="李四",
        contact_phone="010-12345678",
    )


def _api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _pdf_text(data: bytes) -> str:
    return "".join(page.extract_text() for page in pypdf.PdfReader(io.BytesIO(data)).pages)


# --- the balance, under random sequences ---------------------------------------------------------
@dataclass
class Oracle:
    """An independent model of one wallet: buckets spent vouchers → trial → cash."""

    vouchers: Decimal = Decimal(0)
    trial: Decimal = Decimal(0)
    cash: Decimal = Decimal(0)
    consumed: Decimal = Decimal(0)
    returned: Decimal = Decimal(0)
    charges: list = field(default_factory=list)  # (txn, cash part, voucher part, trial part)
    topups: list = field(default_factory=list)  # ledger transactions of top-ups
    invoices: dict = field(default_factory=dict)  # public_id -> (amount, state)

    @property
    def invoiced(self) -> Decimal:
        return sum(
            (a for a, s in self.invoices.values() if s in ("requested", "issued")), Decimal(0)
        )

    @property
    def invoiceable(self) -> Decimal:
        debt = max(Decimal(0), -self.cash)
        return max(Decimal(0), self.consumed - self.returned - debt - self.invoiced)

    @property
    def refundable(self) -> Decimal:
        held = max(Decimal(0), self.invoiced - (self.consumed - self.returned))
        return max(Decimal(0), self.cash - held)

    def spend(self, total: Decimal) -> tuple[Decimal, Decimal, Decimal]:
        from_v = min(total, self.vouchers)
        from_t = min(total - from_v, self.trial)
        from_c = total - from_v - from_t
        self.vouchers -= from_v
        self.trial -= from_t
        self.cash -= from_c
        self.consumed += from_c
        return from_c, from_v, from_t


money = st.decimals(min_value="1", max_value="300", places=2)
# Each wallet starts with a top-up, so most sequences have cash to consume and invoice.
ops = st.one_of(
    st.tuples(st.just("topup"), money),
    st.tuples(st.just("voucher"), money),
    st.tuples(st.just("trial")),
    st.tuples(st.just("consume"), st.integers(1, 2)),
    st.tuples(st.just("consume"), st.integers(1, 2)),
    st.tuples(st.just("correct"), st.integers(0, 9)),
    st.tuples(st.just("reverse_topup"), st.integers(0, 9)),
    st.tuples(st.just("refund"), money),
    st.tuples(st.just("request"), st.none()),
    st.tuples(st.just("request"), st.decimals(min_value="0.50", max_value="90", places=2)),
    st.tuples(st.just("issue"), st.integers(0, 9)),
    st.tuples(st.just("issue"), st.integers(0, 9)),
    st.tuples(st.just("reject"), st.integers(0, 9)),
    st.tuples(st.just("reverse"), st.integers(0, 9)),
)


@pytest.mark.django_db
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(ops, min_size=1, max_size=30))
def test_invoiceable_reconciles_under_random_sequences(prices, steps) -> None:
    with clock.use_clock(clock.FrozenClock()), transaction.atomic():
        user = UserFactory()
        model = Oracle()
        for kind, *args in [("topup", Decimal("200")), *steps]:
            if kind == "topup":
                _topup(user, args[0])
                model.cash += args[0]
                model.topups.append(
                    services.get_or_create_wallet(user)
                    .transactions.filter(kind="topup")
                    .latest("id")
                )
            elif kind == "voucher":
                services.grant_voucher(user, args[0], reason="property", valid_days=30)
                model.vouchers += args[0]
            elif kind == "trial":
                if services.grant_trial_credit(user):
                    model.trial += services.TRIAL_CREDIT
            elif kind == "consume":
                total = TERM_PER_CARD_DAY * args[0]
                if model.vouchers + model.trial + model.cash < total:
                    with pytest.raises(services.InsufficientFunds):
                        _consume(user, args[0])
                    continue
                rental = _consume(user, args[0])
                model.charges.append((rental.transaction, *model.spend(total)))
            elif kind == "correct" and model.charges:
                txn, cash, vouchers, trial = model.charges.pop(args[0] % len(model.charges))
                services.reverse_transaction(txn, reason="property")
                model.cash += cash
                model.vouchers += vouchers
                model.trial += trial
                model.returned += cash
            elif kind == "reverse_topup" and model.topups:
                txn = model.topups.pop(args[0] % len(model.topups))
                services.reverse_transaction(txn, reason="property")
                model.cash -= _topup_amount(txn)
            elif kind == "refund":
                expected = args[0] <= model.cash and args[0] <= model.refundable
                try:
                    services.refund_cash(user, args[0], reason="property")
                except services.BillingError:
                    assert not expected, (args[0], model)
                    event("refund refused" + (" (invoiced cash)" if args[0] <= model.cash else ""))
                else:
                    assert expected, (args[0], model)
                    model.cash -= args[0]
                    event("refunded")
            elif kind == "request":
                wanted = model.invoiceable if args[0] is None else args[0]
                expected = Decimal("1.00") <= wanted <= model.invoiceable
                try:
                    row = invoicing.request_invoice(
                        user, kind="normal", title_type="personal", amount=args[0]
                    )
                except invoicing.InvoiceError:
                    assert not expected, (wanted, model)
                else:
                    assert expected and row.amount == wanted, (wanted, model)
                    event("invoice requested")
                    model.invoices[row.public_id] = (row.amount, "requested")
            elif kind in ("issue", "reject", "reverse") and model.invoices:
                ids = sorted(model.invoices)
                pid = ids[args[0] % len(ids)]
                amount, state = model.invoices[pid]
                allowed = {"issue": "requested", "reject": "requested", "reverse": "issued"}[kind]
                new = {"issue": "issued", "reject": "rejected", "reverse": "reversed"}[kind]
                try:
                    if kind == "issue":
                        invoicing.issue_invoice(pid, by=None)
                    elif kind == "reject":
                        invoicing.reject_request(pid, by=None, reason="property")
                    else:
                        invoicing.reverse_invoice(pid, by=None, reason="property")
                except invoicing.InvoiceError:
                    assert state != allowed
                else:
                    assert state == allowed
                    model.invoices[pid] = (amount, new)
                    event(f"invoice {new}")
            balance = invoicing.balance_for(user)
            assert balance.invoiceable == model.invoiceable, (kind, balance, model)
            assert balance.refundable == model.refundable, (kind, balance, model)
            cash = Account.objects.filter(
                wallet__team__personal_of=user, kind=AccountKind.CASH
            ).first()
            assert (cash.balance if cash else 0) == model.cash
        assert_ledger_consistent()
        assert services.reconcile() == []


def _topup_amount(txn) -> Decimal:
    return sum((e.amount for e in txn.entries.filter(account__kind="cash")), Decimal(0))


# --- the journeys --------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_person_requests_a_puipiao_an_operator_issues_it_the_pdf_downloads(
    prices, alice, alice_client, operator_client, django_capture_on_commit_callbacks
) -> None:
    services.grant_trial_credit(alice)  # never invoiceable
    services.grant_voucher(alice, Decimal("20"), reason="never invoiceable", valid_days=30)
    _topup(alice, "100")
    _consume(alice)  # 43.20: 20 voucher, 10 trial, 13.20 cash
    api = _api(alice)
    balance = api.get(f"{API}balance/").json()
    assert Decimal(balance["invoiceable"]) == Decimal("13.20")
    r = api.post(API, {"kind": "normal", "title_type": "personal"}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["state"] == "requested" and Decimal(body["amount"]) == Decimal("13.20")
    assert body["title"] == "Alice" and body["pdf_url"] is None
    assert Decimal(api.get(f"{API}balance/").json()["invoiceable"]) == 0
    # The operator's queue shows it; issuing renders the PDF and mails the customer.
    assert "13.20" in operator_client.get("/ops/invoices/").content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        r = operator_client.post(f"/ops/invoices/{body['id']}/issue/")
    assert r.status_code == 302
    row = Invoice.objects.get()
    assert row.state == "issued" and len(row.number) == 20
    assert len(mail.outbox) == 1 and row.number in mail.outbox[0].body
    page = alice_client.get("/billing/invoices/").content.decode()
    assert row.number in page
    pdf = b"".join(alice_client.get(f"/billing/invoices/{row.public_id}/pdf/").streaming_content)
    assert pdf.startswith(b"%PDF-") and b"/FontFile2" in pdf  # the Chinese font is embedded
    text = _pdf_text(pdf)
    assert "电子发票（普通发票）" in text and row.number in text and "Alice" in text
    assert "¥13.20" in text and amount_in_words(Decimal("13.20")) in text
    api_pdf = api.get(f"{API}{row.public_id}/pdf/")
    assert api_pdf.status_code == 200 and api_pdf["Content-Type"] == "application/pdf"
    # Nobody else reads it.
    bob_api = _api(UserFactory())
    assert bob_api.get(f"{API}{row.public_id}/pdf/").status_code == 404
    assert bob_api.get(f"{API}{row.public_id}/").status_code == 404


@pytest.mark.django_db
def test_a_zhuanpiao_is_for_verified_organisations_only(prices, alice) -> None:
    _topup(alice, "100")
    _consume(alice)
    r = _api(alice).post(API, {"kind": "special", "title_type": "organisation"}, format="json")
    assert r.status_code == 400 and "kind" in r.json()["fields"]
    _organisation(alice)
    r = _api(alice).post(API, {"kind": "special", "title_type": "organisation"}, format="json")
    assert r.status_code == 400 and "address_phone" in r.json()["fields"]
    r = _api(alice).post(
        API,
        {
            "kind": "special",
            "title_type": "organisation",
            "address_phone": "北京市海淀区某路1号 010-12345678",
            "bank_account": "中国银行北京分行 1234567890",
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    assert r.json()["title"] == "北京某某科技有限公司" and r.json()["tax_id"] == CREDIT_CODE
    row = invoicing.issue_invoice(r.json()["id"], by=None)
    text = _pdf_text(row.pdf.read())
    assert "增值税专用发票" in text and CREDIT_CODE in text and "中国银行北京分行" in text


@pytest.mark.django_db
def test_red_letter_reversal_frees_the_amount_and_the_refund_rule(prices, alice) -> None:
    _topup(alice, "100")
    rental = _consume(alice)  # 43.20 of cash consumed
    row = invoicing.request_invoice(alice, kind="normal", title_type="personal")
    invoicing.issue_invoice(row.public_id, by=None)
    # The charge is corrected (given back) after it was invoiced: the 43.20 is back in the cash,
    # but invoiced, so it cannot be refunded until the invoice is reversed.
    services.reverse_transaction(rental.transaction, reason="fault compensation")
    with pytest.raises(invoicing.InvoiceError) as refused:
        services.refund_cash(alice, Decimal("100"), reason="leaving")
    assert "43.20" in refused.value.message()
    services.refund_cash(alice, Decimal("56.80"), reason="leaving")
    with pytest.raises(invoicing.InvoiceError):
        invoicing.reverse_invoice(row.public_id, by=None, reason="")
    reversed_ = invoicing.reverse_invoice(row.public_id, by=None, reason="charge corrected")
    assert reversed_.state == "reversed" and reversed_.red_number != reversed_.number
    text = _pdf_text(reversed_.red_pdf.read())
    assert "红字" in text and reversed_.number in text and "¥-43.20" in text
    services.refund_cash(alice, Decimal("43.20"), reason="leaving")
    assert invoicing.balance_for(alice).refundable == 0
    with pytest.raises(invoicing.InvoiceError):  # reversed once
        invoicing.reverse_invoice(row.public_id, by=None, reason="again")
    assert_ledger_consistent()


@pytest.mark.django_db
def test_reversal_makes_the_amount_invoiceable_again(prices, alice, operator_client) -> None:
    _topup(alice, "100")
    _consume(alice)
    row = invoicing.request_invoice(alice, kind="normal", title_type="personal")
    operator_client.post(f"/ops/invoices/{row.public_id}/issue/")
    assert invoicing.balance_for(alice).invoiceable == 0
    operator_client.post(f"/ops/invoices/{row.public_id}/reverse/", {"reason": "wrong title"})
    row.refresh_from_db()
    assert row.state == "reversed"
    assert invoicing.balance_for(alice).invoiceable == Decimal("43.20")
    again = invoicing.request_invoice(
        alice, kind="normal", title_type="personal", title="Alice Chen"
    )
    operator_client.post(f"/ops/invoices/{again.public_id}/reject/", {"reason": "duplicate"})
    again.refresh_from_db()
    assert again.state == "rejected" and invoicing.balance_for(alice).invoiceable == Decimal(
        "43.20"
    )


@pytest.mark.django_db
def test_the_minimum_is_a_setting(prices, alice, settings) -> None:
    _topup(alice, "100")
    _consume(alice)
    settings.INVOICE_MIN_AMOUNT = "500.00"
    with pytest.raises(invoicing.InvoiceError) as refused:
        invoicing.request_invoice(alice, kind="normal", title_type="personal")
    assert refused.value.field == "amount" and "500.00" in refused.value.message()


@pytest.mark.django_db
def test_every_invoice_door_refuses_an_unverified_account(prices, client) -> None:
    user = UserFactory(verified=False)
    r = _api(user).post(API, {"kind": "normal", "title_type": "personal"}, format="json")
    assert r.status_code == 403 and r.json()["error"] == "verification_required"
    client.force_login(user)
    r = client.post("/billing/invoices/", {"kind": "normal", "title_type": "personal"})
    assert r.status_code == 403 and 'data-error="verification_required"' in r.content.decode()
    assert not Invoice.objects.exists()


@pytest.mark.django_db
def test_customers_cannot_reach_the_operator_pages(alice_client) -> None:
    assert alice_client.get("/ops/invoices/").status_code == 403


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_never_invoice_the_same_cash_twice(prices, sandbox_payments) -> None:
    """Rounds of 12 requests released together for the whole invoiceable amount: one wins each
    round (the wallet lock), the others see nothing left to invoice."""
    from tests.support.concurrency import race

    user = UserFactory()
    _topup(user, "1000")
    for _round in range(4):
        _consume(user, 2)  # 86.40 more to invoice
        results = race(
            12, lambda i: invoicing.request_invoice(user, kind="normal", title_type="personal")
        )
        won = [r for r in results if isinstance(r, Invoice)]
        assert len(won) == 1, results
        assert all(isinstance(r, invoicing.InvoiceError) for r in results if r not in won), results
        assert invoicing.balance_for(user).invoiceable == 0
    assert sum(i.amount for i in Invoice.objects.all()) == Decimal("345.60")
