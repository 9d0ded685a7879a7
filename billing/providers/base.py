"""The payment-provider interface (Horizon-style: one thin adapter per backend).

A provider turns a pending ``Payment`` into a URL the customer is sent to, and turns the provider's
callback into a verified ``WebhookEvent``. Real providers (Alipay, WeChat Pay, Stripe) implement the
same two methods; ``billing.services.handle_webhook`` does the rest (idempotent crediting).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from billing.models import Payment


@dataclass(frozen=True)
class WebhookEvent:
    payment_id: str  # our Payment.public_id
    provider_txn_id: str  # the provider's transaction id (unique)
    amount: Decimal
    status: str  # "succeeded" | "failed"


class PaymentProvider(Protocol):
    name: str

    def checkout_url(self, payment: Payment) -> str: ...

    def parse_webhook(self, body: bytes, headers: dict[str, str]) -> WebhookEvent:
        """Verify the signature and parse; raise ``billing.services.InvalidWebhook`` if bad."""
        ...
