from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = _("Billing")

    def ready(self) -> None:
        from console import hooks

        hooks.trial_credit_due.connect(_grant_trial_credit, dispatch_uid="billing.trial_credit")


def _grant_trial_credit(sender: Any, user: Any, **kwargs: Any) -> bool:
    """The accounts' ``trial_credit_due``: grant the one-time trial credit (True if this did)."""
    from billing.services import grant_trial_credit

    return grant_trial_credit(user)
