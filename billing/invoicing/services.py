"""发票: what a customer may invoice, requests, the operator's issue and red-letter reversal.

The rule (one place, used by the requests and by ``billing.services.refund_cash``):

* **consumed** — cash charged for usage and long-term rentals (the cash legs of ``usage`` and
  ``term_purchase`` transactions); vouchers and the trial credit never count;
* **returned** — of it, what corrections gave back (reversals of those transactions: the
  "refunded" consumption);
* **debt** — consumption not paid yet (the cash balance below zero);
* **invoiced** — invoices requested or issued (a rejected request or a reversed invoice frees
  its amount).

``invoiceable = consumed − returned − debt − invoiced`` (never below 0). Cash that was invoiced
but is back in the balance (a charge corrected after it was invoiced) cannot be refunded until
the invoice is reversed: ``refundable = cash − max(0, invoiced − (consumed − returned))``.

Every request takes the wallet lock first and reads the balance under it, so two requests never
invoice the same cash; a reversal takes it too (it changes what a refund may pay).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.mail import send_mail
from django.db import transaction
from django.http import Http404
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, override

from billing import clock
from billing.choices import AccountKind, TransactionKind
from billing.errors import BillingError
from billing.invoicing import pdf
from billing.invoicing.models import (
    HOLDING_STATES,
    Invoice,
    InvoiceKind,
    InvoiceState,
    TitleType,
)
from billing.ledger import get_or_create_wallet, lock_wallet
from billing.models import Account, Entry, Wallet
from billing.money import ZERO, round_cents, to_decimal
from console.audit import services as audit
from console.errors import ErrorCode
from console.ids import uuid_or_404
from console.notices import services as notices
from console.tenancy import contact, team_of, user_of
from console.verification.checks import credit_code_valid, normalize
from console.verification.services import require_verified, verified

if TYPE_CHECKING:
    from console.models import User

logger = logging.getLogger(__name__)

SPEND_KINDS = (TransactionKind.USAGE, TransactionKind.TERM_PURCHASE)
KIND_LABELS = {
    InvoiceKind.NORMAL: "电子发票（普通发票）",
    InvoiceKind.SPECIAL: "电子发票（增值税专用发票）",
}


class InvoiceError(BillingError):
    code = ErrorCode.INVALID


@dataclass(frozen=True)
class InvoiceBalance:
    consumed: Decimal = ZERO
    returned: Decimal = ZERO
    debt: Decimal = ZERO
    invoiced: Decimal = ZERO
    cash: Decimal = ZERO

    @property
    def invoiceable(self) -> Decimal:
        return max(ZERO, self.consumed - self.returned - self.debt - self.invoiced)

    @property
    def held_cash(self) -> Decimal:
        """Invoiced cash that is back in the balance (not consumed any more)."""
        return max(ZERO, self.invoiced - (self.consumed - self.returned))

    @property
    def refundable(self) -> Decimal:
        return max(ZERO, self.cash - self.held_cash)


def invoice_balance(wallet: Wallet | None) -> InvoiceBalance:
    """The wallet's invoice balance, summed in Python (SQLite sums in floating point). Read it
    under the wallet lock to act on it."""
    if wallet is None:
        return InvoiceBalance()
    cash = Account.objects.get(wallet=wallet, kind=AccountKind.CASH)
    consumed = returned = ZERO
    rows = Entry.objects.filter(account=cash).values_list(
        "amount", "transaction__kind", "transaction__reverses__kind"
    )
    for amount, kind, reversed_kind in rows:
        if kind in SPEND_KINDS:
            consumed -= amount
        elif kind == TransactionKind.REVERSAL and reversed_kind in SPEND_KINDS:
            returned += amount
    invoiced = sum(
        Invoice.objects.filter(wallet=wallet, state__in=HOLDING_STATES).values_list(
            "amount", flat=True
        ),
        ZERO,
    )
    return InvoiceBalance(
        consumed=round_cents(consumed),
        returned=round_cents(returned),
        debt=max(ZERO, -cash.balance),
        invoiced=round_cents(invoiced),
        cash=cash.balance,
    )


def balance_for(user: User) -> InvoiceBalance:
    return invoice_balance(Wallet.objects.filter(team=team_of(user)).first())


def minimum_amount() -> Decimal:
    return round_cents(to_decimal(settings.INVOICE_MIN_AMOUNT))


# --- requests ------------------------------------------------------------------------------------
def _text(value: Any, limit: int) -> str:
    return str(value or "").strip()[:limit]


def _parse_amount(amount: Any, invoiceable: Decimal) -> Decimal:
    if amount in (None, ""):
        return invoiceable
    try:
        value = to_decimal(str(amount).strip())
    except Exception as exc:
        raise InvoiceError(gettext_noop("Enter an amount in 元."), field="amount") from exc
    if not value.is_finite() or value != value.quantize(Decimal("0.01")):
        raise InvoiceError(gettext_noop("Enter an amount in 元, in whole cents."), field="amount")
    return value


@transaction.atomic
def request_invoice(
    user: User,
    *,
    kind: str,
    title_type: str,
    title: str = "",
    tax_id: str = "",
    address_phone: str = "",
    bank_account: str = "",
    email: str = "",
    amount: Any = None,
    request: Any = None,
) -> Invoice:
    """A verified customer asks for an electronic invoice of consumed cash (all of it by default).

    普票 for a person (titled with the verified name) or an organisation; 专票 only for a
    verified organisation, with its 税号, 地址电话 and 开户行及账号. Raises ``InvoiceError``
    (``amount`` above the invoiceable cash or below ``INVOICE_MIN_AMOUNT``) or the gate's 403.
    """
    person = user_of(user)  # who asks: their verification titles the team's invoice
    require_verified(person, "invoice")
    if kind not in InvoiceKind.values:
        raise InvoiceError(gettext_noop("Choose a general or a special VAT invoice."), field="kind")
    if title_type not in TitleType.values:
        raise InvoiceError(
            gettext_noop("Choose an individual or an organisation title."), field="title_type"
        )
    who = verified(person)
    organisation = who is not None and who.is_organisation
    fields = {
        "title": _text(title, 200),
        "tax_id": normalize(_text(tax_id, 24)),
        "address_phone": _text(address_phone, 200),
        "bank_account": _text(bank_account, 200),
    }
    if kind == InvoiceKind.SPECIAL and (not organisation or title_type != TitleType.ORGANISATION):
        raise InvoiceError(
            gettext_noop(
                "A special VAT invoice is issued to a verified organisation only; individuals get a general invoice."
            ),
            field="kind",
        )
    if title_type == TitleType.ORGANISATION:
        if not organisation:
            raise InvoiceError(
                gettext_noop("An organisation title needs the organisation's verification."),
                field="title_type",
            )
        assert who is not None
        fields["title"] = fields["title"] or who.organisation_name
        fields["tax_id"] = fields["tax_id"] or who.credit_code
        if not credit_code_valid(fields["tax_id"]):
            raise InvoiceError(gettext_noop("Enter a valid taxpayer ID."), field="tax_id")
    else:
        fields["title"] = fields["title"] or (who.real_name if who else "")
        fields["tax_id"] = ""
        if not fields["title"]:
            raise InvoiceError(gettext_noop("Enter the invoice title."), field="title")
    if kind == InvoiceKind.SPECIAL:
        for name, message in (
            (
                "address_phone",
                gettext_noop("A special VAT invoice needs the registered address and phone."),
            ),
            (
                "bank_account",
                gettext_noop("A special VAT invoice needs the bank and account number."),
            ),
        ):
            if not fields[name]:
                raise InvoiceError(message, field=name)
    wallet = lock_wallet(user)  # the one lock: concurrent requests queue here
    balance = invoice_balance(wallet)
    value = _parse_amount(amount, balance.invoiceable)
    minimum = minimum_amount()
    if value < minimum:
        raise InvoiceError(
            gettext_noop(
                "An invoice is at least %(minimum)s 元; you can invoice %(invoiceable)s 元 now."
            ),
            field="amount",
            minimum=minimum,
            invoiceable=balance.invoiceable,
        )
    if value > balance.invoiceable:
        raise InvoiceError(
            gettext_noop(
                "You can invoice %(invoiceable)s 元 of consumed cash (trial credit and vouchers "
                "are never invoiced)."
            ),
            field="amount",
            invoiceable=balance.invoiceable,
        )
    row = Invoice.objects.create(
        wallet=wallet,
        kind=kind,
        title_type=title_type,
        email=_text(email, 254) or person.email,
        amount=value,
        requested_at=clock.now(),
        **fields,
    )
    audit.record(user, "invoice.request", row, team=wallet.team, label=fields["title"], after={"amount": value, "kind": kind}, request=request)  # fmt: skip
    return row


# --- lookups -------------------------------------------------------------------------------------
def invoices_for(user: User) -> Any:
    return Invoice.objects.filter(wallet__team=team_of(user))


def get_invoice_for_user(user: User, public_id: Any) -> Invoice:
    row = Invoice.objects.filter(
        public_id=uuid_or_404(public_id), wallet__team=team_of(user)
    ).first()
    if row is None:
        raise Http404
    return row


def get_invoice(public_id: Any) -> Invoice:
    row = Invoice.objects.filter(public_id=uuid_or_404(public_id)).first()
    if row is None:
        raise Http404
    return row


def queue() -> Any:
    return Invoice.objects.select_related("wallet__team__personal_of").order_by(
        "requested_at", "id"
    )


# --- the operator's side -------------------------------------------------------------------------
def _locked(public_id: Any, *states: str) -> Invoice:
    row = Invoice.objects.select_for_update().filter(public_id=uuid_or_404(public_id)).first()
    if row is None:
        raise Http404
    if row.state not in states:
        raise InvoiceError(
            gettext_noop("This invoice is %(state)s; it cannot be changed so."),
            code=ErrorCode.CONFLICT,
            http_status=409,
            state=row.state,
        )
    return row


def _number(pk: int, *, red: bool = False) -> str:
    """A 20-digit number: the year's two digits, then 9 for a red-letter one, then the id."""
    year = f"{clock.now():%y}"
    return f"{year}9{pk:017d}" if red else f"{year}{pk:018d}"


