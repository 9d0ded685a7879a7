"""What a visitor and a new customer meet first: the landing page's claims, the navigation, the
login and "check your inbox" pages, and small things (favicon, private keys never echoed)."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest
from allauth.account.models import EmailAddress
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from billing import services as billing_services
from billing.seed import seed_default_prices
from marketplace.choices import AssetKind
from tests.marketplace.factories import AssetFactory, ImageFactory
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db
TEMPLATES = Path(settings.BASE_DIR) / "templates"


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> None:
    cache.clear()


def _main_text(html: str) -> str:
    main = re.search(r"<main.*?</main>", html, re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", main.group(0) if main else html))


def _page(client: Client, path: str, language: str = "en") -> str:
    response = client.get(path, HTTP_ACCEPT_LANGUAGE=language)
    assert response.status_code == 200
    return response.content.decode()


# --- the landing page: every claim computed -------------------------------------------------------
def test_the_landing_page_asks_visitors_to_sign_up_for_the_trial_credit(client: Client) -> None:
    html = _page(client, "/")
    cta = re.search(r'<a [^>]*id="cta-signup"[^>]*>(.*?)</a>', html, re.S)
    assert cta and reverse("account_signup") in cta.group(0)
    assert f"{billing_services.TRIAL_CREDIT} 元" in cta.group(1)
    assert reverse("billing:prices") in html
    zh = _page(client, "/", "zh-hans")
    assert f"注册即得 {billing_services.TRIAL_CREDIT} 元体验金" in _main_text(zh).replace(
        " 体", "体"
    )


def test_the_trial_credit_on_the_landing_page_is_billings_not_a_literal(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(billing_services, "TRIAL_CREDIT", Decimal("12.50"))
    assert "Sign up and get 12.50 元 trial credit" in _main_text(_page(client, "/"))


def test_the_landing_page_counts_the_catalogue_and_the_fleet_from_the_database(
    client: Client,
) -> None:
    AssetFactory.create_batch(3)
    AssetFactory.create_batch(2, kind=AssetKind.DATASET, publisher="data")
    AssetFactory(is_listed=False)
    ImageFactory()
    load_small_fleet()
    text = _main_text(_page(client, "/"))
    assert "3 public models and 2 datasets to mount read-only, 1 one-click images" in text
    assert "300+" not in text and "1,100" not in text
    assert re.search(r"\d+ cards \([^)]*RTX 4090[^)]*\) in Xiamen and Yinchuan\.", text)


def test_the_lowest_locked_price_names_the_model_it_applies_to(client: Client) -> None:
    seed_default_prices()
    text = _main_text(_page(client, "/"))
    assert "Locked price for 30 days: RTX 4090 down to 1.20 元 per card-hour." in text
    assert "RTX 4090 1.90 元" in text and "A800 3.50 元" in text
    assert "H800 7.00" not in text  # a placeholder is not an offer
    zh = _main_text(_page(client, "/", "zh-hans"))
    assert "长租 30 天锁价：RTX 4090 低至每卡时 1.20 元。" in zh


def test_no_template_states_catalogue_sizes_or_prices_as_literals() -> None:
    for path in (TEMPLATES / "console").glob("*.html"):
        text = path.read_text()
        assert not re.search(r"\d00\+|1,100|\d+\.\d\d 元", text), path


def test_a_customer_never_sees_a_placeholder_price(alice_client: Client) -> None:
    seed_default_prices()
    load_small_fleet()
    for language, absent, present in (
        ("zh-hans", "占位", "暂未开放"),
        ("en", "placeholder", "Not yet available"),
    ):
        html = _page(alice_client, "/", language)
        assert absent not in html.lower()
        # Not orderable, so not among "Available now" (issue 29): named apart, with no price.
        table = re.search(r'<table[^>]*id="availability".*?</table>', html, re.S).group(0)
        assert "<strong>H800</strong>" not in table and "<strong>A800</strong>" in table
        coming = re.search(r'<p class="small" id="coming-soon">.*?</p>', html, re.S).group(0)
        assert present in coming and "H800" in coming and "7.00" not in coming


# --- navigation and small things --------------------------------------------------------------------
def _active_nav_items(html: str) -> list[str]:
    nav = re.search(r'<ul class="navbar-nav me-auto">.*?</ul>\s*\n', html, re.S).group(0)
    return re.findall(r'class="nav-link[^"]*\bactive\b[^"]*"[^>]*>([^<]+)<', nav)


@pytest.mark.parametrize(
    ("path", "item"),
    [
        ("/ops/fleet/", "Operations"),
        ("/diagnostics/", "Operations"),
        ("/instances/", "Instances"),
        ("/prices/", "Prices"),
        ("/billing/", "Billing"),
        ("/images/", "Images"),
    ],
)
def test_exactly_the_section_of_the_page_is_highlighted(
    operator_client: Client, path: str, item: str
) -> None:
    assert _active_nav_items(_page(operator_client, path)) == [item]


def test_the_signed_in_address_is_legible_on_the_dark_navbar(alice_client: Client) -> None:
    html = _page(alice_client, "/")
    span = re.search(r'<span class="([^"]*)" id="nav-user">alice@example.com</span>', html)
    assert span and "text-white" in span.group(1).split()
    assert "text-light-emphasis" not in span.group(1)


def test_the_favicon_is_served(client: Client) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/x-icon"
    assert response.content[:4] == b"\x00\x00\x01\x00"  # an ICO header


def test_the_login_page_offers_the_password_reset_once(client: Client) -> None:
    assert _page(client, reverse("account_login"), "zh-hans").count("忘记密码") == 1
    html = _page(client, reverse("account_login"))
    assert html.count(reverse("account_reset_password")) == 1


def test_a_pasted_private_key_is_never_echoed_back(alice_client: Client) -> None:
    secret = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"
    private = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{secret}\n-----END OPENSSH PRIVATE KEY-----"
    response = alice_client.post(
        reverse("account:ssh-key-list"),
        {"name": "laptop", "public_key": private},
        HTTP_ACCEPT_LANGUAGE="en",
    )
    html = response.content.decode()
    assert "PRIVATE key" in html  # the reason is shown
    assert secret not in html and "BEGIN OPENSSH" not in html
    assert 'value="laptop"' in html  # other fields keep what was typed


def test_a_bad_public_key_is_kept_for_correction(alice_client: Client) -> None:
    response = alice_client.post(
        reverse("account:ssh-key-list"), {"name": "", "public_key": "ssh-ed25519 typo"}
    )
    assert "ssh-ed25519 typo" in response.content.decode()


# --- "check your inbox": resend, contact, and logged in after confirming ------------------------
User = get_user_model()
PASSWORD = "violet-Falcon-42-river"


def _signup(client: Client, email: str):
    return client.post(
        reverse("account_signup"), {"email": email, "password1": PASSWORD, "password2": PASSWORD}
    )


def test_check_your_inbox_links_a_real_contact_and_offers_a_resend(
    client: Client, settings
) -> None:
    settings.SUPPORT_EMAIL = "help@gpu.example.cn"
    html = _page(client, reverse("account_email_verification_sent"), "zh-hans")
    assert 'href="mailto:help@gpu.example.cn"' in html
    assert f'action="{reverse("account:resend-verification")}"' in html
    assert "重新发送链接" in html


def test_the_resend_sends_a_new_link_to_an_unverified_address_only() -> None:
    client = Client(REMOTE_ADDR="10.0.0.7")
    _signup(client, "ivy@lab.example.edu")
    assert len(mail.outbox) == 1
    cache.clear()  # allauth's one-mail-per-address window since the sign-up
    url = reverse("account:resend-verification")

    answer = client.post(url, {"email": "IVY@lab.example.edu"}, follow=True)
    assert len(mail.outbox) == 2 and mail.outbox[1].to == ["ivy@lab.example.edu"]
    assert "/accounts/confirm-email/" in mail.outbox[1].body
    # Again at once: allauth's per-address limit holds the mail back, the answer is the same.
    again = client.post(url, {"email": "ivy@lab.example.edu"}, follow=True)
    assert len(mail.outbox) == 2
    # An unknown address and a verified one: no mail, and the same answer (no enumeration).
    frank = User.objects.create_user("frank", "frank@example.com", PASSWORD)
    EmailAddress.objects.create(user=frank, email=frank.email, verified=True, primary=True)
    unknown = client.post(url, {"email": "nobody@example.com"}, follow=True)
    verified = client.post(url, {"email": "frank@example.com"}, follow=True)
    assert len(mail.outbox) == 2
    notices = [
        [str(m) for m in r.context["messages"]][-1] for r in (answer, again, unknown, verified)
    ]
    assert notices[0] == notices[1] == notices[2] == notices[3]


def test_the_resend_is_limited_per_client_address() -> None:
    client = Client(REMOTE_ADDR="10.0.0.8")
    url = reverse("account:resend-verification")
    codes = [client.post(url, {"email": f"x{i}@example.com"}).status_code for i in range(11)]
    assert codes[:10] == [302] * 10 and codes[10] == 429


def test_confirming_the_address_in_the_same_browser_logs_the_new_customer_in(
    django_capture_on_commit_callbacks,
) -> None:
    client = Client(REMOTE_ADDR="10.0.0.9")
    _signup(client, "judy@startup.example.com")
    link = re.search(r"https?://[^/\s]+(/accounts/confirm-email/[^/\s]+/)", mail.outbox[0].body)
    assert f"{billing_services.TRIAL_CREDIT} 元" in mail.outbox[0].body  # billing's amount
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(link.group(1))
    assert response.status_code == 302 and response["Location"] == settings.LOGIN_REDIRECT_URL
    user = User.objects.get(email="judy@startup.example.com")
    assert client.session["_auth_user_id"] == str(user.pk)
    assert "trial-credit-card" in _page(client, "/")


def test_a_confirmation_link_opened_elsewhere_verifies_but_does_not_log_in() -> None:
    _signup(Client(REMOTE_ADDR="10.0.0.10"), "kim@startup.example.com")
    link = re.search(r"https?://[^/\s]+(/accounts/confirm-email/[^/\s]+/)", mail.outbox[0].body)
    other = Client(REMOTE_ADDR="10.0.0.11")
    response = other.post(link.group(1))
    assert response.status_code == 302
    assert EmailAddress.objects.get(email="kim@startup.example.com").verified
    assert "_auth_user_id" not in other.session


# --- one language per page ------------------------------------------------------------------------
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
# Three English words in a row: an untranslated sentence (names like "RTX 4090" are one or two).
ENGLISH_RUN = re.compile(r"\b[A-Za-z][a-z]+(?:[ ,;:]+[a-z]{2,}){2,}\b")
VISITOR_PAGES = ("/", "/prices/", "/billing/quote/?gpu_model=RTX+4090&cards=8&disk_gb=0")
CUSTOMER_PAGES = ("/", "/prices/", "/billing/", "/billing/quote/?gpu_model=H800&cards=8&disk_gb=0")
ACCOUNT_PAGES = ("/accounts/login/", "/accounts/signup/", "/accounts/confirm-email/")


@pytest.mark.parametrize("who", ["visitor", "customer"])
def test_pages_speak_one_language(who: str, client: Client, alice_client: Client) -> None:
    seed_default_prices()
    load_small_fleet()
    AssetFactory()
    ImageFactory()
    reader = client if who == "visitor" else alice_client
    paths = VISITOR_PAGES + ACCOUNT_PAGES if who == "visitor" else CUSTOMER_PAGES
    for path in paths:
        english = _main_text(_page(reader, path, "en"))
        assert not CJK.search(english.replace("元", "")), (path, CJK.findall(english))
        chinese = _main_text(_page(reader, path, "zh-hans"))
        assert CJK.search(chinese), path
        assert not ENGLISH_RUN.search(chinese), (path, ENGLISH_RUN.findall(chinese))
