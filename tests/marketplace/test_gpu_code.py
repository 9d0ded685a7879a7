"""One GPU model key (issue 30): the catalogue's ``gpu_code`` maps every spelling of a card onto
billing's key (``billing.pricing.gpu_model_key``), over billing's one list of GPU models. Pure."""

from __future__ import annotations

import pytest

from billing import seed
from billing.pricing import GPU_KEYS, GPU_PRODUCTS, gpu_model_key
from marketplace.catalogue import GPU_LABELS, GPU_MODELS, gpu_code


def _spellings(product: str) -> list[str]:
    """How people and files write a product: the price book's name, the fleet's code, lower case,
    hyphenated, with stray spaces, full width (a Chinese input method)."""
    key = gpu_model_key(product)
    letters = "".join(ch for ch in key if ch.isalpha())
    digits = key[len(letters) :] if key.startswith(letters) else ""
    hyphenated = f"{letters}-{digits}" if letters and digits else key
    full_width = "".join(chr(ord(ch) + 0xFEE0) for ch in key)
    return [product, key, key.lower(), hyphenated.lower(), hyphenated, f"  {product} ", full_width]


@pytest.mark.parametrize("product", GPU_PRODUCTS, ids=str)
def test_every_spelling_of_a_billed_gpu_model_is_billings_key(product: str) -> None:
    key = gpu_model_key(product)
    for spelling in _spellings(product):
        assert gpu_code(spelling) == key, spelling


def test_the_issue_s_example() -> None:
    assert gpu_code("rtx-4090") == "RTX4090" == gpu_model_key("rtx-4090")


def test_the_catalogue_knows_exactly_billings_gpu_keys() -> None:
    assert GPU_MODELS == GPU_KEYS
    assert {gpu_code(k) for k in GPU_KEYS} == set(GPU_KEYS)
    assert {k: GPU_LABELS[k] for k in GPU_KEYS} == dict(zip(GPU_KEYS, GPU_PRODUCTS, strict=True))


def test_every_gpu_model_the_seed_price_book_prices_is_a_catalogue_gpu() -> None:
    priced = {gpu_model_key(name) for name, _rate, _placeholder in seed.GPU_PRICES}
    termed = {gpu_model_key(name) for name, _days, _rate in seed.TERM_PRICES}
    assert priced == set(GPU_KEYS)
    assert termed <= priced
    assert all(gpu_code(name) == gpu_model_key(name) for name, _r, _p in seed.GPU_PRICES)


@pytest.mark.parametrize("value", ["", "V100", "GTX 1080", "RTX 409", "4090", "A8000"], ids=repr)
def test_anything_else_is_no_card(value: str) -> None:
    assert gpu_code(value) == ""
