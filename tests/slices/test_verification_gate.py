"""实名认证 at the order doors: a slice of 64 cards or more needs a verified account, refused alike
by the API and the order form (403 ``verification_required``); small hosts never need it."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client
from rest_framework.test import APIClient

from billing import services as billing
from slices.models import Instance
from tests.console.factories import UserFactory, verify_personally

pytestmark = pytest.mark.django_db
API = "/api/v1/instances/"
FORM = "/instances/new/"


@pytest.fixture
def unverified(sim_fleet):
    user = UserFactory(verified=False)
    billing.grant_voucher(user, Decimal("500000"), reason="test", valid_days=30)
    return user


def _api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_the_api_refuses_a_64_card_slice_until_verified(unverified) -> None:
    r = _api(unverified).post(API, {"gpu_model": "A800", "cards": 64}, format="json")
    assert r.status_code == 403, r.content
    assert r.json()["error"] == "verification_required"
    assert r.json()["verification_url"] == "/account/verification/"
    assert not Instance.objects.exists()
    verify_personally(unverified)
    r = _api(unverified).post(API, {"gpu_model": "A800", "cards": 64}, format="json")
    assert r.status_code == 202, r.content


def test_the_form_refuses_a_64_card_slice_the_same_way(unverified) -> None:
    client = Client()
    client.force_login(unverified)
    r = client.post(FORM, {"gpu_model": "A800", "cards": 64, "billing_mode": "on_demand"})
    assert r.status_code == 403
    assert "/account/verification/" in r.content.decode()
    assert not Instance.objects.exists()


def test_a_small_host_needs_no_verification(unverified, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        r = _api(unverified).post(API, {"gpu_model": "RTX4090", "cards": 8}, format="json")
    assert r.status_code == 202, r.content


def test_the_setting_can_lift_the_gate(unverified, settings) -> None:
    settings.VERIFICATION_REQUIRED_FOR = ["topup", "invoice"]
    r = _api(unverified).post(API, {"gpu_model": "A800", "cards": 64}, format="json")
    assert r.status_code == 202, r.content
