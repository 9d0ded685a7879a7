"""The charge lines of a month, read from the ledger (one query per table, no per-line query).

A line is one ``UsageCharge`` (a settlement period of one session), one long-term rental paid up
front, or a correction that gave a charge back (negative). What paid for each line: a ledger
transaction's customer legs (vouchers, trial credit, cash) are handed to its lines in order,
vouchers first, trial next, cash last — the spending order — so per transaction the lines' parts
sum to its legs exactly, and the month's lines sum to the ledger to the cent.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.db.models import Q
from django.utils.translation import gettext as _

from billing import clock
from billing.choices import RESOURCE_KIND_LABELS, AccountKind, Meter, TransactionKind
from billing.models import Entry, LedgerTransaction, TermRental, UsageCharge, Wallet
from billing.money import ZERO
from billing.statements import month_bounds
from console.tenancy import team_of

if TYPE_CHECKING:
    from console.models import User

SPEND_KINDS = (TransactionKind.USAGE, TransactionKind.TERM_PURCHASE)
_HOURS = Decimal(3600)
_DAYS = Decimal(86400)


@dataclass
class BillLine:
    bill_no: str  # 账单号
    period: str  # 账期 YYYY-MM
    charged_at: datetime
    product: str  # 产品 (the resource kind's code)
    resource_id: str  # 资源 ID
    label: str
    item: str  # 计费项: gpu / disk / term
    mode: str  # 计费方式: on_demand / term / correction
    gpu_model: str
    quantity: Decimal  # 用量: card-hours, GB-days or card-days
    unit_price: Decimal  # 单价
    amount: Decimal  # 原价
    voucher: Decimal = ZERO  # 代金券抵扣
    trial: Decimal = ZERO  # 体验金抵扣
    cash: Decimal = ZERO  # 现金金额
    member: str = ""  # who in the team caused it (issue 30); "" = the team's shared storage
    transaction_id: int = 0
    region: str = ""  # 地域: the region's code ("" for account-wide storage)

    @property
    def region_display(self) -> str:
        return region_label(self.region)

    @property
    def product_display(self) -> str:
        return product_label(self.product)

    @property
    def item_display(self) -> str:
        return item_label(self.item)

    @property
    def mode_display(self) -> str:
        return mode_label(self.mode)


def product_label(code: str) -> str:
    label = RESOURCE_KIND_LABELS.get(code)
    return str(label) if label is not None else code


# The shipped regions' names (billing reads no fleet table); another region shows its code.
REGION_LABELS = {"xiamen": _("Xiamen"), "yinchuan": _("Yinchuan"), "ulanqab": _("Ulanqab")}


def region_label(code: str) -> str:
    label = REGION_LABELS.get(code)
    return str(label) if label is not None else (code or "—")


def item_label(item: str) -> str:
    return {
        "gpu": _("GPU card-hours"),
        "disk": _("Disk GB-days"),
        "term": _("GPU card-days (prepaid)"),
    }.get(item, item)


def mode_label(mode: str) -> str:
    return {
        "on_demand": _("On demand"),
        "term": _("Long-term rental"),
        "correction": _("Correction"),
    }.get(mode, mode)


def _split(lines: list[BillLine], paid: dict[str, Decimal]) -> None:
    """Hand a transaction's vouchers, trial and cash to its lines in spending order."""
    left = {k: paid.get(k, ZERO) for k in ("voucher", "trial")}
    for line in lines:
        rest = line.amount
        for kind in ("voucher", "trial"):
            take = min(rest, left[kind]) if rest > 0 else ZERO
            setattr(line, kind, take)
            left[kind] -= take
            rest -= take
        line.cash = rest


def _split_back(lines: list[BillLine], paid: dict[str, Decimal]) -> None:
    """A correction's lines (negative): what it gave back to vouchers, trial and cash, handed to
    them in the same order."""
    left = {k: paid.get(k, ZERO) for k in ("voucher", "trial")}
    for line in lines:
        rest = line.amount
        for kind in ("voucher", "trial"):
            take = max(rest, left[kind]) if rest < 0 and left[kind] < 0 else ZERO
            setattr(line, kind, take)
            left[kind] -= take
            rest -= take
        line.cash = rest


def member_names(ids: set[int]) -> dict[int, str]:
    """Each member's name on the bill (their login name)."""
    from console.models import User

    if not ids:
        return {}
    return dict(User.objects.filter(pk__in=list(ids)).values_list("pk", User.USERNAME_FIELD))


