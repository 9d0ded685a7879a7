"""The seed price book (version 1) and top-up voucher rule, shared by the data migration and tests.

Seed values from the brief: RTX 4090 1.90 元 and A800 3.50 元 per card-hour on demand; RTX 4090
30-day term 1.20 元. The 1- and 7-day RTX 4090 terms and the H800 price are PLACEHOLDERS for the
operator to set (the H800 row is flagged ``is_placeholder`` and labelled in the UI).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

SEED_EFFECTIVE_AT = datetime(2025, 1, 1, tzinfo=UTC)
GPU_PRICES = (
    ("RTX 4090", Decimal("1.90"), False),
    ("A800", Decimal("3.50"), False),
    ("H800", Decimal("7.00"), True),  # placeholder: the operator sets the real price
)
TERM_PRICES = (
    ("RTX 4090", 1, Decimal("1.80")),  # placeholder tier
    ("RTX 4090", 7, Decimal("1.60")),  # placeholder tier
    ("RTX 4090", 30, Decimal("1.20")),  # from the brief
)


def seed_billing(price_book: Any, gpu_price: Any, term_price: Any, bonus_rule: Any) -> None:
    """Create version 1 and the 5 % rule unless a price book exists (models passed in, so the
    migration can use its historical models)."""
    if not price_book.objects.exists():
        book = price_book.objects.create(
            version=1,
            effective_at=SEED_EFFECTIVE_AT,
            note="Seed prices (H800 and the 1/7-day RTX 4090 terms are placeholders)",
            storage_per_gb_day=Decimal("0.01"),
            storage_free_gb=50,
        )
        for model, rate, placeholder in GPU_PRICES:
            gpu_price.objects.create(
                price_book=book,
                gpu_model=model,
                on_demand_per_card_hour=rate,
                is_placeholder=placeholder,
            )
        for model, days, rate in TERM_PRICES:
            term_price.objects.create(
                price_book=book, gpu_model=model, days=days, rate_per_card_hour=rate
            )
    if not bonus_rule.objects.exists():
        bonus_rule.objects.create(
            threshold=Decimal("100000.00"), percent=Decimal("5.00"), voucher_valid_days=365
        )


def seed_default_prices() -> None:
    # Inside: migration 0002 imports this module and must not load today's models with it.
    from billing.models import GpuPrice, PriceBook, TermPrice, TopUpBonusRule

    seed_billing(PriceBook, GpuPrice, TermPrice, TopUpBonusRule)
