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
  price book and the user's balance (order forms, API).
* ``ensure_affordable(user, gpu_model, cards, *, term_days=None, release_in_seconds=None,
  committed=()) -> Quote`` — the one affordability rule of orders and starts: the balance must run
  the account's whole burn (``account_burn``: its open sessions, the commitments (``Commitment``)
  the caller made that billing does not meter yet, and this order) for
  ``ORDER_MIN_RUNWAY_SECONDS``, a term paid in full on top; raises ``InsufficientFunds``. The
  caller holds its account's order lock.
* ``ensure_member_within_budget(who, gpu_model, cards, *, term_days=None, release_in_seconds=None,
  committed=(), storage_per_day=None)`` — a team member's monthly budget (issue 30): what they
  spent this month (``member_month_spend``: their lines of the bill), the runway of what they run
  and this order must fit it; raises ``BudgetExceeded`` (402). Takes the team's lock; the caller
  holds its order lock. ``member_limits(who)`` is their membership (budget, card quota, stop on
  exhaustion); every usage session and term records its member (``member_id_of(who)``: the
  acting user, for ``for_row(row)`` the row's maker; nobody for a team's shared storage).
* ``ensure_storage_affordable(user, stored_gb, added_gb)`` — the same for storage: a new or grown
  disk beyond the free allowance needs its first day in the balance. ``storage_price()`` is the
  price book's storage price (per GB a day, the free GB).
