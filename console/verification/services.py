"""Real-name verification: submissions, the operator's review and the gate.

Services other apps call
------------------------
* ``require_verified(user, action)`` — the gate: raises ``VerificationRequired`` (403
  ``verification_required``) when ``action`` is in ``VERIFICATION_REQUIRED_FOR`` and the account
  is not verified. Billing calls it for ``topup`` (``start_topup``) and ``invoice``; slices for
  ``large_order`` through ``require_verified_for_order(user, cards)`` (slices of
  ``VERIFICATION_LARGE_ORDER_CARDS`` cards or more). Every door (page, API, admin) goes through
  those services, so all refuse alike.
* ``verified(user) -> Verification | None`` — the approved record (its kind tells an
  organisation, which may ask for a 专票).

What is kept of a person: the name, the ID number masked (``11**************2X``) and an HMAC of
it under a key derived from ``SECRET_KEY``; the number itself is never stored, logged or
returned by the API. The face check is the provider's; nothing of it is kept but its reference.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext_noop

from console.errors import DomainError, ErrorCode
from console.ids import uuid_or_404
from console.notices import services as notices
from console.verification import checks
from console.verification.models import (
    ORGANISATION_KINDS,
    Verification,
    VerificationKind,
    VerificationState,
)
from console.verification.providers import get_provider

if TYPE_CHECKING:
    from console.models import User

logger = logging.getLogger(__name__)

VERIFICATION_URL = "/account/verification/"
# The actions a setting may gate (VERIFICATION_REQUIRED_FOR).
GATED_ACTIONS = ("topup", "invoice", "large_order")

# A licence: what its first bytes must be, by the type it is stored as.
LICENCE_TYPES = {
    b"%PDF-": "application/pdf",
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
}
_PHONE = re.compile(r"^[0-9+\-() ]{5,30}$")


class VerificationError(DomainError):
    code = ErrorCode.INVALID


class VerificationRequired(DomainError):
    code = ErrorCode.VERIFICATION_REQUIRED
    http_status = 403


# --- the gate ------------------------------------------------------------------------------------
def verified(user: Any) -> Verification | None:
    from console.tenancy import user_of

    user = user_of(user)  # a person is verified, whichever team they act in
    if not getattr(user, "pk", None):
        return None
    return Verification.objects.filter(owner=user, state=VerificationState.APPROVED).first()


def is_gated(action: str) -> bool:
    return action in settings.VERIFICATION_REQUIRED_FOR


_REFUSALS = {
    "topup": gettext_noop(
        "Online top-ups need a verified account (real-name verification). Verify at %(verification_url)s."
    ),
    "invoice": gettext_noop(
        "Invoices need a verified account (real-name verification). Verify at %(verification_url)s."
    ),
    "large_order": gettext_noop(
        "Orders of %(cards)d cards or more need a verified account (real-name verification). Verify at %(verification_url)s."
    ),
}


def require_verified(user: Any, action: str) -> None:
    """Refuse ``action`` (one of ``GATED_ACTIONS``) for an unverified account when it is gated."""
    if action not in GATED_ACTIONS:
        raise ValueError(f"unknown gated action {action!r}")
    if not is_gated(action) or verified(user) is not None:
        return
    raise VerificationRequired(
        _REFUSALS[action],
        cards=int(settings.VERIFICATION_LARGE_ORDER_CARDS),
        action=action,
        verification_url=VERIFICATION_URL,
    )


def require_verified_for_order(user: Any, cards: int) -> None:
    """The gate of an order: slices of ``VERIFICATION_LARGE_ORDER_CARDS`` cards or more."""
    if int(cards) >= int(settings.VERIFICATION_LARGE_ORDER_CARDS):
        require_verified(user, "large_order")


# --- status --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Status:
    state: str  # "none" or a VerificationState
    latest: Verification | None
    required_for: tuple[str, ...]

    @property
    def verified(self) -> bool:
        return self.state == VerificationState.APPROVED


def status(user: User) -> Status:
    """The account's standing: its live (pending/approved) record, else its latest rejected one."""
    rows = list(Verification.objects.filter(owner=user)[:5])
    live = next((v for v in rows if v.state != VerificationState.REJECTED), None)
    latest = live or (rows[0] if rows else None)
    required = tuple(a for a in GATED_ACTIONS if is_gated(a))
    return Status(latest.state if latest else "none", latest, required)


