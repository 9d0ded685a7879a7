"""Every money movement of the console: one function per state change, atomic at the entry point.

Services other apps call
------------------------
* ``grant_trial_credit(user) -> bool`` — the one-time 10.00 元 trial credit (accounts, after email
  verification). Idempotent, also under concurrency (unique ledger key per wallet).
* ``get_wallet_summary(user) -> WalletSummary`` — balances by kind as ``Decimal`` (dashboard).
* ``open_usage_session(user, *, resource_kind, resource_id, gpu_model, cards, label="", at=None)``
  — billing starts (an instance reached *running*). Idempotent per resource.
* ``close_usage_session(resource_kind, resource_id, *, reason=CloseReason.RELEASED, at=None)`` —
  billing stops (released, failed, migrated away); settles up to ``at``.
* ``quote_for(user, gpu_model, cards, disk_gb=0) -> Quote`` — the price calculator on the current
  price book and the user's balance (order forms, API); ``ensure_affordable(...)`` (same
  arguments) raises ``InsufficientFunds`` when the balance cannot run the order for one window.
* ``purchase_term(user, *, gpu_model, cards, days, resource_kind, resource_id, label="")`` — a
  long-term rental paid up front at the locked price.
* The **stop hook**: when the balance cannot cover the next settlement window, billing closes the
  sessions that must stop and, on commit, calls the stop handler once per session with
  ``(resource_kind, resource_id, reason)``. The slices app installs it with
  ``register_stop_handler(fn)`` (e.g. in its ``AppConfig.ready``) or names it in the setting
  ``BILLING_STOP_HANDLER = "slices.services.stop_for_billing"``. It must release the resource
  (keeping disks and files) and must not raise; without a handler, stops are only logged.

Locking and concurrency
-----------------------
Every writer takes the customer's ``Wallet`` row lock first (``SELECT … FOR UPDATE``; several wallets
always in ascending id order), then reads and writes that wallet's accounts, then the operator's
system accounts. One lock order everywhere, so no deadlocks; and because nothing touches a
customer's accounts without the wallet lock, a top-up and a settlement never lose each other's
update. Ledger rows carry unique keys (``LedgerTransaction.idempotency_key``, ``UsageCharge``
(session, period), ``Payment.provider_txn_id``), so a replayed webhook or settlement posts nothing
twice even if the locks were bypassed. SQLite (embedded default) ignores row locks but runs every
write transaction ``BEGIN IMMEDIATE``, which serialises writers.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, cast

from django.conf import settings
from django.db import IntegrityError, connection, models, transaction
from django.db.models import Sum
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from billing import clock, lowbalance
from billing.choices import (
    AccountKind,
    CloseReason,
    Meter,
    NoticeKind,
    PaymentState,
    TransactionKind,
    UsageState,
)
from billing.errors import (
    BillingError,
    IdempotencyMismatch,
    InsufficientFunds,
    InvalidWebhook,
    PriceNotSet,
)
from billing.models import (
    Account,
    BillingNotice,
    Entry,
    GpuPrice,
    LedgerTransaction,
    Payment,
    PriceBook,
    TermPrice,
    TermRental,
    TopUpBonusRule,
    UsageCharge,
    UsageSession,
    Wallet,
    gpu_price_quote,
)
from billing.money import (
    ZERO,
    allocate,
    charge_for,
    percent_of,
    round_cents,
    settlement_delta,
    to_decimal,
)
from billing.pricing import Quote, quote_order, runway_seconds

logger = logging.getLogger(__name__)

TRIAL_CREDIT = Decimal("10.00")
MIN_TOPUP = Decimal("1.00")
MAX_TOPUP = Decimal("10000000.00")


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
        handler(resource_kind, resource_id, reason)
    except Exception:  # the billing side is committed; the slices reconciler retries the release
        logger.exception("stop handler failed for %s %s", resource_kind, resource_id)


# --- wallets and system accounts -----------------------------------------------------------------
def get_or_create_wallet(user: Any) -> Wallet:
    """The user's wallet, with its cash and trial accounts (created on first use)."""
    wallet = Wallet.objects.filter(owner=user).first()
    if wallet is not None:
        return wallet
    try:
        with transaction.atomic():
            wallet = Wallet.objects.create(owner=user)
            Account.objects.bulk_create(
                [
                    Account(wallet=wallet, kind=AccountKind.CASH),
                    Account(wallet=wallet, kind=AccountKind.TRIAL),
                ]
            )
            return wallet
    except IntegrityError:  # another request created it first
        return Wallet.objects.get(owner=user)


def _lock_wallet(user: Any) -> Wallet:
    wallet = get_or_create_wallet(user)
    return Wallet.objects.select_for_update().get(pk=wallet.pk)


def _system_account(kind: AccountKind) -> Account:
    account = Account.objects.filter(wallet__isnull=True, kind=kind).first()
    if account is not None:
        return account
    try:
        with transaction.atomic():
            return Account.objects.create(wallet=None, kind=kind)
    except IntegrityError:
        return Account.objects.get(wallet__isnull=True, kind=kind)


def _bucket(wallet: Wallet, kind: AccountKind) -> Account:
    return Account.objects.get(wallet=wallet, kind=kind)


def _post(
    kind: TransactionKind,
    legs: Sequence[tuple[Account, Decimal]],
    *,
    wallet: Wallet | None,
    memo: str = "",
    key: str | None = None,
    by: Any = None,
    at: datetime | None = None,
    reverses: LedgerTransaction | None = None,
) -> LedgerTransaction:
    """Post one balanced transaction and move the cached balances with it.

    Callers hold the wallet lock. Balances move with ``F()`` increments so system accounts shared
    by every wallet never lose an update.
    """
    legs = [(account, round_cents(amount)) for account, amount in legs if amount]
    if sum((amount for _, amount in legs), ZERO) != 0:
        raise ValueError("a ledger transaction must sum to zero")
    txn = LedgerTransaction.objects.create(
        kind=kind,
        wallet=wallet,
        memo=memo[:300],
        idempotency_key=key,
        created_by=by if getattr(by, "pk", None) else None,
        created_at=at or clock.now(),
        reverses=reverses,
    )
    Entry.objects.bulk_create([Entry(transaction=txn, account=a, amount=x) for a, x in legs])
    for account, amount in sorted(legs, key=lambda leg: leg[0].pk):
        Account.objects.filter(pk=account.pk).update(balance=models.F("balance") + amount)
    return txn


