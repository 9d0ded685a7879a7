"""Issue 29, the origin rule: a tenant's app is served only on its own host, a site apart from the
console's; the console's hosts only redirect; a name under APPS_DOMAIN that is no app's is 404;
what an app may not send through the proxy is dropped; hand-offs work once; app-host cookies
end at logout; share links expire and end when the instance stops."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console import sites
from slices.models import Instance, PortGrant, ShareLink
from slices.port_views import OffOrigin, _response, app_location
from slices.proxy import UpstreamResponse
from slices.services import ports, proxy
from slices.services.instances import transition
from tests.support.apphosts import (
    APP_PORT,
    app_host,
    body_of,
    follow_handoff,
    open_app,
    running_with_port,
)
from tests.support.servers import base_env, run_manage

pytestmark = pytest.mark.django_db


# -- sites -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("apps", "hosts", "refused"),
    [
        ("localhost", ["127.0.0.1", "[::1]", "testserver"], False),
        ("localhost", ["127.0.0.1", "localhost"], True),  # the console on the apps' domain
        ("apps.example.com", ["console.example.com"], True),  # same registrable domain
        ("example.com", ["console.example.com"], True),
        ("example-apps.com", ["console.example.com"], False),
        ("gpc-apps.com.cn", ["console.gpc.com.cn"], False),
        ("apps.gpc.com.cn", ["console.gpc.com.cn"], True),  # com.cn is a public suffix
        ("example-apps.com", [".example-apps.com"], True),  # the console under the apps' domain
        ("10.0.0.1", ["console.example.com"], True),  # an IP is no domain
    ],
)
def test_the_apps_domain_must_be_a_site_apart(apps: str, hosts: list[str], refused: bool) -> None:
    assert (sites.apps_domain_problem(apps, hosts) is not None) is refused


def test_app_hosts_parse_only_an_instance_id_and_a_port() -> None:
    uid = "0b4f3a9e-5d4c-4a3b-9c2d-1e0f9a8b7c6d"
    assert sites.parse_app_host(f"{uid}-7860.localhost:8000", "localhost") == (uid, 7860)
    for host in (f"{uid}-7860.evil.localhost", f"x{uid}-7860.localhost", f"{uid}-99999.localhost",
                 f"{uid}.localhost", "localhost", f"{uid}-7860.localhost.evil.com"):  # fmt: skip
        assert sites.parse_app_host(host, "localhost") is None, host


def test_the_console_refuses_to_start_with_apps_on_its_site() -> None:
    env = {**base_env(), "APPS_DOMAIN": "apps.example.com", "ALLOWED_HOSTS": "console.example.com"}
    result = run_manage(env, "check")
    assert result.returncode != 0 and "APPS_DOMAIN" in result.stderr
    env = {**base_env(), "DATABASE_URL": "postgres://x@127.0.0.1/x", "REDIS_URL": "redis://x"}
    env |= {"SECRET_KEY": "s" * 60}
    result = run_manage(env, "check")
    assert result.returncode != 0 and "APPS_DOMAIN must be set" in result.stderr
    env = {**base_env(), "SESSION_COOKIE_DOMAIN": ".example.com"}
    result = run_manage(env, "check")
    assert result.returncode != 0 and "SESSION_COOKIE_DOMAIN" in result.stderr


def test_behind_tls_the_console_cookies_carry_the_host_prefix() -> None:
    env = {**base_env(), "SESSION_COOKIE_SECURE": "true", "CSRF_COOKIE_SECURE": "true"}
    code = (
        "from django.conf import settings as s; "
        "print(s.SESSION_COOKIE_NAME, s.CSRF_COOKIE_NAME, s.LANGUAGE_COOKIE_NAME, "
        "s.SESSION_COOKIE_DOMAIN, s.CSRF_COOKIE_DOMAIN)"
    )
    result = run_manage(env, "shell", "--no-imports", "-c", code)
    assert result.stdout.strip().splitlines()[-1].split() == [
        "__Host-sessionid",
        "__Host-csrftoken",
        "__Host-django_language",
        "None",
        "None",
    ], result.stderr


# -- hosts -------------------------------------------------------------------------------------


def test_a_name_under_the_apps_domain_that_is_no_app_serves_nothing_of_the_console(
    alice, alice_client
) -> None:
    instance = running_with_port(alice)
    for host in ("evil.localhost", f"x-{APP_PORT}.localhost", f"{instance.public_id}.localhost"):
        visitor = Client(HTTP_HOST=host)
        for path in ("/", "/accounts/login/", "/api/v1/", "/billing/", "/static/console/app.css"):
            answer = visitor.get(path)
            assert answer.status_code == 404, (host, path)
            assert b"csrfmiddlewaretoken" not in answer.content
            assert "sessionid" not in answer.cookies and "csrftoken" not in answer.cookies
    # An app host's /api/ and /accounts/ are the app's, never the console's.
    app = open_app(alice_client, instance)
    page = app.get("/accounts/login/")
    assert page.status_code == 200 and b"simulated" in body_of(page)


def test_the_bare_apps_domain_sends_the_browser_to_the_console() -> None:
    answer = Client(HTTP_HOST="localhost:8000").get("/billing/?x=1")
    assert answer.status_code == 302
    assert answer["Location"] == "http://127.0.0.1:8000/billing/?x=1"


def test_the_console_host_sets_no_share_cookie_and_serves_no_share_content(alice, alice_client):
    instance = running_with_port(alice)
    link, secret = ports.create_share_link(alice, instance, APP_PORT)
    answer = Client().get(f"/shared/ports/{secret}/")
    assert answer.status_code == 302
    assert not answer.cookies  # nothing for the console's host: the app host gets its own
    assert answer["Location"].startswith(f"http://{app_host(instance)}/__gpc/auth?t=")


# -- the hand-off and the grants ---------------------------------------------------------------


def test_a_handoff_works_once(alice, alice_client) -> None:
    instance = running_with_port(alice)
    opened = alice_client.get(f"/instances/{instance.public_id}/web-ports/{APP_PORT}/open/")
    follow_handoff(opened["Location"])
    replay = Client(HTTP_HOST=app_host(instance)).get(opened["Location"].split("localhost", 1)[1])
    assert replay.status_code == 404
    assert ports.APP_COOKIE not in replay.cookies
    # A forged or tampered cookie opens nothing.
    forged = Client(HTTP_HOST=app_host(instance))
    forged.cookies[ports.APP_COOKIE] = f'{{"g": 1, "i": "{instance.public_id}", "p": 7860}}'
    assert forged.get("/").status_code == 404


def test_the_handoff_next_stays_on_the_app_host(alice, alice_client) -> None:
    instance = running_with_port(alice)
    for bad in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        opened = alice_client.get(
            f"/instances/{instance.public_id}/web-ports/{APP_PORT}/open/", {"next": bad}
        )
        landed = Client(HTTP_HOST=app_host(instance)).get(opened["Location"].split("localhost")[1])
        assert landed["Location"] == "/", bad


def test_logging_out_ends_the_app_hosts_cookies(alice, alice_client) -> None:
    instance = running_with_port(alice)
    app = open_app(alice_client, instance)
    assert app.get("/").status_code == 200
    alice_client.post("/accounts/logout/")
    assert app.get("/").status_code == 404
    assert PortGrant.objects.filter(user=alice, revoked_at__isnull=True).count() == 0


def test_a_grant_ends_when_the_instance_changes_hands(alice, bob, alice_client) -> None:
    instance = running_with_port(alice)
    app = open_app(alice_client, instance)
    Instance.objects.filter(pk=instance.pk).update(created_by=bob, team=bob.personal_team)
    assert app.get("/").status_code == 404


# -- share links -------------------------------------------------------------------------------


def test_share_links_last_24_hours_unless_the_owner_picks_another_lifetime(
    alice, alice_client
) -> None:
    instance = running_with_port(alice)
    before = timezone.now()
    link, _ = ports.create_share_link(alice, instance, APP_PORT)
    assert (
        timedelta(hours=23, minutes=59) < link.expires_at - before <= timedelta(hours=24, seconds=5)
    )
    made = alice_client.post(
        f"/instances/{instance.public_id}/web-ports/{APP_PORT}/share-links/",
        {"lifetime": "1h"},
        HTTP_HX_REQUEST="true",
    )
    assert made.status_code == 200
    newest = ShareLink.objects.filter(instance=instance).order_by("-id").first()
    assert newest.expires_at - before <= timedelta(hours=1, seconds=5)
    bad = alice_client.post(
        f"/instances/{instance.public_id}/web-ports/{APP_PORT}/share-links/",
        {"lifetime": "forever"},
        HTTP_HX_REQUEST="true",
    )
    assert bad.status_code == 400 and "forever" in bad.content.decode()
    assert ShareLink.objects.filter(instance=instance).count() == 2  # nothing made


def test_an_expired_share_link_opens_nothing(alice) -> None:
    instance = running_with_port(alice)
    link, secret = ports.create_share_link(alice, instance, APP_PORT)
    opened = Client().get(f"/shared/ports/{secret}/")
    visitor = follow_handoff(opened["Location"])
    assert visitor.get("/").status_code == 200
    ShareLink.objects.filter(pk=link.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert visitor.get("/").status_code == 404
    assert Client().get(f"/shared/ports/{secret}/").status_code == 404


@pytest.mark.parametrize("dst", ["stopping", "releasing"])
def test_share_links_and_grants_end_when_the_instance_stops(alice, alice_client, dst) -> None:
    instance = running_with_port(alice)
    _, secret = ports.create_share_link(alice, instance, APP_PORT)
    visitor = follow_handoff(Client().get(f"/shared/ports/{secret}/")["Location"])
    owner = open_app(alice_client, instance)
    assert transition(instance, dst, code="test")
    assert ShareLink.objects.filter(instance=instance, revoked_at__isnull=True).count() == 0
    # Running again (a start), neither the link nor either browser's cookie comes back.
    Instance.objects.filter(pk=instance.pk).update(state="running")
    assert visitor.get("/").status_code == 404
    assert owner.get("/").status_code == 404
    assert Client().get(f"/shared/ports/{secret}/").status_code == 404


# -- what an app may not send ------------------------------------------------------------------


def _upstream(headers: list[tuple[str, str]], status: int = 200) -> UpstreamResponse:
    async def body():  # noqa: ANN202
        yield b"ok"

    return UpstreamResponse(status=status, headers=headers, body=body())


def _access(instance: Instance) -> proxy.Access:
    spec, node, node_port = proxy.tunnel_target(instance, APP_PORT)
    return proxy.Access(
        instance=instance,
        port=APP_PORT,
        via="owner",
        share_link_id=None,
        spec=spec,
        node=node,
        node_port=node_port,
        keep_prefix=True,
        prefix="",
    )


def test_the_proxy_strips_what_no_app_may_send(alice, rf) -> None:
    instance = running_with_port(alice)
    request = rf.get("/", HTTP_HOST=app_host(instance))
    headers = [
        ("Content-Type", "text/html"),
        ("Service-Worker-Allowed", "/"),
        ("Clear-Site-Data", '"*"'),
        ("Set-Cookie", "sessionid=tenant; Path=/"),
        ("Set-Cookie", "csrftoken=tenant; Path=/"),
        ("Set-Cookie", "gpc_app=forged; Path=/"),
        ("Set-Cookie", "wide=1; Domain=localhost; Path=/"),
        ("Set-Cookie", "own=1; Path=/; HttpOnly"),
        ("X-App", "kept"),
    ]
    response = _response(_upstream(headers), _access(instance), request)
    assert "Service-Worker-Allowed" not in response and "Clear-Site-Data" not in response
    assert set(response.cookies) == {"own"}
    assert response["X-App"] == "kept" and response["Content-Type"] == "text/html"


def test_a_redirect_off_the_apps_origin_is_refused(alice, rf) -> None:
    instance = running_with_port(alice)
    own = f"http://{app_host(instance)}"
    assert app_location("/lab?x=1", own, APP_PORT) == "/lab?x=1"
    assert app_location(f"{own}/tree", own, APP_PORT) == "/tree"
    assert app_location(f"http://127.0.0.1:{APP_PORT}/tree", own, APP_PORT) == "/tree"
    assert app_location("tree/x", own, APP_PORT) == "tree/x"
    for bad in (
        "http://127.0.0.1:8000/billing/",  # the console on a test host
        "http://testserver/api/v1/tokens/",
        "//evil.example/",
        "https://evil.example/",
        f"http://127.0.0.1:{APP_PORT + 1}/",
        "javascript:alert(1)",
    ):
        with pytest.raises(OffOrigin):
            app_location(bad, own, APP_PORT)
    request = rf.get("/", HTTP_HOST=app_host(instance))
    refused = _response(
        _upstream([("Location", "http://testserver/")], status=302), _access(instance), request
    )
    assert refused.status_code == 502 and "Location" not in refused


def test_an_ai_apps_api_on_the_console_origin_runs_nothing(alice, rf) -> None:
    instance = running_with_port(alice)
    request = rf.get("/apps/x/v1/models")
    access = _access(instance)
    response = _response(
        _upstream([("Content-Type", "text/html"), ("Set-Cookie", "sessionid=x")]),
        access,
        request,
        on_console=True,
    )
    assert response["Content-Security-Policy"] == "sandbox; default-src 'none'"
    assert not response.cookies
    assert body_of(response) == b"ok"


def test_the_ports_page_offers_lifetimes_and_shows_when_links_end_in_both_languages(
    alice, alice_client
) -> None:
    instance = running_with_port(alice)
    ports.create_share_link(alice, instance, APP_PORT)
    url = f"/instances/{instance.public_id}/"
    zh = alice_client.get(url, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert 'name="lifetime"' in zh and "24 小时" in zh and "失效" in zh
    assert f"/web-ports/{APP_PORT}/open/" in zh
    alice_client.cookies["django_language"] = "en"
    en = alice_client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "24 hours" in en and ", ends " in en
