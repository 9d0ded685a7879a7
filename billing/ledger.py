"""The ledger: wallets and their accounts, the wallet lock, posting, the spending order, totals.

Every writer takes the customer's ``Wallet`` row lock first (``lock_wallet``; several wallets always
in ascending id order), then reads and writes that wallet's accounts, then the operator's system
accounts. ``post`` writes one balanced transaction and moves the cached balances with it. The
spending order (vouchers expiring first, then the trial credit, cash last) is written once, here,
and used by every charge: settlement, long-term rentals.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django.db import IntegrityError, models, transaction
from django.db.models import Sum
from django.db.models.functions import Round

from billing import clock
from billing.choices import AccountKind, MemoCode, PaymentState, TransactionKind
from billing.models import (
    Account,
    Entry,
    LedgerTransaction,
    Payment,
    UsageCharge,
    UsageSession,
    Wallet,
)
from billing.money import ZERO, allocate, charge_for, round_cents
from billing.pricing import runway_seconds
from console.tenancy import team_of

if TYPE_CHECKING:
    from console.models import User


# --- wallets and accounts ------------------------------------------------------------------------
def get_or_create_wallet(who: Any) -> Wallet:
    """The team's wallet (``who``: an Acting, a team, or a user for their personal team), with
    its cash and trial accounts (created on first use)."""
    team = team_of(who)
    wallet = Wallet.objects.filter(team=team).first()
    if wallet is not None:
        return wallet
    try:
        with transaction.atomic():
            wallet = Wallet.objects.create(team=team)
            Account.objects.bulk_create(
                [
                    Account(wallet=wallet, kind=AccountKind.CASH),
                    Account(wallet=wallet, kind=AccountKind.TRIAL),
                ]
            )
            return wallet
    except IntegrityError:  # another request created it first
        return Wallet.objects.get(team=team)


def lock_wallet(who: Any) -> Wallet:
    """The team's wallet, row-locked until the end of the transaction (the first lock taken)."""
    wallet = get_or_create_wallet(who)
    return Wallet.objects.select_for_update().get(pk=wallet.pk)


def system_account(kind: AccountKind) -> Account:
    """The operator's account of ``kind`` (revenue, payments, promotions, …), created on first use."""
    account = Account.objects.filter(wallet__isnull=True, kind=kind).first()
    if account is not None:
        return account
    try:
        with transaction.atomic():
            return Account.objects.create(wallet=None, kind=kind)
    except IntegrityError:
        return Account.objects.get(wallet__isnull=True, kind=kind)


def wallet_account(wallet: Wallet, kind: AccountKind) -> Account:
    """The wallet's cash or trial account."""
    return Account.objects.get(wallet=wallet, kind=kind)


def new_voucher(wallet: Wallet, amount: Decimal, expires_at: datetime, reason: str) -> Account:
    """A voucher account (empty: the grant's posting credits it)."""
    return Account.objects.create(
        wallet=wallet,
        kind=AccountKind.VOUCHER,
        granted_amount=amount,
        expires_at=expires_at,
        reason=reason[:200],
    )


# --- posting -------------------------------------------------------------------------------------
def post(
    kind: TransactionKind,
    legs: Sequence[tuple[Account, Decimal]],
    *,
    wallet: Wallet | None,
    memo: str = "",
    code: MemoCode | None = None,
    params: dict[str, Any] | None = None,
    key: str | None = None,
    by: User | None = None,
    at: datetime | None = None,
    reverses: LedgerTransaction | None = None,
) -> LedgerTransaction:
    """Post one balanced transaction and move the cached balances with it.

    The description is a ``MemoCode`` with its parameters (rendered in the reader's language),
    or ``memo``, free text an operator typed (a voucher's or a refund's reason).
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
        memo_code=code or "",
        memo_params=params or {},
        idempotency_key=key,
        created_by=by if getattr(by, "pk", None) else None,
        created_at=at or clock.now(),
        reverses=reverses,
    )
    Entry.objects.bulk_create([Entry(transaction=txn, account=a, amount=x) for a, x in legs])
    for account, amount in sorted(legs, key=lambda leg: leg[0].pk):
        # Rounded to the cent in SQL: SQLite adds NUMERIC in floating point, and a voucher spent
        # down to 13.599999999999994 could never be spent to 0 (its CHECK balance >= 0 failed).
        Account.objects.filter(pk=account.pk).update(balance=Round(models.F("balance") + amount, 2))
    return txn


# --- the spending order --------------------------------------------------------------------------
SPENDING_ORDER = (AccountKind.VOUCHER, AccountKind.TRIAL, AccountKind.CASH)


class Spendable(Protocol):
    """An account as a charge sees it: a model instance, or a plain row in the bulk settlement."""

    @property
    def pk(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def balance(self) -> Decimal: ...

    @property
    def expires_at(self) -> datetime | None: ...


S = TypeVar("S", bound=Spendable)


def spend_order(account: Spendable) -> tuple[int, float, int]:
    """Sort key: vouchers first (the soonest expiring first), then the trial credit, cash last."""
    expiry = account.expires_at.timestamp() if account.expires_at else float("inf")
    return (SPENDING_ORDER.index(AccountKind(account.kind)), expiry, account.pk)


def spendable_accounts(wallet: Wallet, at: datetime) -> list[Account]:
    """The wallet's accounts that can pay at ``at``, in spending order."""
    return sorted(Account.objects.filter(wallet=wallet).spendable(at), key=spend_order)


