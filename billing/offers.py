"""What the public price page, the calculator and the landing page say about prices.

Read-only, computed from the current price book on every request, so a page never states a price
the meter would not charge. A model whose price is still the operator's placeholder
(``GpuPrice.is_placeholder``) is listed as not yet available, with no number: placeholders are for
operators, never shown to customers as prices.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing import services
from billing.models import gpu_price_quote
from billing.pricing import TermQuote, quote_order, runway_seconds


@dataclass(frozen=True)
class PublishedPrice:
    """One GPU model's prices for one card, as the public price page lists them."""

    gpu_model: str
    orderable: bool  # False while the price is the operator's placeholder
    on_demand_per_card_hour: Decimal | None
    terms: tuple[TermQuote, ...]  # locked-price terms for one card: rate, total, saving


@dataclass(frozen=True)
class CheapestTerm:
    gpu_model: str
    days: int
    rate_per_card_hour: Decimal


@dataclass(frozen=True)
class BonusOffer:
    threshold: Decimal
    percent: Decimal
    valid_days: int


@dataclass(frozen=True)
class PriceSheet:
    version: int | None
    prices: tuple[PublishedPrice, ...]
    storage_free_gb: int
    storage_per_gb_day: Decimal
    trial_credit: Decimal
    bonus: BonusOffer | None

    @property
    def orderable(self) -> tuple[PublishedPrice, ...]:
        return tuple(p for p in self.prices if p.orderable)

    @property
    def orderable_models(self) -> frozenset[str]:
        return frozenset(p.gpu_model for p in self.orderable)

    @property
    def cheapest_term(self) -> CheapestTerm | None:
        """The lowest locked card-hour price of any orderable model (ties: the longest term)."""
        best: CheapestTerm | None = None
        for price in self.orderable:
            for term in price.terms:
                if best is None or (term.rate_per_card_hour, -term.days) < (
                    best.rate_per_card_hour,
                    -best.days,
                ):
                    best = CheapestTerm(price.gpu_model, term.days, term.rate_per_card_hour)
        return best

    def trial_runway(self, cards: int = 8) -> tuple[str, int] | None:
        """How long the trial credit runs ``cards`` cards of the cheapest orderable model."""
        cheapest = min(
            self.orderable, key=lambda p: p.on_demand_per_card_hour or Decimal(0), default=None
        )
        if cheapest is None or cheapest.on_demand_per_card_hour is None:
            return None
        seconds = runway_seconds(self.trial_credit, cheapest.on_demand_per_card_hour * cards)
        return (cheapest.gpu_model, seconds) if seconds is not None else None


def price_sheet(at: datetime | None = None) -> PriceSheet:
    """The current price book as customers may see it (three queries)."""
    book = services.current_price_book(at)
    rows = []
    for price, terms in services.price_list(at):
        if price.is_placeholder or book is None:
            rows.append(PublishedPrice(price.gpu_model, False, None, ()))
            continue
        per_card = quote_order(gpu_price_quote(book, price, terms), 1)
        rows.append(
            PublishedPrice(price.gpu_model, True, price.on_demand_per_card_hour, per_card.terms)
        )
    rule = services.current_bonus_rule()
    return PriceSheet(
        version=book.version if book else None,
        prices=tuple(rows),
        storage_free_gb=book.storage_free_gb if book else 0,
        storage_per_gb_day=book.storage_per_gb_day if book else Decimal("0"),
        trial_credit=services.TRIAL_CREDIT,
        bonus=BonusOffer(rule.threshold, rule.percent, rule.voucher_valid_days) if rule else None,
    )
