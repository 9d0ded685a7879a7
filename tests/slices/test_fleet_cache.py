"""The pages' shared view of the fleet (`slices.services.fleet.fleet_view`): built once per change
of the fleet, never stale after a claim, a release or a node's change, whoever made it.

Transactional tests: the view is shared only between committed states (a transaction that changed
the fleet reads it afresh), so the commits and their on-commit token are real here. SQLite by
default; the integration run repeats them on PostgreSQL.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone, translation

from billing import services as billing
from billing.seed import seed_default_prices
from slices import services, topology
from slices.choices import NodeHealth
from slices.models import FleetVersion, Node
from slices.services import fleet as fleet_services
from slices.services.allocation import allocate, release_allocation
from slices.services.fleet import availability, build_fleet, fleet_view
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fleet(sim_driver, settings, tmp_path) -> None:
    settings.SLICES_SYSTEM_DISK_GB = 50
    settings.SLICES_PFS_CONSOLE_ROOT = str(tmp_path / "pfs")
    seed_default_prices()  # transactional tests flush the migration-seeded price book
    load_small_fleet()


@pytest.fixture
def customer(alice):
    billing.grant_voucher(alice, Decimal("50000"), reason="test", valid_days=30)
    return alice


def _free(model: str) -> int:
    return sum(a.free_gpus for a in availability() if a.gpu_model == model)


def _row(model: str) -> services.Availability:
    [row] = [a for a in availability() if a.gpu_model == model]
    return row


def _placeable(cards: int, model: str) -> bool:
    try:
        services.preview_allocation(cards, model)
    except services.NoCapacity:
        return False
    return True


def test_the_view_is_built_once_and_read_with_one_query(fleet, django_assert_num_queries) -> None:
    first = fleet_view()
    with django_assert_num_queries(1):  # the key: the token and the nodes' aggregate
        assert fleet_view() is first
    with django_assert_num_queries(1):
        rows = availability()
    assert {(a.region, a.gpu_model, a.free_gpus) for a in rows} == {
        ("xiamen", "H800", 192),
        ("xiamen", "RTX4090", 16),
        ("yinchuan", "A800", 64),
    }


def test_the_fleet_pages_read_no_node_row_while_the_fleet_is_unchanged(
    fleet, customer, client
) -> None:
    """The dashboard, the order form and its live preview, once the view is built: the nodes
    are read only by the key's aggregate (once per look at the fleet), the leases not at all."""
    client.force_login(customer)
    pages = [
        ("/", {}, 1),
        ("/instances/new/?gpu_model=A800&cards=64", {}, 2),  # the choices and the preview
        ("/instances/new/?gpu_model=RTX4090&cards=8", {"HTTP_HX_REQUEST": "true"}, 2),
    ]
    for url, headers, _looks in pages:
        assert client.get(url, **headers).status_code == 200  # the view is built once
    for url, headers, looks in pages:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url, **headers).status_code == 200
        fleet_reads = [
            q["sql"]
            for q in captured
            if '"slices_node"' in q["sql"] or '"slices_allocationnode"' in q["sql"]
        ]
        assert len(fleet_reads) == looks, (url, fleet_reads)
        assert all('"token"' in sql for sql in fleet_reads), fleet_reads


def test_an_order_shows_at_once_and_its_release_gives_the_cards_back(fleet, customer) -> None:
    assert _free("A800") == 64 and _placeable(64, "A800")
    view = fleet_view()
    instance, _created = services.order_instance(
        customer, services.OrderRequest(gpu_model="A800", cards=64)
    )
    instance.refresh_from_db()
    assert instance.state == "running"
    # The claim committed: the next read, in the same process, is of the new fleet.
    assert fleet_view() is not view
    assert _free("A800") == 0 and _row("A800").largest_slice == 0
    assert not _placeable(64, "A800") and not _placeable(1, "A800")
    services.release_instance(instance, by="test")
    instance.refresh_from_db()
    assert instance.state == "released"
    assert _free("A800") == 64 and _row("A800").largest_slice == 64
    assert _placeable(64, "A800")