def spending_legs(buckets: Sequence[S], amount: Decimal, to: S) -> list[tuple[S, Decimal]]:
    """The legs of a charge of ``amount`` paid to ``to``: taken from ``buckets`` in their order.

    ``buckets`` are in spending order; each gives what it has until the amount is covered (the
    last one may go negative: usage already consumed is charged even when the balance ran out).
    """
    parts = allocate(amount, [b.balance for b in buckets])
    legs = [(b, -p) for b, p in zip(buckets, parts, strict=True) if p]
    legs.append((to, amount))
    return legs


# --- totals --------------------------------------------------------------------------------------
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


def get_wallet_summary(who: Any) -> WalletSummary:
    """Balances by kind (Decimal 元), burn rate and runway; zeros for an anonymous caller."""
    if not getattr(who, "is_authenticated", True):
        return WalletSummary()
    team = team_of(who)
    return summarize(
        Account.objects.filter(wallet__team=team).spendable(clock.now()),
        UsageSession.objects.filter(wallet__team=team).open().only("rate", "cards", "meter"),
    )


def summarize(spendable: Iterable[Account], open_sessions: Iterable[UsageSession]) -> WalletSummary:
    """The summary of a wallet from its spendable accounts and its open sessions (however they
    were read: ``get_wallet_summary`` here, the wallet API with SQL built once)."""
    cash = trial = vouchers = ZERO
    next_expiry: datetime | None = None
    for account in spendable:
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
    count = 0
    for session in open_sessions:
        burn += session.burn_per_hour
        count += 1
    return WalletSummary(cash, trial, vouchers, burn, next_expiry, count)


def ledger_totals() -> dict[str, Decimal]:
    """Sum of every account by kind (the whole ledger sums to zero)."""
    return {
        row["kind"]: round_cents(row["total"] or ZERO)  # SQLite sums in floating point
        for row in Account.objects.values("kind").annotate(total=Sum("balance"))
    }


# --- reconcile -----------------------------------------------------------------------------------
def reconcile(wallet: Wallet | None = None) -> list[str]:
    """Check the books; returns a list of problems (empty when everything reconciles).

    * every session's total is rate × seconds under the rounding rule and equals its usage
      postings (``UsageCharge`` rows);
    * every ledger transaction sums to zero and every cached balance equals its entries;
    * every paid top-up has exactly one ledger transaction, every pending/failed one none.
    Sums are taken in Python (SQLite's SUM is floating point). Meant for a periodic audit task
    and the tests; it reads everything of ``wallet`` (or all wallets).
    """
    return _session_problems(wallet) + _entry_problems(wallet) + _payment_problems(wallet)


def _session_problems(wallet: Wallet | None) -> list[str]:
    sessions = UsageSession.objects.all() if wallet is None else wallet.usage_sessions.all()
    posted: dict[int, Decimal] = defaultdict(lambda: ZERO)
    for session_id, amount in UsageCharge.objects.filter(session__in=sessions).values_list(
        "session_id", "amount"
    ):
        posted[session_id] += amount
    problems = []
    for s in sessions:
        expected = charge_for(s.rate, s.cards, s.settled_seconds, s.per_seconds)
        if s.charged != expected or posted[s.pk] != expected:
            problems.append(
                f"session {s.public_id}: charged {s.charged}, posted {posted[s.pk]}, "
                f"rate × seconds {expected}"
            )
    return problems


def _entry_problems(wallet: Wallet | None) -> list[str]:
    entries = (
        Entry.objects.all() if wallet is None else Entry.objects.filter(account__wallet=wallet)
    )
    by_txn: dict[int, Decimal] = defaultdict(lambda: ZERO)
    by_account: dict[int, Decimal] = defaultdict(lambda: ZERO)
    for txn_id, account_id, amount in entries.values_list("transaction", "account", "amount"):
        by_txn[txn_id] += amount
        by_account[account_id] += amount
    problems = []
    if wallet is None:
        problems += [f"transaction {pk} sums to {total}" for pk, total in by_txn.items() if total]
    accounts = Account.objects.all() if wallet is None else wallet.accounts.all()
    problems += [
        f"account {a.public_id} caches {a.balance}, entries sum to {by_account[a.pk]}"
        for a in accounts
        if a.balance != by_account[a.pk]
    ]
    return problems


def _payment_problems(wallet: Wallet | None) -> list[str]:
    payments = Payment.objects.all() if wallet is None else wallet.payments.all()
    return [
        f"payment {p.public_id} ({p.state}) has transaction {p.transaction_id}"
        for p in payments
        if (p.state == PaymentState.SUCCEEDED) != (p.transaction_id is not None)
    ]
