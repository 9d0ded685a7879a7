"""Sign-up, verification, login, reset: every rejection, the abuse limits, no enumeration."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from allauth.account.models import EmailAddress
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from billing.services import get_wallet_summary
from console import services
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db
User = get_user_model()
GOOD_PASSWORD = "violet-Falcon-42-river"


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> None:
    cache.clear()  # allauth counts attempts in the cache


def _client(ip: str = "10.0.0.1") -> Client:
    return Client(REMOTE_ADDR=ip, headers={"Accept-Language": "en"})


def _signup(
    client: Client, email: str, password: str = GOOD_PASSWORD, password2: str | None = None
):
    return client.post(
        reverse("account_signup"),
        {"email": email, "password1": password, "password2": password2 or password},
    )


def _confirmation_link(message: mail.EmailMessage) -> str:
    return re.search(r"https?://[^/\s]+(/accounts/confirm-email/[^/\s]+/)", message.body).group(1)


def _verified(user) -> None:
    EmailAddress.objects.create(user=user, email=user.email, verified=True, primary=True)


def _login(client: Client, login: str, password: str):
    return client.post(reverse("account_login"), {"login": login, "password": password})


# --- sign-up and verification -------------------------------------------------------------------
def test_signup_sends_a_verification_mail_and_grants_nothing_before_it() -> None:
    client = _client()
    response = _signup(client, "carol@lab.example.edu")
    assert response.status_code == 302
    assert response["Location"] == reverse("account_email_verification_sent")
    user = User.objects.get(email="carol@lab.example.edu")
    assert user.username  # generated: username is optional
    assert not EmailAddress.objects.get(user=user).verified
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["carol@lab.example.edu"]
    assert get_wallet_summary(user).trial == Decimal("0")
    # Not logged in, and logging in before verifying only re-sends the mail.
    assert client.get(reverse("account:overview")).status_code == 302
    response = _login(client, "carol@lab.example.edu", GOOD_PASSWORD)
    assert response["Location"] == reverse("account_email_verification_sent")
    assert "_auth_user_id" not in client.session


def test_verification_grants_the_trial_credit_once(django_capture_on_commit_callbacks) -> None:
    client = _client()
    _signup(client, "dave@startup.example.com")
    link = _confirmation_link(mail.outbox[0])
    user = User.objects.get(email="dave@startup.example.com")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(link)
    assert response.status_code == 302
    assert EmailAddress.objects.get(user=user).verified
    assert get_wallet_summary(user).trial == Decimal("10.00")

    # The same link again, a second verified address, a direct replay: nothing more.
    with django_capture_on_commit_callbacks(execute=True):
        client.post(link)
        second = EmailAddress.objects.create(user=user, email="dave2@startup.example.com")
        services.on_email_verified(user.pk)
    assert not services.grant_trial_credit_after_verification(user.pk)
    assert second.pk and get_wallet_summary(user).trial == Decimal("10.00")

    response = _login(client, "dave@startup.example.com", GOOD_PASSWORD)
    assert response.status_code == 302
    html = client.get("/").content.decode()
    assert "10.00 元" in html and "/demo/llama-7b/" in html


def test_an_invalid_confirmation_key_is_refused() -> None:
    response = _client().post("/accounts/confirm-email/not-a-real-key/")
    assert response.status_code == 404 or "expired or is invalid" in response.content.decode()


@pytest.mark.parametrize(
    ("email", "password", "password2", "message"),
    [
        ("not-an-email", GOOD_PASSWORD, None, "Enter a valid email address."),
        ("", GOOD_PASSWORD, None, "This field is required."),
        ("erin@example.com", "short1", None, "This password is too short."),
        ("erin@example.com", "password1234", None, "This password is too common."),
        ("erin@example.com", "4815162342108", None, "This password is entirely numeric."),
        (
            "erin@example.com",
            GOOD_PASSWORD,
            "another-Password-99",
            "You must type the same password each time.",
        ),
        ("erin@mailinator.com", GOOD_PASSWORD, None, "Disposable email addresses (mailinator.com)"),
        ("erin@inbox.guerrillamail.com", GOOD_PASSWORD, None, "Disposable email addresses"),
    ],
)
def test_bad_signup_input_is_refused_with_a_clear_message(
    email: str, password: str, password2: str | None, message: str
) -> None:
    response = _signup(_client(), email, password, password2)
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not User.objects.exists()
    assert mail.outbox == []


def test_duplicate_signup_looks_like_a_new_one_and_mails_the_owner(alice) -> None:
    fresh = _signup(_client("10.0.0.2"), "frank@example.com")
    mail.outbox.clear()
    duplicate = _signup(_client("10.0.0.3"), alice.email)
    assert (duplicate.status_code, duplicate["Location"]) == (fresh.status_code, fresh["Location"])
    assert User.objects.filter(email=alice.email).count() == 1
    assert len(mail.outbox) == 1 and mail.outbox[0].to == [alice.email]
    assert "already" in mail.outbox[0].body  # tells the owner, not the visitor


def test_signup_email_is_case_insensitive_duplicate(alice) -> None:
    _signup(_client(), alice.email.upper())
    assert User.objects.filter(email__iexact=alice.email).count() == 1


# --- login --------------------------------------------------------------------------------------
def test_login_by_email_or_username(alice) -> None:
    _verified(alice)
    for login in (alice.email, alice.username):
        client = _client()
        assert _login(client, login, PASSWORD).status_code == 302
        assert client.get(reverse("account:overview")).status_code == 200


def test_login_answers_the_same_for_unknown_accounts_and_wrong_passwords(alice) -> None:
    _verified(alice)
    unknown = _login(_client(), "nobody@example.com", "whatever-Pass-1")
    wrong = _login(_client(), alice.email, "whatever-Pass-1")
    assert unknown.status_code == wrong.status_code == 200
    text = "The email address and/or password you specified are not correct."
    assert text in unknown.content.decode() and text in wrong.content.decode()


def test_repeated_failures_lock_the_account_but_not_others_behind_the_same_ip(alice, bob) -> None:
    _verified(alice)
    _verified(bob)
    attacker = _client("192.0.2.7")
    for _ in range(5):
        assert "not correct" in _login(attacker, alice.email, "guess-Guess-1").content.decode()
    locked = _login(attacker, alice.email, PASSWORD)
    assert "Too many failed login attempts" in locked.content.decode()
    assert "_auth_user_id" not in attacker.session
    # A colleague behind the same NAT still logs in.
    colleague = _client("192.0.2.7")
    assert _login(colleague, bob.email, PASSWORD).status_code == 302
    # And alice herself stays locked from anywhere until the window passes.
    assert (
        "Too many failed" in _login(_client("198.51.100.1"), alice.email, PASSWORD).content.decode()
    )


# --- password reset -----------------------------------------------------------------------------
def test_password_reset_answers_the_same_for_unknown_and_known_addresses(alice) -> None:
    _verified(alice)
    known = _client("10.0.1.1").post(reverse("account_reset_password"), {"email": alice.email})
    unknown = _client("10.0.1.2").post(
        reverse("account_reset_password"), {"email": "nobody@example.com"}
    )
    assert (known.status_code, known["Location"]) == (unknown.status_code, unknown["Location"])
    assert {tuple(m.to) for m in mail.outbox} == {(alice.email,), ("nobody@example.com",)}


def test_password_reset_link_sets_a_new_password(alice) -> None:
    _verified(alice)
    client = _client()
    client.post(reverse("account_reset_password"), {"email": alice.email})
    link = re.search(
        r"https?://[^/\s]+(/accounts/password/reset/key/\S+/)", mail.outbox[0].body
    ).group(1)
    form_url = client.get(link)["Location"]
    response = client.post(form_url, {"password1": GOOD_PASSWORD, "password2": GOOD_PASSWORD})
    assert response.status_code == 302
    assert _login(_client(), alice.email, GOOD_PASSWORD).status_code == 302


# --- abuse limits -------------------------------------------------------------------------------
def _limit(action: str) -> int:
    """The first (per-IP) allowance of the configured rate, e.g. "10/h/ip" -> 10."""
    return int(settings.ACCOUNT_RATE_LIMITS[action].split("/")[0])


def test_signups_are_rate_limited_per_ip() -> None:
    client = _client("203.0.113.9")
    limit = _limit("signup")
    for i in range(limit):
        assert _signup(client, f"user{i}@example.com").status_code == 302
    assert _signup(client, "over@example.com").status_code == 429
    assert not User.objects.filter(email="over@example.com").exists()
    assert _signup(_client("203.0.113.10"), "other-ip@example.com").status_code == 302


def test_password_resets_are_rate_limited_per_ip() -> None:
    client = _client("203.0.113.20")
    limit = _limit("reset_password")
    for i in range(limit):
        response = client.post(reverse("account_reset_password"), {"email": f"x{i}@example.com"})
        assert response.status_code == 302
    response = client.post(reverse("account_reset_password"), {"email": "over@example.com"})
    assert response.status_code == 429
    assert len(mail.outbox) == limit


def test_password_resets_are_rate_limited_per_address(alice) -> None:
    _verified(alice)
    for i in range(3):
        _client(f"10.9.0.{i}").post(reverse("account_reset_password"), {"email": alice.email})
    response = _client("10.9.0.99").post(reverse("account_reset_password"), {"email": alice.email})
    assert response.status_code == 429
    assert len(mail.outbox) == 3


# --- pages and language -------------------------------------------------------------------------
def test_account_pages_speak_chinese_by_default_and_english_on_request(
    alice, alice_client: Client
) -> None:
    zh = Client().get(reverse("account_signup")).content.decode()
    assert '<html lang="zh-hans"' in zh and "注册" in zh and "体验金" in zh
    en = _client().get(reverse("account_signup")).content.decode()
    assert "Create your account" in en and "10.00 元 trial credit" in en
    assert "SSH" in alice_client.get(reverse("account:overview")).content.decode()


def test_landing_page_offers_sign_up(client: Client) -> None:
    assert reverse("account_signup") in client.get("/").content.decode()


def test_accounts_created_by_operators_can_be_marked_verified_and_log_in(alice) -> None:
    services.mark_email_verified(alice)
    services.mark_email_verified(alice)  # idempotent
    assert EmailAddress.objects.get(user=alice).verified
    assert _login(_client(), alice.username, PASSWORD).status_code == 302
    assert get_wallet_summary(alice).trial == Decimal("0")


def test_admin_login_shares_the_lockout(operator, alice) -> None:
    _verified(operator)
    attacker = _client("192.0.2.50")
    for _ in range(5):
        response = attacker.post(
            reverse("admin:login"), {"username": operator.username, "password": "nope-Nope-1"}
        )
        assert response.status_code == 200
    locked = attacker.post(
        reverse("admin:login"), {"username": operator.username, "password": PASSWORD}
    )
    assert locked.status_code == 429
    # Locked on the console's form too, while another account behind the same IP is not.
    assert "Too many failed" in _login(attacker, operator.email, PASSWORD).content.decode()
    ok = _client("192.0.2.50").post(
        reverse("admin:login"), {"username": alice.username, "password": PASSWORD}
    )
    assert ok.status_code == 200  # alice is no operator: the admin says so, but is not locked
    assert "Too many" not in ok.content.decode()


def test_a_successful_admin_login_does_not_count_as_a_failure(operator) -> None:
    for _ in range(6):
        client = _client("192.0.2.60")
        response = client.post(
            reverse("admin:login"), {"username": operator.username, "password": PASSWORD}
        )
        assert response.status_code == 302


def test_signup_ignores_privilege_fields() -> None:
    _client().post(
        reverse("account_signup"),
        {
            "email": "mallory@example.com",
            "password1": GOOD_PASSWORD,
            "password2": GOOD_PASSWORD,
            "is_staff": "on",
            "is_superuser": "on",
            "username": "admin",
        },
    )
    user = User.objects.get(email="mallory@example.com")
    assert not user.is_staff and not user.is_superuser


def test_a_malformed_rate_limit_setting_fails_at_start(tmp_path) -> None:
    import subprocess
    import sys

    from tests.support.servers import ROOT, embedded_env

    env = embedded_env(tmp_path)
    env["RATE_LIMIT_SIGNUP"] = "ten per hour"
    result = subprocess.run(
        [sys.executable, "-c", "import console.settings"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "Rate limit 'ten per hour' for signup is invalid" in result.stderr


@pytest.mark.parametrize(
    ("email", "mailbox"),
    [
        ("Alice@Example.com", "alice@example.com"),
        ("alice+gpu@example.com", "alice@example.com"),
        ("A.Lice+x@GoogleMail.com", "alice@gmail.com"),
        ("a.lice@lab.example.edu", "a.lice@lab.example.edu"),
    ],
)
def test_canonical_mailbox(email: str, mailbox: str) -> None:
    assert services.canonical_mailbox(email) == mailbox


def _sign_up_and_verify(email: str, ip: str, capture) -> object:
    client = _client(ip)
    mail.outbox.clear()
    _signup(client, email)
    with capture(execute=True):
        client.post(_confirmation_link(mail.outbox[0]))
    return User.objects.get(email__iexact=email)


def test_one_trial_credit_per_mailbox_across_accounts(django_capture_on_commit_callbacks) -> None:
    first = _sign_up_and_verify("ivan@example.com", "10.2.0.1", django_capture_on_commit_callbacks)
    alias = _sign_up_and_verify(
        "Ivan+second@example.com", "10.2.0.2", django_capture_on_commit_callbacks
    )
    assert get_wallet_summary(first).trial == Decimal("10.00")
    assert EmailAddress.objects.get(user=alias).verified
    assert get_wallet_summary(alias).trial == Decimal("0")


def test_password_change_and_logout(alice) -> None:
    _verified(alice)
    client = _client()
    _login(client, alice.email, PASSWORD)
    weak = client.post(
        reverse("account_change_password"),
        {"oldpassword": PASSWORD, "password1": "12345", "password2": "12345"},
    )
    assert "This password is too short" in weak.content.decode()
    response = client.post(
        reverse("account_change_password"),
        {"oldpassword": PASSWORD, "password1": GOOD_PASSWORD, "password2": GOOD_PASSWORD},
    )
    assert response.status_code == 302
    assert client.get(reverse("account:overview")).status_code == 200  # still logged in
    client.post(reverse("account_logout"))
    assert client.get(reverse("account:overview")).status_code == 302
    assert _login(_client(), alice.email, GOOD_PASSWORD).status_code == 302
