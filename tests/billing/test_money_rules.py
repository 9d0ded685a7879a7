"""Money rules that lived outside billing (issue 30), now billing's pure functions: the AI-app
launch's six minutes of balance, the demo's rounded-up most cost, the storage a kept disk adds."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.money import charge_for
from billing.pricing import (
    APP_LAUNCH_MIN_SECONDS,
    StoragePrice,
    covers_app_launch,
    most_charged,
)


@pytest.mark.parametrize(
    ("balance", "per_hour", "covered"),
    [
        ("0.19", "1.90", True),  # exactly six minutes of one RTX 4090
        ("0.18", "1.90", False),
        ("1.52", "15.20", True),  # eight cards
        ("1.51", "15.20", False),
        ("0.00", "0.00", True),  # a free app needs no balance
        ("-0.01", "0.00", False),  # a debt does not launch even a free one
        ("0.3501", "3.50", True),
    ],
    ids=["one-card-exact", "one-card-short", "eight-cards-exact", "eight-cards-short", "free",
         "debt-free", "a800-above"],
)  # fmt: skip
def test_an_app_launches_on_a_balance_that_pays_for_six_minutes(
    balance: str, per_hour: str, covered: bool
) -> None:
    assert APP_LAUNCH_MIN_SECONDS == 360
    assert covers_app_launch(Decimal(balance), Decimal(per_hour)) is covered


@pytest.mark.parametrize(
    ("per_hour", "seconds", "most"),
    [
        ("15.20", 30 * 60, "7.60"),  # the README's demo: 8 × 1.90 元/h for 30 minutes
        ("28.00", 21 * 60, "9.80"),
        ("1.90", 1, "0.01"),  # 0.000527… 元: up to the cent, never down
        ("1.90", 7, "0.01"),  # 0.0036… rounds half up to 0.00 in metering; the promise says 0.01
        ("1.90", 0, "0.00"),
    ],
    ids=["demo-4090", "demo-a800", "one-second", "seven-seconds", "nothing"],
)
def test_the_most_a_run_can_cost_is_rounded_up_to_the_cent(
    per_hour: str, seconds: int, most: str
) -> None:
    got = most_charged(Decimal(per_hour), seconds)
    assert got == Decimal(most)
    # Never below what metering charges for the same time at the same hourly price.
    assert got >= charge_for(Decimal(per_hour), 1, seconds)


@pytest.mark.parametrize(
    ("free_gb", "total_gb", "gb", "added", "free"),
    [
        (0, 50, 50, "0.25", False),  # nothing free: the disk's own GB
        (100, 80, 50, "0.00", True),  # inside the allowance with the account's other storage
        (100, 130, 50, "0.15", False),  # only the 30 GB past the allowance
        (100, 250, 50, "0.25", False),  # the allowance already used by the other storage
        (100, 100, 50, "0.00", True),  # exactly at the allowance
    ],
    ids=["no-allowance", "within", "partly-over", "all-over", "at-the-edge"],
)
def test_a_kept_system_disk_adds_its_share_of_the_accounts_storage_charge(
    free_gb: int, total_gb: int, gb: int, added: str, free: bool
) -> None:
    price = StoragePrice(per_gb_day=Decimal("0.005"), free_gb=free_gb)
    assert price.added_per_day(total_gb, gb) == Decimal(added)
    assert price.within_free(total_gb) is free
    assert price.added_per_day(total_gb, gb) == price.per_day(total_gb) - price.per_day(
        total_gb - gb
    )