def test_the_dashboard_and_the_order_form_follow_an_order_and_its_release(
    fleet, customer, client
) -> None:
    client.force_login(customer)
    form = "/instances/new/?gpu_model=RTX4090&cards=8"

    def dashboard_4090() -> str:
        html = client.get("/").content.decode()
        row = html[html.index("RTX 4090", html.index('id="availability"')) :]
        return row[: row.index("</tr>")]

    assert "16 / 16" in dashboard_4090()
    assert "no_capacity" not in client.get(form, HTTP_HX_REQUEST="true").content.decode()
    held = [
        services.order_instance(customer, services.OrderRequest(gpu_model="RTX4090", cards=8))[0]
        for _ in range(2)
    ]
    assert "0 / 16" in dashboard_4090()
    refused = client.get(form, HTTP_HX_REQUEST="true")
    assert refused.context["preview"].no_capacity is not None
    services.release_instance(held[0], by="test")
    assert "8 / 16" in dashboard_4090()
    assert client.get(form, HTTP_HX_REQUEST="true").context["preview"].placement is not None


def test_a_claim_and_a_release_of_the_allocator_are_seen_at_once(fleet, alice) -> None:
    assert _free("H800") == 192
    slices = [allocate(alice, 64, "H800") for _ in range(3)]
    assert _free("H800") == 0
    with pytest.raises(services.NoCapacity) as refused:
        services.preview_allocation(64, "H800")
    # the explanation comes from the same view: A800 fits instead
    assert any(alt["gpu_model"] == "A800" for alt in refused.value.alternatives)
    release_allocation(slices[1])
    assert _free("H800") == 64 and _placeable(64, "H800")


def test_every_committed_claim_and_release_gives_a_new_token(fleet, alice) -> None:
    before = FleetVersion.objects.get(pk=1)
    held = allocate(alice, 8, "RTX4090")
    release_allocation(held)
    after = FleetVersion.objects.get(pk=1)
    assert after.changes == before.changes + 2 and after.token != before.token


def test_a_lease_replaced_on_the_same_gpus_is_seen(fleet, alice) -> None:
    """The node rows end as they were (the same GPUs free): only the token tells the views apart,
    and the earliest start a refusal names moves to the lease that now ends first."""
    now = timezone.now()
    first = allocate(alice, 8, "RTX4090", ends_at=now + timedelta(hours=1))
    allocate(alice, 8, "RTX4090", ends_at=now + timedelta(hours=2))

    def earliest() -> datetime:
        with pytest.raises(services.NoCapacity) as refused:
            services.preview_allocation(8, "RTX4090")
        assert refused.value.earliest is not None
        return refused.value.earliest

    masks = dict(Node.objects.values_list("pk", "free_mask"))
    assert abs(earliest() - (now + timedelta(hours=1))) < timedelta(seconds=1)
    release_allocation(first)
    allocate(alice, 8, "RTX4090", ends_at=now + timedelta(hours=3))
    assert dict(Node.objects.values_list("pk", "free_mask")) == masks
    assert abs(earliest() - (now + timedelta(hours=2))) < timedelta(seconds=1)


def test_the_transaction_that_claims_sees_its_claim_and_others_do_not_keep_it(fleet, alice) -> None:
    shared = fleet_view()
    with transaction.atomic():
        allocate(alice, 8, "RTX4090")
        # This connection changed the fleet: it reads it afresh, and shares nothing it read.
        assert _free("RTX4090") == 8
        assert fleet_view() is not shared
        transaction.set_rollback(True)
    # Rolled back: no new token, the shared view is still the fleet.
    assert fleet_view() is shared and _free("RTX4090") == 16


def test_a_claim_committed_by_another_connection_is_seen_by_this_process(fleet, alice) -> None:
    assert _free("RTX4090") == 16

    def elsewhere() -> None:
        try:
            allocate(alice, 4, "RTX4090")
        finally:
            connection.close()

    worker = threading.Thread(target=elsewhere)
    worker.start()
    worker.join()
    assert _free("RTX4090") == 12


