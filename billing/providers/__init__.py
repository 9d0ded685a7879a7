"""Payment providers behind one interface; ``get_provider(name)`` returns the configured one."""

from __future__ import annotations

from billing.providers.base import PaymentProvider, WebhookEvent
from billing.providers.sandbox import SandboxProvider

__all__ = ["PaymentProvider", "WebhookEvent", "get_provider"]

_PROVIDERS: dict[str, type[PaymentProvider]] = {"sandbox": SandboxProvider}


def get_provider(name: str) -> PaymentProvider:
    try:
        return _PROVIDERS[name]()
    except KeyError:
        from billing.services import BillingError

        raise BillingError(f"unknown payment provider {name!r}") from None
