"""What the dashboard shows, gathered from the apps' services in a fixed number of queries."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from billing.services import WalletSummary, get_wallet_summary, price_list
from marketplace.services import catalogue_counts
from slices.services import Availability, availability
from slices.topology import gpu_model_key


@dataclass(frozen=True)
class OfferRow:
    """One region × GPU model line of the "what can I rent now" table."""

    availability: Availability
    price_per_card_hour: Decimal | None
    price_is_placeholder: bool

    @property
    def free_percent(self) -> int:
        a = self.availability
        return round(100 * a.free_gpus / a.total_gpus) if a.total_gpus else 0


@dataclass(frozen=True)
class Dashboard:
    wallet: WalletSummary
    offers: list[OfferRow]
    models: int
    datasets: int
    images: int


def build_dashboard(user: Any) -> Dashboard:
    prices = {gpu_model_key(p.gpu_model): p for p, _terms in price_list()}
    offers = []
    for row in availability():
        price = prices.get(gpu_model_key(row.gpu_model))
        offers.append(
            OfferRow(
                row,
                price.on_demand_per_card_hour if price else None,
                bool(price and price.is_placeholder),
            )
        )
    counts = catalogue_counts()
    return Dashboard(
        wallet=get_wallet_summary(user),
        offers=offers,
        models=counts["models"],
        datasets=counts["datasets"],
        images=counts["images"],
    )
