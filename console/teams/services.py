"""Teams (issue 30): create, invite by email with a role, accept, leave, remove, change roles,
transfer ownership, close; per-member monthly budgets, card quotas and "stop on exhaustion".

Every change takes the team's row lock first (``_lock``), so two admins changing roles at once, or
the last two owners leaving at once, are decided one after the other: the team always keeps an
owner. Every change is in the audit log (console/audit/). Rules, enforced here for the page and the
API alike: nobody grants a role above their own (console/roles.py); the last owner cannot leave or
be demoted; a personal team takes no members.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext, gettext_noop, override

from console import hooks
from console.audit import services as audit
from console.choices import TeamRole
from console.errors import DomainError, ErrorCode
from console.ids import parse_uuid
from console.models import ApiToken, Membership, Team, User
from console.names import clean_name
from console.roles import RANK, Perm, may_grant
from console.teams.models import Invitation
from console.tenancy import Acting

INVITATION_DAYS = 7


class TeamRefused(DomainError):
    code = ErrorCode.INVALID
    http_status = 400


class NotAllowed(DomainError):
    code = ErrorCode.PERMISSION_DENIED
    http_status = 403


def _need(acting: Acting, perm: Perm) -> None:
    if not acting.can(perm):
        raise NotAllowed(gettext_noop("Your role in this team does not allow that."))


def _lock(team: Team) -> Team:
    return Team.objects.select_for_update().get(pk=team.pk)


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _clean_team_name(name: Any) -> str:
    cleaned = clean_name(str(name or ""), max_length=100)  # NameRefused says why not
    if not cleaned:
        raise TeamRefused(gettext_noop("Give the team a name."), field="name")
    return cleaned


def _clean_role(role: Any) -> str:
    if role not in TeamRole.values:
        raise TeamRefused(
            gettext_noop("Choose a role: %(roles)s."),
            field="role",
            roles=", ".join(TeamRole.values),
        )
    return str(role)


def teams_of(user: User) -> list[Membership]:
    """The user's memberships (personal team first), with their teams."""
    return list(
        Membership.objects.filter(user=user, team__closed_at__isnull=True)
        .select_related("team")
        .order_by("-team__personal_of_id", "team__name", "team_id")
    )


def get_team_for_user(user: User, public_id: Any) -> Acting:
    """Acting for ``user`` in the team ``public_id``, or 404 (a team they are not in does not
    exist for them)."""
    from console.tenancy import NotAMember, acting_in

    pid = parse_uuid(public_id)
    team = Team.objects.filter(public_id=pid, closed_at__isnull=True).first() if pid else None
    if team is None:
        raise Http404
    try:
        return acting_in(user, team)
    except NotAMember:
        raise Http404 from None


def members(team: Team) -> list[Membership]:
    return list(team.memberships.select_related("user").order_by("created_at", "id"))


def get_membership(acting: Acting, public_id_or_pk: Any) -> Membership:
    """A membership of the acting team by the member's public id (or its row id), else 404."""
    rows = Membership.objects.filter(team=acting.team).select_related("user")
    pid = parse_uuid(public_id_or_pk)
    row = rows.filter(user__public_id=pid).first() if pid else None
    if row is None and str(public_id_or_pk).isdigit():
        row = rows.filter(pk=int(public_id_or_pk)).first()
    if row is None:
        raise Http404
    return row


# --- the team ---------------------------------------------------------------------------------
@transaction.atomic
def create_team(user: User, name: Any, *, request: Any = None) -> Team:
    cleaned = _clean_team_name(name)
    limit = int(getattr(settings, "TEAMS_MAX_OWNED", 10))
    owned = Membership.objects.filter(
        user=user, role=TeamRole.OWNER, team__personal_of__isnull=True, team__closed_at__isnull=True
    ).count()
    if owned >= limit:
        raise TeamRefused(
            gettext_noop("You can own at most %(limit)s teams."),
            code=ErrorCode.CONFLICT,
            http_status=409,
            limit=limit,
        )
    team = Team.objects.create(name=cleaned)
    Membership.objects.create(team=team, user=user, role=TeamRole.OWNER)
    acting = Acting(team=team, user=user, role=TeamRole.OWNER)
    audit.record(acting, "team.create", team, after={"name": cleaned}, request=request)
    transaction.on_commit(lambda: hooks.team_created.send(sender=Team, team=team))
    return team


@transaction.atomic
def rename_team(acting: Acting, name: Any, *, request: Any = None) -> Team:
    _need(acting, Perm.MEMBERS)
    team = _lock(acting.team)
    cleaned = _clean_team_name(name)
    before = team.name
    Team.objects.filter(pk=team.pk).update(name=cleaned)
    audit.record(
        acting,
        "team.rename",
        team,
        before={"name": before},
        after={"name": cleaned},
        request=request,
    )
    team.name = cleaned
    return team


