"""Operator pages (staff only) and the read-only availability API."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from slices import services
from slices.choices import NodeState
from slices.models import Node
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet() -> None:
    load_small_fleet()


def _node_url(node: Node) -> str:
    return reverse("slices:ops-node", args=[node.public_id])


def test_customers_are_refused_every_operator_page(fleet, alice_client: Client) -> None:
    node = Node.objects.first()
    for url in (
        reverse("slices:ops-fleet"),
        reverse("slices:ops-cluster", args=["xm-h800"]),
        _node_url(node),
    ):
        assert alice_client.get(url).status_code == 403
    assert alice_client.post(_node_url(node), {"action": "drain"}).status_code == 403
    node.refresh_from_db()
    assert node.state == NodeState.READY


def test_anonymous_visitors_are_sent_to_log_in(fleet) -> None:
    response = Client().get(reverse("slices:ops-fleet"))
    assert response.status_code == 302 and "login" in response["Location"]


def test_fleet_page_shows_utilisation_per_region_and_model(
    fleet,
    alice,
    operator_client: Client,
    django_assert_max_num_queries,
) -> None:
    services.allocate(alice, 64, "H800")
    services.change_node_state(Node.objects.get(hostname="xm-h8-su03-n08"), "drain")
    with django_assert_max_num_queries(12):
        response = operator_client.get(reverse("slices:ops-fleet"))
    assert response.status_code == 200
    body = response.content.decode()
    assert "H800" in body and "RTX 4090" in body
    assert "64 / 192" in body  # H800 card: used / total GPUs (the drained node is not "used")
    assert (
        '<td class="text-end">120</td><td class="text-end">8</td>' in body
    )  # free, out of service
    assert "<td>厦门</td>" in body  # the default language shows the Chinese region name
    assert reverse("slices:ops-cluster", args=["xm-h800"]) in body


def test_fabric_map_draws_sus_as_rows_and_holders_with_hover_details(
    fleet,
    alice,
    operator_client: Client,
    django_assert_max_num_queries,
) -> None:
    a = services.allocate(alice, 64, "H800")
    url = reverse("slices:ops-cluster", args=["xm-h800"])
    with django_assert_max_num_queries(12):
        response = operator_client.get(url)
    body = response.content.decode()
    assert body.count('data-state="allocated"') == 8
    assert body.count('data-state="ready"') == 16
    assert body.count("su0") >= 3  # one row per SU
    assert a.short_id in body and "alice" in body
    partial = operator_client.get(url, headers={"HX-Request": "true"})
    assert partial.content.decode().lstrip().startswith('<div id="fabric"')


def test_operator_drains_and_returns_a_node(fleet, operator_client: Client) -> None:
    node = Node.objects.get(hostname="xm-h8-su01-n01")
    response = operator_client.post(_node_url(node), {"action": "drain", "note": "IB link flaps"})
    assert response.status_code == 302
    node.refresh_from_db()
    assert (node.state, node.note) == (NodeState.DRAINING, "IB link flaps")
    page = operator_client.get(_node_url(node)).content.decode()
    assert 'value="return"' in page and "GPU-" in page
    operator_client.post(_node_url(node), {"action": "return"}, headers={"HX-Request": "true"})
    node.refresh_from_db()
    assert node.state == NodeState.READY


def test_unknown_node_is_404_for_operators(fleet, operator_client: Client) -> None:
    url = reverse("slices:ops-node", args=["00000000-0000-0000-0000-000000000000"])
    assert operator_client.get(url).status_code == 404


def test_availability_api_lists_regions_models_and_slice_performance(
    fleet,
    alice_client: Client,
) -> None:
    response = alice_client.get("/api/v1/availability/")
    assert response.status_code == 200
    rows = {(r["region"], r["gpu_model"]): r for r in response.json()}
    h800 = rows[("xiamen", "H800")]
    assert h800["free_gpus"] == 192 and h800["largest_slice"] == 192
    assert h800["slice_performance"]["busbw_gbps"] > 0
    assert rows[("xiamen", "RTX4090")]["slice_performance"] is None
    assert Client().get("/api/v1/availability/").status_code in (401, 403)


def test_admin_cannot_overwrite_allocator_state(operator_client, alice) -> None:
    """Node state/health and free masks, GPUs and allocations change only through the services."""
    from slices import services
    from slices.models import Node

    load_small_fleet()
    node = Node.objects.filter(gpu_model__code="RTX4090").order_by("pk").first()
    page = operator_client.get(f"/admin/slices/node/{node.pk}/change/").content.decode()
    assert 'name="state"' not in page and 'name="free_mask"' not in page
    # An allocation commits between the operator opening the form and saving it.
    allocation = services.allocate(alice, 8, "RTX4090")
    held = Node.objects.get(pk=allocation.nodes.get().node_id)
    response = operator_client.post(
        f"/admin/slices/node/{held.pk}/change/",
        {"address": held.address, "ssh_port": held.ssh_port, "host_key_fingerprint": "SHA256:x"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    held.refresh_from_db()
    assert held.host_key_fingerprint == "SHA256:x"  # the operator's edit was saved
    assert held.free_mask == 0  # the allocation's GPUs were not handed back by the form
    for model in ("gpu", "allocation"):
        assert operator_client.post(f"/admin/slices/{model}/1/change/", {}).status_code == 403
