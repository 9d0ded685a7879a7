"""Billing's tables: the price book, wallets on a double-entry ledger, usage sessions, payments.

Ledger invariants (asserted by tests/billing/test_ledger_properties.py):

* every ``LedgerTransaction``'s entries sum to zero;
* every ``Account.balance`` (a cache, updated in the same database transaction as its entries)
  equals the sum of that account's entries; the sum of all balances is zero;
* entries and transactions are never updated or deleted: corrections are reversing transactions.

Customer accounts hold the customer's money (positive = theirs); the operator's system accounts are
the other side of each posting. Amounts are ``Decimal`` 元 at 0.01 precision (see billing/money.py).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any, NoReturn

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from billing.choices import (
    AccountKind,
    CloseReason,
    MemoCode,
    Meter,
    NoticeKind,
    PaymentState,
    TransactionKind,
    UsageState,
    memo_display_params,
)
from billing.pricing import GpuPrice as GpuPriceQuote
from billing.pricing import StoragePrice as StoragePriceQuote
from billing.pricing import TermPrice as TermPriceQuote
from billing.querysets import (
    AccountQuerySet,
    LedgerTransactionQuerySet,
    PriceBookQuerySet,
    UsageSessionQuerySet,
)

MONEY = {"max_digits": 18, "decimal_places": 2}
RATE = {"max_digits": 12, "decimal_places": 4}


class ImmutableError(Exception):
    """Ledger rows are append-only; post a reversing transaction instead."""


class AppendOnly(models.Model):
    """A ledger row: inserted once, never updated or deleted (corrections are new rows)."""

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ImmutableError(f"{self._meta.verbose_name_plural} are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ImmutableError(f"{self._meta.verbose_name_plural} are append-only")


# --- price book --------------------------------------------------------------------------------
class PriceBook(models.Model):
    """A version of every price, effective from ``effective_at``.

    A charge records the version it used; a running on-demand session keeps the rate it opened
    with, so a new version never changes what is already accrued.
    """

    version = models.PositiveIntegerField(_("version"), unique=True)
    effective_at = models.DateTimeField(_("effective from"))
    note = models.CharField(_("note"), max_length=200, blank=True)
    storage_per_gb_day = models.DecimalField(
        _("disk price per GB-day"), default=Decimal("0.01"), **RATE
    )
    storage_free_gb = models.PositiveIntegerField(_("free disk quota (GB)"), default=50)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = PriceBookQuerySet.as_manager()

    class Meta:
        verbose_name = _("price book version")
        verbose_name_plural = _("price book")
        ordering = ("-effective_at", "-version")

    def __str__(self) -> str:
        return f"v{self.version} ({self.effective_at:%Y-%m-%d %H:%M})"

    @property
    def storage_quote(self) -> StoragePriceQuote:
        return StoragePriceQuote(self.storage_per_gb_day, self.storage_free_gb)


class GpuPrice(models.Model):
    price_book = models.ForeignKey(PriceBook, on_delete=models.PROTECT, related_name="gpu_prices")
    gpu_model = models.CharField(_("GPU model"), max_length=40)
    on_demand_per_card_hour = models.DecimalField(_("on-demand price per card-hour"), **RATE)
    is_placeholder = models.BooleanField(
        _("placeholder"),
        default=False,
        help_text=_("Not a published price yet: the operator must set it."),
    )

    class Meta:
        verbose_name = _("GPU price")
        verbose_name_plural = _("GPU prices")
        ordering = ("gpu_model",)
        constraints = (
            models.UniqueConstraint(
                fields=("price_book", "gpu_model"), name="billing_gpuprice_one_per_model"
            ),
            models.CheckConstraint(
                condition=Q(on_demand_per_card_hour__gt=0), name="billing_gpuprice_positive"
            ),
        )

    def __str__(self) -> str:
        return f"{self.gpu_model} {self.on_demand_per_card_hour} 元/card-h"


class TermPrice(models.Model):
    """A long-term rental term (阶梯长租锁价): ``days`` paid up front at a locked card-hour price."""

    price_book = models.ForeignKey(PriceBook, on_delete=models.PROTECT, related_name="term_prices")
    gpu_model = models.CharField(_("GPU model"), max_length=40)
    days = models.PositiveIntegerField(_("term (days)"))
    rate_per_card_hour = models.DecimalField(_("price per card-hour"), **RATE)

    class Meta:
        verbose_name = _("long-term price")
        verbose_name_plural = _("long-term prices")
        ordering = ("gpu_model", "days")
        constraints = (
            models.UniqueConstraint(
                fields=("price_book", "gpu_model", "days"), name="billing_termprice_unique"
            ),
            models.CheckConstraint(
                condition=Q(rate_per_card_hour__gt=0, days__gt=0), name="billing_termprice_positive"
            ),
        )

    def __str__(self) -> str:
        return f"{self.gpu_model} {self.days}d {self.rate_per_card_hour} 元/card-h"


def gpu_price_quote(book: PriceBook, price: GpuPrice, terms: list[TermPrice]) -> GpuPriceQuote:
    return GpuPriceQuote(
        price.gpu_model,
        price.on_demand_per_card_hour,
        tuple(TermPriceQuote(t.days, t.rate_per_card_hour) for t in terms),
        version=book.version,
    )


class TopUpBonusRule(models.Model):
    """Top-ups of at least ``threshold`` earn ``percent`` % as a voucher (5 % from 100,000 元).

    Operator-editable; the newest active rule applies.
    """

    threshold = models.DecimalField(_("minimum top-up"), default=Decimal("100000.00"), **MONEY)
    percent = models.DecimalField(
        _("voucher percent"), default=Decimal("5.00"), max_digits=5, decimal_places=2
    )
    voucher_valid_days = models.PositiveIntegerField(_("voucher valid for (days)"), default=365)
    active = models.BooleanField(_("active"), default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("top-up voucher rule")
        verbose_name_plural = _("top-up voucher rules")
        ordering = ("-created_at", "-id")
        constraints = (
            models.CheckConstraint(
                condition=Q(threshold__gt=0, percent__gte=0, percent__lte=100),
                name="billing_bonusrule_sane",
            ),
        )

    def __str__(self) -> str:
        return f"≥ {self.threshold} 元 → {self.percent} %"


# --- wallet and ledger -------------------------------------------------------------------------
class Wallet(models.Model):
    """One per team (issue 30). Its row is the lock every money movement of the team takes first."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    team = models.OneToOneField("console.Team", on_delete=models.PROTECT, related_name="wallet")
    # Low-balance thresholds (seconds of runway) already warned about; re-armed after a top-up.
    warned_thresholds = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("wallet")
        verbose_name_plural = _("wallets")
        permissions = (
            ("grant_voucher", _("Can grant compute vouchers")),
            ("refund_cash", _("Can refund cash")),
        )

    def __str__(self) -> str:
        return f"wallet of {self.team}"


