"""Races on PostgreSQL + Redis: verification clicked twice at once, a burst of sign-ups."""

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

from billing.models import LedgerTransaction
from billing.services import get_wallet_summary
from console import services
from tests.support.concurrency import race

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
User = get_user_model()
PASSWORD = "violet-Falcon-42-river"


def test_concurrent_verification_grants_the_trial_credit_once() -> None:
    cache.clear()
    Client(REMOTE_ADDR="10.1.0.1").post(
        reverse("account_signup"),
        {"email": "race@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    user = User.objects.get(email="race@example.com")
    path = re.search(r"https?://[^/\s]+(/accounts/confirm-email/\S+/)", mail.outbox[0].body).group(
        1
    )

    results = race(6, lambda i: Client(REMOTE_ADDR=f"10.1.1.{i}").post(path).status_code)
    # Requests that read the address after another one verified it find the link used (allauth
    # answers 404 for an already-verified address); none fails, at least one verifies.
    assert all(code in (200, 302, 404) for code in results), results
    assert any(code in (200, 302) for code in results), results

    assert EmailAddress.objects.get(user=user).verified
    assert get_wallet_summary(user).trial == Decimal("10.00")
    assert LedgerTransaction.objects.filter(wallet__team__personal_of=user).count() == 1

    # The grant itself, hit by many workers at once (e.g. two verification paths firing):
    # exactly one call wins, the others wait on the wallet lock and see its grant.
    other = User.objects.create_user("racer", "racer@example.com", PASSWORD)
    wins = race(8, lambda i: services.grant_trial_credit_after_verification(other.pk))
    assert wins.count(True) == 1 and wins.count(False) == 7, wins
    assert get_wallet_summary(other).trial == Decimal("10.00")


def test_a_burst_of_signups_from_one_ip_stays_within_the_limit() -> None:
    cache.clear()  # Redis here: the counter every web server shares

    def signup(i: int) -> int:
        return (
            Client(REMOTE_ADDR="203.0.113.50")
            .post(
                reverse("account_signup"),
                {"email": f"burst{i}@example.com", "password1": PASSWORD, "password2": PASSWORD},
            )
            .status_code
        )

    limit = int(settings.ACCOUNT_RATE_LIMITS["signup"].split("/")[0])
    results = race(limit + 8, signup)
    assert all(code in (302, 429) for code in results), results
    created = User.objects.filter(email__startswith="burst").count()
    assert created == results.count(302)
    assert 1 <= created <= limit
