"""Per-member monthly budgets (issue 30): what a member of a team has spent this month.

A member's spending is the sum of their lines in the team's monthly bill (billing/bills/lines.py):
the settled charges of the usage sessions they caused, the long-term rentals they paid, less the
corrections of either posted in the month. The month is the calendar month in the project's time
zone (Asia/Shanghai). Read by the order checks (``services.ensure_member_within_budget``) and the
settlement's stop on exhaustion (billing/settlement.py).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, cast
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import Sum

from billing import clock
from billing.models import TermRental, UsageCharge
from billing.money import ZERO, round_cents, to_decimal


def budget_month(at: datetime | None = None) -> tuple[datetime, datetime]:
    """The calendar month of ``at`` (default now) in the project's time zone: what a monthly
    budget counts, whatever time zone a page shows."""
    tz = ZoneInfo(settings.TIME_ZONE)
    local = (at or clock.now()).astimezone(tz)
    start = datetime(local.year, local.month, 1, tzinfo=tz)
    end = datetime(local.year + (local.month == 12), local.month % 12 + 1, 1, tzinfo=tz)
    return start, end


def month_spend(team_id: int, member_id: int | None, at: datetime | None = None) -> Decimal:
    """What ``member_id``'s lines of team ``team_id``'s bill cost in ``at``'s month (four
    aggregate queries)."""
    start, end = budget_month(at)
    charges = UsageCharge.objects.filter(
        session__wallet__team_id=team_id, session__member_id=member_id
    )
    terms = TermRental.objects.filter(wallet__team_id=team_id, member_id=member_id)
    posted = {"transaction__created_at__gte": start, "transaction__created_at__lt": end}
    undone = {
        "transaction__reversed_by__created_at__gte": start,
        "transaction__reversed_by__created_at__lt": end,
    }

    def total(rows: Any, column: str, when: dict[str, datetime]) -> Decimal:
        return cast(Decimal, rows.filter(**when).aggregate(n=Sum(column))["n"] or ZERO)

    spent = (
        total(charges, "amount", posted)
        + total(terms, "total", posted)
        - total(charges, "amount", undone)
        - total(terms, "total", undone)
    )
    return round_cents(to_decimal(spent))
