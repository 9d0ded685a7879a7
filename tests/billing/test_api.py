from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from billing import services
from billing.models import Payment

pytestmark = pytest.mark.django_db


def _api_client_for(user) -> APIClient:  # noqa: ANN001
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def alice_api(alice) -> APIClient:
    return _api_client_for(alice)


@pytest.fixture
def bob_api(bob) -> APIClient:
    return _api_client_for(bob)


def test_wallet_shows_balances_by_kind(alice, alice_api, prices) -> None:
    services.grant_trial_credit(alice)
    services.grant_voucher(alice, Decimal("5"), reason="sorry", valid_days=7)
    body = alice_api.get("/api/v1/billing/wallet/").json()
    assert body["trial"] == "10.00" and body["vouchers"] == "5.00" and body["cash"] == "0.00"
    assert body["spendable"] == "15.00"
    assert body["runway_seconds"] is None
    assert body["voucher_list"][0]["reason"] == "sorry"


def test_top_up_with_idempotency_key(alice, alice_api, prices) -> None:
    url = "/api/v1/billing/top-ups/"
    first = alice_api.post(
        url, {"amount": "100.00"}, format="json", headers={"Idempotency-Key": "k1"}
    )
    assert first.status_code == 201
    again = alice_api.post(
        url, {"amount": "100.00"}, format="json", headers={"Idempotency-Key": "k1"}
    )
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = alice_api.post(
        url, {"amount": "200.00"}, format="json", headers={"Idempotency-Key": "k1"}
    )
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
    assert Payment.objects.count() == 1
    assert first.json()["checkout_url"].endswith(f"/billing/sandbox/checkout/{first.json()['id']}/")
    bad = alice_api.post(url, {"amount": "0.5"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"] == "invalid"


def test_mass_assignment_cannot_set_state_or_owner(alice, bob, alice_api, prices) -> None:
    response = alice_api.post(
        "/api/v1/billing/top-ups/",
        {"amount": "10.00", "state": "succeeded", "wallet": 999, "owner": bob.pk},
        format="json",
    )
    assert response.json()["state"] == "pending"
    assert Payment.objects.get().wallet.team.personal_of == alice


def test_quote(alice_api, prices) -> None:
    body = alice_api.post(
        "/api/v1/billing/quotes/", {"gpu_model": "RTX 4090", "cards": 8}, format="json"
    ).json()
    assert body["per_hour"] == "15.20"
    assert [t["days"] for t in body["terms"]] == [1, 7, 30]
    unknown = alice_api.post(
        "/api/v1/billing/quotes/", {"gpu_model": "V100", "cards": 1}, format="json"
    )
    assert unknown.status_code == 400
    prices_body = alice_api.get("/api/v1/billing/prices/").json()
    assert {p["gpu_model"]: p["is_placeholder"] for p in prices_body}["H800"] is True


def _sessions(user, n: int, clock) -> None:
    services.grant_voucher(user, Decimal("500"), reason="t", valid_days=30)
    for i in range(n):
        services.open_usage_session(
            user, resource_kind="instance", resource_id=f"{user.pk}-{i}", gpu_model="A800", cards=1
        )
        clock.advance(120)
        services.settle_usage()


def test_lists_have_constant_query_counts(
    alice, alice_api, prices, billing_clock, django_assert_num_queries
) -> None:
    _sessions(alice, 2, billing_clock)
    counts = {}
    for url in (
        "/api/v1/billing/transactions/",
        "/api/v1/billing/usage-sessions/",
        "/api/v1/billing/top-ups/",
    ):
        with CaptureQueriesContext(connection) as ctx:
            alice_api.get(url)
        counts[url] = len(ctx.captured_queries)
    _sessions(alice, 12, billing_clock)
    for url, count in counts.items():
        with django_assert_num_queries(count):
            response = alice_api.get(url)
        assert response.status_code == 200


def test_another_customer_gets_404_and_empty_lists(alice, bob_api, prices, billing_clock) -> None:
    _sessions(alice, 1, billing_clock)
    payment, _ = services.start_topup(alice, "10")
    session = alice.personal_team.wallet.usage_sessions.get()
    txn = alice.personal_team.wallet.transactions.first()
    assert bob_api.get(f"/api/v1/billing/usage-sessions/{session.public_id}/").status_code == 404
    assert bob_api.get(f"/api/v1/billing/transactions/{txn.public_id}/").status_code == 404
    assert bob_api.get(f"/api/v1/billing/top-ups/{payment.public_id}/").status_code == 404
    for url in (
        "/api/v1/billing/transactions/",
        "/api/v1/billing/usage-sessions/",
        "/api/v1/billing/top-ups/",
    ):
        assert bob_api.get(url).json()["results"] == []


def test_transaction_amounts_are_the_customers_side(alice, alice_api, prices) -> None:
    services.grant_trial_credit(alice)
    body = alice_api.get("/api/v1/billing/transactions/").json()
    assert body["results"][0]["amount"] == "10.00"
    one = alice_api.get(f"/api/v1/billing/transactions/{body['results'][0]['id']}/").json()
    assert one["kind"] == "trial_grant" and one["amount"] == "10.00"


def test_malformed_ids_are_404_not_500(alice_api) -> None:
    for url in ("transactions", "usage-sessions", "top-ups"):
        response = alice_api.get(f"/api/v1/billing/{url}/40bdFE1--58862AeA3a75EF3cDF53FD09-/")
        assert response.status_code == 404, url


def test_an_idempotency_key_longer_than_the_column_is_refused(alice_api, prices) -> None:
    url = "/api/v1/billing/top-ups/"
    long_key = "k" * 100
    too_long = alice_api.post(
        url, {"amount": "10.00"}, format="json", headers={"Idempotency-Key": long_key + "1"}
    )
    assert too_long.status_code == 400 and too_long.json()["error"] == "invalid"
    assert "100" in too_long.json()["detail"]
    assert not Payment.objects.exists()
    # a key that only shares the first 100 characters is another key, not a replay
    ok = alice_api.post(
        url, {"amount": "10.00"}, format="json", headers={"Idempotency-Key": long_key}
    )
    assert ok.status_code == 201 and Payment.objects.get().idempotency_key == long_key
    other = alice_api.post(
        url, {"amount": "20.00"}, format="json", headers={"Idempotency-Key": long_key + "2"}
    )
    assert other.status_code == 400 and Payment.objects.count() == 1
