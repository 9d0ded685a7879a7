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
        hooks.close_blocker(_money_left)


def _grant_trial_credit(sender: Any, user: Any, **kwargs: Any) -> bool:
    """The accounts' ``trial_credit_due``: grant the one-time trial credit (True if this did)."""
    from billing.services import grant_trial_credit

    return grant_trial_credit(user)


def _money_left(team: Any) -> list[str]:
    """A team closes only with no money left in its wallet and nothing metering (issue 30)."""
    from billing.ledger import get_wallet_summary

    summary = get_wallet_summary(team)
    held = []
    if summary.spendable > 0:
        held.append(str(_("a balance of %(amount)s 元") % {"amount": summary.spendable}))
    if summary.burn_per_hour > 0:
        held.append(str(_("running charges")))
    return held
