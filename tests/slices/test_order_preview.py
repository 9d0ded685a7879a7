from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from billing.seed import seed_default_prices
from billing.services import grant_voucher
from marketplace.services import accept_license, get_asset_by_hub_id, load_catalogue
from slices import services
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db
URL = reverse("slices:instance-new")


@pytest.fixture
def world() -> None:
    seed_default_prices()
    load_small_fleet()


def test_order_form_needs_login(client: Client) -> None:
    assert client.get(URL).status_code == 302


def test_quote_placement_and_performance_for_a_host(alice_client: Client, world) -> None:
    html = alice_client.get(URL, {"gpu_model": "RTX4090", "cards": 8}).content.decode()
    assert "15.20 元" in html  # 8 cards × 1.90 元 per card-hour
    assert "364.80 元" in html  # per day
    assert "1.20 元" in html  # the 30-day locked price
    assert 'id="order-placement"' in html and "xm-4090" in html


def test_a_slice_shows_its_topology_and_expected_nccl_performance(
    alice_client: Client, world
) -> None:
    html = alice_client.get(URL, {"gpu_model": "H800", "cards": 64}).content.decode()
    assert "GB/s" in html and "µs" in html
    preview = services.preview_allocation(64, "H800")
    assert preview.su_count == 1  # 8 nodes fit one 8-node SU of the small fleet


def test_no_capacity_names_the_reason_and_alternatives(alice_client: Client, world) -> None:
    html = alice_client.get(URL, {"gpu_model": "H800", "cards": 2048}).content.decode()
    assert "alert-warning" in html
    assert "gpu_model=" in html  # links to alternatives


def test_invalid_choices_are_form_errors_not_server_errors(alice_client: Client, world) -> None:
    for params in ({"cards": "7"}, {"gpu_model": "TPU"}, {"disk_gb": "-5"}, {"cards": "x"}):
        response = alice_client.get(URL, params)
        assert response.status_code == 200
        assert "is-invalid" in response.content.decode(), params


def test_the_llama_demo_template_presets_host_image_and_gated_model(
    alice, alice_client: Client, world
) -> None:
    load_catalogue()
    html = alice_client.get(URL, {"template": "llama-7b-demo"}).content.decode()
    assert "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-devel" in html  # the recipe's DeepSpeed image
    assert 'id="mount-error"' in html and "meta-llama/Llama-2-7b-hf" in html  # license first
    model = get_asset_by_hub_id("model", "meta-llama/Llama-2-7b-hf")
    accept_license(alice, model.license)
    html = alice_client.get(URL, {"template": "llama-7b-demo"}).content.decode()
    assert 'id="mount-error"' not in html
    assert "/models/" in html and "/datasets/" in html


def test_affordability_is_checked_against_the_balance(alice, alice_client: Client, world) -> None:
    html = alice_client.get(URL, {"gpu_model": "RTX4090", "cards": 8}).content.decode()
    assert "billing/" in html and "alert-warning" in html  # nothing to spend yet: top up
    grant_voucher(alice, Decimal("100.00"), reason="test", valid_days=3)
    preview = services.preview_order(alice, gpu_model="RTX4090", cards=8)
    assert preview.insufficient_funds == ""
    assert preview.orderable


def test_htmx_request_gets_only_the_form_and_summary(alice_client: Client, world) -> None:
    response = alice_client.get(URL, {"gpu_model": "RTX4090", "cards": 1}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<form method="get"') and 'id="order-summary"' in html
    assert "<html" not in html


def test_preview_reserves_nothing(alice, world) -> None:
    before = [r.free_gpus for r in services.availability()]
    services.preview_order(alice, gpu_model="RTX4090", cards=8)
    assert [r.free_gpus for r in services.availability()] == before
