"""Payment providers behind one interface; ``get_provider(name)`` returns the configured one."""

from __future__ import annotations

from billing.providers.base import PaymentProvider, WebhookEvent
from billing.providers.sandbox import SandboxProvider, sandbox_enabled

__all__ = ["PaymentProvider", "WebhookEvent", "get_provider"]

_PROVIDERS: dict[str, type[PaymentProvider]] = {"sandbox": SandboxProvider}


def get_provider(name: str) -> PaymentProvider:
    from billing.services import BillingError

    if name not in _PROVIDERS:
        raise BillingError(f"unknown payment provider {name!r}")
    if name == "sandbox" and not sandbox_enabled():
        from django.utils.translation import gettext as _

        raise BillingError(
            _("Sandbox payments are disabled on this console (BILLING_SANDBOX_PAYMENTS is off).")
        )
    return _PROVIDERS[name]()
