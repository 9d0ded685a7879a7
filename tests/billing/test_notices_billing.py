"""Billing's warnings reach people through console/notices: the settlement's low-balance warning
and the arrears stop land in the inbox, in var/mail/ and in var/sms/ (once each)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core import mail

from billing import services as billing
from billing.models import BillingNotice
from console.notices.models import Notice, NoticePreference
from tests.billing.factories import open_session

pytestmark = pytest.mark.django_db


@pytest.fixture
def _sms_dir(settings, tmp_path):
    settings.SMS_FILE_PATH = tmp_path / "sms"
    return tmp_path / "sms"


def _sms(folder) -> list[str]:
    return (
        sorted(p.read_text(encoding="utf-8") for p in folder.glob("*.txt"))
        if folder.exists()
        else []
    )


@pytest.mark.django_db
def test_low_balance_and_the_stop_reach_the_inbox_mail_and_sms(
    alice, prices, billing_clock, stop_requests, _sms_dir, django_capture_on_commit_callbacks
) -> None:
    """The settlement's warnings go through the same path: inbox, var/mail/, var/sms/."""
    NoticePreference.objects.create(owner=alice, phone="13800138000")
    billing.grant_voucher(alice, Decimal("10"), reason="small", valid_days=30)
    open_session(alice, cards=8)  # 15.20 元/h: 10 元 last about 39 minutes
    with django_capture_on_commit_callbacks(execute=True):
        billing_clock.advance(60)
        billing.settle_usage()
    assert BillingNotice.objects.filter(kind="low_balance").count() == 1
    notice = Notice.objects.get(recipient=alice, event="low_balance")
    assert notice.mailed_at and notice.texted_at
    assert len(mail.outbox) == 1 and len(_sms(_sms_dir)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(45):
            billing_clock.advance(60)
            billing.settle_usage()
    assert Notice.objects.filter(recipient=alice, event="stopped").count() == 1
    assert stop_requests
    assert len(_sms(_sms_dir)) == 2


@pytest.mark.django_db
def test_the_customers_own_threshold_warns_once_per_crossing(
    alice,
    alice_client,
    prices,
    billing_clock,
    stop_requests,
    _sms_dir,
    django_capture_on_commit_callbacks,
) -> None:
    r = alice_client.post(
        "/notifications/",
        {
            "language": "zh-hans",
            "phone": "13900139000",
            "low_balance_yuan": "95",
            "low_balance_threshold-mail": "1",
            "low_balance_threshold-sms": "1",
        },
    )
    assert r.status_code == 302
    billing.grant_voucher(alice, Decimal("100"), reason="funds", valid_days=30)
    open_session(alice, cards=8)  # 15.20 元/h: 100 元 fall below 95 元 after about 20 minutes

    def minutes(n: int) -> None:
        for _ in range(n):  # each settlement's callbacks run at its commit, as in production
            with django_capture_on_commit_callbacks(execute=True):
                billing_clock.advance(60)
                billing.settle_usage()

    minutes(30)
    warnings = Notice.objects.filter(recipient=alice, event="low_balance_threshold")
    assert warnings.count() == 1
    assert "95" in warnings.get().params["threshold"]
    assert any("95" in t and "13900139000" in t for t in _sms(_sms_dir))
    # Back above it (a voucher), then below again about 3 h later: one more warning.
    billing.grant_voucher(alice, Decimal("50"), reason="more", valid_days=30)
    minutes(150)
    assert warnings.count() == 1
    minutes(60)
    assert warnings.count() == 2


@pytest.mark.django_db
def test_a_bad_threshold_is_refused(alice, alice_client) -> None:
    alice_client.post("/notifications/", {"language": "en", "low_balance_yuan": "-5"})
    assert not NoticePreference.objects.filter(owner=alice, low_balance_yuan__isnull=False).exists()
