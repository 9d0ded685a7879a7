"""Billing's object routes for the tenant-isolation test (tests/console/test_tenant_isolation.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from billing import services
from billing.invoicing import services as invoicing
from billing.seed import seed_default_prices
from console.models import User
from tests.billing.factories import fund, open_session


def _payment(owner: User) -> dict[str, Any]:
    payment, _ = services.start_topup(owner, "10.00")
    return {"public_id": payment.public_id}


def _transaction(owner: User) -> dict[str, Any]:
    fund(owner, "1.00", valid_days=1)
    return {"public_id": services.get_or_create_wallet(owner).transactions.first().public_id}


def _usage_session(owner: User) -> dict[str, Any]:
    seed_default_prices()
    session = open_session(owner, resource_id=str(uuid.uuid4()), gpu_model="A800")
    return {"public_id": session.public_id}


def _consumed(owner: User) -> None:
    """Cash the owner consumed (invoiceable): a top-up and a 1-day rental."""
    seed_default_prices()
    payment, _ = services.start_topup(owner, "100.00")
    services.confirm_payment(
        str(payment.public_id),
        provider="sandbox",
        provider_txn_id=f"iso-{payment.public_id}",
        amount=payment.amount,
    )
    services.purchase_term(
        owner,
        gpu_model="RTX 4090",
        cards=1,
        days=1,
        resource_kind="instance",
        resource_id=str(uuid.uuid4()),
    )


def _invoice(owner: User) -> dict[str, Any]:
    """An issued invoice (with its PDF) of the owner."""
    _consumed(owner)
    row = invoicing.request_invoice(owner, kind="normal", title_type="personal")
    return {"public_id": invoicing.issue_invoice(row.public_id, by=None).public_id}


def _reversed_invoice(owner: User) -> dict[str, Any]:
    kwargs = _invoice(owner)
    invoicing.reverse_invoice(kwargs["public_id"], by=None, reason="isolation")
    return kwargs


def _invoice_action(owner: User) -> dict[str, Any]:
    return {**_invoice(owner), "verb": "reverse"}


def _transfer(owner: User) -> dict[str, Any]:
    payment, _ = services.start_topup(owner, "100.00", provider="bank_transfer")
    return {"public_id": payment.public_id}


OBJECT_ROUTES: dict[str, Callable[[User], dict[str, Any]]] = {
    "billing:sandbox-checkout": _payment,
    "billing:invoice-pdf": _invoice,
    "billing:invoice-red-pdf": _reversed_invoice,
    "billing:transfer-detail": _transfer,
    "billing-invoice-detail": _invoice,
    "billing-invoice-pdf": _invoice,
    "billing-top-up-detail": _payment,
    "billing-transaction-detail": _transaction,
    "billing-usage-session-detail": _usage_session,
}
STAFF_ROUTES: dict[str, Callable[[User], dict[str, Any]]] = {
    "billing:ops-invoice-action": _invoice_action,
    "billing:ops-invoice-pdf": _invoice,
}
EXEMPT_ROUTES: dict[str, str] = {}
