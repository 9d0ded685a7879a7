"""Failed logins: one counter per account, whatever identifier is typed, on every login form."""

from __future__ import annotations

import pytest
from allauth.account.models import EmailAddress
from django.conf import settings
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db
WRONG = "wrong-Password-77"


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> None:
    cache.clear()  # allauth counts attempts in the cache


@pytest.fixture
def frank(django_user_model):
    user = django_user_model.objects.create_user(
        username="frank", email="frank@example.com", password=PASSWORD
    )
    EmailAddress.objects.create(user=user, email="frank@example.com", verified=True, primary=True)
    EmailAddress.objects.create(user=user, email="frank.work@example.com", verified=True)
    EmailAddress.objects.create(user=user, email="frank.old@example.com", verified=False)
    return user


def _client(ip: str = "198.51.100.7") -> Client:
    return Client(REMOTE_ADDR=ip, headers={"Accept-Language": "en"})


def _login(client: Client, login: str, password: str):
    return client.post(reverse("account_login"), {"login": login, "password": password})


def _logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


# Not "frank.old@example.com": an added address never verified is not a login of the account
# and answers as an unknown one, lock included (tests/console/test_input_edges.py).
IDENTIFIERS = [
    "frank",
    "FRANK",
    "frank@example.com",
    "Frank@Example.com",
    "frank.work@example.com",
]


def test_five_failures_under_any_mix_of_identifiers_lock_the_account_for_all_of_them(frank) -> None:
    # Five wrong passwords spread over the username and every address, from five addresses.
    for i, login in enumerate(IDENTIFIERS):
        assert not _logged_in_after(_login(_client(f"10.7.0.{i}"), login, WRONG))
    for login in ("frank", "frank@example.com", "frank.work@example.com"):
        client = _client("10.7.1.1")
        response = _login(client, login, PASSWORD)
        assert not _logged_in(client), login
        assert "Too many failed login attempts" in response.content.decode(), login


def _logged_in_after(response) -> bool:
    return response.status_code == 302 and response["Location"] == settings.LOGIN_REDIRECT_URL


def test_each_extra_address_gets_no_extra_guesses(frank) -> None:
    for _ in range(5):
        _login(_client(), "frank@example.com", WRONG)
    client = _client("10.7.2.2")
    _login(client, "frank.work@example.com", PASSWORD)  # the verified secondary address
    assert not _logged_in(client)


def test_the_lock_does_not_spill_over_to_other_accounts(frank, alice) -> None:
    EmailAddress.objects.create(user=alice, email=alice.email, verified=True, primary=True)
    for _ in range(5):
        _login(_client(), "frank", WRONG)
    client = _client()  # the same IP: colleagues behind one NAT keep working
    _login(client, alice.email, PASSWORD)
    assert _logged_in(client)


def test_an_unverified_secondary_address_does_not_reveal_whether_the_password_is_right(
    frank,
) -> None:
    right = _client("10.7.3.1")
    wrong = _client("10.7.3.2")
    with_right = _login(right, "frank.old@example.com", PASSWORD)
    with_wrong = _login(wrong, "frank.old@example.com", WRONG)
    assert not _logged_in(right) and not _logged_in(wrong)
    assert with_right.status_code == with_wrong.status_code == 200
    assert (
        with_right.content.decode().count("not correct")
        == with_wrong.content.decode().count("not correct")
        == 1
    )
    # ... while a verified secondary address logs in normally.
    ok = _client("10.7.3.3")
    _login(ok, "frank.work@example.com", PASSWORD)
    assert _logged_in(ok)


def test_a_new_account_with_its_only_address_unverified_is_sent_to_verify(
    django_user_model,
) -> None:
    user = django_user_model.objects.create_user(
        username="newbie", email="newbie@example.com", password=PASSWORD
    )
    EmailAddress.objects.create(user=user, email=user.email, verified=False, primary=True)
    response = _login(_client(), "newbie@example.com", PASSWORD)
    assert response.status_code == 302
    assert response["Location"] == reverse("account_email_verification_sent")


# --- the admin's login form ---------------------------------------------------------------------
def _admin_login(client: Client, username: str, password: str):
    return client.post(reverse("admin:login"), {"username": username, "password": password})


def test_admin_login_is_rate_limited_per_ip_like_the_console_login(operator, settings) -> None:
    # The shipped budget is 60/m per IP; a smaller one keeps the test quick (same mechanism).
    settings.ACCOUNT_RATE_LIMITS = {**settings.ACCOUNT_RATE_LIMITS, "login": "8/m/ip"}
    limit = 8
    client = _client("203.0.113.77")
    codes = [_admin_login(client, f"sprayed-{i}", WRONG).status_code for i in range(limit + 10)]
    assert 429 in codes, codes
    assert codes.index(429) <= limit
    # The budget is shared with the console's form: the same IP is throttled there too.
    assert _login(client, "someone-else", WRONG).status_code == 429


def test_admin_and_console_share_one_counter_per_account(operator) -> None:
    EmailAddress.objects.create(user=operator, email=operator.email, verified=True, primary=True)
    for i in range(3):
        _admin_login(_client(f"10.8.0.{i}"), operator.username, WRONG)
    for i in range(2):
        _login(_client(f"10.8.1.{i}"), operator.email, WRONG)
    assert _admin_login(_client("10.8.2.1"), operator.username, PASSWORD).status_code == 429
    client = _client("10.8.2.2")
    _login(client, operator.username, PASSWORD)
    assert not _logged_in(client)
