"""``BILLING_SANDBOX_PAYMENTS``: the free sandbox top-up exists only where it is switched on."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from rest_framework.test import APIClient

from billing import services
from billing.models import Payment
from billing.providers import get_provider
from billing.providers.sandbox import SIGNATURE_HEADER, SandboxProvider
from tests.support.servers import ROOT, base_env, production_env

pytestmark = pytest.mark.django_db

DISABLED = "BILLING_SANDBOX_PAYMENTS"  # named in the message, in every language


def _setting_in(env: dict[str, str], value: str | None = None) -> str:
    env = {k: v for k, v in env.items() if k != "BILLING_SANDBOX_PAYMENTS"}
    if value is not None:
        env["BILLING_SANDBOX_PAYMENTS"] = value
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.BILLING_SANDBOX_PAYMENTS)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "console.settings"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_on_in_the_embedded_default_off_in_production_strict_bool() -> None:
    assert _setting_in(base_env()) == "True"
    assert _setting_in(base_env(), "off") == "False"
    production = production_env("postgres://postgres@127.0.0.1:5432/unused", "redis://x")
    assert _setting_in(production) == "False"
    assert _setting_in(production, "true") == "True"
    bad = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**base_env(), "BILLING_SANDBOX_PAYMENTS": "perhaps"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode != 0 and "BILLING_SANDBOX_PAYMENTS" in bad.stderr


@pytest.mark.usefixtures("no_sandbox_payments")
def test_switched_off_the_provider_refuses_and_no_top_up_starts(alice, prices) -> None:
    with pytest.raises(services.BillingError, match=DISABLED):
        get_provider("sandbox")
    with pytest.raises(services.BillingError, match=DISABLED):
        services.start_topup(alice, "100.00")
    assert not Payment.objects.exists()


@pytest.mark.usefixtures("no_sandbox_payments")
def test_switched_off_the_top_up_page_says_so(alice_client, prices) -> None:
    response = alice_client.post(reverse("billing:topup"), {"amount": "100.00"})
    assert response.status_code == 302 and response.url == reverse("billing:overview")
    assert any(DISABLED in str(m) for m in get_messages(response.wsgi_request))
    assert not Payment.objects.exists()


@pytest.mark.usefixtures("no_sandbox_payments")
def test_switched_off_the_api_answers_an_error(alice) -> None:
    api = APIClient()
    api.force_authenticate(alice)
    response = api.post("/api/v1/billing/top-ups/", {"amount": "100.00"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid" and DISABLED in response.json()["detail"]
    assert not Payment.objects.exists()


def test_switched_off_checkout_and_webhook_are_404_and_credit_nothing(
    alice,
    alice_client,
    client,
    prices,
    settings,
) -> None:
    payment, _ = services.start_topup(alice, "80.00")  # created while it was still on
    body, headers = SandboxProvider().build_callback(payment)
    settings.BILLING_SANDBOX_PAYMENTS = False  # read per request, not at import
    checkout = reverse("billing:sandbox-checkout", args=[payment.public_id])
    assert alice_client.get(checkout).status_code == 404
    assert alice_client.post(checkout, {"outcome": "pay"}).status_code == 404
    webhook = client.post(
        reverse("billing:sandbox-webhook"),
        data=body,
        content_type="application/json",
        headers={SIGNATURE_HEADER: headers[SIGNATURE_HEADER]},
    )
    assert webhook.status_code == 404
    payment.refresh_from_db()
    assert payment.state == "pending"
    assert services.get_wallet_summary(alice).cash == 0
    # a pending sandbox top-up still lists, without a checkout link
    api = APIClient()
    api.force_authenticate(alice)
    listed = api.get("/api/v1/billing/top-ups/")
    assert listed.status_code == 200
    assert listed.json()["results"][0]["checkout_url"] is None