def month_lines(
    user: User | Any,
    month: str | None = None,
    *,
    product: str = "",
    resource: str = "",
    region: str = "",
) -> tuple[str, list[BillLine]]:
    """The month's lines (``"YYYY-MM"``, default this month), oldest first; filters by product
    (resource kind), region (its code) and resource id (a substring)."""
    _first, start, end = month_bounds(month, clock.now())
    period = f"{start:%Y-%m}"
    wallet = Wallet.objects.filter(team=team_of(user)).first()
    if wallet is None:
        return period, []
    txns = LedgerTransaction.objects.filter(
        wallet=wallet, created_at__gte=start, created_at__lt=end
    )
    spend = dict(txns.filter(kind__in=SPEND_KINDS).values_list("pk", "created_at"))
    corrections = list(
        txns.filter(kind=TransactionKind.REVERSAL, reverses__kind__in=SPEND_KINDS).values_list(
            "pk", "created_at", "reverses_id"
        )
    )
    ids = list(spend) + [c[0] for c in corrections]
    paid: dict[int, dict[str, Decimal]] = defaultdict(dict)
    for txn_id, kind, amount in Entry.objects.filter(
        transaction_id__in=ids, account__wallet=wallet
    ).values_list("transaction_id", "account__kind", "amount"):
        key = "voucher" if kind == AccountKind.VOUCHER else str(kind)
        paid[txn_id][key] = paid[txn_id].get(key, ZERO) - amount
    by_txn: dict[int, list[BillLine]] = defaultdict(list)
    rows = (
        UsageCharge.objects.filter(transaction_id__in=list(spend))
        .order_by("transaction_id", "id")
        .values_list(
            "pk",
            "transaction_id",
            "from_second",
            "to_second",
            "amount",
            "session__resource_kind",
            "session__resource_id",
            "session__label",
            "session__meter",
            "session__gpu_model",
            "session__cards",
            "session__rate",
            "session__region",
            "session__member_id",
        )
    )
    for (
        pk,
        txn_id,
        frm,
        to,
        amount,
        kind,
        rid,
        label,
        meter,
        model,
        cards,
        rate,
        where,
        member_id,
    ) in rows.iterator(chunk_size=5000):
        seconds = Decimal(to - frm)
        disk = meter == Meter.DISK
        by_txn[txn_id].append(
            BillLine(
                bill_no=f"U{pk:012d}",
                period=period,
                charged_at=spend[txn_id],
                product=kind,
                resource_id=rid,
                label=label,
                item="disk" if disk else "gpu",
                mode="on_demand",
                gpu_model="" if disk else model,
                quantity=(cards * seconds / (_DAYS if disk else _HOURS)).quantize(
                    Decimal("0.0001")
                ),
                unit_price=rate,
                amount=amount,
                member=_member_key(member_id),
                transaction_id=txn_id,
                region=where,
            )
        )
    for rental in TermRental.objects.filter(transaction_id__in=list(spend)).order_by("id"):
        by_txn[rental.transaction_id].append(
            BillLine(
                bill_no=f"T{rental.pk:012d}",
                period=period,
                charged_at=spend[rental.transaction_id],
                product=rental.resource_kind,
                resource_id=rental.resource_id,
                label=rental.label,
                item="term",
                mode="term",
                gpu_model=rental.gpu_model,
                quantity=Decimal(rental.cards * rental.days),
                unit_price=rental.rate,
                amount=rental.total,
                member=_member_key(rental.member_id),
                transaction_id=rental.transaction_id,
                region=rental.region,
            )
        )
    lines: list[BillLine] = []
    for txn_id in sorted(by_txn, key=lambda t: (spend[t], t)):
        _split(by_txn[txn_id], paid.get(txn_id, {}))
        lines.extend(by_txn[txn_id])
    reversed_lines = _correction_lines(corrections, paid, period)
    lines = sorted(lines + reversed_lines, key=lambda line: (line.charged_at, line.bill_no))
    keys = {line.member for line in lines}
    names = member_names({int(k) for k in keys if k})
    named = {k: names.get(int(k), "") if k else "" for k in keys}
    for line in lines:  # the member's id becomes their name (one query for the month)
        line.member = named[line.member]
    if product:
        lines = [line for line in lines if line.product == product]
    if region:
        lines = [line for line in lines if line.region == region]
    if resource:
        lines = [line for line in lines if resource in line.resource_id]
    return period, lines


def _member_key(member_id: int | None) -> str:
    """The line's member until the month's names are read (one query): its id ("" for none)."""
    return "" if member_id is None else str(member_id)