class Account(models.Model):
    """A ledger account: a customer bucket (cash, trial, one per voucher) or a system account."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    wallet = models.ForeignKey(
        Wallet, null=True, blank=True, on_delete=models.PROTECT, related_name="accounts"
    )
    kind = models.CharField(_("kind"), max_length=20, choices=AccountKind.choices)
    balance = models.DecimalField(_("balance"), default=Decimal("0.00"), **MONEY)
    # vouchers only:
    granted_amount = models.DecimalField(_("granted"), default=Decimal("0.00"), **MONEY)
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True)
    reason = models.CharField(_("reason"), max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = AccountQuerySet.as_manager()

    class Meta:
        verbose_name = _("ledger account")
        verbose_name_plural = _("ledger accounts")
        constraints = (
            models.UniqueConstraint(
                fields=("wallet", "kind"),
                condition=Q(kind__in=("cash", "trial")),
                name="billing_account_one_cash_one_trial",
            ),
            models.UniqueConstraint(
                fields=("kind",),
                condition=Q(wallet__isnull=True),
                name="billing_account_one_system",
            ),
            # Trial credit and vouchers are never overdrawn; cash may dip below zero by at most
            # one settlement window of burn (billing/lowbalance.py).
            models.CheckConstraint(
                condition=~Q(kind__in=("trial", "voucher")) | Q(balance__gte=0),
                name="billing_account_credit_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=("voucher",), expires_at__isnull=False)
                | ~Q(kind__in=("voucher",)),
                name="billing_voucher_expires",
            ),
        )
        indexes = (models.Index(fields=("wallet", "kind", "expires_at")),)

    def __str__(self) -> str:
        owner = f"wallet {self.wallet_id}" if self.wallet_id else "system"
        return f"{self.get_kind_display()} ({owner})"

    def is_spendable(self, at: datetime) -> bool:
        if self.kind == AccountKind.VOUCHER:
            return self.expires_at is not None and self.expires_at > at and self.balance > 0
        return self.kind in (AccountKind.CASH, AccountKind.TRIAL)


class LedgerTransaction(AppendOnly):
    """A balanced set of entries: one money movement, explained by ``kind`` and ``memo``."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    kind = models.CharField(_("kind"), max_length=20, choices=TransactionKind.choices)
    wallet = models.ForeignKey(
        Wallet, null=True, blank=True, on_delete=models.PROTECT, related_name="transactions"
    )
    # A code and its parameters, rendered in the reader's language (``description``); free text
    # an operator typed, and the memos written before codes existed, in ``memo``.
    memo = models.CharField(_("description"), max_length=300, blank=True)
    memo_code = models.CharField(max_length=30, choices=MemoCode.choices, blank=True)
    memo_params = models.JSONField(default=dict, blank=True)
    # What makes replays harmless: "trial:<wallet>", "payment:<provider>:<txn>", "usage:<run>:<w>"…
    idempotency_key = models.CharField(max_length=200, unique=True, null=True, blank=True)
    reverses = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="reversed_by"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(db_index=True)

    objects = LedgerTransactionQuerySet.as_manager()

    class Meta:
        verbose_name = _("ledger transaction")
        verbose_name_plural = _("ledger transactions")
        ordering = ("-created_at", "-id")
        permissions = (("reverse_transaction", _("Can reverse (correct) ledger transactions")),)
        indexes = (models.Index(fields=("wallet", "-created_at", "-id")),)

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.created_at:%Y-%m-%d %H:%M:%S}"

    @property
    def description(self) -> str:
        """What this transaction was, in the active language (or the free text it was given)."""
        if not self.memo_code or self.memo_code not in MemoCode.values:
            return self.memo
        template = str(MemoCode(self.memo_code).label)
        try:
            return template % memo_display_params(self.memo_params)
        except (KeyError, TypeError, ValueError):  # parameters of another version of the template
            return template


