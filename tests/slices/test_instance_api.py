"""The instances API: order (Idempotency-Key), list, retrieve, release, events, logs, errors."""

from __future__ import annotations

from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from billing import services as billing
from billing.models import UsageSession
from slices.models import Instance, Node

pytestmark = pytest.mark.django_db
URL = "/api/v1/instances/"


def _client(user) -> APIClient:
    c = APIClient()
    c.force_authenticate(user)
    return c


def _fund(user, amount="5000"):
    billing.grant_voucher(user, Decimal(amount), reason="test", valid_days=30)


def test_order_runs_and_release_charges_to_the_second(
    sim_fleet, alice, django_capture_on_commit_callbacks
):
    _fund(alice)
    api = _client(alice)
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post(URL, {"gpu_model": "RTX 4090", "cards": 8, "name": "demo"}, format="json")
    assert r.status_code == 202, r.json()
    body = r.json()
    assert body["state"] in ("provisioning", "running") and body["gpu_model"] == "RTX4090"
    got = api.get(f"{URL}{body['id']}/").json()
    assert got["state"] == "running" and got["ssh"]["command"].startswith("ssh")
    assert got["simulated"] is True and got["progress"] == 100
    events = api.get(f"{URL}{body['id']}/events/").json()
    assert set(events) == {"count", "next", "previous", "results"}  # every list's shape
    codes = [e["code"] for e in events["results"]]
    assert codes[:4] == ["ordered", "allocating", "allocated", "provisioning"]
    assert events["count"] == len(codes) and events["next"] is None
    assert api.get(f"{URL}{body['id']}/logs/").json()["results"]
    # A page at a time, the cursor in next: the pages join up without a gap or a repeat.
    first = api.get(f"{URL}{body['id']}/events/?limit=3").json()
    assert [e["code"] for e in first["results"]] == codes[:3] and first["count"] == len(codes)
    second = api.get(first["next"]).json()
    assert [e["code"] for e in second["results"]] == codes[3:6]
    bad = api.get(f"{URL}{body['id']}/events/?after=x")
    assert bad.status_code == 400 and bad.json()["error"] == "invalid"
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post(f"{URL}{body['id']}/release/")
    assert r.status_code == 202 and r.json()["state"] == "releasing"
    assert api.get(f"{URL}{body['id']}/").json()["state"] == "released"
    session = UsageSession.objects.get(resource_id=body["id"])
    assert session.state == "closed"
    assert all(n.free_mask == n.full_mask for n in Node.objects.filter(gpu_model__code="RTX4090"))


def test_idempotency_key_replays_and_refuses_another_body(
    sim_fleet, alice, django_capture_on_commit_callbacks
):
    _fund(alice)
    api = _client(alice)
    order = {"gpu_model": "RTX4090", "cards": 1}
    with django_capture_on_commit_callbacks(execute=True):
        first = api.post(URL, order, format="json", HTTP_IDEMPOTENCY_KEY="k1")
        again = api.post(URL, order, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == 202 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert Instance.objects.count() == 1
    other = api.post(URL, {**order, "cards": 2}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"


def test_runway_refusal_names_the_amount_to_top_up(sim_fleet, alice):
    _fund(alice, "10")
    r = _client(alice).post(URL, {"gpu_model": "A800", "cards": 128}, format="json")
    assert r.status_code == 402, r.json()
    body = r.json()
    assert body["error"] == "insufficient_funds"
    assert Decimal(body["shortfall"]) == Decimal(body["needed"]) - Decimal("10")
    assert not Instance.objects.exists()


def test_no_capacity_is_409_with_alternatives_and_nothing_kept(sim_fleet, alice):
    _fund(alice, "50000")
    r = _client(alice).post(
        URL, {"gpu_model": "A800", "cards": 1024, "region": "yinchuan"}, format="json"
    )
    assert r.status_code in (400, 409), r.json()
    assert not Instance.objects.exists()
    assert all(n.free_mask == n.full_mask for n in Node.objects.all())


def test_quota_is_enforced(sim_fleet, alice, settings, django_capture_on_commit_callbacks):
    settings.SLICES_DEFAULT_GPU_QUOTA = 8
    _fund(alice)
    api = _client(alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert api.post(URL, {"gpu_model": "RTX4090", "cards": 8}, format="json").status_code == 202
    r = api.post(URL, {"gpu_model": "RTX4090", "cards": 1}, format="json")
    assert r.status_code == 409 and r.json()["error"] == "quota_exceeded"


def test_hostile_env_names_are_refused(sim_fleet, alice):
    _fund(alice)
    r = _client(alice).post(
        URL, {"gpu_model": "RTX4090", "cards": 1, "env": {"A;rm -rf /": "x"}}, format="json"
    )
    assert r.status_code == 400 and not Instance.objects.exists()


def test_state_cannot_be_set_through_the_api(sim_fleet, alice, django_capture_on_commit_callbacks):
    _fund(alice)
    with django_capture_on_commit_callbacks(execute=True):
        r = _client(alice).post(
            URL,
            {"gpu_model": "RTX4090", "cards": 1, "state": "released", "owner": 99},
            format="json",
        )
    assert r.status_code == 202
    assert Instance.objects.get().created_by == alice


def test_other_customers_get_404(sim_fleet, alice, bob, django_capture_on_commit_callbacks):
    _fund(alice)
    with django_capture_on_commit_callbacks(execute=True):
        pid = (
            _client(alice)
            .post(URL, {"gpu_model": "RTX4090", "cards": 1}, format="json")
            .json()["id"]
        )
    api = _client(bob)
    assert api.get(f"{URL}{pid}/").status_code == 404
    assert api.post(f"{URL}{pid}/release/").status_code == 404
    assert (
        api.get(URL).json()["results"] == []
        if "results" in api.get(URL).json()
        else api.get(URL).json() == []
    )


def test_quotes_accept_the_fleet_code_and_the_product_name(sim_fleet, alice):
    api = _client(alice)
    by_code = api.post(
        "/api/v1/billing/quotes/", {"gpu_model": "RTX4090", "cards": 8}, format="json"
    )
    by_name = api.post(
        "/api/v1/billing/quotes/", {"gpu_model": "RTX 4090", "cards": 8}, format="json"
    )
    assert by_code.status_code == 200, by_code.json()
    assert by_code.json()["per_hour"] == by_name.json()["per_hour"]
    assert by_code.json()["terms"]
