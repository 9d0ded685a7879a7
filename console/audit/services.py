"""Write and read the audit log (issue 30).

``record(who, action, obj, before=…, after=…, request=…)`` appends one entry in the caller's
transaction (an action rolled back leaves no entry; one that commits always has its entry).
``who`` is an ``Acting``, a user (their personal team), or None with ``team=`` for the system.
Actions are dotted words (``instance.order``, ``wallet.topup``, ``member.role``…); the money-moving
ones are listed in ``MONEY_ACTIONS`` and a test walks every one of them.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404
from django.utils.dateparse import parse_date
from django.utils.translation import gettext_lazy as _

from console.audit.models import AuditEntry
from console.models import Membership, Team
from console.roles import Perm
from console.tenancy import Acting, NotAMember, acting_in, team_of, user_of

# What moves money or GPUs: each appears in the log whenever it happens (a test walks them all).
MONEY_ACTIONS = (
    "instance.order",
    "instance.start",
    "instance.stop",
    "instance.release",
    "disk.create",
    "disk.resize",
    "disk.delete",
    "app.launch",
    "demo.run",
    "wallet.topup",
    "wallet.topup_confirmed",
    "wallet.voucher",
    "wallet.refund",
    "wallet.trial",
    "wallet.reversal",
    "member.budget",
    "reservation.book",
    "reservation.cancel",
)

ACTIONS = (
    *MONEY_ACTIONS,
    "team.create",
    "team.rename",
    "team.transfer",
    "team.delete",
    "member.invite",
    "member.invite_revoke",
    "member.join",
    "member.leave",
    "member.remove",
    "member.role",
    "sshkey.add",
    "sshkey.delete",
    "token.create",
    "token.revoke",
    "invoice.request",
    "invoice.issue",
    "invoice.reject",
    "invoice.reverse",
    "ops.node",
)

# What the page shows for each action (the code stays in the CSV and the API).
ACTION_LABELS: dict[str, Any] = {
    "instance.order": _("Ordered an instance"),
    "reservation.book": _("Booked a window"),
    "reservation.cancel": _("Cancelled a booked window"),
    "instance.start": _("Started an instance"),
    "instance.stop": _("Stopped an instance"),
    "instance.release": _("Released an instance"),
    "disk.create": _("Created a disk"),
    "disk.resize": _("Resized a disk"),
    "disk.delete": _("Deleted a disk"),
    "app.launch": _("Launched an AI app"),
    "demo.run": _("Ran the demo"),
    "wallet.topup": _("Started a top-up"),
    "wallet.topup_confirmed": _("Top-up paid"),
    "wallet.voucher": _("Voucher granted"),
    "wallet.refund": _("Refund paid"),
    "wallet.trial": _("Trial credit granted"),
    "wallet.reversal": _("Ledger correction (reversal)"),
    "member.budget": _("Changed a member's budget or quota"),
    "team.create": _("Created the team"),
    "team.rename": _("Renamed the team"),
    "team.transfer": _("Transferred ownership"),
    "team.delete": _("Closed the team"),
    "member.invite": _("Invited a member"),
    "member.invite_revoke": _("Revoked an invitation"),
    "member.join": _("Joined the team"),
    "member.leave": _("Left the team"),
    "member.remove": _("Removed a member"),
    "member.role": _("Changed a member's role"),
    "sshkey.add": _("Added an SSH key"),
    "sshkey.delete": _("Deleted an SSH key"),
    "token.create": _("Created an API token"),
    "token.revoke": _("Revoked an API token"),
    "invoice.request": _("Requested an invoice"),
    "invoice.issue": _("Invoice issued"),
    "invoice.reject": _("Invoice request rejected"),
    "invoice.reverse": _("Invoice reversed (red-letter)"),
    "ops.node": _("Operator action on a node"),
}

# The page's action filter: a group (a prefix) or one action.
ACTION_GROUPS: tuple[tuple[str, Any], ...] = (
    ("instance.", _("Instances")),
    ("disk.", _("Disks")),
    ("app.", _("AI apps")),
    ("demo.", _("Demo")),
    ("wallet.", _("Wallet")),
    ("invoice.", _("Invoices")),
    ("member.", _("Members")),
    ("team.", _("Team")),
    ("sshkey.", _("SSH keys")),
    ("token.", _("API tokens")),
    ("ops.", _("Operator actions")),
)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def client_ip(request: Any) -> str | None:
    if request is None:
        return None
    meta = getattr(request, "META", None) or {}
    return meta.get("REMOTE_ADDR") or None


def _request_team(request: Any, who: Any) -> Any:
    """The team the request acts in, when ``who`` is its signed-in user (a key added while the
    header's switcher shows a team is that team's entry); None otherwise."""
    acting = getattr(request, "_acting", None) if request is not None else None
    if isinstance(acting, Acting) and who is not None and acting.user.pk == getattr(who, "pk", 0):
        return acting.team
    return None


def record(
    who: Any,
    action: str,
    obj: Any = None,
    *,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    request: Any = None,
    team: Any = None,
    operator: bool = False,
    label: str = "",
) -> AuditEntry:
    """Append one entry in the caller's transaction. The team: ``team=``, else the Acting's, else
    the object's, else the request's (its signed-in user acting in a team), else ``who``'s
    personal team. ``who=None`` is the system (background work: a sweep, a webhook)."""
    if team is None:
        if isinstance(who, Acting):
            team = who.team
        elif obj is not None and getattr(obj, "team_id", None) is not None:
            team = obj.team
        elif _request_team(request, who) is not None:
            team = _request_team(request, who)
        elif who is not None:
            team = team_of(who)
    actor = user_of(who) if who is not None else None
    return AuditEntry.objects.create(
        team=team,
        actor=actor,
        actor_label=(actor.email or actor.get_username()) if actor is not None else "system",
        operator=operator,
        action=action,
        object_type=obj._meta.model_name if obj is not None and hasattr(obj, "_meta") else "",
        object_id=str(getattr(obj, "public_id", getattr(obj, "pk", "")) or "") if obj else "",
        object_label=(label or (str(getattr(obj, "name", "") or obj) if obj is not None else ""))[
            :200
        ],
        before=_plain(before or {}),
        after=_plain(after or {}),
        ip=client_ip(request),
    )


def record_in_every_team(user: Any, action: str, obj: Any = None, **kwargs: Any) -> int:
    """One entry in each team ``user`` is a member of: an account's SSH key opens the instances it
    may reach in every one of them, so each team's log shows it. Returns how many."""
    teams = Team.objects.filter(
        pk__in=Membership.objects.filter(user=user).values("team_id"), closed_at__isnull=True
    )
    written = 0
    for team in teams:
        record(user, action, obj, team=team, **kwargs)
        written += 1
    return written