class Entry(AppendOnly):
    """One leg of a transaction: ``amount`` added to ``account`` (negative = taken out)."""

    transaction = models.ForeignKey(
        LedgerTransaction, on_delete=models.PROTECT, related_name="entries"
    )
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="entries")
    amount = models.DecimalField(_("amount"), **MONEY)

    class Meta:
        verbose_name = _("ledger entry")
        verbose_name_plural = _("ledger entries")
        constraints = (
            models.CheckConstraint(condition=~Q(amount=0), name="billing_entry_nonzero"),
        )

    def __str__(self) -> str:
        return f"{self.amount} → {self.account}"


# --- metering ------------------------------------------------------------------------------------
class Metered:
    """How a metered session is priced: per card-hour (GPU) or per GB-day (disk).

    Shared by the model and the bulk settlement's plain rows (billing/settlement.py).
    """

    __slots__ = ()  # the settlement's rows keep their slots

    meter: str
    rate: Decimal
    cards: int

    @property
    def per_seconds(self) -> int:
        return 86400 if self.meter == Meter.DISK else 3600

    @property
    def burn_per_hour(self) -> Decimal:
        return self.rate * self.cards * 3600 / self.per_seconds


class UsageSession(Metered, models.Model):
    """Billing of one resource from the second it runs until it stops.

    The resource lives in another app; it is referenced by ``resource_kind`` ("instance", "slice",
    "disk"…) and its ``public_id`` string, so billing needs no foreign key into slices.
    """

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    # Indexed by (wallet, -started_at) and the partial open-sessions index below.
    wallet = models.ForeignKey(
        Wallet, on_delete=models.PROTECT, related_name="usage_sessions", db_index=False
    )
    resource_kind = models.CharField(_("resource kind"), max_length=20)
    resource_id = models.CharField(_("resource"), max_length=64)
    label = models.CharField(_("name"), max_length=120, blank=True)
    # Where the resource runs (a region's code; "" for account-wide storage): the bills' 地域.
    region = models.CharField(_("region"), max_length=32, blank=True, default="")
    meter = models.CharField(max_length=8, choices=Meter.choices, default=Meter.GPU)
    gpu_model = models.CharField(_("GPU model"), max_length=40, blank=True)
    cards = models.PositiveIntegerField(_("cards"))  # GB for disks
    rate = models.DecimalField(_("rate"), **RATE)  # per card-hour (GPU) or per GB-day (disk)
    price_book = models.ForeignKey(
        PriceBook, null=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    state = models.CharField(max_length=8, choices=UsageState.choices, default=UsageState.OPEN)
    started_at = models.DateTimeField(_("started"))
    ended_at = models.DateTimeField(_("ended"), null=True, blank=True)
    close_reason = models.CharField(max_length=20, choices=CloseReason.choices, blank=True)
    settled_seconds = models.PositiveBigIntegerField(_("seconds settled"), default=0)
    charged = models.DecimalField(_("charged"), default=Decimal("0.00"), **MONEY)
    settled_at = models.DateTimeField(null=True, blank=True)
    # The member who caused it (issue 30): the instance's maker, for budgets and per-member
    # statements; empty for what the whole team shares (its storage beyond the free GB).
    member = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name=_("member"),
    )

    objects = UsageSessionQuerySet.as_manager()

    class Meta:
        verbose_name = _("usage session")
        verbose_name_plural = _("usage sessions")
        ordering = ("-started_at", "-id")
        constraints = (
            # Exactly one billing start per resource, however often "running" is reported.
            models.UniqueConstraint(
                fields=("resource_kind", "resource_id"),
                condition=Q(state="open"),
                name="billing_usage_one_open_per_resource",
            ),
        )
        # Settlement rewrites every open row each minute: indexes only on columns it never
        # changes, so PostgreSQL can update in place (HOT; see migration 0003's fillfactor).
        indexes = (
            models.Index(
                fields=("wallet",), condition=Q(state="open"), name="billing_usage_open_by_wallet"
            ),
            models.Index(fields=("wallet", "-started_at"), name="billing_usage_by_wallet"),
        )

    def __str__(self) -> str:
        return f"{self.resource_kind} {self.label or self.resource_id}"


