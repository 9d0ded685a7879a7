"""Factories for billing: money and usage made through the services (the ledger stays balanced).

Users come from tests/console/factories.py (``UserFactory``) or the personas in tests/conftest.py.
"""

from __future__ import annotations

import itertools
from decimal import Decimal

from billing import services
from billing.models import Account, UsageSession
from console.models import User

_resource_ids = itertools.count(1)


def fund(user: User, amount: Decimal | str = "100", *, valid_days: int = 30) -> Account:
    """Spendable money for ``user``: a voucher (no payment provider involved)."""
    return services.grant_voucher(user, Decimal(amount), reason="test funds", valid_days=valid_days)


def open_session(
    user: User,
    *,
    resource_id: str | None = None,
    gpu_model: str = "RTX 4090",
    cards: int = 1,
    **kwargs: object,
) -> UsageSession:
    """An open usage session for an instance (needs the seeded prices: the ``prices`` fixture)."""
    return services.open_usage_session(
        user,
        resource_kind="instance",
        resource_id=resource_id or f"instance-{next(_resource_ids)}",
        gpu_model=gpu_model,
        cards=cards,
        **kwargs,
    )