def _spendable_buckets(wallet: Wallet, at: datetime) -> list[Account]:
    """The wallet's buckets in spending order: vouchers expiring first, trial credit, cash last."""
    accounts = list(Account.objects.filter(wallet=wallet).spendable(at))
    return sorted(accounts, key=_spend_key)


_SPEND_RANK: dict[str, int] = {AccountKind.VOUCHER: 0, AccountKind.TRIAL: 1, AccountKind.CASH: 2}


def _spend_key(account: Account) -> tuple[Any, ...]:
    rank = _SPEND_RANK[account.kind]
    expiry = account.expires_at.timestamp() if account.expires_at else float("inf")
    return (account.wallet_id, rank, expiry, account.pk)


def _spend_legs(buckets: list[Account], amount: Decimal) -> list[tuple[Account, Decimal]]:
    parts = allocate(amount, [b.balance for b in buckets])
    return [(b, -p) for b, p in zip(buckets, parts, strict=True) if p]


# --- grants -----------------------------------------------------------------------------------------
@transaction.atomic
def grant_trial_credit(user: Any) -> bool:
    """Grant the one-time 10.00 元 trial credit (体验金). Returns whether this call granted it.

    Idempotent: the grant's ledger key is unique per wallet, so repeated or concurrent calls (two
    verification links clicked at once) grant it once; the wallet lock makes the loser wait and
    see the winner's grant instead of failing.
    """
    wallet = _lock_wallet(user)
    key = f"trial:{wallet.public_id}"
    if LedgerTransaction.objects.filter(idempotency_key=key).exists():
        return False
    try:
        with transaction.atomic():
            _post(
                TransactionKind.TRIAL_GRANT,
                [
                    (_bucket(wallet, AccountKind.TRIAL), TRIAL_CREDIT),
                    (_system_account(AccountKind.PROMOTIONS), -TRIAL_CREDIT),
                ],
                wallet=wallet,
                memo=_("Trial credit for a new verified account"),
                key=key,
            )
    except IntegrityError:  # granted concurrently without the lock (SQLite) — once is enough
        return False
    return True


@transaction.atomic
def grant_voucher(
    user: Any,
    amount: Decimal,
    *,
    reason: str,
    expires_at: datetime | None = None,
    valid_days: int = 90,
    by: Any = None,
    key: str | None = None,
) -> Account:
    """Grant a compute voucher (算力券): its own account with an amount, an expiry and a reason."""
    amount = round_cents(to_decimal(amount))
    if amount <= 0:
        raise BillingError(gettext_noop("A voucher must be worth more than 0 元."))
    if not reason.strip():
        raise BillingError(gettext_noop("A voucher needs a reason."))
    now = clock.now()
    expires_at = expires_at or now + timedelta(days=valid_days)
    if expires_at <= now:
        raise BillingError(gettext_noop("A voucher must expire in the future."))
    wallet = _lock_wallet(user)
    voucher = _new_voucher(wallet, amount, expires_at, reason)
    _post(
        TransactionKind.VOUCHER_GRANT,
        [(voucher, amount), (_system_account(AccountKind.PROMOTIONS), -amount)],
        wallet=wallet,
        memo=reason,
        key=key,
        by=by,
    )
    return voucher


def _new_voucher(wallet: Wallet, amount: Decimal, expires_at: datetime, reason: str) -> Account:
    return Account.objects.create(
        wallet=wallet,
        kind=AccountKind.VOUCHER,
        granted_amount=amount,
        expires_at=expires_at,
        reason=reason[:200],
    )


@transaction.atomic
def refund_cash(user: Any, amount: Decimal, *, reason: str, by: Any = None) -> LedgerTransaction:
    """Pay cash back to the customer (trial credit and vouchers are never refunded)."""
    amount = round_cents(to_decimal(amount))
    if amount <= 0 or not reason.strip():
        raise BillingError(gettext_noop("A refund needs a positive amount and a reason."))
    wallet = _lock_wallet(user)
    cash = _bucket(wallet, AccountKind.CASH)
    if cash.balance < amount:
        raise InsufficientFunds(gettext_noop("The cash balance is %(cash)s 元."), cash=cash.balance)
    return _post(
        TransactionKind.REFUND,
        [(cash, -amount), (_system_account(AccountKind.REFUNDS), amount)],
        wallet=wallet,
        memo=reason,
        by=by,
    )


@transaction.atomic
def reverse_transaction(
    txn: LedgerTransaction, *, reason: str, by: Any = None
) -> LedgerTransaction:
    """Correct a transaction with its mirror image (entries are never edited or deleted)."""
    if not reason.strip():
        raise BillingError(gettext_noop("A correction needs a reason."))
    if txn.wallet_id:
        Wallet.objects.select_for_update().get(pk=txn.wallet_id)
    if LedgerTransaction.objects.filter(reverses=txn).exists():
        raise BillingError(gettext_noop("This transaction was already reversed."))
    legs = [(e.account, -e.amount) for e in txn.entries.select_related("account")]
    try:
        with transaction.atomic():
            return _post(
                TransactionKind.REVERSAL,
                legs,
                wallet=txn.wallet,
                memo=reason,
                by=by,
                reverses=txn,
            )
    except IntegrityError as exc:  # a voucher or the trial credit was already spent
        raise BillingError(
            gettext_noop("The credit was already spent; grant a voucher or refund instead.")
        ) from exc


