"""The console's input edges: one rule set for names, exact websocket origins, the JSON error body
for every error under /api/ (oversized bodies included), and an unverified address that answers
as an unknown one whether or not its account is locked."""

from __future__ import annotations

import pytest
from allauth.account.models import EmailAddress
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path, reverse

from console.names import NAME_MAX_LENGTH, NameRefused, clean_name
from console.routing import OriginValidator, websocket_router
from console.services import create_api_token
from tests.conftest import PASSWORD
from tests.console.factories import ed25519_public_key
from tests.support.servers import run_async
from tests.support.websocket import open_websocket, websocket_scope

WRONG = "wrong-Password-77"
THREE_MB = 3 * 1024 * 1024


# --- names ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "x\u202e",  # right-to-left override
        "x\u200b",  # zero-width space
        "x\u200d",  # zero-width joiner
        "\ufeffx",  # BOM
        "x\u061c",  # Arabic letter mark
        "x\x00",
        "x\x7f",
        "x\u2028y",  # line separator
        "x\ue000",  # private use
        "x\U000e0041",  # tag character (format)
        "x\ud800",  # a lone surrogate (json.loads lets it through)
        "x\U0010fffe",  # unassigned (noncharacter)
    ],
)
def test_names_with_control_format_private_or_unassigned_characters_are_refused(name) -> None:
    with pytest.raises(NameRefused) as refused:
        clean_name(name)
    assert refused.value.reason == "hidden_characters" and refused.value.field == "name"
    assert refused.value.params["char"] == f"U+{ord(name.replace('x', '').replace('y', '')):04X}"


def test_names_are_nfc_trimmed_and_limited() -> None:
    assert clean_name("  e\u0301t\u00e9 \u3000") == "\u00e9t\u00e9"  # NFC, trimmed (also U+3000)
    assert clean_name(None) == clean_name("   ") == ""
    assert clean_name("训练 🚀 Ünïcode – x") == "训练 🚀 Ünïcode – x"
    assert clean_name("n" * NAME_MAX_LENGTH) == "n" * NAME_MAX_LENGTH
    with pytest.raises(NameRefused) as refused:
        clean_name("n" * (NAME_MAX_LENGTH + 1), field="title")
    assert refused.value.reason == "too_long" and refused.value.field == "title"
    # The limit counts characters after NFC: 63 composed "é" typed decomposed are fine.
    assert clean_name("e\u0301" * NAME_MAX_LENGTH) == "\u00e9" * NAME_MAX_LENGTH


# --- websocket origins ---------------------------------------------------------------------------
def _handshake(headers: list[tuple[bytes, bytes]], scheme: str = "ws", user=None) -> bool:
    """Whether the production origin check lets this handshake through to the routes."""
    app = OriginValidator(websocket_router())
    scope = websocket_scope(
        "/ws/nope/",  # routed: the catch-all accepts, then closes 4404
        headers=headers,
        scheme=scheme,
        user=user,
        client=("127.0.0.1", 50000),
        server=("127.0.0.1", 8000),
    )

    async def attempt() -> bool:
        communicator, first = await open_websocket(app, scope)
        accepted = first["type"] == "websocket.accept"
        # The client goes away either way (a refused handshake's consumer waits for it).
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)
        return accepted

    return run_async(attempt())


def _h(**pairs: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode()) for k, v in pairs.items()]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("localhost:8000", "http://localhost:8000"),
        ("LOCALHOST:8000", "http://localhost:8000"),
        ("127.0.0.1:8000", "http://127.0.0.1:8000/"),
        ("testserver", "http://testserver:80"),  # the default port, written out
        ("[::1]:8000", "http://[::1]:8000"),
    ],
)
def test_the_consoles_own_origin_is_accepted(host: str, origin: str) -> None:
    assert _handshake(_h(host=host, origin=origin))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("localhost:8000", "http://localhost:9999"),  # another local port (the case)
        ("localhost:8000", "https://localhost:8000"),  # another scheme
        ("localhost:8000", "http://localhost"),  # port 80, not 8000
        ("localhost:8000", "http://127.0.0.1:8000"),  # another host, though also ours
        ("localhost:8000", "http://evil.example"),
        ("localhost:8000", "null"),
        ("localhost:8000", "http://localhost:8000/page"),  # not an origin
        ("localhost:8000", "http://user@localhost:8000"),
        ("evil.example", "http://evil.example"),  # DNS rebinding: a Host we do not serve
        ("", "http://localhost:8000"),  # no Host to compare with
    ],
)
def test_any_other_origin_is_refused(host: str, origin: str) -> None:
    headers = _h(origin=origin)
    if host:
        headers += _h(host=host)
    assert not _handshake(headers)