# --- submissions ---------------------------------------------------------------------------------
def id_number_hash(id_number: str) -> str:
    """A keyed hash of the normalised number (HMAC-SHA256 under a key derived from SECRET_KEY)."""
    key = hashlib.sha256(b"console.verification.id:" + settings.SECRET_KEY.encode()).digest()
    return hmac.new(key, checks.normalize(id_number).encode(), hashlib.sha256).hexdigest()


def _ensure_none_live(user: User) -> None:
    live = Verification.objects.filter(
        owner=user, state__in=(VerificationState.PENDING, VerificationState.APPROVED)
    ).first()
    if live is None:
        return
    if live.state == VerificationState.APPROVED:
        raise VerificationError(
            gettext_noop("This account is already verified."),
            code=ErrorCode.CONFLICT,
            http_status=409,
        )
    raise VerificationError(
        gettext_noop("A verification is already under review."),
        code=ErrorCode.CONFLICT,
        http_status=409,
    )


def _required(value: str, field: str, template: str, limit: int) -> str:
    value = (value or "").strip()
    if not value or len(value) > limit:
        raise VerificationError(template, field=field)
    return value


def submit_personal(user: User, *, real_name: str, id_number: str) -> Verification:
    """A person: name and ID number (GB 11643 check character) to the provider's face check. The
    sandbox decides at once; the decision is notified."""
    name = _required(
        real_name, "real_name", gettext_noop("Enter your name as on your ID card."), 100
    )
    number = checks.normalize(id_number or "")
    if not checks.resident_id_valid(number):
        raise VerificationError(
            gettext_noop("This is not a valid resident ID number (check its last character)."),
            field="id_number",
        )
    _ensure_none_live(user)
    digest = id_number_hash(number)
    taken = Verification.objects.filter(
        id_number_hash=digest, state=VerificationState.APPROVED
    ).exclude(owner=user)
    if taken.exists():  # one ID number verifies one account
        raise VerificationError(
            gettext_noop("This ID number already verifies another account."),
            code=ErrorCode.CONFLICT,
            http_status=409,
            field="id_number",
        )
    provider = get_provider()
    result = provider.check_person(name, number)
    now = timezone.now()
    try:
        with transaction.atomic():
            row = Verification.objects.create(
                owner=user,
                kind=VerificationKind.PERSONAL,
                state=VerificationState.APPROVED if result.approved else VerificationState.REJECTED,
                provider=provider.name,
                provider_reference=result.reference,
                real_name=name,
                id_number_masked=checks.mask_id_number(number),
                id_number_hash=digest,
                reason=result.reason,
                decided_at=now,
            )
    except IntegrityError:  # a concurrent submission of the same account won
        _ensure_none_live(user)
        raise
    _notify_on_commit(row)
    return row


def _licence_type(upload: UploadedFile) -> str:
    limit = int(settings.VERIFICATION_LICENCE_MAX_BYTES)
    if upload.size is None or upload.size > limit:
        raise VerificationError(
            gettext_noop("The licence file is larger than %(mb)s MB."),
            field="licence",
            mb=limit // (1024 * 1024),
        )
    upload.seek(0)
    head = upload.read(8)
    upload.seek(0)
    for magic, content_type in LICENCE_TYPES.items():
        if head.startswith(magic):
            return content_type
    raise VerificationError(
        gettext_noop("Upload the licence as a PNG, JPEG or PDF file."), field="licence"
    )