@transaction.atomic
def expire_vouchers(now: datetime | None = None) -> int:
    """Move what is left on expired vouchers to the expiry account. Returns how many expired."""
    now = now or clock.now()
    expired = Account.objects.filter(kind=AccountKind.VOUCHER, expires_at__lte=now, balance__gt=0)
    wallet_ids = sorted(set(expired.values_list("wallet_id", flat=True)))
    list(Wallet.objects.filter(pk__in=wallet_ids).order_by("pk").select_for_update().values("pk"))
    sink = _system_account(AccountKind.EXPIRED)
    count = 0
    # Read (and so re-checked) under the wallet locks: a concurrent run already wrote these off.
    for voucher in expired.select_related("wallet").order_by("wallet_id", "pk"):
        _post(
            TransactionKind.VOUCHER_EXPIRY,
            [(voucher, -voucher.balance), (sink, voucher.balance)],
            wallet=voucher.wallet,
            memo=_("Voucher expired: %(reason)s") % {"reason": voucher.reason},
            # Per run instant: a reversed expiry gives the voucher a balance to expire again.
            key=f"expiry:{voucher.public_id}:{int(now.timestamp())}",
            at=now,
        )
        count += 1
    return count


# --- summary -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WalletSummary:
    cash: Decimal = ZERO
    trial: Decimal = ZERO
    vouchers: Decimal = ZERO  # unexpired only
    burn_per_hour: Decimal = ZERO  # open sessions, exact
    next_voucher_expiry: datetime | None = None
    open_sessions: int = 0

    @property
    def spendable(self) -> Decimal:
        return self.cash + self.trial + self.vouchers

    @property
    def runway_seconds(self) -> int | None:
        return runway_seconds(self.spendable, self.burn_per_hour)


def get_wallet_summary(user: Any) -> WalletSummary:
    """Balances by kind (Decimal 元), burn rate and runway; zeros for a user without a wallet."""
    if not getattr(user, "pk", None):
        return WalletSummary()
    now = clock.now()
    cash = trial = vouchers = ZERO
    next_expiry: datetime | None = None
    for account in Account.objects.filter(wallet__owner=user).spendable(now):
        if account.kind == AccountKind.CASH:
            cash += account.balance
        elif account.kind == AccountKind.TRIAL:
            trial += account.balance
        else:
            vouchers += account.balance
            expires = account.expires_at  # always set on vouchers
            if expires is not None and (next_expiry is None or expires < next_expiry):
                next_expiry = expires
    burn = ZERO
    sessions = UsageSession.objects.for_owner(user).open().only("rate", "cards", "meter")
    count = 0
    for session in sessions:
        burn += session.burn_per_hour
        count += 1
    return WalletSummary(cash, trial, vouchers, burn, next_expiry, count)


# --- prices --------------------------------------------------------------------------------------
def current_price_book(at: datetime | None = None) -> PriceBook | None:
    return PriceBook.objects.effective_at(at or clock.now()).first()


def current_gpu_price(gpu_model: str, at: datetime | None = None) -> tuple[PriceBook, GpuPrice]:
    book = current_price_book(at)
    price = book.gpu_prices.filter(gpu_model=gpu_model).first() if book else None
    if book is None or price is None:
        raise PriceNotSet(gettext_noop("No price is set for %(model)s."), model=gpu_model)
    return book, price


def price_list(at: datetime | None = None) -> list[tuple[GpuPrice, list[TermPrice]]]:
    book = current_price_book(at)
    if book is None:
        return []
    terms: dict[str, list[TermPrice]] = defaultdict(list)
    for term in book.term_prices.all():
        terms[term.gpu_model].append(term)
    return [(p, terms[p.gpu_model]) for p in book.gpu_prices.all()]


def quote_for(user: Any, gpu_model: str, cards: int, disk_gb: int = 0) -> Quote:
    """Quote an order on the current price book, with how long the user's balance lasts."""
    book, price = current_gpu_price(gpu_model)
    terms = list(book.term_prices.filter(gpu_model=gpu_model))
    balance = get_wallet_summary(user).spendable if getattr(user, "pk", None) else None
    return quote_order(
        gpu_price_quote(book, price, terms),
        cards,
        balance=balance,
        disk_gb=disk_gb,
        storage=book.storage_quote,
    )


def ensure_affordable(user: Any, gpu_model: str, cards: int, disk_gb: int = 0) -> Quote:
    """Refuse an on-demand order the balance cannot run for one settlement window.

    The ordering app calls it before allocating; returns the quote (with runway) on success.
    """
    quote = quote_for(user, gpu_model, cards, disk_gb)
    if quote.runway_seconds is not None and quote.runway_seconds < settlement_window():
        raise InsufficientFunds(
            gettext_noop(
                "Your balance cannot run %(cards)d × %(model)s for one minute; please top up."
            ),
            cards=cards,
            model=gpu_model,
        )
    return quote


# --- metering ------------------------------------------------------------------------------------
@transaction.atomic
def open_usage_session(
    user: Any,
    *,
    resource_kind: str,
    resource_id: str,
    gpu_model: str = "",
    cards: int,
    label: str = "",
    meter: str = Meter.GPU,
    at: datetime | None = None,
) -> UsageSession:
    """Start billing a resource at ``at`` (default now) at the current price; idempotent.

    GPU meters bill ``cards`` × the model's on-demand card-hour price. Disk meters bill ``cards``
    GB beyond the free quota at the GB-day price. The rate and price version are recorded on the
    session and never change while it runs.
    """
    if int(cards) < 1:
        raise BillingError(gettext_noop("A usage session needs at least one card (or GB)."))
    existing = UsageSession.objects.filter(
        resource_kind=resource_kind, resource_id=str(resource_id), state=UsageState.OPEN
    ).first()
    if existing is not None:
        return existing
    at = at or clock.now()
    if meter == Meter.DISK:
        book = current_price_book(at)
        if book is None:
            raise PriceNotSet(gettext_noop("No price book is in effect."))
        rate, units = book.storage_per_gb_day, max(0, int(cards) - book.storage_free_gb)
    else:
        book, price = current_gpu_price(gpu_model, at)
        rate, units = price.on_demand_per_card_hour, int(cards)
    wallet = get_or_create_wallet(user)
    try:
        with transaction.atomic():
            return UsageSession.objects.create(
                wallet=wallet,
                resource_kind=resource_kind,
                resource_id=str(resource_id),
                label=label[:120],
                meter=meter,
                gpu_model=gpu_model,
                cards=units,
                rate=rate,
                price_book=book,
                started_at=at,
                settled_at=at,
            )
    except IntegrityError:  # "running" reported twice at once: one billing start
        return UsageSession.objects.get(
            resource_kind=resource_kind, resource_id=str(resource_id), state=UsageState.OPEN
        )


