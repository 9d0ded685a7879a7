"""Refusals before an order is made answer the API's error body and order nothing."""

from __future__ import annotations

import pytest

from slices.models import Instance
from tests.support.api import assert_error

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("lang", "text"), [("en", "longer than"), ("zh-hans", "个字符")])
def test_an_idempotency_key_too_long_is_refused_and_orders_nothing(
    sim_fleet, alice, alice_api, lang: str, text: str
) -> None:
    r = alice_api.post(
        "/api/v1/instances/",
        {"gpu_model": "RTX4090", "cards": 1},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k" * 1000,
        HTTP_ACCEPT_LANGUAGE=lang,
    )
    assert_error(r, 400, "invalid", field="Idempotency-Key", detail=text)
    assert not Instance.objects.exists()
