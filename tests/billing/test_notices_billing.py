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