* ``costs_so_far(resource_kind, resource_ids) -> {id: Decimal}`` — what each resource cost so
  far (its sessions' charges, the open one to this second, and terms paid up front).
* ``purchase_term(user, *, gpu_model, cards, days, resource_kind, resource_id, label="")`` — a
  long-term rental paid up front at the locked price.
* The **stop hook**: when the balance cannot cover the next settlement window, billing closes the
  sessions that must stop and, on commit, calls the stop handler once per session with
  ``(resource_kind, resource_id, reason)``. The slices app installs it with
  ``register_stop_handler(fn)`` (e.g. in its ``AppConfig.ready``) or names it in the setting
  ``BILLING_STOP_HANDLER = "slices.services.stop_for_billing"``. It must release the resource
  (keeping disks and files) and must not raise; without a handler, stops are only logged.

The stop hook and the bulk settlement live in ``billing/settlement.py``, wallets, posting, the
spending order and the books' checks in ``billing/ledger.py``, the errors in ``billing/errors.py``;
the names other apps use are re-exported here, so they import ``billing.services`` only.

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
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_UP, Decimal
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.conf import settings
from django.db import IntegrityError, transaction
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from billing import budgets, clock
from billing.choices import (
    AccountKind,
    CloseReason,
    MemoCode,
    Meter,
    PaymentState,
    TransactionKind,
    UsageState,
)
from billing.errors import (
    BillingError,
    BudgetExceeded,
    IdempotencyMismatch,
    InsufficientFunds,
    InvalidWebhook,
    PriceNotSet,
)
from billing.invoicing import services as invoicing
from billing.ledger import (
    WalletSummary,
    get_or_create_wallet,
    get_wallet_summary,
    ledger_totals,
    lock_wallet,
    new_voucher,
    post,
    reconcile,
    spendable_accounts,
    spending_legs,
    system_account,
    wallet_account,
)
from billing.models import (
    Account,
    GpuPrice,
    LedgerTransaction,
    Payment,
    PriceBook,
    TermPrice,
    TermRental,
    TopUpBonusRule,
    UsageSession,
    Wallet,
    gpu_price_quote,
)
from billing.money import (
    CENT,
    SECONDS_PER_HOUR,
    ZERO,
    allocate,
    charge_for,
    percent_of,
    round_cents,
    to_decimal,
)
from billing.pricing import (
    APP_LAUNCH_MIN_SECONDS,
    Quote,
    StoragePrice,
    covers_app_launch,
    gpu_model_key,
    most_charged,
    quote_order,
    reservation_refund_share,
    window_rate,
    window_total,
)
from billing.providers import get_provider
from billing.settlement import (
    SettlementResult,
    StopHandler,
    get_stop_handler,
    register_stop_handler,
    settle_usage,
    settlement_window,
)
from billing.transfers import services as bank_transfers
from console.api.compiled import CompiledQuery, Many
from console.audit import services as audit
from console.errors import ErrorCode
from console.models import Membership, Team
from console.tenancy import team_of, user_of
from console.verification.services import require_verified

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser

    from console.models import User

__all__ = [  # what other apps, the views and the tests call
    "MAX_TOPUP",
    "MIN_TOPUP",
    "TRIAL_CREDIT",
    "AccountBurn",
    "Commitment",
    "BillingError",
    "BudgetExceeded",
    "IdempotencyMismatch",
    "InsufficientFunds",
    "InvalidWebhook",
    "PriceNotSet",
    "SettlementResult",
    "StopHandler",
    "WalletSummary",
    "account_burn",
    "close_usage_session",
    "confirm_payment",
    "copy_price_book",
    "costs_so_far",
    "current_bonus_rule",
    "current_gpu_price",
    "current_price_book",
    "ensure_affordable",
    "ensure_member_within_budget",
    "member_burn",
    "member_id_of",
    "member_limits",
    "member_month_spend",
    "expire_vouchers",
    "fail_payment",
    "get_open_session",
    "oldest_unsettled_at",
    "open_resource_ids",
    "get_or_create_wallet",
    "get_payment_for_user",
    "get_stop_handler",
    "get_wallet_summary",
    "gpu_model_key",
    "APP_LAUNCH_MIN_SECONDS",
    "covers_app_launch",
    "most_charged",
    "grant_trial_credit",
    "grant_voucher",
    "handle_webhook",
    "ledger_totals",
    "open_usage_session",
    "order_min_runway_seconds",
    "price_list",
    "purchase_term",
    "pay_reservation",
    "refund_reservation",
    "reservation_refund_share",
    "window_price",
    "WindowPrice",
    "quote_for",
    "storage_price",
    "StoragePrice",
    "ensure_storage_affordable",
    "reconcile",
    "refund_cash",
    "register_stop_handler",
    "reverse_transaction",
    "settle_usage",
    "settlement_window",
    "start_topup",
    "term_total",
    "validate_topup_amount",
]

logger = logging.getLogger(__name__)

TRIAL_CREDIT = Decimal("10.00")
MIN_TOPUP = Decimal("1.00")
MAX_TOPUP = Decimal("10000000.00")


# --- grants -----------------------------------------------------------------------------------------
@transaction.atomic
def grant_trial_credit(user: User) -> bool:
    """Grant the one-time 10.00 元 trial credit (体验金). Returns whether this call granted it.

    Idempotent: the grant's ledger key is unique per wallet, so repeated or concurrent calls (two
    verification links clicked at once) grant it once; the wallet lock makes the loser wait and
    see the winner's grant instead of failing.
    """
    wallet = lock_wallet(user)
    key = f"trial:{wallet.public_id}"
    if LedgerTransaction.objects.filter(idempotency_key=key).exists():
        return False
    try:
        with transaction.atomic():
            post(
                TransactionKind.TRIAL_GRANT,
                [
                    (wallet_account(wallet, AccountKind.TRIAL), TRIAL_CREDIT),
                    (system_account(AccountKind.PROMOTIONS), -TRIAL_CREDIT),
                ],
                wallet=wallet,
                code=MemoCode.TRIAL_CREDIT,
                key=key,
            )
    except IntegrityError:  # granted concurrently without the lock (SQLite) — once is enough
        return False
    audit.record(user, "wallet.trial", wallet, team=wallet.team, label=f"{TRIAL_CREDIT} 元", after={"amount": TRIAL_CREDIT})  # fmt: skip
    return True


@transaction.atomic
def grant_voucher(
    user: Any,  # an Acting, a team or a user (console.tenancy.team_of)
    amount: Decimal,
    *,
    reason: str,
    expires_at: datetime | None = None,
    valid_days: int = 90,
    by: User | None = None,
    key: str | None = None,
    request: Any = None,
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
    wallet = lock_wallet(user)
    voucher = new_voucher(wallet, amount, expires_at, reason)
    post(
        TransactionKind.VOUCHER_GRANT,
        [(voucher, amount), (system_account(AccountKind.PROMOTIONS), -amount)],
        wallet=wallet,
        memo=reason,
        key=key,
        by=by,
    )
    audit.record(by, "wallet.voucher", voucher, team=wallet.team, operator=bool(by and by.is_staff), label=reason, after={"amount": amount, "expires_at": expires_at}, request=request)  # fmt: skip
    return voucher


@transaction.atomic
def refund_cash(
    user: User, amount: Decimal, *, reason: str, by: User | None = None, request: Any = None
) -> LedgerTransaction:
    """Pay cash back to the customer (trial credit and vouchers are never refunded)."""
    amount = round_cents(to_decimal(amount))
    if amount <= 0 or not reason.strip():
        raise BillingError(gettext_noop("A refund needs a positive amount and a reason."))
    wallet = lock_wallet(user)
    cash = wallet_account(wallet, AccountKind.CASH)
    if cash.balance < amount:
        raise InsufficientFunds(gettext_noop("The cash balance is %(cash)s 元."), cash=cash.balance)
    invoicing.ensure_refundable(wallet, amount)  # invoiced cash: reverse the invoice first
    audit.record(by, "wallet.refund", wallet, team=wallet.team, operator=bool(by and by.is_staff), label=reason, before={"cash": cash.balance}, after={"cash": cash.balance - amount, "amount": amount}, request=request)  # fmt: skip
    return post(
        TransactionKind.REFUND,
        [(cash, -amount), (system_account(AccountKind.REFUNDS), amount)],
        wallet=wallet,
        memo=reason,
        by=by,
    )


@transaction.atomic
def reverse_transaction(
    txn: LedgerTransaction, *, reason: str, by: User | None = None, request: Any = None
) -> LedgerTransaction:
    """Correct a transaction with its mirror image (entries are never edited or deleted)."""
    if not reason.strip():
        raise BillingError(gettext_noop("A correction needs a reason."))
    if txn.wallet_id:
        locked = Wallet.objects.select_for_update().get(pk=txn.wallet_id)
        audit.record(by, "wallet.reversal", txn, team=locked.team, operator=bool(by and by.is_staff), label=reason, before={"kind": txn.kind, "amounts": [str(e.amount) for e in txn.entries.all()]}, request=request)  # fmt: skip
    if LedgerTransaction.objects.filter(reverses=txn).exists():
        raise BillingError(gettext_noop("This transaction was already reversed."))
    legs = [(e.account, -e.amount) for e in txn.entries.select_related("account")]
    try:
        with transaction.atomic():
            return post(
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
    sink = system_account(AccountKind.EXPIRED)
    count = 0
    # Read (and so re-checked) under the wallet locks: a concurrent run already wrote these off.
    for voucher in expired.select_related("wallet").order_by("wallet_id", "pk"):
        post(
            TransactionKind.VOUCHER_EXPIRY,
            [(voucher, -voucher.balance), (sink, voucher.balance)],
            wallet=voucher.wallet,
            code=MemoCode.VOUCHER_EXPIRED,
            params={"reason": voucher.reason},
            # Per run instant: a reversed expiry gives the voucher a balance to expire again.
            key=f"expiry:{voucher.public_id}:{int(now.timestamp())}",
            at=now,
        )
        count += 1
    return count


# --- prices --------------------------------------------------------------------------------------
def current_price_book(at: datetime | None = None) -> PriceBook | None:
    return PriceBook.objects.effective_at(at or clock.now()).first()


def storage_price(at: datetime | None = None) -> StoragePrice:
    """The price book's storage price (per GB a day beyond the free allowance); free without one."""
    book = current_price_book(at)
    return book.storage_quote if book is not None else StoragePrice()


def current_gpu_price(gpu_model: str, at: datetime | None = None) -> tuple[PriceBook, GpuPrice]:
    """The price in effect for ``gpu_model`` (the product name or the fleet code both match)."""
    book = current_price_book(at)
    key = gpu_model_key(gpu_model)
    price = (
        next((p for p in book.gpu_prices.all() if gpu_model_key(p.gpu_model) == key), None)
        if book
        else None
    )
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


def quote_for(user: User | AnonymousUser, gpu_model: str, cards: int, disk_gb: int = 0) -> Quote:
    """Quote an order on the current price book, with how long the user's balance lasts."""
    book, price = current_gpu_price(gpu_model)
    terms = list(book.term_prices.filter(gpu_model=price.gpu_model))
    balance = get_wallet_summary(user).spendable if _signed_in(user) else None
    return quote_order(
        gpu_price_quote(book, price, terms),
        cards,
        balance=balance,
        disk_gb=disk_gb,
        storage=book.storage_quote,
    )


@dataclass(frozen=True)
class Commitment:
    """A resource another app has committed to run that billing may not meter yet.

    The ordering app passes its account's instances that hold or are about to hold cards: ordered
    and still provisioning, starting (开机), moving to another node. Billing starts when they run,
    so its own tables do not show them yet; ``ensure_affordable`` counts each one it does not
    already bill (an open session) or hold the payment of (a paid term). ``term_days`` None = on
    demand (its per-hour rate counts); a term not paid yet counts its whole price up front.
    """

    resource_kind: str
    resource_id: str
    gpu_model: str
    cards: int
    term_days: int | None = None


@dataclass(frozen=True)
class AccountBurn:
    """What an account already spends: per hour (open sessions and on-demand commitments, exact)
    and up front (terms ordered but not paid yet)."""

    per_hour: Decimal = ZERO
    up_front: Decimal = ZERO


def _signed_in(who: Any) -> bool:
    """An Acting, a team, or a saved, signed-in user: someone whose wallet there is to read."""
    if not getattr(who, "is_authenticated", True):
        return False
    return getattr(who, "pk", True) is not None


def order_min_runway_seconds() -> int:
    """How long the balance must run the account's whole burn for an order to be accepted."""
    return int(getattr(settings, "ORDER_MIN_RUNWAY_SECONDS", 3600))


def account_burn(user: User, committed: Iterable[Commitment] = ()) -> AccountBurn:
    """The account's burn from billing's tables (open GPU and disk sessions) plus the commitments
    it does not bill yet, at the current price book (two queries and one per price looked up)."""
    return _burn(UsageSession.objects.for_team(user).open(), team_of(user), committed)


def _burn(
    sessions: Iterable[UsageSession], team: Any, committed: Iterable[Commitment]
) -> AccountBurn:
    per_hour, up_front = ZERO, ZERO
    billing_now: set[tuple[str, str]] = set()
    for session in sessions:
        per_hour += session.burn_per_hour
        billing_now.add((session.resource_kind, session.resource_id))
    committed = [c for c in committed if (c.resource_kind, str(c.resource_id)) not in billing_now]
    paid = set(
        TermRental.objects.filter(
            wallet__team=team, resource_id__in=[str(c.resource_id) for c in committed]
        ).values_list("resource_kind", "resource_id")
    )
    for c in committed:
        if (c.resource_kind, str(c.resource_id)) in paid:
            continue  # a term paid up front burns nothing per hour
        try:
            if c.term_days is None:
                _book, price = current_gpu_price(c.gpu_model)
                per_hour += price.on_demand_per_card_hour * int(c.cards)
            else:
                up_front += term_total(c.gpu_model, c.cards, c.term_days)
        except PriceNotSet:  # billing cannot start it either (no price): it will never burn
            continue
    return AccountBurn(per_hour, up_front)


def term_total(gpu_model: str, cards: int, days: int, at: datetime | None = None) -> Decimal:
    """What a ``days``-day term of ``cards`` × ``gpu_model`` costs up front on the current book."""
    book, price = current_gpu_price(gpu_model, at)
    term = book.term_prices.filter(gpu_model=price.gpu_model, days=days).first()
    if term is None:
        raise PriceNotSet(
            gettext_noop("No %(days)d-day price is set for %(model)s."), days=days, model=gpu_model
        )
    return round_cents(term.rate_per_card_hour * int(cards) * int(days) * 24)


def ensure_affordable(
    user: User | AnonymousUser,
    gpu_model: str,
    cards: int,
    disk_gb: int = 0,
    *,
    term_days: int | None = None,
    release_in_seconds: float | None = None,
    committed: Iterable[Commitment] = (),
    runway_seconds: int | None = None,
) -> Quote:
    """Refuse an order (or a start of a stopped instance) the balance cannot carry; its quote.

    The balance must run the account's **whole** burn for ``runway_seconds`` (default
    ``ORDER_MIN_RUNWAY_SECONDS``): everything billing per hour now (``account_burn``: open GPU and
    disk sessions, plus the ``committed`` resources not billing yet) and this order. An on-demand
    order released automatically in ``release_in_seconds`` needs its own part only until then. A
    term (``term_days``) is paid in full at the start, and what already runs must stay covered
    after paying it, so it needs its price plus the runway of the rest; unpaid terms of
    ``committed`` resources count in full. Raises ``InsufficientFunds`` (``needed``, ``balance``,
    ``shortfall``, ``top_up_url``) or ``PriceNotSet``.

    Checked per account, not per order: two orders of one account must not pass on the same
    balance, so the caller holds its account's order lock (slices: the ``GpuQuota`` row) from this
    check until the order commits, and passes the orders it committed before as ``committed``.
    """
    quote = quote_for(user, gpu_model, cards, disk_gb)
    runway = order_min_runway_seconds() if runway_seconds is None else int(runway_seconds)
    authenticated = _signed_in(user)
    burn = account_burn(cast("User", user), committed) if authenticated else AccountBurn()
    balance = get_wallet_summary(user).spendable if authenticated else ZERO
    others = burn.per_hour * runway / SECONDS_PER_HOUR + burn.up_front
    if term_days is not None:
        term = next((t for t in quote.terms if t.days == term_days), None)
        if term is None:
            raise PriceNotSet(
                gettext_noop("No %(days)d-day price is set for %(model)s."),
                days=term_days,
                model=gpu_model,
            )
        own, own_seconds = term.total, runway
    else:
        own_seconds = runway
        if release_in_seconds is not None:  # released automatically sooner: only until then
            own_seconds = max(0, min(runway, math.ceil(release_in_seconds)))
        own = quote.per_hour * own_seconds / SECONDS_PER_HOUR
    needed = (others + own).quantize(CENT, rounding=ROUND_UP)
    if balance >= needed:
        return quote
    shortfall = needed - balance
    common: dict[str, Any] = {
        "needed": needed,
        "balance": balance,
        "shortfall": shortfall,
        "top_up_url": reverse("billing:overview"),
    }
    if not burn.per_hour and not burn.up_front:
        if term_days is not None:
            raise InsufficientFunds(
                gettext_noop(
                    "This %(days)d-day term costs %(needed)s 元 up front; your balance is "
                    "%(balance)s 元. Top up %(shortfall)s 元 to order it."
                ),
                days=term_days,
                **common,
            )
        raise InsufficientFunds(  # the message of a first order (nothing else runs)
            gettext_noop(
                "This order needs at least %(needed)s 元 (%(hours)s h at %(per_hour)s 元/h); your "
                "balance is %(balance)s 元. Top up %(shortfall)s 元 to order it."
            ),
            hours=Decimal(own_seconds) / SECONDS_PER_HOUR,
            per_hour=quote.per_hour,
            **common,
        )
    running = round_cents(burn.per_hour)
    if term_days is not None:
        raise InsufficientFunds(
            gettext_noop(
                "This %(days)d-day term costs %(total)s 元 up front, and what already runs on "
                "your account (%(running)s 元/h) needs %(hours)s h more: %(needed)s 元 in all; "
                "your balance is %(balance)s 元. Top up %(shortfall)s 元 to order it."
            ),
            days=term_days,
            total=own,
            running=running,
            hours=Decimal(runway) / SECONDS_PER_HOUR,
            **common,
        )
    raise InsufficientFunds(
        gettext_noop(
            "This order needs at least %(needed)s 元 to run %(hours)s h beside what your "
            "account already runs (%(running)s 元/h; %(per_hour)s 元/h in all); your balance is "
            "%(balance)s 元. Top up %(shortfall)s 元 to order it."
        ),
        hours=Decimal(runway) / SECONDS_PER_HOUR,
        per_hour=round_cents(burn.per_hour + quote.per_hour),
        running=running,
        **common,
    )


def ensure_storage_affordable(user: User, stored_gb: int, added_gb: int) -> None:
    """Refuse more storage (a new or grown disk) whose first day the balance cannot pay.

    Storage is billed per GB a day beyond the account's free allowance, so adding ``added_gb`` to
    the ``stored_gb`` it keeps costs nothing while the total stays within it; beyond, the balance
    must carry one day of the new total. Raises ``InsufficientFunds``.
    """
    price = storage_price()
    per_day = price.per_day(stored_gb + added_gb)
    if per_day > price.per_day(stored_gb) and get_wallet_summary(user).spendable < per_day:
        raise InsufficientFunds(
            gettext_noop(
                "Storage beyond the free %(free)d GB costs %(per_day)s 元 a day with this disk; "
                "please top up first."
            ),
            free=price.free_gb,
            per_day=per_day,
            top_up_url="/billing/",
        )


# --- per-member budgets (issue 30) -------------------------------------------------------------
def member_id_of(who: Any) -> int | None:
    """The member a charge is attributed to: the acting user (for ``for_row(row)`` the row's
    maker); for a bare team its person when it is a personal team, else nobody (what the whole
    team shares, e.g. its storage)."""
    user = user_of(who)
    if user is not None and getattr(user, "pk", None) is not None:
        return int(user.pk)
    team = getattr(who, "team", who)
    personal = getattr(team, "personal_of_id", None)
    return int(personal) if personal is not None else None


def member_month_spend(
    who: Any, member_id: int | None = None, at: datetime | None = None
) -> Decimal:
    """What the member's lines of the team's bill cost this calendar month (billing/budgets.py)."""
    team = team_of(who)
    return budgets.month_spend(team.pk, member_id_of(who) if member_id is None else member_id, at)


def member_limits(who: Any) -> Membership | None:
    """The acting member's membership (budget, card quota, stop on exhaustion), or None (a
    bare team, or a user who is not a member)."""
    member_id = member_id_of(who) if user_of(who) is not None else None
    if member_id is None:
        return None
    return Membership.objects.filter(team=team_of(who), user_id=member_id).first()


def member_burn(who: Any, committed: Iterable[Commitment] = ()) -> AccountBurn:
    """The member's own burn: their open GPU sessions in the team and their ``committed``
    resources (the caller passes only the member's) not billing yet."""
    team = team_of(who)
    sessions = UsageSession.objects.open().filter(
        wallet__team=team, member_id=member_id_of(who), meter=Meter.GPU
    )
    return _burn(sessions, team, committed)


def ensure_member_within_budget(
    who: Any,
    gpu_model: str = "",
    cards: int = 0,
    *,
    term_days: int | None = None,
    release_in_seconds: float | None = None,
    committed: Iterable[Commitment] = (),
    storage_per_day: Decimal | None = None,
) -> None:
    """Refuse an order, a start or more storage that would take the acting member past their
    monthly budget (``Membership.budget_monthly``, 元; none set: no limit). Raises
    ``BudgetExceeded`` (402 ``budget_exceeded``: ``spent``, ``budget``, ``order``, ``running``).

    ``spent`` is what their lines of this month's bill cost (``member_month_spend``); ``order``
    is this order as the funds check counts it: its first ``ORDER_MIN_RUNWAY_SECONDS`` on demand
    (less when released sooner), a term's whole price, or a disk's first day (``storage_per_day``);
    ``running`` the same runway of what the member already runs or has committed (``member_burn``),
    so orders that do not bill yet still count. Takes the team's lock (``Team`` row) and reads the
    budget under it: concurrent orders of one member, and a budget change, are decided one after
    the other. The caller holds its order lock in the same transaction."""
    if user_of(who) is None:
        return
    Team.objects.select_for_update().filter(pk=team_of(who).pk).values_list("pk").first()
    row = member_limits(who)
    if row is None or row.budget_monthly is None:
        return
    runway = order_min_runway_seconds()
    if storage_per_day is not None:
        order = storage_per_day
    elif term_days is not None:
        order = term_total(gpu_model, cards, term_days)
    else:
        own_seconds = runway
        if release_in_seconds is not None:
            own_seconds = max(0, min(runway, math.ceil(release_in_seconds)))
        order = quote_for(who, gpu_model, cards).per_hour * own_seconds / SECONDS_PER_HOUR
    burn = member_burn(who, committed)
    running = burn.per_hour * runway / SECONDS_PER_HOUR + burn.up_front
    spent = member_month_spend(who, row.user_id)
    order = order.quantize(CENT, rounding=ROUND_UP)
    running = running.quantize(CENT, rounding=ROUND_UP)
    if spent + running + order <= row.budget_monthly:
        return
    params = {
        "spent": spent,
        "budget": row.budget_monthly,
        "order": order,
        "running": running,
        "hours": Decimal(runway) / SECONDS_PER_HOUR,
    }
    if storage_per_day is not None:
        template = gettext_noop(
            "This disk's first day costs %(order)s 元; you have spent %(spent)s 元 of your "
            "monthly budget of %(budget)s 元 in this team (what you run needs %(running)s 元 "
            "more). Ask a team owner, admin or billing member to raise it."
        )
    elif term_days is not None:
        template = gettext_noop(
            "This term costs %(order)s 元 up front; you have spent %(spent)s 元 of your monthly "
            "budget of %(budget)s 元 in this team (what you run needs %(running)s 元 more). Ask "
            "a team owner, admin or billing member to raise it."
        )
    else:
        template = gettext_noop(
            "This order costs %(order)s 元 for its first %(hours)s h; you have spent %(spent)s 元 "
            "of your monthly budget of %(budget)s 元 in this team (what you run needs "
            "%(running)s 元 more). Ask a team owner, admin or billing member to raise it."
        )
    raise BudgetExceeded(template, **cast(dict[str, Any], params))


# --- metering ------------------------------------------------------------------------------------
@transaction.atomic
def open_usage_session(
    user: Any,  # an Acting, a team or a user (console.tenancy.team_of)
    *,
    resource_kind: str,
    resource_id: str,
    gpu_model: str = "",
    cards: int,
    label: str = "",
    meter: str = Meter.GPU,
    at: datetime | None = None,
    region: str = "",
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
                member_id=member_id_of(user),
                resource_kind=resource_kind,
                resource_id=str(resource_id),
                label=label[:120],
                region=region[:32],
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


def open_resource_ids(resource_kind: str, resource_ids: Iterable[str]) -> set[str]:
    """Which of these resources billing is metering now (an open session), in one query."""
    return set(
        UsageSession.objects.open()
        .filter(resource_kind=resource_kind, resource_id__in=[str(r) for r in resource_ids])
        .values_list("resource_id", flat=True)
    )


def oldest_unsettled_at() -> datetime | None:
    """When the least recently settled open session was last settled (or started, if never)."""
    from django.db.models import Min
    from django.db.models.functions import Coalesce

    oldest: datetime | None = UsageSession.objects.open().aggregate(
        oldest=Min(Coalesce("settled_at", "started_at"))
    )["oldest"]
    return oldest


def get_open_session(resource_kind: str, resource_id: str) -> UsageSession | None:
    """The session billing a resource now, or None (what another app reads instead of the model)."""
    return (
        UsageSession.objects.open()
        .filter(resource_kind=resource_kind, resource_id=str(resource_id))
        .first()
    )


# What costs_so_far reads on every poll of an instance, its SQL built once per process
# (console/api/compiled.py).
_GPU_SESSIONS_OF = CompiledQuery(
    lambda kind, ids: (
        UsageSession.objects.filter(resource_kind=kind, resource_id__in=ids, meter=Meter.GPU)
        .only(
            "resource_id",
            "state",
            "started_at",
            "settled_seconds",
            "rate",
            "cards",
            "charged",
            "meter",
        )
        .order_by()
    ),
    kind=UsageSession._meta.get_field("resource_kind"),
    ids=Many(UsageSession._meta.get_field("resource_id")),
)
_TERMS_OF = CompiledQuery(
    lambda kind, ids: (
        TermRental.objects.filter(resource_kind=kind, resource_id__in=ids)
        .only("resource_id", "total")
        .order_by()
    ),
    kind=TermRental._meta.get_field("resource_kind"),
    ids=Many(TermRental._meta.get_field("resource_id")),
)


def costs_so_far(
    resource_kind: str, resource_ids: Iterable[str], *, termed: Iterable[str] | None = None
) -> dict[str, Decimal]:
    """What each resource's GPUs have cost so far, as billing counts it (two queries; one when
    ``termed``, the resources that can hold a term, is given and empty).

    Every usage session of the resource counts (a stop, a start or a migration closes one and
    opens the next): a closed one what it was charged, the open one up to this second on billing's
    clock under the same cumulative rounding as settlement. A term counts what was paid for it up
    front, from the second it was paid, however soon it was released. Resources billing never
    charged cost 0.00.
    """
    ids = [str(r) for r in resource_ids]
    costs = dict.fromkeys(ids, ZERO)
    now = clock.now()
    for session in _GPU_SESSIONS_OF.all(kind=resource_kind, ids=ids):
        if session.state == UsageState.OPEN:
            seconds = max(int((now - session.started_at).total_seconds()), session.settled_seconds)
            costs[session.resource_id] += charge_for(
                session.rate, session.cards, seconds, session.per_seconds
            )
        else:
            costs[session.resource_id] += session.charged
    for term in _TERMS_OF.all(kind=resource_kind, ids=ids if termed is None else list(termed)):
        costs[term.resource_id] += term.total
    return {r: round_cents(cost) for r, cost in costs.items()}


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


# --- long-term rental ----------------------------------------------------------------------------
@transaction.atomic
def purchase_term(
    user: Any,  # an Acting, a team or a user (console.tenancy.team_of)
    *,
    gpu_model: str,
    cards: int,
    days: int,
    resource_kind: str,
    resource_id: str,
    label: str = "",
    region: str = "",
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
    wallet = lock_wallet(user)
    buckets = spendable_accounts(wallet, now)
    if sum((b.balance for b in buckets), ZERO) < total:
        raise InsufficientFunds(
            gettext_noop("This term costs %(total)s 元; please top up first."), total=total
        )
    legs = spending_legs(buckets, total, system_account(AccountKind.USAGE_REVENUE))
    txn = post(
        TransactionKind.TERM_PURCHASE,
        legs,
        wallet=wallet,
        code=MemoCode.TERM_RENTAL,
        params={
            "days": days,
            "cards": cards,
            "model": gpu_model,
            "rate": str(term.rate_per_card_hour),
        },
    )
    return TermRental.objects.create(
        wallet=wallet,
        resource_kind=resource_kind,
        resource_id=str(resource_id),
        label=label,
        region=region[:32],
        gpu_model=gpu_model,
        cards=cards,
        days=days,
        rate=term.rate_per_card_hour,
        total=total,
        price_book=book,
        starts_at=now,
        ends_at=now + timedelta(days=days),
        transaction=txn,
        member_id=member_id_of(user),
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
    user: User,
    amount: Any,
    *,
    provider: str = "sandbox",
    idempotency_key: str | None = None,
    request: Any = None,
) -> tuple[Payment, bool]:
    """Create a pending top-up; returns (payment, created).

    With an ``Idempotency-Key``: the same key and amount return the same payment (created=False);
    the same key with another amount raises ``IdempotencyMismatch``.
    """
    value = validate_topup_amount(amount)
    require_verified(user, "topup")  # 实名认证 (VERIFICATION_REQUIRED_FOR), 403 otherwise
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
    if provider == "bank_transfer":  # 对公转账: the remittance code the customer writes
        bank_transfers.on_created(payment)
    audit.record(user, "wallet.topup", payment, team=wallet.team, label=f"{value} 元", after={"amount": value, "provider": provider, "state": payment.state}, request=request)  # fmt: skip
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
        raise InvalidWebhook(gettext_noop("Unknown payment."), code=ErrorCode.UNKNOWN_PAYMENT)
    if round_cents(to_decimal(amount)) != payment.amount:
        raise InvalidWebhook(
            gettext_noop("The paid amount does not match the payment."),
            code=ErrorCode.AMOUNT_MISMATCH,
        )
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
        (wallet_account(wallet, AccountKind.CASH), payment.amount),
        (system_account(AccountKind.PAYMENTS), -payment.amount),
    ]
    code, params = MemoCode.TOPUP, {"provider": provider}
    rule = current_bonus_rule()
    if rule and payment.amount >= rule.threshold:
        bonus = percent_of(payment.amount, rule.percent)
        if bonus > 0:
            percent = f"{rule.percent.normalize():f}"  # 10, 2.5 (normalize alone gives 1E+1)
            reason = _("%(percent)s %% voucher for a top-up of %(amount)s 元") % {
                "percent": percent,
                "amount": payment.amount,
            }
            voucher = new_voucher(
                wallet, bonus, now + timedelta(days=rule.voucher_valid_days), reason
            )
            legs += [(voucher, bonus), (system_account(AccountKind.PROMOTIONS), -bonus)]
            code = MemoCode.TOPUP_BONUS
            params |= {"percent": percent, "amount": str(payment.amount)}
    txn = post(
        TransactionKind.TOPUP,
        legs,
        wallet=wallet,
        code=code,
        params=params,
        key=f"payment:{provider}:{provider_txn_id}",
        at=now,
    )
    # Low-balance warnings re-arm at the next settlement if the runway is back above them
    # (billing/lowbalance.py), so a top-up too small to matter does not warn twice.
    Payment.objects.filter(pk=payment.pk).update(transaction=txn)
    audit.record(None, "wallet.topup_confirmed", payment, team=wallet.team, label=f"{payment.amount} 元", before={"state": payment.state}, after={"state": PaymentState.SUCCEEDED, "amount": payment.amount, "provider": provider}, request=None)  # fmt: skip
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
    event = get_provider(provider_name).parse_webhook(body, headers)
    if event.status != "succeeded":
        fail_payment(event.payment_id, provider=provider_name)
        return False  # a failure is recorded (once), never credited
    try:
        return confirm_payment(
            event.payment_id,
            provider=provider_name,
            provider_txn_id=event.provider_txn_id,
            amount=event.amount,
        )
    except IntegrityError:  # the provider's transaction id already paid another payment
        raise InvalidWebhook(
            gettext_noop("This provider transaction was already used."),
            code=ErrorCode.TRANSACTION_REUSED,
        ) from None


# --- lookups for views -------------------------------------------------------------------------
def get_payment_for_user(user: User, public_id: str) -> Payment:
    return get_object_or_404(Payment, public_id=public_id, wallet__team=team_of(user))


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
    GpuPrice.objects.bulk_create(_copied_into(copy, book.gpu_prices.all()))
    TermPrice.objects.bulk_create(_copied_into(copy, book.term_prices.all()))
    return copy


_PriceRow = TypeVar("_PriceRow", GpuPrice, TermPrice)


def _copied_into(book: PriceBook, rows: Iterable[_PriceRow]) -> list[_PriceRow]:
    """Unsaved copies of price rows, every field kept, for ``book`` (Django's copy: no pk)."""
    copies = []
    for row in rows:
        row.pk = None
        row._state.adding = True
        row.price_book = book
        copies.append(row)
    return copies


# --- booked windows (预约, issue 32) ----------------------------------------------------------------
# Why a window's money came back, as its refund memo says it (rendered in the reader's language).
RESERVATION_REFUND_REASONS = {
    "cancelled": gettext_noop("cancelled"),
    "delay": gettext_noop("started late: the delay is not billed"),
    "missed": gettext_noop("could not be started"),
}


@dataclass(frozen=True)
class WindowPrice:
    """A window's locked price: the term ladder's rate for its length (``term_days``: the rung;
    None: on demand), the total paid up front, and the same hours on demand for comparison."""

    gpu_model: str
    cards: int
    hours: int
    rate_per_card_hour: Decimal
    term_days: int | None
    total: Decimal
    on_demand_total: Decimal
    price_version: int


def window_price(gpu_model: str, cards: int, hours: int, at: datetime | None = None) -> WindowPrice:
    """The locked price of ``cards`` × ``gpu_model`` for ``hours`` on the current price book;
    raises ``PriceNotSet`` (also for a placeholder price: not orderable)."""
    book, price = current_gpu_price(gpu_model, at)
    if price.is_placeholder:
        raise PriceNotSet(
            gettext_noop("No price is set for %(model)s yet; it cannot be booked."),
            model=gpu_model,
        )
    terms = list(book.term_prices.filter(gpu_model=price.gpu_model))
    rate, days = window_rate(gpu_price_quote(book, price, terms), hours)
    return WindowPrice(
        price.gpu_model,
        int(cards),
        int(hours),
        rate,
        days,
        window_total(rate, cards, hours),
        window_total(price.on_demand_per_card_hour, cards, hours),
        book.version,
    )


@transaction.atomic
def pay_reservation(
    who: Any,  # an Acting, a team or a user (console.tenancy.team_of)
    *,
    gpu_model: str,
    cards: int,
    hours: int,
    resource_id: str,
    name: str = "",
) -> tuple[WindowPrice, LedgerTransaction]:
    """Pay a booked window up front at its locked price (idempotent per ``resource_id``).

    The balance must pay it and still carry what already runs for the order runway (the rule
    ``ensure_affordable`` applies to a term); else ``InsufficientFunds`` and nothing is charged.
    """
    priced = window_price(gpu_model, cards, hours)
    key = f"reservation:{resource_id}"
    done = LedgerTransaction.objects.filter(idempotency_key=key).first()
    if done is not None:
        return priced, done
    wallet = lock_wallet(who)
    now = clock.now()
    burn = account_burn(cast("User", who))
    runway = order_min_runway_seconds()
    needed = (priced.total + burn.per_hour * runway / SECONDS_PER_HOUR + burn.up_front).quantize(
        CENT, rounding=ROUND_UP
    )
    buckets = spendable_accounts(wallet, now)
    balance = sum((b.balance for b in buckets), ZERO)
    if balance < needed:
        raise InsufficientFunds(
            gettext_noop(
                "This window costs %(total)s 元 up front (%(needed)s 元 with what already runs on "
                "your account); your balance is %(balance)s 元. Top up %(shortfall)s 元 to book it."
            ),
            total=priced.total,
            needed=needed,
            balance=balance,
            shortfall=needed - balance,
            top_up_url=reverse("billing:overview"),
        )
    legs = spending_legs(buckets, priced.total, system_account(AccountKind.USAGE_REVENUE))
    txn = post(
        TransactionKind.TERM_PURCHASE,
        legs,
        wallet=wallet,
        code=MemoCode.RESERVATION,
        params={
            "name": name[:63],
            "cards": int(cards),
            "model": priced.gpu_model,
            "hours": int(hours),
            "rate": str(priced.rate_per_card_hour),
        },
        key=key,
        by=user_of(who),
    )
    return priced, txn


@transaction.atomic
def refund_reservation(
    who: Any,
    *,
    resource_id: str,
    amount: Decimal,
    why: str,
    share: Decimal,
    name: str = "",
) -> LedgerTransaction | None:
    """Give ``amount`` of a window's payment back, once per (window, ``why``): to the accounts
    that paid it, in the order they paid (vouchers first, cash last), never more than each gave.
    None when there is nothing to give back. A second call with the same ``why`` finds the first
    refund by its key and posts nothing."""
    amount = round_cents(to_decimal(amount))
    key = f"reservation-refund:{resource_id}:{why}"
    wallet = lock_wallet(who)  # the wallet lock first: two refunds of one window queue here
    done = LedgerTransaction.objects.filter(idempotency_key=key).first()
    if done is not None or amount <= 0:
        return done
    paid = LedgerTransaction.objects.filter(idempotency_key=f"reservation:{resource_id}").first()
    if paid is None:  # never paid (nothing to give back)
        return None
    legs = [
        (e.account, -e.amount)
        for e in paid.entries.select_related("account").order_by("pk")
        if e.account.wallet_id == wallet.pk and e.amount < 0
    ]
    if not legs:
        return None
    amount = min(amount, sum((x for _, x in legs), ZERO))
    parts = allocate(amount, [x for _, x in legs])
    back: list[tuple[Account, Decimal]] = [(a, p) for (a, _x), p in zip(legs, parts, strict=True)]
    back.append((system_account(AccountKind.USAGE_REVENUE), -amount))
    total = sum((x for _, x in legs), ZERO)
    return post(
        TransactionKind.REFUND,
        back,
        wallet=wallet,
        code=MemoCode.RESERVATION_REFUND,
        params={
            "name": name[:63],
            "share": str(round_cents(to_decimal(share) * 100)),
            "total": str(total),
            "why": RESERVATION_REFUND_REASONS.get(why, why),
        },
        key=key,
    )
