"""The price calculator: quotes an order from a price table. Pure, no Django imports.

The order forms, the API's quote endpoint and the billing page all call ``quote_order`` with the
price book's current ``GpuPrice`` (see ``billing.services.current_gpu_price``), so a customer sees
exactly the numbers metering will charge. All amounts are ``Decimal`` 元, rounded with the one rule
in ``billing.money``.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from decimal import ROUND_UP, Decimal

from billing.money import (
    CENT,
    SECONDS_PER_DAY,
    SECONDS_PER_HOUR,
    ZERO,
    charge_for,
    round_cents,
    to_decimal,
)


def gpu_model_key(name: str) -> str:
    """The one key a GPU model's name is matched by, however it is written: "RTX 4090" (the
    price book's product name), "RTX4090" (the fleet file's code), "rtx-4090", "ＲＴＸ４０９０".

    The rule: NFKC (full-width letters and digits, typed with a Chinese input method, are the
    ASCII ones), then letters and digits only, upper-cased. Spaces, hyphens and other punctuation
    never tell two GPU products apart, while operators spell them either way ("H100-SXM",
    "H100 SXM"), so they are dropped: all of these are "H100SXM". Every app matches prices,
    fleet codes and order input with this function (``billing.services`` re-exports it).
    """
    folded = unicodedata.normalize("NFKC", name or "").upper()
    return "".join(ch for ch in folded if ch.isalnum())


# The GPU models the console sells, by the price book's product name (the seed price book,
# ``billing.seed``, prices each). Their keys (``GPU_KEYS``) are the one set of GPU model codes: the
# catalogue's ``GPU_MODELS`` and labels are read from here, and its ``gpu_code`` maps every
# spelling onto these keys with ``gpu_model_key``.
GPU_PRODUCTS = ("RTX 4090", "A800", "H800")
GPU_KEYS = tuple(gpu_model_key(name) for name in GPU_PRODUCTS)


@dataclass(frozen=True)
class TermPrice:
    """A long-term rental term (阶梯长租锁价): paid up front, price locked for the term."""

    days: int
    rate_per_card_hour: Decimal


@dataclass(frozen=True)
class GpuPrice:
    """One GPU model's prices in one price-book version."""

    gpu_model: str
    on_demand_per_card_hour: Decimal
    terms: tuple[TermPrice, ...] = ()
    version: int = 0


@dataclass(frozen=True)
class StoragePrice:
    per_gb_day: Decimal = ZERO
    free_gb: int = 0

    def per_day(self, gb: int) -> Decimal:
        """What ``gb`` of the account's storage costs a day (``storage_per_day``)."""
        return storage_per_day(gb, self)

    def added_per_day(self, total_gb: int, gb: int) -> Decimal:
        """What ``gb`` of an account's ``total_gb`` of storage adds to its daily charge: the
        charge with it minus without it, so the free allowance is counted once for the account
        (a stopped instance's kept system disk beside its cloud disks)."""
        return self.per_day(total_gb) - self.per_day(total_gb - gb)

    def within_free(self, total_gb: int) -> bool:
        """Whether ``total_gb`` of an account's storage costs nothing (inside a free allowance)."""
        return self.free_gb > 0 and total_gb <= self.free_gb


@dataclass(frozen=True)
class TermQuote:
    days: int
    rate_per_card_hour: Decimal
    total: Decimal  # paid up front for the whole term
    on_demand_total: Decimal  # the same hours on demand, for comparison
    saving: Decimal  # on_demand_total - total

    @property
    def saving_percent(self) -> Decimal:
        if not self.on_demand_total:
            return ZERO
        return round_cents(self.saving * 100 / self.on_demand_total)


@dataclass(frozen=True)
class Quote:
    gpu_model: str
    cards: int
    rate_per_card_hour: Decimal
    per_hour: Decimal
    per_day: Decimal
    storage_per_day: Decimal
    terms: tuple[TermQuote, ...] = field(default_factory=tuple)
    runway_seconds: int | None = (
        None  # how long ``balance`` lasts on demand; None = no balance given
    )
    price_version: int = 0

    @property
    def burn_per_hour(self) -> Decimal:
        """Exact hourly burn (GPU + storage spread over the day), before rounding."""
        return to_decimal(self.rate_per_card_hour) * self.cards + self.storage_per_day / 24

    def per_hour_for(self, term_days: int | None = None) -> Decimal:
        """The GPUs' price per hour on demand, or the locked rate of the ``term_days`` term."""
        term = next((t for t in self.terms if t.days == term_days), None)
        if term_days is None or term is None:
            return self.per_hour
        return charge_for(term.rate_per_card_hour, self.cards, SECONDS_PER_HOUR)


def storage_per_day(disk_gb: int, price: StoragePrice) -> Decimal:
    """Persistent-disk cost per day beyond the free quota. The parallel file system is free."""
    billable = max(0, int(disk_gb) - price.free_gb)
    return round_cents(to_decimal(price.per_gb_day) * billable)


