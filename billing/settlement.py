"""Settlement: every open usage session charged up to now, in bulk, and the low-balance decision.

``settle_usage`` runs a handful of named steps: lock the wallets, read their open sessions and
spendable accounts, compute what each session owes (``charge_due``, pure), post one ledger
transaction per wallet, decide per wallet whether to warn or stop (billing/lowbalance.py), write
everything back, and after commit hand what was stopped to the stop handler and tell the users.

The stop hook lives here because settlement is what stops: when the balance cannot cover the next
settlement window, billing closes the sessions that must stop and, on commit, calls the stop
handler once per session with ``(resource_kind, resource_id, reason)``. The slices app installs it
with ``register_stop_handler(fn)`` or names it in the setting ``BILLING_STOP_HANDLER``.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from django.conf import settings
from django.db import models, transaction
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _

from billing import clock, lowbalance
from billing.choices import (
    AccountKind,
    CloseReason,
    MemoCode,
    Meter,
    NoticeKind,
    TransactionKind,
    UsageState,
)
from billing.ledger import spend_order, spending_legs, system_account
from billing.models import (
    Account,
    BillingNotice,
    Entry,
    LedgerTransaction,
    Metered,
    UsageCharge,
    UsageSession,
    Wallet,
)
from billing.money import ZERO, charge_for, round_cents
from billing.sql import bulk_set, insert_rows
from console.events import notify_user
from console.retries import retry_transient

logger = logging.getLogger(__name__)

USAGE = MemoCode.USAGE.value


def setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


def settlement_window() -> int:
    """Seconds between bulk settlements (the Celery beat interval) = the low-balance window."""
    return int(setting("BILLING_SETTLEMENT_INTERVAL", 60))


def low_balance_thresholds() -> tuple[int, ...]:
    return tuple(setting("BILLING_LOW_BALANCE_THRESHOLDS", (3600,)))


# --- the stop hook -------------------------------------------------------------------------------
StopHandler = Callable[[str, str, str], None]
_stop_handler: StopHandler | None = None


def register_stop_handler(handler: StopHandler | None) -> StopHandler | None:
    """Install the function billing calls to release a resource it stopped; returns the old one."""
    global _stop_handler
    previous, _stop_handler = _stop_handler, handler
    return previous


def get_stop_handler() -> StopHandler | None:
    if _stop_handler is not None:
        return _stop_handler
    dotted = setting("BILLING_STOP_HANDLER", "")
    return import_string(dotted) if dotted else None


def _request_stop(resource_kind: str, resource_id: str, reason: str) -> None:
    handler = get_stop_handler()
    if handler is None:
        logger.warning(
            "billing stopped %s %s (%s); no stop handler", resource_kind, resource_id, reason
        )
        return
    try:
        # On commit, outside the settlement's transaction: a blip is retried in place.
        retry_transient(
            lambda: handler(resource_kind, resource_id, reason),
            what=f"stopping {resource_kind} {resource_id}",
        )
    except Exception:  # the billing side is committed; the slices reconciler retries the release
        logger.exception("stop handler failed for %s %s", resource_kind, resource_id)


# --- what a run reads and computes ----------------------------------------------------------------
@dataclass
class SettlementResult:
    sessions: int = 0
    charged: Decimal = ZERO
    transactions: int = 0
    stopped: list[int] = field(default_factory=list)
    warnings: int = 0


@dataclass(slots=True)
class _Open(Metered):
    """An open session as the bulk settlement reads it (a plain row, no model instance)."""

    pk: int
    wallet_id: int
    rate: Decimal
    cards: int
    settled_seconds: int
    started_at: datetime
    meter: str
    charged: Decimal
    resource_kind: str
    resource_id: str


_OPEN_COLUMNS = [f.name for f in fields(_Open)]


@dataclass(slots=True)
class _Bucket:
    """A spendable account (or the revenue account) as a plain row; ``balance`` moves in memory."""

    pk: int
    wallet_id: int | None
    kind: str
    balance: Decimal
    expires_at: datetime | None


@dataclass(slots=True)
class Charge:
    """What one session owes for its seconds since the last settlement."""

    session: _Open
    until: int  # the session's new settled_seconds
    amount: Decimal


def charge_due(session: _Open, now: datetime) -> Charge:
    """The session's charge up to ``now`` under cumulative rounding (billing/money.py). Pure.

    ``charged`` is always charge_for(settled_seconds), so the delta is the new cumulative total
    minus it: ``money.settlement_delta`` without redoing the old half. A clock that went back
    (or a replay at the same second) charges nothing and never moves a session backwards.
    """
    until = max(int((now - session.started_at).total_seconds()), session.settled_seconds)
    if until == session.settled_seconds:
        return Charge(session, until, ZERO)
    total = charge_for(session.rate, session.cards, until, session.per_seconds)
    return Charge(session, until, total - session.charged)


@dataclass
class _Run:
    """One settlement run's state, filled step by step."""

    now: datetime
    close: dict[int, str]
    locked: dict[int, list[int] | None]  # wallet id → thresholds warned so far
    sessions: list[_Open] = field(default_factory=list)
    buckets: dict[int, list[_Bucket]] = field(default_factory=dict)  # in spending order
    revenue: _Bucket | None = None
    charges: list[Charge] = field(default_factory=list)
    legs: dict[int, list[tuple[_Bucket, Decimal]]] = field(default_factory=dict)
    notices: list[BillingNotice] = field(default_factory=list)
    warned: dict[int, list[int]] = field(default_factory=dict)  # wallet id → new warned list
    stop: dict[int, str] = field(default_factory=dict)  # session id → close reason


