"""The account mails speak one language: the subject of a Chinese sign-up's verification mail is
Chinese throughout (allauth's own translation mixes in "Email"), the English one English."""

from __future__ import annotations

import pytest
from django.core import mail
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db
PASSWORD = "violet-Falcon-42-river"


@pytest.mark.parametrize(
    ("language", "expected"),
    [("zh-hans", "请确认您的电子邮箱地址"), ("en", "Please confirm your email address")],
)
def test_the_verification_subject_is_in_one_language(language: str, expected: str) -> None:
    cache.clear()
    client = Client(REMOTE_ADDR="10.0.0.9", headers={"Accept-Language": language})
    client.post(
        reverse("account_signup"),
        {"email": "dana@lab.example.edu", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert len(mail.outbox) == 1
    subject = mail.outbox[0].subject
    assert subject.endswith(expected), subject
    if language == "zh-hans":
        assert "Email" not in subject and "Please" not in subject