def _document(row: Invoice, *, red: bool) -> pdf.InvoiceDocument:
    return pdf.InvoiceDocument(
        number=(row.red_number if red else row.number) or "",
        issued_at=clock.now(),
        kind_label=KIND_LABELS[InvoiceKind(row.kind)],
        buyer_name=row.title,
        buyer_tax_id=row.tax_id,
        buyer_address_phone=row.address_phone,
        buyer_bank_account=row.bank_account,
        amount=-row.amount if red else row.amount,
        reverses_number=(row.number or "") if red else "",
        note=row.reason if red else "",
    )


@transaction.atomic
def issue_invoice(public_id: Any, *, by: User | None, request: Any = None) -> Invoice:
    """Issue a requested invoice: its number and its PDF (once)."""
    row = _locked(public_id, InvoiceState.REQUESTED)
    row.number = _number(row.pk)
    row.pdf.save(
        f"{row.public_id}.pdf", ContentFile(pdf.render(_document(row, red=False))), save=False
    )
    row.state = InvoiceState.ISSUED
    row.decided_at = clock.now()
    row.decided_by = by if getattr(by, "pk", None) else None
    row.save()
    audit.record(by, "invoice.issue", row, team=row.wallet.team, operator=True, label=row.number, before={"state": InvoiceState.REQUESTED}, after={"state": row.state, "amount": row.amount}, request=request)  # fmt: skip
    _mail_on_commit(row)
    return row


