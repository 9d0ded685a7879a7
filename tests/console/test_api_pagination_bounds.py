"""Every paginated list of the API answers a bad ``?offset=`` or ``?limit=`` with a 400 naming the
field (issue 29: ``?offset=`` ≥ 2⁶³ overflowed the database's integer, a 500 on every list).

The lists are found by walking the URL configuration (every ``/api/`` route without parameters
that answers a page: ``count`` and ``results``), so a list added later is covered too.
"""

from __future__ import annotations

import pytest
from django.test import Client

from slices.models import Instance
from tests.slices.factories import load_small_fleet, make_instance
from tests.support.routes import iter_routes

pytestmark = pytest.mark.django_db

HUGE = str(2**63)


def _paginated(client: Client) -> list[str]:
    lists = []
    for route in iter_routes():
        if not route.path.startswith("/api/") or route.has_params:
            continue
        response = client.get(route.path)
        if response.status_code != 200 or "json" not in response.get("Content-Type", ""):
            continue
        body = response.json()
        if isinstance(body, dict) and {"count", "results"} <= set(body):
            lists.append(route.path)
    return lists


def test_every_paginated_list_answers_a_bad_offset_or_limit_with_a_400_naming_it(
    alice, operator_client: Client
) -> None:
    load_small_fleet()
    make_instance(alice)
    client = Client()
    client.force_login(alice)
    lists = sorted(set(_paginated(client)) | set(_paginated(operator_client)))
    # The lists this console has today: the walk found them all (and would find a new one).
    assert {"/api/v1/instances/", "/api/v1/ssh-keys/", "/api/v1/models/"} <= set(lists), lists
    for path in lists:
        for query, field in (
            (f"offset={HUGE}", "offset"),
            (f"offset={2**64}", "offset"),
            ("offset=1000000001", "offset"),
            ("offset=-1", "offset"),
            ("offset=abc", "offset"),
            ("offset=1e3", "offset"),
            ("limit=0", "limit"),
            ("limit=-5", "limit"),
            ("limit=x", "limit"),
        ):
            response = client.get(f"{path}?{query}")
            assert response.status_code == 400, (path, query, response.status_code)
            body = response.json()
            assert body["error"] == "invalid", (path, query, body)
            assert list(body["fields"]) == [field], (path, query, body)
        # In bounds: a page (empty past the end), and a huge limit is the longest page.
        assert client.get(f"{path}?offset=1000000000").status_code == 200, path
        page = client.get(f"{path}?limit={HUGE}")
        assert page.status_code == 200, path
        assert page.json()["next"] is None or "limit=200" in page.json()["next"], path


def test_an_instances_events_and_logs_take_any_cursor_without_a_500(alice) -> None:
    load_small_fleet()
    inst: Instance = make_instance(alice)
    client = Client()
    client.force_login(alice)
    for kind in ("events", "logs"):
        url = f"/api/v1/instances/{inst.public_id}/{kind}/"
        for query in (f"after={HUGE}", f"after=-{HUGE}", f"limit={HUGE}", "after=x"):
            response = client.get(f"{url}?{query}")
            assert response.status_code in (200, 400), (url, query, response.status_code)
            if response.status_code == 200:
                assert "results" in response.json()