def entries_for(
    team: Any,
    *,
    action: str = "",
    actor: str = "",
    since: str = "",
    until: str = "",
) -> QuerySet[AuditEntry]:
    """The team's entries, newest first, filtered by action (prefix), actor (email or name part)
    and date range (YYYY-MM-DD, inclusive)."""
    rows = AuditEntry.objects.filter(team=team).select_related("actor")
    if action:
        rows = rows.filter(action__startswith=action)
    if actor:
        rows = rows.filter(actor_label__icontains=actor)
    start, end = _day(since), _day(until)
    if start is not None:
        rows = rows.filter(at__date__gte=start)
    if end is not None:
        rows = rows.filter(at__date__lte=end)
    return rows.order_by("-at", "-id")


def _day(value: str) -> Any:
    """A YYYY-MM-DD day, or None (also for a well-formed impossible day: 2026-02-30)."""
    try:
        return parse_date(str(value or "")[:10])
    except ValueError:
        return None


def team_for_audit(user: Any, public_id: Any, *, token_team_id: int | None = None) -> Acting:
    """Acting for ``user`` in the team ``public_id`` when their role may read its log: 404 for a
    team they are not in (or one their API token was not made for), 403 for a member whose role
    may not (console/roles.py: owner, admin, billing)."""
    team = Team.objects.filter(public_id=public_id, closed_at__isnull=True).first()
    if team is None or (token_team_id is not None and token_team_id != team.pk):
        raise Http404
    try:
        acting = acting_in(user, team)
    except NotAMember:
        raise Http404 from None
    if not acting.can(Perm.AUDIT):
        raise PermissionDenied
    return acting


def changes(entry: AuditEntry) -> list[tuple[str, Any, Any]]:
    """(field, before, after) for every field either side names, in a stable order."""
    before, after = entry.before or {}, entry.after or {}
    keys = [*before, *(k for k in after if k not in before)]
    return [(k, before.get(k), after.get(k)) for k in keys]


def _cell(value: str) -> str:
    """Neutralise spreadsheet formulas in customer text (a disk named ``=cmd``: CSV injection)."""
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


CSV_HEADER = (
    "time",
    "actor",
    "action",
    "object_type",
    "object_id",
    "object",
    "before",
    "after",
    "ip",
)


def as_csv(rows: Iterable[AuditEntry]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_HEADER)
    for e in rows:
        writer.writerow(
            (
                e.at.isoformat(),
                _cell(e.actor_label),
                e.action,
                e.object_type,
                e.object_id,
                _cell(e.object_label),
                json.dumps(e.before, ensure_ascii=False, sort_keys=True),
                json.dumps(e.after, ensure_ascii=False, sort_keys=True),
                e.ip or "",
            )
        )
    return out.getvalue()
