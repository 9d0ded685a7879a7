"""The bank-transfer "provider": no checkout and no callback. The customer is shown the account
to pay and the remittance code; an operator matches the transfer (billing/transfers/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.translation import gettext_noop

from billing.errors import InvalidWebhook
from billing.providers.base import WebhookEvent

if TYPE_CHECKING:
    from billing.models import Payment

NAME = "bank_transfer"


class BankTransferProvider:
    name = NAME

    def checkout_url(self, payment: Payment) -> str:
        return f"/billing/transfers/{payment.public_id}/"

    def parse_webhook(self, body: bytes, headers: dict[str, str]) -> WebhookEvent:
        raise InvalidWebhook(gettext_noop("Bank transfers are matched by an operator."))
