from __future__ import annotations

import hashlib
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console import services
from console.models import ApiToken
from tests.console.factories import make_api_token, make_ssh_key

pytestmark = pytest.mark.django_db


def _api(raw: str, keyword: str = "Bearer") -> Client:
    return Client(headers={"Authorization": f"{keyword} {raw}"})


def test_token_is_stored_only_as_a_hash_with_a_lookup_prefix(alice) -> None:
    token, raw = make_api_token(alice)
    assert re.fullmatch(r"gct_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", raw)
    assert token.prefix == raw.split("_")[1]
    assert token.secret_hash == hashlib.sha256(raw.encode()).hexdigest()
    stored = ApiToken.objects.filter(pk=token.pk).values().get()
    assert all(raw not in str(value) for value in stored.values())


@pytest.mark.parametrize("keyword", ["Token", "Bearer", "bearer"])
def test_api_accepts_token_and_bearer_and_records_last_use(alice, keyword: str) -> None:
    make_ssh_key(alice, name="laptop")
    token, raw = make_api_token(alice)
    response = _api(raw, keyword).get("/api/v1/ssh-keys/")
    assert response.status_code == 200
    assert [k["name"] for k in response.json()["results"]] == ["laptop"]
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_token_authenticated_writes_need_no_csrf_token(alice) -> None:
    _token, raw = make_api_token(alice)
    client = Client(enforce_csrf_checks=True, headers={"Authorization": f"Token {raw}"})
    response = client.post(
        "/api/v1/api-tokens/", {"name": "child"}, content_type="application/json"
    )
    assert response.status_code == 201


@pytest.mark.parametrize(
    ("header", "detail"),
    [
        ("Bearer gct_000000000000_nope", "Invalid token."),
        ("Bearer not-even-a-token", "Invalid token."),
        ("Bearer", "Malformed Authorization header"),
        ("Token a b", "Malformed Authorization header"),
    ],
)
def test_unknown_or_malformed_tokens_get_401_with_the_error_body(header: str, detail: str) -> None:
    client = Client(headers={"Authorization": header, "Accept-Language": "en"})
    response = client.get("/api/v1/ssh-keys/")
    assert response.status_code == 401
    assert response.json()["error"] == "not_authenticated"
    assert detail in response.json()["detail"]
    assert response["WWW-Authenticate"] == "Token"


def test_a_wrong_secret_with_a_real_prefix_is_refused(alice) -> None:
    _token, raw = make_api_token(alice)
    forged = raw[:-4] + ("AAAA" if not raw.endswith("AAAA") else "BBBB")
    assert _api(forged).get("/api/v1/ssh-keys/").status_code == 401


def test_expired_token_is_refused(alice) -> None:
    token, raw = make_api_token(alice, expires_at=timezone.now() + timedelta(days=1))
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = Client(headers={"Authorization": f"Token {raw}", "Accept-Language": "en"}).get(
        "/api/v1/ssh-keys/"
    )
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


def test_revoked_token_is_refused_at_once(alice, alice_client: Client) -> None:
    token, raw = make_api_token(alice)
    assert _api(raw).get("/api/v1/ssh-keys/").status_code == 200
    alice_client.post(reverse("account:token-revoke", args=[token.public_id]))
    response = Client(headers={"Authorization": f"Token {raw}", "Accept-Language": "en"}).get(
        "/api/v1/ssh-keys/"
    )
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]
    assert not services.revoke_api_token(alice, token)  # a second revoke changes nothing


def test_token_of_a_disabled_account_is_refused(alice) -> None:
    _token, raw = make_api_token(alice)
    alice.is_active = False
    alice.save()
    assert _api(raw).get("/api/v1/ssh-keys/").status_code == 401


def test_expiry_in_the_past_is_refused(alice, alice_client: Client) -> None:
    response = alice_client.post(
        "/api/v1/api-tokens/",
        {"name": "old", "expires_at": "2001-01-01T00:00:00Z"},
        content_type="application/json",
    )
    assert response.status_code == 400
    assert "expires_at" in response.json()["fields"]
    assert not ApiToken.objects.exists()


def test_page_shows_the_secret_once_then_only_its_prefix(alice, alice_client: Client) -> None:
    response = alice_client.post(reverse("account:token-list"), {"name": "CI", "lifetime": "30"})
    html = response.content.decode()
    raw = re.search(r'value="(gct_[^"]+)"', html).group(1)
    assert "no-store" in {d.strip() for d in response["Cache-Control"].split(",")}
    token = ApiToken.objects.get(owner=alice)
    assert token.expires_at is not None and token.name == "CI"
    again = alice_client.get(reverse("account:token-list")).content.decode()
    assert raw not in again and token.display_prefix in again
    assert _api(raw).get("/api/v1/api-tokens/").json()["results"][0]["name"] == "CI"


def test_page_token_without_name_is_refused_with_a_message(alice_client: Client) -> None:
    alice_client.post(reverse("set_language"), {"language": "en", "next": "/"})
    response = alice_client.post(reverse("account:token-list"), {"name": "", "lifetime": ""})
    assert "This field is required." in response.content.decode()
    assert not ApiToken.objects.exists()


def test_api_creates_a_token_once_and_never_lists_the_secret(
    alice, bob, alice_client: Client
) -> None:
    make_api_token(bob)
    response = alice_client.post(
        "/api/v1/api-tokens/",
        {
            "name": "script",
            "owner": bob.pk,
            "prefix": "aaaaaaaaaaaa",
            "secret_hash": "0" * 64,
            "revoked_at": None,
            "last_used_at": "2030-01-01T00:00:00Z",
        },
        content_type="application/json",
    )
    assert response.status_code == 201
    created = response.json()
    raw = created["token"]
    token = ApiToken.objects.get(public_id=created["id"])
    assert token.owner == alice and token.prefix != "aaaaaaaaaaaa" and token.last_used_at is None
    listed = alice_client.get("/api/v1/api-tokens/").json()
    assert [t["id"] for t in listed["results"]] == [created["id"]]
    assert raw not in str(listed)
    assert alice_client.get(f"/api/v1/api-tokens/{created['id']}/").json()["state"] == "active"


def test_api_revokes_with_delete(alice, alice_client: Client) -> None:
    token, raw = make_api_token(alice)
    assert alice_client.delete(f"/api/v1/api-tokens/{token.public_id}/").status_code == 204
    token.refresh_from_db()
    assert token.state() == "revoked"
    assert _api(raw).get("/api/v1/ssh-keys/").status_code == 401


def test_token_list_query_counts_do_not_grow(
    alice,
    alice_client: Client,
    django_assert_max_num_queries,
) -> None:
    for i in range(6):
        make_api_token(alice, name=f"t{i}")
    with django_assert_max_num_queries(5):
        assert alice_client.get("/api/v1/api-tokens/").json()["count"] == 6
    with django_assert_max_num_queries(6):
        html = alice_client.get(reverse("account:token-list")).content.decode()
    assert len(re.findall(r'id="token-[0-9a-f]{8}-', html)) == 6


def test_openapi_document_describes_the_token_scheme(client: Client) -> None:
    schema = client.get("/api/schema/", headers={"Accept": "application/json"}).json()
    scheme = schema["components"]["securitySchemes"]["apiToken"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    operation = schema["paths"]["/api/v1/ssh-keys/"]["get"]
    assert {"apiToken": []} in operation["security"]