@transaction.atomic
def reject_request(public_id: Any, *, by: User | None, reason: str, request: Any = None) -> Invoice:
    """Refuse a request (its amount becomes invoiceable again)."""
    if not (reason or "").strip():
        raise InvoiceError(gettext_noop("A rejection needs a reason."), field="reason")
    row = _locked(public_id, InvoiceState.REQUESTED)
    row.state = InvoiceState.REJECTED
    row.reason = reason.strip()[:300]
    row.decided_at = clock.now()
    row.decided_by = by if getattr(by, "pk", None) else None
    row.save()
    audit.record(by, "invoice.reject", row, team=row.wallet.team, operator=True, label=row.reason, before={"state": InvoiceState.REQUESTED}, after={"state": row.state, "amount": row.amount}, request=request)  # fmt: skip
    return row


@transaction.atomic
def reverse_invoice(
    public_id: Any, *, by: User | None, reason: str, request: Any = None
) -> Invoice:
    """冲红: a red-letter invoice cancels an issued one; its amount is invoiceable again (and its
    cash refundable again)."""
    if not (reason or "").strip():
        raise InvoiceError(gettext_noop("A red-letter reversal needs a reason."), field="reason")
    first = get_invoice(public_id)
    Wallet.objects.select_for_update().get(pk=first.wallet_id)  # the wallet lock first
    row = _locked(public_id, InvoiceState.ISSUED)
    row.state = InvoiceState.REVERSED
    row.reason = reason.strip()[:300]
    row.red_number = _number(row.pk, red=True)
    row.reversed_at = clock.now()
    row.red_pdf.save(
        f"{row.public_id}-red.pdf", ContentFile(pdf.render(_document(row, red=True))), save=False
    )
    row.save()
    audit.record(by, "invoice.reverse", row, team=row.wallet.team, operator=True, label=row.number or "", before={"state": InvoiceState.ISSUED}, after={"state": row.state, "red_number": row.red_number}, request=request)  # fmt: skip
    return row


