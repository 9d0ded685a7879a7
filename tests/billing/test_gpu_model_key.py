"""One rule for a GPU model's key (``billing.pricing.gpu_model_key``): the price book's product
names and the fleet's codes meet on it, however either is spelled."""

from __future__ import annotations

import pytest

from billing import pricing
from billing import services as billing
from billing.seed import GPU_PRICES
from slices.fleetfile import SHIPPED_FLEET, load_fleet_file


@pytest.mark.parametrize(
    ("spelling", "key"),
    [
        ("RTX 4090", "RTX4090"),
        ("RTX4090", "RTX4090"),
        ("rtx-4090", "RTX4090"),
        (" RTX\u30004090 ", "RTX4090"),  # an ideographic space
        ("ＲＴＸ４０９０", "RTX4090"),  # full-width, as a Chinese input method types it
        ("A800", "A800"),
        ("H800", "H800"),
        ("H100-SXM", "H100SXM"),  # punctuation never tells two products apart
        ("H100 SXM", "H100SXM"),
        ("h100_sxm5", "H100SXM5"),
        ("", ""),
    ],
)
def test_letters_and_digits_upper_cased_after_nfkc(spelling: str, key: str) -> None:
    assert pricing.gpu_model_key(spelling) == key


def test_the_seed_price_names_match_the_shipped_fleet_codes() -> None:
    codes = {m.code for m in load_fleet_file(SHIPPED_FLEET).gpu_models}
    by_key = {pricing.gpu_model_key(c): c for c in codes}
    assert {name: by_key.get(pricing.gpu_model_key(name)) for name, _rate, _ph in GPU_PRICES} == {
        "RTX 4090": "RTX4090",
        "A800": "A800",
        "H800": "H800",
    }


def test_other_apps_get_the_same_function_through_billing_services() -> None:
    assert billing.gpu_model_key is pricing.gpu_model_key
