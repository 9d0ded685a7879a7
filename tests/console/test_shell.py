from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_landing_page_for_visitors_offers_login(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert reverse("login") in response.content.decode()


def test_dashboard_for_signed_in_user_shows_navigation(alice_client: Client) -> None:
    html = alice_client.get("/").content.decode()
    for name in (
        "slices:instance-list",
        "marketplace:model-list",
        "marketplace:image-list",
        "billing:overview",
    ):
        assert f'href="{reverse(name)}"' in html


def test_simulated_fleet_is_labelled_in_the_embedded_default(alice_client: Client) -> None:
    html = alice_client.get("/").content.decode()
    assert "data-bs-toggle" in html  # the layout rendered
    assert "模拟" in html or "Simulated fleet" in html


def test_default_language_is_chinese_and_english_is_switchable(alice_client: Client) -> None:
    zh = alice_client.get("/").content.decode()
    assert '<html lang="zh-hans"' in zh
    alice_client.post(reverse("set_language"), {"language": "en", "next": "/"})
    en = alice_client.get("/").content.decode()
    assert '<html lang="en"' in en
    assert "Dashboard" in en


def test_healthz_checks_database_and_channel_layer(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "channel_layer": "ok"}


def test_unknown_page_uses_styled_404(alice_client: Client) -> None:
    response = alice_client.get("/no-such-page/")
    assert response.status_code == 404
    assert "404" in response.content.decode()


def test_unknown_api_route_answers_json_error_body(alice_client: Client) -> None:
    response = alice_client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_api_root_and_schema_and_docs_are_served(client: Client) -> None:
    assert client.get("/api/v1/").status_code == 200
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert b"openapi" in schema.content
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()


def test_api_requires_authentication_with_error_body(client: Client) -> None:
    response = client.post("/api/v1/", {})
    assert response.status_code in (401, 403, 405)
    assert "error" in response.json()


def test_security_headers_on_html_pages(client: Client) -> None:
    response = client.get("/")
    csp = response["Content-Security-Policy"]
    assert "object-src 'none'" in csp
    assert "frame-ancestors 'none'" in csp
    assert "base-uri 'self'" in csp
    assert "script-src 'self'" in csp
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"


def test_admin_is_reachable_by_operators_only(
    operator_client: Client, alice_client: Client
) -> None:
    assert operator_client.get("/admin/").status_code == 200
    assert alice_client.get("/admin/").status_code == 302  # redirected to the admin login


def test_diagnostics_is_operator_only(operator_client: Client, alice_client: Client) -> None:
    assert operator_client.get(reverse("diagnostics")).status_code == 200
    # console.auth.staff_required: a signed-in customer is refused, not sent to a login form.
    assert alice_client.get(reverse("diagnostics")).status_code == 403


def test_post_without_csrf_token_is_refused(alice) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post(reverse("set_language"), {"language": "en"})
    assert response.status_code == 403


def test_operator_admin_lists_keys_and_tokens_without_secrets(operator_client: Client) -> None:
    for model in ("sshkey", "apitoken", "trialcreditclaim", "user"):
        response = operator_client.get(f"/admin/console/{model}/")
        assert response.status_code == 200, model
    assert b"secret_hash" not in operator_client.get("/admin/console/apitoken/").content


def test_dashboard_shows_balance_availability_and_prices(alice_client: Client) -> None:
    from billing.seed import seed_default_prices
    from tests.slices.factories import load_small_fleet

    seed_default_prices()
    load_small_fleet()
    html = alice_client.get("/").content.decode()
    assert 'id="availability"' in html
    assert "1.90 元" in html  # RTX 4090 on-demand price from the seed price book
    assert "H800" in html and "A800" in html


def test_dashboard_without_fleet_explains_how_to_load_it(alice_client: Client) -> None:
    html = alice_client.get("/").content.decode()
    assert "load_fleet" in html


def test_dashboard_query_count_does_not_grow_with_the_fleet(
    alice_client: Client, django_assert_max_num_queries
) -> None:
    from tests.slices.factories import load_small_fleet

    load_small_fleet()
    with django_assert_max_num_queries(25):
        alice_client.get("/")


def test_api_pages_are_capped(alice_client: Client) -> None:
    response = alice_client.get("/api/v1/ssh-keys/?limit=100000000")
    assert response.status_code == 200
    from console.api.pagination import ConsolePagination

    assert ConsolePagination.max_limit == 200


def test_diagnostics_ping_refuses_a_delay_that_is_not_a_finite_number(
    operator_client: Client,
) -> None:
    for delay in ("nan", "inf", "-1", "soon", "1e9"):
        response = operator_client.post(reverse("diagnostics-ping"), {"delay": delay})
        assert response.status_code == 400, delay
        assert response.json()["error"] == "invalid"