def submit_organisation(
    user: User,
    *,
    kind: str,
    organisation_name: str,
    credit_code: str,
    licence: UploadedFile | None,
    contact_name: str,
    contact_phone: str,
) -> Verification:
    """A company or a university: name, unified social credit code (GB 32100 check character),
    licence (PNG/JPEG/PDF, size-checked, stored privately) and a contact; an operator reviews it."""
    if kind not in ORGANISATION_KINDS:
        raise VerificationError(gettext_noop("Choose a company or a university."), field="kind")
    org = _required(
        organisation_name, "organisation_name", gettext_noop("Enter the organisation's name."), 200
    )
    code = checks.normalize(credit_code or "")
    if not checks.credit_code_valid(code):
        raise VerificationError(
            gettext_noop(
                "This is not a valid unified social credit code (check its last character)."
            ),
            field="credit_code",
        )
    contact = _required(contact_name, "contact_name", gettext_noop("Enter a contact person."), 100)
    phone = (contact_phone or "").strip()
    if not _PHONE.match(phone):
        raise VerificationError(
            gettext_noop("Enter the contact's phone number."), field="contact_phone"
        )
    if licence is None:
        raise VerificationError(gettext_noop("Upload the business licence."), field="licence")
    content_type = _licence_type(licence)
    _ensure_none_live(user)
    try:
        with transaction.atomic():
            row = Verification(
                owner=user,
                kind=kind,
                organisation_name=org,
                credit_code=code,
                licence_content_type=content_type,
                contact_name=contact,
                contact_phone=phone,
                provider="review",
            )
            extension = {"application/pdf": "pdf", "image/png": "png"}.get(content_type, "jpg")
            row.licence.save(f"{user.public_id}.{extension}", licence, save=False)
            row.save()
    except IntegrityError:
        _ensure_none_live(user)
        raise
    return row


# --- the operator's review -----------------------------------------------------------------------
def review_queue() -> list[Verification]:
    return list(
        Verification.objects.filter(state=VerificationState.PENDING)
        .select_related("owner")
        .order_by("created_at", "id")
    )


def get_for_review(public_id: Any) -> Verification:
    row = Verification.objects.filter(public_id=uuid_or_404(public_id)).first()
    if row is None:
        raise Http404
    return row


@transaction.atomic
def decide(public_id: Any, *, approve: bool, by: User | None, reason: str = "") -> Verification:
    """Approve or reject a pending submission (once: a second decision is refused)."""
    row = Verification.objects.select_for_update().filter(public_id=uuid_or_404(public_id)).first()
    if row is None:
        raise Http404
    if row.state != VerificationState.PENDING:
        raise VerificationError(
            gettext_noop("This verification was already decided."),
            code=ErrorCode.CONFLICT,
            http_status=409,
        )
    reason = (reason or "").strip()[:300]
    if not approve and not reason:
        raise VerificationError(gettext_noop("A rejection needs a reason."), field="reason")
    row.state = VerificationState.APPROVED if approve else VerificationState.REJECTED
    row.reason = reason
    row.reviewed_by = by if getattr(by, "pk", None) else None
    row.decided_at = timezone.now()
    row.save(update_fields=["state", "reason", "reviewed_by", "decided_at"])
    _notify_on_commit(row)
    return row


def licence_file(user: User, public_id: Any) -> Verification:
    """The record whose licence ``user`` may read: their own, or any for an operator."""
    row = get_for_review(public_id)
    if row.owner_id != user.pk and not user.is_staff:
        raise Http404
    if not row.licence:
        raise Http404
    return row


# --- the decision, notified ----------------------------------------------------------------------
def _notify_on_commit(row: Verification) -> None:
    """Tell the account of the decision (inbox, mail; console/notices/), once per decision."""
    if row.state == VerificationState.PENDING:
        return
    approved = row.state == VerificationState.APPROVED
    notices.notify(
        row.owner,
        "verification_approved" if approved else "verification_rejected",
        {"name": row.display_name, "reason": row.reason or "-"},
        key=f"verification:{row.public_id}:{row.state}",
        link=VERIFICATION_URL,
    )
