"""Billing's refusals, in the console's one error vocabulary (``console.errors.DomainError``).

Raised with an untranslated template (``gettext_noop``) and its parameters; the message is rendered
in the reader's language where it is shown. Its own module so the payment providers can raise
them without importing the services (which import the providers).
"""

from __future__ import annotations

from console.errors import DomainError, ErrorCode


class BillingError(DomainError):
    code = ErrorCode.INVALID


class InsufficientFunds(BillingError):
    code = ErrorCode.INSUFFICIENT_FUNDS
    http_status = 402


class BudgetExceeded(BillingError):
    """A member's monthly budget (issue 30) cannot carry this order."""

    code = ErrorCode.BUDGET_EXCEEDED
    http_status = 402


class PriceNotSet(BillingError):
    code = ErrorCode.INVALID


class IdempotencyMismatch(BillingError):
    code = ErrorCode.IDEMPOTENCY_MISMATCH
    http_status = 422


class InvalidWebhook(BillingError):
    code = ErrorCode.INVALID_SIGNATURE
