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

from django.db.models import QuerySet
from django.utils.dateparse import parse_date

from console.audit.models import AuditEntry
from console.tenancy import Acting, team_of, user_of

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
    "member.budget",
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
    "ops.node",
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
    start, end = parse_date(since or ""), parse_date(until or "")
    if start is not None:
        rows = rows.filter(at__date__gte=start)
    if end is not None:
        rows = rows.filter(at__date__lte=end)
    return rows.order_by("-at", "-id")


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
                e.actor_label,
                e.action,
                e.object_type,
                e.object_id,
                e.object_label,
                json.dumps(e.before, ensure_ascii=False, sort_keys=True),
                json.dumps(e.after, ensure_ascii=False, sort_keys=True),
                e.ip or "",
            )
        )
    return out.getvalue()
