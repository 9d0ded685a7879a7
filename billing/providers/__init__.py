"""Payment providers behind one interface; ``get_provider(name)`` returns the configured one."""

from __future__ import annotations

from django.utils.translation import gettext_noop

from billing.errors import BillingError
from billing.providers.bank_transfer import BankTransferProvider
from billing.providers.base import PaymentProvider, WebhookEvent
from billing.providers.sandbox import SandboxProvider, sandbox_enabled

__all__ = ["PaymentProvider", "WebhookEvent", "get_provider"]

_PROVIDERS: dict[str, type[PaymentProvider]] = {
    "sandbox": SandboxProvider,
    "bank_transfer": BankTransferProvider,  # 对公转账 (billing/transfers/)
}


def get_provider(name: str) -> PaymentProvider:
    if name not in _PROVIDERS:
        raise BillingError(gettext_noop("Unknown payment provider %(name)s."), name=name)
    if name == "sandbox" and not sandbox_enabled():
        raise BillingError(
            gettext_noop(
                "Sandbox payments are disabled on this console (BILLING_SANDBOX_PAYMENTS is off)."
            )
        )
    return _PROVIDERS[name]()
