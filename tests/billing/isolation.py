"""Billing's object routes for the tenant-isolation test (tests/console/test_tenant_isolation.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from billing import services
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


OBJECT_ROUTES: dict[str, Callable[[User], dict[str, Any]]] = {
    "billing:sandbox-checkout": _payment,
    "billing-top-up-detail": _payment,
    "billing-transaction-detail": _transaction,
    "billing-usage-session-detail": _usage_session,
}
EXEMPT_ROUTES: dict[str, str] = {}
