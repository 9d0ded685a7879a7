"""Cross-cutting web security checks, derived from the URL configuration so new routes are covered."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.support.routes import iter_routes

pytestmark = pytest.mark.django_db

# Routes that must accept unsafe methods without a CSRF token, and why.
CSRF_EXEMPT = {
    # Payment providers call back server-to-server; the body carries an HMAC signature instead.
    "billing:sandbox-webhook",
    "billing:webhook",
    # The port proxy relays an instance's own web app, whose requests cannot carry the console's
    # token: it refuses another site's state-changing requests by Origin/Referer instead
    # (tests/slices/test_ports.py::test_a_cross_site_request_never_reaches_the_app).
    "slices:instance-port",
    "slices:instance-port-path",
    # An AI app's API (issue 20): programs call it with the app's key as a bearer token, never
    # with the console's session, so there is nothing for a forged cross-site request to ride on
    # (tests/slices/test_apps.py: the session alone gets 401).
    "slices:app-api",
}


# Routes that check the CSRF token in the view, after their own upload handler is in place
# (Django's documented way for a custom upload handler): a POST without the token is refused with
# 403 there, and a method the route does not take is refused with 405 before it.
CSRF_IN_VIEW = {"slices:pfs-upload"}


def test_every_unsafe_request_without_csrf_token_is_refused(alice) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    checked = 0
    for route in iter_routes():
        if route.name in CSRF_EXEMPT or route.path.startswith("/static/"):
            continue
        for method in ("post", "put", "patch", "delete"):
            response = getattr(client, method)(route.path, data={}, content_type="application/json")
            allowed = {403, 405} if route.name in CSRF_IN_VIEW and method != "post" else {403}
            assert response.status_code in allowed, (method, route.path, response.status_code)
            checked += 1
    assert checked > 20


def test_security_headers_on_every_html_page(alice_client: Client) -> None:
    pages = 0
    for route in iter_routes():
        if route.has_params:
            continue
        response = alice_client.get(route.path)
        if (
            not response.get("Content-Type", "").startswith("text/html")
            or response.status_code >= 300
        ):
            continue
        pages += 1
        csp = response["Content-Security-Policy"]
        for directive in (
            "object-src 'none'",
            "base-uri 'self'",
            "frame-ancestors 'none'",
            "script-src 'self'",
        ):
            assert directive in csp, (route.path, directive)
        assert response["X-Content-Type-Options"] == "nosniff", route.path
        assert response["Referrer-Policy"] == "same-origin", route.path
    assert pages >= 5


def test_route_walker_sees_the_api_and_app_pages() -> None:
    paths = {r.path for r in iter_routes()}
    assert "/healthz" in paths
    assert "/api/v1/" in paths
    assert "/instances/" in paths
