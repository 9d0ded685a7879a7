from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.pricing import GpuPrice, StoragePrice, TermPrice, quote_order, runway_seconds

RTX4090 = GpuPrice(
    "RTX 4090",
    Decimal("1.90"),
    (TermPrice(30, Decimal("1.20")), TermPrice(1, Decimal("1.80"))),
    version=1,
)


def test_quote_for_an_8_card_4090() -> None:
    quote = quote_order(RTX4090, 8, balance=Decimal("10.00"))
    assert quote.per_hour == Decimal("15.20")
    assert quote.per_day == Decimal("364.80")
    assert [t.days for t in quote.terms] == [1, 30]
    thirty = quote.terms[1]
    assert thirty.total == Decimal("6912.00")  # 1.20 × 8 × 720 h
    assert thirty.on_demand_total == Decimal("10944.00")
    assert thirty.saving_percent == Decimal("36.84")
    # 10 元 at 15.20 元/h lasts 39 min 28 s (the demo's budget)
    assert quote.runway_seconds == 2368
    assert quote.price_version == 1


def test_storage_beyond_the_free_quota_only() -> None:
    storage = StoragePrice(per_gb_day=Decimal("0.01"), free_gb=50)
    assert quote_order(RTX4090, 1, disk_gb=40, storage=storage).storage_per_day == Decimal("0.00")
    assert quote_order(RTX4090, 1, disk_gb=550, storage=storage).storage_per_day == Decimal("5.00")


def test_no_cards_is_refused() -> None:
    with pytest.raises(ValueError):
        quote_order(RTX4090, 0)


def test_runway_edges() -> None:
    assert runway_seconds(Decimal("5"), Decimal("0")) is None
    assert runway_seconds(Decimal("-1"), Decimal("1.9")) == 0
    assert runway_seconds(Decimal("1.90"), Decimal("1.90")) == 3600


@settings(print_blob=True)
@given(
    balance=st.decimals(min_value="0", max_value="1000000", places=2),
    burn=st.decimals(min_value="0.01", max_value="10000", places=2),
)
def test_runway_is_the_last_whole_second_the_balance_covers(
    balance: Decimal, burn: Decimal
) -> None:
    secs = runway_seconds(balance, burn)
    assert secs is not None
    assert burn * secs / 3600 <= balance < burn * (secs + 1) / 3600
