"""对公转账: the remittance code, matching by hand or from a bank statement CSV.

Every match goes through ``billing.services.confirm_payment`` (the wallet lock, a compare-and-set
of the payment's state, the bank reference as the unique provider transaction id), so a transfer
matched twice — by two operators at once, by hand and by an imported statement, or by the same
statement imported again — credits once.
"""

from __future__ import annotations

import csv
import io
import re
import secrets
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext_noop

from billing.errors import BillingError, InvalidWebhook
from billing.models import Payment
from billing.money import round_cents
from billing.providers.bank_transfer import NAME
from billing.transfers.models import BankTransfer
from console.ids import uuid_or_404
from console.tenancy import team_of

if TYPE_CHECKING:
    from console.models import User

# Crockford's base 32 (no I, L, O, U): read aloud and typed into a bank's memo field.
ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
CODE = re.compile(r"GC[0-9ABCDEFGHJKMNPQRSTVWXYZ]{8}")


def new_code() -> str:
    return "GC" + "".join(secrets.choice(ALPHABET) for _ in range(8))


def on_created(payment: Payment) -> BankTransfer:
    """Give a new bank-transfer payment its remittance code (``start_topup`` calls it)."""
    for _attempt in range(5):
        try:
            with transaction.atomic():
                return BankTransfer.objects.create(payment=payment, remittance_code=new_code())
        except IntegrityError:
            existing = BankTransfer.objects.filter(payment=payment).first()
            if existing is not None:
                return existing
    raise BillingError(gettext_noop("Could not allocate a remittance code; try again."))


def transfer_for_user(user: User, public_id: Any) -> BankTransfer:
    row = (
        BankTransfer.objects.select_related("payment")
        .filter(payment__public_id=uuid_or_404(public_id), payment__wallet__team=team_of(user))
        .first()
    )
    if row is None:
        raise Http404
    return row


def pending() -> Any:
    return (
        BankTransfer.objects.select_related("payment__wallet__team__personal_of")
        .filter(payment__state="pending")
        .order_by("payment__created_at")
    )


def match(code: str, *, bank_reference: str, amount: Any, by: User | None = None) -> bool:
    """Credit the transfer with ``code`` as paid (bank reference, amount received). Returns
    whether this call credited it; raises ``BillingError`` (unknown code, wrong amount, a bank
    reference used for another payment)."""
    code = (code or "").strip().upper()
    reference = (bank_reference or "").strip()[:64]
    if not reference:
        raise BillingError(gettext_noop("Enter the bank's reference of the transfer."))
    row = BankTransfer.objects.select_related("payment").filter(remittance_code=code).first()
    if row is None:
        raise BillingError(
            gettext_noop("No pending transfer has the code %(remittance_code)s."),
            remittance_code=code,
        )
    try:
        value = round_cents(Decimal(str(amount).replace(",", "").strip()))
    except (InvalidOperation, ValueError) as exc:
        raise BillingError(gettext_noop("Enter the amount received.")) from exc
    from billing import services  # the one crediting path (services import this module)

    try:
        credited = services.confirm_payment(
            str(row.payment.public_id),
            provider=NAME,
            provider_txn_id=f"bank:{reference}",
            amount=value,
        )
    except InvalidWebhook as exc:
        raise BillingError(exc.template, **exc.params) from exc
    except IntegrityError as exc:  # the reference already credited another payment
        raise BillingError(
            gettext_noop("The bank reference %(reference)s was already used."), reference=reference
        ) from exc
    if credited:
        BankTransfer.objects.filter(pk=row.pk).update(
            bank_reference=reference,
            matched_by=by if getattr(by, "pk", None) else None,
            matched_at=timezone.now(),
        )
    return credited


@dataclass(frozen=True)
class StatementRow:
    line: int
    reference: str
    amount: str
    code: str
    outcome: str  # credited | already | no_code | refused
    detail: str = ""


_COLUMNS = {
    "reference": ("reference", "流水号", "交易流水号"),
    "amount": ("amount", "金额", "交易金额", "贷方金额"),
    "memo": ("memo", "摘要", "附言", "用途"),
}


def import_statement(data: bytes, *, by: User | None = None) -> list[StatementRow]:
    """Match every row of a bank statement (CSV with a header naming ``reference``, ``amount``
    and ``memo`` columns, in English or Chinese) whose memo carries a remittance code."""
    text = data.decode("utf-8-sig", errors="replace")
    reader = csv.DictReader(io.StringIO(text))
    header = {(name or "").strip().lower(): name for name in reader.fieldnames or []}
    columns = {}
    for key, names in _COLUMNS.items():
        found = next((header[n.lower()] for n in names if n.lower() in header), None)
        if found is None:
            raise BillingError(gettext_noop("The statement needs a %(column)s column."), column=key)
        columns[key] = found
    out = []
    for number, record in enumerate(reader, start=2):
        reference = (record.get(columns["reference"]) or "").strip()
        amount = (record.get(columns["amount"]) or "").strip()
        found_code = CODE.search((record.get(columns["memo"]) or "").upper())
        if found_code is None:
            out.append(StatementRow(number, reference, amount, "", "no_code"))
            continue
        code = found_code.group(0)
        try:
            credited = match(code, bank_reference=reference, amount=amount, by=by)
        except BillingError as exc:
            out.append(StatementRow(number, reference, amount, code, "refused", exc.message()))
            continue
        out.append(
            StatementRow(number, reference, amount, code, "credited" if credited else "already")
        )
    return out
