"""403 and 429 look like the rest of the console, in the reader's language; JSON under /api/."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from console.services import create_api_token

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> None:
    cache.clear()


def _styled(html: str) -> bool:
    return 'class="navbar' in html and "console.css" in html


@pytest.mark.parametrize(
    ("language", "text"), [("zh-hans", "您无权访问此页面"), ("en", "You do not have access")]
)
def test_a_customer_on_an_operator_page_gets_the_styled_translated_403(
    alice, language: str, text: str
) -> None:  # noqa: ANN001
    client = Client(headers={"Accept-Language": language})
    client.force_login(alice)
    response = client.get(reverse("diagnostics"))
    assert response.status_code == 403
    html = response.content.decode()
    assert _styled(html) and text in html


def test_staff_gate_sends_visitors_to_log_in_and_lets_operators_in(client, operator_client) -> None:  # noqa: ANN001
    response = client.get(reverse("diagnostics"))
    assert response.status_code == 302 and reverse("account_login") in response["Location"]
    assert operator_client.get(reverse("diagnostics")).status_code == 200


def test_a_form_without_csrf_token_gets_the_styled_403(alice) -> None:  # noqa: ANN001
    client = Client(enforce_csrf_checks=True, headers={"Accept-Language": "en"})
    client.force_login(alice)
    response = client.post(reverse("account:ssh-key-list"), {"public_key": "x"})
    assert response.status_code == 403
    assert (
        _styled(response.content.decode()) and "This form has expired" in response.content.decode()
    )


def test_api_403_is_json(alice) -> None:  # noqa: ANN001
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)  # session auth without the CSRF header
    response = client.post("/api/v1/ssh-keys/", {}, content_type="application/json")
    assert response.status_code == 403
    assert response.json()["error"] == "permission_denied"


@pytest.mark.parametrize(
    ("language", "text"), [("zh-hans", "尝试次数过多"), ("en", "Too many attempts")]
)
def test_rate_limited_pages_get_the_styled_translated_429(
    settings, language: str, text: str
) -> None:  # noqa: ANN001
    settings.ACCOUNT_RATE_LIMITS = {**settings.ACCOUNT_RATE_LIMITS, "login": "2/m/ip"}
    client = Client(REMOTE_ADDR="198.51.100.40", headers={"Accept-Language": language})
    for _ in range(2):
        client.post(reverse("account_login"), {"login": "nobody", "password": "x-Y-z-123456"})
    response = client.post(
        reverse("account_login"), {"login": "nobody", "password": "x-Y-z-123456"}
    )
    assert response.status_code == 429
    html = response.content.decode()
    assert _styled(html) and text in html


def test_the_429_handler_answers_json_under_the_api() -> None:
    from django.test import RequestFactory

    from console.views import too_many_requests

    response = too_many_requests(RequestFactory().get("/api/v1/anything/"))
    assert response.status_code == 429
    assert response["Content-Type"] == "application/json"


def test_signed_in_pages_and_api_answers_are_private_and_not_stored(alice, alice_client) -> None:  # noqa: ANN001
    for path in ("/", reverse("account:overview"), reverse("account:ssh-key-list")):
        response = alice_client.get(path)
        assert response.status_code == 200, path
        directives = {d.strip() for d in response["Cache-Control"].split(",")}
        assert {"private", "no-store"} <= directives, (path, response["Cache-Control"])
        assert "public" not in directives
    _, raw = create_api_token(alice, name="cache")
    api = Client(headers={"Authorization": f"Token {raw}"}).get("/api/v1/ssh-keys/")
    assert api.status_code == 200
    assert {"private", "no-store"} <= {d.strip() for d in api["Cache-Control"].split(",")}


def test_public_pages_stay_cacheable(client) -> None:  # noqa: ANN001
    response = client.get("/")
    assert "no-store" not in response.get("Cache-Control", "")
