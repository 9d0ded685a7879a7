"""Operator pages speak the page's language: clusters named in Chinese on Chinese pages, GPU
product names rather than fleet codes, the list filter's button not Django admin's word, and a
fabric occupant shown by its instance's id (the one the instance page shows)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from billing import services as billing
from slices import services
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(sim_driver) -> None:
    """The small fleet on the simulated driver with instant steps (an order provisions at once)."""
    load_small_fleet()


def test_the_fleet_and_cluster_pages_in_chinese(fleet, operator_client) -> None:
    page = operator_client.get(reverse("slices:ops-fleet"), HTTP_ACCEPT_LANGUAGE="zh-hans").content
    html = page.decode()
    assert "RTX 4090" in html and ">RTX4090<" not in html
    cluster = operator_client.get(
        reverse("slices:ops-cluster", args=["xm-h800"]), HTTP_ACCEPT_LANGUAGE="zh-hans"
    ).content.decode()
    assert "厦门 H800 · InfiniBand HDR" in cluster
    english = operator_client.get(
        reverse("slices:ops-cluster", args=["xm-h800"]), HTTP_ACCEPT_LANGUAGE="en"
    ).content.decode()
    assert "厦门" not in english
    listing = operator_client.get(reverse("slices:ops-instances"), HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert "过滤器" not in listing.content.decode() and "筛选" in listing.content.decode()


def test_a_fabric_occupant_carries_its_instances_id(
    fleet, operator_client, alice, django_capture_on_commit_callbacks
) -> None:
    billing.grant_voucher(alice, Decimal("50000"), reason="test", valid_days=30)
    with django_capture_on_commit_callbacks(execute=True):
        instance, _ = services.order_instance(
            alice, services.OrderRequest(gpu_model="RTX4090", cards=8, name="occupant")
        )
    instance.refresh_from_db()
    cluster = instance.allocation.cluster.code
    html = operator_client.get(reverse("slices:ops-cluster", args=[cluster])).content.decode()
    assert instance.short_id in html
    if instance.allocation.short_id != instance.short_id:
        assert instance.allocation.short_id not in html
