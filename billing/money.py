"""Money arithmetic for billing: ``Decimal`` only, never ``float``. No Django imports.

The one rounding rule
---------------------
Amounts are in 元. Accrual (rate × seconds) is exact: a ``Decimal`` computed with enough precision
that nothing is lost before rounding. A *settled* amount is rounded to 0.01 元 with
``ROUND_HALF_UP`` (0.005 → 0.01, 0.0049… → 0.00) — the rule the statement shows.

Settlement is **cumulative**: the amount charged for a usage session after ``s`` seconds is always
``round_half_up(rate × cards × s / 3600)``, and a partial settlement charges the difference between
that and what was already charged. So any number of partial settlements, at any boundaries, sums
to exactly the one-shot charge: rounding never drifts (180 one-minute settlements of a 3-hour run
give the same total as one 3-hour settlement).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Context, Decimal, localcontext

CENT = Decimal("0.01")
ZERO = Decimal("0.00")
SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86400
ROUNDING = ROUND_HALF_UP
# Precision for exact accrual: rates carry ≤ 4 decimals, seconds and cards are integers, so
# 60 significant digits keep every intermediate value exact up to absurd amounts.
_EXACT = Context(prec=60, rounding=ROUNDING)


def to_decimal(value: Decimal | int | str) -> Decimal:
    """Coerce an amount to ``Decimal``; ``float`` is refused (it cannot represent 0.1)."""
    if isinstance(value, float):
        raise TypeError("money must not be a float; pass a str, int or Decimal")
    if isinstance(value, Decimal):
        return value
    return Decimal(value)


def round_cents(amount: Decimal | int | str) -> Decimal:
    """Round to 0.01 元 with the one documented rule (half up)."""
    return to_decimal(amount).quantize(CENT, rounding=ROUNDING)


def accrued(
    rate_per_card_hour: Decimal, cards: int, seconds: int, per: int = SECONDS_PER_HOUR
) -> Decimal:
    """The exact (unrounded) amount of ``seconds`` of usage at ``rate`` per card-hour.

    ``per`` is the rate's period in seconds: 3600 for GPU card-hours, 86400 for disk GB-days.
    """
    if seconds < 0 or cards < 0:
        raise ValueError("seconds and cards must not be negative")
    with localcontext(_EXACT):
        return to_decimal(rate_per_card_hour) * int(cards) * int(seconds) / per


def charge_for(
    rate_per_card_hour: Decimal, cards: int, seconds: int, per: int = SECONDS_PER_HOUR
) -> Decimal:
    """What ``seconds`` of a session cost in total, rounded once (the cumulative target)."""
    return round_cents(accrued(rate_per_card_hour, cards, seconds, per))


def settlement_delta(
    rate_per_card_hour: Decimal,
    cards: int,
    settled_seconds: int,
    until_seconds: int,
    per: int = SECONDS_PER_HOUR,
) -> Decimal:
    """The amount to charge when a session settled up to ``settled_seconds`` moves to ``until_seconds``.

    Cumulative: ``charge_for(until) - charge_for(settled)``, so deltas telescope to the one-shot
    charge. Never negative (``charge_for`` is monotonic in seconds).
    """
    if until_seconds < settled_seconds:
        raise ValueError("a settlement cannot go back in time")
    return charge_for(rate_per_card_hour, cards, until_seconds, per) - charge_for(
        rate_per_card_hour, cards, settled_seconds, per
    )


def percent_of(amount: Decimal, rate_percent: Decimal) -> Decimal:
    """``rate_percent`` % of ``amount``, rounded with the same rule (used for bonus vouchers)."""
    with localcontext(_EXACT):
        return round_cents(to_decimal(amount) * to_decimal(rate_percent) / 100)


def allocate(amount: Decimal, available: list[Decimal]) -> list[Decimal]:
    """Split a charge over buckets in spending order; the last bucket (cash) takes any remainder.

    ``available`` is what each bucket holds, in the order money is taken (vouchers expiring
    first, then trial credit, then cash). Every bucket but the last is never taken below zero;
    the last may go negative (the bounded overdraft of billing/lowbalance.py). The parts sum to
    ``amount`` exactly. A negative ``amount`` is refused (``ValueError``).
    """
    if not available:
        raise ValueError("at least one bucket (cash) is needed")
    parts: list[Decimal] = []
    rest = to_decimal(amount)
    if rest < 0:  # a negative charge would credit the customer's buckets
        raise ValueError("cannot allocate a negative amount")
    for held in available[:-1]:
        take = min(rest, max(to_decimal(held), ZERO))
        parts.append(take)
        rest -= take
    parts.append(rest)
    return parts