@transaction.atomic
def close_usage_session(
    resource_kind: str,
    resource_id: str,
    *,
    reason: str = CloseReason.RELEASED,
    at: datetime | None = None,
) -> UsageSession | None:
    """Stop billing a resource at ``at``: settle its last seconds and close it. Idempotent.

    Returns the closed session, or None when nothing was billing.
    """
    session = UsageSession.objects.filter(
        resource_kind=resource_kind, resource_id=str(resource_id), state=UsageState.OPEN
    ).first()
    if session is None:
        return None
    settle_usage(at or clock.now(), wallet_ids=[session.wallet_id], close={session.pk: reason})
    session.refresh_from_db()
    return session if session.state == UsageState.CLOSED else None


@dataclass
class SettlementResult:
    sessions: int = 0
    charged: Decimal = ZERO
    transactions: int = 0
    stopped: list[int] = field(default_factory=list)
    warnings: int = 0


@dataclass(slots=True)
class _Open:
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

    @property
    def per_seconds(self) -> int:
        return 86400 if self.meter == Meter.DISK else 3600

    @property
    def burn_per_hour(self) -> Decimal:
        return self.rate * self.cards * 3600 / self.per_seconds


@dataclass(slots=True)
class _Bucket:
    pk: int
    wallet_id: int | None
    kind: str
    balance: Decimal
    expires_at: datetime | None


_SPEND_RANK = {AccountKind.VOUCHER: 0, AccountKind.TRIAL: 1, AccountKind.CASH: 2}
_FAR_FUTURE = float("inf")