@transaction.atomic
def close_team(acting: Acting, *, request: Any = None) -> None:
    """The owner closes the team: only with nothing running or stored and no money left."""
    _need(acting, Perm.OWN)
    team = _lock(acting.team)
    if team.personal:
        raise TeamRefused(gettext_noop("A personal team cannot be closed."))
    blockers = hooks.team_close_blockers(team)
    if blockers:
        raise TeamRefused(
            gettext_noop("Release what the team still holds first: %(what)s."),
            code=ErrorCode.CONFLICT,
            http_status=409,
            what=", ".join(blockers),
        )
    Team.objects.filter(pk=team.pk).update(closed_at=timezone.now())
    audit.record(acting, "team.delete", team, request=request)
    gone = list(team.memberships.values_list("user_id", flat=True))
    team.memberships.all().delete()
    ApiToken.objects.filter(team=team, revoked_at__isnull=True).update(revoked_at=timezone.now())
    for user_id in gone:
        _left_on_commit(team, user_id)


# --- members ------------------------------------------------------------------------------------
def _owners(team: Team) -> int:
    return team.memberships.filter(role=TeamRole.OWNER).count()


def _left_on_commit(team: Team, user_id: int) -> None:
    """A member left: their tokens for the team end now; the apps answer ``member_left`` (the
    gateway's keys file is written again, their web-port grants end) after the commit."""
    now = timezone.now()
    ApiToken.objects.filter(team=team, owner_id=user_id, revoked_at__isnull=True).update(
        revoked_at=now
    )
    # What they sent out ends too: an invitation they made cannot bring them (or anyone) back.
    Invitation.objects.filter(
        team=team, invited_by_id=user_id, accepted_at__isnull=True, revoked_at__isnull=True
    ).update(revoked_at=now)
    transaction.on_commit(lambda: hooks.member_left.send(sender=Team, team=team, user_id=user_id))


@transaction.atomic
def leave(acting: Acting, *, request: Any = None) -> None:
    team = _lock(acting.team)
    if team.personal:
        raise TeamRefused(gettext_noop("You cannot leave your personal team."))
    if acting.role == TeamRole.OWNER and _owners(team) <= 1:
        raise TeamRefused(
            gettext_noop("You are the team's last owner: transfer ownership first."),
            code=ErrorCode.CONFLICT,
            http_status=409,
        )
    Membership.objects.filter(team=team, user=acting.user).delete()
    audit.record(acting, "member.leave", acting.user, label=acting.user.email, request=request)
    _left_on_commit(team, acting.user.pk)


@transaction.atomic
def remove(acting: Acting, membership: Membership, *, request: Any = None) -> None:
    _need(acting, Perm.MEMBERS)
    team = _lock(acting.team)
    row = Membership.objects.filter(pk=membership.pk, team=team).select_related("user").first()
    if row is None:
        raise Http404
    if row.user_id == acting.user.pk:
        return leave(acting, request=request)
    if RANK[row.role] > RANK[acting.role] or (
        row.role == TeamRole.OWNER and acting.role != TeamRole.OWNER
    ):
        raise NotAllowed(gettext_noop("You cannot remove a member whose role is above yours."))
    if row.role == TeamRole.OWNER and _owners(team) <= 1:
        raise TeamRefused(gettext_noop("The team's last owner cannot be removed."))
    row.delete()
    audit.record(
        acting,
        "member.remove",
        row.user,
        label=row.user.email,
        before={"role": row.role},
        request=request,
    )
    _left_on_commit(team, row.user_id)
    return None


@transaction.atomic
def set_role(
    acting: Acting, membership: Membership, role: Any, *, request: Any = None
) -> Membership:
    _need(acting, Perm.MEMBERS)
    role = _clean_role(role)
    team = _lock(acting.team)
    row = Membership.objects.select_for_update().filter(pk=membership.pk, team=team).first()
    if row is None:
        raise Http404
    if not may_grant(acting.role, role) or not may_grant(acting.role, row.role):
        raise NotAllowed(gettext_noop("Nobody grants or changes a role above their own."))
    if row.role == TeamRole.OWNER and role != TeamRole.OWNER and _owners(team) <= 1:
        raise TeamRefused(
            gettext_noop("The team's last owner cannot be demoted: transfer ownership first."),
            code=ErrorCode.CONFLICT,
            http_status=409,
        )
    before = row.role
    if before != role:
        Membership.objects.filter(pk=row.pk).update(role=role)
        audit.record(
            acting,
            "member.role",
            row.user,
            label=row.user.email,
            before={"role": before},
            after={"role": role},
            request=request,
        )
    row.role = role
    return row


