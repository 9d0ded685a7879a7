"""The sandbox provider of the embedded default: a checkout page with a "pay" button.

Its callback is signed like a real provider's: ``X-Sandbox-Signature: t=<unix>,v1=<hex>`` where
``hex = HMAC-SHA256(secret, "<t>.<body>")``; callbacks older than five minutes are refused, so a
captured callback cannot be replayed later (and a replay within the window credits nothing twice).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
import uuid
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from django.conf import settings
from django.urls import reverse

from billing.errors import InvalidWebhook
from billing.providers.base import WebhookEvent

if TYPE_CHECKING:
    from billing.models import Payment

SIGNATURE_HEADER = "X-Sandbox-Signature"
TOLERANCE_SECONDS = 300
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def sandbox_enabled() -> bool:
    """Whether the sandbox may take payments: ``BILLING_SANDBOX_PAYMENTS``, read on every call.

    On in the embedded default, off in production (anyone could top up for free through it).
    """
    return bool(getattr(settings, "BILLING_SANDBOX_PAYMENTS", False))


def sandbox_secret() -> bytes:
    configured = getattr(settings, "BILLING_SANDBOX_SECRET", "")
    if configured:
        return configured.encode()
    # Derived, so the embedded default needs no configuration and each deployment differs.
    return hmac.new(
        settings.SECRET_KEY.encode(), b"billing-sandbox-webhook", hashlib.sha256
    ).digest()


def sign(body: bytes, timestamp: int | None = None, secret: bytes | None = None) -> str:
    ts = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret or sandbox_secret(), f"{ts}.".encode() + body, hashlib.sha256)
    return f"t={ts},v1={mac.hexdigest()}"


class SandboxProvider:
    name = "sandbox"

    def checkout_url(self, payment: Payment) -> str:
        return reverse("billing:sandbox-checkout", args=[payment.public_id])

    def build_callback(
        self, payment: Payment, status: str = "succeeded"
    ) -> tuple[bytes, dict[str, str]]:
        """What the sandbox "bank" sends when the customer pays: a signed JSON body."""
        body = json.dumps(
            {
                "payment": str(payment.public_id),
                "txn": f"sbx_{payment.public_id.hex}",
                "amount": str(payment.amount),
                "status": status,
            },
            separators=(",", ":"),
        ).encode()
        return body, {SIGNATURE_HEADER: sign(body)}

    def parse_webhook(self, body: bytes, headers: dict[str, str]) -> WebhookEvent:
        header = headers.get(SIGNATURE_HEADER) or headers.get(SIGNATURE_HEADER.lower()) or ""
        try:
            parts = dict(p.split("=", 1) for p in header.split(","))
            given = parts["v1"]
            # ASCII only: compare_digest raises TypeError on non-ASCII text, and a huge ``t``
            # would overflow the float arithmetic of the tolerance check.
            if not (_TIMESTAMP.fullmatch(parts["t"]) and _HEX_DIGEST.fullmatch(given)):
                raise ValueError
            ts = int(parts["t"])
        except (ValueError, KeyError):
            raise InvalidWebhook("missing or malformed signature") from None
        if abs(time.time() - ts) > TOLERANCE_SECONDS:
            raise InvalidWebhook("signature timestamp outside the tolerance")
        expected = sign(body, ts).split("v1=", 1)[1]
        if not hmac.compare_digest(expected, given):
            raise InvalidWebhook("bad signature")
        try:
            data = json.loads(body)
            event = WebhookEvent(
                payment_id=str(uuid.UUID(str(data["payment"]))),
                provider_txn_id=str(data["txn"])[:100],
                amount=Decimal(str(data["amount"])),
                status=str(data["status"]),
            )
            if not event.amount.is_finite() or abs(event.amount) >= Decimal("1e12"):
                raise ValueError
        except (ValueError, KeyError, TypeError, InvalidOperation):
            raise InvalidWebhook("malformed body") from None
        if event.status not in ("succeeded", "failed"):
            raise InvalidWebhook("unknown status")
        return event