@pytest.mark.django_db(transaction=True)
def test_a_missing_or_repeated_origin_is_refused() -> None:
    assert not _handshake(_h(host="localhost:8000"))
    twice = _h(host="localhost:8000", origin="http://localhost:8000") + _h(
        origin="http://evil.example"
    )
    assert not _handshake(twice)


@pytest.mark.django_db(transaction=True)
def test_behind_a_tls_proxy_the_scheme_is_the_proxys(settings) -> None:
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.ALLOWED_HOSTS = ["console.example.com"]
    proxied = _h(host="console.example.com", x_forwarded_proto="https")
    assert _handshake([*proxied, *_h(origin="https://console.example.com")])
    assert not _handshake([*proxied, *_h(origin="http://console.example.com")])
    assert not _handshake([*proxied, *_h(origin="https://console.example.com:8443")])
    # Without the header the connection's own scheme counts (wss: https).
    direct = _h(host="console.example.com", origin="https://console.example.com")
    assert _handshake(direct, scheme="wss") and not _handshake(direct, scheme="ws")


@pytest.mark.django_db(transaction=True)
def test_websocket_allowed_origins_are_full_origins(settings) -> None:
    settings.WEBSOCKET_ALLOWED_ORIGINS = ["https://app.example.com:8443"]
    assert _handshake(_h(host="localhost:8000", origin="https://APP.example.com:8443"))
    assert not _handshake(_h(host="localhost:8000", origin="https://app.example.com"))
    assert not _handshake(_h(host="localhost:8000", origin="http://app.example.com:8443"))
    settings.WEBSOCKET_ALLOWED_ORIGINS = ["app.example.com"]  # a host is not an origin
    with pytest.raises(ImproperlyConfigured, match="WEBSOCKET_ALLOWED_ORIGINS"):
        OriginValidator(websocket_router())


# --- every error under /api/ is the JSON error body ----------------------------------------------
def _boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug")


# This module doubles as a URLconf for the 500 check: the console's routes plus a crashing one.
def _urlpatterns() -> list:
    from console.urls import urlpatterns as console_urls

    return [path("api/v1/boom/", _boom), path("page/boom/", _boom), *console_urls]


handler400 = "console.views.bad_request"
handler404 = "console.views.page_not_found"
handler500 = "console.views.server_error"


def __getattr__(name: str) -> list:
    if name == "urlpatterns":
        return _urlpatterns()
    raise AttributeError(name)


@pytest.fixture
def token_client(alice) -> Client:
    _token, raw = create_api_token(alice, name="edges")
    return Client(headers={"Authorization": f"Token {raw}", "Accept-Language": "en"})


def _json_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert body["error"] == code and body["detail"], body
    return body


@pytest.mark.django_db
@pytest.mark.parametrize("route", ["/api/v1/ssh-keys/", "/api/v1/instances/", "/api/v1/disks/"])
def test_an_oversized_json_body_is_a_413_with_the_error_body(token_client, route: str) -> None:
    body = '{"name": "' + "a" * THREE_MB + '"}'
    response = token_client.post(route, data=body, content_type="application/json")
    answer = _json_error(response, 413, "too_large")
    assert answer["limit"] == 2621440 and "2621440" in answer["detail"]


@pytest.mark.django_db
def test_an_oversized_form_body_is_a_413_with_the_error_body(token_client, alice) -> None:
    big = {"name": "a" * THREE_MB, "public_key": ed25519_public_key()}
    _json_error(token_client.post("/api/v1/ssh-keys/", big), 413, "too_large")  # multipart
    # Signed in with a session, the CSRF check reads the form first: the same answer.
    session = Client(enforce_csrf_checks=True, headers={"Accept-Language": "en"})
    session.force_login(alice)
    session.cookies["csrftoken"] = "c" * 32  # with a cookie, the check reads the form's token
    form = "name=" + "a" * THREE_MB
    response = session.post(
        "/api/v1/ssh-keys/", data=form, content_type="application/x-www-form-urlencoded"
    )
    _json_error(response, 413, "too_large")