@transaction.atomic
def transfer_ownership(acting: Acting, membership: Membership, *, request: Any = None) -> None:
    """The owner makes another member owner and becomes an admin."""
    _need(acting, Perm.OWN)
    team = _lock(acting.team)
    row = Membership.objects.filter(pk=membership.pk, team=team).select_related("user").first()
    if row is None or row.user_id == acting.user.pk:
        raise Http404
    Membership.objects.filter(pk=row.pk).update(role=TeamRole.OWNER)
    Membership.objects.filter(team=team, user=acting.user).update(role=TeamRole.ADMIN)
    audit.record(
        acting,
        "team.transfer",
        row.user,
        label=row.user.email,
        before={"owner": acting.user.email},
        after={"owner": row.user.email},
        request=request,
    )


def _money(value: Any, field: str) -> Decimal | None:
    if value in (None, ""):
        return None
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        amount = Decimal(-1)
    if (
        not amount.is_finite()
        or amount < 0
        or amount > Decimal("100000000")
        or (amount != amount.quantize(Decimal("0.01")))
    ):
        raise TeamRefused(
            gettext_noop("A budget is an amount in 元 of at least 0, to the fen."), field=field
        )
    return amount


def _cards(value: Any, field: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        n = int(str(value))
    except ValueError:
        n = -1
    if n < 0 or n > 100_000:
        raise TeamRefused(
            gettext_noop("A card quota is a whole number of cards, 0 or more."), field=field
        )
    return n


UNSET: Any = object()


@transaction.atomic
def set_limits(
    acting: Acting,
    membership: Membership,
    *,
    budget_monthly: Any = UNSET,
    gpu_quota: Any = UNSET,
    stop_on_budget: Any = UNSET,
    request: Any = None,
) -> Membership:
    """A member's monthly budget (元, empty: none), card quota (empty: none) and whether the
    settlement that crosses the budget stops their running instances. Set by owner, admin or
    billing; takes the team's lock, as every order and start does, so a change applies to the
    next order at once."""
    if not (acting.can(Perm.BILLING) or acting.can(Perm.MEMBERS)):
        raise NotAllowed(gettext_noop("Your role in this team does not allow that."))
    team = _lock(acting.team)
    row = Membership.objects.filter(pk=membership.pk, team=team).select_related("user").first()
    if row is None:
        raise Http404
    if row.role == TeamRole.OWNER and acting.role != TeamRole.OWNER:
        raise NotAllowed(gettext_noop("Only an owner sets an owner's budget and quota."))
    before = {
        "budget_monthly": row.budget_monthly,
        "gpu_quota": row.gpu_quota,
        "stop_on_budget": row.stop_on_budget,
    }
    if budget_monthly is not UNSET:
        row.budget_monthly = _money(budget_monthly, "budget_monthly")
    if gpu_quota is not UNSET:
        row.gpu_quota = _cards(gpu_quota, "gpu_quota")
    if stop_on_budget is not UNSET:
        row.stop_on_budget = stop_on_budget in (True, "true", "on", "1", 1)
    after = {
        "budget_monthly": row.budget_monthly,
        "gpu_quota": row.gpu_quota,
        "stop_on_budget": row.stop_on_budget,
    }
    if after != before:
        Membership.objects.filter(pk=row.pk).update(**after)
        audit.record(
            acting,
            "member.budget",
            row.user,
            label=row.user.email,
            before=before,
            after=after,
            request=request,
        )
    return row


# --- invitations --------------------------------------------------------------------------------
@transaction.atomic
def invite(acting: Acting, email: Any, role: Any, *, request: Any = None) -> tuple[Invitation, str]:
    """An invitation by email with a role (at most the inviter's own); the mail's link works once
    and expires after 7 days. Returns it with its raw token (in the mail; never stored)."""
    _need(acting, Perm.MEMBERS)
    role = _clean_role(role)
    team = _lock(acting.team)
    if team.personal:
        raise TeamRefused(gettext_noop("A personal team cannot take members: create a team first."))
    if not may_grant(acting.role, role):
        raise NotAllowed(gettext_noop("Nobody grants a role above their own."), field="role")
    address = User.objects.normalize_email(str(email or "")).strip().lower()
    from django.core.exceptions import ValidationError
    from django.core.validators import validate_email

    try:
        validate_email(address)
    except ValidationError:
        raise TeamRefused(gettext_noop("Enter a valid email address."), field="email") from None
    if team.memberships.filter(user__email__iexact=address).exists():
        raise TeamRefused(
            gettext_noop("%(email)s is already a member."),
            field="email",
            code=ErrorCode.CONFLICT,
            http_status=409,
            email=address,
        )
    pending = team.invitations.filter(
        accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now()
    )
    if pending.count() >= int(getattr(settings, "TEAMS_MAX_PENDING_INVITATIONS", 50)):
        raise TeamRefused(
            gettext_noop("Too many pending invitations: revoke some first."),
            code=ErrorCode.CONFLICT,
            http_status=409,
        )
    pending.filter(email__iexact=address).update(revoked_at=timezone.now())  # the newest counts
    raw = secrets.token_urlsafe(32)
    row = Invitation.objects.create(
        team=team,
        email=address,
        role=role,
        invited_by=acting.user,
        token_hash=_hash(raw),
        expires_at=timezone.now() + timedelta(days=INVITATION_DAYS),
    )
    audit.record(acting, "member.invite", row, label=address, after={"role": role}, request=request)
    _mail_invitation_on_commit(row, raw, acting.user)
    return row, raw


def invitation_url(raw: str) -> str:
    base = str(getattr(settings, "CONSOLE_BASE_URL", "") or "").rstrip("/")
    return f"{base}/teams/join/{raw}/"


def _mail_invitation_on_commit(row: Invitation, raw: str, inviter: User) -> None:
    team_name, email, role = row.team.name, row.email, row.role
    language = settings.LANGUAGE_CODE

    def send() -> None:
        with override(language):
            subject = gettext("%(who)s invites you to the team %(team)s") % {
                "who": inviter.email or inviter.get_username(),
                "team": team_name,
            }
            body = gettext(
                "You are invited to join %(team)s as %(role)s on the GPU console.\n\n"
                "Accept within 7 days: %(url)s\n"
            ) % {"team": team_name, "role": TeamRole(role).label, "url": invitation_url(raw)}
        send_mail(subject, body, None, [email], fail_silently=True)

    transaction.on_commit(send)


def find_invitation(raw: str) -> Invitation | None:
    """A live invitation by its raw token (not accepted, revoked or expired), else None."""
    if not raw or len(raw) > 100:
        return None
    return (
        Invitation.objects.filter(
            token_hash=_hash(raw),
            accepted_at__isnull=True,
            revoked_at__isnull=True,
            expires_at__gt=timezone.now(),
            team__closed_at__isnull=True,
        )
        .select_related("team", "invited_by")
        .first()
    )


@transaction.atomic
def accept(user: User, raw: str, *, request: Any = None) -> Membership:
    """The invited person joins with the role of the invitation. The link is for the address it
    was sent to: another account gets a clear refusal, and the invitation stays for its owner."""
    row = find_invitation(raw)
    if row is None:
        raise TeamRefused(
            gettext_noop("This invitation has expired, was revoked or was already used."),
            code=ErrorCode.NOT_FOUND,
            http_status=404,
        )
    team = _lock(row.team)
    row = Invitation.objects.select_for_update().get(pk=row.pk)
    if row.accepted_at is not None:
        raise TeamRefused(
            gettext_noop("This invitation was already used."),
            code=ErrorCode.CONFLICT,
            http_status=409,
        )
    if (user.email or "").lower() != row.email.lower():
        raise NotAllowed(
            gettext_noop("This invitation is for %(email)s: sign in with that account."),
            email=row.email,
        )
    membership, created = Membership.objects.get_or_create(
        team=team, user=user, defaults={"role": row.role}
    )
    Invitation.objects.filter(pk=row.pk).update(accepted_at=timezone.now(), accepted_by=user)
    if created:
        audit.record(
            Acting(team=team, user=user, role=membership.role),
            "member.join",
            user,
            label=user.email,
            after={"role": membership.role},
            request=request,
        )
    return membership


@transaction.atomic
def revoke_invitation(acting: Acting, public_id: Any, *, request: Any = None) -> bool:
    _need(acting, Perm.MEMBERS)
    pid = parse_uuid(public_id)
    row = acting.team.invitations.filter(public_id=pid).first() if pid else None
    if row is None:
        raise Http404
    won = Invitation.objects.filter(
        pk=row.pk, accepted_at__isnull=True, revoked_at__isnull=True
    ).update(revoked_at=timezone.now())
    if won:
        audit.record(acting, "member.invite_revoke", row, label=row.email, request=request)
    return bool(won)


def pending_invitations(team: Team) -> list[Invitation]:
    return list(
        team.invitations.filter(
            accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now()
        ).select_related("invited_by")
    )
