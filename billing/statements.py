"""Read-side of billing: the monthly statement and the rows of the billing page and CSV exports.

A statement reconciles line by line: opening balance + every transaction's effect on the customer's
buckets = closing balance, and the usage section lists each session's seconds, cards, rate and the
amount settled in the month (the sum of its ``UsageCharge`` rows).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from django.db.models import QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from billing.choices import RESOURCE_KIND_LABELS, AccountKind, Meter
from billing.models import Entry, LedgerTransaction, UsageCharge, UsageSession, Wallet
from billing.money import ZERO, round_cents

if TYPE_CHECKING:
    from console.models import User


def month_bounds(month: str | None, now: datetime) -> tuple[date, datetime, datetime]:
    """``"2026-03"`` → (first day, start, end) in the page's time zone (the one its times are
    shown in: the console's, Asia/Shanghai by default); default this month."""
    tz = timezone.get_current_timezone()
    local = now.astimezone(tz)
    if month:
        year, mon = (int(x) for x in month.split("-"))
    else:
        year, mon = local.year, local.month
    start = datetime(year, mon, 1, tzinfo=tz)
    end = datetime(year + (mon == 12), mon % 12 + 1, 1, tzinfo=tz)
    return start.date(), start, end


def local_iso(at: datetime | None) -> str:
    """A CSV timestamp in the reader's time zone with its offset (``2026-03-01T10:00:00+08:00``),
    the same wall-clock time the pages show; empty for no time."""
    if at is None:
        return ""
    return timezone.localtime(at).isoformat()


@dataclass(frozen=True)
class UsageShape:
    """How a usage row reads: GPU time in cards at 元 per card-hour, storage in GB at 元 per
    GB·day (a disk session's ``cards`` are the GB billed beyond the free quota)."""

    kind: str  # the resource kind, translated
    model: str  # the GPU model, or "disk storage"
    quantity: str  # "8 cards", "500 GB billed"
    rate_unit: str  # what the rate is per: "card-hour", "GB·day"


def usage_shape(session: UsageSession) -> UsageShape:
    label = RESOURCE_KIND_LABELS.get(session.resource_kind)
    kind = str(label) if label is not None else session.resource_kind
    if session.meter == Meter.DISK:
        quantity = _("%(gb)d GB billed") % {"gb": session.cards}
        return UsageShape(kind, _("Disk storage"), quantity, _("GB·day"))
    cards = ngettext("%(n)d card", "%(n)d cards", session.cards) % {"n": session.cards}
    return UsageShape(kind, session.gpu_model or "—", cards, _("card-hour"))


def with_usage_shapes(sessions: list[UsageSession]) -> list[UsageSession]:
    """Attach ``shape`` to a page of usage sessions (no queries)."""
    for session in sessions:
        session.shape = usage_shape(session)  # type: ignore[attr-defined]
    return sessions


# The customer's buckets in the order a statement shows what paid (as the CSV's columns).
BUCKETS = (AccountKind.CASH, AccountKind.TRIAL, AccountKind.VOUCHER)


@dataclass
class StatementLine:
    txn: LedgerTransaction
    amount: Decimal  # effect on the customer's buckets (+ in, - out)
    by_kind: dict[str, Decimal]
    balance_after: Decimal = ZERO

    @property
    def buckets(self) -> list[Decimal | None]:
        """What each bucket (cash, trial credit, vouchers) gave or got; None where it had no part."""
        return [self.by_kind.get(kind.value) for kind in BUCKETS]


@dataclass
class UsageLine:
    session: UsageSession
    seconds: int
    amount: Decimal

    @property
    def shape(self) -> UsageShape:
        return usage_shape(self.session)


@dataclass
class Statement:
    month: date
    opening: Decimal = ZERO
    closing: Decimal = ZERO
    lines: list[StatementLine] = field(default_factory=list)
    usage: list[UsageLine] = field(default_factory=list)
    totals: dict[str, Decimal] = field(default_factory=dict)

    @property
    def usage_total(self) -> Decimal:
        return sum((u.amount for u in self.usage), ZERO)


def build_statement(wallet: Wallet | None, month: str | None, now: datetime) -> Statement:
    first, start, end = month_bounds(month, now)
    statement = Statement(month=first)
    if wallet is None:
        return statement
    # Sums in Python: SQLite's SUM() is floating point; a month of one wallet is small.
    opening = ZERO
    for amount in Entry.objects.filter(
        account__wallet=wallet, transaction__created_at__lt=start
    ).values_list("amount", flat=True):
        opening += amount
    statement.opening = opening
    entries = (
        Entry.objects.filter(
            account__wallet=wallet,
            transaction__created_at__gte=start,
            transaction__created_at__lt=end,
        )
        .select_related("transaction", "account")
        .order_by("transaction__created_at", "transaction_id", "id")
    )
    lines: dict[int, StatementLine] = {}
    totals: dict[str, Decimal] = defaultdict(lambda: ZERO)
    for entry in entries:
        line = lines.get(entry.transaction_id)
        if line is None:
            line = lines[entry.transaction_id] = StatementLine(entry.transaction, ZERO, {})
        line.amount += entry.amount
        line.by_kind[entry.account.kind] = line.by_kind.get(entry.account.kind, ZERO) + entry.amount
        totals[entry.transaction.kind] += entry.amount
    running = opening
    for line in lines.values():
        running += line.amount
        line.balance_after = running
    statement.lines = list(lines.values())
    statement.closing = running
    statement.totals = dict(totals)
    usage: dict[int, UsageLine] = {}
    charges = (
        UsageCharge.objects.filter(
            session__wallet=wallet,
            transaction__created_at__gte=start,
            transaction__created_at__lt=end,
        )
        .select_related("session")
        .order_by("session_id", "from_second")
    )
    for charge in charges:
        session_line = usage.get(charge.session_id)
        if session_line is None:
            session_line = usage[charge.session_id] = UsageLine(charge.session, 0, ZERO)
        session_line.seconds += charge.to_second - charge.from_second
        session_line.amount += charge.amount
    statement.usage = list(usage.values())
    return statement


def transactions_for(user: User) -> QuerySet[LedgerTransaction]:
    return LedgerTransaction.objects.for_team(user).order_by("-created_at", "-id")


def with_net_amounts(
    txns: list[LedgerTransaction], wallet_id: int | None
) -> list[LedgerTransaction]:
    """Attach ``net`` (effect on the customer's buckets) to a page of transactions: one query."""
    nets: dict[int, Decimal] = defaultdict(lambda: ZERO)
    entries = Entry.objects.filter(transaction__in=[t.pk for t in txns])
    # No wallet, no transactions of its own (and no filter on NULL, which means system accounts).
    if wallet_id is not None:
        for txn_id, amount in entries.filter(account__wallet_id=wallet_id).values_list(
            "transaction_id", "amount"
        ):
            nets[txn_id] += amount
    for txn in txns:
        txn.net = round_cents(nets[txn.pk])  # type: ignore[attr-defined]
    return txns
