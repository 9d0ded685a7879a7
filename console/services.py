"""Accounts glue: SSH keys, API tokens, the trial credit on email verification.

Every write to ``SshKey`` and ``ApiToken`` goes through a function here; views, the API and the
admin call them. Fetchers (``get_*_for_user``) raise ``Http404`` for other people's objects.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import random
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext as _

from console import hooks
from console.api.compiled import CompiledQuery
from console.audit import services as audit
from console.choices import ApiTokenState
from console.ids import uuid_or_404
from console.models import ApiToken, SshKey, Team, TrialCreditClaim, User
from console.validators import parse_ssh_public_key, validate_display_name

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "gct"  # noqa: S105 - a label, not a secret
# Writing last_used_at on every request would turn each API read into a write; a minute is
# precise enough for "last used" and keeps hot tokens from hammering one row.
LAST_USED_RESOLUTION = timedelta(minutes=1)
# Every API request looks its token up: one indexed row with its owner, the SQL built once.
TOKEN_BY_PREFIX = CompiledQuery(
    lambda prefix: ApiToken.objects.select_related("owner").filter(prefix=prefix).order_by(),
    prefix=ApiToken._meta.get_field("prefix"),
)


# --- fetchers -----------------------------------------------------------------------------------
def get_ssh_key_for_user(user: User, public_id: Any) -> SshKey:
    """The caller's key, or 404 (also for keys that exist but belong to someone else)."""
    try:
        return SshKey.objects.for_owner(user).get(public_id=uuid_or_404(public_id))
    except SshKey.DoesNotExist:
        raise Http404 from None


def get_api_token_for_user(user: User, public_id: Any) -> ApiToken:
    try:
        return ApiToken.objects.for_owner(user).get(public_id=uuid_or_404(public_id))
    except ApiToken.DoesNotExist:
        raise Http404 from None


def ssh_keys_of(user: User) -> QuerySet[SshKey]:
    """A person's SSH keys (keys are a person's, whichever team they act in)."""
    return SshKey.objects.for_owner(user)


def get_default_ssh_key(user: User) -> SshKey | None:
    """The key pre-selected when ordering an instance (None when the user has no key)."""
    return SshKey.objects.for_owner(user).defaults().first()


def _check_name(name: str | None) -> str:
    """The chosen name as stored (console/names.py's rules: NFC, trimmed, no control or invisible
    characters, 100 characters), or a ``ValidationError`` keyed by the field."""
    try:
        return validate_display_name(name)
    except ValidationError as exc:
        raise ValidationError({"name": exc}) from None


# --- SSH keys -----------------------------------------------------------------------------------
@transaction.atomic
def add_ssh_key(
    user: User, *, name: str, public_key: str, make_default: bool = False, request: Any = None
) -> SshKey:
    """Validate and store a pasted public key; the first key becomes the default.

    Raises ``ValidationError`` (keyed by field) for a malformed, weak or duplicate key.
    """
    try:
        parsed = parse_ssh_public_key(public_key)
    except ValidationError as exc:
        raise ValidationError({"public_key": exc}) from None
    name = _check_name(name) or parsed.comment[:100] or parsed.fingerprint[7:19]
    # Lock the owner's row: concurrent adds of the same key or of a first key queue up here,
    # so the duplicate check and "first key is default" see each other's result.
    User.objects.select_for_update().filter(pk=user.pk).first()
    mine = SshKey.objects.for_owner(user)
    duplicate = mine.filter(fingerprint=parsed.fingerprint).first()
    if duplicate is not None:
        raise ValidationError(
            {
                "public_key": ValidationError(
                    _("You have already added this key (as “%(name)s”)."),
                    code="duplicate",
                    params={"name": duplicate.name},
                )
            }
        )
    if SshKey.objects.filter(fingerprint=parsed.fingerprint).exclude(owner=user).exists():
        # One key, one account (GitHub's "key is already in use"): the region gateways let a key
        # through to its owner's instances, and a key of two accounts would open both's. The
        # fingerprint is of the canonical encoding, so a re-encoded key is the same key.
        raise _key_in_use()
    if mine.filter(name=name).exists():
        raise ValidationError(
            {"name": ValidationError(_("You already have a key with this name."), code="duplicate")}
        )
    if mine.count() >= settings.SSH_KEY_MAX_PER_USER:
        raise ValidationError(
            _("You can store at most %(limit)s SSH keys; delete one first."),
            code="limit",
            params={"limit": settings.SSH_KEY_MAX_PER_USER},
        )
    is_default = make_default or not mine.exists()
    if is_default:
        mine.filter(is_default=True).update(is_default=False)
    try:
        with transaction.atomic():
            key = SshKey.objects.create(
                owner=user,
                name=name,
                key_type=parsed.key_type,
                public_key=parsed.openssh,
                fingerprint=parsed.fingerprint,
                comment=parsed.comment,
                bits=parsed.bits,
                is_default=is_default,
            )
    except IntegrityError:
        # Another account added the same key meanwhile (the owner's row lock does not cover
        # other accounts; the unique fingerprint does), or a database without row locks.
        if not mine.filter(fingerprint=parsed.fingerprint).exists():
            raise _key_in_use() from None
        raise ValidationError(
            {"public_key": ValidationError(_("You have already added this key."), code="duplicate")}
        ) from None
    audit.record_in_every_team(
        user, "sshkey.add", key, after={"fingerprint": key.fingerprint}, request=request
    )
    return key