def _bucket_order(b: _Bucket) -> tuple:
    return (_SPEND_RANK[b.kind], b.expires_at.timestamp() if b.expires_at else _FAR_FUTURE, b.pk)


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
    now = now or clock.now()
    close = close or {}
    result = SettlementResult()
    open_sessions = UsageSession.objects.filter(state=UsageState.OPEN)
    wallets = Wallet.objects.filter(pk__in=open_sessions.values("wallet_id"))
    if wallet_ids is not None:
        wallets = wallets.filter(pk__in=list(wallet_ids))
    # 1. the wallet locks, ascending id (the lock order of every writer)
    locked = dict(wallets.order_by("pk").select_for_update().values_list("pk", "warned_thresholds"))
    if not locked:
        return result
    # Exactly the wallets locked in step 1: a subquery would also match a wallet whose first
    # session opened since, and lock its accounts without its wallet lock (out of order).
    in_scope = {"wallet_id__in": list(locked)}
    # 2. their open sessions, read after the locks so a concurrent run's progress is visible
    sessions = [
        _Open(*row)
        for row in open_sessions.filter(**in_scope)
        .order_by("pk")
        .values_list(
            "pk",
            "wallet_id",
            "rate",
            "cards",
            "settled_seconds",
            "started_at",
            "meter",
            "charged",
            "resource_kind",
            "resource_id",
        )
    ]
    # A session opened after step 1 in a wallet that had none is left for the next run.
    sessions = [s for s in sessions if s.wallet_id in locked]
    # 3. their spendable accounts and the revenue account, locked in the same statement
    accounts = [
        _Bucket(*row)
        for row in Account.objects.filter(
            models.Q(pk__in=Account.objects.filter(**in_scope).spendable(now).values("pk"))
            | models.Q(wallet__isnull=True, kind=AccountKind.USAGE_REVENUE)
        )
        .order_by("pk")
        .select_for_update()
        .values_list("pk", "wallet_id", "kind", "balance", "expires_at")
    ]
    revenue = next((a for a in accounts if a.wallet_id is None), None)
    if revenue is None:  # the first settlement ever
        created = _system_account(AccountKind.USAGE_REVENUE)
        # Lock and read in one statement: a concurrent first settlement may have created and
        # credited this account since; a balance read before the lock would lose its posting.
        balance = (
            Account.objects.select_for_update().values_list("balance", flat=True).get(pk=created.pk)
        )
        revenue = _Bucket(created.pk, None, created.kind, balance, None)
    buckets: dict[int, list[_Bucket]] = defaultdict(list)
    for account in accounts:
        if account.wallet_id in locked:
            buckets[account.wallet_id].append(account)
    for wallet_buckets in buckets.values():
        wallet_buckets.sort(key=_bucket_order)

    # 4. what each session owes since its last settlement (cumulative rounding, billing/money.py)
    charges: list[tuple[_Open, int, Decimal]] = []
    owed: dict[int, Decimal] = defaultdict(lambda: ZERO)
    for session in sessions:
        until = max(int((now - session.started_at).total_seconds()), session.settled_seconds)
        # ``charged`` is always charge_for(settled_seconds) (cumulative rounding), so the delta
        # is the new cumulative total minus it: billing.money.settlement_delta without redoing
        # the old half.
        delta = (
            charge_for(session.rate, session.cards, until, session.per_seconds) - session.charged
            if until != session.settled_seconds
            else ZERO
        )
        charges.append((session, until, delta))
        owed[session.wallet_id] += delta

    # 5. postings: one transaction per wallet, legs in spending order
    memo = _("Usage up to %(at)s") % {"at": now.strftime("%Y-%m-%d %H:%M:%S UTC")}
    txn_rows: list[list[Any]] = []
    legs_by_wallet: dict[int, list[tuple[_Bucket, Decimal]]] = {}
    for wallet_id, amount in owed.items():
        if not amount:
            continue
        wallet_buckets = buckets[wallet_id]
        parts = allocate(amount, [b.balance for b in wallet_buckets])
        legs = [(b, -p) for b, p in zip(wallet_buckets, parts, strict=True) if p]
        legs.append((revenue, amount))
        legs_by_wallet[wallet_id] = legs
        txn_rows.append([uuid.uuid4(), TransactionKind.USAGE.value, wallet_id, memo, now])
    txn_ids = _insert_rows(
        LedgerTransaction, ["public_id", "kind", "wallet", "memo", "created_at"], txn_rows, True
    )
    txn_of = dict(zip([r[2] for r in txn_rows], txn_ids, strict=True))
    entry_rows: list[list[Any]] = []
    for wallet_id, legs in legs_by_wallet.items():
        for bucket, amount in legs:
            entry_rows.append([txn_of[wallet_id], bucket.pk, amount])
            bucket.balance += amount
    _insert_rows(Entry, ["transaction", "account", "amount"], entry_rows)
    _insert_rows(
        UsageCharge,
        ["session", "transaction", "from_second", "to_second", "amount"],
        [
            [s.pk, txn_of[s.wallet_id], s.settled_seconds, until, delta]
            for s, until, delta in charges
            if delta
        ],
    )
    # 6. the low-balance decision per wallet, on the balances after this settlement
    notices: list[BillingNotice] = []
    warned_updates: dict[int, list[int]] = {}
    stop_now: dict[int, str] = dict(close)
    by_wallet: dict[int, list[_Open]] = defaultdict(list)
    for session in sessions:
        if session.pk not in close:
            by_wallet[session.wallet_id].append(session)
    window = settlement_window()
    thresholds = low_balance_thresholds()
    for wallet_id, wallet_sessions in by_wallet.items():
        spendable = sum((b.balance for b in buckets[wallet_id]), ZERO)
        # Disks are kept when money runs out; their burn is reserved before GPUs are weighed.
        disk_burn = sum((s.burn_per_hour for s in wallet_sessions if s.meter != Meter.GPU), ZERO)
        if disk_burn:
            spendable -= lowbalance.window_cost(disk_burn, window)
        burn = sum((s.burn_per_hour for s in wallet_sessions), ZERO)
        warned = set(locked[wallet_id] or ())
        # Fast path for the common case: far from every threshold, nothing warned yet.
        if not warned and spendable * 3600 >= burn * max(max(thresholds, default=0), window):
            continue
        decision = lowbalance.decide(
            spendable,
            [
                lowbalance.MeteredSession(s.pk, s.burn_per_hour, int(s.started_at.timestamp()))
                for s in wallet_sessions
                if s.meter == Meter.GPU
            ],
            window,
            thresholds,
            warned,
        )
        if decision.warn or decision.rearm:
            warned_updates[wallet_id] = sorted((warned | set(decision.warn)) - set(decision.rearm))
        for threshold in decision.warn:
            notices.append(
                BillingNotice(
                    wallet_id=wallet_id,
                    kind=NoticeKind.LOW_BALANCE,
                    threshold_seconds=threshold,
                    message=_(
                        "Low balance: about %(minutes)d minutes left at %(burn)s 元/h. "
                        "Top up to keep your instances running."
                    )
                    % {
                        "minutes": (decision.runway_seconds or 0) // 60,
                        "burn": round_cents(decision.burn_per_hour),
                    },
                    created_at=now,
                )
            )
        # The session keys handed to the decision are UsageSession primary keys.
        stopped_ids = [cast(int, key) for key in decision.stop]
        for key in stopped_ids:
            stop_now[key] = CloseReason.INSUFFICIENT_FUNDS
        if decision.stop:
            notices.append(
                BillingNotice(
                    wallet_id=wallet_id,
                    kind=NoticeKind.STOPPED,
                    message=_(
                        "Your balance cannot cover the next minute of usage: %(n)d instance(s) "
                        "were stopped. Disks and files are kept."
                    )
                    % {"n": len(decision.stop)},
                    created_at=now,
                )
            )
            result.stopped.extend(stopped_ids)
    # 7. write back: balances, sessions, notices
    moved = {b.pk: b for legs in legs_by_wallet.values() for b, _amount in legs}
    _bulk_set(Account, ["balance"], [(pk, [b.balance]) for pk, b in moved.items()])
    # Most rows only advance; closing rows also change state (a second statement, only then).
    advancing: list[tuple[int, list]] = []
    closing: list[tuple[int, list]] = []
    for session, until, delta in charges:
        if session.pk in stop_now:
            closing.append(
                (
                    session.pk,
                    [
                        until,
                        session.charged + delta,
                        now,
                        UsageState.CLOSED.value,
                        now,
                        stop_now[session.pk],
                    ],
                )
            )
        elif until != session.settled_seconds:  # a replay at the same second changes nothing
            advancing.append((session.pk, [until, session.charged + delta, now]))
    _bulk_set(UsageSession, ["settled_seconds", "charged", "settled_at"], advancing)
    _bulk_set(
        UsageSession,
        ["settled_seconds", "charged", "settled_at", "state", "ended_at", "close_reason"],
        closing,
    )
    if notices:
        BillingNotice.objects.bulk_create(notices)
    if warned_updates:
        Wallet.objects.bulk_update(
            [Wallet(pk=pk, warned_thresholds=w) for pk, w in warned_updates.items()],
            ["warned_thresholds"],
        )
    # 8. after commit: ask slices to release what was stopped for lack of funds, tell the users
    stopped = set(result.stopped)
    stopped_refs = [(s.resource_kind, s.resource_id) for s in sessions if s.pk in stopped]
    if stopped_refs:
        transaction.on_commit(lambda: _request_stops(stopped_refs))
    if notices:
        _notify_on_commit(notices)
    result.sessions = len(sessions)
    result.charged = sum(owed.values(), ZERO)
    result.transactions = len(txn_rows)
    result.warnings = sum(1 for n in notices if n.kind == NoticeKind.LOW_BALANCE)
    return result


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
        try:
            from console.events import notify_user
        except ImportError:  # pragma: no cover - the shell always provides it
            return
        for public_id, kind, message in messages:
            try:
                notify_user(public_id, f"billing.{kind}", {"message": message})
            except Exception:  # a dropped toast must not undo a settlement
                logger.exception("could not notify %s", public_id)

    transaction.on_commit(send)


# Bulk statements. Identifiers come from model metadata and every value is a parameter, so the
# f-strings below carry no user input (hence the S608 waivers).
_SQLITE_MAX_PARAMS = 30000  # SQLite >= 3.32 allows 32,766; Django itself assumes 999