def ensure_refundable(wallet: Wallet, amount: Decimal) -> None:
    """The refund rule (``refund_cash`` calls it under the wallet lock)."""
    balance = invoice_balance(wallet)
    if balance.held_cash and amount > balance.refundable:
        raise InvoiceError(
            gettext_noop(
                "%(held)s 元 of this cash was invoiced: reverse the invoice (red-letter) before refunding "
                "it; %(refundable)s 元 can be refunded now."
            ),
            held=balance.held_cash,
            refundable=balance.refundable,
        )


# --- notices -------------------------------------------------------------------------------------
def _mail_on_commit(row: Invoice) -> None:
    """Tell the customer the invoice is ready (console/notices/: inbox and mail, once); a delivery
    address other than the account's gets the mail too."""
    owner = contact(row.wallet.team)
    params = {"number": row.number, "amount": row.amount}
    notices.notify(
        owner,
        "invoice_issued",
        params,
        key=f"invoice:{row.public_id}:issued",
        link="/billing/invoices/",
    )
    if not row.email or row.email == owner.email:
        return
    to, language = row.email, notices.preference(owner).language

    def send() -> None:
        with override(language):
            subject = _("Your invoice %(number)s is issued") % params
            body = (
                _(
                    "Your electronic invoice %(number)s of %(amount)s 元 is issued; download it at "
                    "/billing/invoices/."
                )
                % params
            )
        try:
            send_mail(f"{settings.ACCOUNT_EMAIL_SUBJECT_PREFIX}{subject}", body + "\n", None, [to])
        except Exception:  # a lost mail must not undo the issue
            logger.exception("could not mail an issued invoice")

    transaction.on_commit(send)


__all__ = [
    "InvoiceBalance",
    "InvoiceError",
    "balance_for",
    "ensure_refundable",
    "get_invoice",
    "get_invoice_for_user",
    "get_or_create_wallet",
    "invoice_balance",
    "invoices_for",
    "issue_invoice",
    "queue",
    "reject_request",
    "request_invoice",
    "reverse_invoice",
]
