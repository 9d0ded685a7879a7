"""What the dashboard shows, gathered from the apps' services in a fixed number of queries."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from billing.offers import PriceSheet, price_sheet
from billing.services import WalletSummary, get_wallet_summary, gpu_model_key, price_list
from marketplace.services import catalogue_counts
from slices.services import Availability, availability
from slices.topology import SLICE_UNIT_GPUS

if TYPE_CHECKING:
    from console.models import User


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
    # On-demand 元 per card-hour by GPU model key (published prices only): the apps strip's
    # rates, from the same look at the price book as the offers.
    app_rates: dict[str, Decimal]
    # GPU models the fleet has but nobody can order yet (no published price): named apart,
    # never in "Available now" nor counted (issue 29).
    coming: tuple[str, ...] = ()


def build_dashboard(user: User) -> Dashboard:
    prices = {gpu_model_key(p.gpu_model): p for p, _terms in price_list()}
    offers = []
    coming: dict[str, None] = {}
    for row in availability():
        price = prices.get(gpu_model_key(row.gpu_model))
        if price is None or price.is_placeholder:
            coming[row.gpu_model] = None
            continue
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
        app_rates={
            key: p.on_demand_per_card_hour for key, p in prices.items() if not p.is_placeholder
        },
        coming=tuple(coming),
    )


@dataclass(frozen=True)
class Landing:
    """What the public landing page claims, every figure computed from the database."""

    sheet: PriceSheet
    regions: list[str]  # display names, in the fleet's order
    gpu_models: list[str]  # what the fleet has (the price book's models before a fleet is loaded)
    slices: bool  # some region rents InfiniBand cluster slices
    cards: int  # GPUs in the fleet
    slice_min_cards: int
    models: int
    datasets: int
    images: int


def orderable(rows: list[Availability], sheet: PriceSheet) -> list[Availability]:
    """The rows whose GPU model has a published price: what a customer can order (a model with
    no price, or a placeholder one, is not offered, so it is not counted either)."""
    priced = {gpu_model_key(p.gpu_model) for p in sheet.prices if p.orderable}
    return [r for r in rows if gpu_model_key(r.gpu_model) in priced]


def build_landing() -> Landing:
    sheet = price_sheet()
    rows = orderable(availability(), sheet)
    regions = list(dict.fromkeys(row.region_name for row in rows))
    # The price book's spelling ("RTX 4090") for the fleet's codes ("RTX4090").
    spelled = {gpu_model_key(p.gpu_model): p.gpu_model for p in sheet.prices}
    gpu_models = list(
        dict.fromkeys(spelled.get(gpu_model_key(r.gpu_model), r.gpu_model) for r in rows)
    ) or [p.gpu_model for p in sheet.prices if p.orderable]
    counts = catalogue_counts()
    return Landing(
        sheet=sheet,
        regions=regions,
        gpu_models=gpu_models,
        slices=any(row.slices for row in rows),
        cards=sum(row.total_gpus for row in rows),
        slice_min_cards=SLICE_UNIT_GPUS,
        models=counts["models"],
        datasets=counts["datasets"],
        images=counts["images"],
    )