def _pg_array_type(field: models.Field) -> str:
    return f"{field.db_type(connection)}[]"


def _pg_array(values: list[Any]) -> str:
    """A PostgreSQL array literal (``{1,"a b",NULL}``), cast by the statement to the column type.

    Much cheaper than letting the driver adapt 10,000 Python objects one by one; every element
    is quoted and escaped, so text is safe.
    """
    parts = []
    for v in values:
        if v is None:
            parts.append("NULL")
        elif isinstance(v, int | Decimal):
            parts.append(str(v))
        else:
            text = v.isoformat() if isinstance(v, datetime) else str(v)
            parts.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(parts) + "}"


def _insert_rows(
    model: type[models.Model], names: list[str], rows: list[list[Any]], returning: bool = False
) -> list[int]:
    """``INSERT`` many rows in one statement; returns their ids (in row order) when asked.

    PostgreSQL: ``INSERT … SELECT * FROM unnest(%s::type[], …)`` — one parameter per column,
    whatever the number of rows. SQLite: multi-row VALUES, split at its parameter limit; ids come
    back through ``RETURNING id, public_id`` and are matched on public_id (order is not promised).
    """
    if not rows:
        return []
    fields = [cast(models.Field, model._meta.get_field(n)) for n in names]
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    columns = ", ".join(qn(cast(str, f.column)) for f in fields)
    ids: list[int] = []
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            arrays = ", ".join(f"%s::{_pg_array_type(f)}" for f in fields)
            sql = f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({arrays})"  # noqa: S608
            if returning:
                sql += " RETURNING id, public_id"
            cursor.execute(sql, [_pg_array([r[i] for r in rows]) for i in range(len(fields))])
            if not returning:
                return []
            # RETURNING promises no order: match the new ids on public_id (the first column).
            pk_of = {public_id: pk for pk, public_id in cursor.fetchall()}
            return [pk_of[r[0]] for r in rows]
        chunk = max(1, _SQLITE_MAX_PARAMS // len(fields))
        row_sql = "(" + ", ".join(["%s"] * len(fields)) + ")"
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            params = [
                f.get_db_prep_save(v, connection)
                for r in part
                for f, v in zip(fields, r, strict=True)
            ]
            sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([row_sql] * len(part))}"  # noqa: S608
            if returning:
                sql += " RETURNING id, public_id"
            cursor.execute(sql, params)
            if returning:
                pk_of = {str(public_id).replace("-", ""): pk for pk, public_id in cursor.fetchall()}
                ids.extend(pk_of[r[0].hex] for r in part)
    return ids