class UsageCharge(models.Model):
    """One settlement of one session: seconds ``from_second``..``to_second`` of it.

    Unique per (session, period start): a replayed or concurrent settlement of the same period
    cannot post twice.
    """

    # No index of its own: the unique (session, from_second) index below serves lookups by session,
    # and the bulk settlement inserts one row per open session each minute.
    session = models.ForeignKey(
        UsageSession, on_delete=models.PROTECT, related_name="charges", db_index=False
    )
    transaction = models.ForeignKey(
        LedgerTransaction, on_delete=models.PROTECT, related_name="usage_charges"
    )
    from_second = models.PositiveBigIntegerField()
    to_second = models.PositiveBigIntegerField()
    amount = models.DecimalField(**MONEY)

    class Meta:
        constraints = (
            models.UniqueConstraint(
                fields=("session", "from_second"), name="billing_usagecharge_once_per_period"
            ),
        )

    def __str__(self) -> str:
        return f"{self.session} s{self.from_second}-{self.to_second}: {self.amount}"


class TermRental(models.Model):
    """A long-term rental paid up front at the term's locked price."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    wallet = models.ForeignKey(Wallet, on_delete=models.PROTECT, related_name="term_rentals")
    resource_kind = models.CharField(max_length=20)
    resource_id = models.CharField(max_length=64)
    label = models.CharField(max_length=120, blank=True)
    region = models.CharField(max_length=32, blank=True, default="")
    gpu_model = models.CharField(max_length=40)
    cards = models.PositiveIntegerField()
    days = models.PositiveIntegerField()
    rate = models.DecimalField(**RATE)
    total = models.DecimalField(**MONEY)
    price_book = models.ForeignKey(PriceBook, on_delete=models.PROTECT, related_name="+")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    transaction = models.OneToOneField(
        LedgerTransaction, on_delete=models.PROTECT, related_name="+"
    )
    member = models.ForeignKey(  # who ordered it (issue 30), as on UsageSession
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name=_("member"),
    )

    class Meta:
        ordering = ("-starts_at",)

    def __str__(self) -> str:
        return f"{self.days}d {self.cards} × {self.gpu_model}"


# --- payments -----------------------------------------------------------------------------------
class Payment(models.Model):
    """A top-up through a payment provider; credited once, when the provider confirms it."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    wallet = models.ForeignKey(Wallet, on_delete=models.PROTECT, related_name="payments")
    provider = models.CharField(pgettext_lazy("payment", "provider"), max_length=20)
    amount = models.DecimalField(_("amount"), **MONEY)
    state = models.CharField(
        _("state"), max_length=10, choices=PaymentState.choices, default=PaymentState.PENDING
    )
    provider_txn_id = models.CharField(max_length=100, unique=True, null=True, blank=True)
    idempotency_key = models.CharField(max_length=100, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True)
    transaction = models.OneToOneField(
        LedgerTransaction, null=True, blank=True, on_delete=models.PROTECT, related_name="payment"
    )
    created_at = models.DateTimeField()
    paid_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("payment")
        verbose_name_plural = _("payments")
        ordering = ("-created_at", "-id")
        constraints = (
            models.UniqueConstraint(
                fields=("wallet", "idempotency_key"), name="billing_payment_idempotency_key"
            ),
            models.CheckConstraint(condition=Q(amount__gt=0), name="billing_payment_positive"),
        )

    def __str__(self) -> str:
        return f"{self.amount} 元 via {self.provider} ({self.state})"


class BillingNotice(models.Model):
    """A message billing sent the customer: a low-balance warning or a stop."""

    wallet = models.ForeignKey(Wallet, on_delete=models.CASCADE, related_name="notices")
    kind = models.CharField(max_length=20, choices=NoticeKind.choices)
    threshold_seconds = models.PositiveIntegerField(null=True, blank=True)
    message = models.CharField(max_length=300)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return self.message


# Invoices keep their models in their own package (billing/invoicing/).
from billing.invoicing.models import Invoice  # noqa: E402, F401
from billing.transfers.models import BankTransfer  # noqa: E402, F401