@pytest.mark.django_db
def test_too_many_fields_is_a_413_with_the_error_body(token_client, settings) -> None:
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10
    form = "&".join(f"f{i}=x" for i in range(20))
    response = token_client.post(
        "/api/v1/ssh-keys/", data=form, content_type="application/x-www-form-urlencoded"
    )
    _json_error(response, 413, "too_large")


@pytest.mark.django_db
def test_pages_keep_djangos_400_for_an_oversized_body() -> None:
    client = Client(headers={"Accept-Language": "en"})
    response = client.post(
        reverse("account_login"),
        data="login=" + "a" * THREE_MB,
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.django_db
def test_other_api_errors_are_the_json_error_body(token_client, settings) -> None:
    bad_json = token_client.post("/api/v1/ssh-keys/", data="{", content_type="application/json")
    _json_error(bad_json, 400, "invalid")
    _json_error(token_client.get("/api/v1/no-such-thing/"), 404, "not_found")
    _json_error(token_client.delete("/api/v1/ssh-keys/"), 405, "method_not_allowed")
    traced = token_client.generic("TRACE", "/api/v1/no-such-thing/")
    _json_error(traced, 405, "method_not_allowed")
    assert "GET" in traced["Allow"]
    # A Host the console does not serve (Django's DisallowedHost, a 400 before any view).
    settings.ALLOWED_HOSTS = ["localhost"]
    _json_error(Client().get("/api/v1/ssh-keys/", HTTP_HOST="evil.example"), 400, "invalid")
    assert Client().get("/no-such-page/", HTTP_HOST="evil.example").status_code == 400


@pytest.mark.django_db
def test_a_crash_under_api_is_a_json_500_and_a_page_stays_html(settings) -> None:
    settings.ROOT_URLCONF = __name__
    client = Client(raise_request_exception=False)
    _json_error(client.get("/api/v1/boom/"), 500, "error")
    page = client.get("/page/boom/")
    assert page.status_code == 500 and page["Content-Type"].startswith("text/html")


# --- an unverified added address answers as an unknown one, locked or not ------------------------
@pytest.fixture
def frank(django_user_model):
    cache.clear()  # allauth counts attempts in the cache
    user = django_user_model.objects.create_user(
        username="frank", email="frank@example.com", password=PASSWORD
    )
    EmailAddress.objects.create(user=user, email="frank@example.com", verified=True, primary=True)
    EmailAddress.objects.create(user=user, email="frank.old@example.com", verified=False)
    yield user
    cache.clear()


def _login(login: str, password: str, ip: str = "198.51.100.9") -> tuple[int, str, bool]:
    client = Client(REMOTE_ADDR=ip, headers={"Accept-Language": "en"})
    response = client.post(reverse("account_login"), {"login": login, "password": password})
    text = response.content.decode()
    return (
        response.status_code,
        "too many"
        if "Too many failed login attempts" in text
        else "not correct" * text.count("not correct"),
        "_auth_user_id" in client.session,
    )


@pytest.mark.django_db
def test_an_unverified_address_answers_as_an_unknown_one_when_its_account_is_locked(frank) -> None:
    for i in range(5):
        _login("frank", WRONG, ip=f"10.9.0.{i}")
    assert _login("frank", PASSWORD, ip="10.9.1.1") == (200, "too many", False)  # locked
    unknown = _login("nobody@example.com", WRONG, ip="10.9.1.2")
    assert unknown == (200, "not correct", False)
    assert _login("frank.old@example.com", WRONG, ip="10.9.1.3") == unknown
    assert _login("frank.old@example.com", PASSWORD, ip="10.9.1.4") == unknown


@pytest.mark.django_db
def test_failures_on_an_unverified_address_lock_that_text_not_the_account(frank) -> None:
    for i in range(5):
        _login("frank.old@example.com", WRONG, ip=f"10.9.2.{i}")
        _login("nobody@example.com", WRONG, ip=f"10.9.3.{i}")
    # Both now answer "too many attempts", alike ...
    assert _login("frank.old@example.com", PASSWORD, ip="10.9.4.1") == _login(
        "nobody@example.com", PASSWORD, ip="10.9.4.2"
    )
    # ... and the account's owner was not locked out by them.
    assert _login("frank", PASSWORD, ip="10.9.4.3")[2]
