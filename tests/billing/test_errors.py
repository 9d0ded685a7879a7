"""Billing's refusals speak the console's one error vocabulary: a code, a status and parameters,
with the message translated where it is shown (not where it was raised)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import translation
from rest_framework.test import APIClient

from billing import services
from console.errors import DomainError, ErrorCode
from console.models import User

pytestmark = pytest.mark.django_db


def test_the_message_is_rendered_in_the_language_active_when_shown(alice: User) -> None:
    with translation.override("en"), pytest.raises(services.InsufficientFunds) as refused:
        services.refund_cash(alice, Decimal("5"), reason="goodwill")
    error = refused.value
    assert isinstance(error, DomainError)
    assert (error.code, error.http_status, error.params) == (
        ErrorCode.INSUFFICIENT_FUNDS,
        402,
        {"cash": Decimal("0.00")},
    )
    with translation.override("zh-hans"):
        assert error.message() == "现金余额为 0.00 元。"
    with translation.override("en"):
        assert str(error) == "The cash balance is 0.00 元."


def test_the_api_body_carries_code_message_and_parameters(alice: User, prices) -> None:
    client = APIClient()
    client.force_authenticate(alice)
    for language, detail in (("en", "No price is set for Z9."), ("zh-hans", "Z9 尚未设置价格。")):
        response = client.post(
            "/api/v1/billing/quotes/",
            {"gpu_model": "Z9", "cards": 1},
            format="json",
            HTTP_ACCEPT_LANGUAGE=language,
        )
        assert response.status_code == 400
        assert response.json() == {"error": "invalid", "detail": detail, "model": "Z9"}