# --- the run -------------------------------------------------------------------------------------
@transaction.atomic
def settle_usage(
    now: datetime | None = None,
    *,
    wallet_ids: Iterable[int] | None = None,
    close: dict[int, str] | None = None,
) -> SettlementResult:
    """Charge every open session (or those of ``wallet_ids``) up to ``now``, in bulk.

    A constant number of queries whatever the number of sessions: lock the wallets, read their
    open sessions and spendable accounts (plus the revenue account), then one INSERT each for
    ledger transactions, entries and usage charges and one UPDATE … FROM each for balances and
    sessions — 8 statements on PostgreSQL (arrays via ``unnest``), a few more on SQLite for very
    large runs (its parameter limit). One ledger transaction per wallet and run; one
    ``UsageCharge`` per session and period, unique on (session, period start).

    Safe to run twice or concurrently: the second run waits for the wallet locks, then reads the
    sessions the first one advanced and finds nothing left to charge. Then the low-balance
    decision runs per wallet (billing/lowbalance.py): warnings once per threshold, and the
    sessions that must stop are closed at ``now`` and handed to the stop handler on commit.
    """
    run = _Run(now or clock.now(), dict(close or {}), _lock_wallets(wallet_ids))
    if not run.locked:
        return SettlementResult()
    _read_sessions(run)
    _read_buckets(run)
    run.charges = [charge_due(s, run.now) for s in run.sessions]
    transactions = _post_usage(run)
    _decide_low_balance(run)
    _write_back(run)
    _after_commit(run)
    return SettlementResult(
        sessions=len(run.sessions),
        charged=sum((c.amount for c in run.charges), ZERO),
        transactions=transactions,
        stopped=[pk for pk, reason in run.stop.items() if pk not in run.close],
        warnings=sum(1 for n in run.notices if n.kind == NoticeKind.LOW_BALANCE),
    )


def _lock_wallets(wallet_ids: Iterable[int] | None) -> dict[int, list[int] | None]:
    """Step 1: lock the wallets with open sessions, ascending id (the lock order of every writer)."""
    open_sessions = UsageSession.objects.filter(state=UsageState.OPEN)
    wallets = Wallet.objects.filter(pk__in=open_sessions.values("wallet_id"))
    if wallet_ids is not None:
        wallets = wallets.filter(pk__in=list(wallet_ids))
    return dict(wallets.order_by("pk").select_for_update().values_list("pk", "warned_thresholds"))


def _read_sessions(run: _Run) -> None:
    """Step 2: their open sessions, read after the locks so a concurrent run's progress shows."""
    # Exactly the wallets locked in step 1: a subquery would also match a wallet whose first
    # session opened since, and lock its accounts without its wallet lock (out of order).
    rows = (
        UsageSession.objects.filter(state=UsageState.OPEN, wallet_id__in=list(run.locked))
        .order_by("pk")
        .values_list(*_OPEN_COLUMNS)
    )
    run.sessions = [_Open(*row) for row in rows]


