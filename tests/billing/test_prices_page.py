"""The public price page and calculator: what a visitor sees before signing up."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from billing import offers, services
from billing.models import GpuPrice, PriceBook, TermPrice

pytestmark = pytest.mark.django_db


def _text(html: str) -> str:
    main = re.search(r"<main.*?</main>", html, re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", main.group(0) if main else html))


def _get(client: Client, path: str, language: str = "en") -> str:
    response = client.get(path, HTTP_ACCEPT_LANGUAGE=language)
    assert response.status_code == 200, response
    return response.content.decode()


def test_prices_are_public_and_list_every_model_with_terms_and_what_is_free(
    client: Client, prices: None
) -> None:
    text = _text(_get(client, reverse("billing:prices")))
    for model in GpuPrice.objects.values_list("gpu_model", flat=True):
        assert model in text
    assert "RTX 4090 1.90 元" in text
    assert "A800 3.50 元" in text
    assert "30 days: 1.20 元" in text  # the locked-price term
    assert "Parallel file system Free" in text
    assert "Traffic Free" in text
    assert f"Trial credit {services.TRIAL_CREDIT} 元" in text
    assert "100,000.00 元" in text  # the top-up voucher rule
    book = services.current_price_book()
    assert f"the first {book.storage_free_gb} GB free" in text  # cloud disks, a working feature


def test_no_page_calls_a_working_feature_coming_soon(client: Client, prices: None) -> None:
    """Cloud disks are orderable: the price page and the calculator say what they cost, with no
    "coming soon" left from before they existed."""
    for path in (reverse("billing:prices"), reverse("billing:quote")):
        assert "coming soon" not in _get(client, path, "en").lower()
        zh = _get(client, path, "zh-hans")
        assert "即将" not in zh
    assert "云盘与已关机实例的系统盘" in _get(client, reverse("billing:prices"), "zh-hans")


def test_a_placeholder_price_is_not_yet_available_and_never_shown_as_a_price(
    client: Client, prices: None
) -> None:
    h800 = GpuPrice.objects.get(gpu_model="H800")
    assert h800.is_placeholder
    for language in ("en", "zh-hans"):
        html = _get(client, reverse("billing:prices"), language)
        row = re.search(r'<tr data-gpu-model="H800">.*?</tr>', html, re.S).group(0)
        assert f"{h800.on_demand_per_card_hour}" not in row
        assert "占位" not in html and "placeholder" not in html.lower()
    assert "暂未开放" in _get(client, reverse("billing:prices"), "zh-hans")
    assert "Not yet available" in _get(client, reverse("billing:prices"), "en")


def test_the_calculator_quotes_for_a_visitor_without_a_balance(
    client: Client, prices: None
) -> None:
    url = reverse("billing:quote") + "?gpu_model=RTX+4090&cards=8&disk_gb=0"
    html = _get(client, url)
    assert 'id="quote-per-hour">15.20 元' in html
    assert "Your balance lasts" not in html
    assert reverse("account_signup") in html


def test_the_calculator_refuses_a_model_without_a_published_price(
    client: Client, alice_client: Client, prices: None
) -> None:
    url = reverse("billing:quote") + "?gpu_model=H800&cards=8&disk_gb=0"
    for who in (client, alice_client):
        html = _get(who, url)
        assert "H800 is not yet available." in html
        assert "quote-per-hour" not in html
        assert "7.00 元" not in html


def test_the_calculator_shows_a_customer_how_long_the_balance_lasts(
    alice, alice_client: Client, prices: None
) -> None:
    services.grant_trial_credit(alice)
    url = reverse("billing:quote") + "?gpu_model=RTX+4090&cards=8&disk_gb=0"
    assert "39 min 28 s" in _text(_get(alice_client, url))  # 10 元 at 15.20 元/h


def test_the_cheapest_locked_price_names_its_model_and_ignores_placeholders(
    prices: None,
) -> None:
    book = PriceBook.objects.get()
    # A cheaper term on a placeholder model is not an offer.
    TermPrice.objects.create(
        price_book=book, gpu_model="H800", days=30, rate_per_card_hour=Decimal("0.50")
    )
    best = offers.price_sheet().cheapest_term
    assert (best.gpu_model, best.days, best.rate_per_card_hour) == ("RTX 4090", 30, Decimal("1.20"))
    GpuPrice.objects.filter(gpu_model="H800").update(is_placeholder=False)
    best = offers.price_sheet().cheapest_term
    assert (best.gpu_model, best.rate_per_card_hour) == ("H800", Decimal("0.50"))


def test_no_price_book_no_claims(client: Client) -> None:
    TermPrice.objects.all().delete()
    GpuPrice.objects.all().delete()
    PriceBook.objects.all().delete()
    sheet = offers.price_sheet()
    assert sheet.prices == () and sheet.cheapest_term is None and sheet.trial_runway() is None
    assert "No prices are published yet." in _get(client, reverse("billing:prices"))


def test_the_billing_page_shows_no_placeholder_to_a_customer(
    alice_client: Client, prices: None
) -> None:
    html = _get(alice_client, reverse("billing:overview"), "zh-hans")
    assert "占位" not in html
    assert "暂未开放" in html
