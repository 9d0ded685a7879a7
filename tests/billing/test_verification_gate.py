"""实名认证 at the top-up doors: API and form refuse an unverified account alike (403
``verification_required``); nothing is stored; the trial credit needs no verification."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from billing import services
from billing.models import Payment
from tests.console.factories import UserFactory, verify_personally

pytestmark = pytest.mark.django_db
API = "/api/v1/billing/top-ups/"


@pytest.fixture
def unverified():
    return UserFactory(verified=False)


def test_the_api_refuses_a_top_up_until_verified(unverified, prices) -> None:
    api = APIClient()
    api.force_authenticate(unverified)
    r = api.post(API, {"amount": "100.00"}, format="json")
    assert r.status_code == 403 and r.json()["error"] == "verification_required"
    assert not Payment.objects.exists()
    verify_personally(unverified)
    assert api.post(API, {"amount": "100.00"}, format="json").status_code == 201


def test_the_form_refuses_a_top_up_the_same_way(unverified, prices) -> None:
    client = Client()
    client.force_login(unverified)
    r = client.post("/billing/top-up/", {"amount": "100"})
    assert r.status_code == 403
    assert 'data-error="verification_required"' in r.content.decode()
    assert not Payment.objects.exists()


def test_the_service_refuses_every_other_door(unverified) -> None:
    with pytest.raises(services.BillingError.__mro__[1]) as refused:  # DomainError
        services.start_topup(unverified, "100")
    assert refused.value.code == "verification_required" and refused.value.http_status == 403


def test_the_trial_credit_needs_no_verification(unverified) -> None:
    assert services.grant_trial_credit(unverified) is True


def test_top_ups_ungated_by_the_setting(unverified, settings) -> None:
    settings.VERIFICATION_REQUIRED_FOR = ["invoice", "large_order"]
    payment, created = services.start_topup(unverified, "100")
    assert created and payment.amount == 100
