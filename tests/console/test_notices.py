"""Notices that reach people: the inbox (站内信) page and API, mail and SMS (var/sms/) by the
account's preferences and in its language, once per event whatever retries; the events billing,
verification and invoices send (low balance, the arrears stop, decisions, an invoice issued)."""

from __future__ import annotations

import pytest
from django.core import mail
from rest_framework.test import APIClient

from console.notices import services
from console.notices.models import Notice, NoticePreference

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _sms_dir(settings, tmp_path):
    settings.SMS_FILE_PATH = tmp_path / "sms"
    settings.PRIVATE_FILES_DIR = tmp_path / "private"
    return tmp_path / "sms"


def _sms(folder) -> list[str]:
    return (
        sorted(p.read_text(encoding="utf-8") for p in folder.glob("*.txt"))
        if folder.exists()
        else []
    )


def test_a_notice_is_sent_once_whatever_retries(
    alice, _sms_dir, django_capture_on_commit_callbacks
) -> None:
    NoticePreference.objects.create(owner=alice, phone="13800138000")
    params = {"minutes": 30, "burn": "15.20"}
    with django_capture_on_commit_callbacks(execute=True):
        first = services.notify(alice, "low_balance", params, key="k1")
        again = services.notify(alice, "low_balance", params, key="k1")  # a retried task
    assert first.pk == again.pk and Notice.objects.count() == 1
    services.deliver(first.pk)  # a worker that crashed after sending, then retried
    assert len(mail.outbox) == 1
    texts = _sms(_sms_dir)
    assert len(texts) == 1 and texts[0].startswith("To: 13800138000")
    assert (
        "15.20" in texts[0]
        and "余额不足" in mail.outbox[0].subject
        or "15.20" in mail.outbox[0].body
    )


def test_each_notice_is_in_the_recipients_language(
    alice, bob, django_capture_on_commit_callbacks
) -> None:
    NoticePreference.objects.create(owner=bob, language="en")
    with django_capture_on_commit_callbacks(execute=True):
        services.notify(alice, "stopped", {"n": 2}, key="a")
        services.notify(bob, "stopped", {"n": 2}, key="b")
    by_to = {m.to[0]: m for m in mail.outbox}
    assert "2 个实例已停机" in by_to[alice.email].body
    assert "instance(s) were stopped" in by_to[bob.email].body


def test_preferences_choose_mail_and_sms_per_event(
    alice, alice_client, _sms_dir, django_capture_on_commit_callbacks
) -> None:
    r = alice_client.post(
        "/notifications/",
        {"language": "en", "phone": "13800138000", "low_balance-sms": "1", "stopped-mail": "1"},
    )
    assert r.status_code == 302
    pref = NoticePreference.objects.get(owner=alice)
    assert pref.language == "en" and pref.channels["low_balance"] == ["sms"]
    with django_capture_on_commit_callbacks(execute=True):
        services.notify(alice, "low_balance", {"minutes": 5, "burn": "1.00"}, key="x")
    assert mail.outbox == [] and len(_sms(_sms_dir)) == 1
    assert "minutes of usage are left" in _sms(_sms_dir)[0]
    assert Notice.objects.filter(recipient=alice).count() == 1  # the inbox always has it


def test_the_inbox_page_badge_and_mark_read(alice, alice_client, bob_client) -> None:
    one = services.notify(alice, "stopped", {"n": 1}, key="p1")
    services.notify(alice, "low_balance", {"minutes": 9, "burn": "2.00"}, key="p2")
    badge = alice_client.get("/notifications/badge/").content.decode()
    assert 'id="notice-count"' in badge and ">2<" in badge
    assert 'hx-get="/notifications/badge/"' in alice_client.get("/billing/").content.decode()
    page = alice_client.get("/notifications/").content.decode()
    assert 'data-unread="2"' in page and "余额不足" in page
    assert (
        f'hx-post="/notifications/{one.public_id}/read/"' in page
    )  # the page's route, not the API's
    en = alice_client.get("/notifications/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Low balance" in en
    # htmx marks one read and gets the list back.
    r = alice_client.post(f"/notifications/{one.public_id}/read/", HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and 'data-unread="1"' in r.content.decode()
    assert bob_client.post(f"/notifications/{one.public_id}/read/").status_code == 404
    alice_client.post("/notifications/read-all/")
    assert services.unread_count(alice) == 0
    assert (
        alice_client.get("/notifications/badge/").content.decode()
        == '<span id="notice-count"></span>'
    )


def test_the_api_lists_counts_and_marks_read(alice, bob) -> None:
    notice = services.notify(
        alice, "invoice_issued", {"number": "26000000000000000001", "amount": "12.00"}, key="i"
    )
    api = APIClient()
    api.force_authenticate(alice)
    body = api.get("/api/v1/notifications/").json()
    assert body["results"][0]["event"] == "invoice_issued" and body["results"][0]["read"] is False
    assert "26000000000000000001" in body["results"][0]["title"]
    assert api.get("/api/v1/notifications/unread-count/").json() == {"unread": 1}
    assert api.post(f"/api/v1/notifications/{notice.public_id}/read/").json()["read"] is True
    assert api.get("/api/v1/notifications/unread-count/").json() == {"unread": 0}
    other = APIClient()
    other.force_authenticate(bob)
    assert other.get(f"/api/v1/notifications/{notice.public_id}/").status_code == 404
    assert other.post("/api/v1/notifications/read-all/").json() == {"marked": 0}


def test_decisions_and_invoices_are_notified(alice, django_capture_on_commit_callbacks) -> None:
    from console.verification import services as verification
    from console.verification.models import Verification

    Verification.objects.filter(owner=alice).delete()
    with django_capture_on_commit_callbacks(execute=True):
        verification.submit_personal(alice, real_name="张三", id_number="11010519491231002X")
    assert Notice.objects.get(recipient=alice).event == "verification_approved"
    assert "实名认证已通过" in mail.outbox[0].subject