def _key_in_use() -> ValidationError:
    return ValidationError(
        {
            "public_key": ValidationError(
                _("This key is already in use by another account. Add a key of your own."),
                code="in_use",
            )
        }
    )


def registered_ssh_keys(pairs: set[tuple[int, str]]) -> set[tuple[int, str]]:
    """Which of ``(owner id, fingerprint)`` are keys still on those accounts (one query)."""
    if not pairs:
        return set()
    found = SshKey.objects.filter(
        owner_id__in={o for o, _f in pairs}, fingerprint__in={f for _o, f in pairs}
    ).values_list("owner_id", "fingerprint")
    return set(found) & pairs


@transaction.atomic
def set_default_ssh_key(user: User, key: SshKey) -> SshKey:
    """Make ``key`` the one pre-selected for new instances (exactly one default per user)."""
    User.objects.select_for_update().filter(pk=user.pk).first()
    SshKey.objects.for_owner(user).filter(is_default=True).exclude(pk=key.pk).update(
        is_default=False
    )
    SshKey.objects.for_owner(user).filter(pk=key.pk).update(is_default=True)
    key.is_default = True
    return key


@transaction.atomic
def delete_ssh_key(user: User, key: SshKey, *, request: Any = None) -> bool:
    """Delete a key; if it was the default, the newest remaining key becomes the default.

    The region gateways stop letting it through at their next sync (one is queued on commit
    through ``hooks.ssh_key_removed``; the gateway lets through only keys still on the account).
    Returns False if another request deleted it first.
    """
    User.objects.select_for_update().filter(pk=user.pk).first()
    deleted, _rows = SshKey.objects.for_owner(user).filter(pk=key.pk).delete()
    if deleted:
        audit.record_in_every_team(
            user, "sshkey.delete", key, before={"fingerprint": key.fingerprint}, request=request
        )
        # robust: a broker away at that moment costs only the early sync (beat's pass follows).
        transaction.on_commit(
            lambda: hooks.ssh_key_removed.send(sender=User, user=user), robust=True
        )
    # Checked after the delete, under the lock: ``key`` may be stale about being the default.
    if deleted and not SshKey.objects.for_owner(user).defaults().exists():
        successor = SshKey.objects.for_owner(user).order_by("-created_at", "-id").first()
        if successor is not None:
            SshKey.objects.filter(pk=successor.pk).update(is_default=True)
    return bool(deleted)


# --- API tokens ---------------------------------------------------------------------------------
def _hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


@transaction.atomic
def create_api_token(
    user: User,
    *,
    name: str,
    expires_at: datetime | None = None,
    team: Team | None = None,
    request: Any = None,
) -> tuple[ApiToken, str]:
    """Create a token and return it with its secret, which is never retrievable again. It acts
    in ``team`` (default: the user's personal team), of which the user must be a member."""
    from console.tenancy import NotAMember, acting_in

    try:
        team = acting_in(user, team).team
    except NotAMember:
        raise ValidationError(
            {"team": ValidationError(_("You are not a member of that team."), "not_member")}
        ) from None
    name = _check_name(name)
    if not name:
        raise ValidationError({"name": ValidationError(_("Give the token a name."), "required")})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError(
            {"expires_at": ValidationError(_("The expiry must be in the future."), "past")}
        )
    User.objects.select_for_update().filter(pk=user.pk).first()
    if ApiToken.objects.for_owner(user).active().count() >= settings.API_TOKEN_MAX_PER_USER:
        raise ValidationError(
            _("You can have at most %(limit)s active tokens; revoke one first."),
            code="limit",
            params={"limit": settings.API_TOKEN_MAX_PER_USER},
        )
    prefix = secrets.token_hex(6)
    raw = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        owner=user,
        team=team,
        name=name[:100],
        prefix=prefix,
        secret_hash=_hash_token(raw),
        expires_at=expires_at,
    )
    audit.record(user, "token.create", token, team=team, after={"prefix": prefix}, request=request)
    return token, raw