def test_a_nodes_state_shows_at_once(fleet, alice) -> None:
    node = Node.objects.filter(cluster__code="xm-4090").order_by("pk").first()
    assert _row("RTX4090").out_of_service_gpus == 0
    assert services.change_node_state(node, "drain")
    assert _row("RTX4090").out_of_service_gpus == 8 and _free("RTX4090") == 8
    assert services.change_node_state(node, "return")
    assert _row("RTX4090").out_of_service_gpus == 0 and _free("RTX4090") == 16


def test_a_node_changed_outside_the_allocator_is_seen(fleet) -> None:
    """A teardown that failed marks its node degraded with a plain update (no token): the key's
    aggregate of the node rows moves, so the view is rebuilt."""
    view = fleet_view()
    node = Node.objects.filter(cluster__code="yc-a800").order_by("pk").first()
    Node.objects.filter(pk=node.pk).update(health=NodeHealth.DEGRADED)
    assert fleet_view() is not view
    row = _row("A800")
    assert row.out_of_service_gpus == 8 and row.largest_slice == 0
    Node.objects.filter(pk=node.pk).update(health=NodeHealth.OK)
    assert _row("A800").largest_slice == 64


def test_region_names_follow_the_readers_language_from_one_view(fleet) -> None:
    view = fleet_view()
    with translation.override("en"):
        english = {a.region_name for a in availability()}
    with translation.override("zh-hans"):
        chinese = {a.region_name for a in availability()}
    assert fleet_view() is view
    assert english == {"Xiamen", "Yinchuan"} and chinese == {"厦门", "银川"}


def test_a_view_past_its_age_is_rebuilt(fleet, monkeypatch) -> None:
    view = fleet_view()
    monkeypatch.setattr(fleet_services, "FLEET_VIEW_MAX_AGE_SECONDS", 0.0)
    assert fleet_view() is not view


def test_without_the_token_row_nothing_is_shared_until_a_change_makes_it(fleet, alice) -> None:
    FleetVersion.objects.all().delete()  # as a test's flush does
    assert fleet_view() is not fleet_view()
    allocate(alice, 1, "RTX4090")
    assert FleetVersion.objects.get(pk=1).changes == 1
    assert fleet_view() is fleet_view()
    assert _free("RTX4090") == 15


@pytest.mark.parametrize(
    ("cards", "model", "region"),
    [
        (1, "RTX4090", None),
        (2, "RTX4090", "xiamen"),
        (8, "RTX4090", None),
        (8, "H800", None),
        (64, "H800", "xiamen"),
        (8, "A800", "yinchuan"),
        (64, "A800", None),
    ],
)
def test_the_preview_on_the_shared_view_is_the_plan_on_a_fresh_read(
    fleet, alice, cards, model, region
) -> None:
    # A used fleet: partly used hosts, a slice, a drained node.
    allocate(alice, 2, "RTX4090")
    allocate(alice, 1, "RTX4090")
    allocate(alice, 64, "H800")
    allocate(alice, 4, "H800")
    drained = Node.objects.filter(cluster__code="xm-h800", free_mask=255).order_by("-pk").first()
    services.change_node_state(drained, "drain")
    preview = services.preview_allocation(cards, model, region)
    req = topology.Request("same", cards, model, region)
    fresh, _nodes = build_fleet(model)
    planned = fresh.plan(req)
    assert isinstance(planned, topology.Placement)
    with fleet_view().planning() as shared:
        on_view = shared.plan(req)
    # the same GPUs of the same nodes, in rank order (node ids are each fleet's own numbering)
    assert isinstance(on_view, topology.Placement)
    assert [(s.hostname, s.gpus, s.su) for s in on_view.shares] == [
        (s.hostname, s.gpus, s.su) for s in planned.shares
    ]
    assert (preview.cluster, preview.node_count, preview.su_count) == (
        planned.cluster,
        len(planned.shares),
        planned.su_count,
    )
    assert (preview.su_min_structural, preview.at_structural_minimum) == (
        planned.su_min_structural,
        planned.at_structural_minimum,
    )
