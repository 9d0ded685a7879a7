"""Hostile request bodies: no JSON endpoint answers a 5xx, whatever the nesting."""

from __future__ import annotations

import pytest
from django.test import Client

from console.services import create_api_token
from tests.support.routes import iter_routes

pytestmark = pytest.mark.django_db

DEEP_JSON = '{"a":' * 1000 + "1" + "}" * 1000
DEEP_LIST = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize("body", [DEEP_JSON, DEEP_LIST], ids=["object", "list"])
def test_deeply_nested_json_is_a_400_on_every_api_route(alice, body: str) -> None:  # noqa: ANN001
    _, raw = create_api_token(alice, name="deep")
    client = Client(headers={"Authorization": f"Token {raw}", "Accept-Language": "en"})
    parsed: set[str] = set()
    for route in iter_routes():
        if not route.path.startswith("/api/"):
            continue
        for method in ("post", "put", "patch"):
            response = getattr(client, method)(
                route.path, data=body, content_type="application/json"
            )
            assert response.status_code < 500, (method, route.path, response.status_code)
            if response.status_code == 400:
                assert response.json()["error"] == "invalid", (method, route.path, response.json())
                assert "nested too deeply" in response.json()["detail"]
                parsed.add(route.path)
    # The body was really parsed (not only refused for the method or a missing object).
    assert {"/api/v1/ssh-keys/", "/api/v1/api-tokens/", "/api/v1/billing/top-ups/"} <= parsed, (
        parsed
    )
