"""``/api/v1/reservations/``, ``/api/v1/capacity/`` and the ``/reservations/`` page (issue 32)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import services as billing
from slices.models import Reservation

pytestmark = pytest.mark.django_db


def D(value) -> Decimal:  # noqa: N802 - amounts as the API gives them (numbers or strings)
    return Decimal(str(value))


def _body(**kw):
    body = {
        "gpu_model": "RTX4090",
        "cards": 8,
        "region": "xiamen",
        "starts_at": (timezone.now() + timedelta(days=2)).isoformat(),
        "hours": 24,
    }
    body.update(kw)
    return body


def test_book_list_and_cancel_through_the_api(sim_fleet, funded, alice_api) -> None:
    got = alice_api.post("/api/v1/reservations/", _body(), format="json")
    assert got.status_code == 201, got.json()
    row = got.json()
    assert D(row["total"]) == D("345.60") and D(row["rate_per_card_hour"]) == D("1.80")
    assert row["term_days"] == 1 and row["state"] == "booked"
    assert row["cancellation_rule"]["full_refund_until_hours_before_start"] == 24
    listed = alice_api.get("/api/v1/reservations/").json()
    assert [r["id"] for r in listed] == [row["id"]]
    cancelled = alice_api.post(f"/api/v1/reservations/{row['id']}/cancel/")
    assert cancelled.status_code == 200
    assert D(cancelled.json()["refunded"]) == D("345.60")
    again = alice_api.post(f"/api/v1/reservations/{row['id']}/cancel/").json()
    assert D(again["refunded"]) == 0  # a double cancel refunds once


def test_the_quote_answers_the_locked_price_without_booking(sim_fleet, funded, alice_api) -> None:
    got = alice_api.post("/api/v1/reservations/quote/", _body(hours=7 * 24), format="json")
    assert got.status_code == 200
    assert D(got.json()["rate_per_card_hour"]) == D("1.60") and got.json()["term_days"] == 7
    assert not Reservation.objects.exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"starts_at": "2020-01-01T00:00:00Z"}, "starts_at"),  # past start
        ({"starts_at": "__far__"}, "starts_at"),  # more than 90 days ahead
        ({"gpu_model": "V100"}, "gpu_model"),  # unknown model
        ({"hours": 0}, "hours"),  # zero hours
        ({"region": "mars"}, "region"),
        ({"cards": 3}, "cards"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(sim_fleet, funded, alice_api, change, field) -> None:
    if change.get("starts_at") == "__far__":
        change = {"starts_at": (timezone.now() + timedelta(days=91)).isoformat()}
    before = billing.get_wallet_summary(funded).spendable
    got = alice_api.post("/api/v1/reservations/", _body(**change), format="json")
    assert got.status_code == 400, got.json()
    assert field in got.json()["fields"]
    assert not Reservation.objects.exists()
    assert billing.get_wallet_summary(funded).spendable == before


def test_the_capacity_calendar_shows_what_can_be_booked(sim_fleet, funded, alice_api) -> None:
    days = alice_api.get("/api/v1/capacity/?gpu_model=RTX4090&region=xiamen").json()
    assert len(days) == 90
    assert days[0]["total_gpus"] == 16 and days[0]["free_gpus"] == 16
    start = (timezone.localtime() + timedelta(days=3)).replace(hour=0, minute=0, second=0)
    alice_api.post(
        "/api/v1/reservations/", _body(starts_at=start.isoformat(), hours=48), format="json"
    )
    days = alice_api.get("/api/v1/capacity/?gpu_model=RTX4090&region=xiamen&days=10").json()
    assert [d["free_gpus"] for d in days[:5]] == [16, 16, 8, 8, 16]
    assert days[1]["largest_host"] == 8
    bad = alice_api.get("/api/v1/capacity/?gpu_model=nope&region=xiamen")
    assert bad.status_code == 400 and "gpu_model" in bad.json()["fields"]


def test_another_team_never_sees_or_cancels_a_window(sim_fleet, funded, alice_api, bob) -> None:
    from rest_framework.test import APIClient

    row = alice_api.post("/api/v1/reservations/", _body(), format="json").json()
    other = APIClient()
    other.force_authenticate(bob)
    assert other.get("/api/v1/reservations/").json() == []
    assert other.get(f"/api/v1/reservations/{row['id']}/").status_code == 404
    assert other.post(f"/api/v1/reservations/{row['id']}/cancel/").status_code == 404
    assert Reservation.objects.get().state == "booked"


@pytest.mark.parametrize(
    ("language", "words"),
    [
        ("zh-hans", ["预约", "容量日历", "支付"]),
        ("en", ["Reservations", "Capacity calendar", "Book and pay"]),
    ],
)
def test_the_page_in_both_languages(sim_fleet, funded, alice_client, language, words) -> None:
    page = alice_client.get("/reservations/", HTTP_ACCEPT_LANGUAGE=language)
    assert page.status_code == 200
    text = page.content.decode()
    for word in words:
        assert word in text
    assert 'id="capacity-calendar"' in text and text.count("capacity-cell") >= 90


def test_the_page_books_quotes_and_cancels(sim_fleet, funded, alice_client) -> None:
    start = (timezone.localtime() + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    form = {"gpu_model": "RTX4090", "region": "xiamen", "cards": 8, "starts_at": start, "hours": 24}
    quoted = alice_client.get(
        "/reservations/", form, HTTP_HX_REQUEST="true", HTTP_ACCEPT_LANGUAGE="en"
    )
    assert quoted.status_code == 200 and "345.60" in quoted.content.decode()
    assert "<html" not in quoted.content.decode()  # htmx gets the booking region only
    booked = alice_client.post("/reservations/", form)
    assert booked.status_code == 302
    row = Reservation.objects.get()
    alice_client.post(f"/reservations/{row.public_id}/cancel/")
    row.refresh_from_db()
    assert row.state == "cancelled" and row.refunded == Decimal("345.60")


def test_the_page_shows_a_bad_start_on_its_field(sim_fleet, funded, alice_client) -> None:
    form = {
        "gpu_model": "RTX4090",
        "region": "xiamen",
        "cards": 8,
        "starts_at": "2020-01-01T00:00",
        "hours": 24,
    }
    got = alice_client.post("/reservations/", form, HTTP_ACCEPT_LANGUAGE="en")
    assert got.status_code == 400
    assert "is-invalid" in got.content.decode() and not Reservation.objects.exists()


def test_the_live_quote_shows_a_bad_field_in_place(sim_fleet, funded, alice_client) -> None:
    form = {
        "gpu_model": "RTX4090",
        "region": "xiamen",
        "cards": 8,
        "starts_at": "2020-01-01T00:00",
        "hours": 24,
    }
    got = alice_client.get(
        "/reservations/", form, HTTP_HX_REQUEST="true", HTTP_ACCEPT_LANGUAGE="en"
    )
    assert got.status_code == 200  # htmx swaps it in
    assert "at least 10 minutes from now" in got.content.decode()
