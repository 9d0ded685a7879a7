"""The instance reads every API client polls (issue 22): one representation (InstanceSerializer's
fields, read from the model; the list, one instance and an action's answer agree on every one),
the same few queries for a 1-card host as for a 64-card slice, pages whose count is exact whether
or not it needed its own query, and nothing of another customer's."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from billing import services as billing
from slices import services
from slices.api.serializers import InstanceSerializer
from slices.models import Instance

pytestmark = pytest.mark.django_db
URL = "/api/v1/instances/"
# Change with the time or with the order a page is read in: compared apart.
MOVING = {"cost_so_far", "eta_seconds"}


def _api(user) -> APIClient:  # noqa: ANN001
    api = APIClient()
    api.force_authenticate(user)
    return api


def _order(user, callbacks, cards: int = 1, **extra) -> Instance:  # noqa: ANN001
    model = "A800" if cards >= 64 else "RTX4090"
    with callbacks(execute=True):
        instance, _ = services.order_instance(
            user, services.OrderRequest(gpu_model=model, cards=cards, **extra)
        )
    instance.refresh_from_db()
    return instance


def _fixed(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in MOVING}


def _detail(api: APIClient, public_id: object) -> tuple[dict, int]:
    with CaptureQueriesContext(connection) as ctx:
        response = api.get(f"{URL}{public_id}/")
    assert response.status_code == 200, response.content
    return response.json(), len(ctx.captured_queries)


def test_the_list_one_instance_and_an_action_answer_every_field_alike(
    sim_fleet, alice, django_capture_on_commit_callbacks
) -> None:
    billing.grant_voucher(alice, Decimal("50000"), reason="test", valid_days=30)
    callbacks = django_capture_on_commit_callbacks
    host = _order(alice, callbacks, name="host")
    big = _order(alice, callbacks, cards=64, name="big")
    failed = _order(alice, callbacks, name="broken", platform_env={"SIM_FAIL": "mount"})
    assert (host.state, big.state, failed.state) == ("running", "running", "failed")
    api = _api(alice)
    fields = set(InstanceSerializer().fields)

    rows = {r["id"]: r for r in api.get(URL).json()["results"]}
    assert set(rows) == {str(i.public_id) for i in (host, big, failed)}
    host_row, host_queries = _detail(api, host.public_id)
    big_row, big_queries = _detail(api, big.public_id)
    failed_row, _ = _detail(api, failed.public_id)
    for one in (host_row, big_row, failed_row):
        assert set(one) == fields and set(rows[one["id"]]) == fields
        assert _fixed(one) == _fixed(rows[one["id"]])
    assert len(big_row["nodes"]) == 8 and big_row["nodes"][0]["rank"] == 0
    assert host_row["ssh"]["command"].startswith("ssh") and host_row["gpu_model_name"]
    assert failed_row["failure"]["code"] and failed_row["ssh"] is None
    assert Decimal(host_row["cost_so_far"]) >= 0 and host_row["eta_seconds"] is None
    assert big_queries == host_queries  # 8 nodes cost what 1 does
    print(f"one instance: {host_queries} queries")

    with callbacks(execute=True):
        released = api.post(f"{URL}{host.public_id}/release/")
    assert released.status_code == 202 and set(released.json()) == fields
    after, _ = _detail(api, host.public_id)
    assert _fixed(released.json()) | {"state": after["state"]} == _fixed(after) | {
        "ended_at": released.json()["ended_at"]
    }


def test_pages_count_exactly_and_link_to_their_neighbours(
    sim_fleet, alice, bob, django_capture_on_commit_callbacks
) -> None:
    billing.grant_voucher(alice, Decimal("50000"), reason="test", valid_days=30)
    billing.grant_voucher(bob, Decimal("5000"), reason="test", valid_days=30)
    mine = [_order(alice, django_capture_on_commit_callbacks, name=f"i{n}") for n in range(5)]
    _order(bob, django_capture_on_commit_callbacks, name="bobs")
    newest_first = [str(i.public_id) for i in reversed(mine)]
    api = _api(alice)
    for limit, offset in [(50, 0), (5, 0), (2, 0), (2, 2), (2, 4), (2, 5), (3, 9), (1, 1)]:
        with CaptureQueriesContext(connection) as ctx:
            body = api.get(f"{URL}?limit={limit}&offset={offset}").json()
        assert body["count"] == 5, (limit, offset)
        assert [r["id"] for r in body["results"]] == newest_first[offset : offset + limit]
        assert (body["next"] is None) == (offset + limit >= 5)
        assert (body["previous"] is None) == (offset == 0)
        counted = any("COUNT(" in q["sql"].upper() for q in ctx.captured_queries)
        # A page that holds the rest from its start tells the count: no query for it.
        assert counted == (not 0 < 5 - offset < limit), (limit, offset)
    assert api.get(f"{URL}?state=released").json() == {
        "count": 0,
        "next": None,
        "previous": None,
        "results": [],
    }


def test_another_customers_instance_is_not_found_and_not_listed(
    sim_fleet, alice, bob, django_capture_on_commit_callbacks
) -> None:
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    theirs = _order(alice, django_capture_on_commit_callbacks, name="alices")
    api = _api(bob)
    response = api.get(f"{URL}{theirs.public_id}/")
    assert response.status_code == 404 and response.json()["error"] == "not_found"
    assert api.get(f"{URL}?state=all").json()["count"] == 0
    assert api.get(f"{URL}not-a-uuid/").status_code == 404
    anonymous = APIClient().get(f"{URL}{theirs.public_id}/")
    assert anonymous.status_code == 401