# An AI app launches only on a balance that pays for this long at its hourly price (the launch
# page says "Your balance does not cover six minutes of this app" otherwise).
APP_LAUNCH_MIN_SECONDS = 6 * 60


def covers_app_launch(balance: Decimal, per_hour: Decimal) -> bool:
    """Whether ``balance`` pays for ``APP_LAUNCH_MIN_SECONDS`` of an app at ``per_hour`` (exact,
    no rounding: six minutes of 1.90 元/h is 0.19 元)."""
    needed = to_decimal(per_hour) * APP_LAUNCH_MIN_SECONDS / SECONDS_PER_HOUR
    return to_decimal(balance) >= needed


def most_charged(per_hour: Decimal, seconds: int) -> Decimal:
    """The most ``seconds`` at ``per_hour`` can cost, rounded up to the cent (a promise such as the
    demo's "at most 7.60 元" never falls short of what metering, rounding half up, charges)."""
    return (to_decimal(per_hour) * seconds / Decimal(SECONDS_PER_HOUR)).quantize(
        CENT, rounding=ROUND_UP
    )


def runway_seconds(balance: Decimal, burn_per_hour: Decimal) -> int | None:
    """Whole seconds ``balance`` lasts at ``burn_per_hour``; None when nothing burns (forever)."""
    burn = to_decimal(burn_per_hour)
    if burn <= 0:
        return None
    balance = to_decimal(balance)
    if balance <= 0:
        return 0
    return int(balance * SECONDS_PER_HOUR / burn)  # int() floors positive values


def term_quote(price: GpuPrice, term: TermPrice, cards: int) -> TermQuote:
    seconds = term.days * SECONDS_PER_DAY
    total = charge_for(term.rate_per_card_hour, cards, seconds)
    on_demand = charge_for(price.on_demand_per_card_hour, cards, seconds)
    return TermQuote(term.days, term.rate_per_card_hour, total, on_demand, on_demand - total)


def quote_order(
    price: GpuPrice,
    cards: int,
    *,
    balance: Decimal | None = None,
    disk_gb: int = 0,
    storage: StoragePrice | None = None,
) -> Quote:
    """Quote ``cards`` cards of ``price.gpu_model``: per hour, per day, every term, and runway."""
    if cards < 1:
        raise ValueError("an order needs at least one card")
    rate = to_decimal(price.on_demand_per_card_hour)
    disk = storage_per_day(disk_gb, storage) if storage else ZERO
    quote = Quote(
        gpu_model=price.gpu_model,
        cards=cards,
        rate_per_card_hour=rate,
        per_hour=charge_for(rate, cards, SECONDS_PER_HOUR),
        per_day=charge_for(rate, cards, SECONDS_PER_DAY),
        storage_per_day=disk,
        terms=tuple(term_quote(price, t, cards) for t in sorted(price.terms, key=lambda t: t.days)),
        price_version=price.version,
    )
    if balance is not None:
        quote = Quote(
            **{**quote.__dict__, "runway_seconds": runway_seconds(balance, quote.burn_per_hour)}
        )
    return quote


# --- booked windows (预约, issue 32) ---------------------------------------------------------------
# The cancellation rule, stated at booking and applied exactly: all back until this long before
# the start, half after that, nothing once the window has started.
RESERVATION_FULL_REFUND_SECONDS = 24 * SECONDS_PER_HOUR
RESERVATION_LATE_REFUND_SHARE = Decimal("0.5")


def window_rate(price: GpuPrice, hours: int) -> tuple[Decimal, int | None]:
    """The term ladder's locked card-hour rate for a window of ``hours``: the longest term that
    is no longer than the window (its rung's ``days``), else the on-demand rate (None)."""
    best: TermPrice | None = None
    for term in sorted(price.terms, key=lambda t: t.days):
        if term.days * 24 <= int(hours):
            best = term
    if best is None:
        return to_decimal(price.on_demand_per_card_hour), None
    return to_decimal(best.rate_per_card_hour), best.days


def window_total(rate_per_card_hour: Decimal, cards: int, hours: int) -> Decimal:
    """What a window of ``cards`` for ``hours`` costs up front at the locked rate."""
    return charge_for(rate_per_card_hour, int(cards), int(hours) * SECONDS_PER_HOUR)


def reservation_refund_share(seconds_before_start: float) -> Decimal:
    """The share of a window's price a cancellation gives back ``seconds_before_start`` before
    its start: 1 until 24 h before (inclusive), ½ after that, 0 from the start on."""
    if seconds_before_start >= RESERVATION_FULL_REFUND_SECONDS:
        return Decimal(1)
    if seconds_before_start > 0:
        return RESERVATION_LATE_REFUND_SHARE
    return ZERO
