"""Ordering from the page: sensible defaults, runway refusal with the top-up link, the order."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.test import Client

from billing import services as billing
from console.services import add_ssh_key
from slices.models import Instance
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db
URL = "/instances/new/"
KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"
)


@pytest.fixture
def world(settings):
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    load_small_fleet()


def test_form_opens_on_a_cheap_available_host_with_the_default_key(
    alice, alice_client: Client, world
):
    add_ssh_key(alice, name="laptop", public_key=KEY, make_default=True)
    html = alice_client.get(URL).content.decode()
    assert 'value="RTX4090" selected' in html and 'value="1" selected' in html
    assert "RTX 4090" in html  # the product name is shown
    heading = re.search(r'id="order-placement".*?<h2[^>]*>(.*?)</h2>', html, re.S)
    assert heading and heading.group(1).strip() == "1 × RTX 4090", heading  # never the fleet code
    key = alice.ssh_keys.get()
    assert f'value="{key.public_id}" selected' in html


def test_cards_offered_only_where_they_can_run(alice_client: Client, world):
    html = alice_client.get(URL, {"gpu_model": "RTX4090"}).content.decode()
    assert 'value="64"' not in html  # RTX 4090 has no InfiniBand cluster: no slices offered
    html = alice_client.get(URL, {"gpu_model": "A800"}).content.decode()
    assert 'value="64"' in html


def test_runway_refusal_on_the_form_links_to_top_up(alice, alice_client: Client, world):
    billing.grant_voucher(alice, Decimal("10"), reason="test", valid_days=30)
    html = alice_client.get(URL, {"gpu_model": "A800", "cards": 64}).content.decode()
    assert 'id="insufficient-funds"' in html and "/billing/" in html
    assert (
        'id="order-button" disabled' in html.replace("\n", " ")
        or "disabled aria-describedby" in html
    )
    r = alice_client.post(URL, {"gpu_model": "A800", "cards": 64, "billing_mode": "on_demand"})
    assert r.status_code == 409 and not Instance.objects.exists()


def test_posting_the_form_orders_and_opens_the_instance(
    alice, alice_client: Client, world, django_capture_on_commit_callbacks
):
    billing.grant_voucher(alice, Decimal("500"), reason="test", valid_days=30)
    with django_capture_on_commit_callbacks(execute=True):
        r = alice_client.post(
            URL,
            {
                "gpu_model": "RTX4090",
                "cards": 8,
                "name": "订单 <b>$(x)</b>",
                "billing_mode": "on_demand",
                "auto_release_hours": "2",
            },
        )
    instance = Instance.objects.get()
    assert r.status_code == 302 and r["Location"].endswith(f"/instances/{instance.public_id}/")
    assert instance.name == "订单 <b>$(x)</b>" and instance.auto_release_at is not None
    page = alice_client.get(r["Location"]).content.decode()
    assert "订单 &lt;b&gt;$(x)&lt;/b&gt;" in page
    assert instance.ssh_command in page


def test_models_are_offered_only_in_regions_that_have_them(alice_client: Client, world):
    html = alice_client.get(URL, {"region": "yinchuan"}).content.decode()
    assert 'value="H800"' not in html  # the small fleet has H800 only in Xiamen


def test_fabric_map_names_the_instance_holding_a_node(
    alice, operator, world, django_capture_on_commit_callbacks
):
    from slices import services

    billing.grant_voucher(alice, Decimal("500"), reason="test", valid_days=30)
    with django_capture_on_commit_callbacks(execute=True):
        instance, _ = services.order_instance(
            alice, services.OrderRequest(gpu_model="RTX4090", cards=8, name="fabric-holder")
        )
    client = Client()
    client.force_login(operator)
    cluster = instance.allocation.cluster.code
    html = client.get(f"/ops/clusters/{cluster}/").content.decode()
    assert "fabric-holder" in html
    assert "fabric-holder" in client.get("/ops/instances/").content.decode()


def test_the_event_list_is_served_on_its_own_for_live_updates(alice, alice_client: Client, world):
    from tests.slices.factories import make_instance

    instance = make_instance(alice)
    from slices.services.instances import record_event

    record_event(
        instance,
        "state",
        code="ordered",
        params={"cards": 1, "gpu_model": "RTX4090", "user": "alice"},
    )
    url = f"/instances/{instance.public_id}/"
    html = alice_client.get(url, {"part": "events"}, HTTP_HX_REQUEST="true").content.decode()
    assert html.lstrip().startswith('<ol class="list-unstyled small mb-0" id="instance-events">')
    assert "<li" in html
    live = alice_client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert live.lstrip().startswith('<div id="instance-live"')