def _read_buckets(run: _Run) -> None:
    """Step 3: their spendable accounts and the revenue account, locked in the same statement."""
    spendable = Account.objects.filter(wallet_id__in=list(run.locked)).spendable(run.now)
    rows = (
        Account.objects.filter(
            models.Q(pk__in=spendable.values("pk"))
            | models.Q(wallet__isnull=True, kind=AccountKind.USAGE_REVENUE)
        )
        .order_by("pk")
        .select_for_update()
        .values_list("pk", "wallet_id", "kind", "balance", "expires_at")
    )
    buckets: dict[int, list[_Bucket]] = defaultdict(list)
    for bucket in (_Bucket(*row) for row in rows):
        if bucket.wallet_id is None:
            run.revenue = bucket
        elif bucket.wallet_id in run.locked:
            buckets[bucket.wallet_id].append(bucket)
    run.buckets = {wallet_id: sorted(b, key=spend_order) for wallet_id, b in buckets.items()}
    if run.revenue is None:  # the first settlement ever
        created = system_account(AccountKind.USAGE_REVENUE)
        # Lock and read in one statement: a concurrent first settlement may have created and
        # credited this account since; a balance read before the lock would lose its posting.
        balance = (
            Account.objects.select_for_update().values_list("balance", flat=True).get(pk=created.pk)
        )
        run.revenue = _Bucket(created.pk, None, created.kind, balance, None)


def _post_usage(run: _Run) -> int:
    """Step 5: one ledger transaction per wallet (legs in spending order); returns how many."""
    owed: dict[int, Decimal] = defaultdict(lambda: ZERO)
    for charge in run.charges:
        owed[charge.session.wallet_id] += charge.amount
    revenue = cast(_Bucket, run.revenue)
    params = {"at": run.now.strftime("%Y-%m-%d %H:%M:%S UTC")}
    txn_rows: list[list[Any]] = []
    for wallet_id, amount in owed.items():
        if amount:
            run.legs[wallet_id] = spending_legs(run.buckets.get(wallet_id, []), amount, revenue)
            txn_rows.append(
                [uuid.uuid4(), TransactionKind.USAGE.value, wallet_id, "", USAGE, params, run.now]
            )
    names = ["public_id", "kind", "wallet", "memo", "memo_code", "memo_params", "created_at"]
    txn_ids = insert_rows(LedgerTransaction, names, txn_rows, True)
    txn_of = dict(zip([r[2] for r in txn_rows], txn_ids, strict=True))
    entry_rows: list[list[Any]] = []
    for wallet_id, legs in run.legs.items():
        for bucket, amount in legs:
            entry_rows.append([txn_of[wallet_id], bucket.pk, amount])
            bucket.balance += amount
    insert_rows(Entry, ["transaction", "account", "amount"], entry_rows)
    insert_rows(
        UsageCharge,
        ["session", "transaction", "from_second", "to_second", "amount"],
        [
            [
                c.session.pk,
                txn_of[c.session.wallet_id],
                c.session.settled_seconds,
                c.until,
                c.amount,
            ]
            for c in run.charges
            if c.amount
        ],
    )
    return len(txn_rows)


def _decide_low_balance(run: _Run) -> None:
    """Step 6: per wallet, on the balances after this settlement: warn, re-arm or stop."""
    run.stop = dict(run.close)
    by_wallet: dict[int, list[_Open]] = defaultdict(list)
    for session in run.sessions:
        if session.pk not in run.close:
            by_wallet[session.wallet_id].append(session)
    window = settlement_window()
    thresholds = low_balance_thresholds()
    for wallet_id, sessions in by_wallet.items():
        spendable = sum((b.balance for b in run.buckets.get(wallet_id, [])), ZERO)
        # Disks are kept when money runs out; their burn is reserved before GPUs are weighed.
        disk_burn = sum((s.burn_per_hour for s in sessions if s.meter != Meter.GPU), ZERO)
        if disk_burn:
            spendable -= lowbalance.window_cost(disk_burn, window)
        burn = sum((s.burn_per_hour for s in sessions), ZERO)
        warned = set(run.locked[wallet_id] or ())
        # Fast path for the common case: far from every threshold, nothing warned yet.
        if not warned and spendable * 3600 >= burn * max(max(thresholds, default=0), window):
            continue
        gpu_sessions = [
            lowbalance.MeteredSession(s.pk, s.burn_per_hour, int(s.started_at.timestamp()))
            for s in sessions
            if s.meter == Meter.GPU
        ]
        decision = lowbalance.decide(spendable, gpu_sessions, window, thresholds, warned)
        _apply_decision(run, wallet_id, warned, decision)


