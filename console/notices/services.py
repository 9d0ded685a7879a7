"""Notify an account of an event: the inbox row, then mail and SMS by its preferences.

Services other apps call
------------------------
* ``notify(user, event, params, *, key, link="")`` — idempotent by ``key`` (unique): a second call
  with the same key (a retried task, a replayed settlement, a worker that crashed after the
  first) finds the row and sends nothing. Mail and SMS go out after the caller's transaction
  commits, each claimed by a compare-and-set of its time first: at most once, never twice.
* ``unread_count(user)``, ``notices_for(user)``, ``mark_read(user, public_id)``,
  ``mark_all_read(user)``, ``preference(user)``, ``save_preference(user, …)``.

Texts are rendered in the recipient's language (``NoticePreference.language``; the console's
default until the account chooses), from templates in ``events.py`` and the notice's parameters.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext, gettext_noop, override

from console.errors import DomainError
from console.ids import uuid_or_404
from console.notices import sms
from console.notices.events import EVENTS, SHARED
from console.notices.models import Notice, NoticePreference

if TYPE_CHECKING:
    from console.models import User

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rendered:
    title: str
    body: str


def render(notice: Notice, language: str | None = None) -> Rendered:
    """The notice's title and text, in ``language`` (default: the active one)."""
    event = EVENTS.get(notice.event)
    if event is None:
        return Rendered(notice.event, "")

    def fill(template: str) -> str:
        text = gettext(template)
        try:
            return text % notice.params if notice.params else text
        except (KeyError, TypeError, ValueError):
            return text

    if language:
        with override(language):
            return Rendered(fill(event.title), fill(event.body))
    return Rendered(fill(event.title), fill(event.body))


def preference(user: Any) -> NoticePreference:
    row = NoticePreference.objects.filter(owner=user).first()
    return row or NoticePreference(owner=user, language=settings.LANGUAGE_CODE)


def channels_for(pref: NoticePreference, event: str) -> set[str]:
    chosen = pref.channels.get(SHARED.get(event, event))
    if chosen is None:
        return set(EVENTS[event].channels) if event in EVENTS else {"inbox"}
    return set(chosen)


def notify(user: Any, event: str, params: dict[str, Any], *, key: str, link: str = "") -> Notice:
    """Tell ``user`` about ``event`` once (``key``); mail and SMS after the commit."""
    return notify_user_id(user.pk, event, params, key=key, link=link)


def notify_user_id(
    user_id: int, event: str, params: dict[str, Any], *, key: str, link: str = ""
) -> Notice:
    """``notify`` by the account's primary key (callers that read ids in bulk: settlement)."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}")
    clean = {k: str(v) for k, v in params.items()}
    try:
        with transaction.atomic():
            notice = Notice.objects.create(
                recipient_id=user_id, event=event, params=clean, key=key[:200], link=link[:200]
            )
    except IntegrityError:
        return Notice.objects.get(key=key[:200])
    transaction.on_commit(lambda: deliver(notice.pk))
    return notice


def _claim(pk: int, field: str) -> bool:
    return (
        Notice.objects.filter(pk=pk, **{f"{field}__isnull": True}).update(**{field: timezone.now()})
        == 1
    )


def deliver(pk: int) -> None:
    """Send the notice's mail and SMS (each claimed first, so a repeat sends nothing). Failures
    are logged: a notice never undoes the event it tells of."""
    notice = Notice.objects.select_related("recipient").filter(pk=pk).first()
    if notice is None:
        return
    pref = preference(notice.recipient)
    wanted = channels_for(pref, notice.event)
    text = render(notice, pref.language)
    if "mail" in wanted and notice.recipient.email and _claim(pk, "mailed_at"):
        try:
            subject = f"{settings.ACCOUNT_EMAIL_SUBJECT_PREFIX}{text.title}"
            send_mail(subject, text.body + "\n", None, [notice.recipient.email])
        except Exception:
            logger.exception("could not mail notice %s", notice.public_id)
    if "sms" in wanted and pref.phone and _claim(pk, "texted_at"):
        try:
            sms.get_backend().send(pref.phone, f"【GPU Console】{text.body}")
        except Exception:
            logger.exception("could not text notice %s", notice.public_id)


# --- the inbox -----------------------------------------------------------------------------------
def notices_for(user: Any) -> Any:
    """The account's inbox (every notice: preferences choose mail and SMS), newest first."""
    return Notice.objects.filter(recipient=user)


def unread_count(user: Any) -> int:
    if not getattr(user, "pk", None):
        return 0
    return Notice.objects.filter(recipient=user, read_at__isnull=True).count()


def mark_read(user: Any, public_id: Any) -> Notice:
    notice = Notice.objects.filter(recipient=user, public_id=uuid_or_404(public_id)).first()
    if notice is None:
        raise Http404
    if notice.read_at is None:
        Notice.objects.filter(pk=notice.pk, read_at__isnull=True).update(read_at=timezone.now())
        notice.refresh_from_db(fields=["read_at"])
    return notice


def mark_all_read(user: Any) -> int:
    return Notice.objects.filter(recipient=user, read_at__isnull=True).update(
        read_at=timezone.now()
    )


def _threshold(value: Any) -> Decimal | None:
    text = str(value or "").strip()
    if not text:
        return None
    try:
        amount = Decimal(text)
    except InvalidOperation:
        amount = Decimal(-1)
    if not amount.is_finite() or amount <= 0 or amount != amount.quantize(Decimal("0.01")):
        raise DomainError(gettext_noop("Enter a threshold in 元, e.g. 100 or 99.50."))
    return amount


def save_preference(
    user: User,
    *,
    language: str,
    phone: str,
    channels: dict[str, list[str]],
    low_balance_yuan: Any = None,
) -> NoticePreference:
    known = {code for code, _name in settings.LANGUAGES}
    threshold = _threshold(low_balance_yuan)
    pref, _created = NoticePreference.objects.get_or_create(owner=user)
    if threshold != pref.low_balance_yuan:
        pref.low_balance_armed = True
    pref.low_balance_yuan = threshold
    pref.language = language if language in known else settings.LANGUAGE_CODE
    pref.phone = phone.strip()[:20]
    pref.channels = {
        event: sorted({c for c in chosen if c in ("inbox", "mail", "sms")})
        for event, chosen in channels.items()
        if event in EVENTS
    }
    pref.save()
    return pref
