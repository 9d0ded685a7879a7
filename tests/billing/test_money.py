from __future__ import annotations

from decimal import Context, Decimal, localcontext

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.money import (
    accrued,
    allocate,
    charge_for,
    percent_of,
    round_cents,
    settlement_delta,
    to_decimal,
)

rates = st.decimals(min_value="0.01", max_value="50", places=2)
cards = st.integers(min_value=1, max_value=2048)
seconds = st.integers(min_value=0, max_value=90 * 86400)


def test_round_cents_is_half_up_at_the_midpoint() -> None:
    assert round_cents("0.005") == Decimal("0.01")
    assert round_cents("0.0049999") == Decimal("0.00")
    assert round_cents("2.675") == Decimal("2.68")  # float would say 2.67
    assert round_cents("-0.005") == Decimal("-0.01")


def test_float_is_refused() -> None:
    with pytest.raises(TypeError):
        to_decimal(1.9)


def test_known_prices() -> None:
    assert charge_for(Decimal("1.90"), 1, 3600) == Decimal("1.90")
    assert charge_for(Decimal("3.50"), 8, 1800) == Decimal("14.00")
    assert charge_for(Decimal("1.90"), 1, 1) == Decimal("0.00")  # 0.000527… 元
    assert charge_for(Decimal("1.90"), 8, 10) == Decimal("0.04")  # 0.04222…
    assert percent_of(Decimal("100000"), Decimal("5")) == Decimal("5000.00")


def test_three_hours_in_180_minutes_equals_one_settlement() -> None:
    rate = Decimal("1.90")
    total = sum(settlement_delta(rate, 8, m * 60, (m + 1) * 60) for m in range(180))
    assert total == charge_for(rate, 8, 3 * 3600) == Decimal("45.60")


@settings(print_blob=True, max_examples=300)
@given(rate=rates, n_cards=cards, cuts=st.lists(seconds, max_size=40))
def test_partial_settlements_sum_to_the_one_shot_charge(
    rate: Decimal, n_cards: int, cuts: list[int]
) -> None:
    points = [0, *sorted(cuts)]
    deltas = [
        settlement_delta(rate, n_cards, a, b) for a, b in zip(points, points[1:], strict=False)
    ]
    assert all(d >= 0 for d in deltas)
    assert sum(deltas, Decimal(0)) == charge_for(rate, n_cards, points[-1])


@settings(print_blob=True, max_examples=300)
@given(rate=rates, n_cards=cards, secs=seconds)
def test_charge_is_within_half_a_cent_of_rate_times_seconds(
    rate: Decimal, n_cards: int, secs: int
) -> None:
    exact = accrued(rate, n_cards, secs)
    # The reference at the same 60-digit precision: the default 28-digit context would itself
    # round large products (1e8 元 × many digits) and make the comparison, not accrual, inexact.
    with localcontext(Context(prec=60)):
        assert exact == rate * n_cards * secs / 3600
    assert abs(charge_for(rate, n_cards, secs) - exact) <= Decimal("0.005")
    assert charge_for(rate, n_cards, secs) == charge_for(rate, n_cards, secs).quantize(
        Decimal("0.01")
    )


def test_allocating_a_negative_amount_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        allocate(Decimal("-1.00"), [Decimal("5.00"), Decimal("10.00")])
    assert allocate(Decimal("0.00"), [Decimal("5.00"), Decimal("10.00")]) == [0, 0]