def _correction_lines(
    corrections: list[tuple[int, datetime, int]],
    paid: dict[int, dict[str, Decimal]],
    period: str,
) -> list[BillLine]:
    """A correction gives a charge back: per member of the charge it reverses, one negative line
    of what their part was (so each member's lines still sum to what they cost), with what it
    returned to each bucket handed out in spending order."""
    if not corrections:
        return []
    reversed_ids = [c[2] for c in corrections]
    what = {}
    for txn_id, kind in LedgerTransaction.objects.filter(pk__in=reversed_ids).values_list(
        "pk", "kind"
    ):
        what[txn_id] = kind
    # Per reversed transaction: each member's part and the first subject of theirs.
    parts_of: dict[int, dict[int | None, Decimal]] = defaultdict(dict)
    subjects: dict[tuple[int, int | None], tuple[str, str, str, str]] = {}
    for txn_id, kind, rid, model, where, member_id, amount in (
        UsageCharge.objects.filter(transaction_id__in=reversed_ids)
        .order_by("transaction_id", "id")
        .values_list(
            "transaction_id",
            "session__resource_kind",
            "session__resource_id",
            "session__gpu_model",
            "session__region",
            "session__member_id",
            "amount",
        )
    ):
        parts_of[txn_id][member_id] = parts_of[txn_id].get(member_id, ZERO) + amount
        subjects.setdefault((txn_id, member_id), (kind, rid, model, where))
    for r in TermRental.objects.filter(transaction_id__in=reversed_ids):
        parts_of[r.transaction_id][r.member_id] = (
            parts_of[r.transaction_id].get(r.member_id, ZERO) + r.total
        )
        subjects.setdefault(
            (r.transaction_id, r.member_id), (r.resource_kind, r.resource_id, r.gpu_model, r.region)
        )
    out = []
    for pk, at, reverses in corrections:
        parts = paid.get(pk, {})
        voucher, trial, cash = (parts.get(k, ZERO) for k in ("voucher", "trial", "cash"))
        whole = voucher + trial + cash
        shares = sorted(parts_of.get(reverses, {None: -whole}).items(), key=_member_order)
        group: list[BillLine] = []
        for i, (share_member, share) in enumerate(shares):
            # The last member's line takes what is left: the lines sum to the ledger exactly.
            amount = whole - sum((line.amount for line in group), ZERO)
            if i < len(shares) - 1:
                amount = -share
            kind, rid, model, where = subjects.get((reverses, share_member), ("", "", "", ""))
            group.append(
                BillLine(
                    bill_no=f"R{pk:012d}" + (f"-{i}" if i else ""),
                    period=period,
                    charged_at=at,
                    product=kind,
                    resource_id=rid,
                    label="",
                    item="term" if what.get(reverses) == TransactionKind.TERM_PURCHASE else "gpu",
                    mode="correction",
                    gpu_model=model,
                    quantity=ZERO,
                    unit_price=ZERO,
                    amount=amount,
                    member=_member_key(share_member),
                    transaction_id=pk,
                    region=where,
                )
            )
        _split_back(group, {"voucher": voucher, "trial": trial})
        out.extend(group)
    return out


def _member_order(item: tuple[int | None, Decimal]) -> tuple[bool, int]:
    return (item[0] is None, item[0] or 0)


@dataclass(frozen=True)
class Totals:
    amount: Decimal
    voucher: Decimal
    trial: Decimal
    cash: Decimal


def totals(lines: list[BillLine]) -> Totals:
    return Totals(
        sum((line.amount for line in lines), ZERO),
        sum((line.voucher for line in lines), ZERO),
        sum((line.trial for line in lines), ZERO),
        sum((line.cash for line in lines), ZERO),
    )


@dataclass(frozen=True)
class SummaryRow:
    key: str
    label: str
    totals: Totals
    share: int  # percent of the month's amount, for the chart


def summary(lines: list[BillLine], by: str) -> list[SummaryRow]:
    """The monthly bill grouped ``by`` product, region, gpu_model or member; largest first."""
    groups: dict[str, list[BillLine]] = defaultdict(list)
    for line in lines:
        groups[getattr(line, by) or "—"].append(line)
    whole = sum((line.amount for line in lines), ZERO)
    rows = []
    for key, group in groups.items():
        t = totals(group)
        label = (
            product_label(key)
            if by == "product"
            else region_label(key if key != "—" else "")
            if by == "region"
            else (_("The team (shared storage)") if key == "—" else key)
            if by == "member"
            else key
        )
        share = int(t.amount * 100 / whole) if whole > 0 else 0
        rows.append(SummaryRow(key, label, t, max(0, min(100, share))))
    return sorted(rows, key=lambda r: (-r.totals.amount, r.key))


def ledger_month_total(user: User | Any, month: str | None = None) -> Decimal:
    """What the ledger says the month's charges cost the customer's buckets (the check of the
    bill: its lines sum to this to the cent)."""
    _first, start, end = month_bounds(month, clock.now())
    spend = Q(transaction__kind__in=SPEND_KINDS) | Q(
        transaction__kind=TransactionKind.REVERSAL, transaction__reverses__kind__in=SPEND_KINDS
    )
    entries = Entry.objects.filter(
        spend,
        account__wallet__team=team_of(user),
        transaction__created_at__gte=start,
        transaction__created_at__lt=end,
    )
    return -sum(entries.values_list("amount", flat=True), ZERO)