def _apply_decision(
    run: _Run, wallet_id: int, warned: set[int], decision: lowbalance.LowBalanceDecision
) -> None:
    if decision.warn or decision.rearm:
        run.warned[wallet_id] = sorted((warned | set(decision.warn)) - set(decision.rearm))
    for threshold in decision.warn:
        message = _(
            "Low balance: about %(minutes)d minutes left at %(burn)s 元/h. "
            "Top up to keep your instances running."
        ) % {
            "minutes": (decision.runway_seconds or 0) // 60,
            "burn": round_cents(decision.burn_per_hour),
        }
        run.notices.append(
            BillingNotice(
                wallet_id=wallet_id,
                kind=NoticeKind.LOW_BALANCE,
                threshold_seconds=threshold,
                message=message,
                created_at=run.now,
            )
        )
    if decision.stop:
        # The session keys handed to the decision are UsageSession primary keys.
        for key in decision.stop:
            run.stop[cast(int, key)] = CloseReason.INSUFFICIENT_FUNDS
        message = _(
            "Your balance cannot cover the next minute of usage: %(n)d instance(s) "
            "were stopped. Disks and files are kept."
        ) % {"n": len(decision.stop)}
        run.notices.append(
            BillingNotice(
                wallet_id=wallet_id, kind=NoticeKind.STOPPED, message=message, created_at=run.now
            )
        )


def _write_back(run: _Run) -> None:
    """Step 7: balances, sessions (advanced, or closed), notices, warned thresholds."""
    moved = {b.pk: b for legs in run.legs.values() for b, _amount in legs}
    bulk_set(Account, ["balance"], [(pk, [b.balance]) for pk, b in moved.items()])
    # Most rows only advance; closing rows also change state (a second statement, only then).
    advancing: list[tuple[int, list[Any]]] = []
    closing: list[tuple[int, list[Any]]] = []
    for c in run.charges:
        values = [c.until, c.session.charged + c.amount, run.now]
        if c.session.pk in run.stop:
            closing.append(
                (c.session.pk, [*values, UsageState.CLOSED.value, run.now, run.stop[c.session.pk]])
            )
        elif c.until != c.session.settled_seconds:  # a replay at the same second changes nothing
            advancing.append((c.session.pk, values))
    bulk_set(UsageSession, ["settled_seconds", "charged", "settled_at"], advancing)
    bulk_set(
        UsageSession,
        ["settled_seconds", "charged", "settled_at", "state", "ended_at", "close_reason"],
        closing,
    )
    if run.notices:
        BillingNotice.objects.bulk_create(run.notices)
    if run.warned:
        Wallet.objects.bulk_update(
            [Wallet(pk=pk, warned_thresholds=w) for pk, w in run.warned.items()],
            ["warned_thresholds"],
        )


def _after_commit(run: _Run) -> None:
    """Step 8: ask slices to release what was stopped for lack of funds; tell the users."""
    stopped = {pk for pk in run.stop if pk not in run.close}
    refs = [(s.resource_kind, s.resource_id) for s in run.sessions if s.pk in stopped]
    if refs:
        transaction.on_commit(lambda: _request_stops(refs))
    if run.notices:
        _notify_on_commit(run.notices)


def _request_stops(refs: list[tuple[str, str]]) -> None:
    for kind, resource_id in refs:
        _request_stop(kind, resource_id, CloseReason.INSUFFICIENT_FUNDS.value)


def _notify_on_commit(notices: list[BillingNotice]) -> None:
    owners = dict(
        Wallet.objects.filter(pk__in={n.wallet_id for n in notices}).values_list(
            "pk", "owner__public_id"
        )
    )
    messages = [(str(owners[n.wallet_id]), n.kind, n.message) for n in notices]

    def send() -> None:
        for public_id, kind, message in messages:
            try:
                notify_user(public_id, f"billing.{kind}", {"message": message})
            except Exception:  # a dropped toast must not undo a settlement
                logger.exception("could not notify %s", public_id)

    transaction.on_commit(send)