def _bulk_set(model: type[models.Model], columns: list[str], rows: list[tuple[int, list]]) -> None:
    """``UPDATE t SET col = v.col … FROM (…) v WHERE t.id = v.id`` in one statement.

    Django's ``bulk_update`` builds one CASE per column, whose cost grows with rows × rows on
    PostgreSQL; a join is linear. PostgreSQL: ``unnest`` of one array per column. SQLite: a
    VALUES list (values prepared by each field), split at its parameter limit.
    """
    if not rows:
        return
    fields = [cast(models.Field, model._meta.get_field(c)) for c in columns]
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            names = ", ".join(["id", *[f"c{i}" for i in range(len(fields))]])
            arrays = ", ".join(["%s::bigint[]", *[f"%s::{_pg_array_type(f)}" for f in fields]])
            sets = ", ".join(f"{qn(cast(str, f.column))} = v.c{i}" for i, f in enumerate(fields))
            sql = f"UPDATE {table} AS t SET {sets} FROM unnest({arrays}) AS v({names}) WHERE t.id = v.id"  # noqa: S608
            arrays_params = [_pg_array([pk for pk, _v in rows])]
            arrays_params += [
                _pg_array([values[i] for _pk, values in rows]) for i in range(len(fields))
            ]
            cursor.execute(sql, arrays_params)
            return
        width = len(fields) + 1
        chunk = max(1, _SQLITE_MAX_PARAMS // width)
        sets = ", ".join(
            f"{qn(cast(str, f.column))} = v.column{i + 2}" for i, f in enumerate(fields)
        )
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            params: list[Any] = []
            for pk, values in part:
                params.append(pk)
                params.extend(
                    f.get_db_prep_save(v, connection) for f, v in zip(fields, values, strict=True)
                )
            placeholders = ", ".join(["(" + ", ".join(["%s"] * width) + ")"] * len(part))
            sql = f"UPDATE {table} SET {sets} FROM (VALUES {placeholders}) AS v WHERE {table}.id = v.column1"  # noqa: S608
            cursor.execute(sql, params)


def settle_session_alone(session_id: int, now: datetime | None = None) -> Decimal:
    """The naive per-session settlement (one lock, reads and writes per session).

    Kept as the benchmark's baseline (bench/billing.py); production uses ``settle_usage``.
    """
    now = now or clock.now()
    with transaction.atomic():
        session = UsageSession.objects.get(pk=session_id)
        Wallet.objects.select_for_update().get(pk=session.wallet_id)
        session.refresh_from_db()
        if session.state != UsageState.OPEN:
            return ZERO
        until = max(int((now - session.started_at).total_seconds()), session.settled_seconds)
        delta = settlement_delta(
            session.rate, session.cards, session.settled_seconds, until, session.per_seconds
        )
        if delta:
            buckets = _spendable_buckets(session.wallet, now)
            legs = _spend_legs(buckets, delta)
            legs.append((_system_account(AccountKind.USAGE_REVENUE), delta))
            txn = _post(TransactionKind.USAGE, legs, wallet=session.wallet, at=now)
            UsageCharge.objects.create(
                session=session,
                transaction=txn,
                from_second=session.settled_seconds,
                to_second=until,
                amount=delta,
            )
        UsageSession.objects.filter(pk=session.pk).update(
            settled_seconds=until, charged=session.charged + delta, settled_at=now
        )
        return delta


# --- long-term rental ----------------------------------------------------------------------------
@transaction.atomic
def purchase_term(
    user: Any,
    *,
    gpu_model: str,
    cards: int,
    days: int,
    resource_kind: str,
    resource_id: str,
    label: str = "",
) -> TermRental:
    """Pay a long-term rental up front at the term's price, locked for the whole term.

    Raises ``InsufficientFunds`` when the spendable balance cannot cover it (nothing is charged).
    The ordering app then runs the resource without an on-demand usage session for the term.
    """
    if int(cards) < 1 or int(days) < 1:
        raise BillingError(gettext_noop("A rental needs at least one card and one day."))
    now = clock.now()
    book = current_price_book(now)
    term = book.term_prices.filter(gpu_model=gpu_model, days=days).first() if book else None
    if book is None or term is None:
        raise PriceNotSet(
            gettext_noop("No %(days)d-day price is set for %(model)s."), days=days, model=gpu_model
        )
    total = round_cents(term.rate_per_card_hour * cards * days * 24)
    wallet = _lock_wallet(user)
    buckets = _spendable_buckets(wallet, now)
    if sum((b.balance for b in buckets), ZERO) < total:
        raise InsufficientFunds(
            gettext_noop("This term costs %(total)s 元; please top up first."), total=total
        )
    legs = _spend_legs(buckets, total)
    legs.append((_system_account(AccountKind.USAGE_REVENUE), total))
    txn = _post(
        TransactionKind.TERM_PURCHASE,
        legs,
        wallet=wallet,
        memo=_("%(days)d-day rental of %(cards)d × %(model)s at %(rate)s 元/card-h")
        % {"days": days, "cards": cards, "model": gpu_model, "rate": term.rate_per_card_hour},
    )
    return TermRental.objects.create(
        wallet=wallet,
        resource_kind=resource_kind,
        resource_id=str(resource_id),
        label=label,
        gpu_model=gpu_model,
        cards=cards,
        days=days,
        rate=term.rate_per_card_hour,
        total=total,
        price_book=book,
        starts_at=now,
        ends_at=now + timedelta(days=days),
        transaction=txn,
    )


# --- top-ups -------------------------------------------------------------------------------------
def _fingerprint(**fields: Any) -> str:
    text = "|".join(f"{k}={fields[k]}" for k in sorted(fields))
    return hashlib.sha256(text.encode()).hexdigest()


def validate_topup_amount(amount: Any) -> Decimal:
    try:
        value = to_decimal(str(amount).strip())
    except Exception as exc:
        raise BillingError(gettext_noop("Enter an amount in 元, e.g. 100 or 99.50.")) from exc
    if (
        not value.is_finite()
        or value != value.quantize(Decimal("0.01"))
        or not (MIN_TOPUP <= value <= MAX_TOPUP)
    ):
        raise BillingError(
            gettext_noop("A top-up is between %(min)s and %(max)s 元, in whole cents."),
            min=MIN_TOPUP,
            max=MAX_TOPUP,
        )
    return round_cents(value)


@transaction.atomic
def start_topup(
    user: Any, amount: Any, *, provider: str = "sandbox", idempotency_key: str | None = None
) -> tuple[Payment, bool]:
    """Create a pending top-up; returns (payment, created).

    With an ``Idempotency-Key``: the same key and amount return the same payment (created=False);
    the same key with another amount raises ``IdempotencyMismatch``.
    """
    value = validate_topup_amount(amount)
    from billing.providers import get_provider

    get_provider(provider)  # unknown providers fail before anything is stored
    wallet = get_or_create_wallet(user)
    fingerprint = _fingerprint(amount=value, provider=provider)
    if idempotency_key:
        existing = Payment.objects.filter(wallet=wallet, idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.request_fingerprint != fingerprint:
                raise IdempotencyMismatch(
                    gettext_noop("This Idempotency-Key was used for another request.")
                )
            return existing, False
    try:
        with transaction.atomic():
            payment = Payment.objects.create(
                wallet=wallet,
                provider=provider,
                amount=value,
                idempotency_key=idempotency_key or None,
                request_fingerprint=fingerprint,
                created_at=clock.now(),
            )
    except IntegrityError:  # the same key raced in from a concurrent request
        existing = Payment.objects.get(wallet=wallet, idempotency_key=idempotency_key)
        if existing.request_fingerprint != fingerprint:
            raise IdempotencyMismatch(
                gettext_noop("This Idempotency-Key was used for another request.")
            ) from None
        return existing, False
    return payment, True


def current_bonus_rule() -> TopUpBonusRule | None:
    return TopUpBonusRule.objects.filter(active=True).first()


@transaction.atomic
def confirm_payment(
    payment_public_id: str, *, provider: str, provider_txn_id: str, amount: Decimal
) -> bool:
    """Credit a top-up the provider confirmed. Returns whether this call credited it.

    Idempotent: the payment moves PENDING (or FAILED) → SUCCEEDED by compare-and-set under the
    wallet lock, so a replayed or concurrent callback credits nothing more; ``provider_txn_id`` is
    unique. A top-up at or above the bonus rule's threshold earns a voucher in the same ledger
    transaction.
    """
    payment = Payment.objects.filter(public_id=payment_public_id, provider=provider).first()
    if payment is None:
        raise InvalidWebhook(gettext_noop("Unknown payment."))
    if round_cents(to_decimal(amount)) != payment.amount:
        raise InvalidWebhook(gettext_noop("The paid amount does not match the payment."))
    wallet = Wallet.objects.select_for_update().get(pk=payment.wallet_id)
    now = clock.now()
    # FAILED → SUCCEEDED too: the provider captured the money after a failure was recorded (a
    # late success callback), so it is credited — once, as SUCCEEDED is final.
    won = (
        Payment.objects.filter(
            pk=payment.pk, state__in=(PaymentState.PENDING, PaymentState.FAILED)
        ).update(state=PaymentState.SUCCEEDED, provider_txn_id=provider_txn_id, paid_at=now)
        == 1
    )
    if not won:  # already credited (replay, concurrent callback, or a second "pay" click)
        return False
    legs: list[tuple[Account, Decimal]] = [
        (_bucket(wallet, AccountKind.CASH), payment.amount),
        (_system_account(AccountKind.PAYMENTS), -payment.amount),
    ]
    memo = _("Top-up via %(provider)s") % {"provider": provider}
    rule = current_bonus_rule()
    if rule and payment.amount >= rule.threshold:
        bonus = percent_of(payment.amount, rule.percent)
        if bonus > 0:
            reason = _("%(percent)s %% voucher for a top-up of %(amount)s 元") % {
                "percent": rule.percent.normalize(),
                "amount": payment.amount,
            }
            voucher = _new_voucher(
                wallet, bonus, now + timedelta(days=rule.voucher_valid_days), reason
            )
            legs += [(voucher, bonus), (_system_account(AccountKind.PROMOTIONS), -bonus)]
            memo = f"{memo}; {reason}"
    txn = _post(
        TransactionKind.TOPUP,
        legs,
        wallet=wallet,
        memo=memo,
        key=f"payment:{provider}:{provider_txn_id}",
        at=now,
    )
    # Low-balance warnings re-arm at the next settlement if the runway is back above them
    # (billing/lowbalance.py), so a top-up too small to matter does not warn twice.
    Payment.objects.filter(pk=payment.pk).update(transaction=txn)
    return True


@transaction.atomic
def fail_payment(payment_public_id: str, *, provider: str) -> bool:
    return (
        Payment.objects.filter(
            public_id=payment_public_id, provider=provider, state=PaymentState.PENDING
        ).update(state=PaymentState.FAILED)
        == 1
    )


def handle_webhook(provider_name: str, body: bytes, headers: dict[str, str]) -> bool:
    """Verify a provider's callback and apply it. Raises ``InvalidWebhook`` on a bad signature."""
    from billing.providers import get_provider

    event = get_provider(provider_name).parse_webhook(body, headers)
    if event.status != "succeeded":
        return fail_payment(event.payment_id, provider=provider_name)
    try:
        return confirm_payment(
            event.payment_id,
            provider=provider_name,
            provider_txn_id=event.provider_txn_id,
            amount=event.amount,
        )
    except IntegrityError:  # the provider's transaction id already paid another payment
        raise InvalidWebhook(gettext_noop("This provider transaction was already used.")) from None


# --- lookups for views -------------------------------------------------------------------------
def get_payment_for_user(user: Any, public_id: Any) -> Payment:
    from django.shortcuts import get_object_or_404

    return get_object_or_404(Payment, public_id=public_id, wallet__owner=user)


def ledger_totals() -> dict[str, Decimal]:
    """Sum of every account by kind (the whole ledger sums to zero)."""
    return {
        row["kind"]: round_cents(row["total"] or ZERO)  # SQLite sums in floating point
        for row in Account.objects.values("kind").annotate(total=Sum("balance"))
    }


@transaction.atomic
def copy_price_book(book: PriceBook, effective_at: datetime | None = None) -> PriceBook:
    """A new price-book version with ``book``'s prices, effective in one hour unless told.

    The operator edits it until it takes effect; versions in effect are never edited.
    """
    latest = PriceBook.objects.select_for_update().order_by("-version").first()
    copy = PriceBook.objects.create(
        version=(latest.version if latest else 0) + 1,
        effective_at=effective_at or clock.now() + timedelta(hours=1),
        note=f"copy of v{book.version}",
        storage_per_gb_day=book.storage_per_gb_day,
        storage_free_gb=book.storage_free_gb,
    )
    GpuPrice.objects.bulk_create(
        [
            GpuPrice(
                price_book=copy,
                gpu_model=p.gpu_model,
                on_demand_per_card_hour=p.on_demand_per_card_hour,
                is_placeholder=p.is_placeholder,
            )
            for p in book.gpu_prices.all()
        ]
    )
    TermPrice.objects.bulk_create(
        [
            TermPrice(
                price_book=copy,
                gpu_model=t.gpu_model,
                days=t.days,
                rate_per_card_hour=t.rate_per_card_hour,
            )
            for t in book.term_prices.all()
        ]
    )
    return copy


def reconcile(wallet: Wallet | None = None) -> list[str]:
    """Check the books; returns a list of problems (empty when everything reconciles).

    * every session's total is rate × seconds under the rounding rule and equals its usage
      postings (``UsageCharge`` rows);
    * every ledger transaction sums to zero and every cached balance equals its entries;
    * every paid top-up has exactly one ledger transaction, every pending/failed one none.
    Sums are taken in Python (SQLite's SUM is floating point). Meant for a periodic audit task
    and the tests; it reads everything of ``wallet`` (or all wallets).
    """
    problems: list[str] = []
    sessions = UsageSession.objects.all() if wallet is None else wallet.usage_sessions.all()
    posted: dict[int, Decimal] = defaultdict(lambda: ZERO)
    for session_id, amount in UsageCharge.objects.filter(session__in=sessions).values_list(
        "session_id", "amount"
    ):
        posted[session_id] += amount
    for s in sessions:
        expected = charge_for(s.rate, s.cards, s.settled_seconds, s.per_seconds)
        if s.charged != expected or posted[s.pk] != expected:
            problems.append(
                f"session {s.public_id}: charged {s.charged}, posted {posted[s.pk]}, "
                f"rate × seconds {expected}"
            )
    entries = (
        Entry.objects.all() if wallet is None else Entry.objects.filter(account__wallet=wallet)
    )
    by_txn: dict[int, Decimal] = defaultdict(lambda: ZERO)
    by_account: dict[int, Decimal] = defaultdict(lambda: ZERO)
    for txn_id, account_id, amount in entries.values_list("transaction", "account", "amount"):
        by_txn[txn_id] += amount
        by_account[account_id] += amount
    if wallet is None:
        problems += [f"transaction {pk} sums to {total}" for pk, total in by_txn.items() if total]
    accounts = Account.objects.all() if wallet is None else wallet.accounts.all()
    problems += [
        f"account {a.public_id} caches {a.balance}, entries sum to {by_account[a.pk]}"
        for a in accounts
        if a.balance != by_account[a.pk]
    ]
    payments = Payment.objects.all() if wallet is None else wallet.payments.all()
    for p in payments:
        if (p.state == PaymentState.SUCCEEDED) != (p.transaction_id is not None):
            problems.append(f"payment {p.public_id} ({p.state}) has transaction {p.transaction_id}")
    return problems
