"""Billing's enumerations, with their badge colours beside them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _


class AccountKind(models.TextChoices):
    # A customer's buckets (balance = money the customer holds):
    CASH = "cash", _("Cash")
    TRIAL = "trial", _("Trial credit")
    VOUCHER = "voucher", _("Voucher")
    # The operator's side of every posting (balances are mostly negative: the mirror image):
    PAYMENTS = "payments", _("Payments received")
    PROMOTIONS = "promotions", _("Promotional credit granted")
    USAGE_REVENUE = "usage_revenue", _("Usage revenue")
    REFUNDS = "refunds", _("Refunds paid out")
    EXPIRED = "expired", _("Expired vouchers")


CUSTOMER_KINDS = (AccountKind.CASH, AccountKind.TRIAL, AccountKind.VOUCHER)
SYSTEM_KINDS = (
    AccountKind.PAYMENTS,
    AccountKind.PROMOTIONS,
    AccountKind.USAGE_REVENUE,
    AccountKind.REFUNDS,
    AccountKind.EXPIRED,
)


class BillingMode(models.TextChoices):
    """How an instance's GPUs are paid: by the second, or a locked-price term paid up front."""

    ON_DEMAND = "on_demand", _("On demand, by the second")
    TERM = "term", _("Locked-price term, paid up front")


class TransactionKind(models.TextChoices):
    TOPUP = "topup", _("Top-up")
    TRIAL_GRANT = "trial_grant", _("Trial credit")
    VOUCHER_GRANT = "voucher_grant", _("Voucher grant")
    USAGE = "usage", pgettext_lazy("transaction kind", "Usage")
    TERM_PURCHASE = "term_purchase", _("Long-term rental")
    REFUND = "refund", _("Refund")
    VOUCHER_EXPIRY = "voucher_expiry", _("Voucher expired")
    REVERSAL = "reversal", _("Correction")


class MemoCode(models.TextChoices):
    """What a ledger transaction says, as a code; the label is the template its parameters fill,
    rendered in the reader's language (``LedgerTransaction.description``). Free text an operator
    typed (a voucher's or a refund's reason) is stored as ``memo`` instead."""

    TRIAL_CREDIT = "trial_credit", _("Trial credit for a new verified account")
    VOUCHER_EXPIRED = "voucher_expired", _("Voucher expired: %(reason)s")
    USAGE = "usage", _("Usage up to %(at)s")
    TERM_RENTAL = (
        "term_rental",
        _("%(days)d-day rental of %(cards)d × %(model)s at %(rate)s 元/card-h"),
    )
    TOPUP = "topup", _("Top-up via %(provider)s")
    RESERVATION = (
        "reservation",
        _("Booked window %(name)s: %(cards)d × %(model)s for %(hours)d h at %(rate)s 元/card-h"),
    )
    RESERVATION_REFUND = (
        "reservation_refund",
        _("Refund of booked window %(name)s (%(share)s %% of %(total)s 元): %(why)s"),
    )
    TOPUP_BONUS = (
        "topup_bonus",
        _("Top-up via %(provider)s; %(percent)s %% voucher for a top-up of %(amount)s 元"),
    )


# Display names of the payment providers a top-up memo names (``%(provider)s``).
PAYMENT_PROVIDER_LABELS = {"sandbox": _("sandbox (test payments)")}

# How a memo's ``%(at)s`` is stored (UTC); pages show it in the reader's time zone.
MEMO_TIME_FORMAT = "%Y-%m-%d %H:%M:%S UTC"


def memo_display_params(params: dict[str, Any]) -> dict[str, Any]:
    """A memo's parameters as a reader sees them: providers by their translated name, times in the
    active time zone (the page's), so a row never mixes local time with UTC."""
    shown = dict(params)
    provider = shown.get("provider")
    if isinstance(provider, str) and provider in PAYMENT_PROVIDER_LABELS:
        shown["provider"] = str(PAYMENT_PROVIDER_LABELS[provider])
    why = shown.get("why")
    if isinstance(why, str):  # a booked window's refund reason, stored in English
        shown["why"] = gettext(why)
    at = shown.get("at")
    if isinstance(at, str):
        try:
            when = datetime.strptime(at, MEMO_TIME_FORMAT).replace(tzinfo=UTC)
        except ValueError:
            pass
        else:
            shown["at"] = timezone.localtime(when).strftime("%Y-%m-%d %H:%M:%S")
    return shown


TRANSACTION_KIND_BADGES = {
    TransactionKind.TOPUP: "success",
    TransactionKind.TRIAL_GRANT: "info",
    TransactionKind.VOUCHER_GRANT: "info",
    TransactionKind.USAGE: "secondary",
    TransactionKind.TERM_PURCHASE: "primary",
    TransactionKind.REFUND: "warning",
    TransactionKind.VOUCHER_EXPIRY: "light",
    TransactionKind.REVERSAL: "danger",
}


class Meter(models.TextChoices):
    GPU = "gpu", _("GPU card-hours")
    DISK = "disk", _("Disk GB-days")


# Display names of the resource kinds other apps bill (``UsageSession.resource_kind``).
RESOURCE_KIND_LABELS = {"instance": _("Instance"), "storage": _("Storage")}


class UsageState(models.TextChoices):
    OPEN = "open", _("Charging")
    CLOSED = "closed", _("Closed")


USAGE_STATE_BADGES = {UsageState.OPEN: "success", UsageState.CLOSED: "secondary"}


class CloseReason(models.TextChoices):
    RELEASED = "released", _("Released")
    FAILED = "failed", _("Failed")
    MIGRATED = "migrated", _("Migrated away")
    INSUFFICIENT_FUNDS = "insufficient_funds", _("Stopped: balance exhausted")
    TERM_COVERED = "term_covered", _("Covered by a long-term rental")
    BUDGET_EXHAUSTED = "budget_exhausted", _("Stopped: the member's monthly budget is spent")


class PaymentState(models.TextChoices):
    PENDING = "pending", _("Awaiting payment")
    SUCCEEDED = "succeeded", _("Paid")
    FAILED = "failed", pgettext_lazy("payment state", "Failed")


PAYMENT_STATE_BADGES = {
    PaymentState.PENDING: "warning",
    PaymentState.SUCCEEDED: "success",
    PaymentState.FAILED: "danger",
}


class NoticeKind(models.TextChoices):
    LOW_BALANCE = "low_balance", _("Low balance")
    STOPPED = "stopped", _("Stopped for lack of funds")