@transaction.atomic
def revoke_api_token(user: User, token: ApiToken, *, request: Any = None) -> bool:
    """Revoke a token at once. Compare-and-set: True only for the call that revoked it."""
    now = timezone.now()
    won = (
        ApiToken.objects.for_owner(user)
        .filter(pk=token.pk, revoked_at__isnull=True)
        .update(revoked_at=now)
        == 1
    )
    if won:
        token.revoked_at = now
        audit.record(user, "token.revoke", token, before={"prefix": token.prefix}, request=request)
    return won


@dataclass(frozen=True)
class TokenCheck:
    token: ApiToken | None
    failure: str | None  # "invalid", "expired", "revoked", "inactive_user"


def _last_used_resolution() -> timedelta:
    """A minute, up to a half more at random: tokens first used together (a fleet of scripts
    started at once) do not all write their stamp in the same second of every minute."""
    return LAST_USED_RESOLUTION + timedelta(seconds=random.uniform(0, 30))


def check_api_token(raw: str) -> TokenCheck:
    """Look a presented token up by its prefix and compare hashes in constant time.

    Also records the last use (at most once a minute).
    """
    parts = raw.split("_", 2)  # the secret itself may contain "_"
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1] or len(raw) > 200:
        return TokenCheck(None, "invalid")
    token = TOKEN_BY_PREFIX.first(prefix=parts[1])  # prefix is unique: one row at most
    if token is None or not hmac.compare_digest(token.secret_hash, _hash_token(raw)):
        return TokenCheck(None, "invalid")
    now = timezone.now()
    state = token.state(now)
    if state == ApiTokenState.REVOKED:
        return TokenCheck(None, "revoked")
    if state == ApiTokenState.EXPIRED:
        return TokenCheck(None, "expired")
    if not token.owner.is_active:
        return TokenCheck(None, "inactive_user")
    if token.last_used_at is None or token.last_used_at < now - _last_used_resolution():
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return TokenCheck(token, None)


# --- sign-up ------------------------------------------------------------------------------------
@transaction.atomic
def mark_email_verified(user: User) -> None:
    """Record ``user.email`` as verified and primary without a mail round-trip.

    For accounts that operators or ``demo_setup`` create: allauth's login requires a verified
    address. Grants nothing by itself (the trial credit follows real verification only).
    """
    from allauth.account.models import EmailAddress

    address = EmailAddress.objects.filter(user=user, email__iexact=user.email).first()
    if address is None:
        address = EmailAddress(user=user, email=user.email)
    EmailAddress.objects.filter(user=user, primary=True).exclude(pk=address.pk).update(
        primary=False
    )
    address.verified = True
    address.primary = True
    address.save()


_DOTLESS_DOMAINS = {"gmail.com": "gmail.com", "googlemail.com": "gmail.com"}


def canonical_mailbox(email: str) -> str:
    """The mailbox behind an address: ``A.Lice+gpu@GoogleMail.com`` -> ``alice@gmail.com``."""
    local, _at, domain = email.strip().lower().rpartition("@")
    local = local.split("+", 1)[0]
    if domain in _DOTLESS_DOMAINS:
        domain = _DOTLESS_DOMAINS[domain]
        local = local.replace(".", "")
    return f"{local}@{domain}"


def grant_trial_credit_after_verification(user_id: int, email: str | None = None) -> bool:
    """Give a newly verified account its one-time 10 元 trial credit (体验金).

    Called after the email verification has committed. Once per account (the billing service is
    idempotent per wallet, so a second verification, a second address or two confirmations racing
    each other grant nothing more) and once per mailbox ever (``TrialCreditClaim``: a new account
    on ``alice+2@…`` or on the address of a deleted account gets none). Returns whether this call
    granted it.
    """
    user = User.objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return False
    mailbox = canonical_mailbox(email or user.email)
    # get_or_create copes with a concurrent creator (unique mailbox): the loser reads its row.
    claim, _created = TrialCreditClaim.objects.get_or_create(
        mailbox=mailbox, defaults={"user": user}
    )
    if claim.user_id != user.pk:
        logger.info("no trial credit for user %s: mailbox already claimed", user.public_id)
        return False
    # Billing grants it (its receiver, connected in BillingConfig.ready): accounts never import
    # billing, the money is decided there.
    granted = any(bool(r) for _f, r in hooks.trial_credit_due.send(sender=User, user=user))
    if granted:
        logger.info("trial credit granted to user %s", user.public_id)
    return granted


def on_email_verified(user_id: int, email: str | None = None) -> None:
    """Schedule the trial credit once the verification's transaction commits."""
    transaction.on_commit(lambda: grant_trial_credit_after_verification(user_id, email))
