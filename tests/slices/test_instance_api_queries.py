"""The instance list answers in the same number of queries however many instances a page holds
(costs, disks and nodes are looked up once for the page, not once per instance)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from billing import services as billing
from slices import services
from slices.services import disks as disk_service

pytestmark = pytest.mark.django_db
URL = "/api/v1/instances/"


def _order(user, n: int, django_capture_on_commit_callbacks, disks=()) -> None:
    for i in range(n):
        with django_capture_on_commit_callbacks(execute=True):
            services.order_instance(
                user,
                services.OrderRequest(gpu_model="RTX4090", cards=1, name=f"q{i}", disks=disks),
            )


def _list_queries(api: APIClient) -> tuple[int, list[dict]]:
    with CaptureQueriesContext(connection) as ctx:
        r = api.get(URL)
    assert r.status_code == 200, r.content
    return len(ctx.captured_queries), r.json()["results"]


def test_the_list_costs_the_same_queries_for_two_or_six_instances(
    sim_fleet, alice, django_capture_on_commit_callbacks
):
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    api = APIClient()
    api.force_authenticate(alice)
    disk = disk_service.create_disk(alice, name="data", size_gb=10, region="xiamen")
    _order(alice, 1, django_capture_on_commit_callbacks, disks=((str(disk.public_id), "ro"),))
    _order(alice, 1, django_capture_on_commit_callbacks)
    few, rows = _list_queries(api)
    assert len(rows) == 2
    _order(alice, 4, django_capture_on_commit_callbacks)
    many, rows = _list_queries(api)
    assert len(rows) == 6
    print(f"{few} queries for 2 instances, {many} for 6")
    assert many == few, f"{few} queries for 2 instances, {many} for 6"
    # Each row still carries its own cost, nodes and disks, as the retrieve answers them.
    for row in rows:
        one = api.get(f"{URL}{row['id']}/").json()
        assert (row["cost_so_far"], row["nodes"], row["disks"]) == (
            one["cost_so_far"],
            one["nodes"],
            one["disks"],
        )
    assert sum(len(row["disks"]) for row in rows) == 1
